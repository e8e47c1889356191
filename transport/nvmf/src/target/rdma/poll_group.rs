//! [`RdmaPollGroup`]: one per reactor. It owns, per device, one PD, one CQ
//! shared by all its queues, one SRQ (unless `no_srq`) and the receive
//! buffers; the CM listeners assigned to its core; and its connections.
//! One poller drives everything: accept; poll each queue, answering the
//! bdev completions of the last round, and post its WRs; reap the CQ and
//! feed its capsules to the core; post what they queued and the
//! SRQ receives; destroy closed queues on this core. Answering before
//! reaping lets the host read a batch of responses while this core parses
//! the next capsules, instead of the two taking turns.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use pollux_reactor::{PollStatus, PollerId, RareCheck, Reactor};
use pollux_verbs::recv_repost::RecvRepost;
use pollux_verbs::{provider::PendingConn as _, ConnRequestInfo};
use pollux_verbs::{
    Access, CmEvent, CmId, CmListener, CompletionQueue, ConnParam, Device, ProtectionDomain,
    Provider, QpAttr, QpCaps, QpInit, QpState, QueuePair as _, SharedRecvQueue, Wc, WcOpcode,
    WcStatus,
};

use super::super::error::CapsuleError;
use super::super::qpair::QueuePair;
use super::super::transport::{QpairParams, ReqTag, TransportError};
use super::conn::{Conn, ConnIo, ConnState, MrTable, RdmaOps};
use super::handoff::{self, Handoff, Inbox};
use super::options::{QueuePlacement, RdmaOptions};
use super::recv_bufs::RecvBufs;
use super::transport::{cm_addr, RdmaTransport};
use super::wrid::{Token, WrKind};
use crate::spec::cmd::SQE_SIZE;
use crate::spec::rdma_cm::{CmAccept, CmReject, CmRejectStatus, CmRequest};
use crate::spec::transport_id::TransportId;

/// Completions reaped per CQ poll call.
const WC_BATCH: usize = 64;
/// Most completions reaped in one poll round.
const WC_ROUND: usize = 256;
/// Poll rounds between CM checks (accept, connection events): those are
/// system calls on the soft provider, kept off the per-I/O path.
const CM_PERIOD: u64 = 32;
/// CM rounds between two checks of the listeners while the reactor is
/// busy (see [`RareCheck`]; a failing `accept` is a system call on the soft
/// provider): about every 1024 polls.
const LISTEN_PERIOD: u64 = 32;

/// Counters of one poll group (data path: plain integers, read on its core).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PollGroupStats {
    /// Live connections.
    pub connections: usize,
    /// Connect requests this group's listeners validated and handed to
    /// another group (queue placement).
    pub handed_off: u64,
    /// Connect requests another group handed to this one.
    pub adopted: u64,
    /// Capsules received.
    pub capsules: u64,
    /// Capsules queued because the host ran ahead of its queue's free
    /// requests (handed to the core when one frees).
    pub capsules_queued: u64,
    /// Transfers the transport answered `Busy` (send queue or READ credits
    /// exhausted; the core retried them).
    pub transport_busy: u64,
    /// Requests the core parked (data buffer pool empty, transport busy,
    /// bdev full), summed over live and destroyed queues.
    pub core_parked: u64,
    /// `post_send` batches (doorbells).
    pub doorbells: u64,
    /// Completions with an error status (flushes included).
    pub wc_errors: u64,
    /// Receive buffers of this group free or posted (all of them when no
    /// queue holds one).
    pub recv_buffers_idle: usize,
    /// Receive buffers in total.
    pub recv_buffers: usize,
    /// Commands whose in-capsule data was used in place (the receive
    /// buffer lent to the request and the bdev), over the live queues.
    pub icd_lent: u64,
    /// In-capsule data copied into a request buffer (only an SGL offset
    /// other than 0 does that here), over the live queues.
    pub icd_copies: u64,
}

pub(crate) struct Shared<P: Provider> {
    pub(crate) transport: Arc<RdmaTransport<P>>,
    reactor: Reactor,
    index: usize,
    pd: P::Pd,
    cq: P::Cq,
    srq: Option<P::Srq>,
    mrs: MrTable<P>,
    /// Command slots and lendable in-capsule data buffers.
    recvs: RecvBufs,
    /// The connection of the last SRQ receive (checked against the QP
    /// number before use: no hash lookup per capsule in the common case).
    hot_conn: usize,
    /// Receive buffers not owned by a queue (no SRQ).
    free_recvs: Vec<u32>,
    /// SRQ receives to post at the end of the poll.
    recv_repost: RecvRepost,
    conns: Vec<Option<Conn<P>>>,
    gens: Vec<u16>,
    free_slots: Vec<u16>,
    by_qpn: HashMap<u32, u16>,
    listeners: Vec<(TransportId, P::CmListener)>,
    /// Connect requests other groups handed to this one.
    inbox: Rc<Inbox<P>>,
    /// Rejected CM ids, kept for a few CM rounds so the host reads the
    /// reject before the connection closes.
    rejected: VecDeque<(u64, P::CmId)>,
    listen_gen: u64,
    cq_reserved: u32,
    wcs: Vec<Wc>,
    rounds: u64,
    /// When a CM round checks the listeners.
    listen: RareCheck,
    stats: PollGroupStats,
    shutting_down: bool,
    // The device last: everything above belongs to it.
    dev: P::Device,
}

