//! The 16-byte completion queue entry (CQE) and [`NvmeStatus`].

use super::{le16, le32, need, put16, put32, WireError};

/// Size of a CQE in bytes.
pub const CQE_SIZE: usize = 16;

/// Byte offsets of the CQE fields.
pub mod off {
    /// Command-specific DW0 (4 bytes).
    pub const DW0: usize = 0;
    /// DW1 (4 bytes).
    pub const DW1: usize = 4;
    /// SQ head pointer (2 bytes).
    pub const SQHD: usize = 8;
    /// SQ identifier (2 bytes).
    pub const SQID: usize = 10;
    /// Command identifier (2 bytes).
    pub const CID: usize = 12;
    /// Status and phase (2 bytes).
    pub const STATUS: usize = 14;
}

const _: () = assert!(off::STATUS + 2 == CQE_SIZE);
const _: () = assert!(off::DW1 + 4 == off::SQHD);

/// The SQHD value that says "SQ flow control disabled".
pub const SQHD_DISABLED: u16 = 0xFFFF;

/// Status code type (SCT).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum StatusCodeType {
    /// 0: generic command status.
    Generic = 0,
    /// 1: command specific status (fabrics codes included).
    CommandSpecific = 1,
    /// 2: media and data integrity errors.
    MediaError = 2,
    /// 3: path related status.
    Path = 3,
    /// 7: vendor specific.
    Vendor = 7,
}

impl StatusCodeType {
    /// The SCT of a 3-bit value (4-6 are reserved; they read as `Vendor`).
    pub const fn from_bits(v: u8) -> Self {
        match v & 7 {
            0 => StatusCodeType::Generic,
            1 => StatusCodeType::CommandSpecific,
            2 => StatusCodeType::MediaError,
            3 => StatusCodeType::Path,
            _ => StatusCodeType::Vendor,
        }
    }
}

/// An NVMe status: `(SCT, SC)` plus the DNR, More and CRD bits. The named
/// constants carry DNR where the Linux target sets it (the host must not
/// retry); `with_dnr`/`without_dnr` change it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NvmeStatus {
    sct: StatusCodeType,
    sc: u8,
    crd: u8,
    more: bool,
    dnr: bool,
}

