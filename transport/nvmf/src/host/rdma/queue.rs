//! One NVMe queue over an RC QP: capsule and response buffers, staged WRs
//! posted once per flush, the per-request completion rule (send completion
//! + response + key invalidated), and the memory modes.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use pollux_reactor::mem::{ArenaOptions, DmaArena, HugepageMode, SgList};
use pollux_verbs::sig::{check, GuardType};
use pollux_verbs::{
    Access, CmAddr, CmEvent, CmId, CompletionQueue, ConnParam, Device, MemoryRegion,
    ProtectionDomain, Provider, QpAttr, QpCaps, QpInit, QpState, QueuePair, RecvWr, SendOp, SendWr,
    Sge, SigAttrs, SigDomain, SigErrKind, T10Dif, Wc, WcFlags, WcStatus,
};

use super::mr_cache::MrCache;
use super::wrid::{decode, encode, WrKind};
use super::{MemMode, RdmaHostOptions};
use crate::host::pi::{HostPi, PiIo};
use crate::host::transport::{DataDir, HostQueue, QueueParams, Queued, SlotBufs};
use crate::host::HostError;
use crate::spec::cmd::{NvmeCmd, SQE_SIZE};
use crate::spec::cpl::{NvmeCompletion, NvmeStatus, CQE_SIZE};
use crate::spec::rdma_cm::{CmAccept, CmReject, CmRequest};
use crate::spec::sgl::SglDescriptor;

/// Most data segments of one I/O (fast-registration page list, inline SGEs).
pub const MAX_DATA_SEGS: usize = 16;
/// WRs posted per `post_send` call.
const POST_BATCH: usize = 32;
/// Completions reaped per CQ poll.
const POLL_BATCH: usize = 64;
/// Polls between two looks at the connection manager.
const CM_CHECK_EVERY: u32 = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Staged {
    Reg(u16),
    Send(u16),
    Inv(u16),
}

/// How many of the `staged` WRs may be posted now: all of them, or, where
/// binds must wait for the SENDs before them (`bind_after_sends`), those
/// before the first registration with a SEND in flight (`sends_in_flight`
/// already posted, or staged ahead of it).
fn postable(staged: &[Staged], sends_in_flight: u32, bind_after_sends: bool) -> usize {
    if !bind_after_sends {
        return staged.len();
    }
    let mut sends = sends_in_flight;
    for (k, op) in staged.iter().enumerate() {
        match op {
            Staged::Reg(_) if sends > 0 => return k,
            Staged::Send(_) => sends += 1,
            _ => {}
        }
    }
    staged.len()
}

/// The next key of an MR: the same index, the low byte (the variant)
/// advanced, so that a target still holding the old key is refused.
fn next_key(k: u32) -> u32 {
    (k & !0xFF) | (k.wrapping_add(1) & 0xFF)
}

#[derive(Debug, Clone, Copy)]
struct RSlot {
    active: bool,
    send_done: bool,
    rsp: Option<NvmeCompletion>,
    /// A fast-registered key is valid and must be invalidated.
    mr_valid: bool,
    inv_posted: bool,
    key: u32,
    iova: u64,
    sges: [Sge; MAX_DATA_SEGS + 1],
    nsge: usize,
    pages: [Sge; MAX_DATA_SEGS],
    npages: usize,
    /// This I/O registered the slot's integrity MR (`ikey`, `sig`, the
    /// tuples' SGEs in `prot`) instead of its fast-reg MR (`key`).
    integrity: bool,
    ikey: u32,
    sig: Option<SigAttrs>,
    prot: [Sge; MAX_DATA_SEGS],
    nprot: usize,
}

impl RSlot {
    /// A described command: waiting for its send completion and response.
    fn arm(&mut self) {
        self.active = true;
        self.send_done = false;
        self.rsp = None;
        self.inv_posted = false;
    }

    /// The key registered for the current I/O.
    fn io_key(&self) -> u32 {
        if self.integrity {
            self.ikey
        } else {
            self.key
        }
    }
}

impl Default for RSlot {
    fn default() -> Self {
        RSlot {
            active: false,
            send_done: false,
            rsp: None,
            mr_valid: false,
            inv_posted: false,
            key: 0,
            iova: 0,
            sges: [Sge::default(); MAX_DATA_SEGS + 1],
            nsge: 0,
            pages: [Sge::default(); MAX_DATA_SEGS],
            npages: 0,
            integrity: false,
            ikey: 0,
            sig: None,
            prot: [Sge::default(); MAX_DATA_SEGS],
            nprot: 0,
        }
    }
}

