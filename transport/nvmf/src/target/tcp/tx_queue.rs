//! The send side of one NVMe/TCP target connection: the shared
//! [`SegQueue`] keyed by request. A read's C2HData payload of
//! [`BY_REF_MIN`] bytes or more is not copied: the queue records
//! (request, offset, length), the response is `Pending` for the core, and
//! each poll's flush hands the socket `writev`s of header bytes and request
//! data in stream order. A mark after each response
//! ([`SegQueue::mark`]) reports the request sent once its last byte is out
//! (the core frees it and its buffers). Smaller payloads are copied into
//! the send buffer: below a page the copy costs less than the extra slice
//! and the request's longer life.

use pollux_reactor::mem::SgList;

use super::super::qpair::QueuePair;
use super::super::transport::ReqTag;
pub(super) use crate::tcp_tx::BY_REF_MIN;
use crate::tcp_tx::{SegQueue, SegSource};

/// What a connection has to send, in order; marks name requests.
pub(super) type TxQueue = SegQueue<ReqTag>;

/// Queued request data is read from the core's queue pair (a request's
/// buffers while its response is `Pending`).
impl SegSource<ReqTag> for QueuePair {
    fn seg_bufs(&self, tag: ReqTag) -> Option<&SgList> {
        QueuePair::response_bufs(self, tag)
    }
}

#[cfg(test)]
mod tests {
    use std::io::ErrorKind;

    use pollux_reactor::mem::SgList;

    use super::TxQueue;
    use crate::spec::tcp::{crc32c, Digests, PduType, SendLayout};
    use crate::target::transport::ReqTag;
    use crate::tcp_test_io::{data, flat, Trickle};
    use crate::tcp_tx::{SegSource, MAX_IOV};

    /// Requests' buffers by slot.
    struct Reqs(Vec<Option<SgList>>);

    impl SegSource<ReqTag> for Reqs {
        fn seg_bufs(&self, tag: ReqTag) -> Option<&SgList> {
            self.0.get(tag.slot())?.as_ref()
        }
    }

    #[test]
    fn headers_and_request_data_leave_in_order_and_each_request_is_reported_once_out() {
        for ddgst in [false, true] {
            let reqs = Reqs(
                (0..8)
                    .map(|s| Some(data(31, s, 3, 4096 + s * 512)))
                    .collect(),
            );
            let mut q = TxQueue::new(1024, 8);
            q.buf.layout = SendLayout::new(
                Digests {
                    header: false,
                    data: ddgst,
                },
                0,
            );
            let mut want = Vec::new();
            let mut ends = Vec::new();
            for s in 0..8 {
                let tag = ReqTag::new(s as u16, 1);
                let bufs = reqs.0[s].as_ref().expect("data");
                let all = flat(bufs);
                // Two C2H-like PDUs per request, split inside a buffer.
                let cut = all.len() / 2 + 3;
                for (off, len) in [(0, cut), (cut, all.len() - cut)] {
                    let before = q.buf.unsent_bytes().to_vec();
                    q.push_pdu(PduType::C2hData, &[0u8; 24], 0, len);
                    want.extend_from_slice(&q.buf.unsent_bytes()[before.len()..]);
                    q.push_ref(tag, bufs, off, len);
                    want.extend_from_slice(&all[off..off + len]);
                    if ddgst {
                        want.extend_from_slice(&crc32c(&all[off..off + len]).to_le_bytes());
                    }
                }
                q.mark(tag);
                ends.push(want.len());
            }
            // The send buffer holds headers and digests only.
            assert!(q.buf.unsent() < 8 * 2 * (24 + 4) + 1);
            let mut sock = Trickle::new(1000);
            let mut sent = Vec::new();
            let mut polls = 0;
            while !q.is_empty() {
                q.flush(&mut sock, &reqs, &mut |t| sent.push(t.slot()))
                    .expect("flush");
                polls += 1;
                assert!(polls < 10_000);
                // A request is reported only once all its bytes are out.
                for &s in &sent {
                    assert!(sock.out.len() >= ends[s], "request {s} reported early");
                }
            }
            assert_eq!(q.unsent(), 0);
            assert!(sock.out == want, "bytes out of order (ddgst {ddgst})");
            assert_eq!(sent, (0..8).collect::<Vec<_>>());
            assert!(sock.max_slices <= MAX_IOV && sock.max_slices > 2);
        }
    }

