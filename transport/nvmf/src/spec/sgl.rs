//! SGL descriptors (16 bytes). Byte 15 is the identifier: the high nibble is
//! the descriptor type, the low nibble the subtype.

use super::{byte, le32, le64, need, put32, put64, WireError};

/// Size of one SGL descriptor.
pub const SGL_DESC_SIZE: usize = 16;

/// Type nibble: Data Block.
pub const SGL_TYPE_DATA_BLOCK: u8 = 0x0;
/// Type nibble: Bit Bucket.
pub const SGL_TYPE_BIT_BUCKET: u8 = 0x1;
/// Type nibble: Segment.
pub const SGL_TYPE_SEGMENT: u8 = 0x2;
/// Type nibble: Last Segment.
pub const SGL_TYPE_LAST_SEGMENT: u8 = 0x3;
/// Type nibble: Keyed Data Block.
pub const SGL_TYPE_KEYED_DATA_BLOCK: u8 = 0x4;
/// Type nibble: Transport SGL Data Block (NVMe/TCP: data moved by the
/// transport, H2CData/C2HData).
pub const SGL_TYPE_TRANSPORT_DATA_BLOCK: u8 = 0x5;
/// Subtype of a transport data block: transport specific format A (the
/// one NVMe/TCP uses).
pub const SGL_SUBTYPE_TRANSPORT_A: u8 = 0xA;
/// Subtype: the address field is a memory address.
pub const SGL_SUBTYPE_ADDRESS: u8 = 0x0;
/// Subtype: the address field is an offset into the in-capsule data.
pub const SGL_SUBTYPE_OFFSET: u8 = 0x1;
/// Subtype (keyed only): invalidate the key remotely.
pub const SGL_SUBTYPE_INVALIDATE_KEY: u8 = 0xF;
/// Largest length of a keyed data block (24 bits).
pub const KEYED_SGL_MAX_LEN: u32 = 0x00FF_FFFF;

/// A descriptor this crate cannot use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SglError {
    /// The type nibble is not one of the known types (status: SGL Descriptor
    /// Type Invalid).
    #[error("SGL descriptor type {0:#x} is not supported")]
    UnsupportedType(u8),
    /// The subtype is invalid for the type (status: Invalid Field).
    #[error("SGL descriptor type {sgl_type:#x} has invalid subtype {subtype:#x}")]
    UnsupportedSubtype {
        /// The type nibble.
        sgl_type: u8,
        /// The subtype nibble.
        subtype: u8,
    },
}

impl From<SglError> for WireError {
    fn from(e: SglError) -> Self {
        match e {
            SglError::UnsupportedType(t) => WireError::InvalidField {
                what: "SGL type",
                value: u64::from(t),
            },
            SglError::UnsupportedSubtype { subtype, .. } => WireError::InvalidField {
                what: "SGL subtype",
                value: u64::from(subtype),
            },
        }
    }
}

/// One SGL descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SglDescriptor {
    /// Data Block with an address (subtype 0x0).
    DataBlock {
        /// Memory address.
        addr: u64,
        /// Length in bytes.
        len: u32,
    },
    /// Data Block with an offset into the in-capsule data (identifier 0x01).
    InCapsule {
        /// Offset from the start of the in-capsule data (ICDOFF is 0).
        offset: u64,
        /// Length in bytes.
        len: u32,
    },
    /// Bit Bucket (data to discard).
    BitBucket {
        /// Length in bytes.
        len: u32,
    },
    /// Segment or Last Segment: points at more descriptors.
    Segment {
        /// Last Segment (0x3) rather than Segment (0x2).
        last: bool,
        /// The address field is an in-capsule offset (subtype 0x1).
        offset: bool,
        /// Address or offset of the descriptor list.
        addr: u64,
        /// Length of the descriptor list in bytes.
        len: u32,
    },
    /// Keyed Data Block (identifier 0x40, or 0x4F with `invalidate`).
    Keyed {
        /// Host address (virtual address or IOVA of the registration).
        addr: u64,
        /// Length in bytes (24 bits on the wire).
        len: u32,
        /// Remote key.
        key: u32,
        /// Subtype Invalidate Key: answer with SEND_WITH_INV(key).
        invalidate: bool,
    },
    /// Transport SGL Data Block, format A (identifier 0x5A): the transport
    /// moves the data (NVMe/TCP R2T/H2CData and C2HData).
    Transport {
        /// Length in bytes.
        len: u32,
    },
}

