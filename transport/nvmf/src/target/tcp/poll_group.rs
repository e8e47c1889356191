//! [`TcpPollGroup`]: one reactor's share of the NVMe/TCP transport: the
//! listening sockets it owns, its connections and the poller that drives
//! them.
//!
//! Each poll: refresh the owned listeners when the transport's listener
//! generation moved (one atomic load); accept what is pending on them
//! (non-blocking) and place each new socket by the transport's
//! [`PlacementPolicy`](pollux_verbs::placement::PlacementPolicy) (fewest
//! connections first, or the listener's core): a socket for another group
//! travels by reactor message to that core's [`TcpInbox`]; adopt handed-over
//! sockets; poll every connection (receive, core, send), where a quiet
//! connection receives only once the group's [`QuietSet`] reports bytes
//! on its socket.

use std::cell::RefCell;
use std::net::{TcpListener, TcpStream};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use pollux_reactor::{AcceptPacer, PollStatus, PollerGuard, Reactor};

use super::super::qpair::QueuePair;
use super::super::transport::{QpairParams, TransportError, TransportPollGroup};
use super::conn::TcpConn;
use super::group_counter::GroupCounter;
use super::quiet::QuietSet;
use super::refusal::{Refusal, MAX_REFUSALS};
use super::transport::{TcpInbox, TcpTransport};
use super::wake;
use crate::spec::rdma_cm::ADMIN_QUEUE_MAX_DEPTH;
use crate::spec::transport_id::TransportId;

/// Sockets accepted per listener per poll at most.
const ACCEPTS_PER_POLL: usize = 16;
/// Connection reads (one per connection per poll) between two rounds of
/// `accept`: a group with `n` connections accepts once in
/// `ACCEPT_EVERY / n` polls, a group with none on a busy core (serving
/// another transport's queues, say) once in `ACCEPT_EVERY`. A failing
/// `accept` costs more than a busy poll's receive (the kernel allocates a
/// socket and an inode and frees them again, ~1.5 us on the 2-vCPU VM of
/// `docs/benchmarks.md`): tried on every poll it took 17 % of the target's
/// CPU at 512 B QD 128 over one connection. One round per 1024 reads costs
/// well under 1 % and delays a new connection by about a millisecond at
/// most (SPDK's acceptor runs every 10 ms); a round that took a connection
/// is followed by another on the next poll, so a storm of connections is
/// taken at once. See `Ctx::accept_due` for when a round comes sooner.
pub(super) const ACCEPT_EVERY: u32 = 1024;

struct GroupState {
    conns: Vec<TcpConn>,
    /// Connections beyond the limits, being answered and closed.
    refusing: Vec<Refusal>,
    listeners: Vec<(TransportId, Arc<TcpListener>)>,
    /// The listeners as wake sources of the reactor (adaptive idle mode).
    listener_wakes: Vec<pollux_reactor::WakeWatch>,
    listen_gen: u64,
    /// Accepting no more (its connections are closing).
    shutting_down: bool,
    /// Polls until the next round of `accept` is due.
    accept_in: u32,
    /// Pauses `accept` after a failure for want of descriptors or memory,
    /// and paces its log lines.
    accept_pacer: AcceptPacer,
    /// This group's `accept` rounds (in the transport's stats).
    accept_rounds: Arc<GroupCounter>,
    /// Every connection's socket, for the quiet ones: read only once their
    /// socket has bytes.
    quiet: QuietSet,
}

/// One core's NVMe/TCP poll group (`!Send`).
pub struct TcpPollGroup {
    // Removed when the group goes, after `drop` has shut its connections.
    _poller: PollerGuard,
    state: Rc<RefCell<GroupState>>,
    transport: Arc<TcpTransport>,
    reactor: Reactor,
    index: usize,
    _inbox: Rc<TcpInbox>,
}

impl std::fmt::Debug for TcpPollGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpPollGroup")
            .field("index", &self.index)
            .field("connections", &self.connections())
            .finish()
    }
}

/// What one poll of the group needs besides its state.
struct Ctx {
    transport: Arc<TcpTransport>,
    reactor: Reactor,
    index: usize,
    inbox: Rc<TcpInbox>,
}

