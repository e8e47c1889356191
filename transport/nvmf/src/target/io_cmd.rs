//! NVM I/O commands: Read, Write, Flush, Write Zeroes and Dataset
//! Management (deallocate → bdev unmap). Ranges and lengths are checked
//! before the bdev sees anything; bdev errors map to NVMe status.
//!
//! The data path: no lock, no allocation. The controller's readiness and
//! the namespace generation are one atomic load each; the namespace view
//! (with this core's bdev channels) is the queue's own.

use pollux_bdev::{IoError, IoType, PiAction, PiChecks, PiErrorKind, SgList, PI_TUPLE_SIZE};

use super::qpair::{ExecOutcome, NsEntry, QueuePair};
use super::req::{Dir, Exec, Plan};
use super::subsystem::pi_type_code;
use super::transport::ReqTag;
use crate::spec::cmd::{FabricsType, IoOpcode};
use crate::spec::cpl::NvmeStatus;
use crate::spec::nvm::{prinfo, DsmCmd, DsmRange, RwCmd, DSM_RANGE_SIZE};

/// The entry of `nsid` in a sorted namespace view.
#[inline]
fn find_ns(view: &[NsEntry], nsid: u32) -> Option<&NsEntry> {
    // Most subsystems serve one namespace (or the first is the busy one).
    if let Some(e) = view.first().filter(|e| e.nsid == nsid) {
        return Some(e);
    }
    view.binary_search_by_key(&nsid, |e| e.nsid)
        .ok()
        .and_then(|i| view.get(i))
}

/// Whether `slba..slba+nlb` fits in `nsze` blocks.
fn in_range(slba: u64, nlb: u64, nsze: u64) -> bool {
    slba.checked_add(nlb).is_some_and(|end| end <= nsze)
}

/// The bdev's PI action for a Read or Write of `rw` on a namespace with
/// PI Type `pi_type` (0: none) in `md` metadata bytes, and whether the wire
/// carries the data only (PRACT with PI-only metadata). PRCHK asks for
/// checks (the reference tag's is void on Type 3), PRACT for generation on
/// a write and for the checks and stripping on a read.
///
/// # Errors
/// Invalid Protection Information: a Type 1 reference tag check whose
/// initial reference tag is not the low 32 bits of SLBA.
#[cold]
#[inline(never)]
fn pi_plan(
    rw: &RwCmd,
    write: bool,
    pi_type: u8,
    md: u32,
) -> Result<(Option<PiAction>, bool), NvmeStatus> {
    if pi_type == 0 {
        // PRINFO means nothing without PI; metadata moves as it is.
        return Ok((None, false));
    }
    let p = rw.prinfo;
    if pi_type == 1 && p & prinfo::PRCHK_REF != 0 && rw.ilbrt != rw.slba as u32 {
        return Err(NvmeStatus::INVALID_PI);
    }
    let mut checks = PiChecks::NONE;
    if p & prinfo::PRCHK_GUARD != 0 {
        checks = checks.with(PiChecks::GUARD);
    }
    if p & prinfo::PRCHK_REF != 0 && pi_type != 3 {
        checks = checks.with(PiChecks::REF);
    }
    let pract = p & prinfo::PRACT != 0;
    let mut a = if write && pract {
        PiAction::write_generate()
    } else {
        PiAction::verify(checks)
    }
    .with_ref_tag(rw.ilbrt);
    a.app_tag = rw.lbat;
    a.app_mask = rw.lbatm;
    if p & prinfo::PRCHK_APP != 0 {
        a = a.with_app_tag(rw.lbat, rw.lbatm);
    }
    let acts = a.generate || a.checks != PiChecks::NONE;
    Ok((acts.then_some(a), pract && md == PI_TUPLE_SIZE))
}