impl SglDescriptor {
    /// The "no data" descriptor the Linux host sends: keyed, all zero.
    pub const fn null() -> Self {
        SglDescriptor::Keyed {
            addr: 0,
            len: 0,
            key: 0,
            invalidate: false,
        }
    }

    /// A keyed data block.
    ///
    /// # Errors
    ///
    /// [`WireError::TooLarge`] when `len` does not fit in 24 bits.
    pub fn keyed(addr: u64, len: u32, key: u32, invalidate: bool) -> Result<Self, WireError> {
        if len > KEYED_SGL_MAX_LEN {
            return Err(WireError::TooLarge {
                what: "keyed SGL length",
                value: u64::from(len),
            });
        }
        Ok(SglDescriptor::Keyed {
            addr,
            len,
            key,
            invalidate,
        })
    }

    /// In-capsule data at `offset`, `len` bytes.
    pub const fn in_capsule(offset: u64, len: u32) -> Self {
        SglDescriptor::InCapsule { offset, len }
    }

    /// The identifier byte (type << 4 | subtype).
    pub fn identifier(&self) -> u8 {
        match *self {
            SglDescriptor::DataBlock { .. } => SGL_TYPE_DATA_BLOCK << 4,
            SglDescriptor::InCapsule { .. } => (SGL_TYPE_DATA_BLOCK << 4) | SGL_SUBTYPE_OFFSET,
            SglDescriptor::BitBucket { .. } => SGL_TYPE_BIT_BUCKET << 4,
            SglDescriptor::Segment { last, offset, .. } => {
                let t = if last {
                    SGL_TYPE_LAST_SEGMENT
                } else {
                    SGL_TYPE_SEGMENT
                };
                (t << 4) | u8::from(offset)
            }
            SglDescriptor::Keyed { invalidate, .. } => {
                let sub = if invalidate {
                    SGL_SUBTYPE_INVALIDATE_KEY
                } else {
                    SGL_SUBTYPE_ADDRESS
                };
                (SGL_TYPE_KEYED_DATA_BLOCK << 4) | sub
            }
            SglDescriptor::Transport { .. } => {
                (SGL_TYPE_TRANSPORT_DATA_BLOCK << 4) | SGL_SUBTYPE_TRANSPORT_A
            }
        }
    }

    /// The data length the descriptor describes.
    pub fn len(&self) -> u32 {
        match *self {
            SglDescriptor::DataBlock { len, .. }
            | SglDescriptor::InCapsule { len, .. }
            | SglDescriptor::BitBucket { len }
            | SglDescriptor::Segment { len, .. }
            | SglDescriptor::Keyed { len, .. }
            | SglDescriptor::Transport { len } => len,
        }
    }

    /// Whether the length is zero.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Parse a 16-byte descriptor.
    ///
    /// # Errors
    ///
    /// [`SglError::UnsupportedType`] for an unknown type nibble,
    /// [`SglError::UnsupportedSubtype`] for a subtype the type does not allow.
    #[inline(always)]
    pub fn parse(b: &[u8; SGL_DESC_SIZE]) -> Result<Self, SglError> {
        let id = byte(b, 15);
        let (ty, sub) = (id >> 4, id & 0xF);
        let addr = le64(b, 0);
        let len = le32(b, 8);
        let bad_sub = SglError::UnsupportedSubtype {
            sgl_type: ty,
            subtype: sub,
        };
        match ty {
            SGL_TYPE_DATA_BLOCK => match sub {
                SGL_SUBTYPE_ADDRESS => Ok(SglDescriptor::DataBlock { addr, len }),
                SGL_SUBTYPE_OFFSET => Ok(SglDescriptor::InCapsule { offset: addr, len }),
                _ => Err(bad_sub),
            },
            SGL_TYPE_BIT_BUCKET => match sub {
                SGL_SUBTYPE_ADDRESS => Ok(SglDescriptor::BitBucket { len }),
                _ => Err(bad_sub),
            },
            SGL_TYPE_SEGMENT | SGL_TYPE_LAST_SEGMENT => match sub {
                SGL_SUBTYPE_ADDRESS | SGL_SUBTYPE_OFFSET => Ok(SglDescriptor::Segment {
                    last: ty == SGL_TYPE_LAST_SEGMENT,
                    offset: sub == SGL_SUBTYPE_OFFSET,
                    addr,
                    len,
                }),
                _ => Err(bad_sub),
            },
            SGL_TYPE_KEYED_DATA_BLOCK => match sub {
                SGL_SUBTYPE_ADDRESS | SGL_SUBTYPE_INVALIDATE_KEY => Ok(SglDescriptor::Keyed {
                    addr,
                    len: len & KEYED_SGL_MAX_LEN,
                    key: le32(b, 11),
                    invalidate: sub == SGL_SUBTYPE_INVALIDATE_KEY,
                }),
                _ => Err(bad_sub),
            },
            SGL_TYPE_TRANSPORT_DATA_BLOCK => match sub {
                SGL_SUBTYPE_TRANSPORT_A => Ok(SglDescriptor::Transport { len }),
                _ => Err(bad_sub),
            },
            other => Err(SglError::UnsupportedType(other)),
        }
    }

