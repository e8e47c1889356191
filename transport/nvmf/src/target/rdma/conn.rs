//! One RDMA connection (one NVMe queue): its QP and CM id, the core's
//! [`QueuePair`], and [`ConnIo`], the per-queue work-request machinery that
//! implements [`QpairOps`]: RDMA READs for host data, RDMA WRITEs chained
//! with the response SEND (or SEND_WITH_INV), batched and posted once per
//! poll, unsignaled where the next signaled WR implies their completion.

use std::collections::VecDeque;

use pollux_reactor::mem::{ArenaId, DmaBuf, SgList};
use pollux_verbs::group::{post_sends, GroupConn, Link, MrTable};
use pollux_verbs::recv_repost::RecvRepost;
use pollux_verbs::{Provider, RemoteAddr, SendFlags, SendOp, SendWr, Sge};

use super::super::qpair::QueuePair;
use super::super::transport::{QpairOps, RemoteBuf, ReqTag, Response, Transfer, TransportError};
use super::wrid::{Token, WrKind};
use crate::spec::cpl::CQE_SIZE;

/// A work request waiting for the end-of-poll flush.
#[derive(Debug, Clone, Copy)]
pub(crate) enum PendOp {
    Read(RemoteAddr),
    Write(RemoteAddr),
    Send,
    SendInv(u32),
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct PendWr {
    token: Token,
    op: PendOp,
    sge_start: u32,
    sge_n: u32,
    signaled: bool,
    /// The request slot whose stored CQE a SEND carries inline.
    cqe_slot: u32,
}

/// The transport side of one queue: what [`QpairOps`] needs.
pub(crate) struct ConnIo<P: Provider> {
    pub(crate) slot: u16,
    pub(crate) gen: u16,
    pend: Vec<PendWr>,
    sges: Vec<Sge>,
    cqes: Vec<[u8; CQE_SIZE]>,
    /// Send-queue slots each request holds until its signaled WR completes.
    req_wrs: Vec<u32>,
    /// The tag (slot and generation) of the request whose WRs `req_wrs`,
    /// `req_reads` and `req_upto` of its slot count: a completion of an
    /// older request of the slot (an unsignaled SEND flushed in error)
    /// releases nothing of the newer one.
    req_tag: Vec<u32>,
    /// READs each request holds.
    req_reads: Vec<u32>,
    pub(crate) sq_avail: u32,
    pub(crate) sq_size: u32,
    rd_avail: u32,
    rd_depth: u32,
    max_sge: u32,
    send_inv: bool,
    /// No new transfers (the queue is being torn down).
    pub(crate) closing: bool,
    /// The core asked for a disconnect.
    pub(crate) disconnect_requested: bool,
    /// Memory regions registered for this queue only.
    pub(crate) own_mrs: MrTable<P>,
    /// Batches that went to `post_send` (doorbells).
    pub(crate) doorbells: u64,
    /// Transfers refused for lack of send-queue slots or read credits.
    pub(crate) busy: u64,
    /// Receives of this queue (no SRQ) waiting to be posted, in one batch
    /// per poll, as far as in-capsule data buffers are at hand.
    pub(crate) rq_repost: RecvRepost,
    /// The last arena looked up and its local key (the data of one queue
    /// mostly lives in one or two arenas: no table scan per buffer).
    last_key: Option<(ArenaId, u32)>,
    /// Response SENDs posted unsignaled (all but the last of each flush),
    /// oldest first: a later signaled SEND's completion implies theirs.
    unsig: VecDeque<u32>,
    /// SENDs ever pushed to / popped from `unsig`.
    unsig_pushed: u64,
    unsig_popped: u64,
    /// Per request slot: `unsig_pushed` when its signaled SEND was posted
    /// (everything before it completes with it).
    req_upto: Vec<u64>,
    /// The index in `pend` of the newest response SEND waiting for the
    /// flush: the only one of the batch posted signaled (each SEND queued
    /// after it turns it unsignaled).
    last_send: Option<usize>,
}

impl<P: Provider> ConnIo<P> {
    /// Control path: preallocates everything the queue's data path uses,
    /// for `depth` requests (the core's request count).
    pub(crate) fn new(
        slot: u16,
        gen: u16,
        depth: u16,
        sq_size: u32,
        rd_depth: u32,
        max_sge: u32,
        send_inv: bool,
    ) -> Self {
        let depth = usize::from(depth);
        ConnIo {
            slot,
            gen,
            pend: Vec::with_capacity(sq_size as usize),
            sges: Vec::with_capacity(sq_size as usize * max_sge as usize),
            cqes: vec![[0; CQE_SIZE]; depth],
            req_wrs: vec![0; depth],
            req_tag: vec![u32::MAX; depth],
            req_reads: vec![0; depth],
            sq_avail: sq_size,
            sq_size,
            rd_avail: rd_depth,
            rd_depth,
            max_sge: max_sge.max(1),
            send_inv,
            closing: false,
            disconnect_requested: false,
            own_mrs: MrTable::new(),
            doorbells: 0,
            busy: 0,
            rq_repost: RecvRepost::with_capacity(depth),
            last_key: None,
            unsig: VecDeque::with_capacity(sq_size as usize),
            unsig_pushed: 0,
            unsig_popped: 0,
            req_upto: vec![0; depth],
            last_send: None,
        }
    }