/// The NVMe status of a bdev error.
pub(crate) fn bdev_status(e: IoError, exec: Exec) -> NvmeStatus {
    match e {
        IoError::Pi { kind, .. } => match kind {
            PiErrorKind::Guard => NvmeStatus::GUARD_CHECK_ERROR,
            PiErrorKind::AppTag => NvmeStatus::APP_TAG_CHECK_ERROR,
            PiErrorKind::RefTag => NvmeStatus::REF_TAG_CHECK_ERROR,
            PiErrorKind::Length => NvmeStatus::DATA_SGL_LENGTH_INVALID,
        },
        IoError::OutOfRange { .. } => NvmeStatus::LBA_OUT_OF_RANGE,
        IoError::ReadOnly(_) => NvmeStatus::NAMESPACE_WRITE_PROTECTED,
        IoError::Unsupported(_) => NvmeStatus::INVALID_OPCODE,
        IoError::BadLength { .. } => NvmeStatus::DATA_SGL_LENGTH_INVALID,
        IoError::ZeroLength(_) => NvmeStatus::INVALID_FIELD,
        IoError::Device(_) | IoError::ShortTransfer { .. } => match exec {
            Exec::Read => NvmeStatus::UNRECOVERED_READ_ERROR,
            Exec::Write | Exec::WriteZeroes => NvmeStatus::WRITE_FAULT,
            _ => NvmeStatus::INTERNAL_ERROR,
        },
        _ => NvmeStatus::INTERNAL_ERROR,
    }
}

/// Read the 16 bytes at `off` of a buffer list.
fn read16(bufs: &SgList, off: usize) -> [u8; DSM_RANGE_SIZE] {
    let mut out = [0u8; DSM_RANGE_SIZE];
    let mut pos = 0usize;
    let mut done = 0usize;
    for seg in bufs.iter() {
        let s = seg.as_slice();
        let (start, end) = (pos, pos + s.len());
        pos = end;
        if end <= off + done || done == DSM_RANGE_SIZE {
            continue;
        }
        let from = off + done - start;
        let n = (s.len() - from).min(DSM_RANGE_SIZE - done);
        out[done..done + n].copy_from_slice(&s[from..from + n]);
        done += n;
    }
    out
}

impl QueuePair {
    /// I/O queue: what a command needs, with the range and length checks.
    pub(crate) fn classify_io(&mut self, slot: u16) -> Result<Plan, NvmeStatus> {
        let si = usize::from(slot);
        let cmd = &self.reqs[si].cmd;
        let (opcode, nsid) = (cmd.opcode, cmd.nsid);
        if cmd.is_fabrics() {
            return Err(match FabricsType::from_code(cmd.fctype()) {
                Some(FabricsType::Connect) => NvmeStatus::COMMAND_SEQUENCE_ERROR,
                _ => NvmeStatus::INVALID_OPCODE,
            });
        }
        let ready = self.ctrlr.as_ref().is_some_and(|c| c.is_ready());
        if !ready {
            return Err(NvmeStatus::COMMAND_SEQUENCE_ERROR);
        }
        self.refresh_ns_view();
        let Some(e) = find_ns(&self.ns_view, nsid) else {
            return Err(NvmeStatus::INVALID_NAMESPACE);
        };
        // One look at the bdev's geometry (a call through the backend).
        let info = e.ns.bdev().info();
        let bs = u64::from(info.block_size());
        let md = info.md_size();
        let pi_type = pi_type_code(info.pi_type());
        let nsze = info.num_blocks();
        let max_io = u64::from(self.target.options().max_io_size);
        let op = IoOpcode::from_code(opcode).ok_or(NvmeStatus::INVALID_OPCODE)?;
        let req = &mut self.reqs[si];
        match op {
            IoOpcode::Read | IoOpcode::Write | IoOpcode::WriteZeroes => {
                let rw = RwCmd::from_cmd(&req.cmd);
                let nlb = u64::from(rw.nlb);
                if !in_range(rw.slba, nlb, nsze) {
                    return Err(NvmeStatus::LBA_OUT_OF_RANGE);
                }
                req.slba = rw.slba;
                req.nlb = rw.nlb;
                // FUA on a write: durable before the completion (a flush
                // follows it); on a read it asks nothing of this target.
                req.fua = rw.fua && op != IoOpcode::Read;
                if op == IoOpcode::WriteZeroes {
                    // On a PI bdev the zeroed blocks get valid tuples (guard
                    // of zeroes, app tag 0, ref tag = LBA: the bdev layer's
                    // contract), which is what PRACT asks for.
                    return Ok(Plan::no_data(Exec::WriteZeroes));
                }
                if nlb * bs > max_io {
                    return Err(NvmeStatus::INVALID_FIELD);
                }
                let write = op == IoOpcode::Write;
                // A bdev without PI (the common case) needs none of
                // `pi_plan`: its result, moved through the stack, cost a
                // failed store forward per command.
                let spread = if pi_type == 0 {
                    req.pi = None;
                    req.pi_spread = None;
                    false
                } else {
                    let (pi, spread) = pi_plan(&rw, write, pi_type, md)?;
                    req.pi = pi;
                    req.pi_spread = spread.then_some((bs as u32, md));
                    spread
                };
                // The bdev's blocks carry their metadata; the wire's do too
                // unless PRACT strips a PI-only metadata.
                let buf_len = nlb * (bs + u64::from(md));
                let len = if spread { nlb * bs } else { buf_len };
                let (exec, dir) = if write {
                    (Exec::Write, Dir::ToCtrl)
                } else {
                    (Exec::Read, Dir::ToHost)
                };
                Ok(Plan::new(exec, dir, len as u32).with_buf_len(buf_len as u32))
            }
            IoOpcode::Flush => Ok(Plan::no_data(Exec::Flush)),
            IoOpcode::DatasetManagement => {
                let d = DsmCmd::from_cmd(&req.cmd);
                // NR+1 ranges from a buffer that may be longer (Linux
                // sends 4096 bytes for one range).
                Ok(Plan::new(Exec::Dsm, Dir::ToCtrl, d.data_len() as u32).sgl_may_exceed())
            }
            IoOpcode::Fabrics => Err(NvmeStatus::INVALID_OPCODE),
        }
    }

