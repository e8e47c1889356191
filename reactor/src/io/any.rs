//! `AnyEngine`: the engine chosen at run time by [`EngineKind`].

use std::io;

use super::engine::{EngineConfig, EngineError, EngineKind, IoDone, IoEngine, IoOp, QueueError};
use super::linux_aio::LinuxAioEngine;
use super::uring::UringEngine;
use crate::mem::SgList;

/// io_uring or Linux AIO, chosen by [`AnyEngine::new`] (enum dispatch, no
/// boxing).
pub enum AnyEngine {
    /// io_uring.
    Uring(UringEngine),
    /// Linux native AIO.
    LinuxAio(LinuxAioEngine),
}

impl AnyEngine {
    /// Create an engine of `kind`; `Auto` tries io_uring and falls back to
    /// Linux AIO (it may be disabled by `/proc/sys/kernel/io_uring_disabled`
    /// or seccomp), logging which one it uses.
    ///
    /// # Errors
    /// The engine's setup error (for `Auto`, the Linux AIO one when both fail).
    pub fn new(kind: EngineKind, cfg: EngineConfig) -> Result<AnyEngine, EngineError> {
        match kind {
            EngineKind::IoUring => UringEngine::new(cfg).map(AnyEngine::Uring),
            EngineKind::LinuxAio => LinuxAioEngine::new(cfg).map(AnyEngine::LinuxAio),
            EngineKind::Auto => match UringEngine::new(cfg) {
                Ok(e) => {
                    log::info!("io engine: io_uring (depth {})", cfg.depth);
                    Ok(AnyEngine::Uring(e))
                }
                Err(EngineError::Setup { source, .. }) => {
                    log::info!("io engine: io_uring unavailable ({source}), using Linux AIO");
                    LinuxAioEngine::new(cfg).map(AnyEngine::LinuxAio)
                }
                Err(e) => Err(e),
            },
        }
    }
}

impl IoEngine for AnyEngine {
    fn kind(&self) -> EngineKind {
        match self {
            AnyEngine::Uring(e) => e.kind(),
            AnyEngine::LinuxAio(e) => e.kind(),
        }
    }

    fn queue(&mut self, op: IoOp, bufs: SgList, token: u64) -> Result<(), QueueError> {
        match self {
            AnyEngine::Uring(e) => e.queue(op, bufs, token),
            AnyEngine::LinuxAio(e) => e.queue(op, bufs, token),
        }
    }

    fn submit(&mut self) -> io::Result<usize> {
        match self {
            AnyEngine::Uring(e) => e.submit(),
            AnyEngine::LinuxAio(e) => e.submit(),
        }
    }

    fn reap(&mut self, max: usize, on_done: impl FnMut(IoDone)) -> usize {
        match self {
            AnyEngine::Uring(e) => e.reap(max, on_done),
            AnyEngine::LinuxAio(e) => e.reap(max, on_done),
        }
    }

    fn in_flight(&self) -> usize {
        match self {
            AnyEngine::Uring(e) => e.in_flight(),
            AnyEngine::LinuxAio(e) => e.in_flight(),
        }
    }

    fn capacity(&self) -> usize {
        match self {
            AnyEngine::Uring(e) => e.capacity(),
            AnyEngine::LinuxAio(e) => e.capacity(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_kinds_are_honoured_and_auto_picks_one() {
        let cfg = EngineConfig::default();
        let aio = AnyEngine::new(EngineKind::LinuxAio, cfg).unwrap();
        assert_eq!(aio.kind(), EngineKind::LinuxAio);
        assert_eq!(aio.capacity(), 128);
        let auto = AnyEngine::new(EngineKind::Auto, cfg).unwrap();
        let uring_works = UringEngine::new(cfg).is_ok();
        let want = if uring_works {
            EngineKind::IoUring
        } else {
            EngineKind::LinuxAio
        };
        assert_eq!(auto.kind(), want);
        assert!(matches!(
            AnyEngine::new(
                EngineKind::Auto,
                EngineConfig {
                    depth: 0,
                    max_segs: 1
                }
            ),
            Err(EngineError::InvalidConfig(_))
        ));
    }

    #[test]
    fn any_engine_passes_the_conformance_read_back() {
        let mut e = AnyEngine::new(EngineKind::Auto, EngineConfig::default()).unwrap();
        super::super::conformance::write_then_read_back(&mut e);
    }
}
