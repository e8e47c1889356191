//! T10-PI signature domain types for integrity registration
//! (`REG_MR_INTEGRITY`), after the kernel's `ib_sig_attrs` (`t10-pi.md` §7).

/// Bytes of one T10 PI tuple.
pub const PI_TUPLE_SIZE: usize = 8;

/// Guard (block guard) type of a T10-DIF domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuardType {
    /// CRC-16/T10-DIF.
    Crc,
    /// IP checksum.
    IpCsum,
}

/// T10-DIF parameters of one domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct T10Dif {
    /// Guard type.
    pub bg_type: GuardType,
    /// Protection interval in bytes (512, 4096, …).
    pub pi_interval: u32,
    /// Guard seed (normally 0).
    pub bg: u16,
    /// Application tag.
    pub app_tag: u16,
    /// Reference tag of the first block.
    pub ref_tag: u32,
    /// Increment the reference tag per interval.
    pub ref_remap: bool,
    /// An app tag of 0xFFFF disables checks for that block.
    pub app_escape: bool,
    /// An all-ones ref tag (with app escape) disables checks (Type 3).
    pub ref_escape: bool,
    /// Mask applied to the app tag before comparing.
    pub apptag_check_mask: u16,
}

/// One signature domain (memory or wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SigDomain {
    /// No protection information in this domain.
    None,
    /// T10-DIF tuples (8 bytes per interval).
    T10Dif(T10Dif),
}

/// Bits of [`SigAttrs::check_mask`]: one bit per tuple byte.
pub mod check {
    /// Guard bytes 0-1.
    pub const GUARD: u8 = 0xC0;
    /// App tag bytes 2-3.
    pub const APPTAG: u8 = 0x30;
    /// Ref tag bytes 4-7.
    pub const REFTAG: u8 = 0x0F;
}

/// Signature attributes of an integrity MR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SigAttrs {
    /// Which tuple bytes to check ([`check`]).
    pub check_mask: u8,
    /// The memory domain.
    pub mem: SigDomain,
    /// The wire domain.
    pub wire: SigDomain,
    /// PI bytes in the memory domain.
    pub meta_length: u32,
}

/// Kind of a signature error found during a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SigErrKind {
    /// Guard mismatch.
    BadGuard,
    /// Reference tag mismatch.
    BadRefTag,
    /// Application tag mismatch.
    BadAppTag,
}

/// A signature error reported by
/// [`MemoryRegion::check_sig_status`](crate::MemoryRegion::check_sig_status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SigError {
    /// What failed.
    pub kind: SigErrKind,
    /// Expected value.
    pub expected: u64,
    /// Value found.
    pub actual: u64,
    /// Byte offset in the wire domain.
    pub offset: u64,
    /// The MR key.
    pub key: u32,
}
