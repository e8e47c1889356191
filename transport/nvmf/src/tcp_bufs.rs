//! The send and receive buffers of one NVMe/TCP connection, shared by the
//! target ([`crate::target::tcp`]) and host ([`crate::host::tcp`])
//! transports: PDUs are appended to a [`SendBuf`] and written out once per
//! poll by as many non-blocking `write`s as the socket takes; bytes are read
//! into a [`RecvBuf`] and handled where they lie.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;

use crate::spec::tcp::{crc32c, Digests, PduType, SendLayout};

/// Most padding a PDU may put before its data (PDO is one byte).
pub(crate) const MAX_PAD: usize = 256;

/// Sent bytes at the front of a [`SendBuf`] above which a flush that
/// leaves bytes unsent moves them to the front.
const COMPACT_MIN: usize = 64 * 1024;

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
    /// header included, `t`'s `hlen` bytes) with digest and padding for
    /// `data_len` bytes of data. Built in place at the end of the buffer:
    /// under a plain layout (no digests, no padding) the header is copied
    /// once and its common header rewritten there.
    pub(crate) fn push_pdu<const N: usize>(
        &mut self,
        t: PduType,
        hdr: &[u8; N],
        flags: u8,
        data_len: usize,
    ) {
        let start = self.buf.len();
        if self.layout.is_plain() && N == t.hlen() {
            self.buf.extend_from_slice(hdr);
            SendLayout::plain_header(t, flags, data_len).encode_into(&mut self.buf[start..]);
            return;
        }
        let len = self.layout.header_bytes(t, data_len);
        self.buf.extend_from_slice(&hdr[..N.min(len)]);
        // Room for the header digest and padding (zeroes).
        self.buf.resize(start + len, 0);
        self.layout
            .finish_header(&mut self.buf[start..], t, flags, data_len);
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

    /// The bytes not written yet.
    pub(crate) fn unsent_bytes(&self) -> &[u8] {
        &self.buf[self.sent..]
    }

    /// `n` more bytes (at most [`unsent`](Self::unsent)) were written.
    pub(crate) fn consume(&mut self, n: usize) {
        self.sent = (self.sent + n).min(self.buf.len());
        if self.sent == self.buf.len() {
            self.buf.clear();
            self.sent = 0;
        } else if self.sent >= COMPACT_MIN && self.sent * 2 >= self.buf.len() {
            // A socket that never drains completely must not grow the
            // buffer without end: move the unsent half (or less) to the
            // front, so each byte moves at most once on average.
            self.buf.drain(..self.sent);
            self.sent = 0;
        }
    }

    /// Drop every byte not written yet (the peer is gone).
    pub(crate) fn discard(&mut self) {
        self.buf.clear();
        self.sent = 0;
    }

    /// Write what is buffered; `Ok(true)` when bytes left. Stops at
    /// `WouldBlock`; a peer that takes nothing more is an error.
    ///
    /// # Errors
    /// The socket's error (`WriteZero` when the peer is gone).
    pub(crate) fn flush(&mut self, sock: &mut impl Write) -> std::io::Result<bool> {
        let mut wrote = false;
        while self.unsent() > 0 {
            match sock.write(self.unsent_bytes()) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.consume(n);
                    wrote = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
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
    /// The last [`fill`](Self::fill) took less than the room it offered:
    /// the socket held no more at that moment, so another read in the same
    /// poll would most likely fail with `WouldBlock` (a wasted system
    /// call).
    pub(crate) drained: bool,
}

impl RecvBuf {
    pub(crate) fn new(len: usize) -> Self {
        RecvBuf {
            buf: vec![0u8; len],
            head: 0,
            tail: 0,
            drained: false,
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
        self.fill_at_most(sock, usize::MAX)
    }

    /// [`fill`](Self::fill), taking at most `max` bytes (at least one).
    ///
    /// # Errors
    /// As [`fill`](Self::fill).
    pub(crate) fn fill_at_most(
        &mut self,
        sock: &mut TcpStream,
        max: usize,
    ) -> std::io::Result<usize> {
        if self.head == self.tail {
            self.head = 0;
            self.tail = 0;
        } else if self.tail == self.buf.len() || self.head > self.buf.len() / 2 {
            self.buf.copy_within(self.head..self.tail, 0);
            self.tail -= self.head;
            self.head = 0;
        }
        let end = self.tail + (self.buf.len() - self.tail).min(max.max(1));
        let n = sock.read(&mut self.buf[self.tail..end])?;
        self.drained = self.tail + n < end;
        self.tail += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::tcp::MAX_HEADER_LEN;

    /// Takes at most `per_call` bytes per flush, then would block.
    struct Trickle {
        out: Vec<u8>,
        per_call: usize,
        took: bool,
    }

    impl Write for Trickle {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            if self.took {
                self.took = false;
                return Err(ErrorKind::WouldBlock.into());
            }
            self.took = true;
            let n = b.len().min(self.per_call);
            self.out.extend_from_slice(&b[..n]);
            Ok(n)
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A connected loopback pair: (ours, non-blocking; the peer's).
    fn pair() -> (TcpStream, TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let peer = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (ours, _) = l.accept().expect("accept");
        ours.set_nonblocking(true).expect("non-blocking");
        (ours, peer)
    }

    #[test]
    fn a_read_that_takes_less_than_it_offered_marks_the_socket_drained() {
        let (mut ours, mut peer) = pair();
        let mut rb = RecvBuf::new(4096);
        peer.write_all(&[7u8; 100]).expect("write");
        // Loopback delivers in the writer's call: the bytes are here.
        assert_eq!(rb.fill(&mut ours).expect("read"), 100);
        assert!(rb.drained, "100 of 4096 bytes: nothing more was there");
        // More than the room offered: the read fills it, not drained.
        peer.write_all(&[8u8; 300]).expect("write");
        assert_eq!(rb.fill_at_most(&mut ours, 200).expect("read"), 200);
        assert!(!rb.drained, "took all 200 offered: more may wait");
        assert_eq!(rb.fill(&mut ours).expect("read"), 100);
        assert!(rb.drained);
        assert_eq!(rb.avail(), 400);
        assert_eq!(
            rb.fill(&mut ours).map_err(|e| e.kind()),
            Err(ErrorKind::WouldBlock)
        );
    }

    #[test]
    fn a_plain_layout_builds_the_same_headers_as_the_general_one() {
        use crate::spec::tcp::{FLAG_LAST_PDU, FLAG_SUCCESS};
        let plain = SendLayout::new(Digests::default(), 0);
        assert!(plain.is_plain());
        let cases: [(PduType, u8, usize); 5] = [
            (PduType::C2hData, FLAG_LAST_PDU | FLAG_SUCCESS, 512),
            (PduType::H2cData, FLAG_LAST_PDU, 4096),
            (PduType::R2t, 0, 0),
            (PduType::CapsuleResp, 0x03, 0),
            (PduType::CapsuleCmd, 0, 0),
        ];
        for (t, flags, data_len) in cases {
            // Junk in the common header: both paths rewrite all of it.
            let mut hdr = [0xA5u8; 72];
            for (i, b) in hdr.iter_mut().enumerate() {
                *b = b.wrapping_add(i as u8);
            }
            let mut sb = SendBuf::new(256);
            sb.layout = plain;
            let mut want = [0u8; MAX_HEADER_LEN + MAX_PAD];
            let n = t.hlen();
            want[..n].copy_from_slice(&hdr[..n]);
            let len = plain.finish_header(&mut want, t, flags, data_len);
            if n == 72 {
                sb.push_pdu(t, &hdr, flags, data_len);
            } else {
                let short: [u8; 24] = hdr[..24].try_into().expect("24 bytes");
                sb.push_pdu(t, &short, flags, data_len);
            }
            assert_eq!(sb.unsent_bytes(), &want[..len], "{t:?}");
        }
    }

    #[test]
    fn a_socket_that_never_drains_does_not_grow_the_send_buffer_without_end() {
        let mut sb = SendBuf::new(1024);
        let mut sock = Trickle {
            out: Vec::new(),
            per_call: 4096,
            took: false,
        };
        let mut pushed = Vec::new();
        let mut max_len = 0;
        // A backlog first, then as much in as goes out each round: the
        // buffer is never empty after a flush.
        for round in 0..2000u32 {
            let n = if round == 0 { 32 * 1024 } else { 4096 };
            let bytes: Vec<u8> = (0..n).map(|i| (round as usize * 7 + i) as u8).collect();
            sb.push_raw(&bytes);
            pushed.extend_from_slice(&bytes);
            assert!(sb.flush(&mut sock).is_ok());
            assert!(sb.unsent() > 0);
            max_len = max_len.max(sb.buf.len());
        }
        assert!(max_len < 4 * COMPACT_MIN, "grew to {max_len} B");
        while sb.unsent() > 0 {
            assert!(sb.flush(&mut sock).is_ok());
        }
        assert!(sock.out == pushed, "bytes out of order or lost");
        assert!(sb.buf.is_empty());
    }
}
