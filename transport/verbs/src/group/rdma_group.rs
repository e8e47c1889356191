//! [`RdmaGroup`]: what every RDMA target poll group does the same way,
//! generic over the provider, the transport's connection type and the key
//! its listeners carry.

use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pollux_reactor::{AwakeHold, PollStatus, PollerGuard, RareCheck, Reactor, WakeWatch};

use super::conn_table::ConnTable;
use super::link::GroupConn;
use super::listen_table::ListenTable;
use crate::placement::{Inbox, PlacementPolicy, Placer, Route};
use crate::provider::{CmId, CmListener, CompletionQueue, Device, PendingConn, Provider};
use crate::types::{DeviceCaps, Wc};
use crate::{CmAddr, ConnParam, ConnRequestInfo, VerbsError};

/// Completions reaped per CQ poll call.
pub const WC_BATCH: usize = 64;
/// Connect requests taken from one listener per CM round.
const ACCEPT_BURST: usize = 16;
/// CM rounds a rejected CM id is kept, so the peer reads the reject before
/// the id is destroyed.
const REJECT_HOLD_ROUNDS: u64 = 4;
/// Rounds without work before a group whose connections are all settled
/// arms its CQ and lets a sleeping reactor sleep (and at least the
/// reactor's `sleep_after` since the last work: arming earlier would only
/// make each command cost the host a descriptor write while the reactor
/// polls anyway).
const QUIET_ROUNDS: u32 = 64;
/// The longest a group with connections lets its reactor sleep without a
/// round: disconnects (CM events) and whatever else no descriptor signals
/// are seen at the next tick.
pub const SLEEP_TICK: Duration = Duration::from_millis(100);

/// One open listener of a group: its address, the transport's key, the CM
/// endpoint, and its descriptor watched by the reactor (a sleeping reactor
/// wakes for a connect request).
struct Listening<P: Provider, K> {
    addr: CmAddr,
    key: K,
    l: P::CmListener,
    /// `None` when the reactor could not watch it (logged): the group then
    /// holds the reactor awake while it listens.
    wake: Option<WakeWatch>,
}

/// How to open a poll group.
#[derive(Debug, Clone)]
pub struct GroupSpec {
    /// The transport's name in log lines (`"nvmf rdma"`, `"iser"`).
    pub label: &'static str,
    /// The verbs device; `None`: the provider's first.
    pub device: Option<String>,
    /// CQ entries (capped at the device's maximum).
    pub num_cqe: u32,
    /// Poll rounds between CM rounds (accept, connection events: system
    /// calls on the soft provider, kept off the per-I/O path).
    pub cm_period: u64,
    /// CM rounds between two checks of the listeners while the reactor is
    /// busy (see [`RareCheck`]); every CM round when it is idle.
    pub listen_period: u64,
    /// Listen backlog.
    pub backlog: u32,
}

/// Why a poll group could not open.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    /// The provider has no device.
    #[error("no {0} verbs device")]
    NoDevice(&'static str),
    /// A verbs call failed.
    #[error("{what}: {source}")]
    Verbs {
        /// What was being done.
        what: &'static str,
        /// The error.
        #[source]
        source: VerbsError,
    },
}

/// An address a group could not listen on.
#[derive(Debug, thiserror::Error)]
#[error("listen on {addr}: {source}")]
pub struct ListenError {
    /// The address.
    pub addr: CmAddr,
    /// Why.
    #[source]
    pub source: VerbsError,
}

/// Connection counters every group keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupCounters {
    /// Connect requests this group's listeners validated and handed to
    /// another group.
    pub handed_off: u64,
    /// Connect requests another group handed to this one.
    pub adopted: u64,
}

fn verbs(what: &'static str) -> impl FnOnce(VerbsError) -> GroupError {
    move |source| GroupError::Verbs { what, source }
}

/// What a transport decides when its group accepts connections
/// ([`RdmaGroup::serve_requests`]): whether a request may be served, how
/// it is rejected, and how a connection is made.
pub trait Acceptor<P: Provider, C: GroupConn<P>, K: Clone + PartialEq + Send + 'static> {
    /// Why a request is refused (the transport's reject status or reason).
    type Refusal;

    /// Check a request that arrived on one of this group's listeners,
    /// before it is placed.
    ///
    /// # Errors
    /// Why it is refused (then [`reject`](Self::reject)ed here).
    fn check(&mut self, id: &P::CmId) -> Result<(), Self::Refusal>;

    /// Where connections go.
    fn policy(&self) -> PlacementPolicy;

    /// The refusal of a request no group can take.
    fn no_group(&self) -> Self::Refusal;

    /// Refuse `id` (count it, then [`RdmaGroup::reject`] with the
    /// transport's private data).
    fn reject(&mut self, g: &mut RdmaGroup<P, C, K>, id: P::CmId, why: Self::Refusal);

    /// Make a connection of `id`, placed on this group (check it again: it
    /// may come from another group), and [`add`](RdmaGroup::add) it;
    /// `false` when it was refused (rejected or not accepted): its seat is
    /// then given back.
    fn connect(&mut self, g: &mut RdmaGroup<P, C, K>, id: P::CmId, key: K) -> bool;
}

