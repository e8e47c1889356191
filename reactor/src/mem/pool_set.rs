//! `PoolSet`: a small and a large [`BufPool`], like SPDK's iobuf, with the
//! per-reactor [`PoolSetCache`] over both.

use super::arena::HugepageMode;
use super::buf::DmaBuf;
use super::cache::BufCache;
use super::error::MemResult;
use super::pool::{BufPool, BufPoolOptions};

/// Sizes of a [`PoolSet`] (defaults: 8192 × 8 KiB and 1024 × 128 KiB).
#[derive(Debug, Clone)]
pub struct PoolSetOptions {
    /// Capacity of a small buffer.
    pub small_size: usize,
    /// Number of small buffers.
    pub small_count: usize,
    /// Per-reactor cache of small buffers.
    pub small_cache: usize,
    /// Capacity of a large buffer.
    pub large_size: usize,
    /// Number of large buffers.
    pub large_count: usize,
    /// Per-reactor cache of large buffers.
    pub large_cache: usize,
    /// Hugepage policy of the arenas.
    pub hugepages: HugepageMode,
}

impl Default for PoolSetOptions {
    fn default() -> Self {
        PoolSetOptions {
            small_size: 8 << 10,
            small_count: 8192,
            small_cache: 128,
            large_size: 128 << 10,
            large_count: 1024,
            large_cache: 16,
            hugepages: HugepageMode::Auto,
        }
    }
}

/// Which pool of a [`PoolSet`] a buffer size maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolClass {
    /// The small pool.
    Small,
    /// The large pool.
    Large,
}

/// A small and a large buffer pool (`Clone`, `Send`, `Sync`).
#[derive(Debug, Clone)]
pub struct PoolSet {
    small: BufPool,
    large: BufPool,
}

impl PoolSet {
    /// Create both pools (control path).
    ///
    /// # Errors
    /// As [`BufPool::new`].
    pub fn new(opts: &PoolSetOptions) -> MemResult<PoolSet> {
        let mut s = BufPoolOptions::new("iobuf-small", opts.small_size, opts.small_count);
        s.cache_size = opts.small_cache;
        s.hugepages = opts.hugepages;
        let mut l = BufPoolOptions::new("iobuf-large", opts.large_size, opts.large_count);
        l.cache_size = opts.large_cache;
        l.hugepages = opts.hugepages;
        Ok(PoolSet {
            small: BufPool::new(s)?,
            large: BufPool::new(l)?,
        })
    }

    /// The class serving `len` bytes in one buffer, or `None` if larger than a
    /// large buffer (split the I/O).
    pub fn class_for(&self, len: usize) -> Option<PoolClass> {
        if len <= self.small.buf_size() {
            Some(PoolClass::Small)
        } else if len <= self.large.buf_size() {
            Some(PoolClass::Large)
        } else {
            None
        }
    }

    /// The pool of a class.
    pub fn pool(&self, class: PoolClass) -> &BufPool {
        match class {
            PoolClass::Small => &self.small,
            PoolClass::Large => &self.large,
        }
    }

    /// The small pool.
    pub fn small(&self) -> &BufPool {
        &self.small
    }

    /// The large pool.
    pub fn large(&self) -> &BufPool {
        &self.large
    }
}

/// A reactor's caches of a [`PoolSet`] (`!Send`).
#[derive(Debug)]
pub struct PoolSetCache {
    small: BufCache,
    large: BufCache,
    set: PoolSet,
}

impl PoolSetCache {
    /// Create this thread's caches (control path).
    pub fn new(set: &PoolSet, waiters_hint: usize) -> PoolSetCache {
        PoolSetCache {
            small: BufCache::new(set.small(), waiters_hint),
            large: BufCache::new(set.large(), waiters_hint),
            set: set.clone(),
        }
    }

    /// The cache of a class.
    pub fn cache(&self, class: PoolClass) -> &BufCache {
        match class {
            PoolClass::Small => &self.small,
            PoolClass::Large => &self.large,
        }
    }

    /// A buffer of the smallest class holding `len` bytes, with its length set
    /// to `len`; `None` when that pool is exhausted or `len` is too large.
    pub fn get(&self, len: usize) -> Option<DmaBuf> {
        let class = self.set.class_for(len)?;
        let mut b = self.cache(class).get()?;
        // `len <= capacity` by the choice of class.
        b.set_len(len).ok()?;
        Some(b)
    }

    /// Serve the waiters of both caches (small first); see [`BufCache::poll`].
    pub fn poll(&self, mut on_ready: impl FnMut(PoolClass, u64, DmaBuf)) -> usize {
        self.small.poll(|t, b| on_ready(PoolClass::Small, t, b))
            + self.large.poll(|t, b| on_ready(PoolClass::Large, t, b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_pick_the_right_pool() {
        let opts = PoolSetOptions {
            small_size: 8192,
            small_count: 4,
            small_cache: 2,
            large_size: 128 << 10,
            large_count: 2,
            large_cache: 2,
            hugepages: HugepageMode::Never,
        };
        let set = PoolSet::new(&opts).unwrap();
        assert_eq!(set.class_for(512), Some(PoolClass::Small));
        assert_eq!(set.class_for(8192), Some(PoolClass::Small));
        assert_eq!(set.class_for(8193), Some(PoolClass::Large));
        assert_eq!(set.class_for((128 << 10) + 1), None);
        let c = PoolSetCache::new(&set, 2);
        let s = c.get(4096).unwrap();
        assert_eq!((s.len(), s.capacity()), (4096, 8192));
        let l = c.get(65536).unwrap();
        assert_eq!((l.len(), l.capacity()), (65536, 128 << 10));
        let l2 = c.get(65536).unwrap();
        assert!(c.get(65536).is_none(), "large pool exhausted");
        assert!(c.cache(PoolClass::Large).get_or_wait(42).is_none());
        drop(l);
        let mut got = Vec::new();
        assert_eq!(c.poll(|cl, t, _| got.push((cl, t))), 1);
        assert_eq!(got, vec![(PoolClass::Large, 42)]);
        drop((s, l2));
    }
}
