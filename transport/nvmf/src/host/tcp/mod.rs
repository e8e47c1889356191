//! The NVMe/TCP host transport: one TCP connection per queue, opened with
//! ICReq/ICResp (digests negotiated), then CapsuleCmd PDUs; writes up to
//! the in-capsule limit travel in the capsule, larger ones answer the
//! target's R2Ts with H2CData PDUs (each at most the target's MAXH2CDATA);
//! reads arrive as C2HData PDUs, the last one with SUCCESS when the target
//! sends no response capsule (the host disables SQ flow control in its
//! Connect, as Linux does, which allows it).
//!
//! - [`TcpHost`]: the target address and [`TcpHostOptions`] (header and
//!   data digest, connect timeout) for one reactor's queues.
//! - [`TcpQueue`]: one queue (`queue.rs`).
//!
//! Data moves without staging copies: the core keeps the caller's buffers
//! in its slots and lends them to the queue by slot in every flush and
//! poll ([`SlotBufs`](super::SlotBufs)).
//! - Writes: in-capsule data and H2CData payloads of a page or more go out
//!   from the caller's buffers by scatter-gather (`writev` of PDU headers
//!   and buffer slices, `tx.rs`); smaller ones are copied into the send
//!   buffer (cheaper than another slice). A command's completion is held
//!   back until its last referenced byte is written.
//! - Reads: C2HData payloads land in the caller's buffers at their DATAO:
//!   copied once from the receive buffer when they came with earlier
//!   bytes, else read from the socket straight into the buffers (with the
//!   receive buffer as the last slice for what follows). While payloads
//!   are big (16 KiB or more) reads into the receive buffer take at most
//!   4 KiB, so little more than the next header is copied and the rest of
//!   each payload goes straight in. The data digest is computed over the
//!   bytes where they landed.
//!
//! The socket is non-blocking and polled; the connect and the ICReq
//! exchange are the only waits (control path, bounded by the timeout,
//! polling the current reactor so an in-process target progresses).
//! Reconnection is the host core's ([`Controller::poll_recover`](super::Controller::poll_recover)).

mod queue;
#[cfg(test)]
mod tests;
mod tx;

use std::net::SocketAddr;
use std::time::Duration;

pub use queue::{TcpQueue, TcpQueueStats};

use super::transport::{HostTransport, QueueParams};
use super::HostError;

/// Options of the TCP host transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpHostOptions {
    /// Ask for a header digest (CRC32C) on every PDU (`--hdr-digest`).
    pub header_digest: bool,
    /// Ask for a data digest (CRC32C) on every PDU with data (`--data-digest`).
    pub data_digest: bool,
    /// How long the TCP connect and the ICReq/ICResp exchange may take.
    pub connect_timeout: Duration,
}

impl Default for TcpHostOptions {
    fn default() -> Self {
        TcpHostOptions {
            header_digest: false,
            data_digest: false,
            connect_timeout: Duration::from_secs(5),
        }
    }
}

/// The NVMe/TCP host transport on one reactor: opens queues to one
/// target address.
#[derive(Debug, Clone)]
pub struct TcpHost {
    addr: SocketAddr,
    opts: TcpHostOptions,
}

impl TcpHost {
    /// Queues to `addr` with `opts`.
    pub fn new(addr: SocketAddr, opts: TcpHostOptions) -> Self {
        TcpHost { addr, opts }
    }

    /// The target address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The options.
    pub fn options(&self) -> &TcpHostOptions {
        &self.opts
    }
}

impl HostTransport for TcpHost {
    type Queue = TcpQueue;

    fn name(&self) -> &'static str {
        "tcp"
    }

    fn open_queue(&self, params: &QueueParams) -> Result<TcpQueue, HostError> {
        TcpQueue::connect(self.addr, &self.opts, params)
    }
}
