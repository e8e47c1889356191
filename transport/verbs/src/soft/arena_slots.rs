//! Arena slots: the numbers MR table entries use to name the arena their
//! memory is in, on the owner's side (the device's registered arenas) and
//! on a peer's side (the arenas it mapped from the owner's fds).
//!
//! A slot id is `generation << 32 | index`. The index is reused once the
//! last MR over an arena is gone (so a long-running process keeps as many
//! slots as it has registered arenas, not as many as it ever had); the
//! generation changes on every reuse, so a peer that still holds the old
//! mapping of an index (its `ArenaGone` message not read yet) never copies
//! through it for a key naming the new arena: the ids differ, the lookup
//! misses, and the peer reads its socket for the new arena first.

use std::sync::Arc;

use pollux_reactor::mem::DmaArena;

/// An arena in a slot, under its full slot id.
#[derive(Clone)]
pub(crate) struct SlotArena {
    /// `generation << 32 | index`.
    pub(crate) id: u64,
    /// The arena (owner: the registered one; peer: its mapping).
    pub(crate) arena: Arc<DmaArena>,
}

/// The index part of a slot id.
pub(crate) fn slot_index(id: u64) -> usize {
    (id & 0xffff_ffff) as usize
}

/// The slot id of `index` at `generation`.
pub(crate) fn slot_id(index: usize, generation: u32) -> u64 {
    (u64::from(generation) << 32) | (index as u64 & 0xffff_ffff)
}

/// The arena of slot `id` in `slots`, if that slot holds exactly that id.
#[inline]
pub(crate) fn slot_arena(slots: &[Option<SlotArena>], id: u64) -> Option<&Arc<DmaArena>> {
    slots
        .get(slot_index(id))?
        .as_ref()
        .filter(|s| s.id == id)
        .map(|s| &s.arena)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pollux_reactor::mem::ArenaOptions;

    #[test]
    fn a_reused_index_never_matches_the_old_id() {
        let a = DmaArena::new(4096, ArenaOptions::named("t-slot")).expect("arena");
        let old = slot_id(3, 0);
        let new = slot_id(3, 1);
        assert_eq!(slot_index(new), 3);
        let mut v: Vec<Option<SlotArena>> = vec![None; 4];
        v[3] = Some(SlotArena { id: new, arena: a });
        assert!(slot_arena(&v, new).is_some());
        assert!(slot_arena(&v, old).is_none());
        assert!(slot_arena(&v, slot_id(9, 1)).is_none());
    }
}
