//! [`IserPollGroup`]: one per reactor. It owns one PD, one CQ shared by
//! its connections, one SRQ with receive buffers of iSER header + BHS +
//! 8 KiB, the CM listeners assigned to its core, and its connections. One
//! poller: accept (iSER CM header checked), reap the CQ in batches, feed
//! PDUs to the connection cores, poll them, post the queued WRs (one
//! doorbell per connection, one for the SRQ), destroy closed connections on
//! this core. A connect request checked here may be placed on another
//! group ([`pollux_verbs::placement`]); requests other groups placed here
//! arrive in this group's inbox and are attached to this group's device.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use pollux_reactor::mem::{BufPool, BufPoolOptions, DmaBuf};
use pollux_reactor::{PollStatus, PollerId, RareCheck, Reactor};
use pollux_verbs::placement::{Handoff, Inbox, Route};
use pollux_verbs::provider::PendingConn as _;
use pollux_verbs::recv_repost::RecvRepost;
use pollux_verbs::{
    Access, CmAddr, CmEvent, CmId, CmListener, CompletionQueue, ConnParam, ConnRequestInfo, Device,
    ProtectionDomain, Provider, QpAttr, QpCaps, QpInit, QpState, QueuePair as _, Sge,
    SharedRecvQueue, Wc, WcOpcode, WcStatus,
};

use super::conn::{Conn, ConnIo, ConnState, IserOps, MrTable};
use super::options::{IserOptions, RECV_BUF_LEN};
use super::transport::{IserTransport, IserTransportError};
use super::wrid::{Token, WrKind};
use crate::pdu::{IserCmHdr, IserHeader, ISER_HDR_LEN};
use crate::target::{ConnParams, Connection};

/// Completions reaped per CQ poll call.
const WC_BATCH: usize = 64;
/// Poll rounds between CM checks (system calls on the soft provider).
const CM_PERIOD: u64 = 16;
/// CM rounds between two checks of the listeners while the reactor is
/// busy (see [`RareCheck`]; a failing `accept` is a system call on the soft
/// provider): about every 1024 polls.
const LISTEN_PERIOD: u64 = 64;

/// Counters of one poll group (read on its core).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IserPollGroupStats {
    /// Live connections.
    pub connections: usize,
    /// Connect requests this group's listeners checked and handed to
    /// another group (placement).
    pub handed_off: u64,
    /// Connect requests another group handed to this one.
    pub adopted: u64,
    /// PDUs received.
    pub pdus: u64,
    /// `post_send` batches (doorbells).
    pub doorbells: u64,
    /// Completions with an error status (flushes included).
    pub wc_errors: u64,
    /// Transfers or sends answered `Busy` (the core retried them).
    pub transport_busy: u64,
    /// NOP-In pings sent to silent initiators (the connections dropped
    /// for leaving one unanswered are the target's
    /// [`nop_timeouts`](crate::target::IscsiTarget::nop_timeouts)).
    pub nop_pings: u64,
    /// Receive buffers posted or waiting to be reposted.
    pub recv_buffers_idle: usize,
    /// Receive buffers in total.
    pub recv_buffers: usize,
}

struct Shared<P: Provider> {
    transport: Arc<IserTransport<P>>,
    reactor: Reactor,
    index: usize,
    pd: P::Pd,
    cq: P::Cq,
    srq: P::Srq,
    mrs: MrTable<P>,
    _recv_pool: BufPool,
    recvs: Vec<DmaBuf>,
    recv_lkey: Vec<u32>,
    /// Receive buffers waiting to be posted to the SRQ (every one is
    /// posted, or waits here).
    recv_repost: RecvRepost,
    conns: Vec<Option<Conn<P>>>,
    gens: Vec<u16>,
    free_slots: Vec<u16>,
    by_qpn: HashMap<u32, u16>,
    listeners: Vec<(CmAddr, u16, P::CmListener)>,
    /// Connect requests (with their portal group tag) other groups handed
    /// to this one.
    inbox: Rc<Inbox<P, u16>>,
    rejected: VecDeque<(u64, P::CmId)>,
    listen_gen: u64,
    cq_reserved: u32,
    wcs: Vec<Wc>,
    rounds: u64,
    /// When a CM round checks the listeners.
    listen: RareCheck,
    stats: IserPollGroupStats,
    shutting_down: bool,
    dev: P::Device,
}