/// Counters of one queue (how its requests travelled).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RdmaQueueStats {
    /// Commands whose data travelled in the capsule.
    pub inline: u64,
    /// Fast registrations posted.
    pub registrations: u64,
    /// Keys the target invalidated (SEND_WITH_INVALIDATE, checked).
    pub remote_invalidations: u64,
    /// LOCAL_INV work requests posted.
    pub local_invalidations: u64,
    /// PI checks the signature offload failed.
    pub pi_errors: u64,
}

/// One RDMA host queue (`!Send`).
pub struct RdmaQueue<P: Provider> {
    cm: P::CmId,
    // Fields drop in order: the fast-reg MRs before the QP. With ibverbs
    // they are type-2 memory windows, and a window still bound (an I/O
    // abandoned on a dead queue) holds a reference on the QP it was bound
    // through: soft-RoCE then cannot destroy the QP (`__rxe_cleanup`
    // warns after its timeout). Freeing the windows first releases it.
    _frmrs: Vec<P::Mr>,
    /// Integrity MRs, one per slot, once PI offload is enabled.
    imrs: Vec<P::Mr>,
    /// The device has signature offload.
    integrity_cap: bool,
    qp: P::Qp,
    /// Keeps the queue buffers registered (the fields below say where).
    _ctrl_mr: P::Mr,
    /// `ctrl_mr`'s address and local key, read once (every capsule and
    /// receive SGE names them).
    ctrl_addr: u64,
    ctrl_lkey: u32,
    cq: P::Cq,
    _pd: Rc<P::Pd>,
    ctrl: Arc<DmaArena>,
    mrs: Rc<MrCache<P>>,
    qid: u16,
    entries: u16,
    rsp_base: usize,
    mode: MemMode,
    remote_inv: bool,
    inline: u32,
    max_send_sge: usize,
    slots: Vec<RSlot>,
    staged: Vec<Staged>,
    repost: Vec<u16>,
    wcs: Vec<Wc>,
    dead: Option<String>,
    polls: u32,
    stats: RdmaQueueStats,
    /// Post a registration only when every SEND before it has completed
    /// (the device replays binds when it retransmits: see
    /// [`FastRegMode::MemoryWindow`](pollux_verbs::types::FastRegMode::MemoryWindow)).
    bind_after_sends: bool,
    /// Capsule SENDs posted and not yet completed.
    sends_in_flight: u32,
}

impl<P: Provider> std::fmt::Debug for RdmaQueue<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaQueue")
            .field("qid", &self.qid)
            .field("entries", &self.entries)
            .field("mode", &self.mode)
            .field("dead", &self.dead)
            .finish()
    }
}

fn tr(what: &str) -> impl Fn(pollux_verbs::VerbsError) -> HostError + '_ {
    move |e| HostError::Transport(format!("{what}: {e}"))
}

