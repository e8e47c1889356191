//! The reactor: one run-to-completion loop per core.
//!
//! [`Reactor::poll_once`] is one step: drain up to [`MSG_BATCH`] messages, run
//! every active poller, then the timed pollers whose deadline has passed.
//! [`Reactor::run`] loops over it (and sleeps in the adaptive idle mode)
//! until the reactor stops; [`launch`](crate::launch) runs it on pinned
//! threads, [`TestCluster`](crate::TestCluster) calls `poll_once` by hand.

use std::any::Any;
use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::num::NonZeroU64;
use std::os::fd::AsFd;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use slab::Slab;

use crate::awake::AwakeHold;
use crate::channel::{ChannelCache, IoDevice};
use crate::clock::Clock;
use crate::cores::CoreId;
use crate::current::{self, CurrentGuard};
use crate::error::{ReactorError, SendError};
use crate::hybrid::HybridEstimate;
use crate::msg::{Inbox, Messenger};
use crate::poller::{PollFn, PollStatus, PollerId, PollerTable};
use crate::stats::{nanos, Counters, PollerStats, ReactorStats};
use crate::timer::TimerHeap;
use crate::wake::{IdleMode, Sleeper, Slept, WakeFdId};

/// The most messages one loop handles before it runs the pollers (SPDK uses
/// 8; messages are control path, pollers are the data path).
pub const MSG_BATCH: usize = 32;

/// A reply or completion closure waiting on its home core; a boxed
/// `Box<dyn FnOnce(&Reactor, T)>`.
type ReplySlot = Box<dyn Any>;

/// A parked reply closure for a value of type `T`.
type Reply<T> = Box<dyn FnOnce(&Reactor, T)>;

pub(crate) struct Inner {
    core: CoreId,
    clock: Clock,
    idle: IdleMode,
    /// The time read at the start of the current loop.
    now: Cell<Instant>,
    /// `now` as nanoseconds since `epoch` (cached with it, for cheap integer arithmetic).
    now_ns: Cell<u64>,
    /// The reactor's creation time, origin of `now_ns`.
    epoch: Instant,
    /// When the previous loop started (for busy/idle accounting).
    loop_start: Cell<Instant>,
    /// Whether the previous loop was busy.
    last_busy: Cell<bool>,
    /// The start of the last busy loop (adaptive and hybrid modes).
    last_busy_at: Cell<Instant>,
    /// The hybrid mode's estimate of the idle stretches.
    hybrid: Cell<HybridEstimate>,
    /// Live [`AwakeHold`]s: the reactor does not sleep while any is.
    awake_holds: Cell<u64>,
    in_poll: Cell<bool>,
    stopping: Cell<bool>,
    torn_down: Cell<bool>,
    counters: Cell<Counters>,
    pollers: RefCell<PollerTable>,
    timers: RefCell<TimerHeap>,
    removals: RefCell<Vec<PollerId>>,
    replies: RefCell<Slab<ReplySlot>>,
    channels: RefCell<ChannelCache>,
    inbox: Inbox,
    messenger: Messenger,
    sleeper: RefCell<Option<Sleeper>>,
    next_wake_id: Cell<u64>,
}

/// A handle to the reactor of one core: cheap to clone (`Rc` inside) and
/// `!Send`, so it never leaves its thread.
///
/// ```compile_fail
/// fn assert_send<T: Send>() {}
/// assert_send::<pollux_reactor::Reactor>();
/// ```
///
/// ```compile_fail
/// let cluster = pollux_reactor::TestCluster::new(1);
/// let r = cluster.reactor(0);
/// std::thread::spawn(move || r.core());
/// ```
#[derive(Clone)]
pub struct Reactor(Rc<Inner>);

impl std::fmt::Debug for Reactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reactor")
            .field("core", &self.0.core)
            .field("idle", &self.0.idle)
            .finish()
    }
}

