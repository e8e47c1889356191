//! [`RecvRepost`]: the receive buffers of a poll group's shared receive
//! queue that wait to be posted (again), and how many are posted now.
//!
//! Both RDMA targets (NVMe-oF, iSER) keep a per-core pool of receive
//! buffers behind one SRQ: a receive completion hands its buffer id back
//! ([`completed`](RecvRepost::completed), then [`push`](RecvRepost::push)
//! once the capsule or PDU in it is consumed), and the group posts every
//! waiting buffer once per poll in batches of [`POST_BATCH`] work requests
//! ([`post`](RecvRepost::post)), each tagged `Token(Recv, u16::MAX, 0, id)`.
//! A queue pair without SRQ keeps its own receives the same way, tagged
//! with its connection's slot and generation
//! ([`post_tagged`](RecvRepost::post_tagged)). What a buffer's scatter list
//! is stays with the transport (the NVMe-oF target adds a lent data buffer
//! as a second entry).

use crate::token::{WrKind, WrToken};
use crate::types::{Sge, WrId};
use crate::wr::RecvWr;
use crate::PostError;

/// Work requests handed to one `post_recv` call.
pub const POST_BATCH: usize = 32;

/// The buffer ids waiting to be posted, oldest first, and the count of
/// buffers posted and not yet completed. Control path allocates (its
/// capacity is the pool's size); the data path does not.
#[derive(Debug, Default)]
pub struct RecvRepost {
    waiting: Vec<u32>,
    posted: usize,
}

impl RecvRepost {
    /// Nothing waiting; room for `count` ids without growing.
    pub fn with_capacity(count: usize) -> Self {
        Self {
            waiting: Vec::with_capacity(count),
            posted: 0,
        }
    }

    /// Buffers `0..count` waiting (a fresh pool).
    pub fn all(count: u32) -> Self {
        let mut r = Self::with_capacity(count as usize);
        r.waiting.extend(0..count);
        r
    }

    /// Buffer `id` waits to be posted.
    #[inline]
    pub fn push(&mut self, id: u32) {
        self.waiting.push(id);
    }

    /// Forget the waiting buffers (the caller took them back).
    pub fn clear(&mut self) {
        self.waiting.clear();
    }

    /// Buffers `ids` wait to be posted.
    pub fn extend(&mut self, ids: impl IntoIterator<Item = u32>) {
        self.waiting.extend(ids);
    }

    /// A posted buffer came back in a completion (it is the caller's until
    /// it is [`push`](Self::push)ed again).
    #[inline]
    pub fn completed(&mut self) {
        self.posted = self.posted.saturating_sub(1);
    }

    /// Whether no buffer waits.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Buffers waiting to be posted.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Buffers posted and not completed yet.
    pub fn posted(&self) -> usize {
        self.posted
    }

