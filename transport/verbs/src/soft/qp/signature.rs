//! Signature (integrity MR) work on both sides of a queue pair: resolving a
//! peer's integrity MR, running a WR through the PI transform, and a receive
//! into an integrity MR.

use super::*;

impl QpInner {
    /// The peer's integrity MR behind `ra` (mapping new arenas once).
    pub(super) fn remote_sig(
        &self,
        l: &Link,
        ra: RemoteAddr,
        len: u64,
        need: Access,
    ) -> Option<SigSide> {
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
    pub(super) fn run_sig(
        &self,
        slot: &SqSlot,
        sges: &[Sge],
        l: &Link,
        tail: &mut u64,
    ) -> Option<Run> {
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

    /// Slow path of a receive whose SGE did not resolve: an integrity MR
    /// takes the payload through the PI transform; anything else is a local
    /// protection error. Returns the (responder, requester) statuses of a
    /// failure.
    #[cold]
    #[inline(never)]
    pub(super) fn recv_sig(&self, one: Option<Sge>, payload: Span) -> Option<(WcStatus, WcStatus)> {
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
}
