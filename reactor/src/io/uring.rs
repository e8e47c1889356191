//! `UringEngine`: an [`IoEngine`] over io_uring (the `io-uring` crate), one
//! ring per reactor, reaped by the reactor's poller.

use std::io;
use std::os::fd::AsRawFd;
use std::os::fd::BorrowedFd;

use io_uring::{opcode, squeue, types, IoUring};

use super::engine::{
    EngineConfig, EngineError, EngineKind, IoDone, IoEngine, IoKind, IoOp, QueueError,
};
use super::slots::SlotTable;
use crate::mem::SgList;

/// io_uring engine (`!Send`).
pub struct UringEngine {
    // INVARIANT: every SQE pushed to `ring` points only at iovecs and buffers
    // owned by a busy slot of `slots`, which keeps them alive and in place
    // until the matching CQE is reaped. `ring` is declared first so that it is
    // dropped (and the kernel's use of the buffers ended) before `slots`.
    ring: IoUring,
    slots: SlotTable,
    unsubmitted: usize,
}

impl UringEngine {
    /// Set up a ring of `cfg.depth` entries (control path).
    ///
    /// # Errors
    /// [`EngineError::InvalidConfig`], or [`EngineError::Setup`] when
    /// `io_uring_setup` fails (not supported, disabled by
    /// `/proc/sys/kernel/io_uring_disabled` or seccomp, memlock too low).
    pub fn new(cfg: EngineConfig) -> Result<UringEngine, EngineError> {
        cfg.validate()?;
        let ring = IoUring::builder()
            .setup_cqsize(cfg.depth.saturating_mul(2))
            .build(cfg.depth)
            .map_err(|source| EngineError::Setup {
                engine: "io_uring",
                source,
            })?;
        Ok(UringEngine {
            ring,
            slots: SlotTable::new(cfg.depth as usize, cfg.max_segs),
            unsubmitted: 0,
        })
    }

    /// Have the kernel signal `fd` (an eventfd) on each completion, for the
    /// reactor's adaptive idle mode.
    ///
    /// # Errors
    /// What `io_uring_register(IORING_REGISTER_EVENTFD)` returns.
    pub fn register_eventfd(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        self.ring.submitter().register_eventfd(fd.as_raw_fd())
    }

    /// I/Os queued but not yet submitted.
    pub fn unsubmitted(&self) -> usize {
        self.unsubmitted
    }
}

