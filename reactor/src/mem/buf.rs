//! `DmaBuf`: an exclusively owned, aligned buffer inside a [`DmaArena`].

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use super::arena::{ArenaId, ArenaOptions, DmaArena, HugepageMode};
use super::cache;
use super::error::{MemError, MemResult};
use super::pool::{self, PoolShared};

/// An owned, aligned buffer of DMA-able memory inside a [`DmaArena`].
///
/// It is owned by whoever holds it, and by the engine or queue pair carrying
/// it until that I/O completes. Dropping a pool buffer returns it to its pool:
/// to the current thread's [`BufCache`](super::BufCache) for that pool when
/// there is one (no lock, no atomic read-modify-write, no allocation), else
/// to the pool's shared lock-free queue.
///
/// `DmaBuf` is `Send` (and `Sync`): it can be handed to another core in a
/// message, and from there it returns to that core's cache or to the shared
/// queue. It is the only handle to its bytes, exactly like a `Box<[u8]>`.
pub struct DmaBuf {
    // INVARIANT: `ptr..ptr+cap` lies inside the arena of `pool`, which this
    // buffer keeps alive (its slot holds one of the pool's references, see
    // `PoolShared`: taken in batches when slots leave the shared queue, not
    // per buffer), and no other live
    // `DmaBuf` or reference covers any byte of it: pools hand each slot to at
    // most one `DmaBuf` at a time (a slot index is in exactly one of: the
    // shared free queue, one cache's free list, one `DmaBuf`). `len <= cap`,
    // where `cap` is `pool.buf_size()`. A standalone buffer
    // ([`DmaBuf::alloc`]) has a one-slot pool of its own that is never
    // returned to (`pool.is_standalone()`); it is freed with that pool.
    //
    // Kept at 24 bytes (pointer, pool, slot, length): buffers travel by value
    // with every I/O, inline in `SgList`s.
    ptr: NonNull<u8>,
    pool: NonNull<PoolShared>,
    idx: u32,
    len: u32,
}

// SAFETY: the buffer exclusively owns its bytes (see INVARIANT) and its pool
// is reference-counted `Send + Sync` state; returning it from another thread goes
// through that thread's own cache or the lock-free shared queue.
unsafe impl Send for DmaBuf {}
// SAFETY: `&DmaBuf` only allows reading the bytes it exclusively owns.
unsafe impl Sync for DmaBuf {}

impl DmaBuf {
    /// Slot `idx` of `pool`. Only the pool and its caches call this, with an
    /// index they just took off a free list (which holds the slot's
    /// reference to the pool, handed to the buffer).
    #[inline]
    pub(super) fn from_pool(pool: NonNull<PoolShared>, idx: u32) -> DmaBuf {
        // SAFETY: the slot's reference keeps the pool alive.
        let p = unsafe { pool.as_ref() };
        let ptr = p.slot_ptr(idx);
        // Pools refuse buffer sizes over `u32::MAX`.
        let len = p.buf_size() as u32;
        DmaBuf {
            ptr,
            pool,
            idx,
            len,
        }
    }

    /// A standalone buffer of `len` bytes in an arena of its own (ordinary
    /// pages, registered like any arena), 4 KiB aligned. For tests, apps and
    /// the control path: each call creates a memfd and a mapping.
    ///
    /// # Errors
    /// As [`DmaArena::new`].
    pub fn alloc(len: usize) -> MemResult<DmaBuf> {
        if len == 0 {
            return Err(MemError::InvalidArgument("buffer length is zero"));
        }
        let len32 = u32::try_from(len)
            .map_err(|_| MemError::InvalidArgument("buffer length exceeds u32::MAX"))?;
        let arena = DmaArena::new(
            len,
            ArenaOptions::named("pollux-standalone").hugepages(HugepageMode::Never),
        )?;
        let ptr =
            NonNull::new(arena.base()).ok_or(MemError::InvalidArgument("arena base is null"))?;
        Ok(DmaBuf {
            ptr,
            pool: PoolShared::standalone(arena, len).into_slot_ref(),
            idx: 0,
            len: len32,
        })
    }