    /// Whether WRs wait for the flush.
    pub(crate) fn has_pending(&self) -> bool {
        !self.pend.is_empty()
    }

    /// The SEND of request `tag` completed (signaled, or an unsignaled one
    /// failing): it and every unsignaled SEND posted before it are done.
    /// Releases their send-queue slots and calls `done` for each request,
    /// oldest first. A stale tag is harmless (the core ignores it).
    #[inline(always)]
    pub(crate) fn sends_done(&mut self, tag: ReqTag, mut done: impl FnMut(ReqTag)) {
        let upto = if self.owns(tag) {
            self.req_upto.get(tag.slot()).copied().unwrap_or(0)
        } else {
            // Not the slot's current request: an unsignaled SEND flushed in
            // error (each such WR completes on its own), nothing to retire.
            0
        };
        while self.unsig_popped < upto {
            let Some(t) = self.unsig.pop_front() else {
                break;
            };
            self.unsig_popped += 1;
            let t = ReqTag::from_u64(u64::from(t));
            self.send_done(t);
            done(t);
        }
        self.send_done(tag);
        done(tag);
    }

    /// Whether the WR counters of `tag`'s slot are `tag`'s.
    fn owns(&self, tag: ReqTag) -> bool {
        self.req_tag.get(tag.slot()) == Some(&tag.0)
    }

    /// The SEND of request `tag` completed: release its slots.
    fn send_done(&mut self, tag: ReqTag) {
        if !self.owns(tag) {
            return;
        }
        if let Some(n) = self.req_wrs.get_mut(tag.slot()) {
            self.sq_avail = (self.sq_avail + *n).min(self.sq_size);
            *n = 0;
        }
    }

    /// The last READ of request `tag` completed: release its slots and credits.
    pub(crate) fn read_done(&mut self, tag: ReqTag) {
        if !self.owns(tag) {
            return;
        }
        let s = tag.slot();
        if let (Some(n), Some(r)) = (self.req_wrs.get_mut(s), self.req_reads.get_mut(s)) {
            self.sq_avail = (self.sq_avail + *n).min(self.sq_size);
            self.rd_avail = (self.rd_avail + *r).min(self.rd_depth);
            *n = 0;
            *r = 0;
        }
    }