/// The per-reactor half of the iSER transport (see the module docs).
pub struct IserPollGroup<P: Provider> {
    state: Rc<RefCell<Shared<P>>>,
    reactor: Reactor,
    poller: PollerId,
}

impl<P: Provider> std::fmt::Debug for IserPollGroup<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IserPollGroup")
            .field("stats", &self.stats())
            .finish()
    }
}

fn no_res(what: &str, e: impl std::fmt::Display) -> IserTransportError {
    IserTransportError::NoResources(format!("{what}: {e}"))
}

impl<P: Provider> IserPollGroup<P> {
    pub(crate) fn new(
        t: &Arc<IserTransport<P>>,
        reactor: &Reactor,
        index: usize,
    ) -> Result<Rc<Self>, IserTransportError> {
        let opts = &t.opts;
        let name = match &opts.device {
            Some(n) => n.clone(),
            None => P::list_devices()
                .map_err(|e| no_res("listing verbs devices", e))?
                .first()
                .map(|d| d.name.clone())
                .ok_or_else(|| no_res("verbs device", "none"))?,
        };
        let dev = P::open_device(&name).map_err(|e| no_res("opening the verbs device", e))?;
        let caps = dev.caps().clone();
        let pd = dev.alloc_pd().map_err(|e| no_res("allocating a PD", e))?;
        let cq = dev
            .create_cq(opts.num_cqe.min(caps.max_cqe))
            .map_err(|e| no_res("creating the CQ", e))?;
        let nrecv = opts.max_srq_depth.min(caps.max_srq_wr).max(1) as usize;
        // One connection may have a full CmdSN window of commands plus its
        // declared MaxOutstandingUnexpectedPDUs (immediate PDUs) plus one
        // Logout in the receive queue at once. The SRQ is shared, so this
        // is not reserved per connection: a burst beyond the posted
        // receives is held back by RC's RNR flow control (rnr retry 7),
        // not lost. A group that cannot hold even one connection's worth
        // is misconfigured.
        let limits = &t.target.options().limits;
        let one_conn = limits.queue_depth as usize + limits.max_unexpected_pdus as usize + 1;
        if nrecv < one_conn {
            log::warn!(
                "iser: {nrecv} receive buffers are fewer than one connection may need ({one_conn}: queue depth + MaxOutstandingUnexpectedPDUs + 1)"
            );
        }
        let srq = pd
            .create_srq(nrecv as u32, 1)
            .map_err(|e| no_res("creating the SRQ", e))?;
        let mut po = BufPoolOptions::new("iser-recv", RECV_BUF_LEN, nrecv);
        po.align = 64;
        po.cache_size = 1;
        po.hugepages = opts.hugepages;
        let recv_pool = BufPool::new(po).map_err(|e| no_res("receive buffers", e))?;
        let mut mrs = MrTable::<P>(Vec::new());
        for a in recv_pool.arenas().iter().chain(t.target.pool().arenas()) {
            if mrs.lkey(a.id()).is_none() {
                let mr = pd
                    .reg_mr(a, 0, a.len(), Access::LOCAL_WRITE)
                    .map_err(|e| no_res("registering buffers", e))?;
                mrs.0.push((a.id(), mr));
            }
        }
        let mut recvs = Vec::with_capacity(nrecv);
        let mut recv_lkey = Vec::with_capacity(nrecv);
        for _ in 0..nrecv {
            let b = recv_pool
                .get()
                .ok_or_else(|| no_res("receive buffers", "pool short"))?;
            recv_lkey.push(mrs.lkey(b.arena_id()).unwrap_or(0));
            recvs.push(b);
        }
        let mut sh = Shared {
            transport: Arc::clone(t),
            reactor: reactor.clone(),
            index,
            pd,
            cq,
            srq,
            mrs,
            _recv_pool: recv_pool,
            recvs,
            recv_lkey,
            recv_repost: RecvRepost::all(nrecv as u32),
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
            stats: IserPollGroupStats {
                recv_buffers: nrecv,
                ..IserPollGroupStats::default()
            },
            shutting_down: false,
            dev,
        };
        sh.post_srq()
            .map_err(|e| no_res("posting SRQ receives", e))?;
        sh.sync_listeners();
        t.placer.seats().join(index, reactor.core());
        log::info!(
            "iser: poll group {index} on core {:?}: device {name}, {nrecv} receive buffers of {RECV_BUF_LEN} B",
            reactor.core()
        );
        let state = Rc::new(RefCell::new(sh));
        let weak = Rc::downgrade(&state);
        let poller = reactor.add_poller("iser-target", move || {
            let Some(s) = weak.upgrade() else {
                return PollStatus::Idle;
            };
            let Ok(mut s) = s.try_borrow_mut() else {
                return PollStatus::Idle;
            };
            s.poll()
        });
        Ok(Rc::new(IserPollGroup {
            state,
            reactor: reactor.clone(),
            poller,
        }))
    }

