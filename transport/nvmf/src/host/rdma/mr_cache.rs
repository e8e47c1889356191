//! Registrations of data arenas: one MR per arena, made on first use (or
//! up front with [`MrCache::register`]) and looked up per I/O by arena id
//! (a short linear scan, no allocation once every arena is known).
//!
//! In `register-always` mode the arenas are registered for local access
//! only and each I/O's buffer is exposed by a fast registration (`RegMr`)
//! whose page list carries these MRs' lkeys. On a device that fast-registers
//! by type-2 memory window (`FastRegMode::MemoryWindow`: the ibverbs
//! provider) the provider gives these MRs the window-bind right itself, so
//! the same access serves both providers; a window covers one contiguous
//! range of one MR, which a buffer of one arena is.
//!
//! An arena nobody else holds any more (a one-off control buffer of a
//! Connect or an Identify, a pool that was dropped) is deregistered and let
//! go at the next registration, so a host that reconnects for hours keeps
//! only the arenas still in use.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use pollux_reactor::mem::{ArenaId, DmaArena, DmaBuf};
use pollux_verbs::{Access, MemoryRegion, ProtectionDomain, Provider};

use super::super::HostError;

/// An arena, its MR, and how many of the arena's references the cache and
/// the registration itself hold (the arena is unused elsewhere when its
/// count is down to that).
type Entry<P> = (ArenaId, Arc<DmaArena>, <P as Provider>::Mr, usize);

/// The MRs of data arenas for one PD.
pub struct MrCache<P: Provider> {
    pd: Rc<P::Pd>,
    access: Access,
    mrs: RefCell<Vec<Entry<P>>>,
    /// The arena of the last lookup and its `(lkey, rkey)`: an I/O's
    /// buffers mostly come from one pool arena, so the scan is skipped.
    last: Cell<Option<(ArenaId, u32, u32)>>,
}

impl<P: Provider> MrCache<P> {
    pub(crate) fn new(pd: Rc<P::Pd>, access: Access) -> Self {
        MrCache {
            pd,
            access,
            mrs: RefCell::new(Vec::new()),
            last: Cell::new(None),
        }
    }

    /// Register `arena` (control path; a no-op when it is known).
    ///
    /// # Errors
    /// [`HostError::Transport`] when the provider refuses.
    pub fn register(&self, arena: &Arc<DmaArena>) -> Result<(), HostError> {
        if self.mrs.borrow().iter().any(|(id, ..)| *id == arena.id()) {
            return Ok(());
        }
        self.release_unused();
        let before = Arc::strong_count(arena);
        let mr = self
            .pd
            .reg_mr(arena, 0, arena.len(), self.access)
            .map_err(|e| HostError::Transport(format!("register arena {}: {e}", arena.name())))?;
        let held = Arc::clone(arena);
        let own = Arc::strong_count(arena).saturating_sub(before);
        self.mrs.borrow_mut().push((arena.id(), held, mr, own));
        Ok(())
    }

    /// Deregister the arenas only the cache and their MR still hold
    /// (control path).
    pub fn release_unused(&self) {
        let mut mrs = self.mrs.borrow_mut();
        let n = mrs.len();
        mrs.retain(|(_, a, _, own)| Arc::strong_count(a) > *own);
        if mrs.len() != n {
            self.last.set(None);
        }
    }

    /// `(lkey, rkey)` of the MR that covers `buf` (registering its arena if
    /// it is new).
    ///
    /// # Errors
    /// As [`MrCache::register`].
    #[inline]
    pub fn keys(&self, buf: &DmaBuf) -> Result<(u32, u32), HostError> {
        if let Some((a, l, r)) = self.last.get() {
            if a == buf.arena_id() {
                return Ok((l, r));
            }
        }
        self.keys_slow(buf)
    }

    /// [`keys`](Self::keys) for another arena than the last one.
    #[cold]
    #[inline(never)]
    fn keys_slow(&self, buf: &DmaBuf) -> Result<(u32, u32), HostError> {
        let id = buf.arena_id();
        if let Some((_, _, mr, _)) = self.mrs.borrow().iter().find(|(a, ..)| *a == id) {
            let keys = (mr.lkey(), mr.rkey());
            self.last.set(Some((id, keys.0, keys.1)));
            return Ok(keys);
        }
        self.register(buf.arena())?;
        self.mrs
            .borrow()
            .iter()
            .find(|(a, ..)| *a == id)
            .map(|(_, _, mr, _)| (mr.lkey(), mr.rkey()))
            .ok_or_else(|| HostError::Transport("registration vanished".into()))
    }

    /// Registered arenas.
    pub fn len(&self) -> usize {
        self.mrs.borrow().len()
    }

    /// Whether none is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