/// The per-reactor half of the RDMA transport (see the module docs).
pub struct RdmaPollGroup<P: Provider> {
    state: Rc<RefCell<Shared<P>>>,
    reactor: Reactor,
    poller: PollerId,
}

impl<P: Provider> std::fmt::Debug for RdmaPollGroup<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaPollGroup")
            .field("stats", &self.stats())
            .finish()
    }
}

fn no_res(what: &str, e: impl std::fmt::Display) -> TransportError {
    TransportError::NoResources(format!("{what}: {e}"))
}

impl<P: Provider> RdmaPollGroup<P> {
    pub(crate) fn new(
        t: &Arc<RdmaTransport<P>>,
        reactor: &Reactor,
        index: usize,
    ) -> Result<Rc<Self>, TransportError> {
        let opts = &t.opts;
        let target = t
            .target
            .upgrade()
            .ok_or_else(|| TransportError::Other("the target is gone".into()))?;
        let topts = target.options();
        let name = match &opts.device {
            Some(n) => n.clone(),
            None => P::list_devices()
                .map_err(|e| no_res("listing verbs devices", e))?
                .first()
                .map(|d| d.name.clone())
                .ok_or_else(|| {
                    TransportError::NoResources(format!("no {} verbs device", P::NAME))
                })?,
        };
        let dev = P::open_device(&name).map_err(|e| no_res("opening the verbs device", e))?;
        let caps = dev.caps().clone();
        let pd = dev.alloc_pd().map_err(|e| no_res("allocating a PD", e))?;
        let cq = dev
            .create_cq(opts.num_cqe.min(caps.max_cqe))
            .map_err(|e| no_res("creating the CQ", e))?;
        let nrecv = opts.max_srq_depth.min(if opts.no_srq {
            u32::MAX
        } else {
            caps.max_srq_wr
        }) as usize;
        let buf_size = RdmaOptions::recv_buf_size(topts);
        let mut recvs = RecvBufs::new(nrecv, topts.in_capsule_data_size as usize, opts.hugepages)
            .map_err(|e| no_res("allocating receive buffers", e))?;
        let srq = if opts.no_srq {
            None
        } else {
            Some(
                pd.create_srq(nrecv as u32, recvs.sges_per_recv())
                    .map_err(|e| no_res("creating the SRQ", e))?,
            )
        };
        let mut mrs = MrTable::<P>(Vec::new());
        let slot_arenas = target.slot_pool().map(|p| p.arenas());
        for a in recvs
            .arenas()
            .iter()
            .chain(target.data_pool().arenas())
            .chain(slot_arenas.into_iter().flatten())
        {
            if mrs.lkey(a.id()).is_none() {
                let mr = pd
                    .reg_mr(a, 0, a.len(), Access::LOCAL_WRITE)
                    .map_err(|e| no_res("registering buffers", e))?;
                mrs.0.push((a.id(), mr));
            }
        }
        recvs.set_lkeys(|id| mrs.lkey(id));
        t.stats
            .recv_memory
            .fetch_add((nrecv * buf_size) as u64, Ordering::Relaxed);
        log::info!(
            "nvmf rdma: poll group {index} on core {:?}: device {name}, {} receive buffers of {buf_size} B ({} KiB), {}",
            reactor.core(),
            nrecv,
            nrecv * buf_size / 1024,
            if opts.no_srq { "per-queue receive queues" } else { "shared receive queue" }
        );
        let mut sh = Shared {
            transport: Arc::clone(t),
            reactor: reactor.clone(),
            index,
            pd,
            cq,
            srq,
            mrs,
            recvs,
            hot_conn: 0,
            free_recvs: if opts.no_srq {
                (0..nrecv as u32).rev().collect()
            } else {
                Vec::new()
            },
            recv_repost: RecvRepost::with_capacity(nrecv),
            conns: Vec::new(),
            gens: Vec::new(),
            free_slots: Vec::new(),
            by_qpn: HashMap::new(),
            listeners: Vec::new(),
            inbox: t.placer.inbox(reactor),
            rejected: VecDeque::new(),
            listen_gen: 0,
            cq_reserved: 0,
            wcs: vec![Wc::default(); WC_BATCH],
            rounds: 0,
            listen: RareCheck::new(LISTEN_PERIOD),
            stats: PollGroupStats {
                recv_buffers: nrecv,
                ..PollGroupStats::default()
            },
            shutting_down: false,
            dev,
        };
        if sh.srq.is_some() {
            sh.recv_repost.extend(0..nrecv as u32);
            sh.post_srq()
                .map_err(|e| no_res("posting SRQ receives", e))?;
        }
        sh.sync_listeners()?;
        t.placer.seats().join(index, reactor.core());
        let state = Rc::new(RefCell::new(sh));
        let weak = Rc::downgrade(&state);
        let poller = reactor.add_poller("nvmf-rdma", move || {
            let Some(s) = weak.upgrade() else {
                return PollStatus::Idle;
            };
            let Ok(mut s) = s.try_borrow_mut() else {
                return PollStatus::Idle;
            };
            s.poll()
        });
        Ok(Rc::new(RdmaPollGroup {
            state,
            reactor: reactor.clone(),
            poller,
        }))
    }

