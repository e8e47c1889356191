//! The reactor's time source: the monotonic clock, or a manual clock that a
//! [`TestCluster`](crate::TestCluster) advances by hand so timed pollers run
//! deterministically.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Where a reactor reads the time (once per loop).
#[derive(Clone)]
#[cfg_attr(not(any(test, feature = "test-util")), allow(dead_code))]
pub(crate) enum Clock {
    /// `Instant::now()`.
    Real,
    /// A shared cell moved only by [`Clock::advance`].
    Manual(Rc<Cell<Instant>>),
}

#[cfg_attr(not(any(test, feature = "test-util")), allow(dead_code))]
impl Clock {
    /// A manual clock starting at the current instant.
    pub(crate) fn manual() -> Self {
        Self::Manual(Rc::new(Cell::new(Instant::now())))
    }

    pub(crate) fn now(&self) -> Instant {
        match self {
            Self::Real => Instant::now(),
            Self::Manual(t) => t.get(),
        }
    }

    /// Moves a manual clock forward; a no-op on the real clock.
    pub(crate) fn advance(&self, by: Duration) {
        if let Self::Manual(t) = self {
            t.set(t.get() + by);
        }
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
}
