//! RC queue pairs and shared receive queues, with preallocated WR arrays.

use std::cell::{Cell, RefCell};
use std::mem::MaybeUninit;
use std::ptr::{self, NonNull};
use std::rc::Rc;

use rdma_sys::*;

use super::cq::CqInner;
use super::device::{PdInner, PORT};
use super::mw::{Window, MW_MAX_SEGMENTS};
use super::{last_err, rc_err, zeroed_slice};
use crate::error::{PostError, PostErrorKind, VerbsError};
use crate::provider::{QpInit, QueuePair, SharedRecvQueue};
use crate::types::{Access, FastRegMode, QpAttr, QpCaps, QpState, SendFlags, Sge};
use crate::wr::{RecvWr, SendOp, SendWr};

use super::Ibverbs;

/// Receive WRs and their SGEs, reused by every `post_recv`.
struct RecvScratch {
    wrs: Box<[ibv_recv_wr]>,
    sges: Box<[ibv_sge]>,
    max_sge: usize,
}

impl RecvScratch {
    fn new(depth: u32, max_sge: u32) -> RecvScratch {
        let depth = depth.max(1) as usize;
        let max_sge = max_sge.max(1) as usize;
        RecvScratch {
            // SAFETY: C structs of integers and raw pointers.
            wrs: unsafe { zeroed_slice(depth) },
            // SAFETY: as above.
            sges: unsafe { zeroed_slice(depth * max_sge) },
            max_sge,
        }
    }

    /// Fill the arrays from `wrs` (at most the array length) and chain them.
    /// Returns how many are ready, and the first refused one.
    fn fill(&mut self, wrs: &[RecvWr<'_>]) -> (usize, Option<PostError>) {
        let mut err = None;
        let mut n = 0;
        for (i, wr) in wrs.iter().enumerate() {
            if i == self.wrs.len() {
                err = Some(PostError {
                    index: i,
                    kind: PostErrorKind::QueueFull,
                });
                break;
            }
            if wr.sg_list.len() > self.max_sge {
                err = Some(PostError {
                    index: i,
                    kind: PostErrorKind::TooManySge,
                });
                break;
            }
            let sges = &mut self.sges[i * self.max_sge..][..wr.sg_list.len()];
            copy_sges(sges, wr.sg_list);
            let w = &mut self.wrs[i];
            w.wr_id = wr.wr_id.0;
            w.sg_list = sges.as_mut_ptr();
            w.num_sge = wr.sg_list.len() as i32;
            n = i + 1;
        }
        link(&mut self.wrs[..n], |w, next| w.next = next);
        (n, err)
    }

    fn index_of(&self, bad: *mut ibv_recv_wr) -> usize {
        index_in(&self.wrs, bad)
    }
}

fn copy_sges(dst: &mut [ibv_sge], src: &[Sge]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = ibv_sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        };
    }
}

/// Chain `wrs` through their `next` pointers; the last one ends the list.
fn link<T>(wrs: &mut [T], set_next: impl Fn(&mut T, *mut T)) {
    let n = wrs.len();
    let base = wrs.as_mut_ptr();
    for (i, w) in wrs.iter_mut().enumerate() {
        let next = if i + 1 < n {
            // `i + 1 < n`: inside the slice.
            base.wrapping_add(i + 1)
        } else {
            ptr::null_mut()
        };
        set_next(w, next);
    }
}

/// The index of `bad` in `wrs` (0 when it is not inside).
fn index_in<T>(wrs: &[T], bad: *mut T) -> usize {
    let base = wrs.as_ptr() as usize;
    let size = std::mem::size_of::<T>().max(1);
    (bad as usize)
        .checked_sub(base)
        .map_or(0, |off| off / size)
        .min(wrs.len())
}

fn post_kind(rc: i32, state: QpState) -> PostErrorKind {
    match rc.abs() {
        libc::ENOMEM => PostErrorKind::QueueFull,
        _ if matches!(state, QpState::Reset | QpState::Init | QpState::Rtr) => {
            PostErrorKind::WrongState(state)
        }
        _ => PostErrorKind::InvalidOpcode,
    }
}

