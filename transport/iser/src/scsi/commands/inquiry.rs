//! INQUIRY: standard data and the VPD pages 00h, 80h, 83h, B0h, B1h, B2h.

use crate::scsi::disk::{
    DiskInfo, COMPARE_AND_WRITE_MAX_BLOCKS, UNMAP_MAX_DESCRIPTORS, VENDOR, WRITE_SAME_MAX_BLOCKS,
};
use crate::scsi::sense::Sense;

/// The VPD pages supported, ascending.
pub const VPD_PAGES: [u8; 6] = [0x00, 0x80, 0x83, 0xB0, 0xB1, 0xB2];

/// Standard INQUIRY data (96 bytes) into `b` (≥ 96); returns the length.
pub fn standard(info: &DiskInfo, b: &mut [u8]) -> usize {
    const LEN: usize = 96;
    b[..LEN].fill(0);
    b[0] = 0x00; // connected, direct access block device
    b[2] = 0x06; // SPC-4
    b[3] = 0x02 | 0x10; // response format 2, HiSup
    b[4] = (LEN - 5) as u8;
    b[5] = if info.pi_type != 0 { 0x01 } else { 0 }; // PROTECT
    b[7] = 0x02; // CmdQue
    b[8..16].copy_from_slice(VENDOR);
    b[16..32].copy_from_slice(&info.product);
    b[32..36].copy_from_slice(b"0001");
    // Version descriptors (SPC-4 §6.4.2, each "no version claimed"):
    // without them an initiator takes the SBC-3 pages (Block Limits,
    // thin provisioning) as unclaimed.
    for (i, d) in VERSION_DESCRIPTORS.iter().enumerate() {
        b[58 + 2 * i..60 + 2 * i].copy_from_slice(&d.to_be_bytes());
    }
    LEN
}

/// Standard INQUIRY version descriptors: SAM-5, SPC-4, SBC-3, iSCSI.
pub const VERSION_DESCRIPTORS: [u16; 4] = [0x00A0, 0x0460, 0x04C0, 0x0960];

fn be16(b: &mut [u8], o: usize, v: u16) {
    b[o..o + 2].copy_from_slice(&v.to_be_bytes());
}
fn be32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_be_bytes());
}

/// VPD page `page` into `b` (≥ 512 bytes); returns the length.
///
/// # Errors
/// ILLEGAL REQUEST 24/00 for a page not in [`VPD_PAGES`].
pub fn vpd(info: &DiskInfo, page: u8, b: &mut [u8]) -> Result<usize, Sense> {
    b[..512].fill(0);
    b[1] = page;
    let body = match page {
        0x00 => {
            b[4..4 + VPD_PAGES.len()].copy_from_slice(&VPD_PAGES);
            VPD_PAGES.len()
        }
        0x80 => {
            let s = info.serial.as_bytes();
            let n = s.len().min(64);
            b[4..4 + n].copy_from_slice(&s[..n]);
            n
        }
        0x83 => {
            // LU designator, NAA type 6 (binary, association LU).
            b[4] = 0x01;
            b[5] = 0x03;
            b[7] = 16;
            b[8..24].copy_from_slice(&info.naa);
            // T10 vendor id designator (ASCII): vendor + serial.
            let s = info.serial.as_bytes();
            let n = 8 + s.len().min(32);
            b[24] = 0x02;
            b[25] = 0x01;
            b[27] = n as u8;
            b[28..36].copy_from_slice(VENDOR);
            b[36..28 + n].copy_from_slice(&s[..n - 8]);
            20 + 4 + n
        }
        0xB0 => {
            // WSNZ=0: WRITE SAME with 0 blocks writes to the end of the
            // medium.
            b[4] = 0;
            b[5] = COMPARE_AND_WRITE_MAX_BLOCKS as u8;
            be16(b, 6, 1); // OPTIMAL TRANSFER LENGTH GRANULARITY
            be32(b, 8, info.max_transfer_blocks);
            be32(b, 12, info.max_transfer_blocks);
            if info.unmap {
                be32(b, 20, info.max_unmap_blocks());
                be32(b, 24, UNMAP_MAX_DESCRIPTORS);
                be32(b, 28, 1);
            }
            b[36..44].copy_from_slice(&u64::from(WRITE_SAME_MAX_BLOCKS).to_be_bytes());
            0x3C
        }
        0xB1 => {
            be16(b, 4, 1); // non-rotating
            0x3C
        }
        0xB2 => {
            if info.unmap {
                // LBPU, LBPWS, LBPWS10 (WRITE SAME(10) unmaps as (16)
                // does), LBPRZ=001b.
                b[5] = 0x80 | 0x40 | 0x20 | 0x04;
                b[6] = 0x02; // thin provisioned
            }
            4
        }
        _ => return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(2, None)),
    };
    be16(b, 2, body as u16);
    Ok(4 + body)
}
