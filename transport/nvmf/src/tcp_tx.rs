//! [`SegQueue`]: the send side of one NVMe/TCP connection, target or host.
//! PDU headers, digests and small payloads are copied into a [`SendBuf`];
//! large payloads stay in their owner's buffers (a target's request, a
//! host's slot: named by a key `K`) and are recorded as (key, offset,
//! length). Each flush hands the socket `writev`s of header bytes and
//! owner data in stream order, as many as it takes; a mark pushed after a
//! payload tells the owner, once every byte before it is out, that its
//! buffers are no longer referred to.

use std::collections::VecDeque;
use std::io::{ErrorKind, IoSlice, Write};

use pollux_reactor::mem::SgList;

use crate::sg_at::for_each_slice;
use crate::spec::tcp::{crc32c_append, PduType};
use crate::tcp_bufs::SendBuf;

/// Payloads at least this long go out from their owner's buffers. Below
/// a page, copying into the send buffer costs less than another slice in
/// the `writev` and the owner's longer wait for its mark.
pub(crate) const BY_REF_MIN: usize = 4096;
/// Slices per `writev` at most: a header, a payload and a digest per
/// command, so a queue of 64 writes or 128 reads leaves in one call (Linux
/// takes up to 1024).
pub(crate) const MAX_IOV: usize = 256;
/// Slices of the array used while few segments are queued (it costs less
/// to set up).
const SMALL_IOV: usize = 16;

/// Where queued owner data is read from when it is written.
pub(crate) trait SegSource<K> {
    /// Owner `key`'s buffers; `None` when it has none any more (a bug:
    /// the flush fails with `InvalidData`).
    fn seg_bufs(&self, key: K) -> Option<&SgList>;
}

/// One stretch of the outgoing byte stream.
#[derive(Debug, Clone, Copy)]
enum Seg<K> {
    /// The next `len` bytes of the send buffer.
    Bytes(usize),
    /// `len` bytes of owner `key`'s data from byte `off`; `mark`: a
    /// [`Mark`](Seg::Mark) of `key` follows at once (folded in: one
    /// segment less per payload sent by reference).
    Data {
        key: K,
        off: usize,
        len: usize,
        mark: bool,
    },
    /// Everything queued for `key` before this point is out.
    Mark(K),
}

/// What one connection has to send, in order.
#[derive(Debug)]
pub(crate) struct SegQueue<K> {
    /// PDU bytes (headers, digests, copied payloads).
    pub(crate) buf: SendBuf,
    segs: VecDeque<Seg<K>>,
    /// Owner data queued by reference and not written yet.
    by_ref: usize,
}

impl<K: Copy + PartialEq> SegQueue<K> {
    /// A queue with room for `capacity` bytes and `entries` commands in
    /// flight before it grows.
    pub(crate) fn new(capacity: usize, entries: usize) -> Self {
        SegQueue {
            buf: SendBuf::new(capacity),
            segs: VecDeque::with_capacity(4 * entries + 16),
            by_ref: 0,
        }
    }

    /// Bytes not written yet (buffered and by reference).
    pub(crate) fn unsent(&self) -> usize {
        self.buf.unsent() + self.by_ref
    }