pub(super) struct QpInner {
    // INVARIANT: created on `pd` with `send_cq`/`recv_cq`/`srq`; destroyed
    // in drop only. The Rc fields drop after the QP is destroyed.
    pub(super) qp: NonNull<ibv_qp>,
    caps: QpCaps,
    max_msg: u32,
    /// The state as far as we know (our modifies and CM transitions); the
    /// device may move the QP to ERR on its own, which posting does not need
    /// to know (ERR accepts posts and flushes them).
    pub(super) state: Cell<QpState>,
    send: RefCell<SendScratch>,
    recv: RefCell<RecvScratch>,
    has_srq: bool,
    _srq: Option<Rc<SrqInner>>,
    _send_cq: Rc<CqInner>,
    _recv_cq: Rc<CqInner>,
    pub(super) pd: Rc<PdInner>,
}

impl Drop for QpInner {
    fn drop(&mut self) {
        // SAFETY: created in `IbvQp::create`, destroyed once, here; the CQs,
        // SRQ and PD it uses are still alive (fields drop after this body).
        unsafe { ibv_destroy_qp(self.qp.as_ptr()) };
    }
}

impl QpInner {
    pub(super) fn qp_num(&self) -> u32 {
        // SAFETY: live QP (type invariant).
        unsafe { self.qp.as_ref().qp_num }
    }

    /// Move the QP to ERR (after a disconnect: its WRs flush).
    pub(super) fn to_error(&self) {
        // SAFETY: all-zero is a valid ibv_qp_attr.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_ERR;
        // SAFETY: live QP, valid attribute struct and mask.
        let rc = unsafe {
            ibv_modify_qp(
                self.qp.as_ptr(),
                &mut a,
                ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
            )
        };
        if rc == 0 {
            self.state.set(QpState::Err);
        }
    }
}

/// Send WRs and their SGEs, reused by every `post_send`.
struct SendScratch {
    wrs: Box<[ibv_send_wr]>,
    sges: Box<[ibv_sge]>,
    max_sge: usize,
    /// Window state changes of the WRs being posted (capacity: the depth,
    /// so pushing never allocates).
    pending: Vec<KeyChange>,
}

/// A window's state before a bind or LOCAL_INV of the post changed it:
/// kept if the WR is posted (and a bind's key published then), restored if
/// it is not.
struct KeyChange {
    slot: usize,
    window: Rc<Window>,
    key: u32,
    bound: bool,
    addr: u64,
    len: u64,
    /// The key a bind gives the window once it is posted.
    publish: Option<u32>,
}

impl KeyChange {
    fn before(slot: usize, window: &Rc<Window>, publish: Option<u32>) -> KeyChange {
        KeyChange {
            slot,
            window: window.clone(),
            key: window.key.get(),
            bound: window.bound.get(),
            addr: window.addr.get(),
            len: window.len.get(),
            publish,
        }
    }

    /// Settle the change: `posted` WRs of the list reached the device.
    fn settle(self, posted: usize) {
        if self.slot < posted {
            if let Some(k) = self.publish {
                self.window.publish_key(k);
            }
        } else {
            let w = &self.window;
            w.key.set(self.key);
            w.bound.set(self.bound);
            w.addr.set(self.addr);
            w.len.set(self.len);
        }
    }
}

fn refused(why: &'static str) -> PostErrorKind {
    PostErrorKind::Refused(why)
}

/// An RC queue pair (`ibv_qp`).
pub struct IbvQp {
    pub(super) inner: Rc<QpInner>,
}

impl std::fmt::Debug for IbvQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvQp")
            .field("qp_num", &self.qp_num())
            .field("state", &self.inner.state.get())
            .finish_non_exhaustive()
    }
}

fn qp_state_from(v: u32) -> QpState {
    match v {
        0 => QpState::Reset,
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        4 => QpState::Sqd,
        5 => QpState::Sqe,
        _ => QpState::Err,
    }
}

