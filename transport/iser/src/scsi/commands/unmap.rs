//! UNMAP parameter list.

use crate::scsi::disk::UNMAP_MAX_DESCRIPTORS;
use crate::scsi::sense::Sense;

/// Parse the parameter list: header (data length, descriptor length) and
/// at most [`UNMAP_MAX_DESCRIPTORS`] descriptors of at most `max_blocks`
/// blocks. `None` when it has no descriptor.
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
    if desc_len % 16 != 0 || data_len != desc_len + 6 || 8 + desc_len > d.len() {
        return Err(Sense::INVALID_FIELD_IN_PARAM);
    }
    let n = desc_len / 16;
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
    if blocks == 0 {
        return Ok(None);
    }
    Ok(Some((lba, u64::from(blocks))))
}
