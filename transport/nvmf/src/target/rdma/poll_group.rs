//! [`RdmaPollGroup`]: one per reactor. Its generic part
//! ([`RdmaGroup`]: the device, PD and CQ shared by all its queues, the CM
//! listeners assigned to its core, its connections) is shared with the
//! iSER target; its own part holds the SRQ (unless `no_srq`) and the
//! receive buffers, and decides which connect requests become queues (its
//! [`Acceptor`]). One poller drives everything: accept; poll each queue, answering the
//! bdev completions of the last round, and post its WRs; reap the CQ and
//! feed its capsules to the core; post what they queued and the
//! SRQ receives; destroy closed queues on this core. Answering before
//! reaping lets the host read a batch of responses while this core parses
//! the next capsules, instead of the two taking turns.

use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use pollux_reactor::{PollStatus, Reactor};
use pollux_verbs::group::{
    Acceptor, GroupConn as _, GroupPoller, GroupSpec, Link, MrTable, RdmaGroup,
};
use pollux_verbs::placement::PlacementPolicy;
use pollux_verbs::recv_repost::RecvRepost;
use pollux_verbs::{
    CmId, ConnRequestInfo, ProtectionDomain, Provider, QpAttr, QpCaps, QpInit, QpState,
    QueuePair as _, SharedRecvQueue, Wc, WcOpcode, WcStatus,
};

use super::super::error::CapsuleError;
use super::super::qpair::QueuePair;
use super::super::transport::{QpairParams, ReqTag, TransportError};
use super::conn::{Conn, ConnIo, RdmaOps};
use super::options::RdmaOptions;
use super::recv_bufs::RecvBufs;
use super::transport::RdmaTransport;
use super::wrid::{Token, WrKind};
use crate::spec::cmd::SQE_SIZE;
use crate::spec::rdma_cm::{CmAccept, CmReject, CmRejectStatus, CmRequest};
use crate::spec::transport_id::TransportId;

/// Most completions reaped in one poll round.
const WC_ROUND: usize = 256;
/// Poll rounds between CM checks (accept, connection events): those are
/// system calls on the soft provider, kept off the per-I/O path.
const CM_PERIOD: u64 = 32;
/// CM rounds between two checks of the listeners while the reactor is
/// busy (see [`RareCheck`](pollux_reactor::RareCheck); a failing `accept`
/// is a system call on the soft provider): about every 1024 polls.
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

/// A poll group: the generic part (device, PD, CQ, connections,
/// listeners) and the NVMe/RDMA part.
pub(crate) struct Shared<P: Provider> {
    g: RdmaGroup<P, Conn<P>, TransportId>,
    x: Nvmf<P>,
}

/// What a poll group holds of its own for NVMe/RDMA.
struct Nvmf<P: Provider> {
    transport: Arc<RdmaTransport<P>>,
    srq: Option<P::Srq>,
    mrs: MrTable<P>,
    /// Command slots and lendable in-capsule data buffers.
    recvs: RecvBufs,
    /// Receive buffers not owned by a queue (no SRQ).
    free_recvs: Vec<u32>,
    /// SRQ receives to post at the end of the poll.
    recv_repost: RecvRepost,
    stats: PollGroupStats,
}