impl IbvQp {
    pub(super) fn create(
        pd: &Rc<PdInner>,
        init: &QpInit<'_, Ibverbs>,
    ) -> Result<IbvQp, VerbsError> {
        let ctx = pd.ctx.ctx;
        if init.send_cq.inner.ctx.ctx != ctx || init.recv_cq.inner.ctx.ctx != ctx {
            return Err(VerbsError::InvalidArgument("CQ of another device"));
        }
        if let Some(srq) = init.srq {
            if !Rc::ptr_eq(&srq.inner.pd, pd) {
                return Err(VerbsError::InvalidArgument("SRQ of another PD"));
            }
        }
        let dc = &pd.ctx.caps;
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
        // SAFETY: all-zero is a valid ibv_qp_init_attr.
        let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = init.send_cq.inner.cq.as_ptr();
        attr.recv_cq = init.recv_cq.inner.cq.as_ptr();
        attr.srq = init.srq.map_or(ptr::null_mut(), |s| s.inner.srq.as_ptr());
        attr.qp_type = ibv_qp_type::IBV_QPT_RC;
        attr.sq_sig_all = i32::from(init.sq_sig_all);
        attr.cap = ibv_qp_cap {
            max_send_wr: c.max_send_wr,
            max_recv_wr: if init.srq.is_some() { 0 } else { c.max_recv_wr },
            max_send_sge: c.max_send_sge,
            max_recv_sge: if init.srq.is_some() {
                0
            } else {
                c.max_recv_sge
            },
            max_inline_data: c.max_inline_data,
        };
        // SAFETY: `pd`, the CQs and the SRQ are live objects of one context
        // (checked above); `attr` is a valid init struct.
        let qp = unsafe { ibv_create_qp(pd.pd.as_ptr(), &mut attr) };
        let qp = NonNull::new(qp).ok_or_else(|| VerbsError::sys("ibv_create_qp", last_err()))?;
        let mut real = QpCaps {
            max_send_wr: attr.cap.max_send_wr,
            max_recv_wr: attr.cap.max_recv_wr,
            max_send_sge: attr.cap.max_send_sge,
            max_recv_sge: attr.cap.max_recv_sge,
            max_inline_data: attr.cap.max_inline_data,
        };
        // Some providers hand back the requested capacities from create but
        // round the queues up (rxe: a 64-deep RQ holds 127); the QP's own
        // query reports what it really holds.
        let mut q = MaybeUninit::<ibv_qp_attr>::zeroed();
        let mut qi = MaybeUninit::<ibv_qp_init_attr>::zeroed();
        // SAFETY: live QP; writable attribute structs.
        let rc = unsafe {
            ibv_query_qp(
                qp.as_ptr(),
                q.as_mut_ptr(),
                ibv_qp_attr_mask::IBV_QP_CAP.0 as i32,
                qi.as_mut_ptr(),
            )
        };
        if rc == 0 {
            // SAFETY: zero-initialised and filled by the call.
            let c = unsafe { q.assume_init_ref().cap };
            real.max_send_wr = real.max_send_wr.max(c.max_send_wr);
            real.max_send_sge = real.max_send_sge.max(c.max_send_sge);
            real.max_inline_data = real.max_inline_data.max(c.max_inline_data);
            if init.srq.is_none() {
                real.max_recv_wr = real.max_recv_wr.max(c.max_recv_wr);
                real.max_recv_sge = real.max_recv_sge.max(c.max_recv_sge);
            }
        }
        let send_depth = real.max_send_wr.max(1) as usize;
        let send_sge = real.max_send_sge.max(1) as usize;
        Ok(IbvQp {
            inner: Rc::new(QpInner {
                qp,
                caps: real,
                max_msg: pd.ctx.caps.max_msg_size,
                state: Cell::new(QpState::Reset),
                send: RefCell::new(SendScratch {
                    // SAFETY: C structs of integers, raw pointers and unions.
                    wrs: unsafe { zeroed_slice(send_depth) },
                    // SAFETY: as above.
                    sges: unsafe { zeroed_slice(send_depth * send_sge) },
                    max_sge: send_sge,
                    pending: Vec::with_capacity(send_depth),
                }),
                recv: RefCell::new(RecvScratch::new(real.max_recv_wr, real.max_recv_sge)),
                has_srq: init.srq.is_some(),
                _srq: init.srq.map(|s| s.inner.clone()),
                _send_cq: init.send_cq.inner.clone(),
                _recv_cq: init.recv_cq.inner.clone(),
                pd: pd.clone(),
            }),
        })
    }

