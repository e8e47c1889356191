//! NVMe and NVMe-oF wire formats: bytes only, no I/O, no state.
//!
//! Every structure is little-endian. Parsing is `&[u8] -> Result<T, WireError>`
//! (never a cast of untrusted bytes, never a panic); encoding writes into a
//! caller's buffer of the exact size (`&mut [u8; N]`), so a field can never
//! land outside it. Each file checks its field table at compile time
//! (`const _: () = assert!(..)`): every offset plus size fits the structure.
//!
//! Files: [`cmd`] (64-byte SQE, opcodes), [`cpl`] (16-byte CQE, [`NvmeStatus`]),
//! [`sgl`] (SGL descriptors), [`connect`] (Fabrics Connect), [`property`]
//! (CAP/VS/CC/CSTS and Property Get/Set), [`features`] (Set/Get Features,
//! async events), [`identify`] (Identify data), [`log_page`] (Get Log Page
//! and the logs), [`nvm`] (NVM I/O command fields), [`rdma_cm`] (RDMA CM
//! private data), [`tcp`] (NVMe/TCP PDUs and digests) and [`transport_id`]
//! (transport types and addresses).
//!
//! The reference for every offset is `shared/docs/nvmeof-rdma.md`.

pub mod cmd;
pub mod connect;
pub mod cpl;
pub mod features;
pub mod identify;
pub mod log_page;
pub mod nvm;
pub mod property;
pub mod rdma_cm;
pub mod sgl;
pub mod tcp;
pub mod transport_id;

pub use cmd::{AdminOpcode, FabricsType, IoOpcode, NvmeCmd, OPC_FABRICS, SQE_SIZE};
pub use cpl::{NvmeCompletion, NvmeStatus, StatusCodeType, CQE_SIZE};
pub use sgl::{SglDescriptor, SglError, SGL_DESC_SIZE};

/// A wire structure could not be parsed (or a value could not be encoded).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The buffer is shorter than the structure.
    #[error("{what}: need {need} bytes, got {got}")]
    Short {
        /// The structure.
        what: &'static str,
        /// Bytes it needs.
        need: usize,
        /// Bytes there were.
        got: usize,
    },
    /// A field holds a value the format does not allow.
    #[error("{what}: invalid value {value:#x}")]
    InvalidField {
        /// The field.
        what: &'static str,
        /// Its value.
        value: u64,
    },
    /// A string field is not printable ASCII (or is not NUL terminated).
    #[error("{what}: not a valid NUL-terminated ASCII string")]
    BadString {
        /// The field.
        what: &'static str,
    },
    /// A value does not fit its field when encoding.
    #[error("{what}: value {value:#x} does not fit")]
    TooLarge {
        /// The field.
        what: &'static str,
        /// The value.
        value: u64,
    },
}

/// `b` as a fixed-size array, or [`WireError::Short`].
pub(crate) fn need<'a, const N: usize>(
    b: &'a [u8],
    what: &'static str,
) -> Result<&'a [u8; N], WireError> {
    match b.get(..N) {
        Some(s) => s.try_into().map_err(|_| WireError::Short {
            what,
            need: N,
            got: b.len(),
        }),
        None => Err(WireError::Short {
            what,
            need: N,
            got: b.len(),
        }),
    }
}

/// The `N` bytes at `off`, zeroes when out of range (callers check lengths
/// first: parsers take fixed-size arrays).
#[inline]
pub(crate) fn bytes<const N: usize>(b: &[u8], off: usize) -> [u8; N] {
    let mut out = [0u8; N];
    if let Some(s) = off.checked_add(N).and_then(|end| b.get(off..end)) {
        out.copy_from_slice(s);
    }
    out
}

/// Little-endian `u16` at `off`.
#[inline]
pub(crate) fn le16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes(bytes(b, off))
}

/// Little-endian `u32` at `off`.
#[inline]
pub(crate) fn le32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(bytes(b, off))
}

/// Little-endian `u64` at `off`.
#[inline]
pub(crate) fn le64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(bytes(b, off))
}

/// Little-endian `u128` at `off`.
#[inline]
pub(crate) fn le128(b: &[u8], off: usize) -> u128 {
    u128::from_le_bytes(bytes(b, off))
}

