//! Completion queues with a non-blocking completion channel each.

use std::cell::RefCell;
use std::os::fd::BorrowedFd;
use std::ptr::{self, NonNull};
use std::rc::Rc;

use rdma_sys::*;

use super::device::Ctx;
use super::{last_err, rc_err, set_nonblocking, zeroed_slice};
use crate::error::{CqError, VerbsError};
use crate::provider::CompletionQueue;
use crate::types::{Wc, WcFlags, WcOpcode, WcStatus, WrId};

/// Completions fetched per `ibv_poll_cq` call.
const POLL_BATCH: usize = 32;

/// The completion channel (its fd signals armed CQs).
struct Channel {
    // INVARIANT: from ibv_create_comp_channel, destroyed in drop only, after
    // the CQ that uses it (the CQ's owner drops the CQ first).
    ch: NonNull<ibv_comp_channel>,
}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: the CQ using the channel was destroyed before (CqInner).
        unsafe { ibv_destroy_comp_channel(self.ch.as_ptr()) };
    }
}

pub(super) struct CqInner {
    // INVARIANT: created on `ctx` with `channel`; destroyed in drop only,
    // after every QP using it (QPs hold an `Rc<CqInner>`).
    pub(super) cq: NonNull<ibv_cq>,
    channel: Channel,
    wcs: RefCell<Box<[ibv_wc]>>,
    pub(super) ctx: Rc<Ctx>,
}

impl Drop for CqInner {
    fn drop(&mut self) {
        // Events are acked as soon as they are read (`ack_events`), so the
        // destroy does not wait. The channel is destroyed after this body.
        // SAFETY: no QP uses the CQ any more (they hold `Rc<CqInner>`).
        unsafe { ibv_destroy_cq(self.cq.as_ptr()) };
    }
}

/// A completion queue (`ibv_cq`) with its own completion channel.
pub struct IbvCq {
    pub(super) inner: Rc<CqInner>,
}

impl std::fmt::Debug for IbvCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvCq")
            .field("cq_num", &self.cq_num())
            .field("depth", &self.depth())
            .finish()
    }
}

impl IbvCq {
    pub(super) fn create(ctx: &Rc<Ctx>, depth: u32) -> Result<IbvCq, VerbsError> {
        if depth == 0 || depth > ctx.caps.max_cqe {
            return Err(VerbsError::InvalidArgument("CQ depth 0 or above max_cqe"));
        }
        let cqe = i32::try_from(depth).map_err(|_| VerbsError::InvalidArgument("CQ depth"))?;
        // SAFETY: open context.
        let ch = unsafe { ibv_create_comp_channel(ctx.ctx.as_ptr()) };
        let channel = Channel {
            ch: NonNull::new(ch)
                .ok_or_else(|| VerbsError::sys("ibv_create_comp_channel", last_err()))?,
        };
        // SAFETY: the channel is live; its fd belongs to it.
        set_nonblocking(unsafe { (*ch).fd })
            .map_err(|e| VerbsError::sys("completion channel O_NONBLOCK", e))?;
        // SAFETY: open context and a live channel of it.
        let cq = unsafe { ibv_create_cq(ctx.ctx.as_ptr(), cqe, ptr::null_mut(), ch, 0) };
        let cq = NonNull::new(cq).ok_or_else(|| VerbsError::sys("ibv_create_cq", last_err()))?;
        Ok(IbvCq {
            inner: Rc::new(CqInner {
                cq,
                channel,
                // SAFETY: ibv_wc is integers and a union of integers.
                wcs: RefCell::new(unsafe { zeroed_slice(POLL_BATCH) }),
                ctx: ctx.clone(),
            }),
        })
    }
}

