//! The timed-poller heap: a binary heap keyed by next deadline, so a loop
//! looks only at the earliest deadline, never at every timed poller.
//!
//! Removal is lazy: a removed poller's entry stays until it reaches the top
//! (the reactor checks the id against the poller table); the heap is
//! compacted when stale entries outnumber live ones.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

use crate::poller::PollerId;

/// One scheduled run: `(deadline, seq)` orders it; `seq` keeps equal
/// deadlines in scheduling order, so runs are deterministic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct TimerEntry {
    pub(crate) deadline: Instant,
    seq: u64,
    key: u32,
    gen: u32,
}

impl TimerEntry {
    pub(crate) fn id(&self) -> PollerId {
        PollerId {
            key: self.key,
            gen: self.gen,
        }
    }
}

/// Earliest deadline first.
#[derive(Default)]
pub(crate) struct TimerHeap {
    heap: BinaryHeap<Reverse<TimerEntry>>,
    seq: u64,
    stale: usize,
}

impl TimerHeap {
    pub(crate) fn schedule(&mut self, id: PollerId, deadline: Instant) {
        self.seq += 1;
        self.heap.push(Reverse(TimerEntry {
            deadline,
            seq: self.seq,
            key: id.key,
            gen: id.gen,
        }));
    }

    /// The earliest deadline, live or stale.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.heap.peek().map(|e| e.0.deadline)
    }

    /// Pops the earliest entry if it is due at `now`.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<TimerEntry> {
        match self.heap.peek() {
            Some(e) if e.0.deadline <= now => self.heap.pop().map(|e| e.0),
            _ => None,
        }
    }

    /// Notes that one entry became stale (its poller was removed), and
    /// compacts the heap with `is_live` when stale entries dominate.
    pub(crate) fn note_stale(&mut self, is_live: impl Fn(PollerId) -> bool) {
        self.stale += 1;
        if self.stale > 32 && self.stale * 2 > self.heap.len() {
            self.heap.retain(|e| is_live(e.0.id()));
            self.stale = 0;
        }
    }

    /// Notes that a stale entry was popped and dropped.
    pub(crate) fn stale_popped(&mut self) {
        self.stale = self.stale.saturating_sub(1);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }

    pub(crate) fn clear(&mut self) {
        self.heap.clear();
        self.stale = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn id(key: u32) -> PollerId {
        PollerId { key, gen: 1 }
    }

    #[test]
    fn pops_in_deadline_then_schedule_order() {
        let t0 = Instant::now();
        let mut h = TimerHeap::default();
        h.schedule(id(1), t0 + Duration::from_millis(5));
        h.schedule(id(2), t0 + Duration::from_millis(1));
        h.schedule(id(3), t0 + Duration::from_millis(5));
        h.schedule(id(4), t0 + Duration::from_millis(9));
        assert_eq!(h.next_deadline(), Some(t0 + Duration::from_millis(1)));
        let now = t0 + Duration::from_millis(5);
        let mut order = Vec::new();
        while let Some(e) = h.pop_due(now) {
            order.push(e.id().key);
        }
        assert_eq!(order, [2, 1, 3]);
        assert_eq!(h.len(), 1);
        assert!(h.pop_due(now).is_none());
    }

    #[test]
    fn compacts_when_stale_entries_dominate() {
        let t0 = Instant::now();
        let mut h = TimerHeap::default();
        for k in 0..40 {
            h.schedule(id(k), t0);
        }
        // Entries 0..34 are removed; only 34..40 stay live.
        for _ in 0..34 {
            h.note_stale(|i| i.key >= 34);
        }
        assert_eq!(h.len(), 6);
    }
}
