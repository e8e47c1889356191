//! [`PollerGuard`]: a poller registered with its reactor for as long as the
//! guard lives. Dropping it removes the poller (deferred to the end of the
//! loop when that happens inside a poller, as [`Reactor::remove_poller`]
//! does), so a component that owns a poller cannot leave it behind on any
//! path out, an error or a panic included.

use std::borrow::Cow;
use std::time::Duration;

use crate::{PollStatus, PollerId, Reactor};

/// One registered poller, removed on drop. `!Send`, like the reactor.
///
/// ```
/// use std::cell::Cell;
/// use std::rc::Rc;
/// use pollux_reactor::{PollStatus, PollerGuard, TestCluster};
///
/// let cluster = TestCluster::new(1);
/// cluster.on(0, |r| {
///     let runs = Rc::new(Cell::new(0));
///     let seen = Rc::clone(&runs);
///     let before = r.poller_count();
///     let guard = PollerGuard::active(r, "example", move || {
///         seen.set(seen.get() + 1);
///         PollStatus::Idle
///     });
///     r.poll_once();
///     assert_eq!(runs.get(), 1);
///     drop(guard);
///     assert_eq!(r.poller_count(), before);
/// });
/// ```
pub struct PollerGuard {
    reactor: Reactor,
    id: PollerId,
}

impl PollerGuard {
    /// Adds an active poller ([`Reactor::add_poller`]).
    pub fn active(
        reactor: &Reactor,
        name: impl Into<Cow<'static, str>>,
        f: impl FnMut() -> PollStatus + 'static,
    ) -> Self {
        Self {
            id: reactor.add_poller(name, f),
            reactor: reactor.clone(),
        }
    }

    /// Adds a timed poller ([`Reactor::add_timed_poller`]).
    pub fn timed(
        reactor: &Reactor,
        name: impl Into<Cow<'static, str>>,
        period: Duration,
        f: impl FnMut() -> PollStatus + 'static,
    ) -> Self {
        Self {
            id: reactor.add_timed_poller(name, period, f),
            reactor: reactor.clone(),
        }
    }

    /// The poller's id (for logs).
    pub fn id(&self) -> PollerId {
        self.id
    }
}

impl Drop for PollerGuard {
    fn drop(&mut self) {
        self.reactor.remove_poller(self.id);
    }
}

impl std::fmt::Debug for PollerGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PollerGuard")
            .field("core", &self.reactor.core())
            .field("id", &self.id)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};
    use std::rc::Rc;
    use std::time::Duration;

    use super::PollerGuard;
    use crate::{PollStatus, TestCluster};

    #[test]
    fn a_timed_guard_runs_on_its_period_until_dropped() {
        let c = TestCluster::new(1);
        let r = c.reactor(0);
        let runs = Rc::new(Cell::new(0));
        let n = Rc::clone(&runs);
        let guard = PollerGuard::timed(&r, "tick", Duration::from_millis(2), move || {
            n.set(n.get() + 1);
            PollStatus::Idle
        });
        assert_eq!(r.poller_count(), 1);
        for _ in 0..4 {
            c.advance(Duration::from_millis(1));
            r.poll_once();
        }
        assert_eq!(runs.get(), 2);
        drop(guard);
        assert_eq!(r.poller_count(), 0);
        c.advance(Duration::from_millis(10));
        r.poll_once();
        assert_eq!(runs.get(), 2, "a dropped guard's poller never runs again");
    }

    #[test]
    fn a_guard_dropped_by_its_own_poller_is_removed_at_the_end_of_the_loop() {
        let c = TestCluster::new(1);
        let r = c.reactor(0);
        let slot: Rc<RefCell<Option<PollerGuard>>> = Rc::default();
        let runs = Rc::new(Cell::new(0));
        let (s, n) = (Rc::clone(&slot), Rc::clone(&runs));
        let guard = PollerGuard::active(&r, "once", move || {
            n.set(n.get() + 1);
            // Dropping the guard from inside: the closure (which holds
            // this `Rc`) is freed once the loop is over, not under us.
            drop(s.borrow_mut().take());
            PollStatus::Busy
        });
        *slot.borrow_mut() = Some(guard);
        assert_eq!(r.poll_once(), PollStatus::Busy);
        assert_eq!(r.poller_count(), 0);
        r.poll_once();
        assert_eq!(runs.get(), 1);
        assert_eq!(Rc::strong_count(&slot), 1, "the closure was freed");
    }
}
