//! [`IserPollGroup`]: one per reactor. Its generic part ([`RdmaGroup`],
//! shared with the NVMe-oF RDMA target) holds the device, PD and CQ shared
//! by its connections, the CM listeners assigned to its core, and its
//! connections; its own part one SRQ with receive buffers of iSER header +
//! BHS + 8 KiB, and its [`Acceptor`] (the iSER CM header). One
//! poller: accept (iSER CM header checked), reap the CQ in batches, feed
//! PDUs to the connection cores, poll them, post the queued WRs (one
//! doorbell per connection, one for the SRQ), destroy closed connections on
//! this core. A connect request checked here may be placed on another
//! group ([`pollux_verbs::placement`]); requests other groups placed here
//! arrive in this group's inbox and are attached to this group's device.

use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use pollux_reactor::mem::{BufPool, BufPoolOptions, DmaBuf};
use pollux_reactor::PollStatus;
use pollux_verbs::group::{
    Acceptor, GroupConn as _, GroupPoller, GroupSpec, Link, MrTable, RdmaGroup,
};
use pollux_verbs::placement::PlacementPolicy;
use pollux_verbs::recv_repost::RecvRepost;
use pollux_verbs::{
    CmId, ConnRequestInfo, ProtectionDomain, Provider, QpCaps, QpInit, Sge, SharedRecvQueue, Wc,
    WcOpcode, WcStatus,
};

use super::conn::{Conn, ConnIo, IserOps};
use super::options::{IserOptions, RECV_BUF_LEN};
use super::transport::{IserTransport, IserTransportError};
use super::wrid::{Token, WrKind};
use crate::pdu::{IserCmHdr, IserHeader, ISER_HDR_LEN};
use crate::target::{ConnParams, Connection};

/// Poll rounds between CM checks (system calls on the soft provider).
const CM_PERIOD: u64 = 16;
/// CM rounds between two checks of the listeners while the reactor is
/// busy (see [`RareCheck`](pollux_reactor::RareCheck); a failing `accept`
/// is a system call on the soft provider): about every 1024 polls.
const LISTEN_PERIOD: u64 = 64;
/// Most completions reaped in one poll round.
const WC_ROUND: usize = usize::MAX;

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

/// A poll group: the generic part (device, PD, CQ, connections,
/// listeners keyed by portal group tag) and the iSER part.
struct Shared<P: Provider> {
    g: Group<P>,
    x: Iser<P>,
}

/// A poll group's generic part.
type Group<P> = RdmaGroup<P, Conn<P>, u16>;

/// What a poll group holds of its own for iSER.
struct Iser<P: Provider> {
    transport: Arc<IserTransport<P>>,
    srq: P::Srq,
    mrs: MrTable<P>,
    _recv_pool: BufPool,
    recvs: Vec<DmaBuf>,
    recv_lkey: Vec<u32>,
    /// Receive buffers waiting to be posted to the SRQ (every one is
    /// posted, or waits here).
    recv_repost: RecvRepost,
    stats: IserPollGroupStats,
    /// This group's reactor: its loop time bounds the wait after a logout.
    reactor: pollux_reactor::Reactor,
    /// [`IserOptions::logout_grace`] in nanoseconds.
    logout_grace_ns: u64,
}