impl TcpPollGroup {
    pub(super) fn new(t: &Arc<TcpTransport>, reactor: &Reactor, index: usize) -> Rc<Self> {
        let inbox = reactor.channel(t).unwrap_or_else(|e| match e {});
        t.seats.join(index, reactor.core());
        let state = Rc::new(RefCell::new(GroupState {
            conns: Vec::new(),
            refusing: Vec::new(),
            listeners: Vec::new(),
            listener_wakes: Vec::new(),
            listen_gen: 0,
            shutting_down: false,
            accept_in: 0,
            accept_pacer: AcceptPacer::new(),
            accept_rounds: t.stats.accept_rounds.add(),
            quiet: QuietSet::new(),
        }));
        let ctx = Ctx {
            transport: Arc::clone(t),
            reactor: reactor.clone(),
            index,
            inbox: Rc::clone(&inbox),
        };
        let weak = Rc::downgrade(&state);
        let poller = PollerGuard::active(reactor, "nvmf-tcp", move || {
            let Some(state) = weak.upgrade() else {
                return PollStatus::Idle;
            };
            let mut st = state.borrow_mut();
            PollStatus::from_work(ctx.poll(&mut st))
        });
        Rc::new(TcpPollGroup {
            _poller: poller,
            state,
            transport: Arc::clone(t),
            reactor: reactor.clone(),
            index,
            _inbox: inbox,
        })
    }

    /// Live connections on this core.
    pub fn connections(&self) -> usize {
        self.state.borrow().conns.len()
    }

    /// Connections beyond the limits this core is still answering (their
    /// sockets open until the Connect's status left or the host went).
    pub fn refusing(&self) -> usize {
        self.state.borrow().refusing.len()
    }

    /// `(SO_RCVBUF, SO_SNDBUF)` of each connection's socket, as the
    /// kernel reports them (tests and diagnostics).
    pub fn socket_buffers(&self) -> Vec<(usize, usize)> {
        self.state
            .borrow()
            .conns
            .iter()
            .filter_map(|c| c.socket_buffers())
            .collect()
    }

    /// Each connection's TCP keep-alive as the kernel reports it (tests).
    #[cfg(test)]
    pub(super) fn socket_keepalives(
        &self,
    ) -> Vec<Option<(std::time::Duration, std::time::Duration, u32)>> {
        self.state
            .borrow()
            .conns
            .iter()
            .map(|c| c.socket_keepalive())
            .collect()
    }

    /// Quiet connections: those whose socket was empty for a while, read
    /// only once the group's epoll set reports bytes on it.
    pub fn quiet_connections(&self) -> usize {
        self.state.borrow().quiet.quiet()
    }

    /// Socket reads issued over this group's live connections.
    pub fn socket_reads(&self) -> u64 {
        self.state.borrow().conns.iter().map(TcpConn::reads).sum()
    }

    /// Requests in use over this group's queues (tests: 0 once idle).
    pub fn outstanding(&self) -> usize {
        self.state
            .borrow()
            .conns
            .iter()
            .map(|c| c.queue().outstanding())
            .sum()
    }
}

impl TransportPollGroup for TcpPollGroup {
    fn transport_name(&self) -> &'static str {
        "tcp"
    }

    fn connections(&self) -> usize {
        TcpPollGroup::connections(self)
    }

    /// The listeners this group owns (it accepts on them from its poller).
    fn listeners(&self) -> usize {
        self.transport
            .lock()
            .iter()
            .filter(|e| e.owner == self.index)
            .count()
    }

    fn shutdown(&self) {
        self.transport.seats.leave(self.index);
        let mut st = self.state.borrow_mut();
        st.shutting_down = true;
        for c in &mut st.conns {
            c.shut_down();
        }
    }

    /// Take up listener changes now rather than at the next poll: a
    /// closed listener's socket is closed when this returns.
    fn apply_listeners(&self) -> Result<(), TransportError> {
        if let Ok(mut st) = self.state.try_borrow_mut() {
            st.sync_listeners(&self.transport, self.index, &self.reactor);
        }
        Ok(())
    }

    fn disconnect_listener(&self, trid: &TransportId, subnqn: Option<&str>) -> usize {
        let mut st = self.state.borrow_mut();
        let mut n = 0;
        for c in st
            .conns
            .iter_mut()
            .filter(|c| c.queue().came_through(trid, subnqn))
        {
            c.shut_down();
            n += 1;
        }
        n
    }
}

impl Drop for TcpPollGroup {
    fn drop(&mut self) {
        self.transport.seats.leave(self.index);
        let mut st = self.state.borrow_mut();
        let conns = std::mem::take(&mut st.conns);
        for mut c in conns {
            c.leave_quiet_set(&mut st.quiet);
            c.shut_down();
            // Counted before the seat goes, as below.
            self.transport
                .stats
                .destroyed
                .fetch_add(1, Ordering::Relaxed);
            self.transport.seats.release(self.index);
        }
    }
}

