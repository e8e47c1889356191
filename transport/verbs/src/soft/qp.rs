//! RC queue pairs: post-time checks, the send-queue executor (WRITE/READ as
//! one copy between mappings, SEND through the ring, local key operations),
//! in-order retirement with RC-ack semantics, the responder, and error/flush.
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

    /// Execute queued send WRs in order until one blocks or fails.
    #[inline(never)]
    fn execute(&self) {
        {
            let sq = self.sq.borrow();
            if sq.exec == sq.tail {
                return;
            }
        }
        let link = self.link.borrow().clone();
        let mut fail = None;
        {
            let mut sq = self.sq.borrow_mut();
            if self.state.get() != QpState::Rts {
                return;
            }
            let mut tail = link.as_ref().map_or(0, |l| l.out_tail.get());
            // Local keys resolved once (see `resolve_local_cached`).
            let mut keys = self.send_keys.get();
            while sq.exec < sq.tail {
                let i = sq.idx(sq.exec);
                let slot = sq.slots[i];
                let s0 = i * sq.max_sge;
                let sges = &sq.sges[s0..s0 + slot.nsge as usize];
                let i0 = i * sq.max_inline;
                let inl = &sq.inl[i0..i0 + slot.inline_len as usize];
                let sig = sq.sigs[i];
                let r = self.run(&slot, sig, sges, inl, link.as_deref(), &mut tail, &mut keys);
                match r {
                    Run::Done => sq.slots[i].st = SlotState::Done(WcStatus::Success),
                    Run::Ack(start, end) => sq.slots[i].st = SlotState::Ack { start, end },
                    Run::Blocked => break,
                    Run::Fail(st, code) => {
                        sq.slots[i].st = SlotState::Done(st);
                        sq.exec += 1;
                        fail = Some(code);
                        break;
                    }
                }
                sq.exec += 1;
            }
            self.send_keys.set(keys);
            if let Some(l) = link.as_ref() {
                l.out_tail.set(tail);
                l.publish_out();
            }
        }
        if let Some(code) = fail {
            let ev = AsyncEvent::QpFatal { qp_num: self.num };
            if code == FATAL_ACCESS {
                if let Some(l) = link.as_ref() {
                    l.set_fatal(FATAL_ACCESS);
                }
            }
            self.to_err(None, Some(ev));
        }
    }

    /// Gather the payload of a send-type WR.
    fn gather(
        &self,
        slot: &SqSlot,
        sges: &[Sge],
        inl: &[u8],
        out: &mut SpanList,
        keys: &mut KeyCache,
    ) -> bool {
        if slot.inline {
            return out.push(Span {
                ptr: inl.as_ptr().cast_mut(),
                len: inl.len(),
            });
        }
        sges.iter()
            .all(|s| self.pd.0.resolve_local_cached(s, Access::NONE, out, keys))
    }

    /// Resolve a remote range against the peer's table, mapping newly
    /// announced arenas once if needed.
    fn remote(&self, l: &Link, ra: RemoteAddr, len: u64, need: Access, out: &mut SpanList) -> bool {
        if let Some(span) = l.rkeys.span(&l.peer_table, ra, len, need) {
            return out.push(span);
        }
        self.remote_full(l, ra, len, need, out)
    }

    /// [`Self::remote`] without a usable cached key: resolve in the peer's
    /// table (mapping new arenas once) and cache the key when it succeeds.
    #[inline(never)]
    fn remote_full(
        &self,
        l: &Link,
        ra: RemoteAddr,
        len: u64,
        need: Access,
        out: &mut SpanList,
    ) -> bool {
        let try_once = |out: &mut SpanList| {
            let arenas = l.peer_arenas.borrow();
            resolve(
                &l.peer_table,
                l.peer_tag,
                ra.rkey,
                ra.addr,
                len,
                need,
                &arenas,
                out,
            )
        };
        let ok = match try_once(out) {
            Ok(()) => true,
            Err(KeyErr::Denied) | Err(KeyErr::Integrity) => false,
            Err(KeyErr::UnknownArena) => {
                l.refresh_arenas();
                *out = SpanList::new();
                try_once(out).is_ok()
            }
        };
        if ok {
            l.rkeys
                .learn(&l.peer_table, l.peer_tag, ra.rkey, &l.peer_arenas.borrow());
        }
        ok
    }

    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        slot: &SqSlot,
        sig: Option<SigAttrs>,
        sges: &[Sge],
        inl: &[u8],
        link: Option<&Link>,
        tail: &mut u64,
        keys: &mut KeyCache,
    ) -> Run {
        let pd = &self.pd.0;
        let needs_link = !matches!(slot.op, OpCopy::LocalInv(_) | OpCopy::RegMr { .. });
        let l = match (needs_link, link) {
            (true, None) => return Run::Fail(WcStatus::RetryExcErr, FATAL_ERR),
            (_, l) => l,
        };
        if matches!(slot.op, OpCopy::LocalInv(_) | OpCopy::RegMr { .. }) {
            // Keys change here: forget the batch's resolved ones.
            keys.clear();
        }
        match slot.op {
            OpCopy::LocalInv(key) => match pd.invalidate(key) {
                Ok(()) => Run::Done,
                Err(_) => Run::Fail(WcStatus::LocQpOpErr, FATAL_ERR),
            },
            OpCopy::RegMr {
                key,
                iova,
                access,
                nprot,
                ..
            } => match pd.fast_reg(key, iova, access, sges, sig, nprot as usize) {
                Ok(()) => Run::Done,
                Err(_) => Run::Fail(WcStatus::LocQpOpErr, FATAL_ERR),
            },
            OpCopy::Send | OpCopy::SendImm(_) | OpCopy::SendInv(_) => {
                let Some(l) = l else { return Run::Blocked };
                let mut src = SpanList::new();
                if !self.gather(slot, sges, inl, &mut src, keys) {
                    return self
                        .run_sig(slot, sges, l, tail)
                        .unwrap_or(Run::Fail(WcStatus::LocProtErr, FATAL_ERR));
                }
                let (flags, imm, aux) = match slot.op {
                    OpCopy::SendImm(i) => (RF_IMM, i, 0),
                    OpCopy::SendInv(k) => (RF_INV, 0, k),
                    _ => (0, 0, 0),
                };
                let hdr = RecHdr {
                    kind: REC_SEND,
                    flags,
                    len: src.total() as u32,
                    imm,
                    aux,
                };
                self.push_record(l, hdr, Some(&src), tail)
            }
            OpCopy::Write(ra) | OpCopy::WriteImm(ra, _) => {
                let Some(l) = l else { return Run::Blocked };
                if let OpCopy::WriteImm(..) = slot.op {
                    // Check ring space first so the data is written once.
                    if !ring_has_room(l, *tail, 0) {
                        return Run::Blocked;
                    }
                }
                let mut src = SpanList::new();
                if !self.gather(slot, sges, inl, &mut src, keys) {
                    return self
                        .run_sig(slot, sges, l, tail)
                        .unwrap_or(Run::Fail(WcStatus::LocProtErr, FATAL_ERR));
                }
                let mut dst = SpanList::new();
                if !self.remote(l, ra, src.total() as u64, Access::REMOTE_WRITE, &mut dst) {
                    return self
                        .run_sig(slot, sges, l, tail)
                        .unwrap_or(Run::Fail(WcStatus::RemAccessErr, FATAL_ACCESS));
                }
                copy_spans(&dst, &src, usize::MAX);
                match slot.op {
                    OpCopy::WriteImm(_, imm) => {
                        let hdr = RecHdr {
                            kind: REC_WRITE_IMM,
                            flags: RF_IMM,
                            len: src.total() as u32,
                            imm,
                            aux: 0,
                        };
                        self.push_record(l, hdr, None, tail)
                    }
                    _ => Run::Done,
                }
            }
            OpCopy::Read(ra) => {
                let Some(l) = l else { return Run::Blocked };
                let mut dst = SpanList::new();
                if !sges
                    .iter()
                    .all(|s| pd.resolve_local_cached(s, Access::LOCAL_WRITE, &mut dst, keys))
                {
                    return self
                        .run_sig(slot, sges, l, tail)
                        .unwrap_or(Run::Fail(WcStatus::LocProtErr, FATAL_ERR));
                }
                let mut src = SpanList::new();
                if !self.remote(l, ra, dst.total() as u64, Access::REMOTE_READ, &mut src) {
                    return self
                        .run_sig(slot, sges, l, tail)
                        .unwrap_or(Run::Fail(WcStatus::RemAccessErr, FATAL_ACCESS));
                }
                copy_spans(&dst, &src, usize::MAX);
                Run::Done
            }
        }
    }

    /// The peer's integrity MR behind `ra` (mapping new arenas once).
    fn remote_sig(&self, l: &Link, ra: RemoteAddr, len: u64, need: Access) -> Option<SigSide> {
        let try_once = || {
            let arenas = l.peer_arenas.borrow();
            resolve_sig(
                &l.peer_table,
                l.peer_tag,
                ra.rkey,
                ra.addr,
                len,
                need,
                &arenas,
            )
        };
        match try_once() {
            Ok(s) => Some(s),
            Err(KeyErr::UnknownArena) => {
                l.refresh_arenas();
                try_once().ok()
            }
            Err(_) => None,
        }
    }

    /// Slow path of SEND/WRITE/READ when the fast path refused a key: run
    /// the WR through an integrity MR ([`integrity`]).
    /// `None` when no integrity MR is involved (the caller reports its own
    /// error).
    #[cold]
    #[inline(never)]
    fn run_sig(&self, slot: &SqSlot, sges: &[Sge], l: &Link, tail: &mut u64) -> Option<Run> {
        let pd = &self.pd.0;
        let local_need = match slot.op {
            OpCopy::Read(_) => Access::LOCAL_WRITE,
            _ => Access::NONE,
        };
        // An integrity SGE must be the only one.
        let local_sig = match (slot.inline, sges) {
            (false, [one]) => pd.resolve_local_sig(one, local_need),
            _ => None,
        };
        let mut local = SpanList::new();
        if local_sig.is_none()
            && (slot.inline
                || !sges
                    .iter()
                    .all(|s| pd.resolve_local(s, local_need, &mut local)))
        {
            return None;
        }
        let len = match &local_sig {
            Some(_) => sges.iter().map(|s| u64::from(s.length)).sum(),
            None => local.total() as u64,
        };
        let fail_local = Run::Fail(WcStatus::LocProtErr, FATAL_ERR);
        let fail_remote = Run::Fail(WcStatus::RemAccessErr, FATAL_ACCESS);
        let (res, remote_sig) = match slot.op {
            OpCopy::Send | OpCopy::SendImm(_) | OpCopy::SendInv(_) => {
                let ls = local_sig.as_ref()?;
                let (flags, imm, aux) = match slot.op {
                    OpCopy::SendImm(i) => (RF_IMM, i, 0),
                    OpCopy::SendInv(k) => (RF_INV, 0, k),
                    _ => (0, 0, 0),
                };
                let Ok(wire) = u32::try_from(len) else {
                    return Some(fail_local);
                };
                let hdr = RecHdr {
                    kind: REC_SEND,
                    flags,
                    len: wire,
                    imm,
                    aux,
                };
                let mut res = Err(Layout);
                let run = self.push_record_with(l, hdr, tail, |span| {
                    let mut dst = SpanList::new();
                    dst.push(span);
                    res = integrity::copy(Side::Plain(&dst), Side::Sig(ls), len);
                });
                if matches!(run, Run::Blocked) {
                    return Some(run);
                }
                match res {
                    Ok(Some(e)) => pd.record_sig_error(e),
                    Ok(None) => {}
                    Err(Layout) => return Some(fail_local),
                }
                return Some(run);
            }
            OpCopy::Write(ra) | OpCopy::WriteImm(ra, _) => {
                let rs = if local_sig.is_none() {
                    Some(self.remote_sig(l, ra, len, Access::REMOTE_WRITE)?)
                } else {
                    None
                };
                let mut dst = SpanList::new();
                let res = match (&local_sig, &rs) {
                    (Some(ls), None) => {
                        if !self.remote(l, ra, len, Access::REMOTE_WRITE, &mut dst) {
                            return Some(fail_remote);
                        }
                        integrity::copy(Side::Plain(&dst), Side::Sig(ls), len)
                    }
                    (None, Some(r)) => integrity::copy(Side::Sig(r), Side::Plain(&local), len),
                    _ => Err(Layout),
                };
                (res, rs.is_some())
            }
            OpCopy::Read(ra) => {
                let rs = if local_sig.is_none() {
                    Some(self.remote_sig(l, ra, len, Access::REMOTE_READ)?)
                } else {
                    None
                };
                let mut src = SpanList::new();
                let res = match (&local_sig, &rs) {
                    (Some(ls), None) => {
                        if !self.remote(l, ra, len, Access::REMOTE_READ, &mut src) {
                            return Some(fail_remote);
                        }
                        integrity::copy(Side::Sig(ls), Side::Plain(&src), len)
                    }
                    (None, Some(r)) => integrity::copy(Side::Plain(&local), Side::Sig(r), len),
                    _ => Err(Layout),
                };
                (res, rs.is_some())
            }
            _ => return None,
        };
        match res {
            Ok(Some(e)) if remote_sig => l.post_sig_error(&e),
            Ok(Some(e)) => pd.record_sig_error(e),
            Ok(None) => {}
            Err(Layout) if remote_sig => return Some(fail_remote),
            Err(Layout) => return Some(fail_local),
        }
        Some(match slot.op {
            OpCopy::WriteImm(_, imm) => {
                let hdr = RecHdr {
                    kind: REC_WRITE_IMM,
                    flags: RF_IMM,
                    len: u32::try_from(len).unwrap_or(u32::MAX),
                    imm,
                    aux: 0,
                };
                self.push_record(l, hdr, None, tail)
            }
            _ => Run::Done,
        })
    }

    fn push_record_with(
        &self,
        l: &Link,
        hdr: RecHdr,
        tail: &mut u64,
        fill: impl FnOnce(Span),
    ) -> Run {
        let len = hdr.len as usize;
        match produce(&l.shm, l.out_d, *tail, &l.head_cache, hdr, fill) {
            Some(end) => {
                *tail = end;
                Run::Ack(end - rec_len(len), end)
            }
            None => Run::Blocked,
        }
    }

    fn push_record(&self, l: &Link, hdr: RecHdr, src: Option<&SpanList>, tail: &mut u64) -> Run {
        let len = hdr.len as usize;
        let r = produce(&l.shm, l.out_d, *tail, &l.head_cache, hdr, |span| {
            if let Some(src) = src {
                let mut dst = SpanList::new();
                dst.push(span);
                copy_spans(&dst, src, len);
            }
        });
        match r {
            Some(end) => {
                *tail = end;
                let rl = if hdr.kind == REC_WRITE_IMM {
                    rec_len(0)
                } else {
                    rec_len(len)
                };
                Run::Ack(end - rl, end)
            }
            None => Run::Blocked,
        }
    }

    /// Look at the peer's NAK and state words.
    fn check_peer(&self, l: &Link) {
        if !l.nak_done.get() {
            let nak = l.shm.u64_at(l.out_ctl(CTL_NAK)).load(Ordering::Acquire);
            if nak != 0 {
                l.nak_done.set(true);
                let status = WcStatus::from_u8((nak >> 56) as u8);
                let pos = nak & NAK_POS_MASK;
                {
                    let mut sq = self.sq.borrow_mut();
                    let mut found = false;
                    for c in sq.head..sq.exec {
                        let i = sq.idx(c);
                        if let SlotState::Ack { start, .. } = sq.slots[i].st {
                            if found {
                                continue;
                            }
                            if start & NAK_POS_MASK == pos {
                                sq.slots[i].st = SlotState::Done(status);
                                found = true;
                            } else {
                                sq.slots[i].st = SlotState::Done(WcStatus::Success);
                            }
                        }
                    }
                }
                self.to_err(None, Some(AsyncEvent::QpFatal { qp_num: self.num }));
                return;
            }
        }
        if self.state.get() != QpState::Err {
            match l.peer_fatal() {
                FATAL_ACCESS => {
                    self.to_err(None, Some(AsyncEvent::QpAccessErr { qp_num: self.num }))
                }
                0 => {}
                _ => {
                    let unacked = {
                        let sq = self.sq.borrow();
                        sq.head < sq.tail
                    };
                    let hs = unacked.then_some(WcStatus::RetryExcErr);
                    self.to_err(hs, Some(AsyncEvent::QpFatal { qp_num: self.num }));
                }
            }
        }
    }

    /// Emit completions for finished WRs, in order. `slow`: look at the
    /// peer's NAK and state words even if nothing waits to retire.
    #[inline(never)]
    fn retire(&self, slow: bool) {
        let (wants_ack, front_done) = {
            let sq = self.sq.borrow();
            (sq.wants_ack(), sq.front_done())
        };
        if !slow && !wants_ack && !front_done {
            // Idle (or only unsignaled WRs in flight): nothing to retire
            // without the peer's acknowledgement, which is not read now.
            return;
        }
        let link = self.link.borrow().clone();
        let mut head_pos = None;
        if let Some(l) = link.as_ref() {
            self.check_peer(l);
            if !self.sq.borrow().wants_ack() {
                if self.sq.borrow().front_done() {
                    self.retire_from(None);
                }
                return;
            }
            let h = l.shm.u64_at(l.out_ctl(CTL_HEAD)).load(Ordering::Acquire);
            if h.wrapping_sub(l.out_tail.get()) as i64 > 0 {
                // The peer claims to have consumed more than we produced.
                self.to_err(None, Some(AsyncEvent::QpFatal { qp_num: self.num }));
            } else {
                head_pos = Some(h);
            }
        }
        self.retire_from(head_pos);
    }

    /// Retire finished WRs in order; `head_pos` is the peer's
    /// acknowledgement (ring head) if it was read.
    fn retire_from(&self, head_pos: Option<u64>) {
        let mut sq = self.sq.borrow_mut();
        while sq.head < sq.exec {
            let i = sq.idx(sq.head);
            // By reference: most retired slots make no completion.
            let s = &sq.slots[i];
            let status = match s.st {
                SlotState::Done(st) => st,
                SlotState::Ack { end, .. } => match head_pos {
                    Some(h) if (end.wrapping_sub(h) as i64) <= 0 => WcStatus::Success,
                    _ => break,
                },
                SlotState::Pending => break,
            };
            if status != WcStatus::Success || s.signaled {
                let wc = Wc {
                    wr_id: s.wr_id,
                    status,
                    opcode: s.op.wc_opcode(),
                    byte_len: s.byte_len,
                    qp_num: self.num,
                    ..Wc::default()
                };
                let wc = if status == WcStatus::Success {
                    wc
                } else {
                    self.err_wc(s.wr_id, status, s.op.wc_opcode())
                };
                if !self.send_cq.0.push(wc) {
                    break;
                }
            }
            sq.head += 1;
        }
    }

    fn nak(&self, l: &Link, status: WcStatus, pos: u64) {
        l.shm.u64_at(l.in_ctl(CTL_NAK)).store(
            ((status as u64) << 56) | (pos & NAK_POS_MASK),
            Ordering::Release,
        );
        l.wake_peer_send();
    }

    /// Take the next receive (SRQ or RQ): its id, whether its SGEs check,
    /// and, when they do not and there is one, the SGE (it may name an
    /// integrity MR: the slow path resolves it).
    fn take_recv(
        &self,
        dst: &mut SpanList,
        keys: &mut KeyCache,
    ) -> Option<(WrId, bool, Option<Sge>)> {
        let pd = &self.pd.0;
        let mut take = |q: &mut RecvQueue| {
            let (id, sges) = q.front()?;
            let ok = sges
                .iter()
                .all(|s| pd.resolve_local_cached(s, Access::LOCAL_WRITE, dst, keys));
            let one = match (ok, sges) {
                (false, [one]) => Some(*one),
                _ => None,
            };
            q.pop();
            Some((id, ok, one))
        };
        match &self.srq {
            Some(srq) => {
                let starve = srq.0.starve.get();
                if starve > 0 {
                    srq.0.starve.set(starve - 1);
                    return None;
                }
                let r = take(&mut srq.0.q.borrow_mut());
                if r.is_some() {
                    srq.0.after_take();
                }
                r
            }
            None => take(&mut self.rq.borrow_mut()),
        }
    }

    /// Slow path of a receive whose SGE did not resolve: an integrity MR
    /// takes the payload through the PI transform; anything else is a local
    /// protection error. Returns the (responder, requester) statuses of a
    /// failure.
    #[cold]
    #[inline(never)]
    fn recv_sig(&self, one: Option<Sge>, payload: Span) -> Option<(WcStatus, WcStatus)> {
        let prot = Some((WcStatus::LocProtErr, WcStatus::RemOpErr));
        let Some(side) = one.and_then(|s| self.pd.0.resolve_local_sig(&s, Access::LOCAL_WRITE))
        else {
            return prot;
        };
        let mut src = SpanList::new();
        src.push(payload);
        match integrity::copy(Side::Sig(&side), Side::Plain(&src), payload.len as u64) {
            Ok(e) => {
                if let Some(e) = e {
                    self.pd.0.record_sig_error(e);
                }
                None
            }
            Err(Layout) => Some((WcStatus::LocLenErr, WcStatus::RemInvReqErr)),
        }
    }

    /// The responder: consume inbound records into receives. `slow`: also
    /// check the inbound ring's tail and the peer's words when nothing came.
    #[inline(never)]
    fn recv(&self, slow: bool) {
        let link = self.link.borrow().clone();
        let Some(l) = link else { return };
        if inbound_processed(self.state.get()) {
            self.consume(&l, slow);
        }
        self.check_peer(&l);
    }

    /// Consume records into receives; `slow`: check the published tail
    /// when the ring runs dry (otherwise its line is not read: it would
    /// be a cache miss on the way to the caller's answer).
    fn consume(&self, l: &Link, slow: bool) {
        let start_head = l.in_head.get();
        let mut head = start_head;
        // Local keys resolved once (see `resolve_local_cached`).
        let mut keys = self.recv_keys.get();
        for _ in 0..RECV_BATCH {
            let found = match peek(&l.shm, l.in_d, head) {
                Ok(None) if slow => check_tail(&l.shm, l.in_d, head).map(|()| None),
                r => r,
            };
            let p = match found {
                Ok(Some(p)) => p,
                Ok(None) => break,
                Err(_) => {
                    self.to_err(None, Some(AsyncEvent::QpFatal { qp_num: self.num }));
                    break;
                }
            };
            if p.hdr.kind == REC_PAD {
                head += p.rec_len;
                continue;
            }
            if p.hdr.kind == REC_SEND && p.hdr.flags & RF_INV == 0 {
                // Fast path: a plain SEND (or SEND_WITH_IMM) into a
                // one-SGE receive of a regular MR that fits it.
                if let Some(wr_id) = self.recv_direct(p.payload, &mut keys) {
                    self.rnr_since.set(None);
                    let imm = p.hdr.flags & RF_IMM != 0;
                    head += p.rec_len;
                    let wc = Wc {
                        wr_id,
                        status: WcStatus::Success,
                        opcode: WcOpcode::Recv,
                        byte_len: p.hdr.len,
                        imm: if imm { p.hdr.imm } else { 0 },
                        flags: if imm {
                            WcFlags::WITH_IMM
                        } else {
                            WcFlags::NONE
                        },
                        qp_num: self.num,
                        vendor_err: 0,
                    };
                    if !self.recv_cq.0.push(wc) {
                        break;
                    }
                    continue;
                }
            }
            let mut dst = SpanList::new();
            let Some((wr_id, ok, one)) = self.take_recv(&mut dst, &mut keys) else {
                if self.rnr_expired(l) {
                    self.nak(l, WcStatus::RnrRetryExcErr, head);
                    head += p.rec_len;
                    self.to_err(None, None);
                }
                break;
            };
            self.rnr_since.set(None);
            let mut wc = Wc {
                wr_id,
                status: WcStatus::Success,
                opcode: WcOpcode::Recv,
                byte_len: p.hdr.len,
                imm: 0,
                flags: WcFlags::NONE,
                qp_num: self.num,
                vendor_err: 0,
            };
            if p.hdr.flags & RF_INV != 0 {
                // This record invalidates a key: forget the batch's ones.
                keys.clear();
            }
            let fail = if p.hdr.kind == REC_WRITE_IMM {
                wc.opcode = WcOpcode::RecvRdmaWithImm;
                wc.flags = WcFlags::WITH_IMM;
                wc.imm = p.hdr.imm;
                None
            } else if !ok {
                self.recv_sig(one, p.payload)
            } else if p.payload.len > dst.total() {
                Some((WcStatus::LocLenErr, WcStatus::RemInvReqErr))
            } else if p.hdr.flags & RF_INV != 0 && self.pd.0.invalidate(p.hdr.aux).is_err() {
                Some((WcStatus::RemInvReqErr, WcStatus::RemInvReqErr))
            } else {
                let mut src = SpanList::new();
                src.push(p.payload);
                copy_spans(&dst, &src, p.payload.len);
                None
            };
            if fail.is_none() && p.hdr.kind != REC_WRITE_IMM {
                if p.hdr.flags & RF_IMM != 0 {
                    wc.flags = WcFlags::WITH_IMM;
                    wc.imm = p.hdr.imm;
                } else if p.hdr.flags & RF_INV != 0 {
                    wc.flags = WcFlags::WITH_INV;
                    wc.imm = p.hdr.aux;
                }
            }
            if let Some((mine, theirs)) = fail {
                self.recv_keys.set(keys);
                self.recv_cq
                    .0
                    .push(self.err_wc(wr_id, mine, WcOpcode::Recv));
                self.nak(l, theirs, head);
                head += p.rec_len;
                l.in_head.set(head);
                release(&l.shm, l.in_d, head);
                self.to_err(None, Some(AsyncEvent::QpFatal { qp_num: self.num }));
                return;
            }
            head += p.rec_len;
            if !self.recv_cq.0.push(wc) {
                break;
            }
        }
        self.recv_keys.set(keys);
        if head != start_head {
            l.in_head.set(head);
            release(&l.shm, l.in_d, head);
            l.wake_peer_send();
        }
    }

    /// The receive fast path: take the next receive (SRQ or RQ) if it is
    /// one or two SGEs of regular MRs with room for `payload`, and copy the
    /// payload straight from the ring into it. `None` (nothing taken) for
    /// anything else: the general path then handles it, errors included.
    #[inline(always)]
    fn recv_direct(&self, payload: Span, keys: &mut KeyCache) -> Option<WrId> {
        let pd = &self.pd.0;
        let take = |q: &mut RecvQueue, keys: &mut KeyCache| {
            let (id, sges) = q.front()?;
            match sges {
                [one] => {
                    let dst = pd.span_cached(one, Access::LOCAL_WRITE, keys)?;
                    if payload.len > dst.len {
                        return None;
                    }
                    // SAFETY: `payload` lies in the link mapping (checked by
                    // `peek`), `dst` in a live MR's arena mapping (checked by
                    // `span_cached`); different mappings: no overlap.
                    unsafe { std::ptr::copy_nonoverlapping(payload.ptr, dst.ptr, payload.len) };
                }
                [a, b] => {
                    // Both SGEs check before a byte moves (a failure takes
                    // the general path with nothing written).
                    let da = pd.span_cached(a, Access::LOCAL_WRITE, keys)?;
                    let db = pd.span_cached(b, Access::LOCAL_WRITE, keys)?;
                    if payload.len > da.len + db.len {
                        return None;
                    }
                    let first = payload.len.min(da.len);
                    // SAFETY: as above for each SGE: `first <= da.len`,
                    // `payload.len - first <= db.len`, and both source
                    // ranges lie inside `payload` (in the link mapping).
                    unsafe {
                        std::ptr::copy_nonoverlapping(payload.ptr, da.ptr, first);
                    }
                    // A capsule without data fills the first SGE only.
                    if payload.len > first {
                        // SAFETY: as above.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                payload.ptr.add(first),
                                db.ptr,
                                payload.len - first,
                            );
                        }
                    }
                }
                _ => return None,
            }
            q.pop();
            Some(id)
        };
        match &self.srq {
            Some(srq) => {
                if srq.0.starve.get() > 0 {
                    return None;
                }
                let r = take(&mut srq.0.q.borrow_mut(), keys);
                if r.is_some() {
                    srq.0.after_take();
                }
                r
            }
            None => take(&mut self.rq.borrow_mut(), keys),
        }
    }

    /// RNR bookkeeping: true once the requester's retry budget is spent.
    fn rnr_expired(&self, l: &Link) -> bool {
        let retry = l
            .shm
            .u32_at(l.in_ctl(CTL_RNR_RETRY))
            .load(Ordering::Acquire)
            .min(7);
        if retry == 7 {
            return false;
        }
        let now = Instant::now();
        let since = match self.rnr_since.get() {
            Some(t) => t,
            None => {
                self.rnr_since.set(Some(now));
                now
            }
        };
        let budget = u128::from(retry) * u128::from(rnr_timer_us(self.min_rnr_timer.get()));
        now.duration_since(since).as_micros() >= budget
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

/// The fast path's running state during one `post_send`.
struct Direct {
    /// Local producer tail (published once at the end).
    tail: u64,
    /// Local key cache (see `resolve_local_cached`).
    keys: KeyCache,
}

impl QpInner {
    /// The SEND fast path of `post_send`, for a WR with nothing queued
    /// before it on an RTS QP: a plain SEND, SEND_WITH_IMM or
    /// SEND_WITH_INV whose payload is inline or one SGE of a regular MR is
    /// written straight from the user's memory into the ring slot and
    /// recorded as awaiting its acknowledgement. False (nothing done) for
    /// anything else, or a full ring: the WR then takes the queued path,
    /// which handles every case and error.
    #[inline(always)]
    fn send_direct(&self, sq: &mut SendQueue, wr: &SendWr<'_>, l: &Link, d: &mut Direct) -> bool {
        let (op, flags, imm, aux) = match wr.op {
            SendOp::Send => (OpCopy::Send, 0, 0, 0),
            SendOp::SendWithImm { imm } => (OpCopy::SendImm(imm), RF_IMM, imm, 0),
            SendOp::SendWithInv { rkey } => (OpCopy::SendInv(rkey), RF_INV, 0, rkey),
            _ => return false,
        };
        let Some(src) = self.direct_source(wr, d) else {
            return false;
        };
        // `check_send` bounded the payload by the maximum message size.
        let Ok(len) = u32::try_from(src.len) else {
            return false;
        };
        let hdr = RecHdr {
            kind: REC_SEND,
            flags,
            len,
            imm,
            aux,
        };
        let end = produce(&l.shm, l.out_d, d.tail, &l.head_cache, hdr, |dst| {
            // SAFETY: `dst` is the record's payload in the link mapping
            // (`len` bytes); `src` is the caller's inline data or a live
            // MR's memory (checked by `span_cached`), never the link.
            unsafe { std::ptr::copy_nonoverlapping(src.ptr, dst.ptr, src.len) }
        });
        let Some(end) = end else { return false };
        d.tail = end;
        let st = SlotState::Ack {
            start: end - rec_len(src.len),
            end,
        };
        self.push_direct_slot(sq, wr, op, len, st);
        sq.exec = sq.tail;
        true
    }

    /// The RDMA WRITE fast path of `post_send`, for a WR with nothing
    /// queued before it on an RTS QP: a WRITE (no immediate) whose payload
    /// is inline or one SGE of a regular MR, to a remote range its rkey
    /// grants, is copied now (as the executor would, at the same point in
    /// the WR order) and its slot finished. False (nothing done) for
    /// anything else or any failed check: the queued path then runs it and
    /// reports the error.
    #[inline(always)]
    /// Record a WR the post-time path already carried out in the next
    /// send-queue slot (its completion is reported in order from there).
    fn push_direct_slot(
        &self,
        sq: &mut SendQueue,
        wr: &SendWr<'_>,
        op: OpCopy,
        len: u32,
        st: SlotState,
    ) {
        let i = sq.idx(sq.tail);
        let signaled = self.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED);
        if signaled {
            sq.sig_upto = sq.tail + 1;
        }
        sq.slots[i] = SqSlot {
            wr_id: wr.wr_id,
            op,
            signaled,
            inline: false,
            nsge: 0,
            inline_len: 0,
            byte_len: len,
            st,
        };
        sq.tail += 1;
    }

    /// The bytes a direct (post-time) SEND or WRITE moves: its inline data,
    /// or its one local SGE resolved through the key cache; `None` sends
    /// the WR down the queued path.
    fn direct_source(&self, wr: &SendWr<'_>, d: &mut Direct) -> Option<Span> {
        if wr.flags.contains(SendFlags::INLINE) {
            return Some(Span {
                ptr: wr.inline.as_ptr().cast_mut(),
                len: wr.inline.len(),
            });
        }
        let [one] = wr.sg_list else { return None };
        self.pd.0.span_cached(one, Access::NONE, &mut d.keys)
    }

    fn write_direct(&self, sq: &mut SendQueue, wr: &SendWr<'_>, l: &Link, d: &mut Direct) -> bool {
        let SendOp::RdmaWrite { remote } = wr.op else {
            return false;
        };
        let Some(src) = self.direct_source(wr, d) else {
            return false;
        };
        let Ok(len) = u32::try_from(src.len) else {
            return false;
        };
        let mut dst = SpanList::new();
        if !self.remote(l, remote, u64::from(len), Access::REMOTE_WRITE, &mut dst) {
            return false;
        }
        let mut from = SpanList::new();
        from.push(src);
        copy_spans(&dst, &from, usize::MAX);
        self.push_direct_slot(
            sq,
            wr,
            OpCopy::Write(remote),
            len,
            SlotState::Done(WcStatus::Success),
        );
        sq.exec = sq.tail;
        true
    }

    fn check_send(
        &self,
        sq: &SendQueue,
        wr: &SendWr<'_>,
        payload_len: u64,
    ) -> Result<(), PostErrorKind> {
        let st = self.state.get();
        if !send_allowed(st) {
            return Err(PostErrorKind::WrongState(st));
        }
        if sq.tail - sq.head >= u64::from(self.caps.max_send_wr) {
            return Err(PostErrorKind::QueueFull);
        }
        let inline = wr.flags.contains(SendFlags::INLINE);
        let extra = match wr.op {
            SendOp::RegMrIntegrity { prot, .. } => prot.len(),
            _ => 0,
        };
        if inline {
            let ok_op = matches!(
                wr.op,
                SendOp::Send
                    | SendOp::SendWithImm { .. }
                    | SendOp::SendWithInv { .. }
                    | SendOp::RdmaWrite { .. }
                    | SendOp::RdmaWriteWithImm { .. }
            );
            if !ok_op {
                return Err(PostErrorKind::InvalidOpcode);
            }
            if wr.inline.len() > sq.max_inline {
                return Err(PostErrorKind::InlineTooLong);
            }
        } else if wr.sg_list.len() + extra > self.caps.max_send_sge as usize
            || wr.sg_list.len() + extra > sq.max_sge
        {
            return Err(PostErrorKind::TooManySge);
        }
        if payload_len > u64::from(self.max_msg_size)
            && matches!(
                wr.op,
                SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. }
            )
        {
            return Err(PostErrorKind::MessageTooLong);
        }
        if payload_len > u64::from(u32::MAX) {
            return Err(PostErrorKind::MessageTooLong);
        }
        Ok(())
    }
}
