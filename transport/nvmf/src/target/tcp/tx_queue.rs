//! The send side of one NVMe/TCP target connection: PDU headers and small
//! payloads in a [`SendBuf`], interleaved with read data that stays in its
//! request's buffers until the socket has taken it.
//!
//! A read's C2HData payload of [`BY_REF_MIN`] bytes or more is not copied:
//! the queue records (request, offset, length), the response is `Pending`
//! for the core, and each poll's flush hands the socket one `writev` of up
//! to [`MAX_IOV`] slices — header bytes and request data in stream order —
//! as many times as it takes them. When the last byte of a response is out
//! its request is reported sent (the core frees it and its buffers).
//! Smaller payloads are copied into the send buffer: below a page the copy
//! costs less than the extra slice and the request's longer life.

use std::collections::VecDeque;
use std::io::{ErrorKind, IoSlice, Write};

use pollux_reactor::mem::SgList;

use super::super::qpair::QueuePair;
use super::super::transport::ReqTag;
use crate::sg_at::for_each_slice;
use crate::spec::tcp::{crc32c_append, PduType};
use crate::tcp_bufs::SendBuf;

/// Where queued request data is read from when it is written: the core's
/// queue pair (a request's buffers while its response is `Pending`).
pub(super) trait ResponseBufs {
    /// Request `tag`'s buffers, `None` when it has none any more.
    fn response_bufs(&self, tag: ReqTag) -> Option<&SgList>;
}

impl ResponseBufs for QueuePair {
    fn response_bufs(&self, tag: ReqTag) -> Option<&SgList> {
        QueuePair::response_bufs(self, tag)
    }
}

/// Payloads at least this long go out from the request's buffers.
pub(super) const BY_REF_MIN: usize = 4096;
/// Slices per `writev` at most: a header and a payload per response, so a
/// queue of 128 reads leaves in one call (Linux takes up to 1024).
const MAX_IOV: usize = 256;

/// One stretch of the outgoing byte stream.
#[derive(Debug, Clone, Copy)]
enum Seg {
    /// The next `len` bytes of the send buffer.
    Bytes(usize),
    /// `len` bytes of request `tag`'s data from byte `off`.
    Data { tag: ReqTag, off: usize, len: usize },
    /// Everything of request `tag`'s response before this point is out.
    Sent(ReqTag),
}

/// What a connection has to send, in order.
#[derive(Debug)]
pub(super) struct TxQueue {
    /// PDU bytes (headers, digests, copied payloads, responses).
    pub(super) buf: SendBuf,
    segs: VecDeque<Seg>,
    /// Request data queued by reference and not written yet.
    by_ref: usize,
}

impl TxQueue {
    /// A queue with room for `capacity` bytes and `requests` responses
    /// in flight before it grows.
    pub(super) fn new(capacity: usize, requests: usize) -> Self {
        TxQueue {
            buf: SendBuf::new(capacity),
            segs: VecDeque::with_capacity(4 * requests + 16),
            by_ref: 0,
        }
    }

    /// Bytes not written yet (buffered and by reference).
    pub(super) fn unsent(&self) -> usize {
        self.buf.unsent() + self.by_ref
    }

    /// Whether nothing is left to write or report.
    pub(super) fn is_empty(&self) -> bool {
        self.segs.is_empty()
    }

    /// Accounts the bytes the send buffer grew by since it held `before`.
    fn note_bytes(&mut self, before: usize) {
        let n = self.buf.unsent() - before;
        if n == 0 {
            return;
        }
        if let Some(Seg::Bytes(len)) = self.segs.back_mut() {
            *len += n;
        } else {
            self.segs.push_back(Seg::Bytes(n));
        }
    }

    /// Appends bytes as they are (ICResp, TermReq).
    pub(super) fn push_raw(&mut self, b: &[u8]) {
        let before = self.buf.unsent();
        self.buf.push_raw(b);
        self.note_bytes(before);
    }

    /// Appends a PDU header (see [`SendBuf::push_pdu`]).
    pub(super) fn push_pdu(&mut self, t: PduType, hdr: &[u8], flags: u8, data_len: usize) {
        let before = self.buf.unsent();
        self.buf.push_pdu(t, hdr, flags, data_len);
        self.note_bytes(before);
    }

    /// Appends a copied payload (see [`SendBuf::push_data`]).
    pub(super) fn push_data(&mut self, len: usize, fill: impl FnOnce(&mut Vec<u8>)) {
        let before = self.buf.unsent();
        self.buf.push_data(len, fill);
        self.note_bytes(before);
    }

    /// Appends `len` bytes of `bufs` (request `tag`'s, which the core
    /// leaves untouched until [`flush`](Self::flush) reports the request
    /// sent) from byte `off`, then the data digest when it is on.
    pub(super) fn push_ref(&mut self, tag: ReqTag, bufs: &SgList, off: usize, len: usize) {
        if len == 0 {
            return;
        }
        self.segs.push_back(Seg::Data { tag, off, len });
        self.by_ref += len;
        if self.buf.layout.ddgst {
            let mut crc = 0;
            for_each_slice(bufs, off, len, |s| crc = crc32c_append(crc, s));
            self.push_raw(&crc.to_le_bytes());
        }
    }

