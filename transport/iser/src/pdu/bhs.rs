//! The 48-byte Basic Header Segment: opcodes, the fields every PDU shares,
//! the SAM LUN encoding and big-endian field helpers.

use super::PduError;

/// Bytes of a Basic Header Segment.
pub const BHS_LEN: usize = 48;
/// The reserved "no tag" value of ITT and TTT.
pub const RESERVED_TAG: u32 = 0xFFFF_FFFF;
/// Largest data segment length the 24-bit field can carry.
pub const MAX_DSL: u32 = 0x00FF_FFFF;

/// Bit 6 of byte 0: immediate delivery (initiator PDUs only).
pub const IMMEDIATE: u8 = 0x40;
/// Bit 7 of byte 1: the Final bit of most PDUs.
pub const FINAL: u8 = 0x80;

/// iSCSI opcodes (byte 0 bits 0-5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// NOP-Out.
    NopOut = 0x00,
    /// SCSI Command.
    ScsiCmd = 0x01,
    /// Task Management Function Request.
    TmfReq = 0x02,
    /// Login Request.
    LoginReq = 0x03,
    /// Text Request.
    TextReq = 0x04,
    /// SCSI Data-Out.
    DataOut = 0x05,
    /// Logout Request.
    LogoutReq = 0x06,
    /// SNACK Request (unused at ErrorRecoveryLevel 0).
    Snack = 0x10,
    /// NOP-In.
    NopIn = 0x20,
    /// SCSI Response.
    ScsiRsp = 0x21,
    /// Task Management Function Response.
    TmfRsp = 0x22,
    /// Login Response.
    LoginRsp = 0x23,
    /// Text Response.
    TextRsp = 0x24,
    /// SCSI Data-In.
    DataIn = 0x25,
    /// Logout Response.
    LogoutRsp = 0x26,
    /// Ready To Transfer.
    R2t = 0x31,
    /// Asynchronous Message.
    Async = 0x32,
    /// Reject.
    Reject = 0x3F,
}

impl Opcode {
    /// The opcode for a 6-bit value.
    pub fn from_u8(v: u8) -> Option<Opcode> {
        use Opcode::*;
        Some(match v {
            0x00 => NopOut,
            0x01 => ScsiCmd,
            0x02 => TmfReq,
            0x03 => LoginReq,
            0x04 => TextReq,
            0x05 => DataOut,
            0x06 => LogoutReq,
            0x10 => Snack,
            0x20 => NopIn,
            0x21 => ScsiRsp,
            0x22 => TmfRsp,
            0x23 => LoginRsp,
            0x24 => TextRsp,
            0x25 => DataIn,
            0x26 => LogoutRsp,
            0x31 => R2t,
            0x32 => Async,
            0x3F => Reject,
            _ => return None,
        })
    }

    /// Whether initiators send this opcode (targets send the others).
    pub fn from_initiator(self) -> bool {
        (self as u8) < 0x20
    }
}

/// An 8-byte SAM logical unit number as carried in BHS bytes 8-15 and in
/// REPORT LUNS data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Lun(pub [u8; 8]);

impl Lun {
    /// LUN `n`: peripheral addressing below 256 (`00 nn 00..`), flat
    /// addressing (`40|hi lo 00..`) up to 16383.
    pub fn from_index(n: u16) -> Lun {
        let mut b = [0u8; 8];
        if n < 256 {
            b[1] = n as u8;
        } else {
            b[0] = 0x40 | ((n >> 8) as u8 & 0x3F);
            b[1] = n as u8;
        }
        Lun(b)
    }

    /// The LUN number for peripheral or flat addressing of a single level
    /// (the last six bytes zero); `None` for other encodings.
    pub fn index(&self) -> Option<u16> {
        if self.0[2..].iter().any(|&b| b != 0) {
            return None;
        }
        match self.0[0] >> 6 {
            0 if self.0[0] == 0 => Some(u16::from(self.0[1])),
            1 => Some((u16::from(self.0[0] & 0x3F) << 8) | u16::from(self.0[1])),
            _ => None,
        }
    }
}

/// Big-endian u16 at `off` (the caller guarantees the bounds: BHS fields).
#[inline]
pub(crate) fn be16(b: &[u8], off: usize) -> u16 {
    u16::from_be_bytes([b[off], b[off + 1]])
}

/// Big-endian u32 at `off`.
#[inline]
pub(crate) fn be32(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Big-endian u64 at `off`.
#[inline]
pub(crate) fn be64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_be_bytes(a)
}

/// Store a big-endian u16 at `off`.
#[inline]
pub(crate) fn put16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_be_bytes());
}

/// Store a big-endian u32 at `off`.
#[inline]
pub(crate) fn put32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_be_bytes());
}