/// One reactor's share of an RDMA target transport, less what is the
/// transport's own: the device, PD and CQ; the connection table; the CM
/// listeners this group owns, connect requests (taken, routed to a group,
/// rejected and held, adopted from other groups) and the pacing of CM work;
/// CQ reaping; closing and removing connections. The transport keeps its
/// receive queue and buffers, its connection type `C`, and the protocol:
/// what a connect request must carry, what a completion means.
///
/// A transport's poller, each round:
/// [`begin_round`](Self::begin_round);
/// [`serve_requests`](Self::serve_requests) with the transport's
/// [`Acceptor`] (or, by hand: [`sync_listeners`](Self::sync_listeners),
/// [`take_requests`](Self::take_requests), [`route`](Self::route),
/// [`adopt`](Self::adopt), [`reject`](Self::reject)); serve its
/// connections and [`reap`](Self::reap) the CQ; and
/// [`remove_with`](Self::remove_with) a closed connection once nothing of it is in
/// flight.
pub struct RdmaGroup<P: Provider, C: GroupConn<P>, K: Clone + PartialEq + Send + 'static> {
    /// The protection domain.
    pub pd: P::Pd,
    /// The CQ every connection of the group shares.
    pub cq: P::Cq,
    /// The connections.
    pub conns: ConnTable<C>,
    /// Counters.
    pub counters: GroupCounters,
    reactor: Reactor,
    index: usize,
    placer: Arc<Placer<P, K>>,
    listens: Arc<ListenTable<K>>,
    listeners: Vec<Listening<P, K>>,
    inbox: Rc<Inbox<P, K>>,
    rejected: VecDeque<(u64, P::CmId)>,
    listen_gen: u64,
    cq_reserved: u32,
    wcs: Vec<Wc>,
    rounds: u64,
    cm_period: u64,
    /// Rounds until the next CM round (a countdown: no division per round).
    until_cm: u64,
    listen: RareCheck,
    /// Held while the group has connections and its CQ is not armed,
    /// rejected ids to forget, or a connect request half-way in. Listeners
    /// alone let the reactor sleep (their descriptors wake it), and so do
    /// connections that are all settled ([`GroupConn::settled`]) once the
    /// CQ is armed: its event descriptor wakes it.
    awake: Option<AwakeHold>,
    /// The CQ's event descriptor, watched by a reactor that sleeps (`None`
    /// in busy mode, or when it could not be watched: then connections
    /// hold the reactor awake).
    cq_wake: Option<WakeWatch>,
    /// Bounds the reactor's sleeps while the group has connections.
    _tick: Option<PollerGuard>,
    /// The CQ is armed: a completion writes its event descriptor.
    armed: bool,
    /// Rounds without work in a row (up to [`QUIET_ROUNDS`]).
    quiet_rounds: u32,
    /// When the last round with work ran (the reactor's loop clock).
    last_work: Instant,
    shutting_down: bool,
    label: &'static str,
    backlog: u32,
    name: String,
    // The device last: everything above belongs to it.
    dev: P::Device,
}

impl<P: Provider, C: GroupConn<P>, K: Clone + PartialEq + Send + 'static> std::fmt::Debug
    for RdmaGroup<P, C, K>
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaGroup")
            .field("label", &self.label)
            .field("index", &self.index)
            .field("device", &self.name)
            .field("connections", &self.conns.count())
            .field("listeners", &self.listeners.len())
            .finish()
    }
}