    /// Write a `RegMr` as a type-2 window bind into slot `i`: the scatter
    /// list must be one virtually contiguous range of one MR of this QP's
    /// PD, starting at `iova`, and the window named by `key` must be free.
    fn fill_bind(
        &self,
        s: &mut SendScratch,
        i: usize,
        wr: &SendWr<'_>,
        key: u32,
        iova: u64,
        access: Access,
    ) -> Result<(), PostErrorKind> {
        let pd = &self.inner.pd;
        if !matches!(pd.ctx.caps.fast_reg, FastRegMode::MemoryWindow { .. }) {
            return Err(PostErrorKind::InvalidOpcode);
        }
        if wr.flags.contains(SendFlags::INLINE) {
            return Err(refused("a registration carries no inline data"));
        }
        let Some(first) = wr.sg_list.first() else {
            return Err(refused("a registration needs a non-empty page list"));
        };
        if wr.sg_list.len() > MW_MAX_SEGMENTS as usize {
            return Err(refused("more segments than max_fast_reg_pages"));
        }
        let mut end = first.addr;
        for sge in wr.sg_list {
            if sge.lkey != first.lkey {
                return Err(refused("a memory window covers one MR: one lkey"));
            }
            if sge.addr != end {
                return Err(refused(
                    "a memory window covers one virtually contiguous range",
                ));
            }
            end = end
                .checked_add(u64::from(sge.length))
                .ok_or(refused("page list wraps the address space"))?;
        }
        let len = end - first.addr;
        if len == 0 {
            return Err(refused("a registration of 0 bytes"));
        }
        if iova != first.addr {
            return Err(refused(
                "a memory window keeps the range's own address: iova must be the first segment's address",
            ));
        }
        if access.contains(Access::ZERO_BASED) {
            return Err(refused("no zero-based memory windows"));
        }
        let mr = pd
            .ctx
            .keys
            .mr(first.lkey)
            .ok_or(refused("the page list's lkey is no MR of this device"))?;
        if mr.pd != pd.pd {
            return Err(refused("the page list's MR belongs to another PD"));
        }
        if mr.access.contains(Access::ZERO_BASED) {
            return Err(refused("a zero-based MR cannot carry a memory window"));
        }
        if first.addr < mr.start || end > mr.start.saturating_add(mr.len) {
            return Err(refused("the page list leaves its MR"));
        }
        let remote = access & (Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC);
        if remote.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
            && !mr.access.contains(Access::LOCAL_WRITE)
        {
            return Err(refused("a writable window needs an MR with LOCAL_WRITE"));
        }
        let window = pd
            .ctx
            .keys
            .window(key)
            .ok_or(refused("the key names no fast-reg MR of this device"))?;
        if window.pd != pd.pd {
            return Err(refused("the fast-reg MR belongs to another PD"));
        }
        if window.bound.get() {
            return Err(refused(
                "the fast-reg MR is still registered: invalidate it first",
            ));
        }
        let w = &mut s.wrs[i];
        w.wr_id = wr.wr_id.0;
        w.sg_list = ptr::null_mut();
        w.num_sge = 0;
        w.send_flags = wr.flags.bits();
        w.imm_data_invalidated_rkey_union.imm_data = 0;
        w.wr.rdma = rdma_t {
            remote_addr: 0,
            rkey: 0,
        };
        w.opcode = ibv_wr_opcode::IBV_WR_BIND_MW;
        w.bind_mw_tso_union.bind_mw = bind_mw_t {
            mw: window.mw.as_ptr(),
            rkey: key,
            bind_info: ibv_mw_bind_info {
                mr: mr.mr.as_ptr(),
                addr: first.addr,
                length: len,
                mw_access_flags: remote.bits(),
            },
        };
        s.pending.push(KeyChange::before(i, &window, Some(key)));
        window.key.set(key);
        window.bound.set(true);
        window.addr.set(first.addr);
        window.len.set(len);
        Ok(())
    }

