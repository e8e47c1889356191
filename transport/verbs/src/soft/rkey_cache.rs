//! A connected QP's cache of the peer's remote keys it resolved last.
//!
//! Resolving an rkey in the peer's MR table ([`resolve`](super::mr::resolve))
//! reads a dozen words of shared memory and walks the segments, once per
//! RDMA WRITE or READ. A target answering reads from one host buffer pool
//! names the same regular MR in every WR, so the link keeps what the last
//! two such keys resolved to and, per WR, only checks that the entry still
//! holds the key at the same change count ([`E_SEQ`](super::mr::E_SEQ)):
//! two loads of one cache line. Any write or invalidation of the entry
//! bumps that count, so a key that was deregistered (or freed and
//! registered again with the same value) misses and takes the full path,
//! which fails the WR with `REM_ACCESS_ERR` as before. Bounds and rights
//! are checked against the cached values on every use.
//!
//! Only regular MRs of one segment are cached (fast-reg keys change per
//! I/O by design). An entry holds its arena, so its mapping outlives any
//! change on the peer's side until the peer announces the arena's end
//! ([`RemoteKeyCache::forget_slot`]); what a hostile peer can do is what it could
//! do without the cache: make accesses fail or land in its own memory.

use std::cell::RefCell;
use std::sync::Arc;

use pollux_reactor::mem::DmaArena;

use super::arena_slots::{slot_arena, SlotArena};
use super::mr::{entry_unchanged, snapshot_regular, EntrySnapshot};
use super::shm::{arena_span, Shm, Span};
use crate::types::{Access, RemoteAddr};

/// One cached key: the entry as it was at change count `snap.seq`.
#[derive(Debug)]
struct CachedKey {
    key: u32,
    snap: EntrySnapshot,
    arena: Arc<DmaArena>,
}

impl CachedKey {
    /// The memory of `[addr, addr+len)` if in bounds and `need` is granted.
    #[inline(always)]
    fn span(&self, addr: u64, len: u64, need: Access) -> Option<Span> {
        let s = &self.snap;
        let start = addr.checked_sub(s.lo)?;
        if !s.access.contains(need) || start.checked_add(len)? > s.len {
            return None;
        }
        arena_span(&self.arena, s.off.checked_add(start)?, len)
    }
}

/// The last two remote keys of one link that resolved to a regular MR.
#[derive(Debug, Default)]
pub(crate) struct RemoteKeyCache {
    keys: RefCell<[Option<CachedKey>; 2]>,
}

impl RemoteKeyCache {
    /// The memory behind `ra` for `len > 0` bytes with rights `need` when
    /// its key is cached and its entry unchanged in the peer's table `t`;
    /// `None` sends the caller down the full path (which reports errors).
    #[inline]
    pub(crate) fn span(&self, t: &Shm, ra: RemoteAddr, len: u64, need: Access) -> Option<Span> {
        if len == 0 {
            return None;
        }
        let keys = self.keys.borrow();
        let c = match &*keys {
            [Some(c), _] if c.key == ra.rkey => c,
            [_, Some(c)] if c.key == ra.rkey => c,
            _ => return None,
        };
        if !entry_unchanged(t, c.snap.entry, c.key, c.snap.seq) {
            return None;
        }
        c.span(ra.addr, len, need)
    }

    /// After the full path resolved `key`: remember it if it is a regular
    /// one-segment MR whose arena is mapped (`arenas`, by slot). A key
    /// already cached is refreshed in place (its entry changed).
    pub(crate) fn learn(&self, t: &Shm, tag: u8, key: u32, arenas: &[Option<SlotArena>]) {
        let Some(snap) = snapshot_regular(t, tag, key) else {
            return;
        };
        let Some(arena) = slot_arena(arenas, snap.slot).cloned() else {
            return;
        };
        if arena_span(&arena, snap.off, snap.len).is_none() {
            return;
        }
        let mut keys = self.keys.borrow_mut();
        let new = Some(CachedKey { key, snap, arena });
        match keys
            .iter()
            .position(|c| c.as_ref().is_some_and(|c| c.key == key))
        {
            Some(i) => keys[i] = new,
            None => {
                keys[1] = keys[0].take();
                keys[0] = new;
            }
        }
    }

    /// Forget the keys whose memory is in the peer's arena slot `slot` (the
    /// full id): the peer let go of that arena, and a cached key would keep
    /// its mapping (and descriptor) alive.
    pub(crate) fn forget_slot(&self, slot: u64) {
        for c in self.keys.borrow_mut().iter_mut() {
            if c.as_ref().is_some_and(|k| k.snap.slot == slot) {
                *c = None;
            }
        }
    }

    /// Keys cached (tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.keys.borrow().iter().flatten().count()
    }
}