    /// Marks the end of request `tag`'s response.
    pub(super) fn push_sent(&mut self, tag: ReqTag) {
        self.segs.push_back(Seg::Sent(tag));
    }

    /// Writes as much as the socket takes, one `writev` at a time, taking
    /// request data from `qp`; `sent` hears of each request whose response
    /// is all out. `Ok(true)` when it wrote.
    ///
    /// # Errors
    /// The socket's error (`WriteZero` when the peer is gone);
    /// `InvalidData` when a queued request's buffers are gone (a bug).
    pub(super) fn flush(
        &mut self,
        sock: &mut impl Write,
        qp: &impl ResponseBufs,
        sent: &mut impl FnMut(ReqTag),
    ) -> std::io::Result<bool> {
        let mut wrote = false;
        loop {
            self.consume(0, sent);
            if self.segs.is_empty() {
                return Ok(wrote);
            }
            let res = {
                let mut iov = [IoSlice::new(&[]); MAX_IOV];
                let n = self.gather(qp, &mut iov)?;
                sock.write_vectored(&iov[..n])
            };
            match res {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.consume(n, sent);
                    wrote = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(wrote),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Fills `iov` from the front of the queue; returns the slices used.
    fn gather<'a>(
        &'a self,
        qp: &'a impl ResponseBufs,
        iov: &mut [IoSlice<'a>; MAX_IOV],
    ) -> std::io::Result<usize> {
        let bytes = self.buf.unsent_bytes();
        let mut at = 0;
        let mut n = 0;
        for seg in &self.segs {
            if n == MAX_IOV {
                break;
            }
            match *seg {
                Seg::Bytes(len) => {
                    iov[n] = IoSlice::new(&bytes[at..at + len]);
                    at += len;
                    n += 1;
                }
                Seg::Data { tag, off, len } => {
                    let Some(bufs) = qp.response_bufs(tag) else {
                        return Err(std::io::Error::new(
                            ErrorKind::InvalidData,
                            "a queued response's buffers are gone",
                        ));
                    };
                    for_each_slice(bufs, off, len, |s| {
                        if n < MAX_IOV {
                            iov[n] = IoSlice::new(s);
                            n += 1;
                        }
                    });
                }
                Seg::Sent(_) => {}
            }
        }
        Ok(n)
    }

    /// `n` bytes from the front were written; `sent` hears of the
    /// responses that are then all out.
    fn consume(&mut self, mut n: usize, sent: &mut impl FnMut(ReqTag)) {
        while let Some(seg) = self.segs.front_mut() {
            match seg {
                Seg::Sent(tag) => {
                    let tag = *tag;
                    self.segs.pop_front();
                    sent(tag);
                }
                _ if n == 0 => return,
                Seg::Bytes(len) => {
                    let m = n.min(*len);
                    self.buf.consume(m);
                    *len -= m;
                    n -= m;
                    if *len == 0 {
                        self.segs.pop_front();
                    }
                }
                Seg::Data { off, len, .. } => {
                    let m = n.min(*len);
                    *off += m;
                    *len -= m;
                    self.by_ref -= m;
                    n -= m;
                    if *len == 0 {
                        self.segs.pop_front();
                    }
                }
            }
        }
    }

    /// Drops everything not written (the peer is gone or the connection
    /// gives up); `held` hears of every request whose buffers it held.
    pub(super) fn discard(&mut self, held: &mut impl FnMut(ReqTag)) {
        for seg in self.segs.drain(..) {
            if let Seg::Sent(tag) = seg {
                held(tag);
            }
        }
        self.buf.discard();
        self.by_ref = 0;
    }
}

#[cfg(test)]
mod tests {
    use std::io::ErrorKind;

    use pollux_reactor::mem::SgList;

    use super::{ResponseBufs, TxQueue, MAX_IOV};
    use crate::spec::tcp::{crc32c, Digests, PduType, SendLayout};
    use crate::target::transport::ReqTag;
    use crate::tcp_test_io::{data, flat, Trickle};

    /// Requests' buffers by slot.
    struct Reqs(Vec<Option<SgList>>);

    impl ResponseBufs for Reqs {
        fn response_bufs(&self, tag: ReqTag) -> Option<&SgList> {
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
                q.push_sent(tag);
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

    #[test]
    fn discard_names_every_request_it_held_and_empties_the_queue() {
        let reqs = Reqs(vec![Some(data(31, 0, 1, 8192)), Some(data(31, 1, 1, 8192))]);
        let mut q = TxQueue::new(1024, 2);
        for s in 0..2 {
            let tag = ReqTag::new(s, 1);
            q.push_pdu(PduType::C2hData, &[0u8; 24], 0, 8192);
            q.push_ref(tag, reqs.0[usize::from(s)].as_ref().expect("data"), 0, 8192);
            q.push_sent(tag);
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
