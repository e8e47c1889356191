//! The responder side of a queue pair: taking receives (SRQ or RQ),
//! consuming inbound records into them, the direct copy from the ring into a
//! one-SGE receive, and RNR bookkeeping.

use super::*;

impl QpInner {
    /// Take the next receive (SRQ or RQ): its id, whether its SGEs check,
    /// and, when they do not and there is one, the SGE (it may name an
    /// integrity MR: the slow path resolves it).
    pub(super) fn take_recv(
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

    /// The responder: consume inbound records into receives. `slow`: also
    /// check the inbound ring's tail and the peer's words when nothing came.
    #[inline(never)]
    pub(super) fn recv(&self, slow: bool) {
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
    pub(super) fn consume(&self, l: &Link, slow: bool) {
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
    pub(super) fn recv_direct(&self, payload: Span, keys: &mut KeyCache) -> Option<WrId> {
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
    pub(super) fn rnr_expired(&self, l: &Link) -> bool {
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