    /// Counters (call on this group's core).
    pub fn stats(&self) -> PollGroupStats {
        self.state
            .try_borrow()
            .map(|s| s.snapshot())
            .unwrap_or_default()
    }

    /// CM listeners this group has open (listeners are opened by the
    /// group's poller after [`TargetTransport::listen`](super::super::TargetTransport::listen)).
    pub fn listeners(&self) -> usize {
        self.state
            .try_borrow()
            .map(|s| s.listeners.len())
            .unwrap_or(0)
    }

    /// Live connections.
    pub fn connections(&self) -> usize {
        self.stats().connections
    }

    /// Stop listening and disconnect every queue (hosts see a clean
    /// disconnect); the queues are destroyed by the next polls. Poll until
    /// [`connections`](Self::connections) is 0 before dropping the group.
    pub fn shutdown(&self) {
        if let Ok(mut s) = self.state.try_borrow_mut() {
            s.shutting_down = true;
            s.transport.placer.seats().leave(s.index);
            s.listeners.clear();
            for i in 0..s.conns.len() {
                s.begin_close(i);
            }
        }
    }
}

impl<P: Provider> RdmaPollGroup<P> {
    /// Open and close this group's CM listeners now (as its poller does
    /// every few rounds) after the transport's list changed.
    ///
    /// # Errors
    ///
    /// The address it could not listen on.
    pub fn apply_listeners(&self) -> Result<(), TransportError> {
        match self.state.try_borrow_mut() {
            Ok(mut s) => s.sync_listeners(),
            // Inside this group's own poll: it syncs there.
            Err(_) => Ok(()),
        }
    }

    /// Start closing the queues that came in through the listener `trid`
    /// (of subsystem `subnqn` only, when given: see
    /// [`QueuePair::came_through`](crate::target::QueuePair::came_through))
    /// with a CM disconnect, as [`shutdown`](Self::shutdown) does for all;
    /// the next polls destroy them and return their receive buffers,
    /// requests and seats. Returns how many.
    pub fn disconnect_listener(&self, trid: &TransportId, subnqn: Option<&str>) -> usize {
        let Ok(mut s) = self.state.try_borrow_mut() else {
            return 0;
        };
        let hit: Vec<usize> = s
            .conns
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                c.as_ref()
                    .filter(|c| c.core.came_through(trid, subnqn))
                    .map(|_| i)
            })
            .collect();
        for &i in &hit {
            s.begin_close(i);
        }
        hit.len()
    }
}

impl<P: Provider> Drop for RdmaPollGroup<P> {
    fn drop(&mut self) {
        self.reactor.remove_poller(self.poller);
        if let Ok(mut s) = self.state.try_borrow_mut() {
            s.transport.placer.seats().leave(s.index);
            // Destroy what is left on this core: QPs first, then the rest.
            for c in s.conns.iter_mut() {
                if let Some(c) = c.as_mut() {
                    c.io.closing = true;
                    let _ = c.cm.disconnect();
                }
            }
            s.conns.clear();
            s.by_qpn.clear();
        }
    }
}

impl<P: Provider> Shared<P> {
    fn snapshot(&self) -> PollGroupStats {
        let mut st = self.stats;
        st.connections = self.conns.iter().flatten().count();
        for c in self.conns.iter().flatten() {
            let qs = c.core.stats();
            st.transport_busy += c.io.busy;
            st.doorbells += c.io.doorbells;
            st.core_parked += qs.parked;
            st.icd_lent += qs.icd_lent;
            st.icd_copies += qs.icd_copies;
        }
        let slots_idle = if self.srq.is_some() {
            self.recv_repost.posted() + self.recv_repost.waiting()
        } else {
            self.free_recvs.len()
        };
        // A slot is only as idle as the data buffers: lent ones are not.
        st.recv_buffers_idle = self
            .recvs
            .data_idle()
            .map_or(slots_idle, |d| d.min(slots_idle));
        st
    }

    /// Create or drop CM listeners when the transport's list changed.
    fn sync_listeners(&mut self) -> Result<(), TransportError> {
        let gen = self.transport.listen_gen.load(Ordering::Acquire);
        if gen == self.listen_gen || self.shutting_down {
            return Ok(());
        }
        self.listen_gen = gen;
        let mut want = Vec::new();
        {
            let mut l = self.transport.lock();
            for e in l.iter_mut() {
                let owner = *e.owner.get_or_insert(self.index);
                if owner == self.index {
                    want.push(e.trid.clone());
                }
            }
        }
        self.listeners.retain(|(t, _)| want.contains(t));
        let mut first_err = Ok(());
        for t in want {
            if self.listeners.iter().any(|(x, _)| *x == t) {
                continue;
            }
            match self
                .dev
                .listen(&cm_addr(&t), self.transport.opts.acceptor_backlog)
            {
                Ok(l) => {
                    log::info!("nvmf rdma: listening on {}", cm_addr(&t));
                    self.listeners.push((t, l));
                }
                Err(e) => {
                    log::error!("nvmf rdma: cannot listen on {}: {e}", cm_addr(&t));
                    if first_err.is_ok() {
                        first_err = Err(TransportError::Other(format!(
                            "listen on {}: {e}",
                            cm_addr(&t)
                        )));
                    }
                }
            }
        }
        first_err
    }