    /// Whether nothing is left to write or report.
    pub(crate) fn is_empty(&self) -> bool {
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

    /// Appends bytes as they are (ICReq/ICResp, TermReq).
    pub(crate) fn push_raw(&mut self, b: &[u8]) {
        let before = self.buf.unsent();
        self.buf.push_raw(b);
        self.note_bytes(before);
    }

    /// Appends a PDU header (see [`SendBuf::push_pdu`]).
    pub(crate) fn push_pdu<const N: usize>(
        &mut self,
        t: PduType,
        hdr: &[u8; N],
        flags: u8,
        data_len: usize,
    ) {
        let before = self.buf.unsent();
        self.buf.push_pdu(t, hdr, flags, data_len);
        self.note_bytes(before);
    }

    /// Appends a PDU header (see [`SendBuf::push_pdu`]) and a copy of its
    /// `len` bytes of data from `bufs` at byte `off`, then the data digest
    /// when it is on: one stretch of the send buffer.
    pub(crate) fn push_pdu_copy<const N: usize>(
        &mut self,
        t: PduType,
        hdr: &[u8; N],
        flags: u8,
        bufs: &SgList,
        off: usize,
        len: usize,
    ) {
        let before = self.buf.unsent();
        self.buf.push_pdu(t, hdr, flags, len);
        self.buf.push_data(len, |out| {
            for_each_slice(bufs, off, len, |s| out.extend_from_slice(s));
        });
        self.note_bytes(before);
    }

    /// Appends `len` bytes of owner `key`'s buffers `bufs` from byte `off`
    /// by reference, then the data digest (computed now, over `bufs`) when
    /// it is on. [`flush`](Self::flush) takes the bytes from its source,
    /// which must hold the same buffers until a later [`mark`](Self::mark)
    /// of `key` is reported.
    pub(crate) fn push_ref(&mut self, key: K, bufs: &SgList, off: usize, len: usize) {
        if len == 0 {
            return;
        }
        self.segs.push_back(Seg::Data {
            key,
            off,
            len,
            mark: false,
        });
        self.by_ref += len;
        if self.buf.layout.ddgst {
            let mut crc = 0;
            for_each_slice(bufs, off, len, |s| crc = crc32c_append(crc, s));
            self.push_raw(&crc.to_le_bytes());
        }
    }

    /// Report `key` to the flush's `marked` once everything queued before
    /// this point is written.
    pub(crate) fn mark(&mut self, key: K) {
        if let Some(Seg::Data {
            key: k,
            mark: m @ false,
            ..
        }) = self.segs.back_mut()
        {
            if *k == key {
                *m = true;
                return;
            }
        }
        self.segs.push_back(Seg::Mark(key));
    }

    /// Writes as much as the socket takes, one `writev` at a time (a
    /// plain `write` when only send-buffer bytes are queued), taking owner
    /// data from `src`; `marked` hears of each mark reached. A write that
    /// takes less than it offered ends the flush: the socket's buffer is
    /// full, and another call now would most likely fail with
    /// `WouldBlock` (the rest goes at the next flush). `Ok(true)` when it
    /// wrote.
    ///
    /// # Errors
    /// The socket's error (`WriteZero` when the peer is gone);
    /// `InvalidData` when a queued owner's buffers are gone (a bug).
    pub(crate) fn flush<S: SegSource<K> + ?Sized>(
        &mut self,
        sock: &mut impl Write,
        src: &S,
        marked: &mut impl FnMut(K),
    ) -> std::io::Result<bool> {
        let mut wrote = false;
        loop {
            self.consume(0, marked);
            let (res, offered) = match self.segs.front() {
                None => return Ok(wrote),
                // Send-buffer bytes alone (capsules, small payloads): one
                // plain write, no slice array to set up.
                Some(&Seg::Bytes(len)) if self.segs.len() == 1 => {
                    (sock.write(&self.buf.unsent_bytes()[..len]), len)
                }
                _ if self.segs.len() <= SMALL_IOV / 2 => {
                    let mut iov = [IoSlice::new(&[]); SMALL_IOV];
                    let (n, offered) = self.gather(src, &mut iov)?;
                    (sock.write_vectored(&iov[..n]), offered)
                }
                _ => {
                    let mut iov = [IoSlice::new(&[]); MAX_IOV];
                    let (n, offered) = self.gather(src, &mut iov)?;
                    (sock.write_vectored(&iov[..n]), offered)
                }
            };
            match res {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.consume(n, marked);
                    wrote = true;
                    if n < offered {
                        return Ok(true);
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(wrote),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Fills `iov` from the front of the queue; returns the slices used
    /// and the bytes they hold.
    fn gather<'a, S: SegSource<K> + ?Sized>(
        &'a self,
        src: &'a S,
        iov: &mut [IoSlice<'a>],
    ) -> std::io::Result<(usize, usize)> {
        let bytes = self.buf.unsent_bytes();
        let max = iov.len();
        let mut at = 0;
        let mut n = 0;
        let mut total = 0;
        for seg in &self.segs {
            if n == max {
                break;
            }
            match *seg {
                Seg::Bytes(len) => {
                    iov[n] = IoSlice::new(&bytes[at..at + len]);
                    at += len;
                    n += 1;
                    total += len;
                }
                Seg::Data { key, off, len, .. } => {
                    let Some(bufs) = src.seg_bufs(key) else {
                        return Err(std::io::Error::new(
                            ErrorKind::InvalidData,
                            "queued data's buffers are gone",
                        ));
                    };
                    for_each_slice(bufs, off, len, |s| {
                        if n < max {
                            iov[n] = IoSlice::new(s);
                            n += 1;
                            total += s.len();
                        }
                    });
                }
                Seg::Mark(_) => {}
            }
        }
        Ok((n, total))
    }

    /// `n` bytes from the front were written; `marked` hears of the marks
    /// then reached.
    fn consume(&mut self, mut n: usize, marked: &mut impl FnMut(K)) {
        // Send-buffer bytes written, released at once at the end.
        let mut bytes = 0;
        while let Some(seg) = self.segs.front_mut() {
            match seg {
                Seg::Mark(key) => {
                    let key = *key;
                    self.segs.pop_front();
                    marked(key);
                }
                _ if n == 0 => break,
                Seg::Bytes(len) => {
                    let m = n.min(*len);
                    bytes += m;
                    *len -= m;
                    n -= m;
                    if *len == 0 {
                        self.segs.pop_front();
                    }
                }
                Seg::Data {
                    key,
                    off,
                    len,
                    mark,
                } => {
                    let m = n.min(*len);
                    *off += m;
                    *len -= m;
                    self.by_ref -= m;
                    n -= m;
                    if *len == 0 {
                        let (key, mark) = (*key, *mark);
                        self.segs.pop_front();
                        if mark {
                            marked(key);
                        }
                    }
                }
            }
        }
        if bytes > 0 {
            self.buf.consume(bytes);
        }
    }

    /// Drops everything not written (the peer is gone or the connection
    /// gives up); `held` hears of every mark not reached.
    pub(crate) fn discard(&mut self, held: &mut impl FnMut(K)) {
        for seg in self.segs.drain(..) {
            match seg {
                Seg::Mark(key)
                | Seg::Data {
                    key, mark: true, ..
                } => held(key),
                _ => {}
            }
        }
        self.buf.discard();
        self.by_ref = 0;
    }
}
