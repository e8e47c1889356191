//! `BufPool`: a shared pool of fixed-size [`DmaBuf`]s over one or more arenas.
//!
//! The pool's free list is a lock-free `crossbeam_queue::ArrayQueue` of slot
//! indices. Reactors do not touch it per I/O: each has a
//! [`BufCache`](super::BufCache) that refills from it and drains to it in
//! batches. Creating a pool is control path (arenas, allocation).

use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_queue::ArrayQueue;

use super::arena::{ArenaOptions, DmaArena, HugepageMode};
use super::buf::DmaBuf;
use super::error::{MemError, MemResult};

/// Options of [`BufPool::new`].
#[derive(Debug, Clone)]
pub struct BufPoolOptions {
    /// Name (logs, arena names).
    pub name: String,
    /// Capacity of each buffer in bytes.
    pub buf_size: usize,
    /// Number of buffers.
    pub count: usize,
    /// Alignment of each buffer: a power of two, at most 4096.
    pub align: usize,
    /// Most buffers a per-reactor [`BufCache`](super::BufCache) keeps; it
    /// refills and drains in batches of half of this. Size the pool so that
    /// `count > cores * cache_size`, or buffers parked in idle caches can
    /// starve another core.
    pub cache_size: usize,
    /// Hugepage policy of the backing arenas.
    pub hugepages: HugepageMode,
    /// Largest arena to create; a pool needing more memory uses several.
    pub max_arena_len: usize,
}

impl BufPoolOptions {
    /// `count` buffers of `buf_size` bytes, 4 KiB aligned, cache of 32,
    /// hugepages if available, arenas of at most 1 GiB.
    pub fn new(name: impl Into<String>, buf_size: usize, count: usize) -> Self {
        BufPoolOptions {
            name: name.into(),
            buf_size,
            count,
            align: 4096,
            cache_size: 32,
            hugepages: HugepageMode::Auto,
            max_arena_len: 1 << 30,
        }
    }
}

/// Source of pool ids (control path).
static NEXT_POOL_ID: AtomicU64 = AtomicU64::new(1);

/// State shared by a pool, its caches and its buffers.
pub(crate) struct PoolShared {
    // INVARIANT: slot `i < count` is `stride` bytes at offset
    // `(i % per_arena) * stride` of `arenas[i / per_arena]`, inside that arena,
    // and every slot index is in exactly one place: `free`, one cache's free
    // list, or one live `DmaBuf`.
    //
    // INVARIANT (lifetime): `refs` counts one reference per `PoolRef` (the
    // `BufPool` handles and the caches) plus one per slot that is not on
    // `free`; the pool is freed when it reaches zero. A slot's reference is
    // taken when it leaves `free` and given back when it returns there, in
    // batches with the cache's refills and drains: a buffer moving between
    // a cache and its user touches no shared counter.
    refs: AtomicUsize,
    id: u64,
    name: String,
    arenas: Vec<Arc<DmaArena>>,
    buf_size: usize,
    stride: usize,
    per_arena: usize,
    count: usize,
    cache_size: usize,
    free: ArrayQueue<u32>,
    /// A one-slot pool made by [`DmaBuf::alloc`]: its buffer is never returned.
    standalone: bool,
}

impl PoolShared {
    /// The one-slot pool of a standalone buffer of `len` bytes filling `arena`
    /// (control path: allocates).
    pub(crate) fn standalone(arena: Arc<DmaArena>, len: usize) -> PoolRef {
        PoolRef::new(PoolShared {
            refs: AtomicUsize::new(1),
            id: NEXT_POOL_ID.fetch_add(1, Ordering::Relaxed),
            name: String::from("pollux-standalone"),
            arenas: vec![arena],
            buf_size: len,
            stride: len,
            per_arena: 1,
            count: 1,
            cache_size: 2,
            free: ArrayQueue::new(1),
            standalone: true,
        })
    }

    /// References held now (tests).
    #[cfg(test)]
    pub(crate) fn refs(&self) -> usize {
        self.refs.load(Ordering::Relaxed)
    }

