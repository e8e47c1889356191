//! Pollux reactors: one run-to-completion event loop per core.
//!
//! A [`Reactor`] owns the pollers, timed pollers, pending replies and I/O
//! channels of one core. Each loop ([`Reactor::poll_once`]) handles up to
//! [`MSG_BATCH`] messages from its inbox, runs every active poller, then the
//! timed pollers whose deadline has passed, and counts the loop busy if any
//! of them did work. [`launch`] runs one pinned thread per core;
//! `TestCluster` (feature `test-util`) drives N reactors from one thread.
//!
//! # Quick start
//!
//! ```
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use std::sync::Arc;
//! use pollux_reactor::{launch, Cores, LaunchConfig, PollStatus};
//!
//! let seen = Arc::new(AtomicU64::new(0));
//! let seen2 = seen.clone();
//! let set = launch(LaunchConfig::new(Cores::parse("0-1").unwrap()), move |r| {
//!     if r.core() == 1 {
//!         // A poller: runs every loop on core 1 and says whether it worked.
//!         r.add_poller("noop", || PollStatus::Idle);
//!     }
//! })
//! .unwrap();
//! // A message: runs once on core 1, then stops every reactor.
//! set.messenger()
//!     .send(1, move |r| {
//!         seen2.store(u64::from(r.core()) + 100, Ordering::SeqCst);
//!         r.stop_all();
//!     })
//!     .unwrap();
//! set.join().unwrap();
//! assert_eq!(seen.load(Ordering::SeqCst), 101);
//! ```
//!
//! # Rules of the data path
//!
//! - **No locks, no spinning atomics.** Cores share only messages (one
//!   bounded `crossbeam-channel` inbox per reactor), `Arc` control-plane
//!   objects and pools refilled in batches.
//! - **No heap allocation per I/O.** Requests come from slabs sized at setup;
//!   a message (`Box<dyn FnOnce(&Reactor) + Send>`) is control path. The loop
//!   itself allocates nothing and, in busy-poll mode, makes no system call
//!   but one clock read (plus one after each poller that reports `Busy`).
//! - **Per-core state is `!Send`.** `Reactor`, channels and pollers hold
//!   `Rc`/`RefCell`/`Cell`, so the compiler keeps them on their core. Per-core
//!   state of a shared device goes through [`IoDevice`] and
//!   [`Reactor::channel`].
//! - **Never complete inside submit.** Queue the completion and deliver it
//!   from the next poll, so a `RefCell` borrow never spans a user callback.
//!   The reactor does the same: it never holds a borrow while it calls a
//!   poller, a message or a reply, which is why a poller may remove itself.
//! - **Out of resources is back-pressure**: wait and resume, not failure.
//!
//! # Idle policy and wake latency
//!
//! [`IdleMode::BusyPoll`] (default) polls forever. [`IdleMode::Adaptive`]
//! sleeps in `epoll_wait` after `sleep_after` idle and wakes on a message
//! (the sender writes an eventfd only when the reactor says it sleeps), on
//! the next timed-poller deadline, or on an fd registered with
//! [`Reactor::register_wake_fd`].
//!
//! Measured with `cargo bench -p pollux-reactor --bench wake_latency` (a
//! `call` round trip between reactors on cores 0 and 1; 2-core VM, Linux
//! 6.18, release build, other builds running): busy-poll **~0.45 µs** per
//! round trip on a quiet machine (1.5 µs under load); adaptive with
//! `sleep_after = 0`, both reactors asleep, **~60-80 µs** (two eventfd
//! wake-ups per round trip). Use a `sleep_after` of a few hundred
//! microseconds to keep busy-poll latency under load and sleep only when
//! truly idle.
//!
//! [`IdleMode::Hybrid`] sleeps through the predictable part of each idle
//! stretch, as Linux's hybrid block polling does: after its work the
//! reactor sleeps for half the moving average of the time from one busy
//! loop to the next, then polls, so work that comes at a steady pace finds
//! it polling; early work wakes it as in the adaptive mode (`hybrid`).
//!
//! # Modules
//!
//! One concept per file: [`Reactor`] (`reactor`), pollers (`poller`), the
//! timer heap (`timer`), messages (`msg`), io_device/channels (`channel`),
//! the idle policy (`wake`) and the hybrid mode's estimate (`hybrid`), statistics (`stats`), core sets (`cores`),
//! the per-I/O clock ([`IoClock`], `io_clock`), control-path locks,
//! counted ([`sync`]), launching (`launch`), the test cluster
//! (`test_cluster`), skipping tests the machine cannot run ([`test_env`]),
//! DMA memory ([`mem`]) and asynchronous file and
//! socket I/O ([`io`]; the socket ring, [`io::SockRing`], measured against
//! plain non-blocking sockets by `cargo bench -p pollux-reactor --bench
//! sock_engine`).

mod accept_pacer;
mod awake;
mod channel;
mod clock;
mod cores;
mod current;
mod error;
mod hybrid;
mod io_clock;
mod launch;
mod msg;
mod poller;
mod poller_guard;
mod rare_check;
mod reactor;
mod stats;
pub mod sync;
#[cfg(any(test, feature = "test-util"))]
mod test_cluster;
pub mod test_env;
#[cfg(any(test, feature = "test-util"))]
mod test_port;
mod timer;
mod wake;
mod wake_watch;

pub mod io;
pub mod mem;

pub use accept_pacer::AcceptPacer;
pub use awake::AwakeHold;
pub use channel::IoDevice;
pub use clock::ClockHandle;
pub use cores::{CoreId, Cores, CoresError, MAX_CORE_ID};
pub use error::{ReactorError, SendError};
pub use io_clock::{ClockSource, IoClock};
pub use launch::{
    launch, LaunchConfig, LaunchError, ReactorSet, DEFAULT_INBOX_DEPTH, STATS_TIMEOUT,
};
pub use msg::Messenger;
pub use poller::{PollStatus, PollerId};
pub use poller_guard::PollerGuard;
pub use rare_check::RareCheck;
pub use reactor::{Reactor, MSG_BATCH};
pub use stats::{PollerStats, ReactorStats};
#[cfg(any(test, feature = "test-util"))]
pub use test_cluster::{NotSettled, TestCluster, DEFAULT_MAX_ROUNDS};
#[cfg(any(test, feature = "test-util"))]
pub use test_port::free_tcp_port;
pub use wake::{IdleMode, WakeFdId};
pub use wake_watch::WakeWatch;