    /// Check one send WR and write it into slot `i` of the scratch arrays.
    fn fill_send(
        &self,
        s: &mut SendScratch,
        i: usize,
        wr: &SendWr<'_>,
    ) -> Result<(), PostErrorKind> {
        if let SendOp::RegMr { key, iova, access } = wr.op {
            return self.fill_bind(s, i, wr, key, iova, access);
        }
        let inline = wr.flags.contains(SendFlags::INLINE);
        let sge_base = i * s.max_sge;
        let num_sge = if inline {
            if wr.inline.len() > self.inner.caps.max_inline_data as usize {
                return Err(PostErrorKind::InlineTooLong);
            }
            // The provider copies inline data at post time; the lkey is not
            // checked.
            s.sges[sge_base] = ibv_sge {
                addr: wr.inline.as_ptr() as u64,
                length: wr.inline.len() as u32,
                lkey: 0,
            };
            usize::from(!wr.inline.is_empty())
        } else {
            if wr.sg_list.len() > s.max_sge {
                return Err(PostErrorKind::TooManySge);
            }
            copy_sges(&mut s.sges[sge_base..], wr.sg_list);
            wr.sg_list.len()
        };
        if wr.payload_len() > u64::from(self.inner.max_msg) {
            return Err(PostErrorKind::MessageTooLong);
        }
        let sg_list = s.sges[sge_base..].as_mut_ptr();
        let w = &mut s.wrs[i];
        w.wr_id = wr.wr_id.0;
        w.sg_list = sg_list;
        w.num_sge = num_sge as i32;
        w.send_flags = wr.flags.bits();
        w.imm_data_invalidated_rkey_union.imm_data = 0;
        w.wr.rdma = rdma_t {
            remote_addr: 0,
            rkey: 0,
        };
        use ibv_wr_opcode::*;
        w.opcode = match wr.op {
            SendOp::Send => IBV_WR_SEND,
            SendOp::SendWithImm { imm } => {
                w.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
                IBV_WR_SEND_WITH_IMM
            }
            SendOp::SendWithInv { rkey } => {
                w.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
                IBV_WR_SEND_WITH_INV
            }
            SendOp::RdmaWrite { remote } => {
                w.wr.rdma = rdma_t {
                    remote_addr: remote.addr,
                    rkey: remote.rkey,
                };
                IBV_WR_RDMA_WRITE
            }
            SendOp::RdmaWriteWithImm { remote, imm } => {
                w.wr.rdma = rdma_t {
                    remote_addr: remote.addr,
                    rkey: remote.rkey,
                };
                w.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
                IBV_WR_RDMA_WRITE_WITH_IMM
            }
            SendOp::RdmaRead { remote } => {
                w.wr.rdma = rdma_t {
                    remote_addr: remote.addr,
                    rkey: remote.rkey,
                };
                IBV_WR_RDMA_READ
            }
            SendOp::LocalInv { key } => {
                w.imm_data_invalidated_rkey_union.invalidated_rkey = key;
                IBV_WR_LOCAL_INV
            }
            // REG_MR became a bind above; no signature work requests in
            // user-space verbs.
            SendOp::RegMr { .. } | SendOp::RegMrIntegrity { .. } => {
                return Err(PostErrorKind::InvalidOpcode)
            }
        };
        if let SendOp::LocalInv { key } = wr.op {
            // Invalidating a window that is not bound under `key` must not
            // reach the kernel (see `mw`).
            if let Some(window) = self.inner.pd.ctx.keys.window(key) {
                if !window.bound.get() || window.key.get() != key {
                    return Err(refused(
                        "LOCAL_INV of a fast-reg MR that is not registered under this key",
                    ));
                }
                s.pending.push(KeyChange::before(i, &window, None));
                window.bound.set(false);
            }
        }
        Ok(())
    }
}

impl QueuePair for IbvQp {
    fn qp_num(&self) -> u32 {
        self.inner.qp_num()
    }

    fn state(&self) -> QpState {
        let mut attr = MaybeUninit::<ibv_qp_attr>::zeroed();
        let mut init = MaybeUninit::<ibv_qp_init_attr>::zeroed();
        // SAFETY: live QP; writable attribute structs.
        let rc = unsafe {
            ibv_query_qp(
                self.inner.qp.as_ptr(),
                attr.as_mut_ptr(),
                ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
                init.as_mut_ptr(),
            )
        };
        if rc == 0 {
            // SAFETY: zero-initialised and filled by the call.
            let s = qp_state_from(unsafe { attr.assume_init_ref().qp_state });
            self.inner.state.set(s);
        }
        self.inner.state.get()
    }

