//! `SgList`: a scatter-gather list of owned [`DmaBuf`] segments.
//!
//! Lists travel by value with every I/O (into a request slot and back out
//! to its completion), so the list is kept to 32 bytes: one segment inline,
//! and a list of two or more in an out-of-line block. Blocks are recycled
//! through a per-thread spare list, so a core that builds and drops
//! multi-segment lists per I/O allocates nothing once warm.

use std::cell::RefCell;
use std::fmt;

use super::buf::DmaBuf;

/// Segments kept inline in an [`SgList`]. Longer lists keep every segment
/// in a block taken from (and given back to) a per-thread spare list.
pub const SG_INLINE: usize = 1;

/// Spare blocks kept per thread; more are freed.
const SPARE_MAX: usize = 1024;
/// Capacity of a new block (a 128 KiB transfer in 32 KiB units fits).
const BLOCK_CAP: usize = 8;

/// The segments of a list of two or more.
type Block = Box<Vec<DmaBuf>>;

thread_local! {
    static SPARE: RefCell<Vec<Block>> = const { RefCell::new(Vec::new()) };
}

/// A block from this thread's spare list, or a new one.
#[cold]
#[inline(never)]
fn take_block() -> Block {
    SPARE
        .try_with(|s| s.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_else(|| Box::new(Vec::with_capacity(BLOCK_CAP)))
}

/// Drop `b`'s segments and keep the block for this thread's next list.
#[cold]
#[inline(never)]
fn recycle(mut b: Block) {
    b.clear();
    // During thread teardown the block is simply freed.
    let _ = SPARE.try_with(move |s| {
        let mut s = s.borrow_mut();
        if s.len() < SPARE_MAX {
            s.push(b);
        }
    });
}

/// A scatter-gather list of owned [`DmaBuf`]s, used by bdev I/O, the io
/// engines and verbs work requests. One segment lives inline; a longer list
/// keeps its segments in a block recycled per thread (no allocation once a
/// thread has had as many multi-segment lists live at once before). Each
/// segment contributes its [`len()`](DmaBuf::len) bytes.
///
/// An empty list owns nothing: dropping or forgetting it is the same.
#[derive(Default)]
pub struct SgList {
    // INVARIANT: at most one of `one` and `more` is `Some`, and `more` is
    // never empty (a list that empties gives its block back).
    one: Option<DmaBuf>,
    more: Option<Block>,
}

impl SgList {
    /// An empty list.
    #[inline]
    pub fn new() -> SgList {
        SgList {
            one: None,
            more: None,
        }
    }

    /// A list of one segment.
    #[inline]
    pub fn from_buf(buf: DmaBuf) -> SgList {
        SgList {
            one: Some(buf),
            more: None,
        }
    }

    /// Append a segment (a second one moves the list into a block).
    #[inline]
    pub fn push(&mut self, buf: DmaBuf) {
        if let Some(m) = self.more.as_mut() {
            m.push(buf);
            return;
        }
        match self.one.take() {
            None => self.one = Some(buf),
            Some(first) => self.spill(first, buf),
        }
    }

    #[cold]
    #[inline(never)]
    fn spill(&mut self, first: DmaBuf, second: DmaBuf) {
        let mut m = take_block();
        m.push(first);
        m.push(second);
        self.more = Some(m);
    }

    /// Remove and return the last segment.
    #[inline]
    pub fn pop(&mut self) -> Option<DmaBuf> {
        match self.more.as_mut() {
            None => self.one.take(),
            Some(m) => {
                let b = m.pop();
                if m.is_empty() {
                    // Keep the invariant: an emptied list gives its block back.
                    self.clear();
                }
                b
            }
        }
    }

    /// Number of segments.
    #[inline]
    pub fn len(&self) -> usize {
        match &self.more {
            None => usize::from(self.one.is_some()),
            Some(m) => m.len(),
        }
    }

    /// Whether there are no segments.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.one.is_none() && self.more.is_none()
    }

    /// Sum of the segments' lengths in bytes.
    #[inline]
    pub fn total_len(&self) -> usize {
        match &self.more {
            None => self.one.as_ref().map_or(0, DmaBuf::len),
            Some(m) => m.iter().map(DmaBuf::len).sum(),
        }
    }

    /// Whether the list holds no block (at most one segment, inline).
    #[inline]
    pub fn is_inline(&self) -> bool {
        self.more.is_none()
    }

    /// The segments.
    #[inline]
    pub fn iter(&self) -> std::slice::Iter<'_, DmaBuf> {
        self.as_slice().iter()
    }

    /// The segments, mutably.
    #[inline]
    pub fn iter_mut(&mut self) -> std::slice::IterMut<'_, DmaBuf> {
        self.as_mut_slice().iter_mut()
    }

    /// The segments as a slice.
    #[inline]
    pub fn as_slice(&self) -> &[DmaBuf] {
        match &self.more {
            None => self.one.as_slice(),
            Some(m) => m,
        }
    }

    /// The segments as a mutable slice.
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [DmaBuf] {
        match &mut self.more {
            None => self.one.as_mut_slice(),
            Some(m) => m,
        }
    }

    /// Drop every segment (returning pool buffers to their pools).
    #[inline]
    pub fn clear(&mut self) {
        self.one = None;
        if let Some(m) = self.more.take() {
            recycle(m);
        }
    }

    /// Copy `src` into the segments in order, from the start; returns the
    /// number of bytes copied (at most `total_len()`).
    #[inline]
    pub fn copy_from_slice(&mut self, src: &[u8]) -> usize {
        let mut done = 0;
        for seg in self.iter_mut() {
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
        for seg in self.iter() {
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

impl Drop for SgList {
    #[inline]
    fn drop(&mut self) {
        if let Some(m) = self.more.take() {
            recycle(m);
        }
    }
}

impl fmt::Debug for SgList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
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
        let mut l = SgList::new();
        l.extend(iter);
        l
    }
}

impl Extend<DmaBuf> for SgList {
    fn extend<I: IntoIterator<Item = DmaBuf>>(&mut self, iter: I) {
        for b in iter {
            self.push(b);
        }
    }
}

/// The segments of an [`SgList`], by value, in order.
pub struct SgIntoIter {
    /// The list, its block reversed so that `pop` yields the next segment.
    list: SgList,
}

impl Iterator for SgIntoIter {
    type Item = DmaBuf;

    #[inline]
    fn next(&mut self) -> Option<DmaBuf> {
        self.list.pop()
    }

    #[inline]
    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.list.len();
        (n, Some(n))
    }
}

