//! The send side of one NVMe/TCP host queue: PDU headers, digests and
//! small payloads in a [`SendBuf`], interleaved with write data that stays
//! in the caller's buffers (lent by the core per slot, [`SlotBufs`]) until
//! the socket has taken it.
//!
//! A payload of [`BY_REF_MIN`] bytes or more (in-capsule data, H2CData) is
//! recorded as (slot, offset, length); each flush hands the socket one
//! `writev` of up to [`MAX_IOV`] slices, header bytes and slot data in
//! stream order, as many times as it takes them (a plain `write` when only
//! send-buffer bytes are queued). When the last byte of
//! such a payload is out, the flush names its slot, so the queue knows when
//! the command's buffers are no longer referred to.

use std::collections::VecDeque;
use std::io::{ErrorKind, IoSlice, Write};

use pollux_reactor::mem::SgList;

use super::super::transport::SlotBufs;
use crate::sg_at::for_each_slice;
use crate::spec::tcp::{crc32c_append, PduType};
use crate::tcp_bufs::SendBuf;

/// Payloads at least this long are sent from the caller's buffers. Below a
/// page, copying into the send buffer costs less than another slice in the
/// `writev` and the bookkeeping of a reference (the slot's completion must
/// wait until the payload is out).
pub(super) const BY_REF_MIN: usize = 4096;
/// Slices per `writev` at most (a header, a payload and a digest per
/// command: a queue of 64 writes leaves in one call).
const MAX_IOV: usize = 192;
/// Slices of the array used while few segments are queued.
const SMALL_IOV: usize = 16;

/// One stretch of the outgoing byte stream.
#[derive(Debug, Clone, Copy)]
enum Seg {
    /// The next `len` bytes of the send buffer.
    Bytes(usize),
    /// `len` bytes of slot `slot`'s buffers from byte `off`.
    Data { slot: u16, off: usize, len: usize },
}

/// What a host queue has to send, in order.
#[derive(Debug)]
pub(super) struct TxQueue {
    /// PDU bytes (headers, digests, copied payloads).
    pub(super) buf: SendBuf,
    segs: VecDeque<Seg>,
}

impl TxQueue {
    /// A queue with room for `capacity` bytes and `entries` commands in
    /// flight before it grows.
    pub(super) fn new(capacity: usize, entries: usize) -> Self {
        TxQueue {
            buf: SendBuf::new(capacity),
            segs: VecDeque::with_capacity(4 * entries + 16),
        }
    }

    /// Whether nothing is left to write.
    #[cfg(test)]
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

    /// Appends bytes as they are (ICReq, TermReq).
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

    /// Appends a copy of `len` bytes of `bufs` from byte `off`, then the
    /// data digest when it is on.
    pub(super) fn push_copy(&mut self, bufs: &SgList, off: usize, len: usize) {
        let before = self.buf.unsent();
        self.buf.push_data(len, |out| {
            for_each_slice(bufs, off, len, |s| out.extend_from_slice(s));
        });
        self.note_bytes(before);
    }

    /// Appends `len` bytes of slot `slot`'s buffers `bufs` from byte `off`
    /// by reference, then the data digest (computed now, over `bufs`) when
    /// it is on. [`flush`](Self::flush) takes the bytes from the lender,
    /// which must lend the same buffers until it names the slot.
    pub(super) fn push_ref(&mut self, slot: u16, bufs: &SgList, off: usize, len: usize) {
        if len == 0 {
            return;
        }
        self.segs.push_back(Seg::Data { slot, off, len });
        if self.buf.layout.ddgst {
            let mut crc = 0;
            for_each_slice(bufs, off, len, |s| crc = crc32c_append(crc, s));
            self.push_raw(&crc.to_le_bytes());
        }
    }

