//! [`TestCluster`]: N reactors driven from one thread, deterministically
//! (SPDK's `ut_multithread.c`). Behind the `test-util` feature.
//!
//! The reactors share a manual clock: time moves only with
//! [`TestCluster::advance`], so timed pollers run exactly when a test says.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::cores::{CoreId, Cores};
use crate::msg::{Mailboxes, Messenger};
use crate::poller::PollStatus;
use crate::wake::{IdleMode, WakeSignal};
use crate::Reactor;

/// The most rounds [`TestCluster::poll_until_idle`] runs.
pub const DEFAULT_MAX_ROUNDS: usize = 10_000;

/// The inbox depth of a test reactor.
const TEST_INBOX_DEPTH: usize = 4096;

/// [`TestCluster::poll_until_idle`] gave up: some reactor stayed busy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("reactors still busy after {rounds} rounds")]
pub struct NotSettled {
    /// Rounds run before giving up.
    pub rounds: usize,
}

/// N reactors on the current thread, polled by hand.
///
/// ```
/// use pollux_reactor::TestCluster;
/// let cluster = TestCluster::new(2);
/// cluster.on(0, |r| {
///     r.call(1, |r1| r1.core() * 10, |r0, v| assert_eq!((r0.core(), v), (0, 10))).unwrap();
/// });
/// cluster.poll_until_idle().unwrap();
/// ```
pub struct TestCluster {
    reactors: Vec<Reactor>,
    clock: Clock,
    messenger: Messenger,
}

impl TestCluster {
    /// `n` reactors on cores `0..n` (at least one).
    ///
    /// # Panics
    ///
    /// Never in practice: busy-poll reactors make no system call to start.
    pub fn new(n: usize) -> Self {
        Self::with_cores(&Cores::first(n))
    }

    /// One reactor per core of `cores` (core numbers need not exist here).
    ///
    /// # Panics
    ///
    /// As [`TestCluster::new`].
    pub fn with_cores(cores: &Cores) -> Self {
        Self::build(cores, IdleMode::BusyPoll)
    }

    /// `n` reactors in idle mode `idle`: driven by the test as ever (they
    /// never sleep), but what the mode changes for pollers holds (wake fds
    /// are registered, `Reactor::idle_mode` says so).
    ///
    /// # Panics
    ///
    /// If a reactor's epoll set or eventfd cannot be created.
    pub fn with_idle(n: usize, idle: IdleMode) -> Self {
        Self::build(&Cores::first(n), idle)
    }

    fn build(cores: &Cores, idle: IdleMode) -> Self {
        let clock = Clock::manual();
        let signal = || match WakeSignal::new(idle) {
            Ok(s) => Arc::new(s),
            Err(e) => panic!("wake signal for {idle:?}: {e}"),
        };
        let (boxes, inboxes) =
            Mailboxes::build(cores.iter().map(|c| (c, signal())), TEST_INBOX_DEPTH);
        let messenger = Messenger::new(boxes);
        let reactors = inboxes
            .into_iter()
            .map(|(core, inbox)| {
                match Reactor::new(core, inbox, messenger.clone(), idle, clock.clone()) {
                    Ok(r) => r,
                    Err(e) => panic!("{idle:?} reactor {core} failed to start: {e}"),
                }
            })
            .collect();
        Self {
            reactors,
            clock,
            messenger,
        }
    }

    /// The reactor of `core`.
    ///
    /// # Panics
    ///
    /// If `core` is not in the cluster (a test bug).
    pub fn reactor(&self, core: CoreId) -> Reactor {
        match self.reactors.iter().find(|r| r.core() == core) {
            Some(r) => r.clone(),
            None => panic!("core {core} is not in this TestCluster"),
        }
    }

    /// Runs `f` now on `core`'s reactor, with it as
    /// [`Reactor::current`]. Messages it sends run at the next poll.
    ///
    /// # Panics
    ///
    /// If `core` is not in the cluster.
    pub fn on<T>(&self, core: CoreId, f: impl FnOnce(&Reactor) -> T) -> T {
        let r = self.reactor(core);
        let _current = crate::current::CurrentGuard::enter(&r);
        f(&r)
    }

    /// One loop on every running reactor, in core order; `Busy` if any was.
    /// A reactor that stopped is torn down after its loop and then skipped.
    pub fn poll_once_all(&self) -> PollStatus {
        let mut busy = false;
        for r in &self.reactors {
            if r.is_torn_down() {
                continue;
            }
            busy |= r.poll_once().is_busy();
            if r.is_stopping() {
                r.teardown();
            }
        }
        PollStatus::from_work(busy)
    }

    /// Polls every reactor until one full round is idle with every inbox
    /// empty, at most [`DEFAULT_MAX_ROUNDS`] rounds. Returns the rounds run.
    /// The clock does not move: pending timed pollers do not count as work.
    ///
    /// # Errors
    ///
    /// [`NotSettled`] if it never settles (a poller that is always busy).
    pub fn poll_until_idle(&self) -> Result<usize, NotSettled> {
        self.poll_until_idle_within(DEFAULT_MAX_ROUNDS)
    }

    /// [`poll_until_idle`](Self::poll_until_idle) with a round limit.
    ///
    /// # Errors
    ///
    /// [`NotSettled`] after `max_rounds` busy rounds.
    pub fn poll_until_idle_within(&self, max_rounds: usize) -> Result<usize, NotSettled> {
        for round in 1..=max_rounds {
            let busy = self.poll_once_all().is_busy();
            let queued = self
                .reactors
                .iter()
                .any(|r| !r.is_torn_down() && self.messenger.pending(r.core()) > 0);
            if !busy && !queued {
                return Ok(round);
            }
        }
        Err(NotSettled { rounds: max_rounds })
    }

    /// Moves the shared manual clock forward (nothing runs until the next
    /// poll).
    pub fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    /// The shared manual clock's time.
    pub fn now(&self) -> Instant {
        self.clock.now()
    }

    /// The cluster's messenger.
    pub fn messenger(&self) -> &Messenger {
        &self.messenger
    }

    /// The shared manual clock (for unit tests that move time from inside
    /// a poller).
    #[cfg(test)]
    pub(crate) fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The cores, ascending.
    pub fn cores(&self) -> Vec<CoreId> {
        self.reactors.iter().map(Reactor::core).collect()
    }
}

impl Drop for TestCluster {
    /// Tears every reactor down (breaking `Rc` cycles through pollers).
    fn drop(&mut self) {
        for r in &self.reactors {
            r.teardown();
        }
    }
}
