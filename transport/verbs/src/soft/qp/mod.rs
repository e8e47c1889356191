//! RC queue pairs: post-time checks, the send-queue executor (WRITE/READ as
//! one copy between mappings, SEND through the ring, local key operations),
//! in-order retirement with RC-ack semantics, the responder, and error/flush
//! (the requester, responder, signature and fast-path halves live in the
//! submodules of those names).
//!
//! Semantics chosen (and why they keep the verbs ordering guarantees):
//! - WRs execute in posting order, at `post_send` and again from the send
//!   CQ's poll when one was blocked (ring full). WRITE/READ data moves when
//!   the WR executes; a SEND is published to the ring after everything
//!   posted before it has executed, so "WRITE then SEND" data is in the
//!   responder's memory before the SEND can be consumed (release/acquire
//!   on the record's stamp, see [`super::ring`]).
//! - Fast path: a SEND posted with nothing queued before it (RTS, payload
//!   inline or one SGE of a regular MR, key checked through a per-QP cache)
//!   is copied by `post_send` straight from the user's memory into the ring
//!   slot; the tail is published once per `post_send`. On the responder, a
//!   SEND into a one-SGE receive of a regular MR is copied straight from the
//!   ring into it. Everything else (and every error) takes the general path.
//! - A SEND (or WRITE_WITH_IMM) completes when the responder has consumed it
//!   into a receive (the ring head passed it): RC ack semantics. Send
//!   completions come out in posting order. The requester reads the shared
//!   head only while a signaled WR is unretired or the SQ is half full
//!   (unsignaled WRs are retired in bulk then), so the responder's head
//!   store usually hits its own cache.
//! - FENCE is implied: a WR never starts before earlier WRs executed, and
//!   READs execute synchronously.
//! - RNR: a SEND with no receive posted stays at the ring head (blocking
//!   later messages of that QP, as an RC retry would); the responder fails
//!   it with RNR_RETRY_EXC_ERR once `rnr_retry × min_rnr_timer` has passed
//!   (never with 7).

mod direct;
mod requester;
mod responder;
mod signature;

use direct::Direct;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::cq::{CqInner, SoftCq};
use super::integrity::{self, Layout, Side};
use super::link::{Link, FATAL_ACCESS, FATAL_ERR};
use super::mr::{resolve, resolve_sig, KeyErr, SigSide};
use super::pd::{KeyCache, SoftPd};
use super::ring::{
    check_tail, has_record, peek, produce, rec_len, release, stamped, touch_next_line, RecHdr,
    CTL_HEAD, CTL_NAK, CTL_RNR_RETRY, CTL_TAIL, REC_PAD, REC_SEND, REC_WRITE_IMM, RF_IMM, RF_INV,
};
use super::shm::{copy_spans, Span, SpanList};
use super::srq::{RecvQueue, SoftSrq};
use super::state_table::{inbound_processed, recv_allowed, send_allowed, transition_allowed};
use super::Soft;
use crate::error::{PostError, PostErrorKind, VerbsError};
use crate::provider::{QpInit, QueuePair};
use crate::sig::SigAttrs;
use crate::types::{
    rnr_timer_us, Access, AsyncEvent, QpAttr, QpCaps, QpState, RemoteAddr, SendFlags, Sge, Wc,
    WcFlags, WcOpcode, WcStatus, WrId,
};
use crate::wr::{RecvWr, SendOp, SendWr};

/// Inbound records handled per poll and QP.
const RECV_BATCH: usize = 256;
/// Progress steps between two looks at the peer's words that change only
/// on errors (NAK, peer state) and at the inbound ring's published tail
/// (torn-ring detection), while a QP has nothing to consume or retire.
/// Idle polls then read one word: the inbound ring's next stamp. A step
/// that consumes or retires something always looks.
pub(crate) const SLOW_CHECK_EVERY: u32 = 32;
const NAK_POS_MASK: u64 = (1 << 56) - 1;