/// Byte at `off` (0 when out of range).
#[inline]
pub(crate) fn byte(b: &[u8], off: usize) -> u8 {
    b.get(off).copied().unwrap_or(0)
}

/// Copy `src` to `off` (no-op, with a debug assertion, when out of range:
/// encoders write into arrays sized for the structure).
#[inline]
pub(crate) fn put(b: &mut [u8], off: usize, src: &[u8]) {
    match off
        .checked_add(src.len())
        .and_then(|end| b.get_mut(off..end))
    {
        Some(d) => d.copy_from_slice(src),
        None => debug_assert!(false, "field at {off} overflows a {}-byte buffer", b.len()),
    }
}

/// Write a little-endian `u16` at `off`.
#[inline]
pub(crate) fn put16(b: &mut [u8], off: usize, v: u16) {
    put(b, off, &v.to_le_bytes());
}

/// Write a little-endian `u32` at `off`.
#[inline]
pub(crate) fn put32(b: &mut [u8], off: usize, v: u32) {
    put(b, off, &v.to_le_bytes());
}

/// Write a little-endian `u64` at `off`.
#[inline]
pub(crate) fn put64(b: &mut [u8], off: usize, v: u64) {
    put(b, off, &v.to_le_bytes());
}

/// Write a little-endian `u128` at `off`.
#[inline]
pub(crate) fn put128(b: &mut [u8], off: usize, v: u128) {
    put(b, off, &v.to_le_bytes());
}

/// Write `s` into the `len`-byte field at `off`, truncated, padded with `pad`
/// (space for SN/MN/FR and the TRSVCID/TRADDR of discovery entries, NUL for
/// NQNs).
pub(crate) fn put_str(b: &mut [u8], off: usize, len: usize, s: &str, pad: u8) {
    let Some(field) = off.checked_add(len).and_then(|end| b.get_mut(off..end)) else {
        debug_assert!(false, "string field at {off} overflows");
        return;
    };
    field.fill(pad);
    let n = s.len().min(len);
    field[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// A string field of `len` bytes at `off`: up to the first NUL, trailing
/// spaces trimmed when `trim_spaces`. Printable ASCII only.
pub(crate) fn get_str(
    b: &[u8],
    off: usize,
    len: usize,
    what: &'static str,
    trim_spaces: bool,
) -> Result<String, WireError> {
    let field = off
        .checked_add(len)
        .and_then(|end| b.get(off..end))
        .ok_or(WireError::Short {
            what,
            need: off.saturating_add(len),
            got: b.len(),
        })?;
    let end = field.iter().position(|&c| c == 0).unwrap_or(len);
    let mut s = &field[..end];
    if trim_spaces {
        while let [rest @ .., b' '] = s {
            s = rest;
        }
    }
    if !s.iter().all(|c| (0x20..0x7f).contains(c)) {
        return Err(WireError::BadString { what });
    }
    Ok(s.iter().map(|&c| char::from(c)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_never_panic_out_of_range() {
        let b = [1u8, 2, 3];
        assert_eq!(le32(&b, 0), 0, "short read gives zero");
        assert_eq!(le16(&b, 1), 0x0302);
        assert_eq!(le64(&b, usize::MAX), 0);
        assert_eq!(byte(&b, 9), 0);
        assert!(need::<4>(&b, "x").is_err());
        assert_eq!(need::<2>(&b, "x").unwrap(), &[1, 2]);
    }

    #[test]
    fn strings_round_trip_and_reject_garbage() {
        let mut b = [0u8; 16];
        put_str(&mut b, 2, 8, "abc", b' ');
        assert_eq!(&b[2..10], b"abc     ");
        assert_eq!(get_str(&b, 2, 8, "s", true).unwrap(), "abc");
        put_str(&mut b, 0, 4, "toolong", 0);
        assert_eq!(&b[..4], b"tool");
        b[10] = b'x';
        b[11] = b'y';
        b[12] = 0xff;
        assert!(get_str(&b, 10, 6, "s", false).is_err());
        assert!(get_str(&b, 10, 60, "s", false).is_err());
    }
}
