//! The send and receive buffers of one NVMe/TCP connection, shared by the
//! target ([`crate::target::tcp`]) and host ([`crate::host::tcp`])
//! transports: PDUs are appended to a [`SendBuf`] and written out once per
//! poll by as many non-blocking `write`s as the socket takes; bytes are read
//! into a [`RecvBuf`] and handled where they lie.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;

use crate::spec::tcp::{crc32c, Digests, PduType, SendLayout, MAX_HEADER_LEN};

/// Most padding a PDU may put before its data (PDO is one byte).
pub(crate) const MAX_PAD: usize = 256;

/// PDUs waiting to be written (grows to its high-water mark once, then is
/// reused: no allocation per PDU in steady state).
#[derive(Debug)]
pub(crate) struct SendBuf {
    buf: Vec<u8>,
    sent: usize,
    /// Header digest, data digest and the peer's data alignment.
    pub(crate) layout: SendLayout,
}

impl SendBuf {
    pub(crate) fn new(capacity: usize) -> Self {
        SendBuf {
            buf: Vec::with_capacity(capacity),
            sent: 0,
            layout: SendLayout::new(Digests::default(), 0),
        }
    }

    /// Bytes not written yet.
    pub(crate) fn unsent(&self) -> usize {
        self.buf.len() - self.sent
    }

    /// Append bytes as they are (ICReq/ICResp, TermReqs: no digest).
    pub(crate) fn push_raw(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }

    /// Append the header of a `t` PDU (`hdr`: its specific header, common
    /// header included) with digest and padding for `data_len` bytes of data.
    pub(crate) fn push_pdu(&mut self, t: PduType, hdr: &[u8], flags: u8, data_len: usize) {
        let mut h = [0u8; MAX_HEADER_LEN + MAX_PAD];
        let n = hdr.len().min(h.len());
        h[..n].copy_from_slice(&hdr[..n]);
        let len = self.layout.finish_header(&mut h, t, flags, data_len);
        self.buf.extend_from_slice(&h[..len]);
    }

    /// Append `len` bytes of data by `fill` (which appends at most `len`;
    /// a short fill is padded with zeroes so the stream stays framed), then
    /// the data digest when it is on.
    pub(crate) fn push_data(&mut self, len: usize, fill: impl FnOnce(&mut Vec<u8>)) {
        let start = self.buf.len();
        fill(&mut self.buf);
        self.buf.resize(start + len, 0);
        if self.layout.ddgst && len > 0 {
            let d = crc32c(&self.buf[start..]);
            self.buf.extend_from_slice(&d.to_le_bytes());
        }
    }

    /// Write what is buffered; `Ok(true)` when bytes left. Stops at
    /// `WouldBlock`; a peer that takes nothing more is an error.
    ///
    /// # Errors
    /// The socket's error (`WriteZero` when the peer is gone).
    pub(crate) fn flush(&mut self, sock: &mut TcpStream) -> std::io::Result<bool> {
        let mut wrote = false;
        while self.sent < self.buf.len() {
            match sock.write(&self.buf[self.sent..]) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.sent += n;
                    wrote = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if self.sent == self.buf.len() {
            self.buf.clear();
            self.sent = 0;
        }
        Ok(wrote)
    }
}

/// Received bytes: `buf[head..tail]` not handled yet.
#[derive(Debug)]
pub(crate) struct RecvBuf {
    pub(crate) buf: Vec<u8>,
    pub(crate) head: usize,
    pub(crate) tail: usize,
}

impl RecvBuf {
    pub(crate) fn new(len: usize) -> Self {
        RecvBuf {
            buf: vec![0u8; len],
            head: 0,
            tail: 0,
        }
    }

    /// Bytes not handled yet.
    pub(crate) fn avail(&self) -> usize {
        self.tail - self.head
    }

    /// One `read` into the free space (the unhandled bytes move to the
    /// front first when the tail is full or past the middle).
    ///
    /// # Errors
    /// The socket's (`WouldBlock` included); `Ok(0)` is the peer's close.
    pub(crate) fn fill(&mut self, sock: &mut TcpStream) -> std::io::Result<usize> {
        if self.head == self.tail {
            self.head = 0;
            self.tail = 0;
        } else if self.tail == self.buf.len() || self.head > self.buf.len() / 2 {
            self.buf.copy_within(self.head..self.tail, 0);
            self.tail -= self.head;
            self.head = 0;
        }
        let n = sock.read(&mut self.buf[self.tail..])?;
        self.tail += n;
        Ok(n)
    }
}
