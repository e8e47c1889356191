//! Per-core target state, the [`IscsiTarget`]'s io_device channel: this
//! reactor's cache of the shared task-buffer pool and the sessions this
//! core was told to close (session reinstatement). One per core, shared by
//! every connection on it; `!Send`.
//!
//! Task buffers are taken from the cache per command and dropped when the
//! task is freed: a buffer dropped on this core goes back to this core's
//! cache, so the shared pool is touched only in batches (refill/drain),
//! never per I/O.

use std::cell::RefCell;

use pollux_reactor::mem::{BufCache, CacheStats, DmaBuf};
use pollux_reactor::{IoDevice, Reactor};

use super::config::IscsiTarget;

/// A core's share of an [`IscsiTarget`].
#[derive(Debug)]
pub struct CoreCtx {
    cache: BufCache,
    /// TSIHs of sessions on this core that a reinstating login elsewhere
    /// retired; their connections close at their next poll.
    doomed: RefCell<Vec<u16>>,
}

impl CoreCtx {
    /// A task buffer from this core's cache, `None` when the cache and the
    /// shared pool are empty (the task waits).
    #[inline]
    pub(crate) fn get(&self) -> Option<DmaBuf> {
        self.cache.get()
    }

    /// Buffers this core's cache holds.
    pub fn cached_buffers(&self) -> usize {
        self.cache.cached()
    }

    /// The cache's counters (gets, misses, refills from and drains to the
    /// shared pool).
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// Whether any session of this core was retired (one `RefCell` borrow,
    /// no atomic: checked once per connection poll).
    #[inline]
    pub(crate) fn any_doomed(&self) -> bool {
        !self.doomed.borrow().is_empty()
    }

    /// Take `tsih` off the retired list; `true` if it was there.
    pub(crate) fn take_doomed(&self, tsih: u16) -> bool {
        let mut d = self.doomed.borrow_mut();
        match d.iter().position(|&t| t == tsih) {
            Some(i) => {
                d.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// Retire session `tsih` of this core (runs from a reactor message).
    pub(crate) fn doom(&self, tsih: u16) {
        let mut d = self.doomed.borrow_mut();
        if !d.contains(&tsih) {
            d.push(tsih);
        }
    }
}

/// The per-core state of an iSCSI target is its io_device channel.
impl IoDevice for IscsiTarget {
    type Channel = CoreCtx;
    type Error = std::convert::Infallible;

    fn create_channel(&self, _r: &Reactor) -> Result<CoreCtx, Self::Error> {
        Ok(CoreCtx {
            cache: BufCache::new(self.pool(), 0),
            doomed: RefCell::new(Vec::new()),
        })
    }
}