/// The per-reactor half of the iSER transport (see the module docs).
pub struct IserPollGroup<P: Provider> {
    poller: GroupPoller<Shared<P>>,
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
        reactor: &pollux_reactor::Reactor,
        index: usize,
    ) -> Result<Rc<Self>, IserTransportError> {
        let opts = &t.opts;
        let spec = GroupSpec {
            label: "iser",
            device: opts.device.clone(),
            num_cqe: opts.num_cqe,
            cm_period: CM_PERIOD,
            listen_period: LISTEN_PERIOD,
            backlog: opts.acceptor_backlog,
        };
        let g = RdmaGroup::open(spec, reactor, index, &t.placer, &t.listens)
            .map_err(|e| no_res("poll group", e))?;
        let nrecv = opts.max_srq_depth.min(g.caps().max_srq_wr).max(1) as usize;
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
        let srq =
            g.pd.create_srq(nrecv as u32, 1)
                .map_err(|e| no_res("creating the SRQ", e))?;
        let mut po = BufPoolOptions::new("iser-recv", RECV_BUF_LEN, nrecv);
        po.align = 64;
        po.cache_size = 1;
        po.hugepages = opts.hugepages;
        let recv_pool = BufPool::new(po).map_err(|e| no_res("receive buffers", e))?;
        let mut mrs = MrTable::<P>::new();
        for a in recv_pool.arenas().iter().chain(t.target.pool().arenas()) {
            mrs.register(&g.pd, a)
                .map_err(|e| no_res("registering buffers", e))?;
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
            g,
            x: Iser {
                transport: Arc::clone(t),
                srq,
                mrs,
                _recv_pool: recv_pool,
                recvs,
                recv_lkey,
                recv_repost: RecvRepost::all(nrecv as u32),
                stats: IserPollGroupStats {
                    recv_buffers: nrecv,
                    ..IserPollGroupStats::default()
                },
                reactor: reactor.clone(),
                logout_grace_ns: u64::try_from(opts.logout_grace.as_nanos()).unwrap_or(u64::MAX),
            },
        };
        sh.x.post_srq()
            .map_err(|e| no_res("posting SRQ receives", e))?;
        // A listener that cannot open is logged; the group serves the others.
        let _ = sh.g.join();
        log::info!(
            "iser: poll group {index} on core {:?}: device {}, {nrecv} receive buffers of {RECV_BUF_LEN} B",
            reactor.core(),
            sh.g.device_name()
        );
        Ok(Rc::new(IserPollGroup {
            poller: GroupPoller::start(reactor, "iser-target", sh, Shared::poll),
        }))
    }

    /// Counters (call on this group's core).
    pub fn stats(&self) -> IserPollGroupStats {
        self.poller.with(Shared::snapshot).unwrap_or_default()
    }

    /// CM listeners this group has open.
    pub fn listeners(&self) -> usize {
        self.poller.with(|s| s.g.listeners()).unwrap_or(0)
    }

    /// Live connections.
    pub fn connections(&self) -> usize {
        self.stats().connections
    }

    /// Stop listening and disconnect every connection; they are destroyed
    /// by the next polls. Poll until [`connections`](Self::connections) is
    /// 0 before dropping the group.
    pub fn shutdown(&self) {
        self.poller.with_mut(|s| s.g.shutdown());
    }
}

impl<P: Provider> Shared<P> {
    fn snapshot(&self) -> IserPollGroupStats {
        let mut st = self.x.stats;
        st.connections = self.g.conns.count();
        st.handed_off = self.g.counters.handed_off;
        st.adopted = self.g.counters.adopted;
        for c in self.g.conns.iter() {
            st.doorbells += c.io.doorbells;
            st.transport_busy += c.io.busy;
            st.nop_pings += c.core.stats().nop_pings;
        }
        st.recv_buffers_idle = self.x.recv_repost.posted() + self.x.recv_repost.waiting();
        st
    }

    fn poll(&mut self) -> PollStatus {
        let Shared { g, x } = self;
        let mut busy = false;
        let cm_round = g.begin_round();
        busy |= g.serve_requests(cm_round, x);
        busy |= g.reap(WC_ROUND, |g, wcs| {
            for wc in wcs {
                x.completion(g, wc);
            }
        }) > 0;
        for i in 0..g.conns.slots() {
            busy |= x.service(g, i, cm_round);
        }
        if !x.recv_repost.is_empty() {
            if let Err(e) = x.post_srq() {
                log::error!("iser: SRQ post failed: {e}");
            }
        }
        g.end_round(busy);
        PollStatus::from_work(busy)
    }
}

impl<P: Provider> Acceptor<P, Conn<P>, u16> for Iser<P> {
    type Refusal = String;

    fn check(&mut self, id: &P::CmId) -> Result<(), String> {
        check_request(id.request()).map(|_| ())
    }

    fn policy(&self) -> PlacementPolicy {
        self.transport.opts.placement
    }

    fn no_group(&self) -> String {
        "no poll group takes connections".into()
    }

