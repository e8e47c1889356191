//! The reactor's time source: the monotonic clock, or a manual clock that a
//! [`TestCluster`](crate::TestCluster) advances by hand so timed pollers run
//! deterministically.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where a reactor reads the time (once per loop).
#[derive(Clone)]
#[cfg_attr(not(any(test, feature = "test-util")), allow(dead_code))]
pub(crate) enum Clock {
    /// `Instant::now()`.
    Real,
    /// A start instant and an offset moved only by [`Clock::advance`];
    /// `Send`, so a [`ClockHandle`] reads it from any thread.
    Manual(Arc<ManualTime>),
}

/// A manual clock's state: `base` plus `offset_ns`.
pub(crate) struct ManualTime {
    base: Instant,
    offset_ns: AtomicU64,
}

#[cfg_attr(not(any(test, feature = "test-util")), allow(dead_code))]
impl Clock {
    /// A manual clock starting at the current instant.
    pub(crate) fn manual() -> Self {
        Self::Manual(Arc::new(ManualTime {
            base: Instant::now(),
            offset_ns: AtomicU64::new(0),
        }))
    }

    pub(crate) fn now(&self) -> Instant {
        match self {
            Self::Real => Instant::now(),
            Self::Manual(t) => t.base + Duration::from_nanos(t.offset_ns.load(Ordering::Acquire)),
        }
    }

    /// Moves a manual clock forward; a no-op on the real clock. (Tests
    /// only, from the thread that drives the cluster.)
    pub(crate) fn advance(&self, by: Duration) {
        if let Self::Manual(t) = self {
            let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
            t.offset_ns.fetch_add(by, Ordering::AcqRel);
        }
    }
}

/// A reactor's clock, to read from anywhere ([`Reactor::clock_handle`]):
/// the monotonic clock, or under a [`TestCluster`](crate::TestCluster) its
/// manual clock. For state made on a reactor that may later be polled off
/// it (a session's keep-alive, say) and must keep that reactor's time.
/// `Send`; reading it is a clock read or one atomic load.
///
/// [`Reactor::clock_handle`]: crate::Reactor::clock_handle
#[derive(Clone)]
pub struct ClockHandle(pub(crate) Clock);

impl ClockHandle {
    /// The monotonic clock (what a reactor outside a test reads).
    pub fn monotonic() -> Self {
        Self(Clock::Real)
    }

    /// The current time on this clock.
    pub fn now(&self) -> Instant {
        self.0.now()
    }
}

impl std::fmt::Debug for ClockHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            Clock::Real => "ClockHandle(monotonic)",
            Clock::Manual(_) => "ClockHandle(manual)",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_advanced_and_is_shared() {
        let c = Clock::manual();
        let d = c.clone();
        let t0 = c.now();
        assert_eq!(c.now(), t0);
        d.advance(Duration::from_millis(3));
        assert_eq!(c.now(), t0 + Duration::from_millis(3));
        let r = Clock::Real;
        let a = r.now();
        r.advance(Duration::from_secs(100));
        assert!(r.now() < a + Duration::from_secs(100));
    }

    #[test]
    fn a_handle_reads_the_manual_clock_from_another_thread() {
        let c = Clock::manual();
        let h = ClockHandle(c.clone());
        let t0 = h.now();
        c.advance(Duration::from_secs(7));
        let t1 = std::thread::spawn(move || h.now()).join().unwrap();
        assert_eq!(t1, t0 + Duration::from_secs(7));
        assert!(format!("{:?}", ClockHandle::monotonic()).contains("monotonic"));
    }
}
