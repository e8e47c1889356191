//! Byte ranges of an [`SgList`] at an offset: what a stream transport
//! (NVMe/TCP) needs to move a PDU's data to or from part of a request's
//! buffers.

use pollux_reactor::mem::SgList;

/// The longest contiguous slice of `bufs` starting at byte `off` (empty
/// past the end).
pub(crate) fn slice_at_mut(bufs: &mut SgList, mut off: usize) -> &mut [u8] {
    for b in bufs.iter_mut() {
        let n = b.len();
        if off < n {
            return &mut b.as_mut_slice()[off..];
        }
        off -= n;
    }
    &mut []
}

/// Copy `src` into `bufs` from byte `off`; returns the bytes copied (fewer
/// when `bufs` ends first).
pub(crate) fn write_at(bufs: &mut SgList, off: usize, src: &[u8]) -> usize {
    write_at_with(bufs, off, src, |_| {})
}

/// [`write_at`], calling `landed` with each destination slice once it is
/// written, in order (a data digest over the bytes where they landed).
pub(crate) fn write_at_with(
    bufs: &mut SgList,
    off: usize,
    src: &[u8],
    mut landed: impl FnMut(&[u8]),
) -> usize {
    let mut done = 0;
    while done < src.len() {
        let dst = slice_at_mut(bufs, off + done);
        if dst.is_empty() {
            break;
        }
        let n = dst.len().min(src.len() - done);
        dst[..n].copy_from_slice(&src[done..done + n]);
        landed(&dst[..n]);
        done += n;
    }
    done
}

/// Calls `f` with each contiguous slice of `len` bytes of `bufs` from byte
/// `off`, in order (fewer bytes when `bufs` ends first).
pub(crate) fn for_each_slice<'a>(
    bufs: &'a SgList,
    mut off: usize,
    len: usize,
    mut f: impl FnMut(&'a [u8]),
) {
    let mut left = len;
    for b in bufs.iter() {
        if left == 0 {
            break;
        }
        let s = b.as_slice();
        if off >= s.len() {
            off -= s.len();
            continue;
        }
        let n = (s.len() - off).min(left);
        f(&s[off..off + n]);
        left -= n;
        off = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pollux_reactor::mem::DmaBuf;

    fn two_bufs() -> SgList {
        let mut l = SgList::new();
        for _ in 0..2 {
            let mut b = DmaBuf::alloc(8).expect("alloc");
            b.as_mut_slice().fill(0);
            l.push(b);
        }
        l
    }

    #[test]
    fn writes_and_reads_across_buffer_boundaries() {
        let mut l = two_bufs();
        assert_eq!(write_at(&mut l, 5, &[1, 2, 3, 4, 5, 6]), 6);
        let mut out = Vec::new();
        for_each_slice(&l, 4, 8, |s| out.extend_from_slice(s));
        assert_eq!(out, [0, 1, 2, 3, 4, 5, 6, 0]);
        assert_eq!(write_at(&mut l, 14, &[9; 5]), 2);
        assert_eq!(slice_at_mut(&mut l, 16).len(), 0);
        assert_eq!(slice_at_mut(&mut l, 9).len(), 7);
        let mut seen = Vec::new();
        assert_eq!(
            write_at_with(&mut l, 6, &[7, 8, 9, 10], |s| seen.push(s.to_vec())),
            4
        );
        assert_eq!(seen, [vec![7, 8], vec![9, 10]]);
    }
}
