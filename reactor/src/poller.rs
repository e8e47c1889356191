//! Pollers: named functions a reactor calls every loop (active pollers) or
//! every period (timed pollers), and the table that holds them.
//!
//! The table never calls user code. The reactor takes a poller's closure out
//! of its slot, releases every borrow, calls it and puts it back, so a poller
//! may add or remove any poller, itself included.

use std::borrow::Cow;
use std::time::Duration;

use slab::Slab;

/// What a poller (or a whole reactor loop) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PollStatus {
    /// Nothing to do: no completion reaped, no message handled.
    #[default]
    Idle,
    /// Did some work; the loop counts as busy.
    Busy,
}

impl PollStatus {
    /// `Busy` if `did_work`, else `Idle`.
    pub fn from_work(did_work: bool) -> Self {
        if did_work {
            Self::Busy
        } else {
            Self::Idle
        }
    }

    /// Whether this is [`PollStatus::Busy`].
    pub fn is_busy(self) -> bool {
        self == Self::Busy
    }

    /// `Busy` if either is busy.
    #[must_use]
    pub fn or(self, other: Self) -> Self {
        Self::from_work(self.is_busy() || other.is_busy())
    }
}

/// Names a poller on its reactor. It carries a generation, so the id of a
/// removed poller never reaches a newer poller that reuses the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PollerId {
    pub(crate) key: u32,
    pub(crate) gen: u32,
}

impl PollerId {
    /// The slot index (for logs).
    pub fn index(self) -> u32 {
        self.key
    }
}

/// A poller's closure.
pub(crate) type PollFn = Box<dyn FnMut() -> PollStatus + 'static>;

/// One poller's slot.
pub(crate) struct PollerSlot {
    pub(crate) gen: u32,
    pub(crate) name: Cow<'static, str>,
    /// `None` for an active poller.
    pub(crate) period: Option<Duration>,
    /// `None` while the closure runs (taken out of the slot).
    pub(crate) f: Option<PollFn>,
    /// Removal asked; the slot goes at the end of the loop.
    pub(crate) removed: bool,
    pub(crate) runs: u64,
    pub(crate) busy_runs: u64,
    pub(crate) busy_ns: u64,
}

/// All pollers of one reactor, plus the order active pollers run in.
#[derive(Default)]
pub(crate) struct PollerTable {
    pub(crate) slots: Slab<PollerSlot>,
    /// Active (untimed) pollers in the order they were added.
    pub(crate) active: Vec<u32>,
    next_gen: u32,
}

impl PollerTable {
    pub(crate) fn insert(
        &mut self,
        name: Cow<'static, str>,
        period: Option<Duration>,
        f: PollFn,
    ) -> PollerId {
        self.next_gen = self.next_gen.wrapping_add(1);
        let gen = self.next_gen;
        let key = self.slots.insert(PollerSlot {
            gen,
            name,
            period,
            f: Some(f),
            removed: false,
            runs: 0,
            busy_runs: 0,
            busy_ns: 0,
        }) as u32;
        if period.is_none() {
            self.active.push(key);
        }
        PollerId { key, gen }
    }

    /// The live (not removed) slot `id` names.
    pub(crate) fn live(&self, id: PollerId) -> Option<&PollerSlot> {
        self.slots
            .get(id.key as usize)
            .filter(|s| s.gen == id.gen && !s.removed)
    }

    /// The live slot `id` names, mutably.
    pub(crate) fn live_mut(&mut self, id: PollerId) -> Option<&mut PollerSlot> {
        self.slots
            .get_mut(id.key as usize)
            .filter(|s| s.gen == id.gen && !s.removed)
    }

    /// The id of the slot at `key` (for the active list).
    pub(crate) fn id_at(&self, key: u32) -> Option<PollerId> {
        self.slots
            .get(key as usize)
            .map(|s| PollerId { key, gen: s.gen })
    }

    /// Takes the slot out of the table (the caller drops it with no borrow
    /// held, since dropping a closure may call back into the reactor).
    pub(crate) fn take_slot(&mut self, id: PollerId) -> Option<PollerSlot> {
        match self.slots.get(id.key as usize) {
            Some(s) if s.gen == id.gen => {}
            _ => return None,
        }
        let slot = self.slots.remove(id.key as usize);
        if slot.period.is_none() {
            self.active.retain(|&k| k != id.key);
        }
        Some(slot)
    }

    /// Any one slot (for teardown).
    pub(crate) fn any_id(&self) -> Option<PollerId> {
        self.slots.iter().next().map(|(k, s)| PollerId {
            key: k as u32,
            gen: s.gen,
        })
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_combines() {
        assert!(PollStatus::Idle.or(PollStatus::Busy).is_busy());
        assert!(!PollStatus::Idle.or(PollStatus::Idle).is_busy());
        assert_eq!(PollStatus::from_work(true), PollStatus::Busy);
        assert_eq!(PollStatus::default(), PollStatus::Idle);
    }

    #[test]
    fn stale_ids_never_reach_a_new_poller() {
        let mut t = PollerTable::default();
        let a = t.insert("a".into(), None, Box::new(|| PollStatus::Idle));
        assert!(t.live(a).is_some());
        assert!(t.take_slot(a).is_some());
        let b = t.insert("b".into(), None, Box::new(|| PollStatus::Idle));
        assert_eq!(a.key, b.key, "slab reuses the slot");
        assert!(t.live(a).is_none());
        assert!(t.take_slot(a).is_none());
        assert_eq!(t.live(b).map(|s| s.name.as_ref()), Some("b"));
        assert_eq!(t.active, vec![b.key]);
    }

    #[test]
    fn timed_pollers_stay_off_the_active_list() {
        let mut t = PollerTable::default();
        let a = t.insert(
            "a".into(),
            Some(Duration::from_millis(1)),
            Box::new(|| PollStatus::Idle),
        );
        assert!(t.active.is_empty());
        assert_eq!(t.len(), 1);
        assert_eq!(t.any_id(), Some(a));
        assert!(t.take_slot(a).is_some());
        assert_eq!(t.any_id(), None);
    }
}
