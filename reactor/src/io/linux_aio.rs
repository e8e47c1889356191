//! `LinuxAioEngine`: an [`IoEngine`] over Linux native AIO (`io_setup`,
//! `io_submit`, `io_getevents`, `io_destroy` as raw system calls), the
//! fallback when io_uring is unavailable. Files must be opened `O_DIRECT` for
//! the I/O to be truly asynchronous.

use std::collections::VecDeque;
use std::io;
use std::mem::size_of;

use super::engine::{
    EngineConfig, EngineError, EngineKind, IoDone, IoEngine, IoKind, IoOp, QueueError,
};
use super::slots::SlotTable;
use crate::mem::SgList;

/// `IOCB_CMD_*` from `linux/aio_abi.h`.
const IOCB_CMD_PREAD: u16 = 0;
const IOCB_CMD_PWRITE: u16 = 1;
const IOCB_CMD_FSYNC: u16 = 2;
const IOCB_CMD_PREADV: u16 = 7;
const IOCB_CMD_PWRITEV: u16 = 8;

/// `struct iocb` from `linux/aio_abi.h` (64 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Iocb {
    aio_data: u64,
    #[cfg(target_endian = "little")]
    aio_key: u32,
    aio_rw_flags: i32,
    #[cfg(target_endian = "big")]
    aio_key: u32,
    aio_lio_opcode: u16,
    aio_reqprio: i16,
    aio_fildes: u32,
    aio_buf: u64,
    aio_nbytes: u64,
    aio_offset: i64,
    aio_reserved2: u64,
    aio_flags: u32,
    aio_resfd: u32,
}

/// `struct io_event` from `linux/aio_abi.h` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct IoEvent {
    data: u64,
    obj: u64,
    res: i64,
    res2: i64,
}

const _: () = assert!(size_of::<Iocb>() == 64);
const _: () = assert!(size_of::<IoEvent>() == 32);

/// Linux native AIO engine (`!Send`).
pub struct LinuxAioEngine {
    // INVARIANT: `ctx` is a live AIO context until `Drop`. Every iocb handed
    // to `io_submit` is `iocbs[slot]` of a busy slot of `slots`, pointing only
    // at that slot's iovecs and buffers; `iocbs` and the slot iovecs are never
    // reallocated, so they stay valid until the event for the slot is reaped.
    ctx: libc::c_ulong,
    slots: SlotTable,
    iocbs: Box<[Iocb]>,
    /// Iocbs queued and not yet accepted by `io_submit`, oldest first.
    pending: VecDeque<*mut Iocb>,
    /// Keys of I/Os `io_submit` refused, with their errno, for the next reap.
    failed: VecDeque<(u64, i32)>,
    events: Box<[IoEvent]>,
}

impl LinuxAioEngine {
    /// Set up an AIO context for `cfg.depth` I/Os (control path).
    ///
    /// # Errors
    /// [`EngineError::InvalidConfig`], or [`EngineError::Setup`] when
    /// `io_setup` fails (e.g. `EAGAIN` past `/proc/sys/fs/aio-max-nr`).
    pub fn new(cfg: EngineConfig) -> Result<LinuxAioEngine, EngineError> {
        cfg.validate()?;
        let depth = cfg.depth as usize;
        let mut ctx: libc::c_ulong = 0;
        // SAFETY: io_setup writes one aio_context_t (unsigned long) to `ctx`,
        // which must be zero on entry.
        let r = unsafe {
            libc::syscall(
                libc::SYS_io_setup,
                libc::c_long::from(cfg.depth as i32),
                &mut ctx as *mut libc::c_ulong,
            )
        };
        if r < 0 {
            return Err(EngineError::Setup {
                engine: "linux-aio",
                source: io::Error::last_os_error(),
            });
        }
        Ok(LinuxAioEngine {
            ctx,
            slots: SlotTable::new(depth, cfg.max_segs),
            iocbs: vec![Iocb::default(); depth].into_boxed_slice(),
            pending: VecDeque::with_capacity(depth),
            failed: VecDeque::with_capacity(depth),
            events: vec![IoEvent::default(); depth].into_boxed_slice(),
        })
    }

    /// `io_getevents` without waiting (`min_nr` 0, zero timeout) into
    /// `events[..max]`; returns how many were filled.
    fn get_events(&mut self, max: usize) -> usize {
        let max = max.min(self.events.len());
        if max == 0 {
            return 0;
        }
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        loop {
            // SAFETY: `events` has room for `max` io_events; `ts` is a valid
            // timespec; `ctx` is live (INVARIANT).
            let r = unsafe {
                libc::syscall(
                    libc::SYS_io_getevents,
                    self.ctx,
                    0 as libc::c_long,
                    max as libc::c_long,
                    self.events.as_mut_ptr(),
                    &mut ts as *mut libc::timespec,
                )
            };
            if r >= 0 {
                return r as usize;
            }
            if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                return 0;
            }
        }
    }
}

