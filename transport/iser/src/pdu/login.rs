//! Login Request (0x43, always immediate) and Login Response (0x23).

use super::bhs::{be16, be32, put16, put32, reserved, Common, BHS_LEN};
use super::PduError;

/// Login flag: Transit.
pub const LOGIN_T: u8 = 0x80;
/// Login flag: Continue.
pub const LOGIN_C: u8 = 0x40;

/// A login stage (CSG/NSG).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    /// 0: security negotiation.
    Security = 0,
    /// 1: login operational negotiation.
    Operational = 1,
    /// 3: full feature phase.
    FullFeature = 3,
}

impl Stage {
    fn from_bits(v: u8) -> Result<Stage, PduError> {
        match v & 3 {
            0 => Ok(Stage::Security),
            1 => Ok(Stage::Operational),
            3 => Ok(Stage::FullFeature),
            _ => Err(PduError::InvalidField("login stage 2")),
        }
    }
}

/// The stage fields common to login requests and responses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginFlags {
    /// T: transit to `nsg`.
    pub transit: bool,
    /// C: the text continues in the next PDU.
    pub cont: bool,
    /// Current stage.
    pub csg: Stage,
    /// Next stage (meaningful with T).
    pub nsg: Stage,
}

impl LoginFlags {
    fn parse(f: u8) -> Result<LoginFlags, PduError> {
        if f & 0x30 != 0 {
            return Err(PduError::Reserved("login byte 1 bits 4-5"));
        }
        let transit = f & LOGIN_T != 0;
        let cont = f & LOGIN_C != 0;
        if transit && cont {
            return Err(PduError::InvalidField("login T and C both set"));
        }
        let csg = Stage::from_bits(f >> 2)?;
        if csg == Stage::FullFeature {
            return Err(PduError::InvalidField("login CSG 3"));
        }
        // NSG is only meaningful with T (RFC 7143 11.12.3); without T the
        // bits are ignored and the next stage reads as the current one, as
        // `encode` writes it (a lossless round trip).
        let nsg = if transit {
            let n = Stage::from_bits(f)?;
            if n <= csg {
                return Err(PduError::InvalidField("login NSG not after CSG"));
            }
            n
        } else {
            csg
        };
        Ok(LoginFlags {
            transit,
            cont,
            csg,
            nsg,
        })
    }

    fn encode(&self) -> u8 {
        (if self.transit { LOGIN_T } else { 0 })
            | (if self.cont { LOGIN_C } else { 0 })
            | ((self.csg as u8) << 2)
            | if self.transit { self.nsg as u8 } else { 0 }
    }
}

/// A Login Request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginRequest {
    /// Stage flags.
    pub flags: LoginFlags,
    /// Version-max.
    pub version_max: u8,
    /// Version-min.
    pub version_min: u8,
    /// Initiator Session ID (6 bytes).
    pub isid: [u8; 6],
    /// Target Session Identifying Handle (0 = new session).
    pub tsih: u16,
    /// Initiator Task Tag.
    pub itt: u32,
    /// Connection ID.
    pub cid: u16,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
}

impl LoginRequest {
    pub(crate) fn parse(c: &Common, b: &[u8; BHS_LEN]) -> Result<Self, PduError> {
        if !c.immediate {
            return Err(PduError::InvalidField("login request not immediate"));
        }
        let flags = LoginFlags::parse(b[1])?;
        if b[3] > b[2] {
            return Err(PduError::InvalidField("version-min above version-max"));
        }
        if c.ahs_len != 0 {
            return Err(PduError::InvalidField("login request with AHS"));
        }
        reserved(b, 22, 24, "login bytes 22-23")?;
        reserved(b, 32, 48, "login bytes 32-47")?;
        let mut isid = [0u8; 6];
        isid.copy_from_slice(&b[8..14]);
        Ok(LoginRequest {
            flags,
            version_max: b[2],
            version_min: b[3],
            isid,
            tsih: be16(b, 14),
            itt: c.itt,
            cid: be16(b, 20),
            cmd_sn: be32(b, 24),
            exp_stat_sn: be32(b, 28),
        })
    }

    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[1] = self.flags.encode();
        b[2] = self.version_max;
        b[3] = self.version_min;
        b[8..14].copy_from_slice(&self.isid);
        put16(b, 14, self.tsih);
        put32(b, 16, self.itt);
        put16(b, 20, self.cid);
        put32(b, 24, self.cmd_sn);
        put32(b, 28, self.exp_stat_sn);
    }
}

/// A Login Response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginResponse {
    /// Stage flags.
    pub flags: LoginFlags,
    /// Version-max.
    pub version_max: u8,
    /// Version-active.
    pub version_active: u8,
    /// ISID (echoed).
    pub isid: [u8; 6],
    /// TSIH (assigned on the final response).
    pub tsih: u16,
    /// ITT (echoed).
    pub itt: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// Status-Class.
    pub status_class: u8,
    /// Status-Detail.
    pub status_detail: u8,
}

impl LoginResponse {
    pub(crate) fn parse(c: &Common, b: &[u8; BHS_LEN]) -> Result<Self, PduError> {
        let flags = LoginFlags::parse(b[1])?;
        reserved(b, 20, 24, "login response bytes 20-23")?;
        reserved(b, 38, 48, "login response bytes 38-47")?;
        let mut isid = [0u8; 6];
        isid.copy_from_slice(&b[8..14]);
        Ok(LoginResponse {
            flags,
            version_max: b[2],
            version_active: b[3],
            isid,
            tsih: be16(b, 14),
            itt: c.itt,
            stat_sn: be32(b, 24),
            exp_cmd_sn: be32(b, 28),
            max_cmd_sn: be32(b, 32),
            status_class: b[36],
            status_detail: b[37],
        })
    }

    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[1] = self.flags.encode();
        b[2] = self.version_max;
        b[3] = self.version_active;
        b[8..14].copy_from_slice(&self.isid);
        put16(b, 14, self.tsih);
        put32(b, 16, self.itt);
        put32(b, 24, self.stat_sn);
        put32(b, 28, self.exp_cmd_sn);
        put32(b, 32, self.max_cmd_sn);
        b[36] = self.status_class;
        b[37] = self.status_detail;
    }
}