impl<P: Provider> RdmaQueue<P> {
    /// Create the QP and buffers, connect through the CM and wait for the
    /// connection (control path).
    pub(crate) fn connect(
        dev: &P::Device,
        pd: &Rc<P::Pd>,
        mrs: &Rc<MrCache<P>>,
        addr: &CmAddr,
        opts: &RdmaHostOptions,
        p: &QueueParams,
    ) -> Result<Self, HostError> {
        let entries = p.entries.max(1);
        let n = usize::from(entries);
        let caps = dev.caps();
        let bind_after_sends =
            opts.mem_mode == MemMode::RegisterAlways && caps.fast_reg.binds_replayed_on_retry();
        if bind_after_sends && p.qid == 1 {
            log::info!(
                "nvmf host: this device replays memory-window binds on retransmission \
                 (soft-RoCE): each I/O's registration waits for the SENDs before it"
            );
        }
        let max_send_sge = (caps.max_sge as usize).clamp(2, MAX_DATA_SEGS + 1);
        let cq = dev
            .create_cq(4 * u32::from(entries) + 8)
            .map_err(tr("create CQ"))?;
        let qp = pd
            .create_qp(&QpInit {
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                caps: QpCaps {
                    max_send_wr: 3 * u32::from(entries) + 1,
                    max_recv_wr: u32::from(entries) + 1,
                    max_send_sge: max_send_sge as u32,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: false,
            })
            .map_err(tr("create QP"))?;
        let rsp_base = n * SQE_SIZE;
        let ctrl_len = rsp_base + (n + 1) * CQE_SIZE;
        let ctrl = DmaArena::new(
            ctrl_len,
            ArenaOptions::named(format!("nvmf-host-q{}", p.qid)).hugepages(HugepageMode::Never),
        )
        .map_err(|e| HostError::Transport(format!("queue buffers: {e}")))?;
        let ctrl_mr = pd
            .reg_mr(&ctrl, 0, ctrl_len, Access::LOCAL_WRITE)
            .map_err(tr("register queue buffers"))?;
        let mut frmrs = Vec::new();
        if opts.mem_mode == MemMode::RegisterAlways {
            frmrs.reserve(n);
            for _ in 0..n {
                frmrs.push(
                    pd.alloc_fast_reg_mr(MAX_DATA_SEGS as u32)
                        .map_err(tr("allocate fast-reg MR"))?,
                );
            }
        }
        let mut slots = vec![RSlot::default(); n];
        for (s, mr) in slots.iter_mut().zip(&frmrs) {
            s.key = mr.lkey();
        }
        // Receives go up before the connection, so no response can find
        // the queue without a buffer.
        qp.modify(&QpAttr::to(QpState::Init))
            .map_err(tr("QP to INIT"))?;
        let req = CmRequest {
            recfmt: 0,
            qid: p.qid,
            hrqsize: entries,
            hsqsize: entries.saturating_sub(1),
            cntlid: if p.qid == 0 { 0 } else { p.cntlid },
        }
        .encode();
        let mut param = ConnParam::with_data(&req);
        param.rnr_retry_count = 7;
        let inline = if p.qid == 0 { 0 } else { p.inline_limit };
        let mut me = RdmaQueue {
            cm: dev
                .connect(addr, &qp, &param)
                .map_err(|e| HostError::Unreachable(format!("{addr}: {e}")))?,
            qp,
            _frmrs: frmrs,
            imrs: Vec::new(),
            integrity_cap: caps.integrity,
            ctrl_addr: ctrl_mr.addr(),
            ctrl_lkey: ctrl_mr.lkey(),
            _ctrl_mr: ctrl_mr,
            cq,
            _pd: Rc::clone(pd),
            ctrl,
            mrs: Rc::clone(mrs),
            qid: p.qid,
            entries,
            rsp_base,
            mode: opts.mem_mode,
            remote_inv: opts.remote_invalidate,
            inline,
            max_send_sge,
            slots,
            staged: Vec::with_capacity(3 * n + 1),
            repost: Vec::with_capacity(n + 1),
            wcs: vec![Wc::default(); POLL_BATCH],
            dead: None,
            polls: 0,
            stats: RdmaQueueStats::default(),
            bind_after_sends,
            sends_in_flight: 0,
        };
        me.repost.extend(0..=entries);
        me.post_recvs()?;
        let start = Instant::now();
        loop {
            match me.cm.get_event().map_err(tr("connection manager"))? {
                Some(CmEvent::Established { private_data }) => {
                    if let Ok(acc) = CmAccept::parse(private_data.as_bytes()) {
                        log::debug!(
                            "nvmf host: queue {} connected, target CRQSIZE {}",
                            p.qid,
                            acc.crqsize
                        );
                    }
                    break;
                }
                Some(CmEvent::Rejected {
                    reason,
                    private_data,
                }) => {
                    if reason == pollux_verbs::cm::REJECT_REASON_INVALID_SERVICE_ID {
                        return Err(HostError::Unreachable(addr.to_string()));
                    }
                    let status = CmReject::parse(private_data.as_bytes())
                        .map(|r| r.status)
                        .unwrap_or(crate::spec::rdma_cm::CmRejectStatus::from_code(0));
                    return Err(HostError::Rejected { qid: p.qid, status });
                }
                Some(CmEvent::Unreachable) => return Err(HostError::Unreachable(addr.to_string())),
                Some(ev) => {
                    return Err(HostError::Disconnected(format!(
                        "connecting queue {}: {ev:?}",
                        p.qid
                    )))
                }
                None => {}
            }
            if start.elapsed() > opts.connect_timeout {
                return Err(HostError::Timeout {
                    what: "RDMA connection",
                    after: opts.connect_timeout,
                });
            }
            match pollux_reactor::Reactor::current() {
                // An in-process target on this reactor makes progress.
                Some(r) => {
                    r.poll_once();
                }
                None => std::thread::yield_now(),
            }
        }
        Ok(me)
    }

    fn post_recvs(&mut self) -> Result<(), HostError> {
        let lkey = self.ctrl_lkey;
        let base = self.ctrl_addr + self.rsp_base as u64;
        let mut i = 0;
        while i < self.repost.len() {
            let end = (i + POST_BATCH).min(self.repost.len());
            let mut sges = [Sge::default(); POST_BATCH];
            for (k, &r) in self.repost[i..end].iter().enumerate() {
                sges[k] = Sge {
                    addr: base + u64::from(r) * CQE_SIZE as u64,
                    length: CQE_SIZE as u32,
                    lkey,
                };
            }
            let mut wrs = [RecvWr {
                wr_id: pollux_verbs::WrId(0),
                sg_list: &[],
            }; POST_BATCH];
            for k in 0..end - i {
                wrs[k] = RecvWr {
                    wr_id: encode(WrKind::Recv, self.repost[i + k]),
                    sg_list: std::slice::from_ref(&sges[k]),
                };
            }
            self.qp
                .post_recv(&wrs[..end - i])
                .map_err(|e| HostError::Disconnected(format!("post receive: {e}")))?;
            i = end;
        }
        self.repost.clear();
        Ok(())
    }

    fn post_staged(&mut self) -> Result<(), HostError> {
        let access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
        let n = postable(&self.staged, self.sends_in_flight, self.bind_after_sends);
        let mut i = 0;
        while i < n {
            let end = (i + POST_BATCH).min(n);
            let dummy = SendWr::new(pollux_verbs::WrId(0), SendOp::Send, &[]);
            let mut wrs = [dummy; POST_BATCH];
            for (k, op) in self.staged[i..end].iter().enumerate() {
                wrs[k] = match *op {
                    Staged::Reg(slot) => {
                        let s = &self.slots[usize::from(slot)];
                        let op = match (s.integrity, s.sig) {
                            (true, Some(sig)) => SendOp::RegMrIntegrity {
                                key: s.ikey,
                                iova: s.iova,
                                access,
                                sig,
                                prot: &s.prot[..s.nprot],
                            },
                            _ => SendOp::RegMr {
                                key: s.key,
                                iova: s.iova,
                                access,
                            },
                        };
                        SendWr::new(encode(WrKind::Reg, slot), op, &s.pages[..s.npages])
                    }
                    Staged::Send(slot) => {
                        let s = &self.slots[usize::from(slot)];
                        SendWr::new(encode(WrKind::Send, slot), SendOp::Send, &s.sges[..s.nsge])
                            .signaled()
                    }
                    Staged::Inv(slot) => {
                        let s = &self.slots[usize::from(slot)];
                        SendWr::new(
                            encode(WrKind::Inv, slot),
                            SendOp::LocalInv { key: s.io_key() },
                            &[],
                        )
                        .signaled()
                    }
                };
            }
            self.qp
                .post_send(&wrs[..end - i])
                .map_err(|e| HostError::Disconnected(format!("post send: {e}")))?;
            i = end;
        }
        if self.bind_after_sends {
            let sends = self.staged[..n]
                .iter()
                .filter(|op| matches!(op, Staged::Send(_)))
                .count();
            self.sends_in_flight += sends as u32;
        }
        if n == self.staged.len() {
            self.staged.clear();
        } else {
            self.staged.drain(..n);
        }
        Ok(())
    }

    fn fail(&mut self, why: String) -> HostError {
        if self.dead.is_none() {
            log::debug!("nvmf host: RDMA queue {} failed: {why}", self.qid);
            self.dead = Some(why.clone());
            let _ = self.cm.disconnect();
        }
        HostError::Disconnected(why)
    }

    fn check_cm(&mut self) -> Result<(), HostError> {
        match self.cm.get_event() {
            Ok(Some(CmEvent::Disconnected)) => Err(self.fail("the target disconnected".into())),
            Ok(Some(ev)) => {
                log::debug!("nvmf host: queue {}: CM event {ev:?}", self.qid);
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(e) => Err(self.fail(format!("connection manager: {e}"))),
        }
    }

    /// Queue id.
    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// The memory mode.
    pub fn mem_mode(&self) -> MemMode {
        self.mode
    }

    /// Counters.
    pub fn stats(&self) -> RdmaQueueStats {
        self.stats
    }

    fn describe(
        &mut self,
        slot: u16,
        cmd: &mut NvmeCmd,
        dir: DataDir,
        data: &SgList,
    ) -> Result<(), HostError> {
        let si = usize::from(slot);
        let nseg = data.len();
        let len = u32::try_from(data.total_len())
            .map_err(|_| HostError::Unsupported("transfer over 4 GiB".into()))?;
        let capsule = self.capsule_sge(si);
        // Built in place (the slot is ~600 bytes: no copy in and out); it
        // becomes active only at the end, so an error leaves it unused.
        let mrs = &self.mrs;
        let s = &mut self.slots[si];
        s.sges[0] = capsule;
        s.nsge = 1;
        s.npages = 0;
        s.integrity = false;
        let inline_ok = dir == DataDir::ToCtrl
            && len > 0
            && len <= self.inline
            && nseg < self.max_send_sge
            && nseg <= MAX_DATA_SEGS;
        if dir == DataDir::None || len == 0 {
            cmd.set_sgl(&SglDescriptor::null());
        } else if inline_ok {
            for (k, b) in data.iter().enumerate() {
                let (lkey, _) = mrs.keys(b)?;
                s.sges[1 + k] = Sge {
                    addr: b.addr() as u64,
                    length: b.len() as u32,
                    lkey,
                };
            }
            s.nsge = 1 + nseg;
            self.stats.inline += 1;
            cmd.set_sgl(&SglDescriptor::in_capsule(0, len));
        } else {
            match self.mode {
                MemMode::Pool => {
                    let first = data
                        .iter()
                        .next()
                        .ok_or_else(|| HostError::Unsupported("no buffer".into()))?;
                    // One keyed descriptor: the buffers must be contiguous.
                    if nseg > 1 {
                        let mut next = first.addr();
                        for b in data.iter() {
                            if b.addr() != next || b.arena_id() != first.arena_id() {
                                return Err(HostError::Unsupported(
                                    "pool mode needs one contiguous buffer per I/O".into(),
                                ));
                            }
                            next += b.len();
                        }
                    }
                    let (_, rkey) = mrs.keys(first)?;
                    let sgl = SglDescriptor::keyed(first.addr() as u64, len, rkey, false)
                        .map_err(|e| HostError::Unsupported(e.to_string()))?;
                    cmd.set_sgl(&sgl);
                }
                MemMode::RegisterAlways => {
                    if nseg > MAX_DATA_SEGS {
                        return Err(HostError::Unsupported(format!(
                            "{nseg} segments (at most {MAX_DATA_SEGS})"
                        )));
                    }
                    if s.mr_valid {
                        return Err(HostError::Protocol("registration key still valid".into()));
                    }
                    for (k, b) in data.iter().enumerate() {
                        let (lkey, _) = mrs.keys(b)?;
                        s.pages[k] = Sge {
                            addr: b.addr() as u64,
                            length: b.len() as u32,
                            lkey,
                        };
                    }
                    let iova = s.pages[0].addr;
                    let key = next_key(s.key);
                    let sgl = SglDescriptor::keyed(iova, len, key, self.remote_inv)
                        .map_err(|e| HostError::Unsupported(e.to_string()))?;
                    s.npages = nseg;
                    s.iova = iova;
                    s.key = key;
                    s.mr_valid = true;
                    self.stats.registrations += 1;
                    cmd.set_sgl(&sgl);
                }
            }
        }
        s.arm();
        Ok(())
    }

    /// The SGE of slot `si`'s command capsule.
    fn capsule_sge(&self, si: usize) -> Sge {
        Sge {
            addr: self.ctrl_addr + (si * SQE_SIZE) as u64,
            length: SQE_SIZE as u32,
            lkey: self.ctrl_lkey,
        }
    }

    /// [`describe`](Self::describe) of an I/O whose PI the slot's
    /// integrity MR handles: the caller's data (and, DIX, tuples) as the
    /// MR's data (and protection) SGEs, the wire's extended blocks as its
    /// address space, a keyed SGL the target does not invalidate (Linux's
    /// host uses the same rule), and the signature attributes of `pi`.
    fn describe_pi(
        &mut self,
        slot: u16,
        cmd: &mut NvmeCmd,
        data: &SgList,
        pi: &PiIo,
    ) -> Result<(), HostError> {
        let si = usize::from(slot);
        if self.imrs.is_empty() {
            return Err(HostError::Unsupported("PI offload not enabled".into()));
        }
        if pi.mode == HostPi::Pract {
            return Err(HostError::Unsupported(
                "PRACT needs no offload: use rw_pi".into(),
            ));
        }
        let (data_len, pi_len) = (pi.data_len(), pi.pi_len());
        if data.total_len() < data_len + pi_len {
            return Err(HostError::Unsupported(
                "buffers shorter than the data and its tuples".into(),
            ));
        }
        let wire = u32::try_from(pi.wire_len())
            .map_err(|_| HostError::Unsupported("transfer over 4 GiB".into()))?;
        let capsule = self.capsule_sge(si);
        let mrs = &self.mrs;
        let s = &mut self.slots[si];
        if s.mr_valid {
            return Err(HostError::Protocol("registration key still valid".into()));
        }
        s.sges[0] = capsule;
        s.nsge = 1;
        s.npages = 0;
        s.nprot = 0;
        // Bytes [0, data_len) are data, [data_len, data_len + pi_len) tuples.
        let mut at = 0usize;
        for b in data.iter() {
            let (from, to) = (at, at + b.len());
            at = to;
            for (lo, hi, prot) in [(0, data_len, false), (data_len, data_len + pi_len, true)] {
                let (a, z) = (from.max(lo), to.min(hi));
                if a >= z {
                    continue;
                }
                let (lkey, _) = mrs.keys(b)?;
                let sge = Sge {
                    addr: (b.addr() + (a - from)) as u64,
                    length: (z - a) as u32,
                    lkey,
                };
                if s.npages + s.nprot == MAX_DATA_SEGS {
                    return Err(HostError::Unsupported(format!(
                        "more than {MAX_DATA_SEGS} segments with the tuples"
                    )));
                }
                if prot {
                    s.prot[s.nprot] = sge;
                    s.nprot += 1;
                } else {
                    s.pages[s.npages] = sge;
                    s.npages += 1;
                }
            }
        }
        let dif = T10Dif {
            bg_type: GuardType::Crc,
            pi_interval: pi.interval(),
            bg: 0,
            app_tag: 0,
            ref_tag: pi.ref_seed(),
            ref_remap: pi.ref_checked(),
            app_escape: true,
            ref_escape: !pi.ref_checked(),
            apptag_check_mask: 0,
        };
        let mut checks = check::GUARD;
        if pi.ref_checked() {
            checks |= check::REFTAG;
        }
        let (mem, check_mask) = match (pi.mode, pi.write) {
            // Insert on a write: generated, nothing to check.
            (HostPi::Insert, true) => (SigDomain::None, 0),
            (HostPi::Insert, false) => (SigDomain::None, checks),
            _ => (SigDomain::T10Dif(dif), checks),
        };
        s.sig = Some(SigAttrs {
            check_mask,
            mem,
            wire: SigDomain::T10Dif(dif),
            meta_length: 0,
        });
        let iova = s.pages[0].addr;
        let key = next_key(s.ikey);
        let sgl = SglDescriptor::keyed(iova, wire, key, false)
            .map_err(|e| HostError::Unsupported(e.to_string()))?;
        s.iova = iova;
        s.ikey = key;
        s.integrity = true;
        s.mr_valid = true;
        s.arm();
        self.stats.registrations += 1;
        cmd.set_sgl(&sgl);
        Ok(())
    }

    /// The SQE of slot `slot` into its capsule, and its WRs staged.
    fn stage(&mut self, slot: u16, cmd: &NvmeCmd) -> Result<Queued, HostError> {
        let si = usize::from(slot);
        let mut sqe = [0u8; SQE_SIZE];
        cmd.encode_into(&mut sqe);
        self.ctrl
            .copy_in(si * SQE_SIZE, &sqe)
            .map_err(|e| HostError::Transport(e.to_string()))?;
        if self.slots[si].npages > 0 {
            self.staged.push(Staged::Reg(slot));
        }
        self.staged.push(Staged::Send(slot));
        Ok(Queued::Yes)
    }

    /// Whether slot `slot` can take a command now (`Ok(false)`: busy).
    fn slot_free(&self, slot: u16) -> Result<bool, HostError> {
        if let Some(d) = &self.dead {
            return Err(HostError::Disconnected(d.clone()));
        }
        let si = usize::from(slot);
        if si >= self.slots.len() {
            return Err(HostError::Protocol(format!("slot {slot} out of range")));
        }
        // The previous command of this slot may still wait for its send
        // completion or invalidation.
        Ok(!self.slots[si].active)
    }

    fn try_complete(&mut self, slot: u16, done: &mut Vec<(u16, NvmeCompletion)>) {
        let s = &mut self.slots[usize::from(slot)];
        if s.active && s.send_done && !s.mr_valid {
            if let Some(cpl) = s.rsp {
                s.active = false;
                done.push((slot, cpl));
            }
        }
    }

    fn on_wc(&mut self, wc: Wc, done: &mut Vec<(u16, NvmeCompletion)>) -> Result<(), HostError> {
        let Some((kind, idx)) = decode(wc.wr_id) else {
            return Err(self.fail(format!(
                "completion with an unknown token {:#x}",
                wc.wr_id.0
            )));
        };
        if wc.status != WcStatus::Success {
            let why = if wc.status == WcStatus::WrFlushErr {
                "the connection was flushed (target gone)".to_string()
            } else {
                format!("{kind:?} work request failed: {:?}", wc.status)
            };
            return Err(self.fail(why));
        }
        match kind {
            WrKind::Recv => {
                if idx > self.entries {
                    return Err(self.fail(format!("receive token {idx} out of range")));
                }
                let mut raw = [0u8; CQE_SIZE];
                let off = self.rsp_base + usize::from(idx) * CQE_SIZE;
                if wc.byte_len as usize != CQE_SIZE || self.ctrl.copy_out(off, &mut raw).is_err() {
                    return Err(self.fail(format!("response of {} bytes", wc.byte_len)));
                }
                self.repost.push(idx);
                let Ok(cpl) = NvmeCompletion::parse(&raw) else {
                    return Err(self.fail("malformed response".into()));
                };
                let slot = cpl.cid & 0x3FF;
                let Some(s) = self.slots.get_mut(usize::from(slot)) else {
                    return Err(self.fail(format!("response for unknown cid {:#x}", cpl.cid)));
                };
                if !s.active || s.rsp.is_some() {
                    return Err(self.fail(format!("unexpected response for cid {:#x}", cpl.cid)));
                }
                let mut cpl = cpl;
                if s.integrity && cpl.status.is_success() {
                    // The offload's checks, now that the data moved.
                    let st = self
                        .imrs
                        .get(usize::from(slot))
                        .map(|m| m.check_sig_status());
                    if let Some(Ok(Some(e))) = st {
                        cpl.status = match e.kind {
                            SigErrKind::BadGuard => NvmeStatus::GUARD_CHECK_ERROR,
                            SigErrKind::BadAppTag => NvmeStatus::APP_TAG_CHECK_ERROR,
                            SigErrKind::BadRefTag => NvmeStatus::REF_TAG_CHECK_ERROR,
                        };
                        self.stats.pi_errors += 1;
                    }
                }
                let s = &mut self.slots[usize::from(slot)];
                s.rsp = Some(cpl);
                if s.mr_valid {
                    if wc.flags.contains(WcFlags::WITH_INV) {
                        if wc.imm != s.io_key() {
                            let (got, want) = (wc.imm, s.io_key());
                            return Err(self.fail(format!(
                                "target invalidated key {got:#x}, expected {want:#x}"
                            )));
                        }
                        s.mr_valid = false;
                        self.stats.remote_invalidations += 1;
                    } else if !s.inv_posted {
                        s.inv_posted = true;
                        self.stats.local_invalidations += 1;
                        self.staged.push(Staged::Inv(slot));
                    }
                } else if wc.flags.contains(WcFlags::WITH_INV) {
                    return Err(self.fail(format!(
                        "target invalidated key {:#x} the host did not ask for",
                        wc.imm
                    )));
                }
                self.try_complete(slot, done);
            }
            WrKind::Send => {
                if self.bind_after_sends {
                    self.sends_in_flight = self.sends_in_flight.saturating_sub(1);
                }
                if let Some(s) = self.slots.get_mut(usize::from(idx)) {
                    s.send_done = true;
                }
                self.try_complete(idx, done);
            }
            WrKind::Inv => {
                if let Some(s) = self.slots.get_mut(usize::from(idx)) {
                    s.mr_valid = false;
                    s.inv_posted = false;
                }
                self.try_complete(idx, done);
            }
            WrKind::Reg => {}
        }
        Ok(())
    }
}

impl<P: Provider> HostQueue for RdmaQueue<P> {
    fn max_inline(&self) -> u32 {
        self.inline
    }

    #[inline]
    fn queue_cmd(
        &mut self,
        slot: u16,
        cmd: &mut NvmeCmd,
        dir: DataDir,
        data: &SgList,
    ) -> Result<Queued, HostError> {
        if !self.slot_free(slot)? {
            return Ok(Queued::Busy);
        }
        self.describe(slot, cmd, dir, data)?;
        self.stage(slot, cmd)
    }

    fn enable_pi_offload(&mut self) -> Result<bool, HostError> {
        if !self.imrs.is_empty() {
            return Ok(true);
        }
        if !self.integrity_cap {
            return Ok(false);
        }
        let mut imrs = Vec::with_capacity(self.slots.len());
        for _ in 0..self.slots.len() {
            imrs.push(
                self._pd
                    .alloc_integrity_mr(MAX_DATA_SEGS as u32)
                    .map_err(tr("allocate integrity MR"))?,
            );
        }
        for (s, m) in self.slots.iter_mut().zip(&imrs) {
            s.ikey = m.lkey();
        }
        self.imrs = imrs;
        Ok(true)
    }

    fn queue_cmd_pi(
        &mut self,
        slot: u16,
        cmd: &mut NvmeCmd,
        _dir: DataDir,
        data: &SgList,
        pi: &PiIo,
    ) -> Result<Queued, HostError> {
        if !self.slot_free(slot)? {
            return Ok(Queued::Busy);
        }
        self.describe_pi(slot, cmd, data, pi)?;
        self.stage(slot, cmd)
    }

    fn flush(&mut self, _bufs: &dyn SlotBufs) -> Result<(), HostError> {
        if let Some(d) = &self.dead {
            return Err(HostError::Disconnected(d.clone()));
        }
        if let Err(e) = self.post_staged() {
            return Err(self.fail(e.to_string()));
        }
        Ok(())
    }

    fn poll(
        &mut self,
        done: &mut Vec<(u16, NvmeCompletion)>,
        bufs: &mut dyn SlotBufs,
    ) -> Result<bool, HostError> {
        if let Some(d) = &self.dead {
            return Err(HostError::Disconnected(d.clone()));
        }
        self.polls = self.polls.wrapping_add(1);
        let mut wcs = std::mem::take(&mut self.wcs);
        let n = match self.cq.poll(&mut wcs) {
            Ok(n) => n,
            Err(e) => {
                self.wcs = wcs;
                return Err(self.fail(format!("completion queue: {e}")));
            }
        };
        let mut res = Ok(n > 0);
        for wc in &wcs[..n] {
            if let Err(e) = self.on_wc(*wc, done) {
                res = Err(e);
                break;
            }
        }
        self.wcs = wcs;
        res?;
        if !self.repost.is_empty() {
            if let Err(e) = self.post_recvs() {
                return Err(self.fail(e.to_string()));
            }
        }
        if !self.staged.is_empty() {
            self.flush(&*bufs)?;
        }
        if n == 0 && self.polls % CM_CHECK_EVERY == 0 {
            self.check_cm()?;
        }
        Ok(n > 0)
    }

    fn slot_state(&self, slot: u16) -> Option<String> {
        let s = self.slots.get(usize::from(slot))?;
        Some(format!(
            "active {} send_done {} response {} key {:#x} valid {} local-inv posted {} \
             (queue: {} remote / {} local invalidations, {} registrations)",
            s.active,
            s.send_done,
            s.rsp.map_or("none".to_string(), |c| format!(
                "status {:#x}",
                c.status.to_field()
            )),
            s.key,
            s.mr_valid,
            s.inv_posted,
            self.stats.remote_invalidations,
            self.stats.local_invalidations,
            self.stats.registrations,
        ))
    }

    fn abandon(&mut self, slot: u16) {
        if let Some(s) = self.slots.get_mut(usize::from(slot)) {
            // The QP is dead; its fast-reg key is unusable by the target.
            *s = RSlot {
                key: s.key,
                ikey: s.ikey,
                ..RSlot::default()
            };
        }
    }

    fn disconnect(&mut self) {
        if self.dead.is_none() {
            self.dead = Some("disconnected by the host".into());
            let _ = self.cm.disconnect();
        }
    }
}

#[cfg(test)]
mod postable_tests {
    use super::{postable, Staged};
    use Staged::*;

    #[test]
    fn everything_goes_when_binds_need_not_wait() {
        let staged = [Reg(0), Send(0), Reg(1), Send(1)];
        assert_eq!(postable(&staged, 5, false), 4);
    }

    #[test]
    fn a_bind_waits_for_every_send_before_it() {
        let staged = [Reg(0), Send(0), Reg(1), Send(1)];
        // Nothing in flight: the first bind and its capsule go, the second
        // bind waits for that capsule's completion.
        assert_eq!(postable(&staged, 0, true), 2);
        // A capsule still in flight: not even the first bind goes.
        assert_eq!(postable(&staged, 1, true), 0);
        // Capsules without data and invalidations never wait.
        let staged = [Send(2), Inv(3), Send(4), Reg(5), Send(5)];
        assert_eq!(postable(&staged, 3, true), 3);
        assert_eq!(postable(&[], 0, true), 0);
    }
}