impl IoEngine for LinuxAioEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::LinuxAio
    }

    fn queue(&mut self, op: IoOp, bufs: SgList, token: u64) -> Result<(), QueueError> {
        let t = self.slots.take(op.kind, bufs, token)?;
        let idx = (t.key as u32) as usize;
        let (opcode, buf, nbytes) = match (op.kind, t.nr) {
            (IoKind::Fsync, _) => (IOCB_CMD_FSYNC, 0, 0),
            (kind, 1) => {
                // SAFETY: `t.iov` points at the slot's first iovec (INVARIANT).
                let v = unsafe { *t.iov };
                let code = if kind == IoKind::Read {
                    IOCB_CMD_PREAD
                } else {
                    IOCB_CMD_PWRITE
                };
                (code, v.iov_base as u64, v.iov_len as u64)
            }
            (kind, nr) => {
                let code = if kind == IoKind::Read {
                    IOCB_CMD_PREADV
                } else {
                    IOCB_CMD_PWRITEV
                };
                (code, t.iov as u64, nr as u64)
            }
        };
        let Some(cb) = self.iocbs.get_mut(idx) else {
            // Slot indices are < depth == iocbs.len(); never lose buffers.
            let bufs = self
                .slots
                .complete(t.key, 0)
                .map(|d| d.bufs)
                .unwrap_or_default();
            return Err(QueueError::Full(bufs));
        };
        *cb = Iocb {
            aio_data: t.key,
            aio_lio_opcode: opcode,
            // A negative fd becomes a huge number the kernel rejects (EBADF).
            aio_fildes: op.fd as u32,
            aio_buf: buf,
            aio_nbytes: nbytes,
            aio_offset: i64::try_from(op.offset).unwrap_or(i64::MAX),
            ..Iocb::default()
        };
        self.pending.push_back(cb as *mut Iocb);
        Ok(())
    }

    fn submit(&mut self) -> io::Result<usize> {
        let mut accepted = 0;
        while !self.pending.is_empty() {
            let (ptrs, _) = self.pending.as_mut_slices();
            // SAFETY: `ptrs` are pointers to iocbs of busy slots, each valid
            // until its event is reaped (INVARIANT); `ctx` is live.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_io_submit,
                    self.ctx,
                    ptrs.len() as libc::c_long,
                    ptrs.as_mut_ptr(),
                )
            };
            if r > 0 {
                let n = r as usize;
                self.pending.drain(..n);
                accepted += n;
                continue;
            }
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EINTR) => continue,
                // No room in the kernel's ring now: retry at the next submit.
                Some(libc::EAGAIN) if accepted > 0 => break,
                Some(libc::EAGAIN) => return Err(err),
                // The first iocb is bad (EBADF, EINVAL, ...): fail it alone,
                // to be delivered by the next reap, and go on.
                Some(e) => {
                    if let Some(cb) = self.pending.pop_front() {
                        // SAFETY: a pending iocb of a busy slot (INVARIANT).
                        let key = unsafe { (*cb).aio_data };
                        self.failed.push_back((key, e));
                    }
                }
                None => return Err(err),
            }
        }
        Ok(accepted)
    }

    fn reap(&mut self, max: usize, mut on_done: impl FnMut(IoDone)) -> usize {
        let mut n = 0;
        while n < max {
            let Some((key, errno)) = self.failed.pop_front() else {
                break;
            };
            if let Some(done) = self.slots.complete(key, -i64::from(errno)) {
                on_done(done);
                n += 1;
            }
        }
        let got = self.get_events(max - n);
        for i in 0..got {
            let ev = self.events[i];
            match self.slots.complete(ev.data, ev.res) {
                Some(done) => {
                    on_done(done);
                    n += 1;
                }
                None => log::error!("linux-aio: event with unknown or stale key {:#x}", ev.data),
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

impl Drop for LinuxAioEngine {
    fn drop(&mut self) {
        // Queued but never submitted: the kernel never saw them.
        while let Some(cb) = self.pending.pop_front() {
            // SAFETY: a pending iocb of a busy slot (INVARIANT).
            let key = unsafe { (*cb).aio_data };
            drop(self.slots.complete(key, -i64::from(libc::ECANCELED)));
        }
        // io_destroy waits for (or cancels) every submitted I/O, so the
        // buffers are free to return to their pools after it.
        // SAFETY: `ctx` is live and destroyed once, here.
        let r = unsafe { libc::syscall(libc::SYS_io_destroy, self.ctx) };
        if r < 0 {
            self.slots.leak_busy();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::conformance as c;
    use super::*;

    fn engine(depth: u32) -> LinuxAioEngine {
        LinuxAioEngine::new(EngineConfig { depth, max_segs: 8 }).unwrap()
    }

    #[test]
    fn write_then_read_back() {
        c::write_then_read_back(&mut engine(8));
    }

    #[test]
    fn bad_fd_is_an_errno() {
        c::bad_fd_is_an_errno(&mut engine(8));
    }

    #[test]
    fn queue_full_returns_buffers() {
        c::queue_full_returns_buffers(&mut engine(4));
    }

    #[test]
    fn unsubmitted_io_is_cancelled_on_drop() {
        let mut e = engine(2);
        let pool = {
            let mut o = crate::mem::BufPoolOptions::new("t-aio-drop", 4096, 1);
            o.hugepages = crate::mem::HugepageMode::Never;
            crate::mem::BufPool::new(o).unwrap()
        };
        e.queue(IoOp::read(0, 0), SgList::from_buf(pool.get().unwrap()), 1)
            .unwrap();
        assert_eq!(pool.available(), 0);
        drop(e);
        assert_eq!(pool.available(), 1, "buffer returned");
    }
}
