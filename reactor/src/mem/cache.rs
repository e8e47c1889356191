//! `BufCache`: a per-reactor (`!Send`) cache over a [`BufPool`], with a FIFO
//! queue of waiters for back-pressure.
//!
//! The fast path (`get`, dropping a `DmaBuf` on the cache's thread) touches
//! only this thread's cache: no lock, no allocation. The shared lock-free
//! queue is touched in batches of `cache_size / 2` when the cache runs empty
//! or overflows.
//!
//! Waiters are tokens, not closures: [`BufCache::get_or_wait`] queues a `u64`
//! token (e.g. a request's slab key) and [`BufCache::poll`] hands buffers to
//! the oldest tokens first. Call `poll` from a poller of the reactor that owns
//! the cache; it never runs inside `get` or inside a buffer's drop, so a
//! completion never runs inside submit.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::fmt;
use std::ptr::NonNull;
use std::rc::Rc;

use super::buf::DmaBuf;
use super::pool::{self, BufPool, PoolRef, PoolShared};

thread_local! {
    /// The caches living on this thread (control path: changed only when a
    /// cache is created or dropped).
    static CACHES: RefCell<Vec<Rc<CacheInner>>> = const { RefCell::new(Vec::new()) };
}

/// Counters of one cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Calls to `get`/`get_or_wait`.
    pub gets: u64,
    /// Gets that found neither a cached nor a shared buffer.
    pub misses: u64,
    /// Tokens queued as waiters.
    pub waits: u64,
    /// Batches taken from the shared queue.
    pub refills: u64,
    /// Batches given back to the shared queue.
    pub drains: u64,
}

struct CacheState {
    /// Cached slot indices; capacity `cache_size`, never exceeded (no
    /// reallocation on the fast path).
    free: Vec<u32>,
    /// Waiting tokens, oldest first.
    waiters: VecDeque<u64>,
}

struct CacheInner {
    /// The cache's one reference to its pool (its slots hold theirs).
    pool: PoolRef,
    state: RefCell<CacheState>,
    stats: Cell<CacheStats>,
}

impl CacheInner {
    fn batch(&self) -> usize {
        (self.pool.cache_size() / 2).max(1)
    }

    fn bump(&self, f: impl FnOnce(&mut CacheStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    /// Take a slot from the cache, refilling from the shared queue if empty.
    fn take(&self, st: &mut CacheState) -> Option<u32> {
        if st.free.is_empty() && self.pool.take_batch(&mut st.free, self.batch()) > 0 {
            self.bump(|s| s.refills += 1);
        }
        st.free.pop()
    }

    /// Put a slot into the cache, draining a batch first when it is full.
    fn put(&self, st: &mut CacheState, idx: u32) {
        if st.free.len() == st.free.capacity() {
            let keep = st.free.len().saturating_sub(self.batch());
            let n = st.free.len() - keep;
            for i in st.free.drain(keep..) {
                self.pool.put_shared(i);
            }
            // SAFETY: the drained slots' references; `self.pool` keeps the
            // pool alive past this.
            unsafe { pool::release(self.pool.ptr(), n) };
            self.bump(|s| s.drains += 1);
        }
        st.free.push(idx);
    }
}

/// Return slot `idx` of `pool` (called by `DmaBuf::drop`): to a cache of this
/// thread for that pool if one can take it (preferring one with waiters),
/// else to the shared queue.
///
/// # Safety
/// The caller holds the slot's reference to the pool (a live buffer's) and
/// hands it over: it goes with the slot into a cache, or is given back.
pub(super) unsafe fn return_slot(pool_ptr: NonNull<PoolShared>, idx: u32) {
    // SAFETY: the slot's reference keeps the pool alive until released below.
    let pool = unsafe { pool_ptr.as_ref() };
    let done = CACHES
        .try_with(|caches| {
            let Ok(caches) = caches.try_borrow() else {
                return false;
            };
            let mut target: Option<&Rc<CacheInner>> = None;
            for c in caches.iter().filter(|c| c.pool.id() == pool.id()) {
                let waiting = c
                    .state
                    .try_borrow()
                    .map(|s| !s.waiters.is_empty())
                    .unwrap_or(false);
                if target.is_none() || waiting {
                    target = Some(c);
                }
                if waiting {
                    break;
                }
            }
            let Some(c) = target else {
                return false;
            };
            let put = match c.state.try_borrow_mut() {
                Ok(mut st) => {
                    c.put(&mut st, idx);
                    true
                }
                Err(_) => false,
            };
            put
        })
        .unwrap_or(false);
    if !done {
        pool.put_shared(idx);
        // SAFETY: the slot's reference, not used after this.
        unsafe { pool::release(pool_ptr, 1) };
    }
}

/// A per-reactor cache of one [`BufPool`] (`!Send`).
///
/// Create one per reactor per pool (e.g. in the reactor's channel for the
/// pool); several caches of the same pool may live on one thread (a
/// `TestCluster`), and buffers dropped on that thread return to one of them.
///
/// It cannot leave its thread:
/// ```compile_fail
/// use pollux_reactor::mem::{BufCache, BufPool, BufPoolOptions};
/// fn send<T: Send>(_: T) {}
/// let pool = BufPool::new(BufPoolOptions::new("x", 4096, 1)).unwrap();
/// send(BufCache::new(&pool, 0));
/// ```
pub struct BufCache {
    inner: Rc<CacheInner>,
}

impl fmt::Debug for BufCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufCache")
            .field("cached", &self.cached())
            .field("waiting", &self.waiting())
            .field("stats", &self.stats())
            .finish()
    }
}

