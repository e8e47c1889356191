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
//! Data: the queue keeps one staging buffer per slot (grown to the
//! largest transfer once, then reused): write data is copied there when
//! the command is queued (the core's buffers are not reachable later),
//! read data lands there and is copied into the caller's buffers when the
//! command completes ([`HostQueue::finish`](super::HostQueue::finish)).
//! The socket is non-blocking and polled; the connect and the ICReq
//! exchange are the only waits (control path, bounded by the timeout,
//! polling the current reactor so an in-process target progresses).
//! Reconnection is the host core's ([`Controller::poll_recover`](super::Controller::poll_recover)).

mod queue;

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
