//! [`IserInitiator`]: one iSER connection (= one session) of the
//! initiator, polled: CM connect with the iSER CM header, login
//! (security → operational → full feature), SCSI tasks with per-task
//! memory registration, SendTargets, logout.
// `SubmitError` hands the caller's inline `SgList` back by value: large,
// but boxing it would allocate on the back-pressure path.
#![allow(clippy::result_large_err)]

mod control;
mod receive;
mod submit;

use std::collections::VecDeque;
use std::time::Instant;

use pollux_reactor::mem::{ArenaId, DmaBuf, SgList};
use pollux_reactor::{AwakeHold, ClockHandle, PollStatus, Reactor};
use pollux_verbs::{
    Access, CmAddr, CmEvent, CmId, CompletionQueue, ConnParam, Device, MemoryRegion,
    ProtectionDomain, Provider, QpAttr, QpCaps, QpInit, QpState, QueuePair, RecvWr, SendOp, SendWr,
    Sge, VerbsError, Wc, WcFlags, WcOpcode, WcStatus, WrId,
};

use super::error::{InitiatorError, SubmitError};
use super::options::{InitiatorOptions, PiEngine, SessionKind};
use super::pi::{self, PiLayout, PiShape, TUPLE};
use super::scsi::{rw16_cdb, LunGeometry};
use super::task::{DataDir, Invalidation, PiFailure, PiPath, Task, TaskResult, NO_PI};
use crate::pdu::text::{parse_text, push_pair};
use crate::pdu::{
    Bhs, IserCmHdr, IserHeader, LoginFlags, LoginRequest, LogoutReason, LogoutRequest, Lun, NopOut,
    Pdu, ScsiCommand, Stag, Stage, TaskAttr, TextPdu, BHS_LEN, ISER_HDR_LEN, ISER_HEADERS_LEN,
    RESERVED_TAG,
};
use crate::scsi::cdb::{rw32_cdb, PiTags};
use crate::scsi::sense::{self, Sense};
use crate::session::{sn_le, sn_lt, SessionParams};

/// Bytes of one receive buffer (any PDU the target may send).
const RECV_SLOT: usize = ISER_HEADERS_LEN + 8192 + 52;
/// Bytes of a task's header slot (iSER header + BHS).
const HDR_SLOT: usize = 128;
/// Control send slots (login, text, NOP-Out, logout).
const CTRL_SLOTS: usize = 2;
/// Bytes of a control slot.
const CTRL_SLOT: usize = RECV_SLOT;
/// Completions reaped per CQ poll.
const WC_BATCH: usize = 32;
/// Most page-list entries of one registration.
const MAX_SGES: usize = 16;
/// Poll rounds between CM event checks (and keep-alive checks) in full
/// feature phase.
const CM_PERIOD: u64 = 64;
/// The ITTs of NOP-Out pings: top bit set (a task's ITT never has it),
/// never the reserved tag.
const PING_ITT: u32 = 0x8000_0000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Recv = 0,
    TaskSend = 1,
    CtrlSend = 2,
    Reg = 3,
    Inv = 4,
}

fn wr(kind: Kind, index: usize) -> WrId {
    WrId((kind as u64) << 56 | index as u64)
}

fn unwr(id: WrId) -> (Option<Kind>, usize) {
    let k = match id.0 >> 56 {
        0 => Some(Kind::Recv),
        1 => Some(Kind::TaskSend),
        2 => Some(Kind::CtrlSend),
        3 => Some(Kind::Reg),
        4 => Some(Kind::Inv),
        _ => None,
    };
    (k, (id.0 & 0xFFFF_FFFF) as usize)
}