    /// Takes up to `room` bytes per write and never blocks; counts writes.
    struct Shallow {
        room: usize,
        writes: usize,
        out: Vec<u8>,
    }

    impl std::io::Write for Shallow {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.write_vectored(&[std::io::IoSlice::new(b)])
        }

        fn write_vectored(&mut self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
            self.writes += 1;
            let mut n = 0;
            for b in bufs {
                let m = b.len().min(self.room - n);
                self.out.extend_from_slice(&b[..m]);
                n += m;
                if n == self.room {
                    break;
                }
            }
            Ok(n)
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_write_that_takes_less_than_offered_ends_the_flush() {
        let reqs = Reqs(vec![Some(data(31, 0, 2, 8192))]);
        let mut q = TxQueue::new(1024, 1);
        let tag = ReqTag::new(0, 1);
        let bufs = reqs.0[0].as_ref().expect("data");
        q.push_pdu(PduType::C2hData, &[0u8; 24], 0, 16384);
        q.push_ref(tag, bufs, 0, 16384);
        q.mark(tag);
        let mut sock = Shallow {
            room: 10_000,
            writes: 0,
            out: Vec::new(),
        };
        let mut sent = Vec::new();
        // One write per flush while the socket takes less than offered.
        assert!(q
            .flush(&mut sock, &reqs, &mut |t| sent.push(t.slot()))
            .expect("flush"));
        assert_eq!((sock.writes, sock.out.len()), (1, 10_000));
        assert!(sent.is_empty());
        assert!(q
            .flush(&mut sock, &reqs, &mut |t| sent.push(t.slot()))
            .expect("flush"));
        // The rest fitted: the request is reported, nothing is left.
        assert_eq!((sock.writes, sock.out.len()), (2, 16384 + 24));
        assert_eq!(sent, [0]);
        assert!(q.is_empty());
    }

    #[test]
    fn discard_names_every_request_it_held_and_empties_the_queue() {
        let reqs = Reqs(vec![Some(data(31, 0, 1, 8192)), Some(data(31, 1, 1, 8192))]);
        let mut q = TxQueue::new(1024, 2);
        for s in 0..2 {
            let tag = ReqTag::new(s, 1);
            q.push_pdu(PduType::C2hData, &[0u8; 24], 0, 8192);
            q.push_ref(tag, reqs.0[usize::from(s)].as_ref().expect("data"), 0, 8192);
            q.mark(tag);
        }
        let mut sock = Trickle::new(9000);
        let mut sent = Vec::new();
        q.flush(&mut sock, &reqs, &mut |t| sent.push(t.slot()))
            .expect("flush");
        assert_eq!(sent, [0]);
        let mut held = Vec::new();
        q.discard(&mut |t| held.push(t.slot()));
        assert_eq!(held, [1]);
        assert!(q.is_empty() && q.unsent() == 0);
    }

    #[test]
    fn a_request_whose_buffers_are_gone_is_an_error_not_a_short_stream() {
        let reqs = Reqs(vec![None]);
        let held = data(31, 0, 1, 4096);
        let mut q = TxQueue::new(1024, 1);
        q.push_ref(ReqTag::new(0, 1), &held, 0, 4096);
        let mut sock = Trickle::new(100_000);
        let e = q
            .flush(&mut sock, &reqs, &mut |_| {})
            .expect_err("no buffers");
        assert_eq!(e.kind(), ErrorKind::InvalidData);
        assert!(sock.out.is_empty());
    }
}
