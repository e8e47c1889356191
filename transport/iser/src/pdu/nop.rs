//! NOP-Out (0x00) and NOP-In (0x20): pings in both directions.

use super::bhs::{be32, lun_at, put32, reserved, Common, Lun, BHS_LEN, FINAL, RESERVED_TAG};
use super::PduError;

/// A NOP-Out PDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NopOut {
    /// Immediate delivery.
    pub immediate: bool,
    /// Logical unit (echoed).
    pub lun: Lun,
    /// ITT: a real tag for a ping, the reserved tag for an answer to a NOP-In.
    pub itt: u32,
    /// TTT: the reserved tag for a ping, echoed when answering a NOP-In.
    pub ttt: u32,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
}

impl NopOut {
    pub(crate) fn parse(c: &Common, b: &[u8; BHS_LEN]) -> Result<Self, PduError> {
        if b[1] != FINAL {
            return Err(PduError::InvalidField("NOP-Out byte 1 must be 0x80"));
        }
        reserved(b, 2, 4, "NOP-Out bytes 2-3")?;
        reserved(b, 32, 48, "NOP-Out bytes 32-47")?;
        let ttt = be32(b, 20);
        if c.itt == RESERVED_TAG && !c.immediate {
            return Err(PduError::InvalidField(
                "NOP-Out without ITT must be immediate",
            ));
        }
        if ttt != RESERVED_TAG && c.itt != RESERVED_TAG {
            return Err(PduError::InvalidField("NOP-Out with both ITT and TTT"));
        }
        Ok(NopOut {
            immediate: c.immediate,
            lun: lun_at(b),
            itt: c.itt,
            ttt,
            cmd_sn: be32(b, 24),
            exp_stat_sn: be32(b, 28),
        })
    }

    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[1] = FINAL;
        b[8..16].copy_from_slice(&self.lun.0);
        put32(b, 16, self.itt);
        put32(b, 20, self.ttt);
        put32(b, 24, self.cmd_sn);
        put32(b, 28, self.exp_stat_sn);
    }
}

/// A NOP-In PDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NopIn {
    /// Logical unit.
    pub lun: Lun,
    /// ITT (echoed), or the reserved tag for a target ping.
    pub itt: u32,
    /// TTT: a real tag asks the initiator to answer.
    pub ttt: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
}

impl NopIn {
    pub(crate) fn parse(c: &Common, b: &[u8; BHS_LEN]) -> Result<Self, PduError> {
        if b[1] != FINAL {
            return Err(PduError::InvalidField("NOP-In byte 1 must be 0x80"));
        }
        reserved(b, 2, 4, "NOP-In bytes 2-3")?;
        reserved(b, 36, 48, "NOP-In bytes 36-47")?;
        let ttt = be32(b, 20);
        if ttt != RESERVED_TAG && c.itt != RESERVED_TAG {
            return Err(PduError::InvalidField("NOP-In with both ITT and TTT"));
        }
        Ok(NopIn {
            lun: lun_at(b),
            itt: c.itt,
            ttt,
            stat_sn: be32(b, 24),
            exp_cmd_sn: be32(b, 28),
            max_cmd_sn: be32(b, 32),
        })
    }

    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[1] = FINAL;
        b[8..16].copy_from_slice(&self.lun.0);
        put32(b, 16, self.itt);
        put32(b, 20, self.ttt);
        put32(b, 24, self.stat_sn);
        put32(b, 28, self.exp_cmd_sn);
        put32(b, 32, self.max_cmd_sn);
    }
}