    fn caps(&self) -> QpCaps {
        self.inner.caps
    }

    fn modify(&self, attr: &QpAttr) -> Result<(), VerbsError> {
        use ibv_qp_attr_mask as m;
        let from = self.state();
        let to = attr.state;
        // SAFETY: all-zero is a valid ibv_qp_attr.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = to as u32;
        let mut mask = m::IBV_QP_STATE;
        match to {
            QpState::Init => {
                a.pkey_index = 0;
                a.port_num = PORT;
                a.qp_access_flags = (attr.access
                    & (Access::LOCAL_WRITE
                        | Access::REMOTE_WRITE
                        | Access::REMOTE_READ
                        | Access::REMOTE_ATOMIC))
                    .bits();
                mask |= m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS;
            }
            QpState::Rtr if from == QpState::Init => {
                return Err(VerbsError::Unsupported(
                    "INIT -> RTR needs a path: connect the QP through the CM",
                ));
            }
            QpState::Rts if from == QpState::Rtr => {
                a.sq_psn = 0;
                a.timeout = attr.timeout;
                a.retry_cnt = attr.retry_cnt;
                a.rnr_retry = attr.rnr_retry;
                a.max_rd_atomic = attr.max_rd_atomic;
                mask |= m::IBV_QP_SQ_PSN
                    | m::IBV_QP_TIMEOUT
                    | m::IBV_QP_RETRY_CNT
                    | m::IBV_QP_RNR_RETRY
                    | m::IBV_QP_MAX_QP_RD_ATOMIC;
            }
            _ => {}
        }
        // SAFETY: live QP, valid attributes for `mask`.
        let rc = unsafe { ibv_modify_qp(self.inner.qp.as_ptr(), &mut a, mask.0 as i32) };
        match rc {
            0 => {
                self.inner.state.set(to);
                Ok(())
            }
            rc if rc.abs() == libc::EINVAL => Err(VerbsError::InvalidTransition { from, to }),
            rc => Err(VerbsError::sys("ibv_modify_qp", rc_err(rc))),
        }
    }

    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        if wrs.is_empty() {
            return Ok(());
        }
        let state = self.inner.state.get();
        if matches!(state, QpState::Reset | QpState::Init | QpState::Rtr) {
            return Err(PostError {
                index: 0,
                kind: PostErrorKind::WrongState(state),
            });
        }
        let mut s = self.inner.send.borrow_mut();
        s.pending.clear();
        let mut n = 0;
        let mut err = None;
        for (i, wr) in wrs.iter().enumerate() {
            if i == s.wrs.len() {
                err = Some(PostError {
                    index: i,
                    kind: PostErrorKind::QueueFull,
                });
                break;
            }
            if let Err(kind) = self.fill_send(&mut s, i, wr) {
                err = Some(PostError { index: i, kind });
                break;
            }
            n = i + 1;
        }
        if n > 0 {
            link(&mut s.wrs[..n], |w, next| w.next = next);
            let mut bad = ptr::null_mut();
            // SAFETY: live QP; the chain of `n` WRs and their SGE arrays live
            // in `s` for the call; inline data is copied by the call.
            let rc = unsafe { ibv_post_send(self.inner.qp.as_ptr(), s.wrs.as_mut_ptr(), &mut bad) };
            let posted = if rc == 0 { n } else { index_in(&s.wrs, bad) };
            for change in s.pending.drain(..) {
                change.settle(posted);
            }
            if rc != 0 {
                return Err(PostError {
                    index: posted,
                    kind: post_kind(rc, state),
                });
            }
        }
        err.map_or(Ok(()), Err)
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        if wrs.is_empty() {
            return Ok(());
        }
        if self.inner.has_srq {
            return Err(PostError {
                index: 0,
                kind: PostErrorKind::UsesSrq,
            });
        }
        let state = self.inner.state.get();
        if state == QpState::Reset {
            return Err(PostError {
                index: 0,
                kind: PostErrorKind::WrongState(state),
            });
        }
        let mut s = self.inner.recv.borrow_mut();
        let (n, err) = s.fill(wrs);
        if n > 0 {
            let mut bad = ptr::null_mut();
            // SAFETY: live QP; the chain of `n` WRs and their SGEs live in `s`.
            let rc = unsafe { ibv_post_recv(self.inner.qp.as_ptr(), s.wrs.as_mut_ptr(), &mut bad) };
            if rc != 0 {
                return Err(PostError {
                    index: s.index_of(bad),
                    kind: post_kind(rc, state),
                });
            }
        }
        err.map_or(Ok(()), Err)
    }
}