impl Reactor {
    /// Creates a reactor for `core` on the current thread.
    pub(crate) fn new(
        core: CoreId,
        inbox: Inbox,
        messenger: Messenger,
        idle: IdleMode,
        clock: Clock,
    ) -> Result<Self, ReactorError> {
        let sleeper = if idle.sleeps() {
            Some(Sleeper::new(&inbox.wake)?)
        } else {
            None
        };
        if let IdleMode::Hybrid { .. } = idle {
            // The default slack (50 us) would end the short sleeps late:
            // after the work they are meant to be polling for.
            if let Err(e) = rustix::thread::set_current_timer_slack(NonZeroU64::new(1)) {
                log::debug!("reactor {core}: timer slack stays as it is: {e}");
            }
        }
        let now = clock.now();
        Ok(Self(Rc::new(Inner {
            core,
            clock,
            idle,
            now: Cell::new(now),
            now_ns: Cell::new(0),
            epoch: now,
            loop_start: Cell::new(now),
            last_busy: Cell::new(false),
            last_busy_at: Cell::new(now),
            hybrid: Cell::new(HybridEstimate::default()),
            awake_holds: Cell::new(0),
            in_poll: Cell::new(false),
            stopping: Cell::new(false),
            torn_down: Cell::new(false),
            counters: Cell::new(Counters::default()),
            pollers: RefCell::new(PollerTable::default()),
            timers: RefCell::new(TimerHeap::default()),
            removals: RefCell::new(Vec::new()),
            replies: RefCell::new(Slab::new()),
            channels: RefCell::new(ChannelCache::default()),
            inbox,
            messenger,
            sleeper: RefCell::new(sleeper),
            next_wake_id: Cell::new(1),
        })))
    }

    /// The reactor running on this thread: set while [`run`](Self::run) or
    /// [`poll_once`](Self::poll_once) runs, and inside
    /// `TestCluster::on`.
    pub fn current() -> Option<Reactor> {
        current::get()
    }

    /// This reactor's core.
    pub fn core(&self) -> CoreId {
        self.0.core
    }

    /// The idle policy this reactor runs with.
    pub fn idle_mode(&self) -> IdleMode {
        self.0.idle
    }

    /// The time read at the start of the current (or last) loop. Cheap: no
    /// clock read.
    #[inline]
    pub fn now(&self) -> Instant {
        self.0.now.get()
    }

    /// Whether this reactor's previous loop did any work (a message, a
    /// poller that reported busy). Inside a poller it tells whether the
    /// core is serving someone: a poller with an expensive check that is
    /// rarely fruitful (a listener's `accept`) can run it on every loop of an
    /// idle core and only now and then on a busy one.
    #[inline]
    pub fn last_loop_busy(&self) -> bool {
        self.0.last_busy.get()
    }

    /// The time now, read from this reactor's clock (not cached: a clock
    /// read, for the control path). [`now`](Self::now) may be older by
    /// however long the current loop has run, which matters to a deadline
    /// set from an event that happened during it (a connection accepted
    /// after the thread was preempted, say). Under a
    /// `TestCluster` it is the manual clock's time.
    pub fn read_clock(&self) -> Instant {
        self.0.clock.now()
    }

    /// This reactor's clock as a `Send` handle, read where this reactor is
    /// not current (what [`read_clock`](Self::read_clock) reads).
    pub fn clock_handle(&self) -> crate::ClockHandle {
        crate::ClockHandle(self.0.clock.clone())
    }

    /// [`now`](Self::now) as whole nanoseconds since this reactor was
    /// created, cached per loop like `now`: for per-I/O timestamps and
    /// latencies in integer arithmetic (no `Instant` subtraction per I/O).
    #[inline]
    pub fn now_ns(&self) -> u64 {
        self.0.now_ns.get()
    }

    /// A `Send` handle that reaches every reactor of this set.
    pub fn messenger(&self) -> &Messenger {
        &self.0.messenger
    }

    /// Whether [`stop`](Self::stop) was called.
    pub fn is_stopping(&self) -> bool {
        self.0.stopping.get()
    }

    /// Adds an active poller, called once per loop from the next loop on.
    ///
    /// The closure runs on this core only; it may add or remove pollers,
    /// itself included, and send messages.
    pub fn add_poller(
        &self,
        name: impl Into<Cow<'static, str>>,
        f: impl FnMut() -> PollStatus + 'static,
    ) -> PollerId {
        self.0
            .pollers
            .borrow_mut()
            .insert(name.into(), None, Box::new(f))
    }

