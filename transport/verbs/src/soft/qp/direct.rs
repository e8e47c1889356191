//! The SEND fast path of `post_send`: a WR with nothing queued before it on
//! an RTS QP is written straight from the user's memory into the ring slot;
//! and the post-time checks of every send WR.

use super::*;
/// The fast path's running state during one `post_send`.
pub(super) struct Direct {
    /// Local producer tail (published once at the end).
    pub(super) tail: u64,
    /// Local key cache (see `resolve_local_cached`).
    pub(super) keys: KeyCache,
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
    pub(super) fn send_direct(
        &self,
        sq: &mut SendQueue,
        wr: &SendWr<'_>,
        l: &Link,
        d: &mut Direct,
    ) -> bool {
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
    pub(super) fn push_direct_slot(
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
    pub(super) fn direct_source(&self, wr: &SendWr<'_>, d: &mut Direct) -> Option<Span> {
        if wr.flags.contains(SendFlags::INLINE) {
            return Some(Span {
                ptr: wr.inline.as_ptr().cast_mut(),
                len: wr.inline.len(),
            });
        }
        let [one] = wr.sg_list else { return None };
        self.pd.0.span_cached(one, Access::NONE, &mut d.keys)
    }

    pub(super) fn write_direct(
        &self,
        sq: &mut SendQueue,
        wr: &SendWr<'_>,
        l: &Link,
        d: &mut Direct,
    ) -> bool {
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

    pub(super) fn check_send(
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