    /// The pool this buffer's slot belongs to.
    #[inline]
    fn pool(&self) -> &PoolShared {
        // SAFETY: the slot's reference keeps the pool alive (INVARIANT).
        unsafe { self.pool.as_ref() }
    }

    /// The first `len()` bytes.
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` is mapped, initialized (mmap zero-fills and
        // only bytes are ever written) and exclusively ours (INVARIANT).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len as usize) }
    }

    /// The first `len()` bytes, mutably.
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len as usize) }
    }

    /// Pointer to the first byte (for iovecs and work requests).
    #[inline]
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Mutable pointer to the first byte (for iovecs and work requests).
    #[inline]
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Address of the first byte.
    #[inline]
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// Length in use (initially the capacity).
    #[inline]
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether `len() == 0`.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes available in the buffer.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.pool().buf_size()
    }

    /// Set the length in use.
    ///
    /// # Errors
    /// [`MemError::InvalidArgument`] when `len > capacity()`; the length is
    /// unchanged then.
    pub fn set_len(&mut self, len: usize) -> MemResult<()> {
        if len > self.capacity() {
            return Err(MemError::InvalidArgument("buffer length exceeds capacity"));
        }
        // `capacity() <= u32::MAX` (pools and `alloc` refuse larger buffers).
        self.len = len as u32;
        Ok(())
    }

    /// The arena the buffer lives in.
    #[inline]
    pub fn arena(&self) -> &Arc<DmaArena> {
        self.pool().arena_of(self.idx).0
    }

    /// Id of the arena the buffer lives in.
    #[inline]
    pub fn arena_id(&self) -> ArenaId {
        self.arena().id()
    }

    /// Offset of the first byte from the arena's base.
    pub fn arena_offset(&self) -> usize {
        self.pool().arena_of(self.idx).1
    }
}

impl fmt::Debug for DmaBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaBuf")
            .field("arena", &self.arena_id())
            .field("offset", &self.arena_offset())
            .field("len", &self.len)
            .field("cap", &self.capacity())
            .finish()
    }
}

impl Drop for DmaBuf {
    #[inline]
    fn drop(&mut self) {
        if self.pool().is_standalone() {
            // SAFETY: the buffer's one reference, not used again.
            unsafe { pool::release(self.pool, 1) };
        } else {
            // SAFETY: the slot's reference is handed on with the slot.
            unsafe { cache::return_slot(self.pool, self.idx) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standalone_buffer_is_usable_and_aligned() {
        let mut b = DmaBuf::alloc(10_000).unwrap();
        assert_eq!(b.len(), 10_000);
        assert_eq!(b.capacity(), 10_000);
        assert_eq!(b.addr() % 4096, 0);
        assert_eq!(b.arena_offset(), 0);
        b.as_mut_slice().fill(0x11);
        assert!(b.as_slice().iter().all(|&x| x == 0x11));
        assert!(b.set_len(10_001).is_err());
        assert_eq!(b.len(), 10_000);
        b.set_len(10).unwrap();
        assert_eq!(b.as_slice().len(), 10);
        // The registry knows where it lives.
        let (a, off) = crate::mem::ArenaRegistry::global()
            .lookup(b.addr(), 10)
            .unwrap();
        assert_eq!(a.id(), b.arena_id());
        assert_eq!(off, 0);
    }

    #[test]
    fn buffers_are_small() {
        assert_eq!(std::mem::size_of::<DmaBuf>(), 24);
    }

    #[test]
    fn buffers_are_send() {
        fn is_send<T: Send + Sync>() {}
        is_send::<DmaBuf>();
        let mut b = DmaBuf::alloc(64).unwrap();
        b.as_mut_slice()[0] = 9;
        let b = std::thread::spawn(move || b).join().unwrap();
        assert_eq!(b.as_slice()[0], 9);
    }
}
