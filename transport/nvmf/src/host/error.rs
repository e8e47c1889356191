//! Typed errors of the host: control-path failures ([`HostError`]) and the
//! status of one I/O ([`IoError`]).

use std::time::Duration;

use crate::spec::cpl::NvmeStatus;
use crate::spec::rdma_cm::CmRejectStatus;

/// A control-path failure: connecting, enabling, identifying, a dead queue.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// The transport ID string is malformed.
    #[error("transport ID: {0}")]
    Trid(String),
    /// Nobody answered at the address (no listener, unreachable).
    #[error("no NVMe-oF target answers at {0}")]
    Unreachable(String),
    /// The target refused the queue at the transport level (RDMA CM REJ).
    #[error("target rejected the connection (queue {qid}): {status:?}")]
    Rejected {
        /// The queue.
        qid: u16,
        /// The NVMe-oF reject status of the REJ private data.
        status: CmRejectStatus,
    },
    /// The target answered a command with an error status.
    #[error("{what} failed: {status}")]
    Nvme {
        /// The command.
        what: &'static str,
        /// Its status.
        status: NvmeStatus,
    },
    /// A Fabrics Connect was refused (unknown subsystem, host not allowed,
    /// bad queue size or id).
    #[error("Connect (queue {qid}) refused: {status}")]
    ConnectRefused {
        /// The queue.
        qid: u16,
        /// Its status.
        status: NvmeStatus,
    },
    /// The target did not answer in time.
    #[error("{what} timed out after {after:?}")]
    Timeout {
        /// What was awaited.
        what: &'static str,
        /// How long.
        after: Duration,
    },
    /// The connection is gone (the target disconnected or died).
    #[error("the connection to the target is lost: {0}")]
    Disconnected(String),
    /// The target's answer makes no sense (bad identify data, unknown CID).
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The transport could not set up resources.
    #[error("transport: {0}")]
    Transport(String),
    /// The request cannot be carried by this queue or transport.
    #[error("unsupported: {0}")]
    Unsupported(String),
}

/// Why one I/O failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IoError {
    /// The target completed the command with an error status.
    #[error("NVMe status {0}")]
    Nvme(NvmeStatus),
    /// The queue died (target gone, transport error) before the command
    /// completed.
    #[error("aborted: the queue is disconnected")]
    Aborted,
    /// The command did not complete within the I/O timeout (the queue is
    /// torn down).
    #[error("timed out")]
    TimedOut,
}