    /// Post every pending WR: one `post_send` per [`POST_CHUNK`](pollux_verbs::group::POST_CHUNK) WRs (one
    /// doorbell per poll for normal batches). Allocation-free.
    ///
    /// # Errors
    ///
    /// The QP refused a WR: the queue is broken and must be torn down.
    pub(crate) fn flush(&mut self, qp: &P::Qp) -> Result<(), pollux_verbs::PostError> {
        // One signaled response SEND per flush (the last): its completion
        // retires the others (RC completes in order), one CQE instead of
        // one per request. `queue_send` turned the earlier ones unsignaled.
        if let Some(last) = self.last_send.take() {
            if let Some(p) = self.pend.get(last) {
                let slot = ReqTag::from_u64(u64::from(p.token.index)).slot();
                if let Some(u) = self.req_upto.get_mut(slot) {
                    *u = self.unsig_pushed;
                }
            }
        }
        let ConnIo {
            pend,
            sges,
            cqes,
            doorbells,
            ..
        } = self;
        let result = post_sends::<_, P>(qp, pend, doorbells, |p| {
            let signaled = if p.signaled {
                SendFlags::SIGNALED
            } else {
                SendFlags::NONE
            };
            // A response SEND carries its CQE inline (no SGE); a data
            // WR its SGEs.
            let (op, sg_list, inline, flags): (_, &[Sge], &[u8], _) = match p.op {
                PendOp::Read(remote) => {
                    (SendOp::RdmaRead { remote }, sges_of(sges, p), &[], signaled)
                }
                PendOp::Write(remote) => (
                    SendOp::RdmaWrite { remote },
                    sges_of(sges, p),
                    &[],
                    signaled,
                ),
                PendOp::Send => (
                    SendOp::Send,
                    &[],
                    cqe_of(cqes, p),
                    signaled | SendFlags::INLINE,
                ),
                PendOp::SendInv(rkey) => (
                    SendOp::SendWithInv { rkey },
                    &[],
                    cqe_of(cqes, p),
                    signaled | SendFlags::INLINE,
                ),
            };
            SendWr {
                wr_id: p.token.encode(),
                op,
                sg_list,
                inline,
                flags,
            }
        });
        self.pend.clear();
        self.sges.clear();
        self.last_send = None;
        result
    }

    /// Queue a response SEND (signaled until another one is queued after
    /// it in the same flush: the batch's last is the only signaled one).
    fn queue_send(&mut self, token: Token, op: PendOp, cqe_slot: u32) {
        if let Some(prev) = self.last_send {
            if let Some(p) = self.pend.get_mut(prev) {
                p.signaled = false;
                self.unsig.push_back(p.token.index);
                self.unsig_pushed += 1;
            }
        }
        self.last_send = Some(self.pend.len());
        self.pend.push(PendWr {
            token,
            op,
            sge_start: 0,
            sge_n: 0,
            signaled: true,
            cqe_slot,
        });
    }

    /// [`queue_data`](Self::queue_data) for `len` bytes (not 0) of one
    /// buffer at least that long: one WR of one SGE.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn queue_one(
        &mut self,
        shared: &MrTable<P>,
        pd: &P::Pd,
        b: &DmaBuf,
        len: u32,
        remote: &RemoteBuf,
        read: bool,
        last: Token,
    ) -> Result<(), TransportError> {
        let lkey = self.lkey(shared, pd, b)?;
        let sge_start = self.sges.len() as u32;
        self.sges.push(Sge {
            addr: b.addr() as u64,
            length: len,
            lkey,
        });
        let ra = RemoteAddr {
            addr: remote.addr,
            rkey: remote.key,
        };
        let (token, op) = if read {
            (last, PendOp::Read(ra))
        } else {
            (
                Token::new(WrKind::Data, self.slot, self.gen, last.index),
                PendOp::Write(ra),
            )
        };
        self.pend.push(PendWr {
            token,
            op,
            sge_start,
            sge_n: 1,
            signaled: read,
            cqe_slot: 0,
        });
        Ok(())
    }

    #[inline]
    fn lkey(
        &mut self,
        shared: &MrTable<P>,
        pd: &P::Pd,
        buf: &DmaBuf,
    ) -> Result<u32, TransportError> {
        if let Some((a, k)) = self.last_key {
            if a == buf.arena_id() {
                return Ok(k);
            }
        }
        self.lkey_slow(shared, pd, buf)
    }

    /// [`lkey`](Self::lkey) for another arena than the last one.
    #[cold]
    #[inline(never)]
    fn lkey_slow(
        &mut self,
        shared: &MrTable<P>,
        pd: &P::Pd,
        buf: &DmaBuf,
    ) -> Result<u32, TransportError> {
        let id = buf.arena_id();
        if let Some(k) = shared.lkey(id).or_else(|| self.own_mrs.lkey(id)) {
            self.last_key = Some((id, k));
            return Ok(k);
        }
        // First use of an arena the poll group did not register (the core's
        // per-request buffers): register it for this queue (once).
        self.own_mrs
            .register(pd, buf.arena())
            .map_err(|e| TransportError::Other(format!("cannot register a data buffer: {e}")))
    }

