//! What a bdev is: its geometry, metadata layout and protection-information type.
//!
//! A [`BdevInfo`] is built once, on the control path, by a backend and is then
//! immutable. Every constructor validates what it is given, so the data path can
//! rely on `block_size` being a supported power of two and on `num_blocks`
//! being non-zero.

use crate::io::BdevError;

/// The data block sizes a bdev may have, in bytes.
pub const SUPPORTED_BLOCK_SIZES: [u32; 2] = [512, 4096];

/// The metadata sizes a bdev may have, in bytes per block (0 = no metadata).
pub const SUPPORTED_MD_SIZES: [u32; 6] = [0, 8, 16, 32, 64, 128];

/// The size of one T10 protection-information tuple (16-bit guard format).
pub const PI_TUPLE_SIZE: u32 = 8;

/// The T10 protection-information type of a bdev.
///
/// With metadata of at least 8 bytes, each block carries a T10 PI tuple in
/// the last 8 bytes of its metadata; the generic layer generates and
/// verifies it per I/O on request (see [`crate::pi`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PiType {
    /// No protection information.
    #[default]
    None,
    /// Type 1: guard, application tag and a reference tag equal to the low 32 bits of the LBA.
    Type1,
    /// Type 2: guard, application tag and a reference tag taken from the command.
    Type2,
    /// Type 3: guard and application tag; the reference tag is not checked.
    Type3,
}

impl PiType {
    /// The type from its number as written in a spec string (`pi=0..3`).
    pub fn from_number(n: u8) -> Option<Self> {
        match n {
            0 => Some(Self::None),
            1 => Some(Self::Type1),
            2 => Some(Self::Type2),
            3 => Some(Self::Type3),
            _ => None,
        }
    }

    /// The number of this type (0 for none).
    pub fn number(self) -> u8 {
        match self {
            Self::None => 0,
            Self::Type1 => 1,
            Self::Type2 => 2,
            Self::Type3 => 3,
        }
    }
}

/// Immutable description of a bdev: name, geometry, metadata layout, PI type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BdevInfo {
    name: String,
    product: &'static str,
    block_size: u32,
    num_blocks: u64,
    md_size: u32,
    md_interleave: bool,
    pi_type: PiType,
}

impl BdevInfo {
    /// A bdev without metadata.
    ///
    /// `product` is a short backend description such as `"Null disk"`.
    ///
    /// # Errors
    ///
    /// [`BdevError::InvalidGeometry`] when the name is empty, the block size is
    /// not one of [`SUPPORTED_BLOCK_SIZES`], `num_blocks` is zero, or the size in
    /// bytes overflows `u64`.
    pub fn new(
        name: impl Into<String>,
        product: &'static str,
        block_size: u32,
        num_blocks: u64,
    ) -> Result<Self, BdevError> {
        let name = name.into();
        if name.is_empty() {
            return Err(BdevError::InvalidGeometry("the bdev name is empty".into()));
        }
        if !SUPPORTED_BLOCK_SIZES.contains(&block_size) {
            return Err(BdevError::InvalidGeometry(format!(
                "block size {block_size} is not one of {SUPPORTED_BLOCK_SIZES:?}"
            )));
        }
        if num_blocks == 0 {
            return Err(BdevError::InvalidGeometry(
                "a bdev needs at least one block".into(),
            ));
        }
        if num_blocks.checked_mul(u64::from(block_size)).is_none() {
            return Err(BdevError::InvalidGeometry(format!(
                "{num_blocks} blocks of {block_size} bytes overflow u64"
            )));
        }
        Ok(Self {
            name,
            product,
            block_size,
            num_blocks,
            md_size: 0,
            md_interleave: false,
            pi_type: PiType::None,
        })
    }

