//! Writes to a TCP socket that never raise `SIGPIPE`: `send` and `sendmsg`
//! with `MSG_NOSIGNAL`, for the NVMe/TCP target's and host's send queues.
//! A peer that went away then shows as an error from the call (`EPIPE`,
//! `ECONNRESET`), never as a signal, which would end an application that
//! embeds Pollux without ignoring `SIGPIPE` (a Rust `main` ignores it; a
//! C application or a fuzzing harness need not). `std`'s
//! `TcpStream::write` passes the flag already; its `write_vectored`
//! (`writev`) cannot.

use std::io::{IoSlice, Write};
use std::net::TcpStream;

use rustix::net::{SendAncillaryBuffer, SendFlags};

/// A [`Write`] over a borrowed socket whose writes carry `MSG_NOSIGNAL`.
pub(crate) struct NoSigpipe<'a>(pub(crate) &'a TcpStream);

impl Write for NoSigpipe<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        Ok(rustix::net::send(self.0, buf, SendFlags::NOSIGNAL)?)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        let mut control = SendAncillaryBuffer::default();
        Ok(rustix::net::sendmsg(
            self.0,
            bufs,
            &mut control,
            SendFlags::NOSIGNAL,
        )?)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::io::{ErrorKind, Read};
    use std::net::{Shutdown, TcpListener};
    use std::time::{Duration, Instant};

    use super::*;

    /// Both calls move bytes in order; to a peer that reset the
    /// connection they fail with an error (the caller's cue to end the
    /// connection) rather than a signal.
    #[test]
    fn writes_arrive_in_order_and_a_gone_peer_is_an_error() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut b, _) = l.accept().unwrap();
        let mut w = NoSigpipe(&a);
        assert_eq!(w.write(b"ab").unwrap(), 2);
        let parts = [IoSlice::new(b"cd"), IoSlice::new(b""), IoSlice::new(b"efg")];
        assert_eq!(w.write_vectored(&parts).unwrap(), 5);
        w.flush().unwrap();
        let mut got = [0u8; 7];
        b.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"abcdefg");
        // The peer closes with unread data: a reset.
        a.write_all(b"unread").unwrap();
        std::thread::sleep(Duration::from_millis(20));
        b.shutdown(Shutdown::Both).unwrap();
        drop(b);
        let start = Instant::now();
        let err = loop {
            let mut w = NoSigpipe(&a);
            match w.write_vectored(&[IoSlice::new(&[0u8; 4096])]) {
                Ok(_) => {}
                Err(e) => break e,
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "writes never failed"
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        assert!(
            matches!(
                err.kind(),
                ErrorKind::BrokenPipe | ErrorKind::ConnectionReset
            ),
            "{err:?}"
        );
        assert!(NoSigpipe(&a).write(b"x").is_err());
    }
}