impl ExactSizeIterator for SgIntoIter {}

impl fmt::Debug for SgIntoIter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SgIntoIter").field(&self.list.len()).finish()
    }
}

impl IntoIterator for SgList {
    type Item = DmaBuf;
    type IntoIter = SgIntoIter;
    #[inline]
    fn into_iter(mut self) -> SgIntoIter {
        if let Some(m) = self.more.as_mut() {
            m.reverse();
        }
        SgIntoIter { list: self }
    }
}

impl<'a> IntoIterator for &'a SgList {
    type Item = &'a DmaBuf;
    type IntoIter = std::slice::Iter<'a, DmaBuf>;
    #[inline]
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<'a> IntoIterator for &'a mut SgList {
    type Item = &'a mut DmaBuf;
    type IntoIter = std::slice::IterMut<'a, DmaBuf>;
    #[inline]
    fn into_iter(self) -> Self::IntoIter {
        self.iter_mut()
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
    fn one_segment_inline_more_in_a_block_and_lengths_add_up() {
        assert_eq!(
            std::mem::size_of::<SgList>(),
            32,
            "lists move with every I/O"
        );
        let p = pool(6);
        let mut l = SgList::new();
        assert!(l.is_empty() && l.is_inline() && l.as_slice().is_empty());
        let mut b = p.get().unwrap();
        b.set_len(1).unwrap();
        l.push(b);
        assert!(l.is_inline());
        assert_eq!((l.len(), l.total_len()), (1, 1));
        for i in 1..5 {
            let mut b = p.get().unwrap();
            b.set_len(i + 1).unwrap();
            l.push(b);
        }
        assert!(!l.is_inline());
        assert_eq!(l.len(), 5);
        assert_eq!(l.total_len(), 1 + 2 + 3 + 4 + 5);
        let lens: Vec<usize> = l.iter().map(DmaBuf::len).collect();
        assert_eq!(lens, [1, 2, 3, 4, 5], "segments keep their order");
        assert_eq!(l.pop().map(|b| b.len()), Some(5));
        drop(l);
        assert_eq!(p.available(), 6, "segments go back to the pool");
    }

    #[test]
    fn an_emptied_list_owns_nothing_and_blocks_are_reused() {
        let p = pool(4);
        let mut l: SgList = (0..3).map(|_| p.get().unwrap()).collect();
        let block = l.as_slice().as_ptr();
        while l.pop().is_some() {}
        assert!(
            l.is_empty() && l.is_inline(),
            "popping the last segment gives the block back"
        );
        assert_eq!(p.available(), 4);
        // The next list to spill on this thread takes the same block.
        let mut l2: SgList = (0..2).map(|_| p.get().unwrap()).collect();
        assert_eq!(l2.as_slice().as_ptr(), block, "the spare block is reused");
        l2.clear();
        assert!(l2.is_empty() && l2.is_inline());
        let l3: SgList = (0..4).map(|_| p.get().unwrap()).collect();
        assert_eq!(l3.as_slice().as_ptr(), block, "clear gives the block back");
        let order: Vec<*const u8> = l3.iter().map(|b| b.as_slice().as_ptr()).collect();
        let moved: Vec<*const u8> = l3.into_iter().map(|b| b.as_slice().as_ptr()).collect();
        assert_eq!(order, moved, "into_iter yields the segments in order");
        assert_eq!(p.available(), 4);
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
