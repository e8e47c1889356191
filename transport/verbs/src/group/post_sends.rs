//! [`post_sends`]: a connection's queued send work requests, posted in
//! calls of at most [`POST_CHUNK`] (one doorbell each; one call per poll in
//! practice).

use crate::provider::{Provider, QueuePair};
use crate::types::WrId;
use crate::wr::{SendOp, SendWr};
use crate::PostError;

/// Most work requests handed to one `post_send` call.
pub const POST_CHUNK: usize = 32;

/// Post a send work request for each of `queued` to `qp`, built by
/// `wr`, [`POST_CHUNK`] to a call; each call is counted in `doorbells`.
///
/// # Errors
/// The QP refused a request: its [`index`](PostError::index) is its place
/// in `queued`; it and those after it were not posted (and will never
/// complete).
#[inline]
pub fn post_sends<'a, T, P: Provider>(
    qp: &P::Qp,
    queued: &'a [T],
    doorbells: &mut u64,
    mut wr: impl FnMut(&'a T) -> SendWr<'a>,
) -> Result<(), PostError> {
    let mut start = 0;
    for chunk in queued.chunks(POST_CHUNK) {
        let mut wrs = [SendWr::new(WrId(0), SendOp::Send, &[]); POST_CHUNK];
        for (w, q) in wrs.iter_mut().zip(chunk) {
            *w = wr(q);
        }
        *doorbells += 1;
        qp.post_send(&wrs[..chunk.len()]).map_err(|mut e| {
            e.index += start;
            e
        })?;
        start += chunk.len();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::{Pair, SoftFixture};
    use crate::provider::MemoryRegion;
    use crate::types::{QpCaps, RemoteAddr};

    const FX: SoftFixture = SoftFixture::new("pollux-post-sends-test");

    /// `n` signaled one-byte RDMA WRITEs from `a` to `b`, posted on a send
    /// queue of `sq` entries that nobody reaps: the doorbells rung, the
    /// outcome, and the completions `a` then reaps.
    fn write(sq: u32, n: usize) -> (u64, Result<(), PostError>, usize) {
        let caps = QpCaps {
            max_send_wr: sq,
            ..QpCaps::default()
        };
        let p = Pair::<SoftFixture>::connect(&FX, caps, 4096);
        let sge = p.a.sge(0, 1);
        let remote = RemoteAddr {
            addr: p.b.addr(0),
            rkey: p.b.mr.rkey(),
        };
        let mut doorbells = 0;
        let ids: Vec<u64> = (0..n as u64).collect();
        let r = post_sends::<_, crate::soft::Soft>(&p.a.qp, &ids, &mut doorbells, |&i| {
            SendWr::new(
                WrId(i),
                SendOp::RdmaWrite { remote },
                std::slice::from_ref(&sge),
            )
            .signaled()
        });
        let mut done = 0;
        p.until(|p| {
            done += p.a.take_swc().len();
            done >= r.map_or_else(|e| e.index, |()| n)
        });
        (doorbells, r, done)
    }

    #[test]
    fn requests_go_in_calls_of_post_chunk() {
        let (doorbells, r, done) = write(128, 70);
        assert!(r.is_ok(), "{r:?}");
        assert_eq!(doorbells, 3, "32 + 32 + 6");
        assert_eq!(done, 70);
    }

    #[test]
    fn a_refused_request_is_named_by_its_place_among_all() {
        let (doorbells, r, done) = write(40, 70);
        let e = r.expect_err("a send queue of 40");
        assert_eq!(
            e.index, 40,
            "refused in the second call, counted from the first"
        );
        assert_eq!(doorbells, 2, "no call after the refusal");
        assert_eq!(done, 40, "the requests before it were posted");
    }
}