    fn reject(&mut self, g: &mut Group<P>, id: P::CmId, why: String) {
        log::debug!("iser: connect request rejected: {why}");
        self.transport
            .stats
            .rejected
            .fetch_add(1, Ordering::Relaxed);
        g.reject(id, &[]);
    }

    fn connect(&mut self, g: &mut Group<P>, id: P::CmId, tag: u16) -> bool {
        self.open_connection(g, id, tag).is_ok()
    }
}

impl<P: Provider> Iser<P> {
    fn post_srq(&mut self) -> Result<(), pollux_verbs::PostError> {
        let Iser {
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

    /// [`Acceptor::reject`], for a `?`.
    fn refuse(&mut self, g: &mut Group<P>, id: P::CmId, why: &str) -> Rejected {
        Acceptor::reject(self, g, id, why.to_string());
        Rejected
    }

    /// One connect request placed on this group: check the iSER CM header
    /// (again: cheap, and the request may come from another group), create
    /// the QP on this group's CQ and SRQ, the send slots and the connection
    /// core, accept with our CM header.
    fn open_connection(&mut self, g: &mut Group<P>, id: P::CmId, tag: u16) -> Result<(), Rejected> {
        let (info, hdr) = match check_request(id.request()) {
            Ok(v) => v,
            Err(why) => return Err(self.refuse(g, id, &why)),
        };
        if g.is_shutting_down() {
            return Err(self.refuse(g, id, "shutting down"));
        }
        let t = Arc::clone(&self.transport);
        let caps = g.caps().clone();
        let depth = t.target.options().limits.queue_depth.max(1);
        let sq = IserOptions::send_wrs(depth).min(caps.max_qp_wr);
        if !g.cq_fits(sq, self.recvs.len() as u32) {
            return Err(self.refuse(g, id, "no resources"));
        }
        let Some((slot, gen)) = g.conns.reserve() else {
            return Err(self.refuse(g, id, "no resources"));
        };
        let use_inv =
            !hdr.send_w_inv_not_sup && t.opts.send_with_invalidate && caps.mem_mgt_extensions;
        let qp = match g.pd.create_qp(&QpInit {
            send_cq: &g.cq,
            recv_cq: &g.cq,
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
            Err(e) => {
                g.conns.unreserve(slot);
                return Err(self.refuse(g, id, &format!("QP: {e}")));
            }
        };
        let rd = g.read_depth(&info, u32::from(t.opts.max_read_depth));
        let (io, send_mr) = match ConnIo::<P>::new(&g.pd, slot, gen, depth, sq, rd) {
            Ok(x) => x,
            Err(e) => {
                g.conns.unreserve(slot);
                return Err(self.refuse(g, id, &format!("send buffers: {e}")));
            }
        };
        let core = Connection::new(
            &t.target,
            g.reactor(),
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
        let param = RdmaGroup::<P, Conn<P>, u16>::accept_param(&rep, rd);
        if let Err(e) = id.accept(&qp, &param) {
            log::warn!("iser: accept failed: {e}");
            g.conns.unreserve(slot);
            t.stats.rejected.fetch_add(1, Ordering::Relaxed);
            return Err(Rejected);
        }
        g.add(
            slot,
            Conn {
                link: Link::new(qp, id, sq),
                core,
                io,
                _send_mr: send_mr,
            },
        );
        t.stats.accepted.fetch_add(1, Ordering::Relaxed);
        log::debug!(
            "iser: accepted a connection on core {:?} (remote invalidation {use_inv})",
            g.reactor().core()
        );
        Ok(())
    }

    fn service(&mut self, g: &mut Group<P>, i: usize, cm_round: bool) -> bool {
        let RdmaGroup { conns, pd, .. } = &mut *g;
        let Some(c) = conns.get_mut(i) else {
            return false;
        };
        let mrs = &self.mrs;
        let mut busy = false;
        let mut close = false;
        if c.link.is_live() {
            let mut ops = IserOps {
                io: &mut c.io,
                shared: mrs,
                pd,
            };
            busy |= c.core.poll(&mut ops) == PollStatus::Busy;
        }
        if c.io.has_pending() {
            busy = true;
            if let Err(e) = c.io.flush(&c.link.qp) {
                log::debug!("iser: post failed ({e:?}); closing the connection");
                close = true;
            }
        }
        // A protocol error: close once the last SEND is out; an initiator
        // that stopped answering at once (the QP's ERR state flushes what
        // it would never take). Logout answered: once the response is out
        // the initiator closes (its CM disconnect, seen below); the target
        // disconnects only when it has not within the grace.
        if c.io.disconnect_requested && (c.io.slots_in_use() == 0 || c.io.abort_requested) {
            if !c.io.logged_out || c.io.abort_requested {
                close = true;
            } else if c.link.is_live()
                && c.io
                    .logout_grace_over(self.reactor.now_ns(), self.logout_grace_ns)
            {
                log::debug!(
                    "iser: the initiator did not disconnect within {} ms of the Logout Response; disconnecting",
                    self.logout_grace_ns / 1_000_000
                );
                close = true;
            }
        }
        if cm_round && c.link.is_live() && c.link.peer_left() {
            close = true;
        }
        let drained = c.io.signaled_inflight == 0;
        if close {
            g.begin_close(i);
            busy = true;
        }
        if drained && g.conns.get(i).is_some_and(|c| !c.link().is_live()) {
            self.destroy(g, i);
            busy = true;
        }
        busy
    }

    /// Destroy connection `i` on this core: the QP first (no more DMA into
    /// our buffers), then the core and the send slots (see [`Conn`]).
    /// Counted as destroyed before its seat is released (`remove_with`):
    /// a transport whose groups hold no connection has counted every one.
    fn destroy(&mut self, g: &mut Group<P>, i: usize) {
        g.remove_with(i, |c| {
            self.stats.doorbells += c.io.doorbells;
            self.stats.transport_busy += c.io.busy;
            self.stats.nop_pings += c.core.stats().nop_pings;
            drop(c);
            self.transport
                .stats
                .destroyed
                .fetch_add(1, Ordering::Relaxed);
        });
    }

    /// One work completion.
    fn completion(&mut self, g: &mut Group<P>, wc: &Wc) {
        let tok = Token::decode(wc.wr_id);
        let ok = wc.status == WcStatus::Success;
        if !ok {
            self.stats.wc_errors += 1;
        }
        if tok.kind == WrKind::Recv {
            return self.recv_done(g, wc, tok.index, ok);
        }
        let Some(i) = g.conns.by_token(tok.conn, tok.gen) else {
            return;
        };
        let RdmaGroup { conns, pd, .. } = &mut *g;
        let Some(c) = conns.get_mut(i) else {
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
                if c.link.is_live() {
                    let mut ops = IserOps {
                        io: &mut c.io,
                        shared: &self.mrs,
                        pd,
                    };
                    c.core.data_done(tok.index as u16, ok, &mut ops);
                }
            }
            _ => {}
        }
        if !ok && wc.status != WcStatus::WrFlushErr {
            log::debug!("iser: work request failed: {:?}", wc.status);
            g.begin_close(i);
        }
    }

    fn recv_done(&mut self, g: &mut Group<P>, wc: &Wc, id: u32, ok: bool) {
        self.recv_repost.completed();
        // Every receive goes back to the SRQ: the core copies what it keeps.
        self.recv_repost.push(id);
        let Some(i) = g.conns.by_qpn(wc.qp_num) else {
            return;
        };
        if !ok || wc.opcode != WcOpcode::Recv {
            if !ok && wc.status != WcStatus::WrFlushErr {
                g.begin_close(i);
            }
            return;
        }
        self.stats.pdus += 1;
        let RdmaGroup { conns, pd, .. } = g;
        let Some(c) = conns.get_mut(i) else {
            return;
        };
        if !c.link.is_live() {
            return;
        }
        let Some(buf) = self.recvs.get(id as usize) else {
            return;
        };
        let bytes = &buf.as_slice()[..(wc.byte_len as usize).min(RECV_BUF_LEN)];
        let alive = match IserHeader::parse(bytes) {
            Ok(hdr) => {
                let mut ops = IserOps {
                    io: &mut c.io,
                    shared: &self.mrs,
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