    /// Submit an I/O command to its namespace's bdev channel.
    pub(crate) fn exec_io(&mut self, slot: u16) -> ExecOutcome {
        let si = usize::from(slot);
        let tag = ReqTag::new(slot, self.reqs[si].gen).to_u64();
        let nsid = self.reqs[si].cmd.nsid;
        let Some(e) = find_ns(&self.ns_view, nsid) else {
            return ExecOutcome::Done(NvmeStatus::INVALID_NAMESPACE);
        };
        let req = &mut self.reqs[si];
        let (slba, nlb) = (req.slba, u64::from(req.nlb));
        // In place: the completion lends the bdev's slot and only the
        // buffers move back (see `IoInbox`).
        let io_type = match req.plan.exec {
            Exec::Read => IoType::Read,
            Exec::Write => IoType::Write,
            Exec::Flush => IoType::Flush,
            Exec::WriteZeroes => IoType::WriteZeroes,
            Exec::Dsm => return self.exec_dsm(slot),
            _ => return ExecOutcome::Done(NvmeStatus::INTERNAL_ERROR),
        };
        let (slba, nlb) = if io_type == IoType::Flush {
            (0, e.ns.num_blocks())
        } else {
            (slba, nlb)
        };
        if io_type == IoType::Write {
            if let Some((bs, md)) = req.pi_spread.take() {
                // PRACT: data-only blocks spread out for the bdev to
                // generate the tuples into (once: a busy channel resubmits
                // them as they are; a read strips at completion).
                super::pi_layout::spread(&mut req.bufs, bs as usize, md as usize, nlb as usize);
            }
        }
        // The data buffers go to the bdev (taken straight into the call:
        // no intermediate moves of the list); the others carry none.
        let bufs = if matches!(io_type, IoType::Read | IoType::Write) {
            std::mem::take(&mut req.bufs)
        } else {
            SgList::new()
        };
        let sub = match req.pi {
            Some(a) => e.ch.submit_in_place_with_pi(
                io_type,
                slba,
                nlb,
                bufs,
                SgList::new(),
                Some(a),
                &self.io_cb,
                tag,
            ),
            None => {
                e.ch.submit_in_place(io_type, slba, nlb, bufs, &self.io_cb, tag)
            }
        };
        match sub {
            Ok(()) => {
                req.subs = 1;
                ExecOutcome::Async
            }
            Err(rej) => {
                if !rej.bufs.is_empty() {
                    req.bufs = rej.bufs;
                }
                ExecOutcome::Busy
            }
        }
    }

