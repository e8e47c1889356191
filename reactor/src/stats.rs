//! Per-reactor and per-poller statistics (SPDK's busy/idle ticks and poller
//! run counts). Collecting them allocates: control path.

use std::borrow::Cow;
use std::time::Duration;

use crate::cores::CoreId;
use crate::poller::PollerId;

/// A snapshot of one poller's counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PollerStats {
    /// The poller's id on its reactor.
    pub id: PollerId,
    /// The name it was added with.
    pub name: Cow<'static, str>,
    /// `Some(period)` for a timed poller.
    pub period: Option<Duration>,
    /// How many times it ran.
    pub runs: u64,
    /// How many of those runs returned [`PollStatus::Busy`](crate::PollStatus::Busy).
    pub busy_runs: u64,
    /// Time attributed to its busy runs, in nanoseconds. The clock is read
    /// only after a busy run, so this also includes the idle pollers that
    /// ran just before it in the same loop (cheap, slightly pessimistic).
    pub busy_ns: u64,
}

/// A snapshot of one reactor's counters.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReactorStats {
    /// The reactor's core.
    pub core: CoreId,
    /// Loops run ([`Reactor::poll_once`](crate::Reactor::poll_once) calls).
    pub loops: u64,
    /// Loops in which a message or a poller did work.
    pub busy_loops: u64,
    /// Time spent in busy loops, in nanoseconds.
    pub busy_ns: u64,
    /// Time spent in idle loops and asleep, in nanoseconds.
    pub idle_ns: u64,
    /// Messages handled.
    pub messages: u64,
    /// Times the reactor slept (adaptive and hybrid idle modes).
    pub sleeps: u64,
    /// The hybrid idle mode's moving average of the time from one busy
    /// loop to the next, in nanoseconds (0 in the other modes).
    pub idle_stretch_ns: u64,
    /// Every live poller, in slot order.
    pub pollers: Vec<PollerStats>,
}

impl ReactorStats {
    /// Busy time as a percentage of busy + idle time (0 before any loop).
    pub fn busy_pct(&self) -> f64 {
        let total = self.busy_ns.saturating_add(self.idle_ns);
        if total == 0 {
            0.0
        } else {
            self.busy_ns as f64 * 100.0 / total as f64
        }
    }

    /// The first poller with this name.
    pub fn poller(&self, name: &str) -> Option<&PollerStats> {
        self.pollers.iter().find(|p| p.name == name)
    }
}

/// The reactor's running counters (reactor-local, `Cell`s in the reactor).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Counters {
    pub(crate) loops: u64,
    pub(crate) busy_loops: u64,
    pub(crate) busy_ns: u64,
    pub(crate) idle_ns: u64,
    pub(crate) messages: u64,
    pub(crate) sleeps: u64,
}

/// Nanoseconds in `d`, saturating.
pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_pct_is_a_ratio() {
        let mut s = ReactorStats::default();
        assert_eq!(s.busy_pct(), 0.0);
        s.busy_ns = 1;
        s.idle_ns = 3;
        assert!((s.busy_pct() - 25.0).abs() < 1e-9);
        s.idle_ns = 0;
        assert!((s.busy_pct() - 100.0).abs() < 1e-9);
    }

    #[test]
    fn nanos_saturates() {
        assert_eq!(nanos(Duration::from_micros(2)), 2000);
        assert_eq!(nanos(Duration::MAX), u64::MAX);
    }
}
