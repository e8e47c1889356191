//! The 64-byte submission queue entry (SQE) and the opcodes.

use super::sgl::{SglDescriptor, SglError, SGL_DESC_SIZE};
use super::{byte, bytes, le16, le32, le64, need, put, put16, put32, put64, WireError};

/// Size of an SQE in bytes.
pub const SQE_SIZE: usize = 64;

/// Byte offsets of the SQE fields.
pub mod off {
    /// Opcode (1 byte).
    pub const OPC: usize = 0;
    /// FUSE (bits 0-1) and PSDT (bits 6-7) (1 byte).
    pub const FLAGS: usize = 1;
    /// Command identifier (2 bytes).
    pub const CID: usize = 2;
    /// Namespace id (4 bytes); FCTYPE is its first byte on Fabrics commands.
    pub const NSID: usize = 4;
    /// CDW2 (4 bytes).
    pub const CDW2: usize = 8;
    /// CDW3 (4 bytes).
    pub const CDW3: usize = 12;
    /// Metadata pointer (8 bytes).
    pub const MPTR: usize = 16;
    /// Data pointer: SGL descriptor 1 (16 bytes).
    pub const DPTR: usize = 24;
    /// CDW10 (4 bytes); CDW11..CDW15 follow.
    pub const CDW10: usize = 40;
    /// CDW15 (4 bytes), the last field.
    pub const CDW15: usize = 60;
}

const _: () = assert!(off::DPTR + SGL_DESC_SIZE == off::CDW10);
const _: () = assert!(off::CDW15 + 4 == SQE_SIZE);
const _: () = assert!(off::MPTR + 8 == off::DPTR);

/// The opcode of every Fabrics command (FCTYPE in byte 4 says which).
pub const OPC_FABRICS: u8 = 0x7F;

/// FLAGS value fabrics requires: PSDT = 01b (SGL for data), no fusing.
pub const FLAGS_PSDT_SGL: u8 = 0x40;

/// Admin command opcodes this crate knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AdminOpcode {
    /// Delete I/O SQ (invalid on fabrics).
    DeleteIoSq,
    /// Create I/O SQ (invalid on fabrics).
    CreateIoSq,
    /// Get Log Page.
    GetLogPage,
    /// Delete I/O CQ (invalid on fabrics).
    DeleteIoCq,
    /// Create I/O CQ (invalid on fabrics).
    CreateIoCq,
    /// Identify.
    Identify,
    /// Abort.
    Abort,
    /// Set Features.
    SetFeatures,
    /// Get Features.
    GetFeatures,
    /// Asynchronous Event Request.
    AsyncEventRequest,
    /// Keep Alive.
    KeepAlive,
    /// A Fabrics command.
    Fabrics,
}

impl AdminOpcode {
    /// The opcode byte.
    pub const fn code(self) -> u8 {
        match self {
            AdminOpcode::DeleteIoSq => 0x00,
            AdminOpcode::CreateIoSq => 0x01,
            AdminOpcode::GetLogPage => 0x02,
            AdminOpcode::DeleteIoCq => 0x04,
            AdminOpcode::CreateIoCq => 0x05,
            AdminOpcode::Identify => 0x06,
            AdminOpcode::Abort => 0x08,
            AdminOpcode::SetFeatures => 0x09,
            AdminOpcode::GetFeatures => 0x0A,
            AdminOpcode::AsyncEventRequest => 0x0C,
            AdminOpcode::KeepAlive => 0x18,
            AdminOpcode::Fabrics => OPC_FABRICS,
        }
    }

