//! MODE SENSE(6)/(10): the caching (08h) and control (0Ah) pages, or all
//! pages (3Fh), with an optional short block descriptor.

use crate::scsi::disk::DiskInfo;
use crate::scsi::sense::Sense;

fn caching(changeable: bool, b: &mut [u8]) -> usize {
    b[0] = 0x08;
    b[1] = 0x12;
    if !changeable {
        b[2] = 0x04; // WCE: the bdev may cache; SYNCHRONIZE CACHE flushes.
    }
    20
}

fn control(info: &DiskInfo, changeable: bool, b: &mut [u8]) -> usize {
    b[0] = 0x0A;
    b[1] = 0x0A;
    if !changeable {
        b[3] = 0x10; // QUEUE ALGORITHM MODIFIER 1: unrestricted reordering
        if info.pi_type != 0 {
            b[5] = 0x00; // ATO=0: the app tag belongs to the initiator
        }
        b[8..10].copy_from_slice(&0xFFFFu16.to_be_bytes());
    }
    12
}

/// Build the MODE SENSE answer into `out` (≥ 512 bytes); returns its length.
///
/// # Errors
/// ILLEGAL REQUEST 24/00 for saved values (PC 3), unknown pages and
/// subpages other than 0 (0xFF with page 0x3F).
#[allow(clippy::too_many_arguments)]
pub fn mode_sense(
    info: &DiskInfo,
    ten: bool,
    dbd: bool,
    pc: u8,
    page: u8,
    subpage: u8,
    out: &mut [u8],
) -> Result<usize, Sense> {
    if pc == 3 {
        return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(2, Some(7)));
    }
    if subpage != 0 && !(page == 0x3F && subpage == 0xFF) {
        return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(3, None));
    }
    let changeable = pc == 1;
    out[..512].fill(0);
    let hdr = if ten { 8 } else { 4 };
    let bd = if dbd { 0 } else { 8 };
    let mut n = hdr;
    if bd > 0 {
        let blocks = u32::try_from(info.num_blocks).unwrap_or(u32::MAX);
        out[n..n + 4].copy_from_slice(&blocks.to_be_bytes());
        out[n + 5..n + 8].copy_from_slice(&info.block_size.to_be_bytes()[1..]);
        n += 8;
    }
    match page {
        0x08 => n += caching(changeable, &mut out[n..]),
        0x0A => n += control(info, changeable, &mut out[n..]),
        0x3F => {
            n += caching(changeable, &mut out[n..]);
            n += control(info, changeable, &mut out[n..]);
        }
        _ => return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(2, Some(5))),
    }
    let wp = if info.writable { 0 } else { 0x80 };
    if ten {
        out[..2].copy_from_slice(&((n - 2) as u16).to_be_bytes());
        out[3] = wp | 0x10; // DPOFUA
        out[6..8].copy_from_slice(&(bd as u16).to_be_bytes());
    } else {
        out[0] = (n - 1) as u8;
        out[2] = wp | 0x10;
        out[3] = bd as u8;
    }
    Ok(n)
}