/// Where the session is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionState {
    /// CM connect in progress.
    Connecting,
    /// Login PDUs being exchanged.
    Login,
    /// Full feature phase.
    Ready,
    /// Logout sent.
    LoggingOut,
    /// Logged out and disconnected.
    Closed,
    /// The connection or login failed.
    Failed(InitiatorError),
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InitiatorStats {
    /// Tasks submitted.
    pub submitted: u64,
    /// Tasks completed.
    pub completed: u64,
    /// Registrations invalidated by the target (SEND_WITH_INV).
    pub remote_invalidations: u64,
    /// Registrations invalidated with LOCAL_INV.
    pub local_invalidations: u64,
    /// PI errors detected by the initiator.
    pub pi_errors: u64,
    /// Submissions refused as busy (window closed or no task).
    pub busy: u64,
    /// NOP-Out pings sent (keep-alive, `InitiatorOptions::nop_interval`).
    pub nop_pings: u64,
    /// NOP-In answers to those pings received.
    pub nop_answers: u64,
}

/// The outstanding NOP-Out ping.
#[derive(Debug, Clone, Copy)]
struct Ping {
    itt: u32,
    /// When it became due (its timeout runs from here).
    since: Instant,
    /// Posted (`false` while no control slot was free).
    sent: bool,
}

/// An iSER initiator session over provider `P` (one connection;
/// `!Send`, polled by its owner). See the [module docs](super).
pub struct IserInitiator<P: Provider> {
    opts: InitiatorOptions,
    state: SessionState,
    remote_inv: bool,
    /// No fast registration: task STags are the rkeys of arena MRs.
    pre_registered: bool,
    offload: bool,
    /// The device replays binds when it retransmits the WRs before them
    /// (rxe; `FastRegMode::MemoryWindow::binds_replayed_on_retry`): a task
    /// that registers memory is submitted only when no SEND is in flight.
    bind_after_sends: bool,
    /// Task and control SENDs posted and not yet completed.
    sends_in_flight: u32,
    // Session.
    params: SessionParams,
    login_text: Vec<u8>,
    stage: Stage,
    tsih: u16,
    cmd_sn: u32,
    exp_cmd_sn: u32,
    max_cmd_sn: u32,
    exp_stat_sn: u32,
    ctrl_itt: u32,
    text: Option<Vec<u8>>,
    geometry: Vec<(u16, LunGeometry)>,
    // Tasks.
    tasks: Vec<Task<P::Mr>>,
    free: Vec<u16>,
    done: VecDeque<u16>,
    // Memory.
    ctrl: DmaBuf,
    ctrl_lkey: u32,
    nrecv: usize,
    ctrl_free: Vec<usize>,
    reposts: Vec<usize>,
    bounce: Option<DmaBuf>,
    bounce_slot: usize,
    arena_mrs: Vec<(ArenaId, P::Mr)>,
    wcs: Vec<Wc>,
    rounds: u64,
    stats: InitiatorStats,
    // Keep-alive.
    /// The keep-alive's time: the clock of the reactor the session was
    /// connected on (manual under `TestCluster`), wherever it is polled;
    /// else the monotonic clock.
    clock: ClockHandle,
    /// A PDU arrived since the last keep-alive check.
    heard: bool,
    /// When the target was last heard from (at check resolution).
    last_heard: Option<Instant>,
    ping: Option<Ping>,
    ping_seq: u32,
    /// Held while the session waits for its target (connect, login, tasks,
    /// a ping, logout): completions cannot wake a sleeping reactor.
    awake: Option<AwakeHold>,
    /// Read the Logout Response but do not disconnect (a misbehaving
    /// initiator for the target's tests; never set otherwise).
    linger_after_logout: bool,
    // Verbs objects; the device last.
    cm: Option<P::CmId>,
    qp: P::Qp,
    cq: P::Cq,
    pd: P::Pd,
    dev: P::Device,
}

impl<P: Provider> std::fmt::Debug for IserInitiator<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IserInitiator")
            .field("state", &self.state)
            .field("stats", &self.stats)
            .finish()
    }
}

fn verbs(what: &str, e: impl std::fmt::Display) -> InitiatorError {
    InitiatorError::Verbs(format!("{what}: {e}"))
}

fn next_key(k: u32) -> u32 {
    (k & !0xff) | (k.wrapping_add(1) & 0xff)
}