    /// The opcode of `code`, if known.
    pub const fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0x00 => AdminOpcode::DeleteIoSq,
            0x01 => AdminOpcode::CreateIoSq,
            0x02 => AdminOpcode::GetLogPage,
            0x04 => AdminOpcode::DeleteIoCq,
            0x05 => AdminOpcode::CreateIoCq,
            0x06 => AdminOpcode::Identify,
            0x08 => AdminOpcode::Abort,
            0x09 => AdminOpcode::SetFeatures,
            0x0A => AdminOpcode::GetFeatures,
            0x0C => AdminOpcode::AsyncEventRequest,
            0x18 => AdminOpcode::KeepAlive,
            OPC_FABRICS => AdminOpcode::Fabrics,
            _ => return None,
        })
    }
}

/// NVM command set I/O opcodes this crate knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum IoOpcode {
    /// Flush.
    Flush,
    /// Write.
    Write,
    /// Read.
    Read,
    /// Write Zeroes.
    WriteZeroes,
    /// Dataset Management.
    DatasetManagement,
    /// A Fabrics command (Connect on an I/O queue).
    Fabrics,
}

impl IoOpcode {
    /// The opcode byte.
    pub const fn code(self) -> u8 {
        match self {
            IoOpcode::Flush => 0x00,
            IoOpcode::Write => 0x01,
            IoOpcode::Read => 0x02,
            IoOpcode::WriteZeroes => 0x08,
            IoOpcode::DatasetManagement => 0x09,
            IoOpcode::Fabrics => OPC_FABRICS,
        }
    }

    /// The opcode of `code`, if known.
    pub const fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0x00 => IoOpcode::Flush,
            0x01 => IoOpcode::Write,
            0x02 => IoOpcode::Read,
            0x08 => IoOpcode::WriteZeroes,
            0x09 => IoOpcode::DatasetManagement,
            OPC_FABRICS => IoOpcode::Fabrics,
            _ => return None,
        })
    }
}

/// Fabrics command types (FCTYPE, SQE byte 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FabricsType {
    /// Property Set.
    PropertySet,
    /// Connect.
    Connect,
    /// Property Get.
    PropertyGet,
    /// Authentication Send.
    AuthSend,
    /// Authentication Receive.
    AuthReceive,
    /// Disconnect.
    Disconnect,
}

impl FabricsType {
    /// The FCTYPE byte.
    pub const fn code(self) -> u8 {
        match self {
            FabricsType::PropertySet => 0x00,
            FabricsType::Connect => 0x01,
            FabricsType::PropertyGet => 0x04,
            FabricsType::AuthSend => 0x05,
            FabricsType::AuthReceive => 0x06,
            FabricsType::Disconnect => 0x08,
        }
    }

    /// The type of `code`, if known.
    pub const fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0x00 => FabricsType::PropertySet,
            0x01 => FabricsType::Connect,
            0x04 => FabricsType::PropertyGet,
            0x05 => FabricsType::AuthSend,
            0x06 => FabricsType::AuthReceive,
            0x08 => FabricsType::Disconnect,
            _ => return None,
        })
    }
}

/// A submission queue entry, field by field. `dptr` is kept raw: parse it
/// with [`NvmeCmd::sgl`] (a bad descriptor is a command error with its own
/// status, not a malformed capsule).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NvmeCmd {
    /// Opcode.
    pub opcode: u8,
    /// FUSE (bits 0-1) and PSDT (bits 6-7).
    pub flags: u8,
    /// Command identifier (opaque; echoed in the CQE).
    pub cid: u16,
    /// Namespace id (FCTYPE in its low byte on Fabrics commands).
    pub nsid: u32,
    /// CDW2.
    pub cdw2: u32,
    /// CDW3.
    pub cdw3: u32,
    /// Metadata pointer.
    pub mptr: u64,
    /// SGL descriptor 1, raw.
    pub dptr: [u8; SGL_DESC_SIZE],
    /// CDW10.
    pub cdw10: u32,
    /// CDW11.
    pub cdw11: u32,
    /// CDW12.
    pub cdw12: u32,
    /// CDW13.
    pub cdw13: u32,
    /// CDW14.
    pub cdw14: u32,
    /// CDW15.
    pub cdw15: u32,
}

