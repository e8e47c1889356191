//! [`RareCheck`]: when a poller runs a check that is expensive and rarely
//! finds anything (a listener's `accept`, a system call that mostly fails).

use crate::Reactor;

/// Paces a rarely fruitful check: due on every call while the reactor's
/// last loop was idle (nobody on the core waits for it), on the call after
/// one that found something (a burst is taken at once), and otherwise once
/// in `period` calls, the first call included.
#[derive(Debug, Clone)]
pub struct RareCheck {
    period: u64,
    calls: u64,
    again: bool,
}

impl RareCheck {
    /// A check due once in `period` calls on a busy reactor (at least 1).
    pub fn new(period: u64) -> Self {
        Self {
            period: period.max(1),
            calls: 0,
            again: false,
        }
    }

    /// Count one call; whether the check is due on it.
    #[inline]
    pub fn due(&mut self, reactor: &Reactor) -> bool {
        self.calls += 1;
        self.again || !reactor.last_loop_busy() || (self.calls - 1) % self.period == 0
    }

    /// Report what the check that was due found: `true` makes it due again
    /// on the next call.
    #[inline]
    pub fn found(&mut self, something: bool) {
        self.again = something;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PollStatus, TestCluster};

    #[test]
    fn due_every_call_when_idle_once_per_period_when_busy_and_after_a_find() {
        let c = TestCluster::new(1);
        let r = c.reactor(0);
        let mut rc = RareCheck::new(4);
        r.poll_once();
        assert!((0..5).all(|_| rc.due(&r)), "an idle reactor: every call");
        r.add_poller("busy", || PollStatus::Busy);
        r.poll_once();
        let mut rc = RareCheck::new(4);
        let due: Vec<bool> = (0..8).map(|_| rc.due(&r)).collect();
        assert_eq!(due, [true, false, false, false, true, false, false, false]);
        rc.found(true);
        assert!(rc.due(&r), "due again after a find");
        rc.found(false);
        assert!(!rc.due(&r));
    }
}