    /// Parse the first 16 bytes of a slice.
    ///
    /// # Errors
    ///
    /// [`WireError::Short`] or the [`SglError`] of [`parse`](Self::parse).
    pub fn parse_slice(b: &[u8]) -> Result<Self, WireError> {
        Ok(Self::parse(need(b, "SGL descriptor")?)?)
    }

    /// The 16 encoded bytes. A keyed length is masked to 24 bits (use
    /// [`keyed`](Self::keyed) to build a checked one).
    #[inline]
    pub fn encode(&self) -> [u8; SGL_DESC_SIZE] {
        let mut b = [0u8; SGL_DESC_SIZE];
        match *self {
            SglDescriptor::DataBlock { addr, len }
            | SglDescriptor::Segment { addr, len, .. }
            | SglDescriptor::InCapsule { offset: addr, len } => {
                put64(&mut b, 0, addr);
                put32(&mut b, 8, len);
            }
            SglDescriptor::BitBucket { len } | SglDescriptor::Transport { len } => {
                put32(&mut b, 8, len)
            }
            SglDescriptor::Keyed { addr, len, key, .. } => {
                put64(&mut b, 0, addr);
                put32(&mut b, 8, len & KEYED_SGL_MAX_LEN);
                put32(&mut b, 11, key);
            }
        }
        b[15] = self.identifier();
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_layout_matches_the_wire() {
        let d =
            SglDescriptor::keyed(0x1122_3344_5566_7788, 0x00AB_CDEF, 0xDEAD_BEEF, true).unwrap();
        let b = d.encode();
        assert_eq!(&b[0..8], &0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(&b[8..11], &[0xEF, 0xCD, 0xAB], "24-bit length");
        assert_eq!(&b[11..15], &[0xEF, 0xBE, 0xAD, 0xDE], "key");
        assert_eq!(b[15], 0x4F);
        assert_eq!(SglDescriptor::parse(&b).unwrap(), d);
        assert!(SglDescriptor::keyed(0, 1 << 24, 0, false).is_err());
    }

    #[test]
    fn identifiers_seen_on_the_wire() {
        assert_eq!(SglDescriptor::null().encode()[15], 0x40);
        assert_eq!(SglDescriptor::in_capsule(0, 512).encode()[15], 0x01);
        let t = SglDescriptor::Transport { len: 4096 };
        assert_eq!(t.encode()[15], 0x5A);
        assert_eq!(SglDescriptor::parse(&t.encode()), Ok(t));
        let ls = SglDescriptor::Segment {
            last: true,
            offset: true,
            addr: 0,
            len: 32,
        };
        assert_eq!(ls.encode()[15], 0x31);
        for d in [
            SglDescriptor::in_capsule(16, 512),
            ls,
            SglDescriptor::DataBlock { addr: 5, len: 6 },
            SglDescriptor::BitBucket { len: 9 },
            SglDescriptor::null(),
        ] {
            assert_eq!(SglDescriptor::parse(&d.encode()).unwrap(), d);
        }
    }

    #[test]
    fn invalid_types_and_subtypes() {
        let mut b = [0u8; 16];
        b[15] = 0x60;
        assert_eq!(SglDescriptor::parse(&b), Err(SglError::UnsupportedType(6)));
        // Transport data blocks: only format A (0x5A).
        b[15] = 0x50;
        assert!(matches!(
            SglDescriptor::parse(&b),
            Err(SglError::UnsupportedSubtype {
                sgl_type: 5,
                subtype: 0
            })
        ));
        b[15] = 0x41;
        assert!(matches!(
            SglDescriptor::parse(&b),
            Err(SglError::UnsupportedSubtype {
                sgl_type: 4,
                subtype: 1
            })
        ));
        b[15] = 0x0F;
        assert!(SglDescriptor::parse(&b).is_err());
        assert!(SglDescriptor::parse_slice(&b[..3]).is_err());
    }
}