    #[inline]
    pub(crate) fn is_standalone(&self) -> bool {
        self.standalone
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    #[inline]
    pub(crate) fn buf_size(&self) -> usize {
        self.buf_size
    }

    pub(crate) fn cache_size(&self) -> usize {
        self.cache_size
    }

    /// The arena of slot `idx` and the slot's offset in it.
    #[inline]
    pub(crate) fn arena_of(&self, idx: u32) -> (&Arc<DmaArena>, usize) {
        let i = idx as usize;
        // Indices only come from this pool's own free list, so `i < count`
        // and the arena exists (INVARIANT); fall back to the first arena
        // rather than panic if that were ever broken.
        let arena = self
            .arenas
            .get(i / self.per_arena)
            .unwrap_or(&self.arenas[0]);
        (arena, (i % self.per_arena) * self.stride)
    }

    #[inline]
    pub(crate) fn slot_ptr(&self, idx: u32) -> NonNull<u8> {
        let (arena, off) = self.arena_of(idx);
        // SAFETY: `off + stride <= arena.len()` (INVARIANT), so the pointer
        // stays inside the mapping.
        let p = unsafe { arena.base().add(off) };
        // A pointer into a live mapping is never null.
        NonNull::new(p).unwrap_or(NonNull::dangling())
    }

    /// Pop up to `max` slots from the shared queue into `out`, taking one
    /// reference per slot (one atomic add for the batch).
    pub(crate) fn take_batch(&self, out: &mut Vec<u32>, max: usize) -> usize {
        let mut n = 0;
        while n < max && out.len() < out.capacity() {
            match self.free.pop() {
                Some(i) => {
                    out.push(i);
                    n += 1;
                }
                None => break,
            }
        }
        if n > 0 {
            self.refs.fetch_add(n, Ordering::Relaxed);
        }
        n
    }

    /// Put a slot back on the shared queue (its reference is still to be
    /// given back with [`release`]).
    pub(crate) fn put_shared(&self, idx: u32) {
        // The queue holds `count` entries and each slot is in one place
        // only, so it is never full; if it were, losing a slot beats a crash.
        if self.free.push(idx).is_err() {
            log::error!("pool `{}`: shared queue full, slot {idx} lost", self.name);
        }
    }
}

/// Give back `n` references to the pool at `pool`, freeing it with the last.
///
/// # Safety
/// The caller holds `n` references (see the lifetime INVARIANT of
/// [`PoolShared`]) and uses none of them, nor `pool`, afterwards.
pub(crate) unsafe fn release(pool: NonNull<PoolShared>, n: usize) {
    // SAFETY: the caller's references keep the pool alive until this
    // subtraction.
    let before = unsafe { pool.as_ref() }
        .refs
        .fetch_sub(n, Ordering::Release);
    if before == n {
        // Every other holder's accesses happened before its release.
        fence(Ordering::Acquire);
        // SAFETY: that was the last reference; the pool came from
        // `Box::into_raw` in `PoolRef::new`.
        drop(unsafe { Box::from_raw(pool.as_ptr()) });
    }
}

/// One counted reference to a [`PoolShared`] (a pool handle's or a
/// cache's): `Clone` adds one, `Drop` gives it back.
pub(crate) struct PoolRef(NonNull<PoolShared>);

// SAFETY: `PoolShared` is `Send + Sync` (arenas are `Arc`s, the queue is
// lock-free, the counter atomic) and the reference count is atomic, like an
// `Arc<PoolShared>`.
unsafe impl Send for PoolRef {}
// SAFETY: as for `Send`: `&PoolRef` only gives `&PoolShared`.
unsafe impl Sync for PoolRef {}

impl PoolRef {
    /// A new pool with `shared.refs` (1) held by the result.
    fn new(shared: PoolShared) -> PoolRef {
        PoolRef(NonNull::from(Box::leak(Box::new(shared))))
    }

    /// The pool's address (for buffers, which hold a slot's reference).
    #[inline]
    pub(crate) fn ptr(&self) -> NonNull<PoolShared> {
        self.0
    }