/// Store a big-endian u64 at `off`.
#[inline]
pub(crate) fn put64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_be_bytes());
}

/// The LUN field (bytes 8-15).
#[inline]
pub(crate) fn lun_at(b: &[u8; BHS_LEN]) -> Lun {
    let mut l = [0u8; 8];
    l.copy_from_slice(&b[8..16]);
    Lun(l)
}

/// Check that `b[range]` is all zero (a reserved field).
#[inline]
pub(crate) fn reserved(
    b: &[u8],
    from: usize,
    to: usize,
    field: &'static str,
) -> Result<(), PduError> {
    if b[from..to].iter().all(|&x| x == 0) {
        Ok(())
    } else {
        Err(PduError::Reserved(field))
    }
}

/// Fields every BHS has (bytes 0-7 and the ITT), decoded but not checked
/// against the opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Common {
    /// The opcode.
    pub opcode: Opcode,
    /// Immediate delivery bit.
    pub immediate: bool,
    /// Byte 1 (opcode-specific flags).
    pub flags: u8,
    /// TotalAHSLength in bytes (the field counts 4-byte words).
    pub ahs_len: usize,
    /// DataSegmentLength in bytes (without padding).
    pub dsl: usize,
    /// Initiator Task Tag.
    pub itt: u32,
}

impl Common {
    /// Decode bytes 0-7 and 16-19.
    ///
    /// # Errors
    /// [`PduError::BadOpcode`], [`PduError::Reserved`] (bit 7 of byte 0, or
    /// the immediate bit on a target PDU).
    pub fn parse(b: &[u8; BHS_LEN]) -> Result<Common, PduError> {
        if b[0] & 0x80 != 0 {
            return Err(PduError::Reserved("byte 0 bit 7"));
        }
        let opcode = Opcode::from_u8(b[0] & 0x3F).ok_or(PduError::BadOpcode(b[0] & 0x3F))?;
        let immediate = b[0] & IMMEDIATE != 0;
        if immediate && !opcode.from_initiator() {
            return Err(PduError::Reserved("immediate bit of a target PDU"));
        }
        Ok(Common {
            opcode,
            immediate,
            flags: b[1],
            ahs_len: usize::from(b[4]) * 4,
            dsl: (be32(b, 4) & MAX_DSL) as usize,
            itt: be32(b, 16),
        })
    }
}

/// Write bytes 0 and 4-7 (opcode, immediate, TotalAHSLength, DSL).
pub(crate) fn put_common(
    b: &mut [u8; BHS_LEN],
    op: Opcode,
    immediate: bool,
    ahs_words: u8,
    dsl: u32,
) {
    b[0] = op as u8 | if immediate { IMMEDIATE } else { 0 };
    put32(b, 4, dsl & MAX_DSL);
    b[4] = ahs_words;
}

/// Round `n` up to a multiple of 4 (data segment padding).
#[inline]
pub fn pad4(n: usize) -> usize {
    (n + 3) & !3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn luns_round_trip() {
        for n in [0u16, 1, 5, 255, 256, 1000, 16383] {
            assert_eq!(Lun::from_index(n).index(), Some(n));
        }
        assert_eq!(Lun::from_index(5).0, [0, 5, 0, 0, 0, 0, 0, 0]);
        assert_eq!(Lun([0x80, 0, 0, 0, 0, 0, 0, 0]).index(), None);
        assert_eq!(Lun([0, 1, 0, 1, 0, 0, 0, 0]).index(), None);
        assert_eq!(Lun([1, 1, 0, 0, 0, 0, 0, 0]).index(), None);
    }

    #[test]
    fn opcodes_round_trip() {
        let mut decoded = 0;
        for v in 0..64u8 {
            if let Some(op) = Opcode::from_u8(v) {
                assert_eq!(op as u8, v);
                decoded += 1;
            }
        }
        // All 18 variants decode (each from its own discriminant).
        assert_eq!(decoded, 18, "opcodes that decode");
        assert_eq!(Opcode::from_u8(0x01), Some(Opcode::ScsiCmd));
        assert_eq!(Opcode::from_u8(0x25), Some(Opcode::DataIn));
        assert_eq!(Opcode::from_u8(0x3F), Some(Opcode::Reject));
        assert_eq!(Opcode::from_u8(0x07), None);
        assert!(Opcode::ScsiCmd.from_initiator());
        assert!(!Opcode::ScsiRsp.from_initiator());
    }

    #[test]
    fn padding() {
        assert_eq!(pad4(0), 0);
        assert_eq!(pad4(1), 4);
        assert_eq!(pad4(4), 4);
        assert_eq!(pad4(18), 20);
    }
}