impl<P: Provider, C: GroupConn<P>, K: Clone + PartialEq + Send + 'static> RdmaGroup<P, C, K> {
    /// Open group `index` on `reactor` (control path): the device, a PD
    /// and the CQ, and this core's inbox of `placer`. It takes no
    /// connections until [`join`](Self::join).
    ///
    /// # Errors
    /// No device, or the device, PD or CQ could not be opened.
    pub fn open(
        spec: GroupSpec,
        reactor: &Reactor,
        index: usize,
        placer: &Arc<Placer<P, K>>,
        listens: &Arc<ListenTable<K>>,
    ) -> Result<Self, GroupError> {
        let name = match spec.device {
            Some(n) => n,
            None => P::list_devices()
                .map_err(verbs("listing verbs devices"))?
                .first()
                .map(|d| d.name.clone())
                .ok_or(GroupError::NoDevice(P::NAME))?,
        };
        let dev = P::open_device(&name).map_err(verbs("opening the verbs device"))?;
        let pd = dev.alloc_pd().map_err(verbs("allocating a PD"))?;
        let cq = dev
            .create_cq(spec.num_cqe.min(dev.caps().max_cqe))
            .map_err(verbs("creating the CQ"))?;
        let (cq_wake, tick) = if reactor.idle_mode().sleeps() {
            match WakeWatch::new(reactor, cq.event_fd()) {
                Ok(w) => {
                    // A timed poller that only bounds the reactor's sleeps.
                    let tick = PollerGuard::timed(
                        reactor,
                        format!("{} sleep tick", spec.label),
                        SLEEP_TICK,
                        || PollStatus::Idle,
                    );
                    (Some(w), Some(tick))
                }
                Err(e) => {
                    log::warn!(
                        "{}: cannot watch the CQ for wake-ups ({e}): connections keep the reactor polling",
                        spec.label
                    );
                    (None, None)
                }
            }
        } else {
            (None, None)
        };
        Ok(RdmaGroup {
            pd,
            cq,
            conns: ConnTable::new(),
            counters: GroupCounters::default(),
            reactor: reactor.clone(),
            index,
            placer: Arc::clone(placer),
            listens: Arc::clone(listens),
            listeners: Vec::new(),
            inbox: placer.inbox(reactor),
            rejected: VecDeque::new(),
            listen_gen: 0,
            cq_reserved: 0,
            wcs: vec![Wc::default(); WC_BATCH],
            rounds: 0,
            cm_period: spec.cm_period.max(1),
            until_cm: 1,
            listen: RareCheck::new(spec.listen_period),
            awake: None,
            cq_wake,
            _tick: tick,
            armed: false,
            quiet_rounds: 0,
            last_work: reactor.now(),
            shutting_down: false,
            label: spec.label,
            backlog: spec.backlog,
            name,
            dev,
        })
    }

    /// Open this group's listeners and take a seat in the placement: new
    /// connections may come here from now on.
    ///
    /// # Errors
    /// As [`sync_listeners`](Self::sync_listeners) (the group joined anyway).
    pub fn join(&mut self) -> Result<(), ListenError> {
        let r = self.sync_listeners();
        self.placer.seats().join(self.index, self.reactor.core());
        r
    }

    /// The reactor.
    pub fn reactor(&self) -> &Reactor {
        &self.reactor
    }

    /// This group's index among the transport's groups.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The device.
    pub fn device(&self) -> &P::Device {
        &self.dev
    }

    /// The device's name.
    pub fn device_name(&self) -> &str {
        &self.name
    }

    /// The device's limits.
    pub fn caps(&self) -> &DeviceCaps {
        self.dev.caps()
    }

    /// CM listeners open.
    pub fn listeners(&self) -> usize {
        self.listeners.len()
    }

    /// Whether [`shutdown`](Self::shutdown) was called.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down
    }

    /// Count a poll round; `true` when it is a CM round (then also forget
    /// rejected ids the peer had time to read). Every round of a group
    /// whose CQ is armed is a CM round once the reactor was idle (it runs
    /// only when something woke it). After 64 (`QUIET_ROUNDS`) rounds without
    /// work, and the reactor's `sleep_after` since the last round with
    /// work, a group whose connections are all settled arms its CQ here,
    /// before the round reaps it (so a completion that came meanwhile is
    /// reaped now, and one that comes later signals).
    #[inline]
    pub fn begin_round(&mut self) -> bool {
        self.rounds += 1;
        self.until_cm -= 1;
        if self.quiet_rounds >= QUIET_ROUNDS && !self.armed {
            self.try_arm();
        }
        let periodic = self.until_cm == 0;
        let cm = periodic || (self.armed && !self.reactor.last_loop_busy());
        if periodic {
            self.until_cm = self.cm_period;
            let hold = REJECT_HOLD_ROUNDS * self.cm_period;
            while self
                .rejected
                .front()
                .is_some_and(|(r, _)| self.rounds - r > hold)
            {
                self.rejected.pop_front();
            }
        }
        cm
    }

    /// End a poll round (after the transport's work; `busy`: there was
    /// some). Work disarms the CQ and holds the reactor again; a round
    /// without work counts towards 64 (`QUIET_ROUNDS`), or, armed and after an
    /// idle loop of the reactor, drains an event that brought nothing (and
    /// re-arms).
    #[inline]
    pub fn end_round(&mut self, busy: bool) {
        if busy {
            self.quiet_rounds = 0;
            self.last_work = self.reactor.now();
            if self.armed {
                self.disarm();
            }
        } else if self.armed {
            // Only after an idle loop: on a reactor kept busy by others the
            // descriptor wakes nobody, and a read per loop would cost.
            if !self.reactor.last_loop_busy() {
                self.drain_event();
            }
        } else if self.quiet_rounds < QUIET_ROUNDS {
            self.quiet_rounds += 1;
        }
    }

    /// Arm the CQ and let the reactor sleep, if the group has connections,
    /// they are all settled, the reactor watches the CQ and it may sleep
    /// by now.
    #[cold]
    fn try_arm(&mut self) {
        self.quiet_rounds = 0;
        if self.cq_wake.is_none() || self.conns.count() == 0 {
            return;
        }
        let arm_after = self.reactor.idle_mode().sleep_after().unwrap_or_default();
        if self.reactor.now().saturating_duration_since(self.last_work) < arm_after {
            return;
        }
        if !self.conns.iter().all(|c| c.settled()) {
            return;
        }
        match self.cq.req_notify(false) {
            Ok(()) => {
                self.armed = true;
                self.update_awake();
            }
            Err(e) => log::warn!("{}: arming the CQ: {e}", self.label),
        }
    }

    /// Work came: the CQ is no longer armed (its event, if one came, is
    /// drained), and connections hold the reactor again.
    #[cold]
    fn disarm(&mut self) {
        self.armed = false;
        self.cq.ack_events();
        self.update_awake();
    }

    /// An armed round without work: drain the CQ's event, if there is one,
    /// and arm again (the event was one-shot).
    #[cold]
    fn drain_event(&mut self) {
        if self.cq.ack_events() {
            if let Err(e) = self.cq.req_notify(false) {
                log::warn!("{}: arming the CQ: {e}", self.label);
                self.disarm();
            }
        }
    }

    /// Whether the CQ is armed (the group lets its reactor sleep).
    pub fn is_armed(&self) -> bool {
        self.armed
    }

    /// Hold the reactor awake while the group has connections (its CQ not
    /// armed), rejected ids to forget, a connect request half-way in or a
    /// listener the reactor does not watch; let go when it has none.
    /// Checked by [`serve_requests`](Self::serve_requests), on CM rounds and
    /// after it took a connection, and when the CQ is armed or disarmed.
    fn update_awake(&mut self) {
        let want = (self.conns.count() > 0 && !self.armed)
            || !self.rejected.is_empty()
            || self
                .listeners
                .iter()
                .any(|x| x.wake.is_none() || x.l.has_partial());
        if want != self.awake.is_some() {
            self.awake = want.then(|| self.reactor.hold_awake());
        }
    }

    /// Open and close CM listeners after the transport's list changed.
    ///
    /// # Errors
    /// The first address it could not listen on (the others are open).
    pub fn sync_listeners(&mut self) -> Result<(), ListenError> {
        let gen = self.listens.generation();
        if gen == self.listen_gen || self.shutting_down {
            return Ok(());
        }
        self.listen_gen = gen;
        let want = self.listens.claim(self.index);
        self.listeners
            .retain(|o| want.iter().any(|(x, y)| *x == o.addr && *y == o.key));
        let mut first_err = Ok(());
        for (addr, key) in want {
            if self.listeners.iter().any(|o| o.addr == addr) {
                continue;
            }
            match self.dev.listen(&addr, self.backlog) {
                Ok(l) => {
                    log::info!("{}: listening on {addr}", self.label);
                    let wake = match WakeWatch::new(&self.reactor, l.wake_fd()) {
                        Ok(w) => Some(w),
                        Err(e) => {
                            log::warn!("{}: cannot watch {addr} for wake-ups: {e}", self.label);
                            None
                        }
                    };
                    self.listeners.push(Listening { addr, key, l, wake });
                }
                Err(source) => {
                    log::error!("{}: cannot listen on {addr}: {source}", self.label);
                    if first_err.is_ok() {
                        first_err = Err(ListenError { addr, source });
                    }
                }
            }
        }
        first_err
    }

    /// Connect requests waiting on this group's listeners, with their
    /// listener's key (at most 16 per listener). Call on CM rounds: it
    /// looks when the reactor was idle, once in `listen_period` calls when
    /// busy, and again at once after it found some.
    pub fn take_requests(&mut self) -> Vec<(P::CmId, K)> {
        let mut out = Vec::new();
        if !self.listen.due(&self.reactor) {
            return out;
        }
        for Listening { addr, key, l, .. } in &self.listeners {
            for _ in 0..ACCEPT_BURST {
                match l.get_request() {
                    Ok(Some(id)) => out.push((id, key.clone())),
                    Ok(None) => break,
                    Err(e) => {
                        log::warn!("{}: listener {addr}: {e}", self.label);
                        break;
                    }
                }
            }
        }
        self.listen.found(!out.is_empty());
        out
    }

    /// The connection work of one poll round: on a CM round, open and close
    /// listeners and take the requests waiting there (each checked, placed,
    /// then connected here, handed to another group or rejected); every
    /// round, connect what other groups handed to this one. Whether there
    /// was any.
    pub fn serve_requests<A: Acceptor<P, C, K>>(&mut self, cm_round: bool, a: &mut A) -> bool {
        let mut busy = false;
        if cm_round {
            // An address that cannot be listened on is logged; the others serve.
            let _ = self.sync_listeners();
            for (id, key) in self.take_requests() {
                busy = true;
                self.admit(a, id, key);
            }
        }
        while self.has_adoptions() {
            let Some((id, key)) = self.adopt() else {
                break;
            };
            busy = true;
            self.connect_placed(a, id, key);
        }
        if cm_round || busy {
            self.update_awake();
        }
        busy
    }

    /// A request on one of this group's listeners: checked here (a reject
    /// goes from here), then placed: connected here, or handed to another
    /// group's core.
    fn admit<A: Acceptor<P, C, K>>(&mut self, a: &mut A, id: P::CmId, key: K) {
        if let Err(why) = a.check(&id) {
            a.reject(self, id, why);
            return;
        }
        match self.route(id, key, a.policy()) {
            Route::Here(id, key) => self.connect_placed(a, id, key),
            Route::Sent { .. } => {}
            Route::NoGroup(id, _) => {
                let why = a.no_group();
                a.reject(self, id, why);
            }
        }
    }

    /// Connect a request placed on this group: a refused one gives its
    /// seat back (a connected one does when it is removed).
    fn connect_placed<A: Acceptor<P, C, K>>(&mut self, a: &mut A, id: P::CmId, key: K) {
        if !a.connect(self, id, key) {
            self.release_seat();
        }
    }

    /// Place a checked connect request by `policy`: [`Route::Here`]
    /// (connect it here; [`release_seat`](Self::release_seat) if that
    /// fails), [`Route::Sent`] to another group, or [`Route::NoGroup`]
    /// (reject it).
    pub fn route(&mut self, id: P::CmId, key: K, policy: PlacementPolicy) -> Route<P, K> {
        let r = self
            .placer
            .route(&self.reactor, self.index, policy, id, key);
        if matches!(r, Route::Sent { .. }) {
            self.counters.handed_off += 1;
        }
        r
    }

    /// Whether requests from other groups wait (cheap: every round).
    #[inline]
    pub fn has_adoptions(&self) -> bool {
        !self.inbox.is_empty()
    }

    /// The next request another group handed to this one, attached to this
    /// group's device (its seat is taken here: connect it, or
    /// [`release_seat`](Self::release_seat)). One that cannot be attached
    /// is dropped, which rejects it, and refused.
    pub fn adopt(&mut self) -> Option<(P::CmId, K)> {
        while let Some(h) = self.inbox.pop() {
            self.counters.adopted += 1;
            match h.req.attach(&self.dev) {
                Ok(id) => return Some((id, h.context)),
                Err(e) => {
                    log::warn!(
                        "{}: cannot attach a handed-over connect request: {e}",
                        self.label
                    );
                    self.placer.refuse(self.index);
                }
            }
        }
        None
    }

    /// Give back the seat of a request placed here that did not become a
    /// connection.
    pub fn release_seat(&self) {
        self.placer.seats().release(self.index);
    }

    /// Reject `id` with `private_data` and keep the id a few CM rounds, so
    /// the peer reads the reject before the id goes.
    pub fn reject(&mut self, id: P::CmId, private_data: &[u8]) {
        let _ = id.reject(private_data);
        self.rejected.push_back((self.rounds, id));
    }

    /// Whether `cqes` more CQ entries fit beside those reserved, with
    /// `extra` more kept free (an SRQ's receives).
    pub fn cq_fits(&self, cqes: u32, extra: u32) -> bool {
        u64::from(self.cq_reserved) + u64::from(cqes) + u64::from(extra)
            <= u64::from(self.cq.depth())
    }

    /// RDMA READs a new connection may have in flight: what the peer
    /// offers (`initiator_depth`, as CM reports it swapped), the device
    /// allows and the transport's `max` — at least 1.
    pub fn read_depth(&self, info: &ConnRequestInfo, max: u32) -> u32 {
        u32::from(info.initiator_depth)
            .min(self.caps().max_qp_init_rd_atom.max(1))
            .min(max)
            .max(1)
    }

    /// The accept parameters of a target: our private data, `read_depth`
    /// READs out, no inbound READs, retries at their maximum.
    pub fn accept_param(private_data: &[u8], read_depth: u32) -> ConnParam<'_> {
        ConnParam {
            private_data,
            responder_resources: 0,
            initiator_depth: read_depth.min(u32::from(u8::MAX)) as u8,
            retry_count: 7,
            rnr_retry_count: 7,
        }
    }

    /// Put an accepted connection in its reserved `slot` (its CQ entries
    /// are reserved from now on).
    pub fn add(&mut self, slot: u16, c: C) {
        self.cq_reserved += c.link().cqes();
        let qpn = c.link().qp_num();
        self.conns.insert(slot, qpn, c);
    }

    /// Take connection `i` out and hand it to `teardown` (drop its QP
    /// first, then what its buffers belong to; count it): its slot and CQ
    /// entries are free, and its placement seat once `teardown` has
    /// returned. So a group's seat count never drops before the
    /// connection is gone and counted: "no queue left" (loads of zero)
    /// means every connection that went is torn down. `false` when there
    /// is no connection `i`.
    pub fn remove_with(&mut self, i: usize, teardown: impl FnOnce(C)) -> bool {
        let Some(c) = self.conns.remove(i) else {
            return false;
        };
        self.cq_reserved = self.cq_reserved.saturating_sub(c.link().cqes());
        teardown(c);
        self.placer.seats().release(self.index);
        true
    }

    /// Begin closing connection `i` (idempotent): the transport's
    /// [`closing`](GroupConn::closing), then the CM disconnect and the QP
    /// to ERR.
    pub fn begin_close(&mut self, i: usize) {
        if let Some(c) = self.conns.get_mut(i) {
            if c.link().is_live() {
                c.closing();
                c.link_mut().begin_close();
            }
        }
    }

    /// Begin closing every connection.
    pub fn close_all(&mut self) {
        for i in 0..self.conns.slots() {
            self.begin_close(i);
        }
    }

    /// Stop listening, leave the placement (no new connections) and
    /// begin closing every connection.
    pub fn shutdown(&mut self) {
        self.shutting_down = true;
        self.placer.seats().leave(self.index);
        self.listeners.clear();
        self.close_all();
    }

    /// Reap the CQ, [`WC_BATCH`] completions at a time, handing each batch
    /// to `each`, until it is empty or `limit` were reaped; how many. A
    /// failed CQ closes every connection.
    #[inline]
    pub fn reap(&mut self, limit: usize, mut each: impl FnMut(&mut Self, &[Wc])) -> usize {
        let mut total = 0;
        loop {
            let mut wcs = std::mem::take(&mut self.wcs);
            let n = match self.cq.poll(&mut wcs) {
                Ok(n) => n,
                Err(e) => {
                    log::error!("{}: CQ failed ({e}); closing every connection", self.label);
                    self.close_all();
                    0
                }
            };
            each(self, &wcs[..n]);
            self.wcs = wcs;
            total += n;
            if n < WC_BATCH || total >= limit {
                return total;
            }
        }
    }
}