fn convert(wc: &ibv_wc, ctx: &Ctx) -> Wc {
    let status = u8::try_from(wc.status).map_or(WcStatus::GeneralErr, WcStatus::from_u8);
    let opcode = match wc.opcode {
        ibv_wc_opcode::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
        ibv_wc_opcode::IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
        ibv_wc_opcode::IBV_WC_LOCAL_INV => WcOpcode::LocalInv,
        // A `RegMr` carried out as a memory-window bind.
        ibv_wc_opcode::IBV_WC_BIND_MW => WcOpcode::RegMr,
        ibv_wc_opcode::IBV_WC_RECV => WcOpcode::Recv,
        ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
        // SEND, and garbage in error completions (only wr_id/status/qp_num
        // /vendor_err are valid then).
        _ => WcOpcode::Send,
    };
    let mut flags = WcFlags::NONE;
    let mut imm = 0;
    if status == WcStatus::Success {
        // SAFETY: both union members are a u32.
        let raw = unsafe { wc.imm_data_invalidated_rkey_union.imm_data };
        if wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0 {
            flags |= WcFlags::WITH_IMM;
            imm = u32::from_be(raw);
        } else if wc.opcode == ibv_wc_opcode::IBV_WC_RECV && wc.wc_flags & ctx.with_inv_bits != 0 {
            flags |= WcFlags::WITH_INV;
            imm = raw;
            // The peer freed one of our windows (fast-reg MRs).
            ctx.keys.remote_invalidated(raw);
        }
    }
    Wc {
        wr_id: WrId(wc.wr_id),
        status,
        opcode,
        byte_len: if status == WcStatus::Success {
            wc.byte_len
        } else {
            0
        },
        imm,
        flags,
        qp_num: wc.qp_num,
        vendor_err: wc.vendor_err,
    }
}

impl CompletionQueue for IbvCq {
    fn cq_num(&self) -> u32 {
        // SAFETY: live CQ (type invariant).
        unsafe { self.inner.cq.as_ref().handle }
    }

    fn depth(&self) -> u32 {
        // SAFETY: live CQ.
        u32::try_from(unsafe { self.inner.cq.as_ref().cqe }).unwrap_or(0)
    }

    fn poll(&self, out: &mut [Wc]) -> Result<usize, CqError> {
        let mut wcs = self.inner.wcs.borrow_mut();
        let mut done = 0;
        while done < out.len() {
            let want = (out.len() - done).min(wcs.len());
            // SAFETY: live CQ; `wcs` has room for `want` (<= 32) entries.
            let n = unsafe { ibv_poll_cq(self.inner.cq.as_ptr(), want as i32, wcs.as_mut_ptr()) };
            if n < 0 {
                return Err(CqError::Overflow);
            }
            let n = n as usize;
            for (dst, src) in out[done..done + n].iter_mut().zip(wcs.iter()) {
                *dst = convert(src, &self.inner.ctx);
            }
            done += n;
            if n < want {
                break;
            }
        }
        Ok(done)
    }

    fn req_notify(&self, solicited_only: bool) -> Result<(), VerbsError> {
        // SAFETY: live CQ.
        let rc = unsafe { ibv_req_notify_cq(self.inner.cq.as_ptr(), i32::from(solicited_only)) };
        if rc != 0 {
            return Err(VerbsError::sys("ibv_req_notify_cq", rc_err(rc)));
        }
        Ok(())
    }

    fn event_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the channel's fd stays open as long as `self` (the channel
        // is destroyed only when the CQ is).
        unsafe { BorrowedFd::borrow_raw(self.inner.channel.ch.as_ref().fd) }
    }

    fn ack_events(&self) -> bool {
        let mut any = false;
        loop {
            let mut cq = ptr::null_mut();
            let mut cq_ctx = ptr::null_mut();
            // SAFETY: live channel with a non-blocking fd; out pointers valid.
            let rc =
                unsafe { ibv_get_cq_event(self.inner.channel.ch.as_ptr(), &mut cq, &mut cq_ctx) };
            if rc != 0 {
                return any;
            }
            // SAFETY: `cq` is the CQ the event belongs to (ours: one CQ per
            // channel); each event is acked exactly once.
            unsafe { ibv_ack_cq_events(cq, 1) };
            any = true;
        }
    }
}