    /// Adds a timed poller, first run one `period` from now, then once per
    /// `period` after each run (no catch-up bursts: a late poller runs once
    /// and is rescheduled from the current loop's time). A zero period makes
    /// it an active poller.
    pub fn add_timed_poller(
        &self,
        name: impl Into<Cow<'static, str>>,
        period: Duration,
        f: impl FnMut() -> PollStatus + 'static,
    ) -> PollerId {
        if period.is_zero() {
            return self.add_poller(name, f);
        }
        let f: PollFn = Box::new(f);
        let id = self
            .0
            .pollers
            .borrow_mut()
            .insert(name.into(), Some(period), f);
        let deadline = self.0.now.get() + period;
        self.0.timers.borrow_mut().schedule(id, deadline);
        id
    }

    /// Removes a poller; safe from inside any poller, itself included.
    /// Inside a loop the removal is deferred to the end of the loop (the
    /// poller does not run again); otherwise it is immediate. Returns
    /// whether `id` named a live poller.
    pub fn remove_poller(&self, id: PollerId) -> bool {
        {
            let mut t = self.0.pollers.borrow_mut();
            match t.live_mut(id) {
                Some(slot) => slot.removed = true,
                None => return false,
            }
        }
        if self.0.in_poll.get() {
            self.0.removals.borrow_mut().push(id);
        } else {
            self.finish_removal(id);
        }
        true
    }

    /// Live pollers on this reactor.
    pub fn poller_count(&self) -> usize {
        let t = self.0.pollers.borrow();
        t.slots.iter().filter(|(_, s)| !s.removed).count()
    }

    fn finish_removal(&self, id: PollerId) {
        let slot = self.0.pollers.borrow_mut().take_slot(id);
        if let Some(slot) = slot {
            if slot.period.is_some() {
                let pollers = &self.0.pollers;
                self.0
                    .timers
                    .borrow_mut()
                    .note_stale(|i| pollers.borrow().live(i).is_some());
            }
            // Dropped here, with no borrow held: the closure's captures may
            // call back into the reactor.
            drop(slot);
        }
    }

    /// One loop: messages, active pollers, expired timed pollers. Returns
    /// `Busy` if any message ran or any poller reported `Busy`.
    ///
    /// Calling it from inside a poller or message (re-entrantly) does
    /// nothing and returns `Idle`.
    pub fn poll_once(&self) -> PollStatus {
        let inner = &*self.0;
        if inner.in_poll.get() {
            return PollStatus::Idle;
        }
        let _current = CurrentGuard::enter(self);
        let now = inner.clock.now();
        let mut c = inner.counters.get();
        let elapsed = nanos(now.saturating_duration_since(inner.loop_start.get()));
        if inner.last_busy.get() {
            c.busy_ns += elapsed;
        } else {
            c.idle_ns += elapsed;
        }
        inner.counters.set(c);
        inner.loop_start.set(now);
        inner.now.set(now);
        inner
            .now_ns
            .set(nanos(now.saturating_duration_since(inner.epoch)));
        inner.in_poll.set(true);

        let mut busy = false;
        let mut msgs = 0u64;
        while (msgs as usize) < MSG_BATCH {
            match inner.inbox.rx.try_recv() {
                Ok(m) => {
                    m(self);
                    msgs += 1;
                }
                Err(_) => break,
            }
        }
        busy |= msgs > 0;

        // Active pollers: those present when the loop started, in order.
        let mut mark = now;
        let n = inner.pollers.borrow().active.len();
        for i in 0..n {
            let id = {
                let t = inner.pollers.borrow();
                t.active.get(i).and_then(|&k| t.id_at(k))
            };
            if let Some(id) = id {
                busy |= self.run_poller(id, &mut mark).is_busy();
            }
        }

        // Timed pollers whose deadline has passed, earliest first.
        loop {
            let due = inner.timers.borrow_mut().pop_due(now);
            let Some(entry) = due else { break };
            let id = entry.id();
            let period = inner.pollers.borrow().live(id).and_then(|s| s.period);
            let Some(period) = period else {
                inner.timers.borrow_mut().stale_popped();
                continue;
            };
            busy |= self.run_poller(id, &mut mark).is_busy();
            if inner.pollers.borrow().live(id).is_some() {
                inner.timers.borrow_mut().schedule(id, now + period);
            } else {
                // Removed while it ran: its entry is already gone.
                inner.timers.borrow_mut().stale_popped();
            }
        }

        inner.in_poll.set(false);
        loop {
            let next = inner.removals.borrow_mut().pop();
            let Some(id) = next else { break };
            self.finish_removal(id);
        }

        let mut c = inner.counters.get();
        c.loops += 1;
        c.messages += msgs;
        if busy {
            c.busy_loops += 1;
            if let IdleMode::Hybrid { sleep_after } = inner.idle {
                let mut h = inner.hybrid.get();
                if inner.last_busy.get() {
                    h.busy_again();
                } else {
                    let stretch = now.saturating_duration_since(inner.last_busy_at.get());
                    h.stretch_ended(nanos(stretch.min(sleep_after)));
                }
                inner.hybrid.set(h);
            }
            inner.last_busy_at.set(now);
        }
        inner.counters.set(c);
        inner.last_busy.set(busy);
        PollStatus::from_work(busy)
    }