impl<P: Provider, C: GroupConn<P>, K: Clone + PartialEq + Send + 'static> Drop
    for RdmaGroup<P, C, K>
{
    fn drop(&mut self) {
        self.placer.seats().leave(self.index);
        // Connections first (QPs before what they use), each disconnected
        // so its peer sees the connection end.
        for mut c in self.conns.drain() {
            c.closing();
            let _ = c.link().cm.disconnect();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::{spin, Endpoint, Fixture, SoftFixture};
    use crate::group::Link;
    use crate::provider::ProtectionDomain;
    use crate::provider::QueuePair;
    use crate::soft::Soft;
    use crate::types::QpCaps;
    use crate::CmEvent;
    use crate::QpInit;
    use pollux_reactor::TestCluster;

    const FX: SoftFixture = SoftFixture::new("pollux-group-test");

    struct TestConn {
        link: Link<Soft>,
        closings: u32,
        settled: bool,
    }

    impl GroupConn<Soft> for TestConn {
        fn link(&self) -> &Link<Soft> {
            &self.link
        }
        fn link_mut(&mut self) -> &mut Link<Soft> {
            &mut self.link
        }
        fn closing(&mut self) {
            self.closings += 1;
        }
        fn settled(&self) -> bool {
            self.settled
        }
    }

    type Group = RdmaGroup<Soft, TestConn, u16>;

    fn spec(cm_period: u64) -> GroupSpec {
        GroupSpec {
            label: "test",
            device: None,
            num_cqe: 64,
            cm_period,
            listen_period: 1,
            backlog: 4,
        }
    }

    /// A group on core 0 of `cl`, joined, listening on `addr` as `key`.
    fn group(cl: &TestCluster, addr: &CmAddr, key: u16) -> (Group, Arc<Placer<Soft, u16>>) {
        let placer = Placer::<Soft, u16>::new("test");
        let listens = Arc::new(ListenTable::new());
        let index = listens.next_group();
        assert!(listens.add(addr.clone(), key));
        let mut g = cl
            .on(0, |r| Group::open(spec(4), r, index, &placer, &listens))
            .expect("the soft device opens");
        g.join().expect("listen");
        assert_eq!(g.listeners(), 1);
        (g, placer)
    }

    /// A QP on the group's CQ, without SRQ.
    fn plain_qp(g: &Group) -> <Soft as Provider>::Qp {
        g.pd.create_qp(&QpInit {
            send_cq: &g.cq,
            recv_cq: &g.cq,
            srq: None,
            caps: QpCaps::default(),
            sq_sig_all: false,
        })
        .expect("QP")
    }

    /// A peer connecting to `addr` with `data`, and its CM id.
    fn peer(addr: &CmAddr, data: &[u8]) -> (Endpoint<SoftFixture>, <Soft as Provider>::CmId) {
        let peer = Endpoint::<SoftFixture>::new(&FX, QpCaps::default(), 4096, 16);
        let id = peer
            .dev
            .connect(addr, &peer.qp, &ConnParam::with_data(data))
            .expect("connect");
        (peer, id)
    }

    /// Take requests, CM round after CM round, until one comes.
    fn next_request(g: &mut Group) -> (<Soft as Provider>::CmId, u16) {
        spin(|| {
            while !g.begin_round() {}
            g.take_requests().pop()
        })
        .expect("a connect request")
    }

    #[test]
    fn a_cm_round_comes_first_and_then_once_per_period() {
        let cl = TestCluster::new(1);
        let (mut g, _p) = group(&cl, &FX.listen_addr(), 1);
        let cm: Vec<bool> = (0..9).map(|_| g.begin_round()).collect();
        assert_eq!(
            cm,
            [true, false, false, false, true, false, false, false, true]
        );
    }

    #[test]
    fn a_request_arrives_with_its_key_is_accepted_and_is_found_by_qp_number_and_token() {
        let cl = TestCluster::new(1);
        let addr = FX.listen_addr();
        let (mut g, placer) = group(&cl, &addr, 7);
        let (_peer, peer_id) = peer(&addr, b"hi");
        let (id, key) = next_request(&mut g);
        assert_eq!(key, 7);
        let info = *id.request().expect("a request");
        assert_eq!(g.read_depth(&info, 1), 1, "capped by the transport");
        let Route::Here(id, _) = g.route(id, key, PlacementPolicy::LeastConnections) else {
            panic!("one group: it stays here");
        };
        assert_eq!(placer.seats().loads(), [1]);
        let qp = plain_qp(&g);
        assert!(g.cq_fits(60, 4) && !g.cq_fits(60, 5), "64 CQ entries");
        let (slot, gen) = g.conns.reserve().expect("a slot");
        id.accept(&qp, &Group::accept_param(b"ok", 1))
            .expect("accept");
        let qpn = qp.qp_num();
        g.add(
            slot,
            TestConn {
                link: Link::new(qp, id, 32),
                closings: 0,
                settled: false,
            },
        );
        assert!(!g.cq_fits(33, 0), "32 reserved");
        let ev = spin(|| peer_id.get_event().expect("event")).expect("established");
        assert!(matches!(ev, CmEvent::Established { .. }), "{ev:?}");
        let i = usize::from(slot);
        assert_eq!(g.conns.by_qpn(qpn), Some(i));
        assert_eq!(g.conns.by_token(slot, gen), Some(i));

        // Closing: once, whatever asks how often; the peer sees it.
        g.begin_close(i);
        g.close_all();
        let c = g.conns.get(i).expect("still there until removed");
        assert_eq!(c.closings, 1);
        assert!(!c.link.is_live());
        let ev = spin(|| peer_id.get_event().expect("event")).expect("disconnect");
        assert!(matches!(ev, CmEvent::Disconnected), "{ev:?}");

        // Removed: slot, CQ entries and seat are free, tokens stale; the
        // seat only once the teardown has run.
        let mut seats_during = None;
        assert!(g.remove_with(i, |c| {
            seats_during = Some(placer.seats().loads());
            drop(c);
        }));
        assert_eq!(seats_during, Some(vec![1]), "seat held until torn down");
        assert!(!g.remove_with(i, drop), "removed once");
        assert_eq!(placer.seats().loads(), [0]);
        assert!(g.cq_fits(64, 0));
        assert_eq!(g.conns.by_token(slot, gen), None);
        assert_eq!(g.conns.by_qpn(qpn), None);
    }

    #[test]
    fn a_rejected_request_reaches_the_peer_and_shutdown_stops_listening() {
        let cl = TestCluster::new(1);
        let addr = FX.listen_addr();
        let (mut g, placer) = group(&cl, &addr, 3);
        let (_peer, peer_id) = peer(&addr, b"x");
        let (id, _) = next_request(&mut g);
        g.reject(id, b"no");
        let ev = spin(|| peer_id.get_event().expect("event")).expect("an answer");
        assert!(matches!(ev, CmEvent::Rejected { .. }), "{ev:?}");
        g.shutdown();
        assert!(g.is_shutting_down());
        assert_eq!(g.listeners(), 0);
        assert!(g.sync_listeners().is_ok(), "a shut group opens nothing");
        assert_eq!(g.listeners(), 0);
        assert!(
            placer
                .seats()
                .place(0, PlacementPolicy::LeastConnections)
                .is_none(),
            "it left the placement"
        );
    }

    /// Refuses requests whose private data starts with `bad`; connects the
    /// others with a QP on the group's CQ.
    #[derive(Default)]
    struct TestAcceptor {
        rejected: Vec<&'static str>,
        connected: u32,
    }

    impl Acceptor<Soft, TestConn, u16> for TestAcceptor {
        type Refusal = &'static str;
        fn check(&mut self, id: &<Soft as Provider>::CmId) -> Result<(), &'static str> {
            let data = id.request().expect("a request").private_data;
            match data.as_bytes().starts_with(b"bad") {
                true => Err("bad"),
                false => Ok(()),
            }
        }
        fn policy(&self) -> PlacementPolicy {
            PlacementPolicy::LeastConnections
        }
        fn no_group(&self) -> &'static str {
            "no group"
        }
        fn reject(&mut self, g: &mut Group, id: <Soft as Provider>::CmId, why: &'static str) {
            self.rejected.push(why);
            g.reject(id, why.as_bytes());
        }
        fn connect(&mut self, g: &mut Group, id: <Soft as Provider>::CmId, _key: u16) -> bool {
            let qp = plain_qp(g);
            let Some((slot, _)) = g.conns.reserve() else {
                return false;
            };
            if id.accept(&qp, &Group::accept_param(b"", 1)).is_err() {
                g.conns.unreserve(slot);
                return false;
            }
            let link = Link::new(qp, id, 8);
            g.add(
                slot,
                TestConn {
                    link,
                    closings: 0,
                    settled: false,
                },
            );
            self.connected += 1;
            true
        }
    }

    #[test]
    fn serve_requests_rejects_what_the_acceptor_refuses_and_connects_the_rest() {
        let cl = TestCluster::new(1);
        let addr = FX.listen_addr();
        let (mut g, placer) = group(&cl, &addr, 1);
        let mut a = TestAcceptor::default();
        let (_bad, bad_id) = peer(&addr, b"bad");
        let (_good, good_id) = peer(&addr, b"good");
        let mut busy = false;
        let served = spin(|| {
            let cm_round = g.begin_round();
            busy |= g.serve_requests(cm_round, &mut a);
            (a.rejected.len() + a.connected as usize == 2).then_some(())
        });
        assert!(served.is_some(), "both requests served");
        assert!(busy);
        assert_eq!(a.rejected, ["bad"]);
        assert_eq!(g.conns.count(), 1);
        assert_eq!(
            placer.seats().loads(),
            [1],
            "only the connection holds a seat"
        );
        let ev = spin(|| bad_id.get_event().expect("event")).expect("an answer");
        assert!(matches!(ev, CmEvent::Rejected { .. }), "{ev:?}");
        let ev = spin(|| good_id.get_event().expect("event")).expect("an answer");
        assert!(matches!(ev, CmEvent::Established { .. }), "{ev:?}");
    }

    /// Whether `fd` is readable now.
    fn readable(fd: &std::os::fd::OwnedFd) -> bool {
        use rustix::event::{poll, PollFd, PollFlags};
        let mut fds = [PollFd::new(fd, PollFlags::IN)];
        poll(&mut fds, Some(&rustix::time::Timespec::default())).expect("poll") > 0
    }

    /// A group that only listens lets its reactor sleep (the listener's
    /// descriptor, which the reactor watches, says when a request comes);
    /// a connection, or a request half-way in, holds the reactor awake
    /// until it is gone.
    #[test]
    fn listening_alone_lets_the_reactor_sleep_a_connection_holds_it_awake() {
        let cl = TestCluster::new(1);
        let addr = FX.listen_addr();
        let (mut g, _placer) = group(&cl, &addr, 1);
        let r = g.reactor().clone();
        let mut a = TestAcceptor::default();
        let cm_round = |g: &mut Group, a: &mut TestAcceptor| {
            while !g.begin_round() {}
            g.serve_requests(true, a)
        };
        cm_round(&mut g, &mut a);
        assert!(!r.is_held_awake(), "listening only");
        let fd = g.listeners[0]
            .l
            .wake_fd()
            .try_clone_to_owned()
            .expect("dup");
        assert!(!readable(&fd), "no request yet");

        // A request half-way in: the socket connected, no request sent.
        let half = rustix::net::socket(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            None,
        )
        .expect("socket");
        let name = addr.0.strip_prefix('@').expect("an abstract name");
        let sa = rustix::net::SocketAddrUnix::new_abstract_name(name.as_bytes()).expect("name");
        rustix::net::connect(&half, &sa).expect("connect");
        assert!(readable(&fd), "the listener's descriptor says so");
        cm_round(&mut g, &mut a);
        assert!(g.listeners[0].l.has_partial());
        assert!(r.is_held_awake(), "a request half-way in");
        drop(half);
        cm_round(&mut g, &mut a);
        assert!(!r.is_held_awake(), "the half request went away");

        let (_peer, peer_id) = peer(&addr, b"good");
        spin(|| readable(&fd).then_some(())).expect("readable on a request");
        spin(|| {
            cm_round(&mut g, &mut a);
            (a.connected == 1).then_some(())
        })
        .expect("connected");
        assert!(r.is_held_awake(), "a connection");
        let ev = spin(|| peer_id.get_event().expect("event")).expect("an answer");
        assert!(matches!(ev, CmEvent::Established { .. }), "{ev:?}");
        let i = (0..g.conns.slots())
            .find(|&i| g.conns.get(i).is_some())
            .expect("the connection");
        g.begin_close(i);
        assert!(g.remove_with(i, drop));
        cm_round(&mut g, &mut a);
        assert!(!r.is_held_awake(), "the connection is gone");
    }

    /// One poll round of a group as a transport runs it (no connection
    /// work of its own); whether it did work.
    fn round(g: &mut Group, a: &mut TestAcceptor) -> bool {
        let cm = g.begin_round();
        let mut busy = g.serve_requests(cm, a);
        busy |= g.reap(WC_BATCH, |_, _| {}) > 0;
        g.end_round(busy);
        busy
    }

    /// A group on a TestCluster reactor in `idle`, with one connection
    /// from a peer: the group, its acceptor, the peer and the
    /// connection's index.
    fn connected(
        cl: &TestCluster,
    ) -> (
        Group,
        Arc<Placer<Soft, u16>>,
        TestAcceptor,
        Endpoint<SoftFixture>,
        usize,
    ) {
        let addr = FX.listen_addr();
        let (mut g, placer) = group(cl, &addr, 1);
        let mut a = TestAcceptor::default();
        let (peer, peer_id) = peer(&addr, b"good");
        spin(|| {
            round(&mut g, &mut a);
            (a.connected == 1).then_some(())
        })
        .expect("connected");
        let ev = spin(|| peer_id.get_event().expect("event")).expect("an answer");
        assert!(matches!(ev, CmEvent::Established { .. }), "{ev:?}");
        let i = (0..g.conns.slots())
            .find(|&i| g.conns.get(i).is_some())
            .expect("the connection");
        (g, placer, a, peer, i)
    }

    /// With its connections settled, a group arms its CQ after
    /// [`QUIET_ROUNDS`] idle rounds and lets a sleeping reactor sleep; a
    /// completion writes the CQ's descriptor (which the reactor watches),
    /// and the round that reaps it disarms the CQ and holds the reactor
    /// again. A connection that is not settled keeps the reactor polling.
    #[test]
    fn settled_connections_let_the_reactor_sleep_until_a_completion() {
        use crate::wr::{RecvWr, SendOp, SendWr};
        use crate::WrId;
        let idle = pollux_reactor::IdleMode::Adaptive {
            sleep_after: Duration::ZERO,
        };
        let cl = TestCluster::with_idle(1, idle);
        let (mut g, _placer, mut a, peer, i) = connected(&cl);
        let r = g.reactor().clone();

        for _ in 0..3 * QUIET_ROUNDS {
            round(&mut g, &mut a);
        }
        assert!(!g.is_armed(), "not settled: never armed");
        assert!(r.is_held_awake());

        g.conns.get_mut(i).expect("conn").settled = true;
        for _ in 0..=QUIET_ROUNDS + 1 {
            round(&mut g, &mut a);
        }
        assert!(g.is_armed(), "settled and idle: armed");
        assert!(!r.is_held_awake(), "the reactor may sleep");
        let efd = g.cq.event_fd().try_clone_to_owned().expect("dup");
        assert!(!readable(&efd), "no completion yet");
        // Idle rounds (the tick) leave it armed.
        round(&mut g, &mut a);
        assert!(g.is_armed() && !r.is_held_awake());

        // A signaled SEND from our side completes once the peer consumed
        // it: the peer's poll writes our CQ's descriptor.
        let ps = [peer.sge(0, 64)];
        peer.qp
            .post_recv(&[RecvWr {
                wr_id: WrId(1),
                sg_list: &ps,
            }])
            .expect("peer receive");
        g.conns
            .get(i)
            .expect("conn")
            .link
            .qp
            .post_send(&[SendWr::new(WrId(9), SendOp::Send, &[]).signaled()])
            .expect("send");
        spin(|| {
            peer.poll();
            readable(&efd).then_some(())
        })
        .expect("the CQ's descriptor is written");
        assert!(round(&mut g, &mut a), "the completion is reaped");
        assert!(!g.is_armed(), "work disarms");
        assert!(r.is_held_awake(), "and holds the reactor");
        assert!(!readable(&efd), "the event was drained");
    }

    /// A group arms its CQ only once the reactor's `sleep_after` has passed
    /// since its last work: before that the reactor polls anyway, and an
    /// armed CQ would only cost each command a descriptor write.
    #[test]
    fn a_group_arms_only_after_the_reactors_sleep_after() {
        let idle = pollux_reactor::IdleMode::Adaptive {
            sleep_after: Duration::from_millis(10),
        };
        let cl = TestCluster::with_idle(1, idle);
        let (mut g, _placer, mut a, _peer, i) = connected(&cl);
        let r = g.reactor().clone();
        g.conns.get_mut(i).expect("conn").settled = true;
        for _ in 0..3 * QUIET_ROUNDS {
            round(&mut g, &mut a);
        }
        assert!(!g.is_armed(), "idle rounds, but no time passed");
        cl.advance(Duration::from_millis(11));
        r.poll_once();
        for _ in 0..=QUIET_ROUNDS + 1 {
            round(&mut g, &mut a);
        }
        assert!(g.is_armed(), "idle for sleep_after: armed");
        assert!(!r.is_held_awake());
    }
}