impl BufCache {
    /// Create this thread's cache of `pool` (control path: allocates the free
    /// list and the waiter queue, with room for `waiters_hint` waiters before
    /// the queue has to grow).
    pub fn new(pool: &BufPool, waiters_hint: usize) -> BufCache {
        let shared = pool.shared().clone();
        let inner = Rc::new(CacheInner {
            state: RefCell::new(CacheState {
                free: Vec::with_capacity(shared.cache_size()),
                waiters: VecDeque::with_capacity(waiters_hint),
            }),
            pool: shared,
            stats: Cell::new(CacheStats::default()),
        });
        CACHES.with(|c| c.borrow_mut().push(Rc::clone(&inner)));
        BufCache { inner }
    }

    /// A buffer, or `None` when the cache and the shared pool are empty.
    pub fn get(&self) -> Option<DmaBuf> {
        let c = &self.inner;
        c.bump(|s| s.gets += 1);
        let slot = {
            let mut st = c.state.borrow_mut();
            c.take(&mut st)
        };
        match slot {
            Some(idx) => Some(DmaBuf::from_pool(c.pool.ptr(), idx)),
            None => {
                c.bump(|s| s.misses += 1);
                None
            }
        }
    }

    /// A buffer now, or `None` after queueing `token` as a waiter: a later
    /// [`poll`](Self::poll) hands it a buffer, oldest waiter first. While
    /// waiters are queued, new callers queue behind them (no overtaking).
    /// Queueing allocates only when more than `waiters_hint` tokens wait.
    pub fn get_or_wait(&self, token: u64) -> Option<DmaBuf> {
        let queued = !self.inner.state.borrow().waiters.is_empty();
        if !queued {
            if let Some(b) = self.get() {
                return Some(b);
            }
        } else {
            self.inner.bump(|s| s.gets += 1);
        }
        self.inner.state.borrow_mut().waiters.push_back(token);
        self.inner.bump(|s| s.waits += 1);
        None
    }

    /// Remove a queued waiter; `false` if it was not queued.
    pub fn cancel_wait(&self, token: u64) -> bool {
        let mut st = self.inner.state.borrow_mut();
        match st.waiters.iter().position(|&t| t == token) {
            Some(i) => {
                st.waiters.remove(i);
                true
            }
            None => false,
        }
    }

    /// Serve waiters in FIFO order with the buffers available (cached, then
    /// shared); returns how many were served. No borrow of the cache is held
    /// while `on_ready` runs, so it may get, wait or drop buffers.
    pub fn poll(&self, mut on_ready: impl FnMut(u64, DmaBuf)) -> usize {
        let c = &self.inner;
        let mut served = 0;
        loop {
            let next = {
                let mut st = c.state.borrow_mut();
                if st.waiters.is_empty() {
                    None
                } else {
                    c.take(&mut st)
                        .and_then(|idx| st.waiters.pop_front().map(|t| (t, idx)))
                }
            };
            let Some((token, idx)) = next else {
                break;
            };
            on_ready(token, DmaBuf::from_pool(c.pool.ptr(), idx));
            served += 1;
        }
        served
    }