impl NvmeCmd {
    /// A command with `opcode` and `cid`, PSDT = SGL, everything else zero
    /// (a null keyed SGL).
    pub fn new(opcode: u8, cid: u16) -> Self {
        NvmeCmd {
            opcode,
            flags: FLAGS_PSDT_SGL,
            cid,
            dptr: SglDescriptor::null().encode(),
            ..NvmeCmd::default()
        }
    }

    /// A Fabrics command of type `fctype`.
    pub fn fabrics(fctype: FabricsType, cid: u16) -> Self {
        let mut c = NvmeCmd::new(OPC_FABRICS, cid);
        c.nsid = u32::from(fctype.code());
        c
    }

    /// Parse the first 64 bytes of `b`.
    ///
    /// # Errors
    ///
    /// [`WireError::Short`] when `b` has fewer than 64 bytes.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        let b: &[u8; SQE_SIZE] = need(b, "SQE")?;
        Ok(NvmeCmd {
            opcode: byte(b, off::OPC),
            flags: byte(b, off::FLAGS),
            cid: le16(b, off::CID),
            nsid: le32(b, off::NSID),
            cdw2: le32(b, off::CDW2),
            cdw3: le32(b, off::CDW3),
            mptr: le64(b, off::MPTR),
            dptr: bytes(b, off::DPTR),
            cdw10: le32(b, off::CDW10),
            cdw11: le32(b, off::CDW10 + 4),
            cdw12: le32(b, off::CDW10 + 8),
            cdw13: le32(b, off::CDW10 + 12),
            cdw14: le32(b, off::CDW10 + 16),
            cdw15: le32(b, off::CDW15),
        })
    }

    /// Encode into `out`.
    pub fn encode_into(&self, out: &mut [u8; SQE_SIZE]) {
        out[off::OPC] = self.opcode;
        out[off::FLAGS] = self.flags;
        put16(out, off::CID, self.cid);
        put32(out, off::NSID, self.nsid);
        put32(out, off::CDW2, self.cdw2);
        put32(out, off::CDW3, self.cdw3);
        put64(out, off::MPTR, self.mptr);
        put(out, off::DPTR, &self.dptr);
        for (i, v) in self.cdws().into_iter().enumerate() {
            put32(out, off::CDW10 + 4 * i, v);
        }
    }

    /// The 64 encoded bytes.
    pub fn encode(&self) -> [u8; SQE_SIZE] {
        let mut out = [0u8; SQE_SIZE];
        self.encode_into(&mut out);
        out
    }

    /// CDW10..CDW15.
    pub fn cdws(&self) -> [u32; 6] {
        [
            self.cdw10, self.cdw11, self.cdw12, self.cdw13, self.cdw14, self.cdw15,
        ]
    }

    /// FUSE bits (0 = not fused).
    pub fn fuse(&self) -> u8 {
        self.flags & 0x3
    }

    /// PSDT bits (1 = SGL, the only value fabrics allows).
    pub fn psdt(&self) -> u8 {
        self.flags >> 6
    }

    /// FCTYPE of a Fabrics command (SQE byte 4).
    pub fn fctype(&self) -> u8 {
        self.nsid as u8
    }

    /// Whether this is a Fabrics command.
    pub fn is_fabrics(&self) -> bool {
        self.opcode == OPC_FABRICS
    }

    /// SGL descriptor 1, parsed.
    ///
    /// # Errors
    ///
    /// [`SglError`] for a type or subtype this crate does not know.
    #[inline(always)]
    pub fn sgl(&self) -> Result<SglDescriptor, SglError> {
        SglDescriptor::parse(&self.dptr)
    }

    /// Set SGL descriptor 1.
    #[inline]
    pub fn set_sgl(&mut self, sgl: &SglDescriptor) {
        self.dptr = sgl.encode();
    }
}