#[derive(Debug, Clone, Copy)]
enum OpCopy {
    Send,
    SendImm(u32),
    SendInv(u32),
    Write(RemoteAddr),
    WriteImm(RemoteAddr, u32),
    Read(RemoteAddr),
    LocalInv(u32),
    /// REG_MR (`integrity`: REG_MR_INTEGRITY, its attributes in the send
    /// queue's `sigs`, out of the slot to keep slots small).
    RegMr {
        key: u32,
        iova: u64,
        access: Access,
        integrity: bool,
        /// Trailing SGEs that are the PI list (integrity only).
        nprot: u32,
    },
}

impl OpCopy {
    fn wc_opcode(&self) -> WcOpcode {
        match self {
            OpCopy::Send | OpCopy::SendImm(_) | OpCopy::SendInv(_) => WcOpcode::Send,
            OpCopy::Write(_) | OpCopy::WriteImm(..) => WcOpcode::RdmaWrite,
            OpCopy::Read(_) => WcOpcode::RdmaRead,
            OpCopy::LocalInv(_) => WcOpcode::LocalInv,
            OpCopy::RegMr {
                integrity: false, ..
            } => WcOpcode::RegMr,
            OpCopy::RegMr {
                integrity: true, ..
            } => WcOpcode::RegMrIntegrity,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Pending,
    Ack { start: u64, end: u64 },
    Done(WcStatus),
}

#[derive(Debug, Clone, Copy)]
struct SqSlot {
    wr_id: WrId,
    op: OpCopy,
    signaled: bool,
    inline: bool,
    nsge: u32,
    inline_len: u32,
    byte_len: u32,
    st: SlotState,
}

/// The send queue: slots plus per-slot SGE and inline storage, allocated
/// once. Counters are free-running: `head ≤ exec ≤ tail`.
struct SendQueue {
    slots: Vec<SqSlot>,
    /// REG_MR_INTEGRITY attributes, by slot.
    sigs: Vec<Option<SigAttrs>>,
    sges: Vec<Sge>,
    inl: Vec<u8>,
    max_sge: usize,
    max_inline: usize,
    /// `max_send_wr`.
    depth: u64,
    head: u64,
    exec: u64,
    tail: u64,
    /// Counter just past the newest signaled WR (0: none yet).
    sig_upto: u64,
}

impl SendQueue {
    /// Slot of counter `c` (the slot array is a power of two: no division).
    fn idx(&self, c: u64) -> usize {
        (c & (self.slots.len() as u64 - 1)) as usize
    }

    /// Whether retiring needs the peer's acknowledgement (the shared head
    /// line): only while a signaled WR is unretired, or the queue is half
    /// full (unsignaled WRs free their slots). Otherwise the line stays in
    /// the peer's cache and the peer's head store is a cache hit, not a
    /// transfer on its critical path. A WR finished locally (error, flush,
    /// local operation) retires without it.
    fn wants_ack(&self) -> bool {
        self.head < self.exec
            && (self.sig_upto > self.head || 2 * (self.tail - self.head) >= self.depth)
    }

    /// Whether the oldest unretired WR finished locally.
    fn front_done(&self) -> bool {
        self.head < self.exec && matches!(self.slots[self.idx(self.head)].st, SlotState::Done(_))
    }
}

enum Run {
    Done,
    Ack(u64, u64),
    Blocked,
    Fail(WcStatus, u32),
}

/// A soft RC queue pair (`!Send`).
#[derive(Clone)]
pub struct SoftQp(pub(crate) Rc<QpInner>);

pub(crate) struct QpInner {
    pub(crate) pd: SoftPd,
    pub(crate) num: u32,
    caps: QpCaps,
    /// The device's largest message (checked per SEND).
    max_msg_size: u32,
    pub(crate) send_cq: SoftCq,
    pub(crate) recv_cq: SoftCq,
    srq: Option<SoftSrq>,
    sq_sig_all: bool,
    state: Cell<QpState>,
    rnr_retry: Cell<u8>,
    min_rnr_timer: Cell<u8>,
    sq: RefCell<SendQueue>,
    rq: RefCell<RecvQueue>,
    pub(crate) link: RefCell<Option<Rc<Link>>>,
    rnr_since: Cell<Option<Instant>>,
    /// Fault injection: polls to skip.
    pub(crate) stall: Cell<u32>,
    /// Local key of the last send SGE (kept across posts, see
    /// [`super::pd::PdInner::resolve_local_cached`]).
    send_keys: Cell<KeyCache>,
    /// Local key of the last receive SGE filled by this QP.
    recv_keys: Cell<KeyCache>,
    /// Receive-side progress steps until the next slow check (see
    /// [`SLOW_CHECK_EVERY`]).
    recv_slow_in: Cell<u32>,
    /// Send-side progress steps until the next slow check.
    send_slow_in: Cell<u32>,
}

impl SoftQp {
    pub(crate) fn new(pd: &SoftPd, init: &QpInit<'_, Soft>) -> Result<SoftQp, VerbsError> {
        let dc = &pd.0.dev.0.caps;
        let c = init.caps;
        if c.max_send_wr == 0
            || c.max_send_wr > dc.max_qp_wr
            || c.max_recv_wr > dc.max_qp_wr
            || c.max_send_sge > dc.max_sge
            || c.max_recv_sge > dc.max_sge
            || c.max_inline_data > dc.max_inline_data
        {
            return Err(VerbsError::InvalidArgument("QP caps above device limits"));
        }
        let same_dev = |cq: &SoftCq| Rc::ptr_eq(&cq.0.dev().0, &pd.0.dev.0);
        if !same_dev(init.send_cq) || !same_dev(init.recv_cq) {
            return Err(VerbsError::InvalidArgument("CQ of another device"));
        }
        if let Some(s) = init.srq {
            if !Rc::ptr_eq(&s.0.pd.0, &pd.0) {
                return Err(VerbsError::InvalidArgument("SRQ of another PD"));
            }
        }
        let caps = QpCaps {
            max_recv_wr: if init.srq.is_some() { 0 } else { c.max_recv_wr },
            ..c
        };
        // Slot storage rounded up to a power of two; the queue still holds
        // at most `max_send_wr` WRs.
        let ring = c.max_send_wr.next_power_of_two();
        let sq = SendQueue {
            slots: vec![
                SqSlot {
                    wr_id: WrId(0),
                    op: OpCopy::Send,
                    signaled: false,
                    inline: false,
                    nsge: 0,
                    inline_len: 0,
                    byte_len: 0,
                    st: SlotState::Pending,
                };
                ring as usize
            ],
            sigs: vec![None; ring as usize],
            sges: vec![Sge::default(); (ring * c.max_send_sge.max(1)) as usize],
            inl: vec![0; (ring * c.max_inline_data) as usize],
            max_sge: c.max_send_sge.max(1) as usize,
            max_inline: c.max_inline_data as usize,
            depth: u64::from(c.max_send_wr),
            head: 0,
            exec: 0,
            tail: 0,
            sig_upto: 0,
        };
        let max_msg_size = pd.0.dev.0.caps.max_msg_size;
        let inner = Rc::new(QpInner {
            pd: pd.clone(),
            num: pd.0.dev.0.next_num(),
            caps,
            max_msg_size,
            send_cq: init.send_cq.clone(),
            recv_cq: init.recv_cq.clone(),
            srq: init.srq.cloned(),
            sq_sig_all: init.sq_sig_all,
            state: Cell::new(QpState::Reset),
            rnr_retry: Cell::new(7),
            min_rnr_timer: Cell::new(1),
            sq: RefCell::new(sq),
            rq: RefCell::new(RecvQueue::new(
                caps.max_recv_wr as usize,
                c.max_recv_sge.max(1) as usize,
            )),
            link: RefCell::new(None),
            rnr_since: Cell::new(None),
            stall: Cell::new(0),
            send_keys: Cell::new(KeyCache::default()),
            recv_keys: Cell::new(KeyCache::default()),
            recv_slow_in: Cell::new(0),
            send_slow_in: Cell::new(0),
        });
        for cq in [init.send_cq, init.recv_cq] {
            let mut l = cq.0.qps.borrow_mut();
            l.retain(|w| w.strong_count() > 0);
            if !l.iter().any(|w| w.as_ptr() == Rc::as_ptr(&inner)) {
                l.push(Rc::downgrade(&inner));
            }
        }
        Ok(SoftQp(inner))
    }

    /// The QP's receive-queue SRQ, if any.
    pub fn srq(&self) -> Option<&SoftSrq> {
        self.0.srq.as_ref()
    }
}

impl QpInner {
    /// Attach the peer link (CM, before RTR).
    pub(crate) fn attach(&self, link: Rc<Link>) {
        *self.link.borrow_mut() = Some(link);
    }

    pub(crate) fn set_rnr_retry(&self, r: u8) {
        self.rnr_retry.set(r.min(7));
    }

    /// Drive the QP from a poll of `cq`. An idle step (nothing inbound,
    /// nothing to retire) reads the inbound ring's next stamp word and
    /// little else; the words that change only on errors are read every
    /// [`SLOW_CHECK_EVERY`] steps.
    #[inline(always)]
    pub(crate) fn progress(&self, cq: &CqInner) {
        let stall = self.stall.get();
        if stall > 0 {
            self.stall.set(stall - 1);
            return;
        }
        if std::ptr::eq(cq, &*self.recv_cq.0) {
            let slow = slow_due(&self.recv_slow_in);
            if slow || !self.inbound_idle() {
                self.recv(slow);
            }
        }
        if std::ptr::eq(cq, &*self.send_cq.0) {
            let slow = slow_due(&self.send_slow_in);
            if slow || self.send_busy() {
                self.execute();
                self.retire(slow);
            }
        }
    }

    /// Nothing inbound: the ring's next stamp word is clear (or there is
    /// no link). Pulls the line after it too (see [`touch_next_line`]).
    #[inline(always)]
    fn inbound_idle(&self) -> bool {
        let link = self.link.borrow();
        let Some(l) = link.as_deref() else {
            return true;
        };
        let head = l.in_head.get();
        if stamped(&l.shm, l.in_d, head) {
            return false;
        }
        touch_next_line(&l.shm, l.in_d, head);
        true
    }

    /// Work for the send side: WRs to execute, an acknowledgement to
    /// read, or WRs finished locally to retire.
    #[inline(always)]
    fn send_busy(&self) -> bool {
        let sq = self.sq.borrow();
        sq.exec != sq.tail || sq.wants_ack() || sq.front_done()
    }

    /// Arm wake-ups from the peer for `cq`; true if work is already pending.
    pub(crate) fn arm_links(&self, cq: &CqInner) -> bool {
        let link = self.link.borrow().clone();
        let Some(l) = link else { return false };
        let mut pending = false;
        if std::ptr::eq(cq, &*self.recv_cq.0) {
            super::link::arm(&l.shm, l.in_ctl(super::ring::CTL_CONSUMER_ARMED));
            let tail = l.shm.u64_at(l.in_ctl(CTL_TAIL)).load(Ordering::Acquire);
            let head = l.in_head.get();
            pending |= has_record(&l.shm, l.in_d, head) || tail.wrapping_sub(head) as i64 > 0;
        }
        if std::ptr::eq(cq, &*self.send_cq.0) {
            super::link::arm(&l.shm, l.out_ctl(super::ring::CTL_PRODUCER_ARMED));
            let sq = self.sq.borrow();
            pending |= sq.wants_ack() || sq.front_done();
        }
        pending
    }

    /// The CQ died (overflow): ERR.
    pub(crate) fn cq_died(&self) {
        self.to_err(None, Some(AsyncEvent::QpFatal { qp_num: self.num }));
    }

    /// Enter ERR: flush the SQ (the first unfinished WR gets `head_status`
    /// if given) and the RQ, tell the peer, raise `ev`.
    pub(crate) fn to_err(&self, head_status: Option<WcStatus>, ev: Option<AsyncEvent>) {
        if self.state.get() == QpState::Err {
            return;
        }
        self.state.set(QpState::Err);
        {
            let mut sq = self.sq.borrow_mut();
            let mut hs = head_status;
            for c in sq.head..sq.tail {
                let i = sq.idx(c);
                if !matches!(sq.slots[i].st, SlotState::Done(_)) {
                    sq.slots[i].st = SlotState::Done(hs.take().unwrap_or(WcStatus::WrFlushErr));
                }
            }
            sq.exec = sq.tail;
        }
        self.flush_rq();
        let dev = &self.pd.0.dev.0;
        if let Some(ev) = ev {
            dev.push_event(ev);
        }
        if self.srq.is_some() {
            dev.push_event(AsyncEvent::QpLastWqeReached { qp_num: self.num });
        }
        if let Some(l) = self.link.borrow().as_ref() {
            l.set_fatal(FATAL_ERR);
        }
        self.send_cq.0.signal();
    }

    fn flush_rq(&self) {
        let mut rq = self.rq.borrow_mut();
        while let Some(id) = rq.pop() {
            self.recv_cq
                .0
                .push(self.err_wc(id, WcStatus::WrFlushErr, WcOpcode::Recv));
        }
    }

    fn err_wc(&self, wr_id: WrId, status: WcStatus, opcode: WcOpcode) -> Wc {
        Wc {
            wr_id,
            status,
            opcode,
            qp_num: self.num,
            ..Wc::default()
        }
    }
}

/// Count down one progress step; true (and restart) when a slow check is due.
#[inline(always)]
fn slow_due(c: &Cell<u32>) -> bool {
    match c.get() {
        0 => {
            c.set(SLOW_CHECK_EVERY - 1);
            true
        }
        n => {
            c.set(n - 1);
            false
        }
    }
}

fn ring_has_room(l: &Link, tail: u64, len: usize) -> bool {
    let head = l.shm.u64_at(l.out_ctl(CTL_HEAD)).load(Ordering::Acquire);
    // Room for the record, a PAD header and the next slot's stamp word.
    tail.wrapping_sub(head) + 3 * rec_len(len) <= super::ring::RING_SIZE
}

impl QueuePair for SoftQp {
    fn qp_num(&self) -> u32 {
        self.0.num
    }

    fn state(&self) -> QpState {
        self.0.state.get()
    }

    fn caps(&self) -> QpCaps {
        self.0.caps
    }

    fn modify(&self, attr: &QpAttr) -> Result<(), VerbsError> {
        let q = &self.0;
        let from = q.state.get();
        let to = attr.state;
        if !transition_allowed(from, to) {
            return Err(VerbsError::InvalidTransition { from, to });
        }
        match to {
            QpState::Reset => {
                let mut sq = q.sq.borrow_mut();
                sq.head = 0;
                sq.exec = 0;
                sq.tail = 0;
                sq.sig_upto = 0;
                q.rq.borrow_mut().clear();
                q.state.set(QpState::Reset);
            }
            QpState::Err => q.to_err(None, None),
            QpState::Rtr => {
                q.min_rnr_timer.set(attr.min_rnr_timer & 31);
                q.state.set(to);
            }
            QpState::Rts => {
                q.set_rnr_retry(attr.rnr_retry);
                if let Some(l) = q.link.borrow().as_ref() {
                    l.shm
                        .u32_at(l.out_ctl(CTL_RNR_RETRY))
                        .store(u32::from(q.rnr_retry.get()), Ordering::Release);
                }
                q.state.set(to);
            }
            _ => q.state.set(to),
        }
        Ok(())
    }

    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        let q = &self.0;
        let mut res = Ok(());
        // Shared borrow for the whole post (only the CM's attach, never
        // reached from here, borrows it mutably).
        let link = q.link.borrow();
        let queued = {
            let mut sq = q.sq.borrow_mut();
            let mut direct = Direct {
                tail: link.as_ref().map_or(0, |l| l.out_tail.get()),
                keys: q.send_keys.get(),
            };
            for (index, wr) in wrs.iter().enumerate() {
                // One SGE (the common WR) without the general sum.
                let payload_len = match (wr.flags.contains(SendFlags::INLINE), wr.sg_list) {
                    (false, [one]) => u64::from(one.length),
                    _ => wr.payload_len(),
                };
                if let Err(kind) = q.check_send(&sq, wr, payload_len) {
                    res = Err(PostError { index, kind });
                    break;
                }
                if let Some(l) = link.as_deref() {
                    // Nothing waits before this WR: a SEND goes straight
                    // into the ring, an RDMA WRITE straight into the
                    // peer's memory.
                    if sq.exec == sq.tail
                        && q.state.get() == QpState::Rts
                        && (q.send_direct(&mut sq, wr, l, &mut direct)
                            || q.write_direct(&mut sq, wr, l, &mut direct))
                    {
                        continue;
                    }
                }
                let mut sig_attrs = None;
                let (op, extra) = match wr.op {
                    SendOp::Send => (OpCopy::Send, &[][..]),
                    SendOp::SendWithImm { imm } => (OpCopy::SendImm(imm), &[][..]),
                    SendOp::SendWithInv { rkey } => (OpCopy::SendInv(rkey), &[][..]),
                    SendOp::RdmaWrite { remote } => (OpCopy::Write(remote), &[][..]),
                    SendOp::RdmaWriteWithImm { remote, imm } => {
                        (OpCopy::WriteImm(remote, imm), &[][..])
                    }
                    SendOp::RdmaRead { remote } => (OpCopy::Read(remote), &[][..]),
                    SendOp::LocalInv { key } => (OpCopy::LocalInv(key), &[][..]),
                    SendOp::RegMr { key, iova, access } => (
                        OpCopy::RegMr {
                            key,
                            iova,
                            access,
                            integrity: false,
                            nprot: 0,
                        },
                        &[][..],
                    ),
                    SendOp::RegMrIntegrity {
                        key,
                        iova,
                        access,
                        sig,
                        prot,
                    } => {
                        sig_attrs = Some(sig);
                        (
                            OpCopy::RegMr {
                                key,
                                iova,
                                access,
                                integrity: true,
                                nprot: prot.len() as u32,
                            },
                            prot,
                        )
                    }
                };
                let inline = wr.flags.contains(SendFlags::INLINE);
                let c = sq.tail;
                let i = sq.idx(c);
                let s0 = i * sq.max_sge;
                let n = if inline { 0 } else { wr.sg_list.len() };
                if let [one] = &wr.sg_list[..n] {
                    sq.sges[s0] = *one;
                } else {
                    sq.sges[s0..s0 + n].copy_from_slice(&wr.sg_list[..n]);
                }
                if !extra.is_empty() {
                    sq.sges[s0 + n..s0 + n + extra.len()].copy_from_slice(extra);
                }
                let il = if inline { wr.inline.len() } else { 0 };
                if il > 0 {
                    let i0 = i * sq.max_inline;
                    sq.inl[i0..i0 + il].copy_from_slice(&wr.inline[..il]);
                }
                if sig_attrs.is_some() || matches!(op, OpCopy::RegMr { .. }) {
                    sq.sigs[i] = sig_attrs;
                }
                let st = if q.state.get() == QpState::Err {
                    SlotState::Done(WcStatus::WrFlushErr)
                } else {
                    SlotState::Pending
                };
                let signaled = q.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED);
                if signaled {
                    sq.sig_upto = c + 1;
                }
                sq.slots[i] = SqSlot {
                    wr_id: wr.wr_id,
                    op,
                    signaled,
                    inline,
                    nsge: (n + extra.len()) as u32,
                    inline_len: il as u32,
                    byte_len: u32::try_from(payload_len).unwrap_or(u32::MAX),
                    st,
                };
                sq.tail += 1;
                if q.state.get() == QpState::Err {
                    sq.exec = sq.tail;
                }
            }
            q.send_keys.set(direct.keys);
            if let Some(l) = link.as_deref() {
                l.out_tail.set(direct.tail);
            }
            sq.exec < sq.tail
        };
        if queued {
            // WRs the fast path did not take: the executor runs them (and
            // publishes what the fast path produced before them).
            q.execute();
        } else if let Some(l) = link.as_deref() {
            // One tail store (and wake-up check) for the whole post.
            l.publish_out();
        }
        if q.state.get() == QpState::Err {
            q.send_cq.0.signal();
        }
        res
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        let q = &self.0;
        if q.srq.is_some() {
            return Err(PostError {
                index: 0,
                kind: PostErrorKind::UsesSrq,
            });
        }
        let st = q.state.get();
        if !recv_allowed(st) {
            return Err(PostError {
                index: 0,
                kind: PostErrorKind::WrongState(st),
            });
        }
        let mut rq = q.rq.borrow_mut();
        for (index, wr) in wrs.iter().enumerate() {
            rq.push(wr).map_err(|kind| PostError { index, kind })?;
        }
        drop(rq);
        if st == QpState::Err {
            q.flush_rq();
        }
        Ok(())
    }
}