    /// Queue data WRs moving `len` bytes between `bufs` and `remote`.
    /// Returns how many WRs were queued.
    #[allow(clippy::too_many_arguments)]
    fn queue_data(
        &mut self,
        shared: &MrTable<P>,
        pd: &P::Pd,
        bufs: &SgList,
        len: u32,
        remote: &RemoteBuf,
        read: bool,
        last: Token,
    ) -> Result<u32, TransportError> {
        let first_pend = self.pend.len();
        let first_sge = self.sges.len();
        let mut left = len as usize;
        let mut off = 0u64;
        let mut iter = bufs.iter().peekable();
        while left > 0 {
            let sge_start = self.sges.len() as u32;
            let mut n = 0u32;
            let mut chunk = 0u64;
            while n < self.max_sge && left > 0 {
                let Some(b) = iter.next() else {
                    break;
                };
                let take = b.len().min(left);
                let lkey = match self.lkey(shared, pd, b) {
                    Ok(k) => k,
                    Err(e) => {
                        self.pend.truncate(first_pend);
                        self.sges.truncate(first_sge);
                        return Err(e);
                    }
                };
                self.sges.push(Sge {
                    addr: b.addr() as u64,
                    length: take as u32,
                    lkey,
                });
                left -= take;
                chunk += take as u64;
                n += 1;
            }
            if n == 0 {
                self.pend.truncate(first_pend);
                self.sges.truncate(first_sge);
                return Err(TransportError::Other(
                    "data buffers shorter than the transfer".into(),
                ));
            }
            let ra = RemoteAddr {
                addr: remote.addr.wrapping_add(off),
                rkey: remote.key,
            };
            self.pend.push(PendWr {
                token: Token::new(WrKind::Data, self.slot, self.gen, last.index),
                op: if read {
                    PendOp::Read(ra)
                } else {
                    PendOp::Write(ra)
                },
                sge_start,
                sge_n: n,
                signaled: false,
                cqe_slot: 0,
            });
            off += chunk;
        }
        let n = (self.pend.len() - first_pend) as u32;
        if read {
            if let Some(p) = self.pend.last_mut() {
                p.token = last;
                p.signaled = true;
            }
        }
        let _ = iter.peek();
        Ok(n)
    }

    /// WRs needed to move `len` bytes of `bufs`.
    fn wrs_for(&self, bufs: &SgList, len: u32) -> u32 {
        let mut left = len as usize;
        let mut n = 0u32;
        for b in bufs.iter() {
            if left == 0 {
                break;
            }
            left -= b.len().min(left);
            n += 1;
        }
        n.div_ceil(self.max_sge)
    }
}

/// The SGEs of a pending data WR.
#[inline]
fn sges_of<'a>(sges: &'a [Sge], p: &PendWr) -> &'a [Sge] {
    sges.get(p.sge_start as usize..(p.sge_start + p.sge_n) as usize)
        .unwrap_or(&[])
}

/// The stored CQE a pending response SEND carries.
#[inline]
fn cqe_of<'a>(cqes: &'a [[u8; CQE_SIZE]], p: &PendWr) -> &'a [u8] {
    cqes.get(p.cqe_slot as usize).map_or(&[], |c| &c[..])
}

/// [`QpairOps`] for one queue, borrowing the poll group's shared state.
pub(crate) struct RdmaOps<'a, P: Provider> {
    pub(crate) io: &'a mut ConnIo<P>,
    pub(crate) shared: &'a MrTable<P>,
    pub(crate) pd: &'a P::Pd,
}