impl GroupState {
    /// Take up the transport's listeners this group owns when they changed
    /// (a removed one's socket closes here, with its last reference).
    fn sync_listeners(&mut self, transport: &TcpTransport, index: usize, reactor: &Reactor) {
        let gen = transport.listen_gen.load(Ordering::Acquire);
        if self.shutting_down {
            self.listener_wakes.clear();
            self.listeners.clear();
        } else if gen != self.listen_gen {
            self.listen_gen = gen;
            // A new listener is tried at once.
            self.accept_in = 0;
            self.listener_wakes.clear();
            self.listeners = transport
                .lock()
                .iter()
                .filter(|e| e.owner == index)
                .map(|e| (e.trid.clone(), Arc::clone(&e.sock)))
                .collect();
            self.listener_wakes = self
                .listeners
                .iter()
                .filter_map(|(_, l)| wake::watch(reactor, l.as_ref()))
                .collect();
        }
    }
}

impl Ctx {
    fn poll(&self, st: &mut GroupState) -> bool {
        let mut busy = false;
        st.sync_listeners(&self.transport, self.index, &self.reactor);
        if self.accept_due(st) {
            busy |= self.accept(st);
        }
        while let Some((s, trid)) = self.inbox.pop() {
            busy = true;
            if st.shutting_down {
                // Placed here before the shutdown: close it.
                self.transport.seats.release(self.index);
                self.transport.stats.refused.fetch_add(1, Ordering::Relaxed);
                drop(s);
                continue;
            }
            self.adopt(st, s, trid);
        }
        let mut i = 0;
        while i < st.refusing.len() {
            if st.refusing[i].poll() {
                busy = true;
                st.refusing.swap_remove(i);
            } else {
                i += 1;
            }
        }
        let GroupState { conns, quiet, .. } = st;
        if quiet.look_due(self.reactor.last_loop_busy()) {
            quiet.look(|i| {
                if let Some(c) = conns.get_mut(i).filter(|c| c.is_quiet()) {
                    c.mark_readable();
                }
            });
        }
        let mut i = 0;
        while i < conns.len() {
            let mut done = false;
            busy |= conns[i].poll(&mut done, quiet);
            if done {
                conns[i].leave_quiet_set(quiet);
                conns.swap_remove(i);
                if let Some(moved) = conns.get_mut(i) {
                    moved.moved_in_quiet_set(quiet, i);
                }
                // Counted before the seat goes: a transport whose groups
                // hold no queue has counted every one.
                self.transport
                    .stats
                    .destroyed
                    .fetch_add(1, Ordering::Relaxed);
                self.transport.seats.release(self.index);
                busy = true;
            } else {
                i += 1;
            }
        }
        busy
    }

    /// Whether this poll tries `accept` on the listeners: once in
    /// [`ACCEPT_EVERY`] connection reads (polls, when the group has no
    /// connection), and on every poll that follows an idle loop of the
    /// reactor when the group serves no connection (nobody on this core is
    /// served: the failing `accept` delays no one) or the reactor sleeps
    /// when idle (a reactor woken by a listener takes the connection at
    /// once). A group serving connections on a busy-polling core keeps the
    /// rare rounds even when idle: an `accept` in an idle poll would delay
    /// the next I/O that arrives (queue depth 1 above all).
    fn accept_due(&self, st: &mut GroupState) -> bool {
        if st.listeners.is_empty() || !st.accept_pacer.ready(self.reactor.now()) {
            return false;
        }
        let idle_core = !self.reactor.last_loop_busy();
        let adaptive = self.reactor.idle_mode().sleeps();
        let now = st.accept_in == 0 || (idle_core && (st.conns.is_empty() || adaptive));
        if !now {
            st.accept_in -= 1;
            return false;
        }
        // The connections that read on every poll (quiet ones do not).
        let reading = st.conns.len().saturating_sub(st.quiet.quiet());
        let n = u32::try_from(reading).unwrap_or(u32::MAX).max(1);
        st.accept_in = (ACCEPT_EVERY / n).saturating_sub(1);
        true
    }

    /// One round of `accept` on every listener this group owns; `true`
    /// when a connection came.
    fn accept(&self, st: &mut GroupState) -> bool {
        st.accept_rounds.bump();
        let mut busy = false;
        for li in 0..st.listeners.len() {
            for _ in 0..ACCEPTS_PER_POLL {
                match st.listeners[li].1.accept() {
                    Ok((s, peer)) => {
                        busy = true;
                        // More may follow: the next poll accepts again.
                        st.accept_in = 0;
                        log::debug!("nvmf tcp: connection from {peer}");
                        let trid = st.listeners[li].0.clone();
                        self.place(st, s, trid);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        self.transport
                            .stats
                            .accept_errors
                            .fetch_add(1, Ordering::Relaxed);
                        if let Some(n) = st.accept_pacer.failed(&e, self.reactor.read_clock()) {
                            log::warn!(
                                "nvmf tcp: accept failed: {e} ({n} failures since the last report{})",
                                if AcceptPacer::for_want_of_resources(&e) {
                                    "; accepting pauses, the connections wait in the backlog"
                                } else {
                                    ""
                                }
                            );
                        }
                        break;
                    }
                }
            }
        }
        busy
    }