    /// Counters (call on this group's core).
    pub fn stats(&self) -> IserPollGroupStats {
        self.state
            .try_borrow()
            .map(|s| s.snapshot())
            .unwrap_or_default()
    }

    /// CM listeners this group has open.
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

    /// Stop listening and disconnect every connection; they are destroyed
    /// by the next polls. Poll until [`connections`](Self::connections) is
    /// 0 before dropping the group.
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

impl<P: Provider> Drop for IserPollGroup<P> {
    fn drop(&mut self) {
        self.reactor.remove_poller(self.poller);
        if let Ok(mut s) = self.state.try_borrow_mut() {
            s.transport.placer.seats().leave(s.index);
            for c in s.conns.iter_mut().flatten() {
                c.io.closing = true;
                let _ = c.cm.disconnect();
            }
            s.conns.clear();
            s.by_qpn.clear();
        }
    }
}

impl<P: Provider> Shared<P> {
    fn snapshot(&self) -> IserPollGroupStats {
        let mut st = self.stats;
        st.connections = self.conns.iter().flatten().count();
        for c in self.conns.iter().flatten() {
            st.doorbells += c.io.doorbells;
            st.transport_busy += c.io.busy;
            st.nop_pings += c.core.stats().nop_pings;
        }
        st.recv_buffers_idle = self.recv_repost.posted() + self.recv_repost.waiting();
        st
    }

    fn sync_listeners(&mut self) {
        let gen = self.transport.listen_gen.load(Ordering::Acquire);
        if gen == self.listen_gen || self.shutting_down {
            return;
        }
        self.listen_gen = gen;
        let mut want = Vec::new();
        {
            let mut l = self.transport.lock();
            for e in l.iter_mut() {
                if *e.owner.get_or_insert(self.index) == self.index {
                    want.push((e.addr.clone(), e.tag));
                }
            }
        }
        self.listeners
            .retain(|(a, t, _)| want.iter().any(|(x, y)| x == a && y == t));
        for (a, tag) in want {
            if self.listeners.iter().any(|(x, _, _)| *x == a) {
                continue;
            }
            match self.dev.listen(&a, self.transport.opts.acceptor_backlog) {
                Ok(l) => {
                    log::info!("iser: listening on {a} (portal group {tag})");
                    self.listeners.push((a, tag, l));
                }
                Err(e) => log::error!("iser: cannot listen on {a}: {e}"),
            }
        }
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
            self.sync_listeners();
            if self.listen.due(&self.reactor) {
                let took = self.accept();
                self.listen.found(took);
                busy |= took;
            }
        }
        if !self.inbox.is_empty() {
            busy |= self.adopt();
        }
        busy |= self.poll_cq();
        for i in 0..self.conns.len() {
            busy |= self.service(i, cm_round);
        }
        if !self.recv_repost.is_empty() {
            if let Err(e) = self.post_srq() {
                log::error!("iser: SRQ post failed: {e}");
            }
        }
        PollStatus::from_work(busy)
    }

    fn post_srq(&mut self) -> Result<(), pollux_verbs::PostError> {
        let Shared {
            recv_repost,
            recvs,
            recv_lkey,
            srq,
            ..
        } = self;
        recv_repost.post::<1>(
            |id, e| {
                let i = id as usize;
                e[0] = Sge {
                    addr: recvs.get(i)?.addr() as u64,
                    length: RECV_BUF_LEN as u32,
                    lkey: *recv_lkey.get(i)?,
                };
                Some(1)
            },
            |wrs| srq.post_recv(wrs),
        )
    }