    /// The same bdev with per-block metadata and a PI type.
    ///
    /// `interleave` means the metadata follows each data block in the data
    /// buffers (DIF layout, "extended LBA"); otherwise it is kept separately
    /// (DIX layout: I/Os carry it in separate `md_bufs`, see
    /// [`IoChannel::submit_with_pi`](crate::IoChannel::submit_with_pi)).
    ///
    /// # Errors
    ///
    /// [`BdevError::InvalidGeometry`] when `md_size` is not one of
    /// [`SUPPORTED_MD_SIZES`], when PI is asked for with less than
    /// [`PI_TUPLE_SIZE`] bytes of metadata, or when `interleave` is set without
    /// metadata.
    pub fn with_metadata(
        mut self,
        md_size: u32,
        interleave: bool,
        pi_type: PiType,
    ) -> Result<Self, BdevError> {
        if !SUPPORTED_MD_SIZES.contains(&md_size) {
            return Err(BdevError::InvalidGeometry(format!(
                "metadata size {md_size} is not one of {SUPPORTED_MD_SIZES:?}"
            )));
        }
        if pi_type != PiType::None && md_size < PI_TUPLE_SIZE {
            return Err(BdevError::InvalidGeometry(format!(
                "PI type {} needs at least {PI_TUPLE_SIZE} bytes of metadata, got {md_size}",
                pi_type.number()
            )));
        }
        if interleave && md_size == 0 {
            return Err(BdevError::InvalidGeometry(
                "interleaved metadata needs a metadata size".into(),
            ));
        }
        let buf_block = u64::from(self.block_size + md_size);
        if self.num_blocks.checked_mul(buf_block).is_none() {
            return Err(BdevError::InvalidGeometry(
                "size with metadata overflows u64".into(),
            ));
        }
        self.md_size = md_size;
        self.md_interleave = interleave;
        self.pi_type = pi_type;
        Ok(self)
    }

    /// The bdev's unique name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A short description of the backend (`"Null disk"`, `"Malloc disk"`, `"AIO disk"`).
    pub fn product(&self) -> &'static str {
        self.product
    }

    /// The size of a data block in bytes (512 or 4096).
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// The number of blocks.
    pub fn num_blocks(&self) -> u64 {
        self.num_blocks
    }

    /// The data capacity in bytes (`block_size * num_blocks`, metadata excluded).
    pub fn size_bytes(&self) -> u64 {
        // Checked in `new`.
        u64::from(self.block_size) * self.num_blocks
    }

    /// Metadata bytes per block (0 when there is none).
    pub fn md_size(&self) -> u32 {
        self.md_size
    }

    /// Whether metadata is interleaved with the data in the I/O buffers.
    pub fn md_interleave(&self) -> bool {
        self.md_interleave
    }

    /// The T10 PI type (see [`crate::pi`]).
    pub fn pi_type(&self) -> PiType {
        self.pi_type
    }

    /// Bytes one block occupies in an I/O's data buffers: `block_size`, plus
    /// `md_size` when the metadata is interleaved.
    pub fn buf_block_size(&self) -> u32 {
        if self.md_interleave {
            self.block_size + self.md_size
        } else {
            self.block_size
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_is_validated() {
        assert!(BdevInfo::new("a", "t", 4096, 10).is_ok());
        assert!(BdevInfo::new("a", "t", 512, 1).is_ok());
        for bs in [0, 1000, 1024, 8192] {
            assert!(matches!(
                BdevInfo::new("a", "t", bs, 10),
                Err(BdevError::InvalidGeometry(_))
            ));
        }
        assert!(matches!(
            BdevInfo::new("a", "t", 512, 0),
            Err(BdevError::InvalidGeometry(_))
        ));
        assert!(matches!(
            BdevInfo::new("", "t", 512, 1),
            Err(BdevError::InvalidGeometry(_))
        ));
        assert!(matches!(
            BdevInfo::new("a", "t", 4096, u64::MAX / 2),
            Err(BdevError::InvalidGeometry(_))
        ));
    }

    #[test]
    fn pi_needs_eight_bytes_of_metadata() {
        let base = BdevInfo::new("a", "t", 512, 8).unwrap();
        let md = base.clone().with_metadata(8, true, PiType::Type1).unwrap();
        assert_eq!(md.md_size(), 8);
        assert_eq!(md.pi_type(), PiType::Type1);
        assert_eq!(md.buf_block_size(), 520);
        assert_eq!(md.size_bytes(), 512 * 8);
        let sep = base.clone().with_metadata(16, false, PiType::None).unwrap();
        assert_eq!(sep.buf_block_size(), 512);
        assert!(base.clone().with_metadata(0, false, PiType::Type3).is_err());
        assert!(base.clone().with_metadata(12, false, PiType::None).is_err());
        assert!(base.clone().with_metadata(0, true, PiType::None).is_err());
    }

    #[test]
    fn pi_numbers_round_trip() {
        for n in 0..4 {
            assert_eq!(PiType::from_number(n).unwrap().number(), n);
        }
        assert_eq!(PiType::from_number(4), None);
    }
}