    fn poll(&mut self) -> PollStatus {
        let mut busy = false;
        self.rounds += 1;
        let cm_round = self.rounds % CM_PERIOD == 1;
        if cm_round {
            while self
                .rejected
                .front()
                .is_some_and(|(r, _)| self.rounds - r > 4 * CM_PERIOD)
            {
                self.rejected.pop_front();
            }
            let _ = self.sync_listeners();
            if self.listen.due(&self.reactor) {
                let took = self.accept();
                self.listen.found(took);
                busy |= took;
            }
        }
        if !self.inbox.is_empty() {
            busy |= self.adopt();
        }
        // Responses first: the bdev completions of the capsules reaped in
        // the previous round are answered and posted before this round's
        // capsules are parsed, so the host works on them while this core
        // works on the next batch (not after it).
        for i in 0..self.conns.len() {
            busy |= self.service(i, cm_round);
        }
        busy |= self.poll_cq();
        // What the new capsules queued (RDMA READs, immediate responses).
        for i in 0..self.conns.len() {
            busy |= self.flush_conn(i);
        }
        if !self.recv_repost.is_empty() {
            if let Err(e) = self.post_srq() {
                log::error!("nvmf rdma: SRQ post failed: {e}");
            }
        }
        PollStatus::from_work(busy)
    }

    fn post_srq(&mut self) -> Result<(), pollux_verbs::PostError> {
        let Shared {
            recv_repost,
            recvs,
            srq,
            ..
        } = self;
        let Some(srq) = srq else {
            return Ok(());
        };
        // No data buffer at hand: that receive and the rest wait for a lent one.
        recv_repost.post::<2>(|id, e| recvs.sges(id, e), |wrs| srq.post_recv(wrs))
    }

    /// Accept or reject pending connect requests on this group's listeners.
    fn accept(&mut self) -> bool {
        let mut busy = false;
        for li in 0..self.listeners.len() {
            for _ in 0..16 {
                let req = match self.listeners[li].1.get_request() {
                    Ok(Some(id)) => id,
                    Ok(None) => break,
                    Err(e) => {
                        log::warn!("nvmf rdma: listener error: {e}");
                        break;
                    }
                };
                busy = true;
                let trid = self.listeners[li].0.clone();
                self.admit(req, trid);
            }
        }
        busy
    }

    /// A connect request on one of this group's listeners: validate it
    /// here (a reject carries its status), then place its queue: here, or
    /// handed to another group's core.
    fn admit(&mut self, id: P::CmId, trid: TransportId) {
        let t = Arc::clone(&self.transport);
        let Some(target) = t.target.upgrade() else {
            self.reject(id, CmRejectStatus::NoResources);
            return;
        };
        if let Err(st) = check_request(id.request(), target.options().max_queue_depth) {
            log::debug!("nvmf rdma: connect rejected: {st:?}");
            self.reject(id, st);
            return;
        }
        let place = t.placer.seats().place(self.index, t.opts.placement);
        let (group, core) = match place {
            Some((g, c)) if g != self.index => (g, c),
            Some(_) => {
                self.connect_placed(id, trid);
                return;
            }
            None => {
                self.reject(id, CmRejectStatus::NoResources);
                return;
            }
        };
        match id.detach() {
            Ok(req) => {
                self.stats.handed_off += 1;
                log::debug!(
                    "nvmf rdma: connect request handed from core {:?} to core {core}",
                    self.reactor.core()
                );
                handoff::send(
                    &t,
                    &self.reactor,
                    group,
                    core,
                    Handoff { req, context: trid },
                );
            }
            Err(e) => {
                // Serve it here after all: move its seat.
                log::warn!("nvmf rdma: {e}; serving the queue on this core");
                t.placer.seats().release(group);
                if t.placer
                    .seats()
                    .place(self.index, QueuePlacement::ListenerCore)
                    .is_some()
                {
                    self.connect_placed(e.id, trid);
                } else {
                    self.reject(e.id, CmRejectStatus::NoResources);
                }
            }
        }
    }

    /// Requests other groups handed to this one: attach each to this
    /// group's device and connect it here.
    fn adopt(&mut self) -> bool {
        let mut busy = false;
        while let Some(Handoff { req, context: trid }) = self.inbox.pop() {
            busy = true;
            self.stats.adopted += 1;
            match req.attach(&self.dev) {
                Ok(id) => self.connect_placed(id, trid),
                Err(e) => {
                    // Dropping the request rejected it.
                    log::warn!("nvmf rdma: cannot attach a handed-over connect request: {e}");
                    handoff::refused(&self.transport, self.index);
                }
            }
        }
        busy
    }