    fn accept(&mut self) -> bool {
        let mut busy = false;
        for li in 0..self.listeners.len() {
            for _ in 0..16 {
                let req = match self.listeners[li].2.get_request() {
                    Ok(Some(id)) => id,
                    Ok(None) => break,
                    Err(e) => {
                        log::warn!("iser: listener error: {e}");
                        break;
                    }
                };
                busy = true;
                let tag = self.listeners[li].1;
                self.admit(req, tag);
            }
        }
        busy
    }

    /// A connect request on one of this group's listeners (portal group
    /// `tag`): check it here (a reject goes from here), then place its
    /// connection: on this group, or handed to another group's core.
    fn admit(&mut self, id: P::CmId, tag: u16) {
        if let Err(why) = check_request(id.request()) {
            self.reject(id, &why);
            return;
        }
        let t = Arc::clone(&self.transport);
        match t
            .placer
            .route(&self.reactor, self.index, t.opts.placement, id, tag)
        {
            Route::Here(id, tag) => self.connect_placed(id, tag),
            Route::Sent { .. } => self.stats.handed_off += 1,
            Route::NoGroup(id, _) => {
                self.reject(id, "no poll group takes connections");
            }
        }
    }

    /// Requests other groups handed to this one: attach each to this
    /// group's device and connect it here.
    fn adopt(&mut self) -> bool {
        let mut busy = false;
        while let Some(Handoff { req, context: tag }) = self.inbox.pop() {
            busy = true;
            self.stats.adopted += 1;
            match req.attach(&self.dev) {
                Ok(id) => self.connect_placed(id, tag),
                Err(e) => {
                    // Dropping the request rejected it.
                    log::warn!("iser: cannot attach a handed-over connect request: {e}");
                    self.transport.placer.refuse(self.index);
                }
            }
        }
        busy
    }

    /// [`Self::connect`] for a request placed on this group: a refused one
    /// gives its seat back (an accepted one does when it is destroyed).
    fn connect_placed(&mut self, id: P::CmId, tag: u16) {
        if self.connect(id, tag).is_err() {
            self.transport.placer.seats().release(self.index);
        }
    }

    fn reject(&mut self, id: P::CmId, why: &str) -> Rejected {
        log::debug!("iser: connect request rejected: {why}");
        self.transport
            .stats
            .rejected
            .fetch_add(1, Ordering::Relaxed);
        let _ = id.reject(&[]);
        self.rejected.push_back((self.rounds, id));
        Rejected
    }