macro_rules! status {
    ($(#[$m:meta])* $name:ident, $sct:ident, $sc:expr, $dnr:expr) => {
        $(#[$m])*
        pub const $name: NvmeStatus = NvmeStatus {
            sct: StatusCodeType::$sct,
            sc: $sc,
            crd: 0,
            more: false,
            dnr: $dnr,
        };
    };
}

impl NvmeStatus {
    status!(/// Success.
        SUCCESS, Generic, 0x00, false);
    status!(/// Invalid Command Opcode | DNR.
        INVALID_OPCODE, Generic, 0x01, true);
    status!(/// Invalid Field in Command | DNR.
        INVALID_FIELD, Generic, 0x02, true);
    status!(/// Command ID Conflict | DNR.
        CID_CONFLICT, Generic, 0x03, true);
    status!(/// Data Transfer Error.
        DATA_TRANSFER_ERROR, Generic, 0x04, false);
    status!(/// Internal Error.
        INTERNAL_ERROR, Generic, 0x06, false);
    status!(/// Command Abort Requested.
        ABORT_REQUESTED, Generic, 0x07, false);
    status!(/// Command Aborted due to SQ Deletion.
        ABORTED_SQ_DELETION, Generic, 0x08, false);
    status!(/// Invalid Namespace or Format | DNR.
        INVALID_NAMESPACE, Generic, 0x0B, true);
    status!(/// Command Sequence Error | DNR.
        COMMAND_SEQUENCE_ERROR, Generic, 0x0C, true);
    status!(/// Invalid SGL Segment Descriptor | DNR.
        INVALID_SGL_SEGMENT, Generic, 0x0D, true);
    status!(/// Invalid Number of SGL Descriptors | DNR.
        INVALID_SGL_COUNT, Generic, 0x0E, true);
    status!(/// Data SGL Length Invalid | DNR.
        DATA_SGL_LENGTH_INVALID, Generic, 0x0F, true);
    status!(/// SGL Descriptor Type Invalid | DNR.
        SGL_DESCRIPTOR_TYPE_INVALID, Generic, 0x11, true);
    status!(/// SGL Offset Invalid | DNR.
        SGL_OFFSET_INVALID, Generic, 0x16, true);
    status!(/// Keep Alive Timer Expired | DNR.
        KEEP_ALIVE_EXPIRED, Generic, 0x19, true);
    status!(/// Keep Alive Timeout Invalid | DNR.
        KEEP_ALIVE_INVALID, Generic, 0x1A, true);
    status!(/// Namespace is Write Protected | DNR.
        NAMESPACE_WRITE_PROTECTED, Generic, 0x20, true);
    status!(/// Transient Transport Error.
        TRANSIENT_TRANSPORT_ERROR, Generic, 0x22, false);
    status!(/// LBA Out of Range | DNR.
        LBA_OUT_OF_RANGE, Generic, 0x80, true);
    status!(/// Capacity Exceeded | DNR.
        CAPACITY_EXCEEDED, Generic, 0x81, true);
    status!(/// Namespace Not Ready (retryable).
        NAMESPACE_NOT_READY, Generic, 0x82, false);
    status!(/// Invalid Queue Identifier | DNR.
        INVALID_QUEUE_ID, CommandSpecific, 0x01, true);
    status!(/// Invalid Queue Size | DNR.
        INVALID_QUEUE_SIZE, CommandSpecific, 0x02, true);
    status!(/// Asynchronous Event Request Limit Exceeded | DNR.
        AER_LIMIT_EXCEEDED, CommandSpecific, 0x05, true);
    status!(/// Invalid Log Page | DNR.
        INVALID_LOG_PAGE, CommandSpecific, 0x09, true);
    status!(/// Invalid Format | DNR.
        INVALID_FORMAT, CommandSpecific, 0x0A, true);
    status!(/// Feature Identifier Not Saveable | DNR (Set Features SV).
        FEATURE_NOT_SAVEABLE, CommandSpecific, 0x0D, true);
    status!(/// Feature Not Changeable | DNR (Set Features).
        FEATURE_NOT_CHANGEABLE, CommandSpecific, 0x0E, true);
    status!(/// Fabrics: Incompatible Format | DNR (Connect RECFMT).
        CONNECT_INCOMPATIBLE_FORMAT, CommandSpecific, 0x80, true);
    status!(/// Fabrics: Controller Busy.
        CONNECT_CONTROLLER_BUSY, CommandSpecific, 0x81, false);
    status!(/// Fabrics: Connect Invalid Parameters | DNR (DW0 holds IPO/IATTR).
        CONNECT_INVALID_PARAMETERS, CommandSpecific, 0x82, true);
    status!(/// Fabrics: Connect Restart Discovery.
        CONNECT_RESTART_DISCOVERY, CommandSpecific, 0x83, false);
    status!(/// Fabrics: Connect Invalid Host | DNR.
        CONNECT_INVALID_HOST, CommandSpecific, 0x84, true);
    status!(/// Fabrics: Discover Restart.
        DISCOVER_RESTART, CommandSpecific, 0x90, false);
    status!(/// Fabrics: Authentication Required | DNR.
        AUTH_REQUIRED, CommandSpecific, 0x91, true);
    status!(/// Write Fault.
        WRITE_FAULT, MediaError, 0x80, false);
    status!(/// Unrecovered Read Error.
        UNRECOVERED_READ_ERROR, MediaError, 0x81, false);
    status!(/// End-to-end Guard Check Error | DNR.
        GUARD_CHECK_ERROR, MediaError, 0x82, true);
    status!(/// End-to-end Application Tag Check Error | DNR.
        APP_TAG_CHECK_ERROR, MediaError, 0x83, true);
    status!(/// End-to-end Reference Tag Check Error | DNR.
        REF_TAG_CHECK_ERROR, MediaError, 0x84, true);
    status!(/// Access Denied | DNR.
        ACCESS_DENIED, MediaError, 0x86, true);
    status!(/// Invalid Protection Information | DNR.
        INVALID_PI, CommandSpecific, 0x81, true);

    /// A status from its parts (CRD 0, More clear).
    pub const fn new(sct: StatusCodeType, sc: u8, dnr: bool) -> Self {
        NvmeStatus {
            sct,
            sc,
            crd: 0,
            more: false,
            dnr,
        }
    }

    /// The status code type.
    pub const fn sct(self) -> StatusCodeType {
        self.sct
    }

    /// The status code.
    pub const fn sc(self) -> u8 {
        self.sc
    }

    /// Do Not Retry.
    pub const fn dnr(self) -> bool {
        self.dnr
    }

    /// More information in the Error log.
    pub const fn more(self) -> bool {
        self.more
    }

    /// Command retry delay index (0-3).
    pub const fn crd(self) -> u8 {
        self.crd
    }

    /// `(SCT, SC, DNR)`.
    pub const fn parts(self) -> (u8, u8, bool) {
        (self.sct as u8, self.sc, self.dnr)
    }

    /// Whether this is success.
    pub const fn is_success(self) -> bool {
        matches!(self.sct, StatusCodeType::Generic) && self.sc == 0
    }

    /// The same status with DNR set.
    pub const fn with_dnr(mut self) -> Self {
        self.dnr = true;
        self
    }

    /// The same status with DNR clear.
    pub const fn without_dnr(mut self) -> Self {
        self.dnr = false;
        self
    }

    /// The same status with the More bit.
    pub const fn with_more(mut self, more: bool) -> Self {
        self.more = more;
        self
    }

    /// The 15-bit status field (bits 1-15 of CQE bytes 14-15; phase excluded):
    /// `DNR<<15 | M<<14 | CRD<<12 | SCT<<9 | SC<<1`.
    pub const fn to_field(self) -> u16 {
        ((self.dnr as u16) << 15)
            | ((self.more as u16) << 14)
            | (((self.crd & 3) as u16) << 12)
            | ((self.sct as u16 & 7) << 9)
            | ((self.sc as u16) << 1)
    }

    /// The status of a CQE status field (the phase bit is ignored).
    pub const fn from_field(f: u16) -> Self {
        NvmeStatus {
            sct: StatusCodeType::from_bits((f >> 9) as u8),
            sc: (f >> 1) as u8,
            crd: ((f >> 12) & 3) as u8,
            more: f & (1 << 14) != 0,
            dnr: f & (1 << 15) != 0,
        }
    }
}

impl std::fmt::Display for NvmeStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sct {:#x} sc {:#04x}", self.sct as u8, self.sc)?;
        if self.dnr {
            f.write_str(" dnr")?;
        }
        Ok(())
    }
}

/// A completion queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvmeCompletion {
    /// Command-specific DW0.
    pub dw0: u32,
    /// DW1 (the high half of a Property Get value).
    pub dw1: u32,
    /// SQ head pointer.
    pub sqhd: u16,
    /// SQ identifier.
    pub sqid: u16,
    /// Command identifier, echoed.
    pub cid: u16,
    /// The status.
    pub status: NvmeStatus,
    /// Phase tag (meaningless on fabrics; targets send 0).
    pub phase: bool,
}

