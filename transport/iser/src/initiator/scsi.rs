//! CDB builders and parameter-data parsers for LUN discovery and block
//! I/O: REPORT LUNS, INQUIRY, READ CAPACITY(16), READ(16)/WRITE(16).

use crate::scsi::cdb::op;

/// What the initiator needs to know about a LU (from READ CAPACITY(16)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LunGeometry {
    /// Logical block size in bytes.
    pub block_size: u32,
    /// Number of blocks.
    pub blocks: u64,
    /// PROT_EN: the LU is formatted with PI.
    pub prot_en: bool,
    /// P_TYPE + 1 (1 = Type 1) when `prot_en`, else 0.
    pub pi_type: u8,
}

/// REPORT LUNS with `alloc` bytes.
pub fn report_luns_cdb(alloc: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op::REPORT_LUNS;
    c[6..10].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// Standard INQUIRY with `alloc` bytes.
pub fn inquiry_cdb(alloc: u16) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op::INQUIRY;
    c[3..5].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// READ CAPACITY(16) with 32 bytes.
pub fn read_capacity16_cdb() -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op::SERVICE_ACTION_IN_16;
    c[1] = 0x10;
    c[13] = 32;
    c
}

/// READ(16) / WRITE(16) with RDPROTECT/WRPROTECT `protect` (3 bits).
pub fn rw16_cdb(write: bool, lba: u64, blocks: u32, protect: u8) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = if write { op::WRITE_16 } else { op::READ_16 };
    c[1] = (protect & 7) << 5;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// The LUN numbers of REPORT LUNS parameter data (flat/peripheral
/// addressing below 16384; others skipped).
pub fn parse_report_luns(d: &[u8]) -> Vec<u16> {
    let Some(len) = d
        .get(..4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    else {
        return Vec::new();
    };
    d.get(8..)
        .unwrap_or(&[])
        .chunks_exact(8)
        .take(len as usize / 8)
        .filter_map(|l| match l[0] >> 6 {
            0 if l[0] == 0 => Some(u16::from(l[1])),
            1 => Some(u16::from_be_bytes([l[0] & 0x3F, l[1]])),
            _ => None,
        })
        .collect()
}

/// Standard INQUIRY facts: (peripheral qualifier, device type, PROTECT).
pub fn parse_inquiry(d: &[u8]) -> Option<(u8, u8, bool)> {
    let b0 = *d.first()?;
    let protect = d.get(5).is_some_and(|b| b & 1 != 0);
    Some((b0 >> 5, b0 & 0x1F, protect))
}

/// READ CAPACITY(16) parameter data.
pub fn parse_read_capacity16(d: &[u8]) -> Option<LunGeometry> {
    let d = d.get(..13)?;
    let mut last = [0u8; 8];
    last.copy_from_slice(&d[..8]);
    let block_size = u32::from_be_bytes([d[8], d[9], d[10], d[11]]);
    let prot_en = d[12] & 1 != 0;
    Some(LunGeometry {
        block_size,
        blocks: u64::from_be_bytes(last).checked_add(1)?,
        prot_en,
        pi_type: if prot_en { ((d[12] >> 1) & 7) + 1 } else { 0 },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builders_and_parsers() {
        let c = rw16_cdb(true, 0x1_0000_0002, 8, 1);
        assert_eq!((c[0], c[1], c[9], c[13]), (0x8A, 0x20, 2, 8));
        assert_eq!(report_luns_cdb(4096)[6..10], 4096u32.to_be_bytes());
        let rl = [
            0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0,
        ];
        assert_eq!(parse_report_luns(&rl), vec![0, 1]);
        let mut rc = [0u8; 32];
        rc[7] = 99;
        rc[10] = 2;
        rc[12] = 1;
        let g = parse_read_capacity16(&rc).unwrap();
        assert_eq!(
            g,
            LunGeometry {
                block_size: 512,
                blocks: 100,
                prot_en: true,
                pi_type: 1
            }
        );
        assert!(parse_read_capacity16(&rc[..5]).is_none());
    }
}
