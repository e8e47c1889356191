//! Counters each poll group bumps and any thread reads: every group's on a
//! cache line of its own, written by that group alone (a load and a store,
//! no atomic read-modify-write), summed when read.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pollux_reactor::sync::Mutex;

/// One group's counter, alone on its cache lines.
#[repr(align(128))]
#[derive(Debug, Default)]
pub(super) struct GroupCounter(AtomicU64);

impl GroupCounter {
    /// Count one (by the owning group only: the one writer).
    #[inline]
    pub(super) fn bump(&self) {
        self.0
            .store(self.0.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
}

/// Every group's counter of one kind.
#[derive(Debug, Default)]
pub(super) struct GroupCounters(Mutex<Vec<Arc<GroupCounter>>>);

impl GroupCounters {
    /// A counter for a new group (control path).
    pub(super) fn add(&self) -> Arc<GroupCounter> {
        let c = Arc::new(GroupCounter::default());
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Arc::clone(&c));
        c
    }

    /// The sum over every group's counter, groups gone included.
    pub(super) fn sum(&self) -> u64 {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|c| c.0.load(Ordering::Relaxed))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_group_counts_on_its_own_line_and_the_sum_keeps_gone_groups() {
        let all = GroupCounters::default();
        let (a, b) = (all.add(), all.add());
        assert!(std::mem::align_of::<GroupCounter>() >= 128);
        let (pa, pb) = (Arc::as_ptr(&a) as usize, Arc::as_ptr(&b) as usize);
        assert!(pa.abs_diff(pb) >= 128, "two groups' counters share a line");
        for _ in 0..3 {
            a.bump();
        }
        b.bump();
        drop(a);
        assert_eq!(all.sum(), 4);
    }
}