    /// Turn this reference into a slot's (a standalone buffer's).
    pub(crate) fn into_slot_ref(self) -> NonNull<PoolShared> {
        let p = self.0;
        std::mem::forget(self);
        p
    }
}

impl std::ops::Deref for PoolRef {
    type Target = PoolShared;

    #[inline]
    fn deref(&self) -> &PoolShared {
        // SAFETY: this reference keeps the pool alive.
        unsafe { self.0.as_ref() }
    }
}

impl Clone for PoolRef {
    fn clone(&self) -> Self {
        self.refs.fetch_add(1, Ordering::Relaxed);
        PoolRef(self.0)
    }
}

impl Drop for PoolRef {
    fn drop(&mut self) {
        // SAFETY: we hold one reference and drop it here.
        unsafe { release(self.0, 1) }
    }
}

/// A shared pool of fixed-size, aligned [`DmaBuf`]s (`Arc` inside: `Clone`,
/// `Send`, `Sync`).
///
/// Reactors take buffers through their own [`BufCache`](super::BufCache);
/// [`BufPool::get`] takes one straight from the shared queue (tests,
/// control path, threads without a cache).
#[derive(Clone)]
pub struct BufPool {
    shared: PoolRef,
}

impl fmt::Debug for BufPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufPool")
            .field("name", &self.shared.name)
            .field("buf_size", &self.shared.buf_size)
            .field("count", &self.shared.count)
            .field("available", &self.shared.free.len())
            .finish()
    }
}

impl BufPool {
    /// Create a pool and its arenas (control path).
    ///
    /// # Errors
    /// [`MemError::InvalidArgument`] for a zero size or count, a count over
    /// `u32::MAX` or a buffer size over `u32::MAX`, an alignment that is not a power of two or exceeds 4096;
    /// arena creation errors otherwise.
    pub fn new(opts: BufPoolOptions) -> MemResult<BufPool> {
        if opts.buf_size == 0 || opts.count == 0 {
            return Err(MemError::InvalidArgument(
                "pool buffer size or count is zero",
            ));
        }
        if u32::try_from(opts.buf_size).is_err() {
            return Err(MemError::InvalidArgument(
                "pool buffer size exceeds u32::MAX",
            ));
        }
        if !opts.align.is_power_of_two() || opts.align > 4096 {
            return Err(MemError::InvalidArgument(
                "pool alignment must be a power of two <= 4096",
            ));
        }
        let count32 = u32::try_from(opts.count)
            .map_err(|_| MemError::InvalidArgument("pool count exceeds u32::MAX"))?;
        let stride = opts
            .buf_size
            .checked_add(opts.align - 1)
            .map(|s| s / opts.align * opts.align)
            .ok_or(MemError::InvalidArgument("pool buffer size overflows"))?;
        let per_arena = (opts.max_arena_len / stride).clamp(1, opts.count);
        let n_arenas = opts.count.div_ceil(per_arena);
        let mut arenas = Vec::with_capacity(n_arenas);
        for a in 0..n_arenas {
            let in_this = per_arena.min(opts.count - a * per_arena);
            let len = in_this
                .checked_mul(stride)
                .ok_or(MemError::InvalidArgument("pool size overflows"))?;
            let name = format!("{}-{a}", opts.name);
            arenas.push(DmaArena::new(
                len,
                ArenaOptions::named(name).hugepages(opts.hugepages),
            )?);
        }
        let free = ArrayQueue::new(opts.count);
        for i in 0..count32 {
            // Capacity is exactly `count`: cannot fail.
            let _ = free.push(i);
        }
        let shared = PoolRef::new(PoolShared {
            refs: AtomicUsize::new(1),
            id: NEXT_POOL_ID.fetch_add(1, Ordering::Relaxed),
            name: opts.name,
            arenas,
            buf_size: opts.buf_size,
            stride,
            per_arena,
            count: opts.count,
            cache_size: opts.cache_size.max(2),
            free,
            standalone: false,
        });
        Ok(BufPool { shared })
    }

