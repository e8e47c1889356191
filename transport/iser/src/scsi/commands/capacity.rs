//! READ CAPACITY(10) and (16) parameter data.

use crate::scsi::disk::DiskInfo;

/// READ CAPACITY(10): last LBA (0xFFFFFFFF if it does not fit) and block length.
pub fn rc10(info: &DiskInfo) -> [u8; 8] {
    let mut b = [0u8; 8];
    let last = info.num_blocks - 1;
    let l = u32::try_from(last).unwrap_or(u32::MAX);
    b[..4].copy_from_slice(&l.to_be_bytes());
    b[4..].copy_from_slice(&info.block_size.to_be_bytes());
    b
}

/// READ CAPACITY(16): last LBA, block length, PROT_EN/P_TYPE, LBPME/LBPRZ.
pub fn rc16(info: &DiskInfo) -> [u8; 32] {
    let mut b = [0u8; 32];
    b[..8].copy_from_slice(&(info.num_blocks - 1).to_be_bytes());
    b[8..12].copy_from_slice(&info.block_size.to_be_bytes());
    if info.pi_type != 0 {
        b[12] = 0x01 | ((info.pi_type - 1) << 1);
    }
    if info.unmap {
        b[14] = 0x80 | 0x40;
    }
    b
}
