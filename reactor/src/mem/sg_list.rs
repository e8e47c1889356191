//! `SgList`: a scatter-gather list of owned [`DmaBuf`] segments.

use smallvec::SmallVec;

use super::buf::DmaBuf;

/// Segments kept inline (no heap allocation) in an [`SgList`].
pub const SG_INLINE: usize = 4;

/// A scatter-gather list of owned [`DmaBuf`]s, used by bdev I/O, the io
/// engines and verbs work requests. Up to [`SG_INLINE`] segments live inline,
/// so building a list of that many allocates nothing. Each segment
/// contributes its [`len()`](DmaBuf::len) bytes.
#[derive(Debug, Default)]
pub struct SgList {
    segs: SmallVec<[DmaBuf; SG_INLINE]>,
}

impl SgList {
    /// An empty list.
    #[inline]
    pub fn new() -> SgList {
        SgList {
            segs: SmallVec::new(),
        }
    }

    /// A list of one segment.
    #[inline]
    pub fn from_buf(buf: DmaBuf) -> SgList {
        let mut l = SgList::new();
        l.push(buf);
        l
    }

    /// Append a segment (allocates only past [`SG_INLINE`] segments).
    #[inline]
    pub fn push(&mut self, buf: DmaBuf) {
        self.segs.push(buf);
    }

    /// Remove and return the last segment.
    #[inline]
    pub fn pop(&mut self) -> Option<DmaBuf> {
        self.segs.pop()
    }

    /// Number of segments.
    #[inline]
    pub fn len(&self) -> usize {
        self.segs.len()
    }

    /// Whether there are no segments.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.segs.is_empty()
    }

    /// Sum of the segments' lengths in bytes.
    #[inline]
    pub fn total_len(&self) -> usize {
        match self.segs.as_slice() {
            [one] => one.len(),
            segs => segs.iter().map(DmaBuf::len).sum(),
        }
    }

    /// Whether the segments are still inline (no heap allocation).
    #[inline]
    pub fn is_inline(&self) -> bool {
        !self.segs.spilled()
    }

    /// The segments.
    #[inline]
    pub fn iter(&self) -> std::slice::Iter<'_, DmaBuf> {
        self.segs.iter()
    }

    /// The segments, mutably.
    #[inline]
    pub fn iter_mut(&mut self) -> std::slice::IterMut<'_, DmaBuf> {
        self.segs.iter_mut()
    }

    /// The segments as a slice.
    #[inline]
    pub fn as_slice(&self) -> &[DmaBuf] {
        &self.segs
    }

    /// The segments as a mutable slice.
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [DmaBuf] {
        &mut self.segs
    }

    /// Drop every segment (returning pool buffers to their pools).
    #[inline]
    pub fn clear(&mut self) {
        self.segs.clear();
    }

    /// Copy `src` into the segments in order, from the start; returns the
    /// number of bytes copied (at most `total_len()`).
    #[inline]
    pub fn copy_from_slice(&mut self, src: &[u8]) -> usize {
        let mut done = 0;
        for seg in self.segs.iter_mut() {
            if done == src.len() {
                break;
            }
            let n = seg.len().min(src.len() - done);
            seg.as_mut_slice()[..n].copy_from_slice(&src[done..done + n]);
            done += n;
        }
        done
    }

    /// Copy the segments' bytes, in order, into `dst`; returns the number of
    /// bytes copied (at most `total_len()`).
    #[inline]
    pub fn copy_to_slice(&self, dst: &mut [u8]) -> usize {
        let mut done = 0;
        for seg in self.segs.iter() {
            if done == dst.len() {
                break;
            }
            let n = seg.len().min(dst.len() - done);
            dst[done..done + n].copy_from_slice(&seg.as_slice()[..n]);
            done += n;
        }
        done
    }
}

impl From<DmaBuf> for SgList {
    #[inline]
    fn from(buf: DmaBuf) -> SgList {
        SgList::from_buf(buf)
    }
}

impl FromIterator<DmaBuf> for SgList {
    fn from_iter<I: IntoIterator<Item = DmaBuf>>(iter: I) -> SgList {
        SgList {
            segs: iter.into_iter().collect(),
        }
    }
}

impl Extend<DmaBuf> for SgList {
    fn extend<I: IntoIterator<Item = DmaBuf>>(&mut self, iter: I) {
        self.segs.extend(iter);
    }
}

impl IntoIterator for SgList {
    type Item = DmaBuf;
    type IntoIter = smallvec::IntoIter<[DmaBuf; SG_INLINE]>;
    #[inline]
    fn into_iter(self) -> Self::IntoIter {
        self.segs.into_iter()
    }
}

impl<'a> IntoIterator for &'a SgList {
    type Item = &'a DmaBuf;
    type IntoIter = std::slice::Iter<'a, DmaBuf>;
    #[inline]
    fn into_iter(self) -> Self::IntoIter {
        self.segs.iter()
    }
}

impl<'a> IntoIterator for &'a mut SgList {
    type Item = &'a mut DmaBuf;
    type IntoIter = std::slice::IterMut<'a, DmaBuf>;
    #[inline]
    fn into_iter(self) -> Self::IntoIter {
        self.segs.iter_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::{BufPool, BufPoolOptions, HugepageMode};

    fn pool(n: usize) -> BufPool {
        let mut o = BufPoolOptions::new("t-sg", 16, n);
        o.hugepages = HugepageMode::Never;
        BufPool::new(o).unwrap()
    }

    #[test]
    fn inline_up_to_four_and_lengths_add_up() {
        let p = pool(6);
        let mut l = SgList::new();
        for i in 0..4 {
            let mut b = p.get().unwrap();
            b.set_len(i + 1).unwrap();
            l.push(b);
        }
        assert!(l.is_inline());
        assert_eq!(l.len(), 4);
        assert_eq!(l.total_len(), 1 + 2 + 3 + 4);
        l.push(p.get().unwrap());
        assert!(!l.is_inline());
        assert_eq!(l.total_len(), 10 + 16);
        drop(l);
        assert_eq!(p.available(), 6, "segments go back to the pool");
    }

    #[test]
    fn copy_in_and_out_across_segments() {
        let p = pool(3);
        let mut l: SgList = (0..3).map(|_| p.get().unwrap()).collect();
        let src: Vec<u8> = (0..40u8).collect();
        assert_eq!(l.copy_from_slice(&src), 40);
        assert_eq!(l.as_slice()[1].as_slice()[0], 16);
        assert_eq!(l.as_slice()[2].as_slice()[7], 39);
        let mut dst = vec![0u8; 48];
        assert_eq!(l.copy_to_slice(&mut dst), 48);
        assert_eq!(&dst[..40], &src[..]);
        let segs: Vec<DmaBuf> = l.into_iter().collect();
        assert_eq!(segs.len(), 3);
    }
}