/// The per-reactor half of the RDMA transport (see the module docs).
pub struct RdmaPollGroup<P: Provider> {
    poller: GroupPoller<Shared<P>>,
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
        let spec = GroupSpec {
            label: "nvmf rdma",
            device: opts.device.clone(),
            num_cqe: opts.num_cqe,
            cm_period: CM_PERIOD,
            listen_period: LISTEN_PERIOD,
            backlog: opts.acceptor_backlog,
        };
        let g = RdmaGroup::open(spec, reactor, index, &t.placer, &t.listens)
            .map_err(|e| TransportError::NoResources(e.to_string()))?;
        let caps = g.caps().clone();
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
                g.pd.create_srq(nrecv as u32, recvs.sges_per_recv())
                    .map_err(|e| no_res("creating the SRQ", e))?,
            )
        };
        let mut mrs = MrTable::<P>::new();
        let slot_arenas = target.slot_pool().map(|p| p.arenas());
        for a in recvs
            .arenas()
            .iter()
            .chain(target.data_pool().arenas())
            .chain(slot_arenas.into_iter().flatten())
        {
            mrs.register(&g.pd, a)
                .map_err(|e| no_res("registering buffers", e))?;
        }
        recvs.set_lkeys(|id| mrs.lkey(id));
        t.stats
            .recv_memory
            .fetch_add((nrecv * buf_size) as u64, Ordering::Relaxed);
        log::info!(
            "nvmf rdma: poll group {index} on core {:?}: device {}, {} receive buffers of {buf_size} B ({} KiB), {}",
            reactor.core(),
            g.device_name(),
            nrecv,
            nrecv * buf_size / 1024,
            if opts.no_srq { "per-queue receive queues" } else { "shared receive queue" }
        );
        let mut sh = Shared {
            g,
            x: Nvmf {
                transport: Arc::clone(t),
                srq,
                mrs,
                recvs,
                free_recvs: if opts.no_srq {
                    (0..nrecv as u32).rev().collect()
                } else {
                    Vec::new()
                },
                recv_repost: RecvRepost::with_capacity(nrecv),
                stats: PollGroupStats {
                    recv_buffers: nrecv,
                    ..PollGroupStats::default()
                },
            },
        };
        if sh.x.srq.is_some() {
            sh.x.recv_repost.extend(0..nrecv as u32);
            sh.x.post_srq()
                .map_err(|e| no_res("posting SRQ receives", e))?;
        }
        sh.g.join()
            .map_err(|e| TransportError::Other(e.to_string()))?;
        Ok(Rc::new(RdmaPollGroup {
            poller: GroupPoller::start(reactor, "nvmf-rdma", sh, Shared::poll),
        }))
    }

    /// Counters (call on this group's core).
    pub fn stats(&self) -> PollGroupStats {
        self.poller.with(Shared::snapshot).unwrap_or_default()
    }

    /// CM listeners this group has open (listeners are opened by the
    /// group's poller after [`TargetTransport::listen`](super::super::TargetTransport::listen)).
    pub fn listeners(&self) -> usize {
        self.poller.with(|s| s.g.listeners()).unwrap_or(0)
    }

    /// Live connections.
    pub fn connections(&self) -> usize {
        self.stats().connections
    }

    /// Stop listening and disconnect every queue (hosts see a clean
    /// disconnect); the queues are destroyed by the next polls. Poll until
    /// [`connections`](Self::connections) is 0 before dropping the group.
    pub fn shutdown(&self) {
        self.poller.with_mut(|s| s.g.shutdown());
    }

    /// Open and close this group's CM listeners now (as its poller does
    /// every few rounds) after the transport's list changed.
    ///
    /// # Errors
    ///
    /// The address it could not listen on.
    pub fn apply_listeners(&self) -> Result<(), TransportError> {
        // Inside this group's own poll: it syncs there.
        self.poller
            .with_mut(|s| s.g.sync_listeners())
            .unwrap_or(Ok(()))
            .map_err(|e| TransportError::Other(e.to_string()))
    }

    /// Start closing the queues that came in through the listener `trid`
    /// (of subsystem `subnqn` only, when given: see
    /// [`QueuePair::came_through`](crate::target::QueuePair::came_through))
    /// with a CM disconnect, as [`shutdown`](Self::shutdown) does for all;
    /// the next polls destroy them and return their receive buffers,
    /// requests and seats. Returns how many.
    pub fn disconnect_listener(&self, trid: &TransportId, subnqn: Option<&str>) -> usize {
        self.poller
            .with_mut(|s| {
                let hit = s.g.conns.select(|c| c.core.came_through(trid, subnqn));
                for &i in &hit {
                    s.g.begin_close(i);
                }
                hit.len()
            })
            .unwrap_or(0)
    }
}

impl<P: Provider> Shared<P> {
    fn snapshot(&self) -> PollGroupStats {
        let mut st = self.x.stats;
        st.connections = self.g.conns.count();
        st.handed_off = self.g.counters.handed_off;
        st.adopted = self.g.counters.adopted;
        for c in self.g.conns.iter() {
            let qs = c.core.stats();
            st.transport_busy += c.io.busy;
            st.doorbells += c.io.doorbells;
            st.core_parked += qs.parked;
            st.icd_lent += qs.icd_lent;
            st.icd_copies += qs.icd_copies;
        }
        let slots_idle = if self.x.srq.is_some() {
            self.x.recv_repost.posted() + self.x.recv_repost.waiting()
        } else {
            self.x.free_recvs.len()
        };
        // A slot is only as idle as the data buffers: lent ones are not.
        st.recv_buffers_idle = self
            .x
            .recvs
            .data_idle()
            .map_or(slots_idle, |d| d.min(slots_idle));
        st
    }