    /// A new socket: serve it here or hand it to the group placement chose.
    fn place(&self, st: &mut GroupState, s: TcpStream, trid: TransportId) {
        let t = &self.transport;
        let Some((group, core)) = t.seats.place(self.index, t.opts.placement) else {
            t.stats.refused.fetch_add(1, Ordering::Relaxed);
            t.stats.refused_at_limit.fetch_add(1, Ordering::Relaxed);
            self.refuse(st, s);
            return;
        };
        if group == self.index {
            self.adopt(st, s, trid);
            return;
        }
        let t2 = Arc::clone(t);
        let sent = self
            .reactor
            .send(core, move |r| match r.existing_channel(&t2) {
                Some(inbox) => inbox.push(s, trid),
                None => {
                    log::warn!(
                        "nvmf tcp: no poll group on core {} for a connection",
                        r.core()
                    );
                    t2.seats.release(group);
                    t2.stats.refused.fetch_add(1, Ordering::Relaxed);
                }
            });
        if let Err(e) = sent {
            log::warn!("nvmf tcp: cannot hand a connection to core {core}: {e}");
            t.seats.release(group);
            t.stats.refused.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A socket no group has a seat for: answer its Connect with a busy
    /// status and close it ([`Refusal`]); closed at once when this group
    /// already answers [`MAX_REFUSALS`].
    fn refuse(&self, st: &mut GroupState, s: TcpStream) {
        let l = self.transport.seats.limits();
        log::warn!(
            "nvmf tcp: connection refused: limit reached (max_qpairs {}, max_qpairs_per_core {})",
            l.total,
            l.per_group
        );
        if st.refusing.len() >= MAX_REFUSALS {
            return;
        }
        let o = &self.transport.opts;
        match Refusal::new(s, o.digest, o.maxh2cdata, o.capsule_limit()) {
            Ok(mut r) => {
                r.watch(&self.reactor);
                st.refusing.push(r);
            }
            Err(e) => log::debug!("nvmf tcp: refused connection: {e}"),
        }
    }

    /// Make a connection of a socket placed on this group (its seat taken).
    fn adopt(&self, st: &mut GroupState, s: TcpStream, trid: TransportId) {
        let t = &self.transport;
        match self.open(s, trid) {
            Ok(mut c) => {
                t.stats.accepted.fetch_add(1, Ordering::Relaxed);
                c.watch(&self.reactor);
                c.join_quiet_set(&mut st.quiet, st.conns.len());
                st.conns.push(c);
            }
            Err(e) => {
                log::warn!("nvmf tcp: cannot serve a connection: {e}");
                t.seats.release(self.index);
                t.stats.refused.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn open(&self, s: TcpStream, trid: TransportId) -> Result<TcpConn, String> {
        let t = &self.transport;
        s.set_nonblocking(true).map_err(|e| e.to_string())?;
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        let sock = socket2::SockRef::from(&s);
        if t.opts.sock_priority > 0 {
            sock.set_priority(u32::from(t.opts.sock_priority))
                .map_err(|e| format!("SO_PRIORITY: {e}"))?;
        }
        if t.opts.recv_buf_size > 0 {
            sock.set_recv_buffer_size(t.opts.recv_buf_size as usize)
                .map_err(|e| format!("SO_RCVBUF: {e}"))?;
        }
        if t.opts.send_buf_size > 0 {
            sock.set_send_buffer_size(t.opts.send_buf_size as usize)
                .map_err(|e| format!("SO_SNDBUF: {e}"))?;
        }
        if let Some(k) = &t.opts.keepalive {
            let ka = socket2::TcpKeepalive::new()
                .with_time(k.idle)
                .with_interval(k.interval)
                .with_retries(k.probes);
            sock.set_tcp_keepalive(&ka)
                .map_err(|e| format!("TCP keep-alive: {e}"))?;
        }
        // Admin or I/O queue: the Connect will say. An admin queue takes
        // up to 32 entries (Linux asks for 32) whatever the I/O limit,
        // which the Connect of an I/O queue is checked against.
        let params = QpairParams {
            depth: t.opts.max_queue_depth.max(ADMIN_QUEUE_MAX_DEPTH),
            in_capsule_data_size: t.opts.capsule_limit(),
            listener: trid,
            qid: None,
            io_queue_depth: t.opts.max_queue_depth,
        };
        let target = t.target.upgrade().ok_or("the target is gone")?;
        let qp = QueuePair::new(&target, &self.reactor, params).map_err(|e| e.to_string())?;
        Ok(TcpConn::new(s, qp, t))
    }
}