pub(super) struct SrqInner {
    // INVARIANT: created on `pd`, destroyed in drop only, after every QP
    // attached to it (they hold an `Rc<SrqInner>`).
    srq: NonNull<ibv_srq>,
    max_wr: u32,
    recv: RefCell<RecvScratch>,
    pub(super) pd: Rc<PdInner>,
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        // SAFETY: no QP uses it any more; destroyed once.
        unsafe { ibv_destroy_srq(self.srq.as_ptr()) };
    }
}

/// A shared receive queue (`ibv_srq`).
pub struct IbvSrq {
    pub(super) inner: Rc<SrqInner>,
}

impl std::fmt::Debug for IbvSrq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvSrq")
            .field("srq_num", &self.srq_num())
            .finish_non_exhaustive()
    }
}

impl IbvSrq {
    pub(super) fn create(
        pd: &Rc<PdInner>,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<IbvSrq, VerbsError> {
        let dc = &pd.ctx.caps;
        if max_wr == 0 || max_wr > dc.max_srq_wr || max_sge == 0 || max_sge > dc.max_srq_sge {
            return Err(VerbsError::InvalidArgument("SRQ size above device limits"));
        }
        let mut init = ibv_srq_init_attr {
            srq_context: ptr::null_mut(),
            attr: ibv_srq_attr {
                max_wr,
                max_sge,
                srq_limit: 0,
            },
        };
        // SAFETY: live PD, valid init struct.
        let srq = unsafe { ibv_create_srq(pd.pd.as_ptr(), &mut init) };
        let srq = NonNull::new(srq).ok_or_else(|| VerbsError::sys("ibv_create_srq", last_err()))?;
        let real = init.attr.max_wr.max(max_wr);
        Ok(IbvSrq {
            inner: Rc::new(SrqInner {
                srq,
                max_wr: real,
                recv: RefCell::new(RecvScratch::new(real, init.attr.max_sge.max(max_sge))),
                pd: pd.clone(),
            }),
        })
    }
}

impl SharedRecvQueue for IbvSrq {
    fn srq_num(&self) -> u32 {
        // SAFETY: live SRQ (type invariant).
        unsafe { self.inner.srq.as_ref().handle }
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        if wrs.is_empty() {
            return Ok(());
        }
        let mut s = self.inner.recv.borrow_mut();
        let (n, err) = s.fill(wrs);
        if n > 0 {
            let mut bad = ptr::null_mut();
            // SAFETY: live SRQ; the chain of `n` WRs and their SGEs live in `s`.
            let rc =
                unsafe { ibv_post_srq_recv(self.inner.srq.as_ptr(), s.wrs.as_mut_ptr(), &mut bad) };
            if rc != 0 {
                return Err(PostError {
                    index: s.index_of(bad),
                    kind: post_kind(rc, QpState::Rts),
                });
            }
        }
        err.map_or(Ok(()), Err)
    }

    fn set_limit(&self, limit: u32) -> Result<(), VerbsError> {
        if limit > self.inner.max_wr {
            return Err(VerbsError::InvalidArgument("SRQ limit above its size"));
        }
        let mut attr = ibv_srq_attr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: limit,
        };
        // SAFETY: live SRQ, valid attribute struct and mask.
        let rc = unsafe {
            ibv_modify_srq(
                self.inner.srq.as_ptr(),
                &mut attr,
                ibv_srq_attr_mask::IBV_SRQ_LIMIT.0 as i32,
            )
        };
        if rc != 0 {
            return Err(VerbsError::sys("ibv_modify_srq", rc_err(rc)));
        }
        Ok(())
    }
}