impl IoEngine for UringEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::IoUring
    }

    fn queue(&mut self, op: IoOp, bufs: SgList, token: u64) -> Result<(), QueueError> {
        let t = self.slots.take(op.kind, bufs, token)?;
        let fd = types::Fd(op.fd);
        // The slot table caps segments at `max_segs <= 1024`.
        let nr = t.nr as u32;
        let entry: squeue::Entry = match (op.kind, t.nr) {
            (IoKind::Fsync, _) => opcode::Fsync::new(fd).build(),
            (IoKind::Read, 1) => {
                // SAFETY: `t.iov` points at the slot's first iovec (INVARIANT).
                let v = unsafe { *t.iov };
                let len = u32::try_from(v.iov_len).unwrap_or(u32::MAX);
                opcode::Read::new(fd, v.iov_base.cast(), len)
                    .offset(op.offset)
                    .build()
            }
            (IoKind::Write, 1) => {
                // SAFETY: as above.
                let v = unsafe { *t.iov };
                let len = u32::try_from(v.iov_len).unwrap_or(u32::MAX);
                opcode::Write::new(fd, v.iov_base.cast::<u8>().cast_const(), len)
                    .offset(op.offset)
                    .build()
            }
            (IoKind::Read, _) => opcode::Readv::new(fd, t.iov, nr).offset(op.offset).build(),
            (IoKind::Write, _) => opcode::Writev::new(fd, t.iov, nr).offset(op.offset).build(),
        }
        .user_data(t.key);
        // SAFETY: the entry references only the slot's iovecs and buffers,
        // which stay alive and unmoved until its CQE is reaped (INVARIANT).
        let pushed = unsafe { self.ring.submission().push(&entry) };
        if pushed.is_err() {
            // Cannot happen (SQ size == slot count), but never lose buffers.
            let bufs = self
                .slots
                .complete(t.key, 0)
                .map(|d| d.bufs)
                .unwrap_or_default();
            return Err(QueueError::Full(bufs));
        }
        self.unsubmitted += 1;
        Ok(())
    }

    fn submit(&mut self) -> io::Result<usize> {
        if self.unsubmitted == 0 {
            return Ok(0);
        }
        loop {
            match self.ring.submit() {
                Ok(n) => {
                    self.unsubmitted = self.unsubmitted.saturating_sub(n);
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    fn reap(&mut self, max: usize, mut on_done: impl FnMut(IoDone)) -> usize {
        let mut n = 0;
        let slots = &mut self.slots;
        let mut cq = self.ring.completion();
        while n < max {
            let Some(cqe) = cq.next() else {
                break;
            };
            match slots.complete(cqe.user_data(), i64::from(cqe.result())) {
                Some(done) => {
                    on_done(done);
                    n += 1;
                }
                None => log::error!(
                    "io_uring: completion with unknown or stale key {:#x}",
                    cqe.user_data()
                ),
            }
        }
        n
    }

    fn in_flight(&self) -> usize {
        self.slots.in_flight()
    }

    fn capacity(&self) -> usize {
        self.slots.capacity()
    }
}

impl Drop for UringEngine {
    fn drop(&mut self) {
        let pending = self.slots.in_flight();
        if pending > 0 {
            // Wait for the kernel to finish with our buffers before they are
            // returned to their pools (dropping the ring alone does not wait
            // for I/O on regular files).
            let _ = self.submit();
            let mut left = pending;
            while left > 0 {
                if self.ring.submit_and_wait(1).is_err() {
                    // The kernel may still use the buffers: never reuse them.
                    self.slots.leak_busy();
                    break;
                }
                left -= self.reap(left, drop);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::conformance as c;
    use super::*;

    fn engine(depth: u32) -> Option<UringEngine> {
        match UringEngine::new(EngineConfig { depth, max_segs: 8 }) {
            Ok(e) => Some(e),
            Err(e) => {
                crate::test_env::skip(
                    &format!("io_uring ({e})"),
                    "run on Linux 5.6 or later with io_uring enabled \
                     (kernel.io_uring_disabled=0, not blocked by seccomp)",
                );
                None
            }
        }
    }

    #[test]
    fn write_then_read_back() {
        if let Some(mut e) = engine(8) {
            c::write_then_read_back(&mut e);
        }
    }

    #[test]
    fn bad_fd_is_an_errno() {
        if let Some(mut e) = engine(8) {
            c::bad_fd_is_an_errno(&mut e);
        }
    }

    #[test]
    fn queue_full_returns_buffers() {
        if let Some(mut e) = engine(4) {
            c::queue_full_returns_buffers(&mut e);
        }
    }

    #[test]
    fn registered_eventfd_is_signalled_on_completion() {
        use rustix::event::{eventfd, EventfdFlags};
        use std::os::fd::AsFd;
        let Some(mut e) = engine(4) else { return };
        let efd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).unwrap();
        e.register_eventfd(efd.as_fd()).unwrap();
        let mut cnt = [0u8; 8];
        assert!(rustix::io::read(&efd, &mut cnt).is_err(), "nothing yet");
        let dev_zero = std::fs::File::open("/dev/zero").unwrap();
        let b = crate::mem::DmaBuf::alloc(4096).unwrap();
        e.queue(IoOp::read(dev_zero.as_raw_fd(), 0), SgList::from_buf(b), 5)
            .unwrap();
        let done = c::run_until(&mut e, 1);
        assert_eq!(done[0].result, Ok(4096));
        assert_eq!(rustix::io::read(&efd, &mut cnt).unwrap(), 8);
        assert!(u64::from_ne_bytes(cnt) >= 1);
    }

    #[test]
    fn drop_with_io_in_flight_waits_and_returns_buffers() {
        let Some(mut e) = engine(4) else { return };
        let Some(f) = c::direct_file("drop", 8192) else {
            return;
        };
        let pool = {
            let mut o = crate::mem::BufPoolOptions::new("t-uring-drop", 4096, 1);
            o.hugepages = crate::mem::HugepageMode::Never;
            crate::mem::BufPool::new(o).unwrap()
        };
        let b = pool.get().unwrap();
        e.queue(IoOp::read(f.file.as_raw_fd(), 0), SgList::from_buf(b), 1)
            .unwrap();
        e.submit().unwrap();
        assert_eq!(pool.available(), 0, "the kernel holds the buffer");
        // The drop waits for the kernel to finish the read, then frees it.
        drop(e);
        assert_eq!(pool.available(), 1, "buffer returned");
    }
}
