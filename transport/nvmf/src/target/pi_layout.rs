//! Moving blocks between the wire's layout and the bdev's extended-LBA
//! layout, in place, for a command with PRACT set on a namespace whose
//! metadata is exactly the PI tuple: the wire carries data only (`block`
//! bytes per block), the bdev's buffers data followed by `md` bytes of
//! metadata per block. A write is spread out before the bdev generates the
//! tuples; a read is packed back (stripped) after the bdev checked them.
//! Segments may split blocks anywhere; nothing is allocated.

use pollux_reactor::mem::SgList;

use crate::sg_at::{for_each_slice, write_at};

/// Bytes moved at a time through the stack.
const CHUNK: usize = 256;

/// Copy `len` bytes of `bufs` from byte `from` to byte `to` (the ranges
/// may overlap).
fn copy_within(bufs: &mut SgList, from: usize, to: usize, len: usize) {
    let mut tmp = [0u8; CHUNK];
    let mut step = |bufs: &mut SgList, at: usize| {
        let n = CHUNK.min(len - at);
        let mut got = 0;
        for_each_slice(bufs, from + at, n, |s| {
            tmp[got..got + s.len()].copy_from_slice(s);
            got += s.len();
        });
        write_at(bufs, to + at, &tmp[..got]);
    };
    if to <= from {
        // Front to back: a chunk is read before anything lands on it.
        for at in (0..len).step_by(CHUNK) {
            step(bufs, at);
        }
    } else {
        for at in (0..len).step_by(CHUNK).rev() {
            step(bufs, at);
        }
    }
}

/// Spread `n` blocks of `block` data bytes, packed at the front of `bufs`,
/// to `block + md` bytes each (the metadata bytes left as they were).
pub(crate) fn spread(bufs: &mut SgList, block: usize, md: usize, n: usize) {
    for i in (1..n).rev() {
        copy_within(bufs, i * block, i * (block + md), block);
    }
}

/// Pack `n` blocks of `block + md` bytes to their `block` data bytes at
/// the front of `bufs` (the inverse of [`spread`]).
pub(crate) fn strip(bufs: &mut SgList, block: usize, md: usize, n: usize) {
    for i in 1..n {
        copy_within(bufs, i * (block + md), i * block, block);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pollux_reactor::mem::DmaBuf;

    /// `total` bytes in segments of the given lengths (the last takes the
    /// rest).
    fn sg(total: usize, parts: &[usize]) -> SgList {
        let mut l = SgList::new();
        let mut left = total;
        for &p in parts.iter().chain([&usize::MAX]) {
            let n = p.min(left);
            if n == 0 {
                break;
            }
            l.push(DmaBuf::alloc(n).unwrap());
            left -= n;
        }
        l
    }

    fn bytes(l: &SgList) -> Vec<u8> {
        l.iter().flat_map(|b| b.as_slice().to_vec()).collect()
    }

    #[test]
    fn spread_then_strip_round_trips_across_any_segments() {
        for (block, md, n) in [(512usize, 8usize, 5usize), (4096, 8, 3), (512, 64, 4)] {
            let ext = n * (block + md);
            for parts in [&[ext][..], &[700, 3], &[block, 1, 13, 1000]] {
                let mut l = sg(ext, parts);
                let data: Vec<u8> = (0..n * block).map(|i| (i % 251) as u8).collect();
                write_at(&mut l, 0, &data);
                spread(&mut l, block, md, n);
                let got = bytes(&l);
                for i in 0..n {
                    let at = i * (block + md);
                    assert_eq!(
                        &got[at..at + block],
                        &data[i * block..(i + 1) * block],
                        "{block}+{md} × {n}, segments {parts:?}, block {i}"
                    );
                }
                strip(&mut l, block, md, n);
                assert_eq!(&bytes(&l)[..n * block], &data[..]);
            }
        }
    }
}