    pub(crate) fn shared(&self) -> &PoolRef {
        &self.shared
    }

    /// Take a buffer from the shared queue, or `None` when it is empty.
    /// Reactors should use their [`BufCache`](super::BufCache) instead.
    pub fn get(&self) -> Option<DmaBuf> {
        let i = self.shared.free.pop()?;
        self.shared.refs.fetch_add(1, Ordering::Relaxed);
        Some(DmaBuf::from_pool(self.shared.ptr(), i))
    }

    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Capacity of each buffer.
    pub fn buf_size(&self) -> usize {
        self.shared.buf_size
    }

    /// Total number of buffers.
    pub fn count(&self) -> usize {
        self.shared.count
    }

    /// Buffers on the shared queue now (not counting those in caches).
    pub fn available(&self) -> usize {
        self.shared.free.len()
    }

    /// The arenas backing the pool (to register them with a verbs device).
    pub fn arenas(&self) -> &[Arc<DmaArena>] {
        &self.shared.arenas
    }

    /// Process-unique id of the pool.
    pub fn id(&self) -> u64 {
        self.shared.id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn opts(size: usize, count: usize) -> BufPoolOptions {
        let mut o = BufPoolOptions::new("t-pool", size, count);
        o.hugepages = HugepageMode::Never;
        o
    }

    #[test]
    fn get_until_empty_then_drop_returns() {
        let pool = BufPool::new(opts(5000, 4)).unwrap();
        let bufs: Vec<DmaBuf> = (0..4).map(|_| pool.get().unwrap()).collect();
        assert!(pool.get().is_none(), "exhausted");
        assert_eq!(pool.available(), 0);
        // Distinct, aligned, non-overlapping, with the right capacity.
        let addrs: HashSet<usize> = bufs.iter().map(|b| b.addr()).collect();
        assert_eq!(addrs.len(), 4);
        for b in &bufs {
            assert_eq!(b.addr() % 4096, 0);
            assert_eq!(b.capacity(), 5000);
            assert_eq!(b.arena_offset() % 8192, 0);
        }
        drop(bufs);
        assert_eq!(pool.available(), 4);
    }

    #[test]
    fn buffers_do_not_overlap_and_keep_their_data() {
        let pool = BufPool::new(opts(100, 8)).unwrap();
        let mut bufs: Vec<DmaBuf> = (0..8).map(|_| pool.get().unwrap()).collect();
        for (i, b) in bufs.iter_mut().enumerate() {
            b.as_mut_slice().fill(i as u8);
        }
        for (i, b) in bufs.iter().enumerate() {
            assert!(b.as_slice().iter().all(|&x| x == i as u8));
        }
    }

    #[test]
    fn several_arenas_when_the_pool_is_larger_than_one() {
        let mut o = opts(4096, 10);
        o.max_arena_len = 3 * 4096;
        let pool = BufPool::new(o).unwrap();
        assert_eq!(pool.arenas().len(), 4);
        let bufs: Vec<DmaBuf> = (0..10).map(|_| pool.get().unwrap()).collect();
        let ids: HashSet<_> = bufs.iter().map(|b| b.arena_id()).collect();
        assert_eq!(ids.len(), 4);
        for b in &bufs {
            assert!(b.arena().contains(b.addr(), b.capacity()));
            assert_eq!(b.arena().base_addr() + b.arena_offset(), b.addr());
        }
    }

    #[test]
    fn invalid_options_are_errors() {
        assert!(BufPool::new(opts(0, 1)).is_err());
        assert!(BufPool::new(opts(1, 0)).is_err());
        let mut o = opts(1, 1);
        o.align = 3;
        assert!(BufPool::new(o).is_err());
    }

    #[test]
    fn buffer_dropped_on_another_thread_comes_back() {
        let pool = BufPool::new(opts(64, 1)).unwrap();
        let b = pool.get().unwrap();
        std::thread::spawn(move || drop(b)).join().unwrap();
        assert_eq!(pool.available(), 1);
    }
}