impl<P: Provider> QpairOps for RdmaOps<'_, P> {
    fn data_from_host(
        &mut self,
        tag: ReqTag,
        remote: &RemoteBuf,
        bufs: &mut SgList,
    ) -> Result<Transfer, TransportError> {
        let io = &mut *self.io;
        if io.closing {
            return Err(TransportError::Disconnected);
        }
        let one = match bufs.as_slice() {
            [b] if remote.len > 0 && b.len() >= remote.len as usize => Some(b),
            _ => None,
        };
        let n = match one {
            Some(_) => 1,
            None => io.wrs_for(bufs, remote.len),
        };
        let reads_ok = io.rd_avail >= n || io.rd_avail == io.rd_depth;
        if n > io.sq_avail || !reads_ok {
            io.busy += 1;
            return Ok(Transfer::Busy);
        }
        let last = Token::new(WrKind::Read, io.slot, io.gen, tag.to_u64() as u32);
        let n = match one {
            Some(b) => {
                io.queue_one(self.shared, self.pd, b, remote.len, remote, true, last)?;
                1
            }
            None => io.queue_data(self.shared, self.pd, bufs, remote.len, remote, true, last)?,
        };
        io.sq_avail -= n;
        io.rd_avail = io.rd_avail.saturating_sub(n);
        io.req_wrs[tag.slot()] = n;
        io.req_reads[tag.slot()] = n;
        io.req_tag[tag.slot()] = tag.0;
        Ok(Transfer::Pending)
    }

    fn send_response(
        &mut self,
        tag: ReqTag,
        rsp: &Response<'_>,
    ) -> Result<Transfer, TransportError> {
        let io = &mut *self.io;
        if io.closing {
            return Err(TransportError::Disconnected);
        }
        // The common response: its data in one buffer (one WRITE of one SGE).
        let (writes, one) = match &rsp.data {
            None => (0, None),
            Some(d) => {
                let len = d.len.min(d.remote.len);
                match d.bufs.as_slice() {
                    [b] if len > 0 && b.len() >= len as usize => (1, Some((b, len, &d.remote))),
                    _ => (io.wrs_for(d.bufs, len), None),
                }
            }
        };
        if writes + 1 > io.sq_avail {
            io.busy += 1;
            return Ok(Transfer::Busy);
        }
        let slot = tag.slot();
        let token = Token::new(WrKind::Send, io.slot, io.gen, tag.to_u64() as u32);
        match (one, &rsp.data) {
            (Some((b, len, remote)), _) => {
                io.queue_one(self.shared, self.pd, b, len, remote, false, token)?;
            }
            (None, Some(d)) => {
                let len = d.len.min(d.remote.len);
                io.queue_data(self.shared, self.pd, d.bufs, len, &d.remote, false, token)?;
            }
            (None, None) => {}
        }
        io.cqes[slot] = rsp.cqe;
        let op = match rsp.invalidate_key {
            Some(k) if io.send_inv => PendOp::SendInv(k),
            _ => PendOp::Send,
        };
        io.queue_send(token, op, slot as u32);
        io.sq_avail -= writes + 1;
        io.req_wrs[slot] = writes + 1;
        io.req_tag[slot] = tag.0;
        Ok(Transfer::Pending)
    }

    fn disconnect(&mut self) {
        self.io.disconnect_requested = true;
    }
}

impl<P: Provider> Conn<P> {
    /// A one-line account of what the queue still holds (requests not free,
    /// by state and parking, and the send-queue bookkeeping), for the debug
    /// log of a queue being torn down. Control path (allocates).
    pub(crate) fn describe(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        for (i, r) in self.core.reqs.iter().enumerate() {
            if r.state == super::super::req::ReqState::Free {
                continue;
            }
            let _ = write!(
                out,
                " [req {i} cid {:#x} opc {:#x} {:?}{}{}]",
                r.cmd.cid,
                r.cmd.opcode,
                r.state,
                r.parked_in
                    .map_or(String::new(), |q| format!(" parked {q:?}")),
                r.remote.map_or(String::new(), |k| format!(
                    " key {:#x} inv {}",
                    k.key, k.invalidate
                )),
            );
        }
        let io = &self.io;
        format!(
            "qid {}: sq_avail {}/{} rd_avail {}/{} unsig {} (pushed {} popped {}) backlog {} \
             busy {} doorbells {}; requests not free:{}",
            self.qid,
            io.sq_avail,
            io.sq_size,
            io.rd_avail,
            io.rd_depth,
            io.unsig.len(),
            io.unsig_pushed,
            io.unsig_popped,
            self.backlog.len(),
            io.busy,
            io.doorbells,
            if out.is_empty() { " none" } else { &out },
        )
    }
}

