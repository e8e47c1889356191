//! The hybrid idle policy's estimate ([`IdleMode::Hybrid`](crate::IdleMode::Hybrid)):
//! how long this reactor's idle stretches last, and how much of the current
//! one to sleep through.
//!
//! Linux's hybrid block polling sleeps for half the mean completion time,
//! then polls. A reactor does the same with the time between its busy
//! loops: right after its work it sleeps for what is left of half the
//! moving average of its recent stretches (from one busy loop to the next),
//! then polls until work comes. When work comes at a steady pace (one I/O
//! outstanding, a host that takes about the same time for each), the reactor
//! is polling again before it arrives: nothing wakes it on the request's
//! path, and it sleeps through half of its idle time instead of spinning.
//! Work that comes early wakes it as in the adaptive mode (a message, a
//! registered file descriptor), and that wake-up is on the work's path: so
//! the share of the average it sleeps adapts, as TCP's window does (AIMD):
//! halved after a sleep that work cut short, grown by 1/16 after one that
//! ran its course, between 1/16 and 1/2. Where the time between pieces of
//! work varies, the reactor sleeps less and polls more.

/// The shortest sleep worth the system calls around it (5 us).
pub(crate) const MIN_SLEEP_NS: u64 = 5_000;

/// The largest share of the average slept, in sixteenths (1/2).
const MAX_SHARE: u64 = 8;

/// The moving average of the stretches, the share of it to sleep, and
/// whether the current stretch has had its sleep. Kept in a `Cell` on the
/// reactor (`Copy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HybridEstimate {
    /// The stretches' moving average in ns (each new one weighs 1/8; 0
    /// before the first).
    avg_ns: u64,
    /// The share of the average slept, in sixteenths (1 to [`MAX_SHARE`]).
    share: u64,
    /// The current stretch has slept once: it polls until work comes (or
    /// until the adaptive limit).
    slept: bool,
}

impl Default for HybridEstimate {
    fn default() -> Self {
        Self {
            avg_ns: 0,
            share: MAX_SHARE,
            slept: false,
        }
    }
}

impl HybridEstimate {
    /// A busy loop ended a stretch of `stretch_ns` that had idle loops in
    /// it: from the previous busy loop's start to this one's. The caller
    /// caps it (at the policy's `sleep_after`), so that one long pause does
    /// not stretch the sleeps of the busy period after it.
    pub(crate) fn stretch_ended(&mut self, stretch_ns: u64) {
        self.avg_ns = if self.avg_ns == 0 {
            stretch_ns
        } else {
            self.avg_ns - self.avg_ns / 8 + stretch_ns / 8
        };
        self.slept = false;
    }

    /// A busy loop right after another (no idle time between them).
    pub(crate) fn busy_again(&mut self) {
        self.slept = false;
    }

    /// How long to sleep now, `idle_ns` after the stretch's busy loop
    /// started: what is left of the share of the average, once per stretch
    /// and only if at least [`MIN_SLEEP_NS`]; `None` to poll on.
    pub(crate) fn sleep_now(&mut self, idle_ns: u64) -> Option<u64> {
        if self.slept {
            return None;
        }
        let left = (self.avg_ns / 16 * self.share).checked_sub(idle_ns)?;
        if left < MIN_SLEEP_NS {
            return None;
        }
        self.slept = true;
        Some(left)
    }

    /// A sleep from [`sleep_now`](Self::sleep_now) ended: cut short by
    /// work (`early`: halve the share) or after its time (grow it by 1/16).
    pub(crate) fn nap_ended(&mut self, early: bool) {
        self.share = if early {
            (self.share / 2).max(1)
        } else {
            (self.share + 1).min(MAX_SHARE)
        };
    }

    /// The moving average of the stretches, in ns.
    pub(crate) fn average_ns(&self) -> u64 {
        self.avg_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steady_pace_sleeps_half_of_each_stretch_once() {
        let mut h = HybridEstimate::default();
        assert_eq!(h.sleep_now(0), None, "nothing known yet");
        h.stretch_ended(1_000_000);
        assert_eq!(h.average_ns(), 1_000_000);
        // 20 us after the busy loop started: 480 us left of the half.
        assert_eq!(h.sleep_now(20_000), Some(480_000));
        assert_eq!(h.sleep_now(500_000), None, "one sleep per stretch");
        h.stretch_ended(1_000_000);
        assert_eq!(h.sleep_now(10_000), Some(490_000));
    }

    #[test]
    fn work_that_cuts_sleeps_short_shrinks_them() {
        let mut h = HybridEstimate::default();
        h.stretch_ended(1_600_000);
        assert_eq!(h.sleep_now(0), Some(800_000));
        h.nap_ended(true);
        h.stretch_ended(1_600_000);
        assert_eq!(
            h.sleep_now(0),
            Some(400_000),
            "a quarter after one early wake"
        );
        for _ in 0..4 {
            h.nap_ended(true);
        }
        h.stretch_ended(1_600_000);
        assert_eq!(h.sleep_now(0), Some(100_000), "never below a sixteenth");
        // Sleeps that run their course grow it back, one sixteenth each, to a half.
        for _ in 0..3 {
            h.nap_ended(false);
        }
        h.stretch_ended(1_600_000);
        assert_eq!(h.sleep_now(0), Some(400_000));
        for _ in 0..20 {
            h.nap_ended(false);
        }
        h.stretch_ended(1_600_000);
        assert_eq!(h.sleep_now(0), Some(800_000));
    }

    #[test]
    fn short_stretches_poll() {
        let mut h = HybridEstimate::default();
        h.stretch_ended(8_000);
        assert_eq!(h.sleep_now(0), None, "4 us is below the shortest sleep");
        h.stretch_ended(1_000_000);
        // 8000 - 1000 + 125000 = 132000: half is 66 us.
        assert_eq!(h.average_ns(), 132_000);
        assert_eq!(h.sleep_now(70_000), None, "past the half already");
        assert_eq!(h.sleep_now(6_000), Some(60_000));
    }

    #[test]
    fn the_average_follows_a_new_pace() {
        let mut h = HybridEstimate::default();
        h.stretch_ended(1_000_000);
        for _ in 0..64 {
            h.stretch_ended(100_000);
        }
        let avg = h.average_ns();
        assert!((100_000..110_000).contains(&avg), "{avg}");
        // A busy loop right after another re-arms the sleep without
        // changing the average.
        assert!(h.sleep_now(0).is_some());
        h.busy_again();
        assert_eq!(h.average_ns(), avg);
        assert!(h.sleep_now(0).is_some());
    }
}