    fn poll(&mut self) -> PollStatus {
        let Shared { g, x } = self;
        let mut busy = false;
        let cm_round = g.begin_round();
        busy |= g.serve_requests(cm_round, x);
        // Responses first: the bdev completions of the capsules reaped in
        // the previous round are answered and posted before this round's
        // capsules are parsed, so the host works on them while this core
        // works on the next batch (not after it).
        for i in 0..g.conns.slots() {
            busy |= x.service(g, i, cm_round);
        }
        busy |= g.reap(WC_ROUND, |g, wcs| {
            // Send-side completions first: a response SEND retired here
            // frees its request for a capsule of the same batch (a host
            // reuses a command slot as soon as it has the response, often
            // before this side saw the SEND complete), so that capsule
            // runs now instead of waiting in the backlog.
            for wc in wcs {
                let tok = Token::decode(wc.wr_id);
                if tok.kind != WrKind::Recv {
                    x.completion(g, wc, tok);
                }
            }
            for wc in wcs {
                let tok = Token::decode(wc.wr_id);
                if tok.kind == WrKind::Recv {
                    x.completion(g, wc, tok);
                }
            }
        }) > 0;
        // What the new capsules queued (RDMA READs, immediate responses).
        for i in 0..g.conns.slots() {
            busy |= x.flush_conn(g, i);
        }
        if !x.recv_repost.is_empty() {
            if let Err(e) = x.post_srq() {
                log::error!("nvmf rdma: SRQ post failed: {e}");
            }
        }
        g.end_round(busy);
        PollStatus::from_work(busy)
    }
}

/// A poll group's generic part.
type Group<P> = RdmaGroup<P, Conn<P>, TransportId>;

impl<P: Provider> Acceptor<P, Conn<P>, TransportId> for Nvmf<P> {
    type Refusal = CmRejectStatus;

    fn check(&mut self, id: &P::CmId) -> Result<(), CmRejectStatus> {
        let target = self
            .transport
            .target
            .upgrade()
            .ok_or(CmRejectStatus::NoResources)?;
        check_request(id.request(), target.options().max_queue_depth).map(|_| ())
    }

    fn policy(&self) -> PlacementPolicy {
        self.transport.opts.placement
    }

    fn no_group(&self) -> CmRejectStatus {
        CmRejectStatus::NoResources
    }

    fn reject(&mut self, g: &mut Group<P>, id: P::CmId, st: CmRejectStatus) {
        log::debug!("nvmf rdma: connect rejected: {st:?}");
        let s = &self.transport.stats;
        s.rejected.fetch_add(1, Ordering::Relaxed);
        if st == CmRejectStatus::NoResources {
            s.rejected_no_resources.fetch_add(1, Ordering::Relaxed);
        }
        g.reject(id, &CmReject::new(st).encode());
    }

    fn connect(&mut self, g: &mut Group<P>, id: P::CmId, trid: TransportId) -> bool {
        self.open_queue(g, id, trid).is_ok()
    }
}