impl NvmeCompletion {
    /// A completion of `cid` on `sqid` with `status`, everything else zero.
    pub fn new(sqid: u16, cid: u16, status: NvmeStatus) -> Self {
        NvmeCompletion {
            dw0: 0,
            dw1: 0,
            sqhd: 0,
            sqid,
            cid,
            status,
            phase: false,
        }
    }

    /// Parse the first 16 bytes of `b`.
    ///
    /// # Errors
    ///
    /// [`WireError::Short`] when `b` has fewer than 16 bytes.
    #[inline]
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        let b: &[u8; CQE_SIZE] = need(b, "CQE")?;
        let st = le16(b, off::STATUS);
        Ok(NvmeCompletion {
            dw0: le32(b, off::DW0),
            dw1: le32(b, off::DW1),
            sqhd: le16(b, off::SQHD),
            sqid: le16(b, off::SQID),
            cid: le16(b, off::CID),
            status: NvmeStatus::from_field(st & !1),
            phase: st & 1 != 0,
        })
    }

    /// Encode into `out`.
    #[inline]
    pub fn encode_into(&self, out: &mut [u8; CQE_SIZE]) {
        put32(out, off::DW0, self.dw0);
        put32(out, off::DW1, self.dw1);
        put16(out, off::SQHD, self.sqhd);
        put16(out, off::SQID, self.sqid);
        put16(out, off::CID, self.cid);
        put16(
            out,
            off::STATUS,
            self.status.to_field() | u16::from(self.phase),
        );
    }

    /// The 16 encoded bytes.
    pub fn encode(&self) -> [u8; CQE_SIZE] {
        let mut out = [0u8; CQE_SIZE];
        self.encode_into(&mut out);
        out
    }

    /// DW0 and DW1 as one u64 (a Property Get value).
    pub fn result64(&self) -> u64 {
        u64::from(self.dw0) | (u64::from(self.dw1) << 32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_field_encoding() {
        assert_eq!(NvmeStatus::SUCCESS.to_field(), 0);
        // Invalid opcode | DNR = 0x4001 << 1 ... SC 1 at bit 1, DNR bit 15.
        assert_eq!(NvmeStatus::INVALID_OPCODE.to_field(), 0x8002);
        // LBA out of range: SC 0x80.
        assert_eq!(
            NvmeStatus::LBA_OUT_OF_RANGE.to_field(),
            0x8000 | (0x80 << 1)
        );
        // Connect invalid parameters: SCT 1, SC 0x82, DNR.
        assert_eq!(
            NvmeStatus::CONNECT_INVALID_PARAMETERS.to_field(),
            0x8000 | (1 << 9) | (0x82 << 1)
        );
        // Linux writes PI guard errors as 0x282 = (SCT<<8)|SC; the field is that << 1.
        let guard = NvmeStatus::new(StatusCodeType::MediaError, 0x82, false);
        assert_eq!(guard.to_field(), 0x282 << 1);
        for s in [
            NvmeStatus::ABORT_REQUESTED,
            NvmeStatus::CONNECT_INVALID_HOST,
            NvmeStatus::INTERNAL_ERROR.with_more(true),
        ] {
            assert_eq!(NvmeStatus::from_field(s.to_field()), s);
        }
        assert_eq!(NvmeStatus::INVALID_FIELD.parts(), (0, 2, true));
        assert!(!NvmeStatus::INVALID_FIELD.without_dnr().dnr());
    }

    #[test]
    fn cqe_round_trip() {
        let mut c = NvmeCompletion::new(3, 0xABCD, NvmeStatus::INVALID_FIELD);
        c.dw0 = 0x1234_5678;
        c.dw1 = 9;
        c.sqhd = 17;
        let b = c.encode();
        assert_eq!(&b[0..4], &[0x78, 0x56, 0x34, 0x12]);
        assert_eq!(&b[8..10], &[17, 0]);
        assert_eq!(&b[10..12], &[3, 0]);
        assert_eq!(&b[12..14], &[0xCD, 0xAB]);
        assert_eq!(b[14] & 1, 0, "phase 0");
        assert_eq!(NvmeCompletion::parse(&b).unwrap(), c);
        assert_eq!(c.result64(), 0x9_1234_5678);
        assert!(NvmeCompletion::parse(&b[..15]).is_err());
    }
}