/// One connection of a poll group (one NVMe queue). Dropped in field
/// order: the QP first (no DMA into our buffers after it), then the core's
/// queue (bdev I/O still in flight owns its buffers and completes into the
/// void).
pub(crate) struct Conn<P: Provider> {
    pub(crate) link: Link<P>,
    pub(crate) core: QueuePair,
    pub(crate) io: ConnIo<P>,
    pub(crate) qid: u16,
    /// Receive buffers this queue owns (no SRQ).
    pub(crate) own_recvs: Vec<u32>,
    /// Capsules waiting for a free request (the host ran ahead of the
    /// completions it has seen): `(receive buffer, length)`.
    pub(crate) backlog: VecDeque<(u32, u32)>,
}

impl<P: Provider> GroupConn<P> for Conn<P> {
    fn link(&self) -> &Link<P> {
        &self.link
    }

    fn link_mut(&mut self) -> &mut Link<P> {
        &mut self.link
    }

    fn closing(&mut self) {
        if log::log_enabled!(log::Level::Debug) {
            log::debug!("nvmf rdma: closing {}", self.describe());
        }
        self.io.closing = true;
    }

    /// Live, no request in use but the AERs the host left with the target
    /// (a poll of the queue, at the group's sleep tick at the latest,
    /// answers one when an event comes), no capsule waiting for a request,
    /// nothing queued to post and no RDMA READ outstanding (unsignaled
    /// SENDs may still be counted against the send queue: they are posted,
    /// and nothing waits for their completion).
    fn settled(&self) -> bool {
        self.link.is_live()
            && self.core.working() == 0
            && self.backlog.is_empty()
            && self.io.pend.is_empty()
            && self.io.rd_avail == self.io.rd_depth
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pollux_verbs::soft::Soft;

    fn io() -> ConnIo<Soft> {
        ConnIo::new(0, 0, 4, 16, 4, 2, true)
    }

    /// Request `tag` holds `n` send-queue slots (as `send_response` leaves it).
    fn hold(io: &mut ConnIo<Soft>, tag: ReqTag, n: u32) {
        io.sq_avail -= n;
        io.req_wrs[tag.slot()] = n;
        io.req_tag[tag.slot()] = tag.0;
    }

    #[test]
    fn a_signaled_send_retires_the_unsignaled_ones_before_it() {
        let mut io = io();
        let (a, b) = (ReqTag::new(0, 1), ReqTag::new(1, 1));
        hold(&mut io, a, 2);
        hold(&mut io, b, 1);
        // a's SEND went unsignaled, b's signaled in the same flush.
        io.unsig.push_back(a.0);
        io.unsig_pushed = 1;
        io.req_upto[b.slot()] = 1;
        let mut done = Vec::new();
        io.sends_done(b, |t| done.push(t));
        assert_eq!(done, vec![a, b]);
        assert_eq!(io.sq_avail, 16);
        assert!(io.unsig.is_empty());
    }

    #[test]
    fn a_stale_completion_releases_nothing_of_the_slots_new_request() {
        let mut io = io();
        let old = ReqTag::new(0, 1);
        let new = ReqTag::new(0, 2);
        hold(&mut io, new, 3);
        io.req_upto[0] = 1;
        io.unsig.push_back(ReqTag::new(1, 1).0);
        io.unsig_pushed = 1;
        // An unsignaled SEND of the slot's previous request, flushed in
        // error: it completes on its own and must neither free the new
        // request's send-queue slots nor retire others on its behalf.
        let mut done = Vec::new();
        io.sends_done(old, |t| done.push(t));
        assert_eq!(done, vec![old]);
        assert_eq!(io.sq_avail, 13);
        assert_eq!(io.unsig.len(), 1);
        io.read_done(old);
        assert_eq!(io.sq_avail, 13);
        // The new request's own completion releases them.
        io.sends_done(new, |t| done.push(t));
        assert_eq!(io.sq_avail, 16);
        assert!(io.unsig.is_empty());
    }
}
