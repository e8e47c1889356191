//! The `IoEngine` trait and the types every engine shares.

use std::fmt;
use std::io;
use std::os::fd::RawFd;

use crate::mem::SgList;

/// What an I/O does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoKind {
    /// Read into the buffers (scatter).
    Read,
    /// Write from the buffers (gather).
    Write,
    /// Flush the file's data and metadata (`fsync`); buffers are ignored.
    Fsync,
}

/// One I/O: what, on which fd, at which byte offset.
///
/// The fd is borrowed by number: the caller keeps it open until the I/O
/// completes (closing it early fails the I/O with `EBADF`, or, if the number
/// is reused, targets another file; it never touches freed memory, since the
/// engine owns the buffers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoOp {
    /// Read, write or fsync.
    pub kind: IoKind,
    /// The file or block device.
    pub fd: RawFd,
    /// Byte offset (ignored for fsync).
    pub offset: u64,
}

impl IoOp {
    /// A read at `offset`.
    pub fn read(fd: RawFd, offset: u64) -> IoOp {
        IoOp {
            kind: IoKind::Read,
            fd,
            offset,
        }
    }

    /// A write at `offset`.
    pub fn write(fd: RawFd, offset: u64) -> IoOp {
        IoOp {
            kind: IoKind::Write,
            fd,
            offset,
        }
    }

    /// An fsync.
    pub fn fsync(fd: RawFd) -> IoOp {
        IoOp {
            kind: IoKind::Fsync,
            fd,
            offset: 0,
        }
    }
}

/// A finished I/O, handing its buffers back.
#[derive(Debug)]
pub struct IoDone {
    /// The token given to `queue`.
    pub token: u64,
    /// Bytes transferred, or the positive errno.
    pub result: Result<usize, i32>,
    /// The buffers given to `queue`.
    pub bufs: SgList,
}

/// Why `queue` refused an I/O; the buffers come back with it.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    /// Every slot is in flight: back-pressure, reap and retry.
    #[error("io engine queue is full")]
    Full(SgList),
    /// More segments than the engine's per-I/O iovec array holds.
    #[error("too many segments for one I/O")]
    TooManySegments(SgList),
}

impl QueueError {
    /// The refused buffers.
    pub fn into_bufs(self) -> SgList {
        match self {
            QueueError::Full(b) | QueueError::TooManySegments(b) => b,
        }
    }
}

impl fmt::Debug for QueueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (what, b) = match self {
            QueueError::Full(b) => ("Full", b),
            QueueError::TooManySegments(b) => ("TooManySegments", b),
        };
        write!(f, "{what}({} segments)", b.len())
    }
}

/// Which engine to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EngineKind {
    /// io_uring (`io-uring` crate).
    IoUring,
    /// Linux native AIO (`io_submit`).
    LinuxAio,
    /// io_uring when `io_uring_setup` works, else Linux native AIO.
    #[default]
    Auto,
}

/// An error creating an engine (control path).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The depth or segment limit is zero or too large.
    #[error("invalid engine configuration: {0}")]
    InvalidConfig(&'static str),
    /// The kernel refused to set the engine up.
    #[error("{engine} setup failed: {source}")]
    Setup {
        /// `"io_uring"` or `"linux-aio"`.
        engine: &'static str,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
}

/// Sizes of an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineConfig {
    /// Most I/Os in flight (queued or submitted).
    pub depth: u32,
    /// Most segments per I/O.
    pub max_segs: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            depth: 128,
            max_segs: 32,
        }
    }
}

impl EngineConfig {
    pub(super) fn validate(&self) -> Result<(), EngineError> {
        if self.depth == 0 || self.depth > 32768 {
            return Err(EngineError::InvalidConfig("depth must be 1..=32768"));
        }
        if self.max_segs == 0 || self.max_segs > 1024 {
            return Err(EngineError::InvalidConfig("max_segs must be 1..=1024"));
        }
        Ok(())
    }
}

/// A per-reactor asynchronous file I/O engine (`!Send`).
///
/// The engine owns an I/O's buffers from `queue` until its completion is
/// reaped. `queue` only records the I/O; `submit` hands everything queued to
/// the kernel in one system call; `reap` delivers completions (never inside
/// `queue` or `submit`). Nothing here allocates per I/O.
pub trait IoEngine {
    /// Which engine this is (`IoUring` or `LinuxAio`).
    fn kind(&self) -> EngineKind;

    /// Record an I/O to be submitted by the next [`submit`](Self::submit).
    ///
    /// # Errors
    /// [`QueueError::Full`] when [`capacity()`](Self::capacity) I/Os are in
    /// flight, [`QueueError::TooManySegments`]; either returns the buffers.
    // The error carries the buffers back by value (an inline `SgList`):
    // boxing it would allocate on the back-pressure path.
    #[allow(clippy::result_large_err)]
    fn queue(&mut self, op: IoOp, bufs: SgList, token: u64) -> Result<(), QueueError>;

    /// Submit every queued I/O; returns how many the kernel accepted. I/Os the
    /// kernel rejects individually complete with their errno at the next reap.
    ///
    /// # Errors
    /// A failure of the submission system call as a whole (I/Os stay queued).
    fn submit(&mut self) -> io::Result<usize>;

    /// Deliver up to `max` completions to `on_done`, without blocking;
    /// returns how many were delivered.
    fn reap(&mut self, max: usize, on_done: impl FnMut(IoDone)) -> usize;

    /// I/Os queued or submitted and not yet reaped.
    fn in_flight(&self) -> usize;

    /// Most I/Os in flight.
    fn capacity(&self) -> usize;
}
