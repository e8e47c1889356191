//! Owned-buffer asynchronous file I/O: io_uring and Linux native AIO engines;
//! and [`SockRing`], an io_uring for stream sockets (multishot receive into
//! provided buffers, one vectored send per socket per poll).
//!
//! One engine per reactor ([`IoEngine`] is implemented by [`UringEngine`],
//! [`LinuxAioEngine`] and the run-time choice [`AnyEngine`]). An I/O takes
//! its [`SgList`](crate::mem::SgList) of `DmaBuf`s by value and gives it back
//! in its [`IoDone`]; the engine keeps the iovecs in a preallocated per-slot
//! array, so nothing is allocated per I/O. The reactor's poller calls
//! `submit` once per batch and `reap` to deliver completions.
//!
//! ```no_run
//! use pollux_reactor::io::{AnyEngine, EngineConfig, EngineKind, IoEngine, IoOp};
//! use pollux_reactor::mem::{DmaBuf, SgList};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut engine = AnyEngine::new(EngineKind::Auto, EngineConfig::default())?;
//! let file = std::fs::File::open("/dev/zero")?;
//! let buf = DmaBuf::alloc(4096)?;
//! # use std::os::fd::AsRawFd;
//! engine.queue(IoOp::read(file.as_raw_fd(), 0), SgList::from_buf(buf), 42)
//!     .map_err(|e| e.to_string())?;
//! engine.submit()?;
//! while engine.reap(16, |done| assert_eq!(done.token, 42)) == 0 {}
//! # Ok(())
//! # }
//! ```

mod any;
#[cfg(test)]
mod conformance;
mod engine;
mod linux_aio;
mod slots;
mod sock_ring;
mod uring;

pub use any::AnyEngine;
pub use engine::{
    EngineConfig, EngineError, EngineKind, IoDone, IoEngine, IoKind, IoOp, QueueError,
};
pub use linux_aio::LinuxAioEngine;
pub use sock_ring::{
    SendError, SendList, SockEvent, SockId, SockRing, SockRingConfig, SockRingError, SockRingStats,
    StableBuf, TaskRun,
};
pub use uring::UringEngine;
