//! UNMAP parameter list.

use crate::scsi::disk::UNMAP_MAX_DESCRIPTORS;
use crate::scsi::sense::Sense;

/// Parse the parameter list: header (data length, descriptor length) and
/// at most [`UNMAP_MAX_DESCRIPTORS`] descriptors of at most `max_blocks`
/// blocks. `None` when it has no descriptor; a descriptor of 0 blocks
/// comes back as it is (nothing to unmap, but its LBA is still checked
/// against the capacity, as LIO does). A descriptor length that is
/// not a multiple of 16 ends in an incomplete descriptor, which is ignored
/// (SBC-3 UNMAP parameter list).
///
/// # Errors
/// ILLEGAL REQUEST 26/00 (inconsistent lengths, too many descriptors or
/// blocks), 1A/00 (short list).
pub fn parse(d: &[u8], max_blocks: u32) -> Result<Option<(u64, u64)>, Sense> {
    if d.len() < 8 {
        return Err(Sense::PARAM_LIST_LENGTH);
    }
    let data_len = usize::from(u16::from_be_bytes([d[0], d[1]]));
    let desc_len = usize::from(u16::from_be_bytes([d[2], d[3]]));
    let n = desc_len / 16;
    if data_len != desc_len + 6 || 8 + 16 * n > d.len() {
        return Err(Sense::INVALID_FIELD_IN_PARAM);
    }
    if n == 0 {
        return Ok(None);
    }
    if n > UNMAP_MAX_DESCRIPTORS as usize {
        return Err(Sense::INVALID_FIELD_IN_PARAM);
    }
    let e = &d[8..24];
    let mut l = [0u8; 8];
    l.copy_from_slice(&e[..8]);
    let lba = u64::from_be_bytes(l);
    let blocks = u32::from_be_bytes([e[8], e[9], e[10], e[11]]);
    if blocks > max_blocks {
        return Err(Sense::INVALID_FIELD_IN_PARAM);
    }
    Ok(Some((lba, u64::from(blocks))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(desc_len: u16, lba: u64, blocks: u32) -> Vec<u8> {
        let mut d = vec![0u8; 8 + usize::from(desc_len)];
        d[..2].copy_from_slice(&(desc_len + 6).to_be_bytes());
        d[2..4].copy_from_slice(&desc_len.to_be_bytes());
        if desc_len >= 16 {
            d[8..16].copy_from_slice(&lba.to_be_bytes());
            d[16..20].copy_from_slice(&blocks.to_be_bytes());
        }
        d
    }

    /// SBC-3: a block descriptor data length that is not a multiple of 16
    /// leaves the last descriptor incomplete, and it is ignored: not an
    /// error.
    #[test]
    fn an_incomplete_last_descriptor_is_ignored() {
        assert_eq!(parse(&list(16, 5, 8), 1 << 20), Ok(Some((5, 8))));
        assert_eq!(parse(&list(20, 5, 8), 1 << 20), Ok(Some((5, 8))));
        assert_eq!(parse(&list(8, 0, 0), 1 << 20), Ok(None));
        assert_eq!(parse(&list(16, 9, 0), 1 << 20), Ok(Some((9, 0))));
        // Its header still has to agree with itself and with the list.
        let mut d = list(20, 5, 8);
        d[1] = 30;
        assert_eq!(parse(&d, 1 << 20), Err(Sense::INVALID_FIELD_IN_PARAM));
        assert_eq!(
            parse(&list(16, 5, 8)[..20], 1 << 20),
            Err(Sense::INVALID_FIELD_IN_PARAM)
        );
        assert_eq!(
            parse(&list(32, 5, 8), 1 << 20),
            Err(Sense::INVALID_FIELD_IN_PARAM),
            "two descriptors"
        );
    }
}