    /// [`Self::connect`] for a request placed on this group: a refused one
    /// gives its seat back (a connected one does when it is destroyed).
    fn connect_placed(&mut self, id: P::CmId, trid: TransportId) {
        if let Err(st) = self.connect(id, trid) {
            log::debug!("nvmf rdma: connect rejected: {st:?}");
            self.transport.placer.seats().release(self.index);
        }
    }

    fn reject(&mut self, id: P::CmId, st: CmRejectStatus) -> CmRejectStatus {
        let s = &self.transport.stats;
        s.rejected.fetch_add(1, Ordering::Relaxed);
        if st == CmRejectStatus::NoResources {
            s.rejected_no_resources.fetch_add(1, Ordering::Relaxed);
        }
        let _ = id.reject(&CmReject::new(st).encode());
        self.rejected.push_back((self.rounds, id));
        st
    }

    /// One connect request: validate the private data, size the queue,
    /// create the QP and the core's queue, post receives, accept.
    fn connect(&mut self, id: P::CmId, trid: TransportId) -> Result<(), CmRejectStatus> {
        let t = Arc::clone(&self.transport);
        let Some(target) = t.target.upgrade() else {
            return Err(self.reject(id, CmRejectStatus::NoResources));
        };
        let topts = target.options();
        let (info, req) = match check_request(id.request(), topts.max_queue_depth) {
            Ok(v) => v,
            Err(st) => return Err(self.reject(id, st)),
        };
        if self.shutting_down {
            return Err(self.reject(id, CmRejectStatus::NoResources));
        }
        let depth = if req.qid == 0 {
            req.hsqsize + 1
        } else {
            (req.hsqsize + 1)
                .min(req.hrqsize)
                .min(topts.max_queue_depth)
        };
        let caps = self.dev.caps().clone();
        let max_sge = caps.max_sge.clamp(1, 16);
        let requests = RdmaOptions::requests_per_queue(depth);
        let sq = RdmaOptions::send_wrs_per_queue(topts, requests, max_sge).min(caps.max_qp_wr);
        let cqes = t.opts.cqes_per_queue(topts, depth, max_sge);
        let srq_cqes = if self.srq.is_some() {
            self.recvs.len() as u32
        } else {
            0
        };
        if self.cq_reserved + cqes + srq_cqes > self.cq.depth()
            || (self.srq.is_none() && self.free_recvs.len() < usize::from(depth))
            || (self.free_slots.is_empty() && self.conns.len() >= usize::from(u16::MAX - 1))
        {
            return Err(self.reject(id, CmRejectStatus::NoResources));
        }
        let qp = match self.pd.create_qp(&QpInit {
            send_cq: &self.cq,
            recv_cq: &self.cq,
            srq: self.srq.as_ref(),
            caps: QpCaps {
                max_send_wr: sq,
                max_recv_wr: if self.srq.is_some() {
                    1
                } else {
                    u32::from(depth)
                },
                max_send_sge: max_sge,
                max_recv_sge: self.recvs.sges_per_recv(),
                max_inline_data: 16,
            },
            sq_sig_all: false,
        }) {
            Ok(q) => q,
            Err(e) => {
                log::warn!("nvmf rdma: cannot create a QP: {e}");
                return Err(self.reject(id, CmRejectStatus::NoResources));
            }
        };
        let params = QpairParams {
            depth,
            in_capsule_data_size: if req.qid == 0 {
                0
            } else {
                topts.in_capsule_data_size
            },
            listener: trid,
            qid: Some(req.qid),
        };
        let core = match QueuePair::with_requests(&target, &self.reactor, params, requests) {
            Ok(c) => c,
            Err(e) => {
                log::warn!("nvmf rdma: cannot create the queue: {e}");
                return Err(self.reject(id, CmRejectStatus::NoResources));
            }
        };
        let slot = match self.free_slots.pop() {
            Some(s) => s,
            None => {
                self.conns.push(None);
                self.gens.push(0);
                (self.conns.len() - 1) as u16
            }
        };
        let gen = self.gens[usize::from(slot)];
        let rd = u32::from(info.initiator_depth)
            .min(caps.max_qp_init_rd_atom.max(1))
            .min(u32::from(t.opts.max_read_depth))
            .max(1);
        let mut conn: Conn<P> = Conn {
            qp_num: qp.qp_num(),
            qp,
            cm: id,
            core,
            io: ConnIo::new(
                slot,
                gen,
                requests,
                sq,
                rd,
                max_sge,
                t.opts.send_with_invalidate,
            ),
            qid: req.qid,
            own_recvs: Vec::new(),
            backlog: VecDeque::with_capacity(usize::from(depth)),
            state: ConnState::Live,
            cqes,
        };
        if self.srq.is_none() {
            let n = usize::from(depth);
            let at = self.free_recvs.len() - n;
            conn.own_recvs = self.free_recvs.split_off(at);
            let ok = conn.qp.modify(&QpAttr::to(QpState::Init)).is_ok()
                && post_own_rq(&mut conn, &mut self.recvs).is_ok();
            if !ok {
                self.free_recvs.append(&mut conn.own_recvs);
                self.free_slots.push(slot);
                let st = self.reject(conn.cm, CmRejectStatus::NoResources);
                return Err(st);
            }
        }
        let rep = CmAccept {
            recfmt: 0,
            crqsize: depth,
        }
        .encode();
        let param = ConnParam {
            private_data: &rep,
            responder_resources: 0,
            initiator_depth: rd as u8,
            retry_count: 7,
            rnr_retry_count: 7,
        };
        if let Err(e) = conn.cm.accept(&conn.qp, &param) {
            log::warn!("nvmf rdma: accept failed: {e}");
            drop(conn.qp);
            self.free_recvs.append(&mut conn.own_recvs);
            self.free_slots.push(slot);
            t.stats.rejected.fetch_add(1, Ordering::Relaxed);
            return Err(CmRejectStatus::NoResources);
        }
        self.cq_reserved += cqes;
        self.by_qpn.insert(conn.qp_num, slot);
        log::debug!(
            "nvmf rdma: accepted qid {} depth {depth} on core {:?}",
            req.qid,
            self.reactor.core()
        );
        self.conns[usize::from(slot)] = Some(conn);
        t.stats.accepted.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Reap the CQ, [`WC_BATCH`] completions at a time, until it is empty
    /// (or [`WC_ROUND`] were reaped).
    fn poll_cq(&mut self) -> bool {
        let mut total = 0;
        loop {
            let mut wcs = std::mem::take(&mut self.wcs);
            let n = match self.cq.poll(&mut wcs) {
                Ok(n) => n,
                Err(e) => {
                    log::error!("nvmf rdma: CQ failed ({e}); closing every queue of this group");
                    for i in 0..self.conns.len() {
                        self.begin_close(i);
                    }
                    0
                }
            };
            // Send-side completions first: a response SEND retired here
            // frees its request for a capsule of the same batch (a host
            // reuses a command slot as soon as it has the response, often
            // before this side saw the SEND complete), so that capsule
            // runs now instead of waiting in the backlog.
            for wc in &wcs[..n] {
                let tok = Token::decode(wc.wr_id);
                if tok.kind != WrKind::Recv {
                    self.completion(wc, tok);
                }
            }
            for wc in &wcs[..n] {
                let tok = Token::decode(wc.wr_id);
                if tok.kind == WrKind::Recv {
                    self.completion(wc, tok);
                }
            }
            self.wcs = wcs;
            total += n;
            if n < WC_BATCH || total >= WC_ROUND {
                return total > 0;
            }
        }
    }

    fn conn_of(&self, tok: &Token) -> Option<usize> {
        let i = usize::from(tok.conn);
        let c = self.conns.get(i)?.as_ref()?;
        (c.io.gen & 0x3FFF == tok.gen).then_some(i)
    }

    /// One work completion, `tok` its decoded token.
    fn completion(&mut self, wc: &Wc, tok: Token) {
        let ok = wc.status == WcStatus::Success;
        if !ok {
            self.stats.wc_errors += 1;
        }
        match tok.kind {
            WrKind::Recv => self.recv_done(wc, &tok, ok),
            WrKind::Send | WrKind::Read | WrKind::Data => {
                let Some(i) = self.conn_of(&tok) else {
                    return;
                };
                let tag = ReqTag::from_u64(u64::from(tok.index));
                let Shared { conns, mrs, pd, .. } = self;
                let Some(c) = conns[i].as_mut() else {
                    return;
                };
                match tok.kind {
                    WrKind::Send => {
                        let core = &mut c.core;
                        c.io.sends_done(tag, |t| {
                            core.response_sent(t);
                        });
                    }
                    WrKind::Read => {
                        c.io.read_done(tag);
                        let res = if ok {
                            Ok(())
                        } else {
                            Err(TransportError::Disconnected)
                        };
                        let mut ops = RdmaOps {
                            io: &mut c.io,
                            shared: mrs,
                            pd,
                        };
                        c.core.transfer_done(tag, res, &mut ops);
                    }
                    _ => {}
                }
                if !ok && wc.status != WcStatus::WrFlushErr {
                    log::debug!(
                        "nvmf rdma: qid {} work request failed: {:?}",
                        c.qid,
                        wc.status
                    );
                    self.begin_close(i);
                }
            }
        }
    }

    fn recv_done(&mut self, wc: &Wc, tok: &Token, ok: bool) {
        let id = tok.index;
        let srq = self.srq.is_some();
        let conn = if srq {
            self.recv_repost.completed();
            let hot = self.hot_conn;
            let hit = self
                .conns
                .get(hot)
                .and_then(|c| c.as_ref())
                .is_some_and(|c| c.qp_num == wc.qp_num);
            if hit {
                Some(hot)
            } else {
                let found = self.by_qpn.get(&wc.qp_num).map(|&s| usize::from(s));
                if let Some(i) = found {
                    self.hot_conn = i;
                }
                found
            }
        } else {
            self.conn_of(tok)
        };
        let Some(i) = conn else {
            if srq {
                self.recv_repost.push(id);
            }
            return;
        };
        let Shared {
            conns,
            recvs,
            mrs,
            pd,
            recv_repost,
            stats,
            ..
        } = self;
        let Some(c) = conns[i].as_mut() else {
            return;
        };
        if !srq {
            c.io.rq_repost.completed();
        }
        let live = c.state == ConnState::Live;
        if !ok || !live || wc.opcode != WcOpcode::Recv {
            if srq {
                recv_repost.push(id);
            }
            if !ok && wc.status != WcStatus::WrFlushErr {
                self.begin_close(i);
            }
            return;
        }
        stats.capsules += 1;
        if !c.backlog.is_empty() {
            // Keep order: behind the capsules already waiting.
            if c.backlog.len() < usize::from(c.core.depth()) {
                c.backlog.push_back((id, wc.byte_len));
                stats.capsules_queued += 1;
            } else {
                self.fail_capsule(i, id);
            }
            return;
        }
        match submit(c, recvs, mrs, pd, id, wc.byte_len) {
            Ok(()) => repost(c, recv_repost, srq, id),
            Err(CapsuleError::QueueFull) if c.backlog.len() < usize::from(c.core.depth()) => {
                c.backlog.push_back((id, wc.byte_len));
                stats.capsules_queued += 1;
            }
            Err(e) => {
                log::debug!(
                    "nvmf rdma: qid {}: bad capsule ({e}); closing the queue",
                    c.qid
                );
                self.fail_capsule(i, id);
            }
        }
    }

    /// A capsule that cannot be served: give its buffer back, close the queue.
    fn fail_capsule(&mut self, i: usize, id: u32) {
        if self.srq.is_some() {
            self.recv_repost.push(id);
        }
        self.begin_close(i);
    }

    /// Start tearing connection `i` down (idempotent): the CM disconnect
    /// moves the QP to ERR, its WRs flush, and [`Self::service`] destroys it
    /// once the core has no transfer pending.
    fn begin_close(&mut self, i: usize) {
        let Some(c) = self.conns.get_mut(i).and_then(|c| c.as_mut()) else {
            return;
        };
        if c.state == ConnState::Closing {
            return;
        }
        if log::log_enabled!(log::Level::Debug) {
            log::debug!("nvmf rdma: closing {}", c.describe());
        }
        c.state = ConnState::Closing;
        c.io.closing = true;
        let _ = c.cm.disconnect();
        if c.qp.state() != QpState::Err {
            let _ = c.qp.modify(&QpAttr::to(QpState::Err));
        }
    }

    /// Per-queue work of one poll round.
    fn service(&mut self, i: usize, cm_round: bool) -> bool {
        let srq = self.srq.is_some();
        let Shared {
            conns,
            recvs,
            mrs,
            pd,
            recv_repost,
            ..
        } = self;
        let Some(c) = conns[i].as_mut() else {
            return false;
        };
        let mut busy = false;
        let mut close = false;
        {
            let mut ops = RdmaOps {
                io: &mut c.io,
                shared: mrs,
                pd,
            };
            busy |= c.core.poll(&mut ops).is_busy();
        }
        while c.state == ConnState::Live {
            let Some(&(id, len)) = c.backlog.front() else {
                break;
            };
            match submit(c, recvs, mrs, pd, id, len) {
                Ok(()) => {
                    c.backlog.pop_front();
                    repost(c, recv_repost, srq, id);
                    busy = true;
                }
                Err(CapsuleError::QueueFull) => break,
                Err(_) => {
                    close = true;
                    break;
                }
            }
        }
        if !srq && c.state == ConnState::Live && !c.io.rq_repost.is_empty() {
            // Receives first: a lent buffer released by a response of this
            // round is posted again before the host can see the response.
            if post_rq_pending(c, recvs).is_err() {
                close = true;
            }
        }
        if c.io.has_pending() {
            busy = true;
            close |= flush_io(c);
        }
        if c.io.disconnect_requested {
            close = true;
        }
        if cm_round && c.state == ConnState::Live {
            while let Ok(Some(ev)) = c.cm.get_event() {
                if matches!(ev, CmEvent::Disconnected | CmEvent::ConnectError) {
                    close = true;
                }
            }
        }
        if close {
            self.begin_close(i);
            busy = true;
        }
        let Some(c) = self.conns[i].as_mut() else {
            return busy;
        };
        if c.state == ConnState::Closing && c.core.transfers_in_flight() == 0 {
            self.destroy(i);
            busy = true;
        }
        busy
    }

    /// Post what connection `i` queued since its [`Self::service`] (the
    /// WRs of capsules reaped after it); a failed post closes it.
    fn flush_conn(&mut self, i: usize) -> bool {
        let srq = self.srq.is_some();
        let Shared { conns, recvs, .. } = self;
        let Some(c) = conns[i].as_mut() else {
            return false;
        };
        if !c.io.has_pending() {
            return false;
        }
        // As in `service`: receives before the responses that free them.
        let mut close = !srq
            && c.state == ConnState::Live
            && !c.io.rq_repost.is_empty()
            && post_rq_pending(c, recvs).is_err();
        close |= flush_io(c);
        if close {
            self.begin_close(i);
        }
        true
    }

    /// Destroy connection `i` on this core: QP first (no more DMA into our
    /// buffers), then return its receive buffers, then drop the core's queue
    /// (bdev I/O still in flight owns its buffers and completes into the void).
    fn destroy(&mut self, i: usize) {
        let Some(mut c) = self.conns[i].take() else {
            return;
        };
        self.by_qpn.remove(&c.qp_num);
        self.cq_reserved = self.cq_reserved.saturating_sub(c.cqes);
        let parked = c.core.stats().parked;
        let (busy, doorbells) = (c.io.busy, c.io.doorbells);
        drop(c.qp);
        if self.srq.is_some() {
            self.recv_repost
                .extend(c.backlog.drain(..).map(|(id, _)| id));
        } else {
            self.free_recvs.append(&mut c.own_recvs);
        }
        drop(c.core);
        drop(c.io);
        drop(c.cm);
        self.stats.core_parked += parked;
        self.stats.transport_busy += busy;
        self.stats.doorbells += doorbells;
        self.gens[i] = self.gens[i].wrapping_add(1) & 0x3FFF;
        self.free_slots.push(i as u16);
        self.transport
            .stats
            .destroyed
            .fetch_add(1, Ordering::Relaxed);
        self.transport.placer.seats().release(self.index);
    }
}

/// Post the queue's pending WRs; `true` when the QP refused them (the
/// queue must close).
fn flush_io<P: Provider>(c: &mut Conn<P>) -> bool {
    match c.io.flush(&c.qp) {
        Ok(()) => false,
        Err(e) => {
            log::debug!(
                "nvmf rdma: qid {}: post failed ({e:?}); closing the queue",
                c.qid
            );
            // WRs that never reached the QP never complete: nothing more
            // will come for them, so the core must not wait.
            c.io.closing = true;
            true
        }
    }
}

/// Validate a connect request's NVMe/RDMA private data and READ depth:
/// the request and its parsed private data, or the reject status.
fn check_request(
    info: Option<&ConnRequestInfo>,
    max_queue_depth: u16,
) -> Result<(ConnRequestInfo, CmRequest), CmRejectStatus> {
    let info = *info.ok_or(CmRejectStatus::InvalidLength)?;
    let req = CmRequest::parse(info.private_data.as_bytes())
        .map_err(|_| CmRejectStatus::InvalidLength)?;
    req.validate(max_queue_depth)?;
    if req.qid == u16::MAX {
        return Err(CmRejectStatus::InvalidQid);
    }
    // RDMA CM reports the depths swapped: `initiator_depth` is the host's
    // responder resources, the READs we may have in flight.
    if info.initiator_depth == 0 {
        // The host offers no READ responder resources: we could never pull
        // its write data (SPDK: INVALID_IRD).
        return Err(CmRejectStatus::InvalidIrd);
    }
    Ok((info, req))
}

/// Post every receive the queue owns (a new connection without SRQ).
fn post_own_rq<P: Provider>(
    c: &mut Conn<P>,
    recvs: &mut RecvBufs,
) -> Result<(), pollux_verbs::PostError> {
    c.io.rq_repost.clear();
    c.io.rq_repost.extend(c.own_recvs.iter().copied());
    post_rq_pending(c, recvs)
}

/// Post the queue's pending receives (no SRQ) in batches, as far as data
/// buffers are at hand; the rest stays pending for a later round.
fn post_rq_pending<P: Provider>(
    c: &mut Conn<P>,
    recvs: &mut RecvBufs,
) -> Result<(), pollux_verbs::PostError> {
    let (slot, gen) = (c.io.slot, c.io.gen);
    let qp = &c.qp;
    c.io.rq_repost.post_tagged::<2>(
        slot,
        gen,
        |id, e| recvs.sges(id, e),
        |wrs| qp.post_recv(wrs),
    )
}

/// Give a consumed receive back: to the SRQ batch or to the queue's
/// pending receives, both posted once per poll (with a fresh data buffer
/// when the request kept the old one).
#[inline(always)]
fn repost<P: Provider>(c: &mut Conn<P>, recv_repost: &mut RecvRepost, srq: bool, id: u32) {
    if srq {
        recv_repost.push(id);
    } else {
        c.io.rq_repost.push(id);
    }
}

/// Hand the capsule in receive `id` to the core: the SQE is parsed (one
/// copy of 64 bytes into the request), in-capsule data at offset 0 is lent
/// with its buffer (the slot then takes a fresh one when reposted).
fn submit<P: Provider>(
    c: &mut Conn<P>,
    recvs: &mut RecvBufs,
    mrs: &MrTable<P>,
    pd: &P::Pd,
    id: u32,
    len: u32,
) -> Result<(), CapsuleError> {
    let Some((sqe, data)) = recvs.parts(id) else {
        return Err(CapsuleError::Malformed(0));
    };
    let icd_len = (len as usize).saturating_sub(SQE_SIZE);
    let mut ops = RdmaOps {
        io: &mut c.io,
        shared: mrs,
        pd,
    };
    if (len as usize) < SQE_SIZE {
        return Err(CapsuleError::Malformed(len as usize));
    }
    c.core.submit_capsule_lent(sqe, data, icd_len, &mut ops)
}
