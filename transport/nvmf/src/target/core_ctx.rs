//! Per-core target state: this reactor's cache of the shared data buffer
//! pool. One per core (the target's io_device channel), shared by every
//! queue pair of every transport on that core.

use pollux_reactor::mem::{BufCache, BufPool, DmaBuf, SgList};
use pollux_reactor::Reactor;

/// A core's share of the target.
#[derive(Debug)]
pub struct CoreCtx {
    reactor: Reactor,
    cache: BufCache,
    io_unit: usize,
}

impl CoreCtx {
    pub(crate) fn new(r: &Reactor, pool: &BufPool, io_unit: usize) -> Self {
        CoreCtx {
            reactor: r.clone(),
            cache: BufCache::new(pool, 64),
            io_unit,
        }
    }

    /// The reactor.
    pub fn reactor(&self) -> &Reactor {
        &self.reactor
    }

    /// Buffers this core's cache holds.
    pub fn cached_buffers(&self) -> usize {
        self.cache.cached()
    }

    /// Fill `bufs` with buffers holding exactly `len` bytes, all or nothing:
    /// `false` (and `bufs` empty) when the pool ran dry, so the caller parks
    /// the request and retries later.
    pub(crate) fn get_buffers(&self, len: usize, bufs: &mut SgList) -> bool {
        let mut left = len;
        while left > 0 {
            let Some(mut b): Option<DmaBuf> = self.cache.get() else {
                bufs.clear();
                return false;
            };
            let n = left.min(self.io_unit);
            if b.set_len(n).is_err() {
                bufs.clear();
                return false;
            }
            bufs.push(b);
            left -= n;
        }
        true
    }
}
