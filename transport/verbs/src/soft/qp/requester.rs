//! The requester side of a queue pair: the send-queue executor (WRITE/READ as
//! one copy between mappings, SEND records into the ring, local key
//! operations), record publication, in-order retirement with RC-ack
//! semantics, and NAKs from the responder.

use super::*;

impl QpInner {
    /// Execute queued send WRs in order until one blocks or fails.
    #[inline(never)]
    pub(super) fn execute(&self) {
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
    pub(super) fn gather(
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
    pub(super) fn remote(
        &self,
        l: &Link,
        ra: RemoteAddr,
        len: u64,
        need: Access,
        out: &mut SpanList,
    ) -> bool {
        if let Some(span) = l.rkeys.span(&l.peer_table, ra, len, need) {
            return out.push(span);
        }
        self.remote_full(l, ra, len, need, out)
    }

    /// [`Self::remote`] without a usable cached key: resolve in the peer's
    /// table (mapping new arenas once) and cache the key when it succeeds.
    #[inline(never)]
    pub(super) fn remote_full(
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
    pub(super) fn run(
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

    pub(super) fn push_record_with(
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

    pub(super) fn push_record(
        &self,
        l: &Link,
        hdr: RecHdr,
        src: Option<&SpanList>,
        tail: &mut u64,
    ) -> Run {
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
    pub(super) fn check_peer(&self, l: &Link) {
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
    pub(super) fn retire(&self, slow: bool) {
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
    pub(super) fn retire_from(&self, head_pos: Option<u64>) {
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

    pub(super) fn nak(&self, l: &Link, status: WcStatus, pos: u64) {
        l.shm.u64_at(l.in_ctl(CTL_NAK)).store(
            ((status as u64) << 56) | (pos & NAK_POS_MASK),
            Ordering::Release,
        );
        l.wake_peer_send();
    }
}