impl<P: Provider> IserInitiator<P> {
    /// Create the verbs objects, post the receives and start the CM
    /// connect (control path; returns at once). Drive it with
    /// [`IserInitiator::poll`] until [`IserInitiator::is_ready`] (login
    /// runs by itself) or [`IserInitiator::state`] is `Failed`.
    ///
    /// # Errors
    /// [`InitiatorError::Verbs`] when a verbs object or buffer cannot be
    /// created or the connect cannot start.
    pub fn connect(opts: InitiatorOptions) -> Result<Self, InitiatorError> {
        let name = match &opts.device {
            Some(n) => n.clone(),
            None => P::list_devices()
                .map_err(|e| verbs("listing devices", e))?
                .first()
                .map(|d| d.name.clone())
                .ok_or_else(|| verbs("device", "none"))?,
        };
        let dev = P::open_device(&name).map_err(|e| verbs("open", e))?;
        let caps = dev.caps().clone();
        let depth = usize::from(opts.queue_depth.max(1));
        let nrecv = depth + 4;
        let pd = dev.alloc_pd().map_err(|e| verbs("pd", e))?;
        let cq = dev
            .create_cq((4 * depth + nrecv + 16) as u32)
            .map_err(|e| verbs("cq", e))?;
        let qp = pd
            .create_qp(&QpInit {
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                caps: QpCaps {
                    max_send_wr: (3 * depth + CTRL_SLOTS + 4) as u32,
                    max_recv_wr: nrecv as u32,
                    // A registration's page list (data and, DIX, tuples).
                    max_send_sge: (MAX_SGES as u32).min(caps.max_sge).max(2),
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: false,
            })
            .map_err(|e| verbs("qp", e))?;
        qp.modify(&QpAttr::to(QpState::Init))
            .map_err(|e| verbs("qp init", e))?;
        let ctrl_len = nrecv * RECV_SLOT + depth * HDR_SLOT + CTRL_SLOTS * CTRL_SLOT;
        let ctrl = DmaBuf::alloc(ctrl_len).map_err(|e| verbs("buffers", e))?;
        // Integrity MRs are fast registrations too: none in forced
        // pre-registered mode.
        let offload = caps.integrity && opts.pi_engine == PiEngine::Auto && !opts.pre_registered;
        let segs = opts.max_segments.clamp(1, MAX_SGES as u32);
        let mut tasks = Vec::with_capacity(depth);
        // Without fast registration (user-space verbs on a device with no
        // memory windows) the tasks advertise their buffers through
        // arena-wide MRs registered once with remote access.
        let mut pre_registered = opts.pre_registered;
        for _ in 0..depth {
            let mr = if pre_registered {
                None
            } else {
                match pd.alloc_fast_reg_mr(segs) {
                    Ok(m) => Some(m),
                    Err(VerbsError::Unsupported(why)) if tasks.is_empty() && !offload => {
                        log::info!("iSER initiator: {why}; using pre-registered buffers");
                        pre_registered = true;
                        None
                    }
                    Err(e) => return Err(verbs("task MR", e)),
                }
            };
            let imr = if offload {
                let m = pd
                    .alloc_integrity_mr(segs)
                    .map_err(|e| verbs("task integrity MR", e))?;
                let k = m.lkey();
                Some((m, k))
            } else {
                None
            };
            let k = mr.as_ref().map_or(0, |m| m.lkey());
            tasks.push(Task::new(mr, k, imr));
        }
        let blocks = (opts.max_io_bytes as usize).div_ceil(512);
        let bounce_slot = blocks * (512 + TUPLE);
        let bounce = if opts.pi != super::PiPolicy::Off && !offload {
            Some(DmaBuf::alloc(bounce_slot * depth).map_err(|e| verbs("bounce", e))?)
        } else {
            None
        };
        let bind_after_sends = !pre_registered && caps.fast_reg.binds_replayed_on_retry();
        let mut s = IserInitiator {
            remote_inv: false,
            pre_registered,
            offload,
            bind_after_sends,
            sends_in_flight: 0,
            params: SessionParams::default(),
            login_text: Vec::with_capacity(8192),
            stage: Stage::Security,
            tsih: 0,
            cmd_sn: 1,
            exp_cmd_sn: 1,
            max_cmd_sn: 1,
            exp_stat_sn: 0,
            ctrl_itt: 0x4000_0000,
            text: None,
            geometry: Vec::new(),
            tasks,
            free: (0..depth as u16).rev().collect(),
            done: VecDeque::with_capacity(depth),
            ctrl_lkey: 0,
            ctrl,
            nrecv,
            ctrl_free: (0..CTRL_SLOTS).collect(),
            reposts: Vec::with_capacity(nrecv),
            bounce,
            bounce_slot,
            arena_mrs: Vec::new(),
            wcs: vec![Wc::default(); WC_BATCH],
            rounds: 0,
            stats: InitiatorStats::default(),
            clock: Reactor::current().map_or_else(ClockHandle::monotonic, |r| r.clock_handle()),
            heard: false,
            last_heard: None,
            ping: None,
            ping_seq: 0,
            linger_after_logout: false,
            awake: Reactor::current().map(|r| r.hold_awake()),
            cm: None,
            state: SessionState::Connecting,
            opts,
            qp,
            cq,
            pd,
            dev,
        };
        let ctrl_buf = s.ctrl.arena().clone();
        s.ctrl_lkey = s
            .lkey_of(&ctrl_buf, false)
            .map_err(|e| verbs("register", e))?;
        if let Some(b) = s.bounce.as_ref().map(|b| b.arena().clone()) {
            s.lkey_of(&b, true).map_err(|e| verbs("register", e))?;
        }
        s.reposts.extend(0..nrecv);
        s.post_recvs().map_err(|e| verbs("post receives", e))?;
        let hdr = IserCmHdr {
            zbva_not_sup: true,
            // An arena MR must never be invalidated by the target.
            send_w_inv_not_sup: !s.opts.remote_invalidate || s.pre_registered,
        }
        .encode();
        let mut p = ConnParam::with_data(&hdr);
        p.initiator_depth = 1;
        p.responder_resources = caps.max_qp_rd_atom.clamp(1, 255) as u8;
        p.rnr_retry_count = 7;
        let addr = CmAddr::new(s.opts.addr.clone());
        let id = <P::Device as Device<P>>::connect(&s.dev, &addr, &s.qp, &p)
            .map_err(|e| verbs("connect", e))?;
        s.cm = Some(id);
        Ok(s)
    }

    /// The session state.
    pub fn state(&self) -> &SessionState {
        &self.state
    }

    /// In full feature phase.
    pub fn is_ready(&self) -> bool {
        self.state == SessionState::Ready
    }

    /// The negotiated parameters.
    pub fn params(&self) -> &SessionParams {
        &self.params
    }

    /// The target agreed to invalidate task STags remotely.
    pub fn remote_invalidation(&self) -> bool {
        self.remote_inv
    }

    /// Task buffers go out as pre-registered arena memory (the provider
    /// has no fast registration): one contiguous buffer per task, no
    /// invalidation.
    pub fn pre_registered(&self) -> bool {
        self.pre_registered
    }

    /// PI goes through integrity MRs (signature offload).
    pub fn pi_offload(&self) -> bool {
        self.offload
    }

    /// The connection's CM id (fault injection in tests).
    pub fn cm_id(&self) -> Option<&P::CmId> {
        self.cm.as_ref()
    }

    /// Counters (keep-alive pings among them).
    pub fn stats(&self) -> InitiatorStats {
        self.stats
    }

    /// Tasks submitted and not yet delivered.
    pub fn outstanding(&self) -> usize {
        self.tasks.iter().filter(|t| t.active).count()
    }

    /// Whether a task could be submitted now (free task, window open).
    pub fn can_submit(&self) -> bool {
        self.is_ready() && !self.free.is_empty() && sn_le(self.cmd_sn, self.max_cmd_sn)
    }

    /// Remember `lun`'s geometry (from READ CAPACITY(16)) for
    /// [`IserInitiator::read`] / [`IserInitiator::write`].
    pub fn set_geometry(&mut self, lun: u16, g: LunGeometry) {
        self.geometry.retain(|(l, _)| *l != lun);
        self.geometry.push((lun, g));
    }

    /// The geometry set for `lun`.
    pub fn geometry(&self, lun: u16) -> Option<LunGeometry> {
        self.geometry
            .iter()
            .find(|(l, _)| *l == lun)
            .map(|(_, g)| *g)
    }

    /// The local lkey of an arena (registered once, control path). In
    /// pre-registered mode a `data` arena is registered for remote access
    /// too (its rkey is the task STag).
    fn lkey_of(
        &mut self,
        arena: &std::sync::Arc<pollux_reactor::mem::DmaArena>,
        data: bool,
    ) -> Result<u32, String> {
        if let Some((_, m)) = self.arena_mrs.iter().find(|(a, _)| *a == arena.id()) {
            return Ok(m.lkey());
        }
        let access = if self.pre_registered && data {
            Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE
        } else {
            Access::LOCAL_WRITE
        };
        let mr = self
            .pd
            .reg_mr(arena, 0, arena.len(), access)
            .map_err(|e| e.to_string())?;
        let k = mr.lkey();
        self.arena_mrs.push((arena.id(), mr));
        Ok(k)
    }

    /// The rkey of an arena already registered by [`Self::lkey_of`].
    fn rkey_of(&self, arena: pollux_reactor::mem::ArenaId) -> Option<u32> {
        self.arena_mrs
            .iter()
            .find(|(a, _)| *a == arena)
            .map(|(_, m)| m.rkey())
    }

    fn ctrl_addr(&self, off: usize) -> u64 {
        (self.ctrl.addr() + off) as u64
    }

    fn post_recvs(&mut self) -> Result<(), pollux_verbs::PostError> {
        for chunk in self.reposts.chunks(16) {
            let mut sges = [Sge::default(); 16];
            let mut wrs = [RecvWr {
                wr_id: WrId(0),
                sg_list: &[],
            }; 16];
            for (k, &i) in chunk.iter().enumerate() {
                sges[k] = Sge {
                    addr: (self.ctrl.addr() + i * RECV_SLOT) as u64,
                    length: RECV_SLOT as u32,
                    lkey: self.ctrl_lkey,
                };
            }
            for (k, w) in wrs.iter_mut().enumerate().take(chunk.len()) {
                *w = RecvWr {
                    wr_id: wr(Kind::Recv, chunk[k]),
                    sg_list: std::slice::from_ref(&sges[k]),
                };
            }
            self.qp.post_recv(&wrs[..chunk.len()])?;
        }
        self.reposts.clear();
        Ok(())
    }

    fn fail(&mut self, e: InitiatorError) {
        if matches!(self.state, SessionState::Failed(_) | SessionState::Closed) {
            return;
        }
        log::debug!("iser initiator: {e}");
        self.state = SessionState::Failed(e);
        if let Some(id) = &self.cm {
            let _ = id.disconnect();
        }
        if self.qp.state() != QpState::Err {
            let _ = self.qp.modify(&QpAttr::to(QpState::Err));
        }
        // The QP is dead: nothing will touch the task buffers any more.
        for i in 0..self.tasks.len() {
            if self.tasks[i].active && !self.done.contains(&(i as u16)) {
                self.done.push_back(i as u16);
            }
        }
    }

    /// Drive the session: CM events, completions, login steps; finished
    /// tasks are handed to `on_done` (never from inside a submit).
    pub fn poll(&mut self, on_done: &mut dyn FnMut(TaskResult)) -> PollStatus {
        self.rounds += 1;
        let mut busy = false;
        let cm_round = !matches!(self.state, SessionState::Ready) || self.rounds % CM_PERIOD == 1;
        if cm_round {
            busy |= self.poll_cm();
        }
        loop {
            let mut wcs = std::mem::take(&mut self.wcs);
            let n = match self.cq.poll(&mut wcs) {
                Ok(n) => n,
                Err(e) => {
                    self.fail(InitiatorError::Lost(format!("CQ: {e}")));
                    0
                }
            };
            for wc in &wcs[..n] {
                self.completion(wc);
            }
            self.wcs = wcs;
            busy |= n > 0;
            if n < WC_BATCH {
                break;
            }
        }
        if !self.reposts.is_empty() && !matches!(self.state, SessionState::Failed(_)) {
            if let Err(e) = self.post_recvs() {
                self.fail(InitiatorError::Verbs(format!("post receives: {e:?}")));
            }
        }
        if cm_round && self.state == SessionState::Ready && !self.opts.nop_interval.is_zero() {
            self.keep_alive();
        }
        let failed = matches!(self.state, SessionState::Failed(_));
        let error = match &self.state {
            SessionState::Failed(e) => Some(e),
            _ => None,
        };
        while let Some(idx) = self.done.pop_front() {
            busy = true;
            let t = &mut self.tasks[usize::from(idx)];
            if !t.active {
                continue;
            }
            t.active = false;
            t.registered &= !failed;
            self.free.push(idx);
            self.stats.completed += 1;
            on_done(TaskResult {
                ctx: t.ctx,
                status: t.status,
                sense: t.sense,
                residual: t.residual,
                pi_error: t.pi_error,
                invalidation: t.invalidation,
                transport_error: failed && !t.rsp,
                error: error.filter(|_| !t.rsp).cloned(),
                bufs: t.bufs.take(),
            });
        }
        self.update_awake();
        PollStatus::from_work(busy)
    }

    /// Whether the session waits for its target: connect, login or logout
    /// in progress, tasks outstanding, a ping unanswered.
    fn waits(&self) -> bool {
        self.free.len() != self.tasks.len()
            || self.ping.is_some()
            || matches!(
                self.state,
                SessionState::Connecting | SessionState::Login | SessionState::LoggingOut
            )
    }

    /// Hold the current reactor awake while the session waits, let it
    /// sleep once it does not (see the module documentation).
    #[inline]
    fn update_awake(&mut self) {
        if self.waits() != self.awake.is_some() {
            if self.awake.is_some() {
                self.awake = None;
            } else {
                self.hold_awake();
            }
        }
    }

    /// Hold the reactor the session runs on awake (the first task
    /// outstanding: now, as the next poll may come after a sleep).
    #[cold]
    pub(super) fn hold_awake(&mut self) {
        self.awake = Reactor::current().map(|r| r.hold_awake());
    }

    fn poll_cm(&mut self) -> bool {
        let Some(id) = &self.cm else {
            return false;
        };
        let ev = match id.get_event() {
            Ok(Some(ev)) => ev,
            Ok(None) => return false,
            Err(e) => {
                self.fail(InitiatorError::Lost(format!("CM: {e}")));
                return true;
            }
        };
        match ev {
            CmEvent::Established { private_data } => {
                match IserCmHdr::parse(private_data.as_bytes()) {
                    Ok(h) => {
                        self.remote_inv = self.opts.remote_invalidate
                            && !self.pre_registered
                            && !h.send_w_inv_not_sup;
                        self.state = SessionState::Login;
                        self.send_login(Stage::Security, Stage::Operational);
                    }
                    Err(e) => self.fail(InitiatorError::Protocol(format!("iSER CM reply: {e}"))),
                }
            }
            CmEvent::Rejected { reason, .. } => self.fail(InitiatorError::Refused(format!(
                "rejected (reason {reason})"
            ))),
            CmEvent::Unreachable | CmEvent::ConnectError => {
                self.fail(InitiatorError::Refused("unreachable".into()))
            }
            CmEvent::Disconnected => {
                if self.state == SessionState::LoggingOut || self.state == SessionState::Closed {
                    self.state = SessionState::Closed;
                } else {
                    self.fail(InitiatorError::Lost("disconnected".into()));
                }
            }
            _ => {}
        }
        true
    }
}

impl<P: Provider> Drop for IserInitiator<P> {
    fn drop(&mut self) {
        if let Some(id) = &self.cm {
            let _ = id.disconnect();
        }
    }
}