/// Abort (admin 0x08) fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortCmd {
    /// The submission queue of the command to abort (CDW10 bits 0-15).
    pub sqid: u16,
    /// Its command identifier (CDW10 bits 16-31).
    pub cid: u16,
}

impl AbortCmd {
    /// The fields of `cmd`.
    pub fn from_cmd(cmd: &NvmeCmd) -> Self {
        AbortCmd {
            sqid: cmd.cdw10 as u16,
            cid: (cmd.cdw10 >> 16) as u16,
        }
    }

    /// CDW10 of an Abort.
    pub fn cdw10(&self) -> u32 {
        u32::from(self.sqid) | (u32::from(self.cid) << 16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqe_round_trips_and_places_fields() {
        let mut c = NvmeCmd::new(0x02, 0xBEEF);
        c.nsid = 7;
        c.cdw10 = 0x1122_3344;
        c.cdw15 = 0xAABB_CCDD;
        c.mptr = 0x0102_0304_0506_0708;
        let b = c.encode();
        assert_eq!(b[0], 0x02);
        assert_eq!(b[1], 0x40, "PSDT = SGL");
        assert_eq!(&b[2..4], &[0xEF, 0xBE]);
        assert_eq!(&b[4..8], &[7, 0, 0, 0]);
        assert_eq!(b[39], 0x40, "null keyed SGL");
        assert_eq!(&b[40..44], &[0x44, 0x33, 0x22, 0x11]);
        assert_eq!(&b[60..64], &[0xDD, 0xCC, 0xBB, 0xAA]);
        assert_eq!(NvmeCmd::parse(&b).unwrap(), c);
        assert!(NvmeCmd::parse(&b[..63]).is_err());
    }

    #[test]
    fn opcodes_round_trip() {
        let (mut admin, mut io, mut fabrics) = (0, 0, 0);
        for code in 0..=255u8 {
            if let Some(op) = AdminOpcode::from_code(code) {
                assert_eq!(op.code(), code);
                admin += 1;
            }
            if let Some(op) = IoOpcode::from_code(code) {
                assert_eq!(op.code(), code);
                io += 1;
            }
            if let Some(t) = FabricsType::from_code(code) {
                assert_eq!(t.code(), code);
                fabrics += 1;
            }
        }
        // Each variant decodes from exactly one code (codes are distinct and
        // `code()` is a function, so the counts cover every variant).
        assert_eq!((admin, io, fabrics), (12, 6, 6), "codes that decode");
        assert_eq!(AdminOpcode::from_code(0x06), Some(AdminOpcode::Identify));
        assert_eq!(AdminOpcode::from_code(0x18), Some(AdminOpcode::KeepAlive));
        assert_eq!(
            AdminOpcode::from_code(OPC_FABRICS),
            Some(AdminOpcode::Fabrics)
        );
        assert_eq!(IoOpcode::from_code(0x01), Some(IoOpcode::Write));
        assert_eq!(IoOpcode::from_code(0x02), Some(IoOpcode::Read));
        assert_eq!(FabricsType::from_code(0x01), Some(FabricsType::Connect));
        assert_eq!(FabricsType::from_code(0x04), Some(FabricsType::PropertyGet));
        assert_eq!(AdminOpcode::from_code(0x03), None);
        assert_eq!(IoOpcode::from_code(0x03), None);
        assert_eq!(FabricsType::from_code(0x02), None);
        let f = NvmeCmd::fabrics(FabricsType::Connect, 1);
        assert_eq!(f.encode()[4], 0x01);
        assert_eq!(f.fctype(), 1);
    }

    #[test]
    fn abort_fields() {
        let a = AbortCmd {
            sqid: 3,
            cid: 0x1234,
        };
        let mut c = NvmeCmd::new(0x08, 1);
        c.cdw10 = a.cdw10();
        assert_eq!(AbortCmd::from_cmd(&c), a);
    }
}