    /// Dataset Management: with AD, one bdev unmap per non-empty range,
    /// all ranges checked first; without AD (hints only), success.
    fn exec_dsm(&mut self, slot: u16) -> ExecOutcome {
        let si = usize::from(slot);
        let tag = ReqTag::new(slot, self.reqs[si].gen).to_u64();
        let Some(e) = find_ns(&self.ns_view, self.reqs[si].cmd.nsid) else {
            return ExecOutcome::Done(NvmeStatus::INVALID_NAMESPACE);
        };
        let req = &mut self.reqs[si];
        let d = DsmCmd::from_cmd(&req.cmd);
        if !d.ad {
            return ExecOutcome::Done(NvmeStatus::SUCCESS);
        }
        let nsze = e.ns.num_blocks();
        let range = |i: u16| {
            DsmRange::parse(&read16(&req.bufs, usize::from(i) * DSM_RANGE_SIZE)).unwrap_or_default()
        };
        if req.dsm_next == 0 {
            let bad = (0..d.nr)
                .map(range)
                .any(|r| r.nlb != 0 && !in_range(r.slba, u64::from(r.nlb), nsze));
            if bad {
                return ExecOutcome::Done(NvmeStatus::LBA_OUT_OF_RANGE);
            }
        }
        // Deallocation is advisory: a bdev without unmap, or with PI (an
        // unmapped block would read back without valid tuples), just
        // succeeds.
        if !e.ns.bdev().supports(pollux_bdev::IoType::Unmap) || e.ns.pi_type() != 0 {
            return ExecOutcome::Done(NvmeStatus::SUCCESS);
        }
        let mut next = req.dsm_next;
        let mut subs = req.subs;
        let mut busy = false;
        while next < d.nr {
            let r = range(next);
            if r.nlb == 0 {
                next += 1;
                continue;
            }
            match e.ch.unmap(r.slba, u64::from(r.nlb), &self.io_cb, tag) {
                Ok(()) => {
                    subs += 1;
                    next += 1;
                }
                Err(_) => {
                    busy = true;
                    break;
                }
            }
        }
        let req = &mut self.reqs[si];
        req.dsm_next = next;
        req.subs = subs;
        if subs > 0 {
            ExecOutcome::Async
        } else if busy {
            ExecOutcome::Busy
        } else {
            ExecOutcome::Done(NvmeStatus::SUCCESS)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pollux_reactor::mem::DmaBuf;

    #[test]
    fn range_checks() {
        assert!(in_range(0, 8, 8));
        assert!(!in_range(1, 8, 8));
        assert!(!in_range(u64::MAX, 2, u64::MAX));
    }

    #[test]
    fn read16_spans_segments() {
        let mut a = DmaBuf::alloc(4096).unwrap();
        let mut b = DmaBuf::alloc(4096).unwrap();
        a.set_len(10).unwrap();
        b.set_len(30).unwrap();
        a.as_mut_slice().copy_from_slice(&[1; 10]);
        b.as_mut_slice().copy_from_slice(&[2; 30]);
        let l: SgList = [a, b].into_iter().collect();
        let x = read16(&l, 4);
        assert_eq!(&x[..6], &[1; 6]);
        assert_eq!(&x[6..], &[2; 10]);
        assert_eq!(read16(&l, 24), [2; 16]);
        assert_eq!(read16(&l, 100), [0; 16]);
    }

    #[test]
    fn bdev_errors_map_to_status() {
        let oor = IoError::OutOfRange {
            lba: 1,
            blocks: 1,
            num_blocks: 1,
        };
        assert_eq!(bdev_status(oor, Exec::Read), NvmeStatus::LBA_OUT_OF_RANGE);
        assert_eq!(
            bdev_status(IoError::Device(5), Exec::Read),
            NvmeStatus::UNRECOVERED_READ_ERROR
        );
        assert_eq!(
            bdev_status(IoError::Device(5), Exec::Write),
            NvmeStatus::WRITE_FAULT
        );
        assert_eq!(
            bdev_status(IoError::Device(5), Exec::Flush),
            NvmeStatus::INTERNAL_ERROR
        );
    }
}