    /// Runs one poller: takes its closure out, calls it with no borrow held,
    /// puts it back (or drops it if it was removed meanwhile).
    fn run_poller(&self, id: PollerId, mark: &mut Instant) -> PollStatus {
        let f = {
            let mut t = self.0.pollers.borrow_mut();
            match t.live_mut(id) {
                Some(slot) => slot.f.take(),
                None => None,
            }
        };
        // `None`: removed, or already running further up the stack.
        let Some(mut f) = f else {
            return PollStatus::Idle;
        };
        let status = f();
        let busy_ns = if status.is_busy() {
            let t = self.0.clock.now();
            let d = nanos(t.saturating_duration_since(*mark));
            *mark = t;
            d
        } else {
            0
        };
        let leftover = {
            let mut t = self.0.pollers.borrow_mut();
            match t.slots.get_mut(id.key as usize) {
                Some(slot) if slot.gen == id.gen => {
                    slot.runs += 1;
                    if status.is_busy() {
                        slot.busy_runs += 1;
                        slot.busy_ns += busy_ns;
                    }
                    if slot.removed {
                        Some(f)
                    } else {
                        slot.f = Some(f);
                        None
                    }
                }
                _ => Some(f),
            }
        };
        drop(leftover);
        status
    }

    /// Runs [`poll_once`](Self::poll_once) until the reactor stops, sleeping
    /// when idle in [`IdleMode::Adaptive`] and [`IdleMode::Hybrid`], then
    /// tears the reactor down on this thread (pollers, pending replies,
    /// channel cache, queued messages are dropped here).
    pub fn run(&self) {
        let _current = CurrentGuard::enter(self);
        while !self.0.stopping.get() {
            let status = self.poll_once();
            if status.is_busy() || self.0.stopping.get() || self.0.awake_holds.get() > 0 {
                continue;
            }
            match self.0.idle {
                IdleMode::BusyPoll => {}
                IdleMode::Adaptive { sleep_after } => self.maybe_sleep(sleep_after),
                IdleMode::Hybrid { sleep_after } => self.maybe_sleep_hybrid(sleep_after),
            }
        }
        self.teardown();
    }

    /// Keep this reactor from sleeping until the hold is dropped: for a
    /// poller that waits on something that cannot wake it (see
    /// [`AwakeHold`]). Holds nest; in busy mode they change nothing.
    pub fn hold_awake(&self) -> AwakeHold {
        AwakeHold::new(self)
    }

    /// Whether an [`AwakeHold`] keeps this reactor from sleeping.
    pub fn is_held_awake(&self) -> bool {
        self.0.awake_holds.get() > 0
    }

    pub(crate) fn add_awake_hold(&self, delta: i64) {
        let c = &self.0.awake_holds;
        c.set(c.get().saturating_add_signed(delta));
    }

    /// How long the reactor has been idle (since its last busy loop started).
    fn idle_for(&self) -> Duration {
        let inner = &*self.0;
        inner
            .now
            .get()
            .saturating_duration_since(inner.last_busy_at.get())
    }

