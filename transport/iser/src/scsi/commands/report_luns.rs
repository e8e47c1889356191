//! REPORT LUNS parameter data.

use crate::pdu::Lun;

/// Write the LUN list for `luns` into `out` (cut to its length); returns
/// the bytes written.
pub fn report_luns(luns: impl Iterator<Item = u16>, out: &mut [u8]) -> usize {
    let mut n = 0usize;
    let mut w = 8usize;
    for l in luns {
        let lun = Lun::from_index(l).0;
        if w + 8 <= out.len() {
            out[w..w + 8].copy_from_slice(&lun);
        }
        w += 8;
        n += 1;
    }
    let list = ((n * 8) as u32).to_be_bytes();
    let hdr = [list[0], list[1], list[2], list[3], 0, 0, 0, 0];
    let h = out.len().min(8);
    out[..h].copy_from_slice(&hdr[..h]);
    w.min(out.len())
}