    /// Post the waiting buffers, oldest first, [`POST_BATCH`] work requests
    /// per `post_recv` call. `sges(id, entries)` fills buffer `id`'s scatter
    /// list (at most `N` entries) and returns how many it used, or `None`
    /// when the buffer cannot be posted now (it and the ones after it keep
    /// waiting). Stops at the first refused work request; the refused one
    /// and those after it keep waiting.
    ///
    /// # Errors
    ///
    /// The provider's [`PostError`] (its `index` counts within the batch).
    #[inline]
    pub fn post<const N: usize>(
        &mut self,
        sges: impl FnMut(u32, &mut [Sge; N]) -> Option<usize>,
        post_recv: impl FnMut(&[RecvWr<'_>]) -> Result<(), PostError>,
    ) -> Result<(), PostError> {
        self.post_tagged(u16::MAX, 0, sges, post_recv)
    }

    /// [`post`](Self::post) with the tokens naming connection slot `conn`,
    /// generation `gen` (a queue pair's own receives).
    ///
    /// # Errors
    ///
    /// As [`post`](Self::post).
    pub fn post_tagged<const N: usize>(
        &mut self,
        conn: u16,
        gen: u16,
        mut sges: impl FnMut(u32, &mut [Sge; N]) -> Option<usize>,
        mut post_recv: impl FnMut(&[RecvWr<'_>]) -> Result<(), PostError>,
    ) -> Result<(), PostError> {
        let total = self.waiting.len();
        let mut done = 0;
        let mut res = Ok(());
        while done < total {
            let mut lists = [[Sge::default(); N]; POST_BATCH];
            let mut lens = [0usize; POST_BATCH];
            let mut n = 0;
            for &id in &self.waiting[done..(done + POST_BATCH).min(total)] {
                let Some(k) = sges(id, &mut lists[n]) else {
                    break;
                };
                lens[n] = k.min(N);
                n += 1;
            }
            if n == 0 {
                break;
            }
            let mut wrs = [RecvWr {
                wr_id: WrId(0),
                sg_list: &[],
            }; POST_BATCH];
            for (k, w) in wrs.iter_mut().enumerate().take(n) {
                let id = self.waiting[done + k];
                *w = RecvWr {
                    wr_id: WrToken::new(WrKind::Recv, conn, gen, id).encode(),
                    sg_list: &lists[k][..lens[k]],
                };
            }
            if let Err(e) = post_recv(&wrs[..n]) {
                done += e.index;
                res = Err(e);
                break;
            }
            done += n;
            if n < POST_BATCH {
                break;
            }
        }
        self.posted += done;
        self.waiting.drain(..done);
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PostErrorKind;

    fn one(id: u32, e: &mut [Sge; 1]) -> Option<usize> {
        e[0] = Sge {
            addr: u64::from(id) * 4096,
            length: 4096,
            lkey: 7,
        };
        Some(1)
    }

    #[test]
    fn posts_every_waiting_buffer_in_batches_oldest_first() {
        let mut r = RecvRepost::all(70);
        let mut calls = Vec::new();
        let mut ids = Vec::new();
        r.post(one, |wrs| {
            calls.push(wrs.len());
            for w in wrs {
                let t = WrToken::decode(w.wr_id);
                assert_eq!((t.kind, t.conn), (WrKind::Recv, u16::MAX));
                assert_eq!(w.sg_list[0].addr, u64::from(t.index) * 4096);
                ids.push(t.index);
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(calls, [32, 32, 6]);
        assert_eq!(ids, (0..70).collect::<Vec<_>>());
        assert_eq!((r.waiting(), r.posted()), (0, 70));
        r.completed();
        r.push(5);
        assert_eq!((r.waiting(), r.posted()), (1, 69));
    }

    #[test]
    fn tagged_posts_name_the_connection() {
        let mut r = RecvRepost::with_capacity(4);
        r.extend([9, 3]);
        let mut got = Vec::new();
        r.post_tagged(12, 0x1234, one, |wrs| {
            got.extend(wrs.iter().map(|w| WrToken::decode(w.wr_id)));
            Ok(())
        })
        .unwrap();
        assert_eq!(
            got,
            [9, 3].map(|i| WrToken::new(WrKind::Recv, 12, 0x1234, i))
        );
        r.push(1);
        r.clear();
        assert!(r.is_empty());
    }

    #[test]
    fn a_refused_request_and_those_after_it_keep_waiting() {
        let mut r = RecvRepost::all(40);
        let e = r
            .post(one, |wrs| {
                if wrs.len() == 32 {
                    Ok(())
                } else {
                    Err(PostError {
                        index: 3,
                        kind: PostErrorKind::QueueFull,
                    })
                }
            })
            .unwrap_err();
        assert_eq!(e.index, 3);
        assert_eq!((r.posted(), r.waiting()), (35, 5));
        let mut next = Vec::new();
        r.post(one, |wrs| {
            next.extend(wrs.iter().map(|w| WrToken::decode(w.wr_id).index));
            Ok(())
        })
        .unwrap();
        assert_eq!(next, [35, 36, 37, 38, 39]);
    }

    #[test]
    fn a_buffer_that_cannot_be_posted_holds_back_the_rest() {
        let mut r = RecvRepost::all(10);
        let two = |id: u32, e: &mut [Sge; 2]| {
            (id != 4).then(|| {
                e[0].length = 64;
                e[1].length = 4096;
                2
            })
        };
        let mut lens = Vec::new();
        r.post(two, |wrs| {
            lens.extend(wrs.iter().map(|w| w.sg_list.len()));
            Ok(())
        })
        .unwrap();
        assert_eq!(lens, [2, 2, 2, 2]);
        assert_eq!((r.posted(), r.waiting()), (4, 6));
    }
}