    /// Number of queued waiters.
    pub fn waiting(&self) -> usize {
        self.inner.state.borrow().waiters.len()
    }

    /// Number of buffers held by this cache.
    pub fn cached(&self) -> usize {
        self.inner.state.borrow().free.len()
    }

    /// Counters.
    pub fn stats(&self) -> CacheStats {
        self.inner.stats.get()
    }
}

impl Drop for BufCache {
    fn drop(&mut self) {
        let _ = CACHES.try_with(|c| {
            if let Ok(mut c) = c.try_borrow_mut() {
                c.retain(|x| !Rc::ptr_eq(x, &self.inner));
            }
        });
        let mut st = self.inner.state.borrow_mut();
        if !st.waiters.is_empty() {
            log::warn!(
                "buffer cache dropped with {} waiters still queued",
                st.waiters.len()
            );
        }
        let n = st.free.len();
        for i in st.free.drain(..) {
            self.inner.pool.put_shared(i);
        }
        if n > 0 {
            // SAFETY: the cached slots' references; the cache's own
            // (`inner.pool`) keeps the pool alive past this.
            unsafe { pool::release(self.inner.pool.ptr(), n) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::{BufPoolOptions, HugepageMode};

    fn pool(count: usize, cache: usize) -> BufPool {
        let mut o = BufPoolOptions::new("t-cache", 4096, count);
        o.hugepages = HugepageMode::Never;
        o.cache_size = cache;
        BufPool::new(o).unwrap()
    }

    #[test]
    fn refills_in_batches_and_drains_when_full() {
        let p = pool(64, 8);
        let c = BufCache::new(&p, 4);
        let b = c.get().unwrap();
        // One batch of cache_size / 2 = 4 came over, one is out.
        assert_eq!(c.cached(), 3);
        assert_eq!(p.available(), 60);
        assert_eq!(c.stats().refills, 1);
        drop(b);
        assert_eq!(c.cached(), 4, "drop on this thread returns to the cache");
        assert_eq!(p.available(), 60);
        // Take 20 and give them all back: the cache keeps at most 8.
        let bufs: Vec<_> = (0..20).map(|_| c.get().unwrap()).collect();
        drop(bufs);
        assert!(c.cached() <= 8);
        assert!(c.stats().drains > 0);
        assert_eq!(p.available() + c.cached(), 64);
        drop(c);
        assert_eq!(p.available(), 64, "dropping the cache drains it");
    }

    #[test]
    fn buffers_outlive_their_cache_and_pool_and_free_it_last() {
        let p = pool(16, 8);
        let arena = std::sync::Arc::downgrade(&p.arenas()[0]);
        let c = BufCache::new(&p, 0);
        let mut a = c.get().unwrap();
        let b = p.get().unwrap();
        // One reference per handle and cache, one per slot off the shared
        // queue (a batch of 4 for the cache, 1 for `b`).
        assert_eq!(p.shared().refs(), 2 + 4 + 1);
        drop(c);
        assert_eq!(
            p.shared().refs(),
            1 + 1 + 1,
            "drained slots gave theirs back"
        );
        drop(p);
        a.as_mut_slice().fill(7);
        assert!(a.as_slice().iter().all(|&x| x == 7));
        drop(a);
        assert!(arena.upgrade().is_some(), "`b` still holds the pool");
        drop(b);
        assert!(arena.upgrade().is_none(), "the last buffer freed the pool");
    }

    #[test]
    fn exhaustion_is_a_miss_not_a_failure() {
        let p = pool(2, 2);
        let c = BufCache::new(&p, 0);
        let a = c.get().unwrap();
        let b = c.get().unwrap();
        assert!(c.get().is_none());
        assert_eq!(c.stats().misses, 1);
        assert_eq!(c.stats().gets, 3);
        drop((a, b));
        assert!(c.get().is_some());
    }

    #[test]
    fn waiters_are_served_fifo_when_buffers_return() {
        let p = pool(2, 2);
        let c = BufCache::new(&p, 4);
        let a = c.get_or_wait(100).unwrap();
        let b = c.get_or_wait(101).unwrap();
        assert!(c.get_or_wait(1).is_none());
        assert!(c.get_or_wait(2).is_none());
        assert!(c.get_or_wait(3).is_none());
        assert_eq!(c.waiting(), 3);
        assert_eq!(c.stats().waits, 3);
        let mut got = Vec::new();
        assert_eq!(c.poll(|t, buf| got.push((t, buf))), 0, "nothing free yet");
        drop(a);
        assert!(
            c.get_or_wait(4).is_none(),
            "no overtaking while waiters queue"
        );
        assert_eq!(c.poll(|t, buf| got.push((t, buf))), 1);
        drop(b);
        assert_eq!(c.poll(|t, buf| got.push((t, buf))), 1);
        let order: Vec<u64> = got.iter().map(|(t, _)| *t).collect();
        assert_eq!(order, vec![1, 2]);
        assert!(c.cancel_wait(4));
        assert!(!c.cancel_wait(4));
        got.clear();
        // Dropping the buffers of 1 and 2 lets 3 be served.
        assert_eq!(c.poll(|t, buf| got.push((t, buf))), 1);
        assert_eq!(got[0].0, 3);
        assert_eq!(c.waiting(), 0);
    }

    #[test]
    fn poll_callback_may_drop_and_get() {
        let p = pool(1, 2);
        let c = BufCache::new(&p, 2);
        let a = c.get().unwrap();
        assert!(c.get_or_wait(7).is_none());
        assert!(c.get_or_wait(8).is_none());
        drop(a);
        let mut served = Vec::new();
        // Each waiter drops its buffer at once, which lets the next one run.
        let n = c.poll(|t, buf| {
            served.push(t);
            drop(buf);
        });
        assert_eq!(n, 2);
        assert_eq!(served, vec![7, 8]);
    }

    #[test]
    fn waiters_on_one_cache_get_buffers_freed_elsewhere() {
        let p = pool(2, 2);
        let c = BufCache::new(&p, 1);
        let a = c.get().unwrap();
        let b = c.get().unwrap();
        assert!(c.get_or_wait(9).is_none());
        // Freed on a thread without a cache: goes to the shared queue.
        std::thread::spawn(move || drop((a, b))).join().unwrap();
        assert_eq!(p.available(), 2);
        let mut got = None;
        assert_eq!(c.poll(|t, buf| got = Some((t, buf))), 1);
        assert_eq!(got.map(|(t, _)| t), Some(9));
    }

    #[test]
    fn two_caches_on_one_thread_prefer_the_one_waiting() {
        let p = pool(2, 2);
        let c1 = BufCache::new(&p, 1);
        let c2 = BufCache::new(&p, 1);
        let a = c1.get().unwrap();
        let b = c1.get().unwrap();
        assert!(c2.get_or_wait(5).is_none());
        drop(a);
        assert_eq!(c2.cached(), 1, "returned to the cache with a waiter");
        assert_eq!(c2.poll(|t, _| assert_eq!(t, 5)), 1);
        drop(b);
        assert_eq!(c1.cached() + c2.cached() + p.available(), 2);
    }

    #[test]
    fn buffers_are_conserved_across_threads_and_caches() {
        let p = pool(64, 8);
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let p = p.clone();
                std::thread::spawn(move || {
                    let c = BufCache::new(&p, 8);
                    let mut held = Vec::new();
                    let mut foreign = Vec::new();
                    for i in 0..5000usize {
                        if let Some(mut b) = c.get() {
                            b.as_mut_slice()[0] = t as u8;
                            if i % 7 == 0 && foreign.len() < 4 {
                                // Dropped on another thread (its cache or the queue).
                                foreign.push(b);
                            } else {
                                held.push(b);
                            }
                        }
                        if held.len() > 6 || i % 3 == 0 {
                            held.clear();
                        }
                        for b in &held {
                            assert_eq!(b.as_slice()[0], t as u8, "no buffer is shared");
                        }
                    }
                    drop(held);
                    drop(c);
                    foreign
                })
            })
            .collect();
        let foreign: Vec<Vec<DmaBuf>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let out: usize = foreign.iter().map(Vec::len).sum();
        assert_eq!(p.available() + out, 64);
        drop(foreign);
        assert_eq!(p.available(), 64);
    }
}