impl<P: Provider> Nvmf<P> {
    fn post_srq(&mut self) -> Result<(), pollux_verbs::PostError> {
        let Nvmf {
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

    /// [`Acceptor::reject`], for a `?`: the status again.
    fn refuse(&mut self, g: &mut Group<P>, id: P::CmId, st: CmRejectStatus) -> CmRejectStatus {
        Acceptor::reject(self, g, id, st);
        st
    }

    /// One connect request placed here: validate the private data, size
    /// the queue, create the QP and the core's queue, post receives, accept.
    fn open_queue(
        &mut self,
        g: &mut Group<P>,
        id: P::CmId,
        trid: TransportId,
    ) -> Result<(), CmRejectStatus> {
        let t = Arc::clone(&self.transport);
        let Some(target) = t.target.upgrade() else {
            return Err(self.refuse(g, id, CmRejectStatus::NoResources));
        };
        let topts = target.options();
        let (info, req) = match check_request(id.request(), topts.max_queue_depth) {
            Ok(v) => v,
            Err(st) => return Err(self.refuse(g, id, st)),
        };
        if g.is_shutting_down() {
            return Err(self.refuse(g, id, CmRejectStatus::NoResources));
        }
        let depth = if req.qid == 0 {
            req.hsqsize + 1
        } else {
            (req.hsqsize + 1)
                .min(req.hrqsize)
                .min(topts.max_queue_depth)
        };
        let caps = g.caps().clone();
        let max_sge = caps.max_sge.clamp(1, 16);
        let requests = RdmaOptions::requests_per_queue(depth);
        let sq = RdmaOptions::send_wrs_per_queue(topts, requests, max_sge).min(caps.max_qp_wr);
        let cqes = t.opts.cqes_per_queue(topts, depth, max_sge);
        let srq_cqes = if self.srq.is_some() {
            self.recvs.len() as u32
        } else {
            0
        };
        if !g.cq_fits(cqes, srq_cqes)
            || (self.srq.is_none() && self.free_recvs.len() < usize::from(depth))
        {
            return Err(self.refuse(g, id, CmRejectStatus::NoResources));
        }
        let Some((slot, gen)) = g.conns.reserve() else {
            return Err(self.refuse(g, id, CmRejectStatus::NoResources));
        };
        let qp = match g.pd.create_qp(&QpInit {
            send_cq: &g.cq,
            recv_cq: &g.cq,
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
                g.conns.unreserve(slot);
                return Err(self.refuse(g, id, CmRejectStatus::NoResources));
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
            io_queue_depth: topts.max_queue_depth,
        };
        let core = match QueuePair::with_requests(&target, g.reactor(), params, requests) {
            Ok(c) => c,
            Err(e) => {
                log::warn!("nvmf rdma: cannot create the queue: {e}");
                g.conns.unreserve(slot);
                return Err(self.refuse(g, id, CmRejectStatus::NoResources));
            }
        };
        let rd = g.read_depth(&info, u32::from(t.opts.max_read_depth));
        let mut conn: Conn<P> = Conn {
            link: Link::new(qp, id, cqes),
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
        };
        if self.srq.is_none() {
            let n = usize::from(depth);
            let at = self.free_recvs.len() - n;
            conn.own_recvs = self.free_recvs.split_off(at);
            let ok = conn.link.qp.modify(&QpAttr::to(QpState::Init)).is_ok()
                && post_own_rq(&mut conn, &mut self.recvs).is_ok();
            if !ok {
                self.free_recvs.append(&mut conn.own_recvs);
                g.conns.unreserve(slot);
                let Conn { link, .. } = conn;
                let Link { cm, .. } = link;
                return Err(self.refuse(g, cm, CmRejectStatus::NoResources));
            }
        }
        let rep = CmAccept {
            recfmt: 0,
            crqsize: depth,
        }
        .encode();
        let param = Group::<P>::accept_param(&rep, rd);
        if let Err(e) = conn.link.cm.accept(&conn.link.qp, &param) {
            log::warn!("nvmf rdma: accept failed: {e}");
            self.free_recvs.append(&mut conn.own_recvs);
            g.conns.unreserve(slot);
            t.stats.rejected.fetch_add(1, Ordering::Relaxed);
            return Err(CmRejectStatus::NoResources);
        }
        log::debug!(
            "nvmf rdma: accepted qid {} depth {depth} on core {:?}",
            req.qid,
            g.reactor().core()
        );
        g.add(slot, conn);
        t.stats.accepted.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// One work completion, `tok` its decoded token.
    fn completion(&mut self, g: &mut Group<P>, wc: &Wc, tok: Token) {
        let ok = wc.status == WcStatus::Success;
        if !ok {
            self.stats.wc_errors += 1;
        }
        match tok.kind {
            WrKind::Recv => self.recv_done(g, wc, &tok, ok),
            WrKind::Send | WrKind::Read | WrKind::Data => {
                let Some(i) = g.conns.by_token(tok.conn, tok.gen) else {
                    return;
                };
                let tag = ReqTag::from_u64(u64::from(tok.index));
                let RdmaGroup { conns, pd, .. } = &mut *g;
                let Some(c) = conns.get_mut(i) else {
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
                            shared: &self.mrs,
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
                    g.begin_close(i);
                }
            }
        }
    }

    fn recv_done(&mut self, g: &mut Group<P>, wc: &Wc, tok: &Token, ok: bool) {
        let id = tok.index;
        let srq = self.srq.is_some();
        let conn = if srq {
            self.recv_repost.completed();
            g.conns.by_qpn(wc.qp_num)
        } else {
            g.conns.by_token(tok.conn, tok.gen)
        };
        let Some(i) = conn else {
            if srq {
                self.recv_repost.push(id);
            }
            return;
        };
        let Nvmf {
            recvs,
            mrs,
            recv_repost,
            stats,
            ..
        } = self;
        let RdmaGroup { conns, pd, .. } = &mut *g;
        let Some(c) = conns.get_mut(i) else {
            if srq {
                recv_repost.push(id);
            }
            return;
        };
        if !srq {
            c.io.rq_repost.completed();
        }
        if !ok || !c.link.is_live() || wc.opcode != WcOpcode::Recv {
            if srq {
                recv_repost.push(id);
            }
            if !ok && wc.status != WcStatus::WrFlushErr {
                g.begin_close(i);
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
                self.fail_capsule(g, i, id);
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
                self.fail_capsule(g, i, id);
            }
        }
    }

    /// A capsule that cannot be served: give its buffer back, close the queue.
    fn fail_capsule(&mut self, g: &mut Group<P>, i: usize, id: u32) {
        if self.srq.is_some() {
            self.recv_repost.push(id);
        }
        g.begin_close(i);
    }

    /// Per-queue work of one poll round.
    fn service(&mut self, g: &mut Group<P>, i: usize, cm_round: bool) -> bool {
        let srq = self.srq.is_some();
        let Nvmf {
            recvs,
            mrs,
            recv_repost,
            ..
        } = self;
        let RdmaGroup { conns, pd, .. } = &mut *g;
        let Some(c) = conns.get_mut(i) else {
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
        while c.link.is_live() {
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
        if !srq && c.link.is_live() && !c.io.rq_repost.is_empty() {
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
        if cm_round && c.link.is_live() && c.link.peer_left() {
            close = true;
        }
        if close {
            g.begin_close(i);
            busy = true;
        }
        let Some(c) = g.conns.get(i) else {
            return busy;
        };
        if !c.link().is_live() && c.core.transfers_in_flight() == 0 {
            self.destroy(g, i);
            busy = true;
        }
        busy
    }

    /// Post what connection `i` queued since its [`Self::service`] (the
    /// WRs of capsules reaped after it); a failed post closes it.
    fn flush_conn(&mut self, g: &mut Group<P>, i: usize) -> bool {
        let srq = self.srq.is_some();
        let Some(c) = g.conns.get_mut(i) else {
            return false;
        };
        if !c.io.has_pending() {
            return false;
        }
        // As in `service`: receives before the responses that free them.
        let mut close = !srq
            && c.link.is_live()
            && !c.io.rq_repost.is_empty()
            && post_rq_pending(c, &mut self.recvs).is_err();
        close |= flush_io(c);
        if close {
            g.begin_close(i);
        }
        true
    }

    /// Destroy connection `i` on this core: QP first (no more DMA into our
    /// buffers), then return its receive buffers, then drop the core's queue
    /// (bdev I/O still in flight owns its buffers and completes into the void).
    /// Counted as destroyed before its seat is released (`remove_with`):
    /// a transport whose groups hold no queue has counted every one.
    fn destroy(&mut self, g: &mut Group<P>, i: usize) {
        g.remove_with(i, |c| {
            let Conn {
                link,
                core,
                io,
                mut own_recvs,
                mut backlog,
                ..
            } = c;
            drop(link);
            if self.srq.is_some() {
                self.recv_repost.extend(backlog.drain(..).map(|(id, _)| id));
            } else {
                self.free_recvs.append(&mut own_recvs);
            }
            self.stats.core_parked += core.stats().parked;
            self.stats.transport_busy += io.busy;
            self.stats.doorbells += io.doorbells;
            drop(core);
            drop(io);
            self.transport
                .stats
                .destroyed
                .fetch_add(1, Ordering::Relaxed);
        });
    }
}

/// Post the queue's pending WRs; `true` when the QP refused them (the
/// queue must close).
fn flush_io<P: Provider>(c: &mut Conn<P>) -> bool {
    match c.io.flush(&c.link.qp) {
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
    let qp = &c.link.qp;
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
#[inline(always)]
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