    /// The adaptive mode: after `sleep_after` idle, sleep until an event.
    fn maybe_sleep(&self, sleep_after: Duration) {
        if self.idle_for() >= sleep_after {
            self.sleep(None);
        }
    }

    /// The hybrid mode: sleep once per idle stretch through the part of it
    /// that the estimate predicts (see `hybrid.rs`); after `sleep_after`
    /// idle, sleep until an event.
    fn maybe_sleep_hybrid(&self, sleep_after: Duration) {
        let idle_for = self.idle_for();
        if idle_for >= sleep_after {
            self.sleep(None);
            return;
        }
        // The sleep runs no reactor code: the estimate stays in hand.
        let mut h = self.0.hybrid.get();
        if let Some(ns) = h.sleep_now(nanos(idle_for)) {
            let slept = self.sleep(Some(Duration::from_nanos(ns)));
            h.nap_ended(slept == Slept::Woken);
        }
        self.0.hybrid.set(h);
    }

    /// Sleep until a message, a registered fd, the next timed poller's
    /// deadline or `limit`, whichever comes first; how it ended.
    fn sleep(&self, limit: Option<Duration>) -> Slept {
        let inner = &*self.0;
        let deadline = inner.timers.borrow().next_deadline();
        let until_timer = deadline.map(|d| d.saturating_duration_since(inner.clock.now()));
        let timeout = match (until_timer, limit) {
            (Some(t), Some(l)) => Some(t.min(l)),
            (t, l) => t.or(l),
        };
        if timeout == Some(Duration::ZERO) {
            return Slept::Not;
        }
        let mut sleeper = inner.sleeper.borrow_mut();
        let Some(sleeper) = sleeper.as_mut() else {
            return Slept::Not;
        };
        match sleeper.sleep(&inner.inbox.wake, timeout, || inner.inbox.rx.is_empty()) {
            Ok(Slept::Not) => Slept::Not,
            Ok(slept) => {
                let mut c = inner.counters.get();
                c.sleeps += 1;
                inner.counters.set(c);
                slept
            }
            Err(e) => {
                log::warn!("reactor {}: epoll_wait failed: {e}", inner.core);
                Slept::Not
            }
        }
    }

    /// Registers a file descriptor whose readability wakes this reactor from
    /// its adaptive sleep (an io_uring eventfd, a verbs completion channel).
    /// The reactor keeps its own duplicate of `fd` until
    /// [`unregister_wake_fd`](Self::unregister_wake_fd) or shutdown. It is
    /// level-triggered: the poller must drain the fd, or the reactor does not
    /// sleep. In [`IdleMode::BusyPoll`] nothing is registered (the reactor
    /// never sleeps) and an id is still returned.
    ///
    /// # Errors
    ///
    /// [`ReactorError::Os`] when the fd cannot be duplicated or added to the
    /// epoll set.
    pub fn register_wake_fd(&self, fd: impl AsFd) -> Result<WakeFdId, ReactorError> {
        let mut sleeper = self.0.sleeper.borrow_mut();
        match sleeper.as_mut() {
            Some(s) => s.register(fd),
            None => {
                let id = self.0.next_wake_id.get();
                self.0.next_wake_id.set(id + 1);
                Ok(WakeFdId(id))
            }
        }
    }

    /// Unregisters a wake fd (closing the reactor's duplicate). Returns
    /// whether it was registered (always `false` in busy-poll mode).
    pub fn unregister_wake_fd(&self, id: WakeFdId) -> bool {
        self.0
            .sleeper
            .borrow_mut()
            .as_mut()
            .is_some_and(|s| s.unregister(id))
    }

    /// Queues `f` on `core` (this core included: it then runs in a later
    /// loop, never inline).
    ///
    /// # Errors
    ///
    /// As [`Messenger::send`].
    pub fn send(
        &self,
        core: CoreId,
        f: impl FnOnce(&Reactor) + Send + 'static,
    ) -> Result<(), SendError> {
        self.0.messenger.send(core, f)
    }