    /// Writes as much as the socket takes, one `writev` at a time, taking
    /// slot data from `bufs`; `out` hears of the slot of each payload
    /// pushed by [`push_ref`](Self::push_ref) once all of it is written.
    /// `Ok(true)` when it wrote.
    ///
    /// # Errors
    /// The socket's error (`WriteZero` when the peer is gone);
    /// `InvalidData` when a queued slot's buffers are not lent (a bug).
    pub(super) fn flush(
        &mut self,
        sock: &mut impl Write,
        bufs: &dyn SlotBufs,
        out: &mut impl FnMut(u16),
    ) -> std::io::Result<bool> {
        let mut wrote = false;
        while !self.segs.is_empty() {
            let res = match self.segs.front() {
                // Send-buffer bytes alone (command capsules of reads, small
                // writes): one plain write, no slice array to set up.
                Some(&Seg::Bytes(len)) if self.segs.len() == 1 => {
                    sock.write(&self.buf.unsent_bytes()[..len])
                }
                // A few commands' worth (the usual case once the queue is
                // warm): a small array costs less to set up.
                _ if self.segs.len() <= SMALL_IOV / 2 => {
                    let mut iov = [IoSlice::new(&[]); SMALL_IOV];
                    let n = self.gather(bufs, &mut iov)?;
                    sock.write_vectored(&iov[..n])
                }
                _ => {
                    let mut iov = [IoSlice::new(&[]); MAX_IOV];
                    let n = self.gather(bufs, &mut iov)?;
                    sock.write_vectored(&iov[..n])
                }
            };
            match res {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.consume(n, out);
                    wrote = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(wrote)
    }

    /// Fills `iov` from the front of the queue; returns the slices used.
    fn gather<'a>(
        &'a self,
        bufs: &'a dyn SlotBufs,
        iov: &mut [IoSlice<'a>],
    ) -> std::io::Result<usize> {
        let bytes = self.buf.unsent_bytes();
        let max = iov.len();
        let mut at = 0;
        let mut n = 0;
        for seg in &self.segs {
            if n == max {
                break;
            }
            match *seg {
                Seg::Bytes(len) => {
                    iov[n] = IoSlice::new(&bytes[at..at + len]);
                    at += len;
                    n += 1;
                }
                Seg::Data { slot, off, len } => {
                    let Some(data) = bufs.bufs(slot) else {
                        return Err(std::io::Error::new(
                            ErrorKind::InvalidData,
                            "a queued write's buffers are not lent",
                        ));
                    };
                    for_each_slice(data, off, len, |s| {
                        if n < max {
                            iov[n] = IoSlice::new(s);
                            n += 1;
                        }
                    });
                }
            }
        }
        Ok(n)
    }

    /// `n` bytes from the front were written; `out` hears of the slots
    /// whose payloads are then all out.
    fn consume(&mut self, mut n: usize, out: &mut impl FnMut(u16)) {
        while n > 0 {
            let Some(seg) = self.segs.front_mut() else {
                return;
            };
            match seg {
                Seg::Bytes(len) => {
                    let m = n.min(*len);
                    self.buf.consume(m);
                    *len -= m;
                    n -= m;
                    if *len == 0 {
                        self.segs.pop_front();
                    }
                }
                Seg::Data { slot, off, len } => {
                    let m = n.min(*len);
                    *off += m;
                    *len -= m;
                    n -= m;
                    if *len == 0 {
                        let slot = *slot;
                        self.segs.pop_front();
                        out(slot);
                    }
                }
            }
        }
    }

    /// Drops everything not written (the queue is dead).
    pub(super) fn discard(&mut self) {
        self.segs.clear();
        self.buf.discard();
    }
}

#[cfg(test)]
mod tests {
    use std::io::ErrorKind;

    use pollux_reactor::mem::SgList;

    use super::{SlotBufs, TxQueue, BY_REF_MIN, MAX_IOV};
    use crate::spec::tcp::{crc32c, Digests, PduType, SendLayout};
    use crate::tcp_test_io::{data, flat, Trickle};

    /// Slots' buffers.
    struct Slots(Vec<Option<SgList>>);

    impl SlotBufs for Slots {
        fn bufs(&self, slot: u16) -> Option<&SgList> {
            self.0.get(usize::from(slot))?.as_ref()
        }

        fn bufs_mut(&mut self, slot: u16) -> Option<&mut SgList> {
            self.0.get_mut(usize::from(slot))?.as_mut()
        }
    }

    #[test]
    fn copied_and_referenced_payloads_leave_in_order_and_each_slot_is_named_once_out() {
        for ddgst in [false, true] {
            let slots = Slots(
                (0..6)
                    .map(|s| Some(data(29, s, 3, 2048 + s * 700)))
                    .collect(),
            );
            let mut q = TxQueue::new(1024, 6);
            q.buf.layout = SendLayout::new(
                Digests {
                    header: false,
                    data: ddgst,
                },
                0,
            );
            let mut want = Vec::new();
            let mut ends = Vec::new();
            for s in 0..6u16 {
                let bufs = slots.0[usize::from(s)].as_ref().expect("data");
                let all = flat(bufs);
                // A small copied piece, then a referenced one that starts
                // inside a buffer and spans the others.
                let cut = 1000;
                assert!(all.len() - cut >= BY_REF_MIN);
                for (off, len, by_ref) in [(0, cut, false), (cut, all.len() - cut, true)] {
                    let before = q.buf.unsent_bytes().to_vec();
                    q.push_pdu(PduType::H2cData, &[0u8; 24], 0, len);
                    want.extend_from_slice(&q.buf.unsent_bytes()[before.len()..]);
                    if by_ref {
                        q.push_ref(s, bufs, off, len);
                    } else {
                        q.push_copy(bufs, off, len);
                    }
                    want.extend_from_slice(&all[off..off + len]);
                    if ddgst {
                        want.extend_from_slice(&crc32c(&all[off..off + len]).to_le_bytes());
                    }
                }
                ends.push(want.len());
            }
            let mut sock = Trickle::new(777);
            let mut named = Vec::new();
            let mut rounds = 0;
            while !q.is_empty() {
                q.flush(&mut sock, &slots, &mut |s| named.push(usize::from(s)))
                    .expect("flush");
                rounds += 1;
                assert!(rounds < 10_000);
                for &s in &named {
                    // Named only once every byte of its payload is out (the
                    // digest may follow).
                    assert!(sock.out.len() + 4 >= ends[s], "slot {s} named early");
                }
            }
            assert!(sock.out == want, "bytes out of order (ddgst {ddgst})");
            assert_eq!(named, (0..6).collect::<Vec<_>>());
            assert!(sock.max_slices <= MAX_IOV && sock.max_slices > 2);
        }
    }

    #[test]
    fn a_payload_over_more_buffers_than_one_writev_takes_goes_out_whole() {
        let slots = Slots(vec![Some(data(29, 0, 40, 512))]);
        let all = flat(slots.0[0].as_ref().expect("data"));
        let mut q = TxQueue::new(1024, 1);
        q.push_pdu(PduType::H2cData, &[0u8; 24], 0, all.len());
        let mut want = q.buf.unsent_bytes().to_vec();
        q.push_ref(0, slots.0[0].as_ref().expect("data"), 0, all.len());
        want.extend_from_slice(&all);
        let mut sock = Trickle::new(usize::MAX / 2);
        let mut named = 0;
        while !q.is_empty() {
            q.flush(&mut sock, &slots, &mut |_| named += 1)
                .expect("flush");
        }
        assert!(sock.out == want);
        assert_eq!(named, 1);
        assert!(sock.max_slices <= MAX_IOV);
    }

    #[test]
    fn a_slot_whose_buffers_are_not_lent_is_an_error_not_a_short_stream() {
        let held = data(29, 0, 1, 4096);
        let mut q = TxQueue::new(1024, 1);
        q.push_ref(0, &held, 0, 4096);
        let mut sock = Trickle::new(100_000);
        let e = q
            .flush(&mut sock, &Slots(vec![None]), &mut |_| {})
            .expect_err("not lent");
        assert_eq!(e.kind(), ErrorKind::InvalidData);
        assert!(sock.out.is_empty());
        q.discard();
        assert!(q.is_empty());
    }
}