    /// One connect request placed on this group: check the iSER CM header
    /// (again: cheap, and the request may come from another group), create
    /// the QP on this group's CQ and SRQ, the send slots and the connection
    /// core, accept with our CM header.
    fn connect(&mut self, id: P::CmId, tag: u16) -> Result<(), Rejected> {
        let (info, hdr) = match check_request(id.request()) {
            Ok(v) => v,
            Err(why) => return Err(self.reject(id, &why)),
        };
        if self.shutting_down {
            return Err(self.reject(id, "shutting down"));
        }
        let t = Arc::clone(&self.transport);
        let caps = self.dev.caps().clone();
        let depth = t.target.options().limits.queue_depth.max(1);
        let sq = IserOptions::send_wrs(depth).min(caps.max_qp_wr);
        if self.cq_reserved + sq + self.recvs.len() as u32 > self.cq.depth()
            || (self.free_slots.is_empty() && self.conns.len() >= usize::from(u16::MAX - 1))
        {
            return Err(self.reject(id, "no resources"));
        }
        let use_inv =
            !hdr.send_w_inv_not_sup && t.opts.send_with_invalidate && caps.mem_mgt_extensions;
        let qp = match self.pd.create_qp(&QpInit {
            send_cq: &self.cq,
            recv_cq: &self.cq,
            srq: Some(&self.srq),
            caps: QpCaps {
                max_send_wr: sq,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        }) {
            Ok(q) => q,
            Err(e) => return Err(self.reject(id, &format!("QP: {e}"))),
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
        let (io, send_mr) = match ConnIo::<P>::new(&self.pd, slot, gen, depth, sq, rd) {
            Ok(x) => x,
            Err(e) => {
                self.free_slots.push(slot);
                return Err(self.reject(id, &format!("send buffers: {e}")));
            }
        };
        let core = Connection::new(
            &t.target,
            &self.reactor,
            ConnParams {
                portal_tag: tag,
                send_with_inv: use_inv,
                nop: t.opts.nop_ping(),
            },
        );
        let rep = IserCmHdr {
            zbva_not_sup: true,
            send_w_inv_not_sup: !use_inv,
        }
        .encode();
        let param = ConnParam {
            private_data: &rep,
            responder_resources: 0,
            initiator_depth: rd as u8,
            retry_count: 7,
            rnr_retry_count: 7,
        };
        if let Err(e) = id.accept(&qp, &param) {
            log::warn!("iser: accept failed: {e}");
            self.free_slots.push(slot);
            t.stats.rejected.fetch_add(1, Ordering::Relaxed);
            return Err(Rejected);
        }
        self.cq_reserved += sq;
        let qp_num = qp.qp_num();
        self.by_qpn.insert(qp_num, slot);
        self.conns[usize::from(slot)] = Some(Conn {
            qp,
            cm: id,
            core,
            io,
            send_mr,
            qp_num,
            state: ConnState::Live,
            cqes: sq,
        });
        t.stats.accepted.fetch_add(1, Ordering::Relaxed);
        log::debug!(
            "iser: accepted a connection on core {:?} (remote invalidation {use_inv})",
            self.reactor.core()
        );
        Ok(())
    }

    fn poll_cq(&mut self) -> bool {
        let mut busy = false;
        loop {
            let mut wcs = std::mem::take(&mut self.wcs);
            let n = match self.cq.poll(&mut wcs) {
                Ok(n) => n,
                Err(e) => {
                    log::error!("iser: CQ failed ({e}); closing every connection");
                    for i in 0..self.conns.len() {
                        self.begin_close(i);
                    }
                    0
                }
            };
            for wc in &wcs[..n] {
                self.completion(wc);
            }
            self.wcs = wcs;
            busy |= n > 0;
            if n < WC_BATCH {
                return busy;
            }
        }
    }

    fn conn_of(&self, tok: &Token) -> Option<usize> {
        let i = usize::from(tok.conn);
        let c = self.conns.get(i)?.as_ref()?;
        (c.io.gen & 0x3FFF == tok.gen).then_some(i)
    }

    fn completion(&mut self, wc: &Wc) {
        let tok = Token::decode(wc.wr_id);
        let ok = wc.status == WcStatus::Success;
        if !ok {
            self.stats.wc_errors += 1;
        }
        if tok.kind == WrKind::Recv {
            return self.recv_done(wc, tok.index, ok);
        }
        let Some(i) = self.conn_of(&tok) else {
            return;
        };
        let Shared { conns, mrs, pd, .. } = self;
        let Some(c) = conns[i].as_mut() else {
            return;
        };
        match tok.kind {
            WrKind::Send => c.io.send_done(tok.index),
            WrKind::Read | WrKind::Data => {
                if tok.kind == WrKind::Read {
                    c.io.read_done(tok.index);
                } else {
                    c.io.write_done(tok.index);
                }
                if c.state == ConnState::Live {
                    let mut ops = IserOps {
                        io: &mut c.io,
                        shared: mrs,
                        pd,
                    };
                    c.core.data_done(tok.index as u16, ok, &mut ops);
                }
            }
            _ => {}
        }
        if !ok && wc.status != WcStatus::WrFlushErr {
            log::debug!("iser: work request failed: {:?}", wc.status);
            self.begin_close(i);
        }
    }

    fn recv_done(&mut self, wc: &Wc, id: u32, ok: bool) {
        self.recv_repost.completed();
        // Every receive goes back to the SRQ: the core copies what it keeps.
        self.recv_repost.push(id);
        let Some(i) = self.by_qpn.get(&wc.qp_num).map(|&s| usize::from(s)) else {
            return;
        };
        if !ok || wc.opcode != WcOpcode::Recv {
            if !ok && wc.status != WcStatus::WrFlushErr {
                self.begin_close(i);
            }
            return;
        }
        self.stats.pdus += 1;
        let Shared {
            conns,
            recvs,
            mrs,
            pd,
            ..
        } = self;
        let Some(c) = conns[i].as_mut() else {
            return;
        };
        if c.state != ConnState::Live {
            return;
        }
        let Some(buf) = recvs.get(id as usize) else {
            return;
        };
        let bytes = &buf.as_slice()[..(wc.byte_len as usize).min(RECV_BUF_LEN)];
        let alive = match IserHeader::parse(bytes) {
            Ok(hdr) => {
                let mut ops = IserOps {
                    io: &mut c.io,
                    shared: mrs,
                    pd,
                };
                c.core.on_pdu(&hdr, &bytes[ISER_HDR_LEN..], &mut ops)
            }
            Err(e) => {
                log::debug!("iser: bad iSER header ({e}); closing the connection");
                false
            }
        };
        if !alive {
            c.io.disconnect_requested = true;
        }
    }

    /// Start tearing connection `i` down (idempotent).
    fn begin_close(&mut self, i: usize) {
        let Some(c) = self.conns.get_mut(i).and_then(|c| c.as_mut()) else {
            return;
        };
        if c.state == ConnState::Closing {
            return;
        }
        c.state = ConnState::Closing;
        c.io.closing = true;
        let _ = c.cm.disconnect();
        if c.qp.state() != QpState::Err {
            let _ = c.qp.modify(&QpAttr::to(QpState::Err));
        }
    }

    fn service(&mut self, i: usize, cm_round: bool) -> bool {
        let Shared { conns, mrs, pd, .. } = self;
        let Some(c) = conns[i].as_mut() else {
            return false;
        };
        let mut busy = false;
        let mut close = false;
        if c.state == ConnState::Live {
            let mut ops = IserOps {
                io: &mut c.io,
                shared: mrs,
                pd,
            };
            busy |= c.core.poll(&mut ops) == PollStatus::Busy;
        }
        if c.io.has_pending() {
            busy = true;
            if let Err(e) = c.io.flush(&c.qp) {
                log::debug!("iser: post failed ({e:?}); closing the connection");
                close = true;
            }
        }
        // Logout answered (or a protocol error): close once the last
        // SEND is out; an initiator that stopped answering at once (the
        // QP's ERR state flushes what it would never take).
        if c.io.disconnect_requested && (c.io.slots_in_use() == 0 || c.io.abort_requested) {
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
        if c.state == ConnState::Closing && c.io.signaled_inflight == 0 {
            self.destroy(i);
            busy = true;
        }
        busy
    }

    /// Destroy connection `i` on this core: the QP first (no more DMA into
    /// our buffers), then the core (its task buffers go back to the
    /// target's pool; bdev I/O in flight owns its buffer and returns it
    /// when it completes).
    fn destroy(&mut self, i: usize) {
        let Some(c) = self.conns[i].take() else {
            return;
        };
        self.by_qpn.remove(&c.qp_num);
        self.cq_reserved = self.cq_reserved.saturating_sub(c.cqes);
        self.stats.doorbells += c.io.doorbells;
        self.stats.transport_busy += c.io.busy;
        self.stats.nop_pings += c.core.stats().nop_pings;
        drop(c.qp);
        drop(c.core);
        drop(c.io);
        drop(c.send_mr);
        drop(c.cm);
        self.gens[i] = self.gens[i].wrapping_add(1) & 0x3FFF;
        self.free_slots.push(i as u16);
        self.transport
            .stats
            .destroyed
            .fetch_add(1, Ordering::Relaxed);
        self.transport.placer.seats().release(self.index);
    }
}

/// A connect request was rejected (the reason is logged).
struct Rejected;

/// Check a connect request: its iSER CM header (reserved bits clear) and
/// the RDMA READ responder resources the initiator offers (we pull
/// solicited Data-Out by RDMA READ). The request and its header, or why
/// it is rejected.
fn check_request(info: Option<&ConnRequestInfo>) -> Result<(ConnRequestInfo, IserCmHdr), String> {
    let info = *info.ok_or("no request")?;
    let hdr = IserCmHdr::parse(info.private_data.as_bytes())
        .map_err(|e| format!("bad iSER CM header: {e}"))?;
    if info.initiator_depth == 0 {
        return Err("no RDMA READ responder resources".into());
    }
    Ok((info, hdr))
}