    /// Runs `f` on `core` and then `reply` with its result back on this
    /// core. The reply closure stays here (it may hold `Rc`s); only a slot
    /// number travels. `core` may be this core. If the other reactor stops
    /// before it runs `f`, `reply` is dropped at this reactor's shutdown.
    ///
    /// # Errors
    ///
    /// As [`Messenger::send`]; `reply` is dropped then.
    pub fn call<T: Send + 'static>(
        &self,
        core: CoreId,
        f: impl FnOnce(&Reactor) -> T + Send + 'static,
        reply: impl FnOnce(&Reactor, T) + 'static,
    ) -> Result<(), SendError> {
        let token = self.park_reply(reply);
        let origin = self.0.core;
        let res = self.send(core, move |r| {
            let value = f(r);
            if let Err(e) = r.send(origin, move |home| home.complete_reply(token, value)) {
                log::warn!("reply from core {} to core {origin} lost: {e}", r.core());
            }
        });
        if res.is_err() {
            let slot = self.0.replies.borrow_mut().try_remove(token);
            drop(slot);
        }
        res
    }

    fn park_reply<T: 'static>(&self, reply: impl FnOnce(&Reactor, T) + 'static) -> usize {
        let boxed: Reply<T> = Box::new(reply);
        self.0.replies.borrow_mut().insert(Box::new(boxed))
    }

    /// Runs the reply parked at `token` with `value` (on its home core).
    fn complete_reply<T: 'static>(&self, token: usize, value: T) {
        let slot = self.0.replies.borrow_mut().try_remove(token);
        let Some(slot) = slot else {
            log::warn!("reactor {}: stale reply token {token}", self.0.core);
            return;
        };
        match slot.downcast::<Reply<T>>() {
            Ok(reply) => reply(self, value),
            Err(_) => log::warn!(
                "reactor {}: reply token {token} of another type",
                self.0.core
            ),
        }
    }

    /// Replies parked on this core, waiting for their answer.
    pub fn pending_replies(&self) -> usize {
        self.0.replies.borrow().len()
    }

    /// Runs `f` on every core of the set (this one included), in parallel,
    /// then `done` on this core once all have run it (SPDK's
    /// `spdk_for_each_channel`). Control path: allocates. Cores that refuse
    /// the message (stopped, or inbox full) are skipped with a warning.
    /// Returns how many cores will run `f`.
    pub fn for_each_core(
        &self,
        f: impl Fn(&Reactor) + Send + Sync + 'static,
        done: impl FnOnce(&Reactor) + 'static,
    ) -> usize {
        let token = self.park_reply(move |r: &Reactor, ()| done(r));
        let origin = self.0.core;
        let cores = self.0.messenger.cores().to_vec();
        let f = Arc::new(f);
        // One extra count, dropped after the loop, so `done` cannot be
        // queued before every core has been asked.
        let remaining = Arc::new(AtomicUsize::new(cores.len() + 1));
        let finish = move |r: &Reactor, rem: &AtomicUsize| {
            if rem.fetch_sub(1, Ordering::AcqRel) == 1 {
                if let Err(e) = r.send(origin, move |home| home.complete_reply(token, ())) {
                    log::warn!("for_each_core completion to core {origin} lost: {e}");
                }
            }
        };
        let mut sent = 0;
        for core in cores {
            let (f, rem) = (f.clone(), remaining.clone());
            let res = self.send(core, move |r| {
                f(r);
                finish(r, &rem);
            });
            match res {
                Ok(()) => sent += 1,
                Err(e) => {
                    log::warn!("for_each_core: skipping core {core}: {e}");
                    finish(self, &remaining);
                }
            }
        }
        finish(self, &remaining);
        sent
    }

    /// This core's channel for `dev`: created on first use (on this core)
    /// and cached while anyone here holds it; dropped, on this core, with
    /// the last `Rc`.
    ///
    /// # Errors
    ///
    /// Whatever [`IoDevice::create_channel`] returns.
    pub fn channel<D: IoDevice>(&self, dev: &Arc<D>) -> Result<Rc<D::Channel>, D::Error> {
        let cached = self.0.channels.borrow().get(dev);
        if let Some(ch) = cached {
            return Ok(ch);
        }
        let ch = Rc::new(dev.create_channel(self)?);
        // `create_channel` may have asked for this very channel recursively.
        let raced = self.0.channels.borrow().get(dev);
        if let Some(existing) = raced {
            drop(ch);
            return Ok(existing);
        }
        self.0.channels.borrow_mut().insert(dev, &ch);
        Ok(ch)
    }

    /// This core's channel for `dev` if one is alive; never creates one.
    pub fn existing_channel<D: IoDevice>(&self, dev: &Arc<D>) -> Option<Rc<D::Channel>> {
        self.0.channels.borrow().get(dev)
    }

    /// Channels alive on this core.
    pub fn channel_count(&self) -> usize {
        self.0.channels.borrow().live()
    }

    /// A snapshot of this reactor's statistics (allocates: control path).
    /// From another core, use [`call`](Self::call) with `|r| r.stats()`.
    pub fn stats(&self) -> ReactorStats {
        let c = self.0.counters.get();
        let pollers = self
            .0
            .pollers
            .borrow()
            .slots
            .iter()
            .filter(|(_, s)| !s.removed)
            .map(|(k, s)| PollerStats {
                id: PollerId {
                    key: k as u32,
                    gen: s.gen,
                },
                name: s.name.clone(),
                period: s.period,
                runs: s.runs,
                busy_runs: s.busy_runs,
                busy_ns: s.busy_ns,
            })
            .collect();
        ReactorStats {
            core: self.0.core,
            loops: c.loops,
            busy_loops: c.busy_loops,
            busy_ns: c.busy_ns,
            idle_ns: c.idle_ns,
            messages: c.messages,
            sleeps: c.sleeps,
            idle_stretch_ns: self.0.hybrid.get().average_ns(),
            pollers,
        }
    }

    /// Stops this reactor: the current loop finishes, then [`run`](Self::run)
    /// tears it down on its own thread and returns. Messages sent to it from
    /// now on fail with [`SendError::Stopped`]; queued ones are dropped.
    /// Other reactors keep running; see [`stop_all`](Self::stop_all).
    pub fn stop(&self) {
        self.0.stopping.set(true);
        self.0.messenger.mark_stopped(self.0.core);
    }

    /// Stops every reactor of the set: each one stops when it handles the
    /// message (after the messages queued before it), this one at once.
    pub fn stop_all(&self) {
        for &core in self.0.messenger.cores() {
            if core != self.0.core {
                if let Err(e) = self.send(core, |r| r.stop()) {
                    log::debug!("stop_all: core {core}: {e}");
                }
            }
        }
        self.stop();
    }

    /// Tears the reactor down on its own thread: drops queued messages,
    /// every poller, pending replies, the channel cache and wake fds. Nothing
    /// is dropped with a borrow held. Idempotent.
    pub(crate) fn teardown(&self) {
        let inner = &*self.0;
        if inner.torn_down.replace(true) {
            return;
        }
        self.stop();
        let _current = CurrentGuard::enter(self);
        while let Ok(m) = inner.inbox.rx.try_recv() {
            drop(m);
        }
        // Dropping a poller may add or remove others: one at a time, bounded.
        for _ in 0..1_000_000 {
            let slot = {
                let mut t = inner.pollers.borrow_mut();
                t.any_id().and_then(|id| t.take_slot(id))
            };
            match slot {
                Some(s) => drop(s),
                None => break,
            }
        }
        inner.timers.borrow_mut().clear();
        inner.removals.borrow_mut().clear();
        for _ in 0..1_000_000 {
            let slot = {
                let mut r = inner.replies.borrow_mut();
                let key = r.iter().next().map(|(k, _)| k);
                key.and_then(|k| r.try_remove(k))
            };
            match slot {
                Some(s) => drop(s),
                None => break,
            }
        }
        inner.channels.borrow_mut().clear();
        let sleeper = inner.sleeper.borrow_mut().take();
        drop(sleeper);
        while let Ok(m) = inner.inbox.rx.try_recv() {
            drop(m);
        }
    }

    /// Whether [`teardown`](Self::teardown) ran.
    #[cfg_attr(not(any(test, feature = "test-util")), allow(dead_code))]
    pub(crate) fn is_torn_down(&self) -> bool {
        self.0.torn_down.get()
    }
}

#[cfg(test)]
mod tests;
