//! [`IserInitiator`]: one iSER connection (= one session) of the
//! initiator, polled: CM connect with the iSER CM header, login
//! (security → operational → full feature), SCSI tasks with per-task
//! memory registration, SendTargets, logout.
// `SubmitError` hands the caller's inline `SgList` back by value: large,
// but boxing it would allocate on the back-pressure path.
#![allow(clippy::result_large_err)]

use std::collections::VecDeque;

use pollux_reactor::mem::{ArenaId, DmaBuf, SgList};
use pollux_reactor::PollStatus;
use pollux_verbs::{
    Access, CmAddr, CmEvent, CmId, CompletionQueue, ConnParam, Device, MemoryRegion,
    ProtectionDomain, Provider, QpAttr, QpCaps, QpInit, QpState, QueuePair, RecvWr, SendOp, SendWr,
    Sge, VerbsError, Wc, WcFlags, WcOpcode, WcStatus, WrId,
};

use super::error::{InitiatorError, SubmitError};
use super::options::{InitiatorOptions, PiEngine, SessionKind};
use super::pi::{self, TUPLE};
use super::scsi::{rw16_cdb, LunGeometry};
use super::task::{DataDir, Invalidation, PiFailure, PiPath, Task, TaskResult};
use crate::pdu::text::{parse_text, push_pair};
use crate::pdu::{
    Bhs, IserCmHdr, IserHeader, LoginFlags, LoginRequest, LogoutReason, LogoutRequest, Lun, NopOut,
    Pdu, ScsiCommand, Stag, Stage, TaskAttr, TextPdu, BHS_LEN, ISER_HDR_LEN, ISER_HEADERS_LEN,
    RESERVED_TAG,
};
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
/// Poll rounds between CM event checks in full feature phase.
const CM_PERIOD: u64 = 64;

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
                    max_send_sge: 2,
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

    /// Counters.
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

    /// Send a control PDU (login, text, NOP-Out, logout).
    fn send_ctrl(&mut self, bhs: &[u8; BHS_LEN], data: &[u8]) -> bool {
        self.post_ctrl(ISER_HEADERS_LEN + data.len(), |b| {
            b[..ISER_HDR_LEN].copy_from_slice(&IserHeader::PLAIN.encode());
            b[ISER_HDR_LEN..ISER_HEADERS_LEN].copy_from_slice(bhs);
            b[ISER_HEADERS_LEN..].copy_from_slice(data);
        })
    }

    /// Send `raw` as one SEND exactly as given (no iSER header added):
    /// fault tests hand the target malformed input with it. `false` when
    /// no control slot is free, `raw` does not fit one, or the post failed
    /// (the session then fails).
    #[cfg(feature = "test-util")]
    pub fn send_raw(&mut self, raw: &[u8]) -> bool {
        self.post_ctrl(raw.len(), |b| b.copy_from_slice(raw))
    }

    /// Post one control SEND of `len` bytes that `fill` writes into a free
    /// control slot.
    fn post_ctrl(&mut self, len: usize, fill: impl FnOnce(&mut [u8])) -> bool {
        let Some(slot) = self.ctrl_free.pop() else {
            return false;
        };
        let depth = self.tasks.len();
        let off = self.nrecv * RECV_SLOT + depth * HDR_SLOT + slot * CTRL_SLOT;
        if len > CTRL_SLOT {
            self.ctrl_free.push(slot);
            return false;
        }
        fill(&mut self.ctrl.as_mut_slice()[off..off + len]);
        let sge = [Sge {
            addr: self.ctrl_addr(off),
            length: len as u32,
            lkey: self.ctrl_lkey,
        }];
        match self
            .qp
            .post_send(&[SendWr::new(wr(Kind::CtrlSend, slot), SendOp::Send, &sge).signaled()])
        {
            Ok(()) => {
                self.sends_in_flight += 1;
                true
            }
            Err(e) => {
                self.ctrl_free.push(slot);
                self.fail(InitiatorError::Verbs(format!("post: {e:?}")));
                false
            }
        }
    }

    fn send_login(&mut self, csg: Stage, nsg: Stage) {
        self.login_text.clear();
        let t = &mut self.login_text;
        if csg == Stage::Security {
            push_pair(t, "InitiatorName", &self.opts.initiator_name);
            let normal = self.opts.session == SessionKind::Normal;
            push_pair(
                t,
                "SessionType",
                if normal { "Normal" } else { "Discovery" },
            );
            if normal {
                push_pair(t, "TargetName", &self.opts.target_name);
            }
            push_pair(t, "AuthMethod", "None");
        } else if csg == Stage::Operational && self.stage != Stage::Operational {
            SessionParams::initiator_offer(t, 8192, 16_776_192, 262_144);
        }
        self.stage = csg;
        let req = LoginRequest {
            flags: LoginFlags {
                transit: true,
                cont: false,
                csg,
                nsg,
            },
            version_max: 0,
            version_min: 0,
            isid: self.opts.isid,
            tsih: self.tsih,
            itt: self.ctrl_itt,
            cid: 0,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
        };
        let bhs = Bhs::LoginReq(req).encode(0, self.login_text.len() as u32);
        let text = std::mem::take(&mut self.login_text);
        if !self.send_ctrl(&bhs, &text) {
            self.fail(InitiatorError::Verbs("no control slot for login".into()));
        }
        self.login_text = text;
    }

    /// Ask the target for its targets (discovery or normal session; Text
    /// `SendTargets=All`). The answer arrives as [`IserInitiator::take_text`].
    ///
    /// # Errors
    /// [`InitiatorError::NotReady`] outside full feature phase or with a
    /// closed window.
    pub fn send_targets(&mut self) -> Result<(), InitiatorError> {
        if !self.is_ready() || !sn_le(self.cmd_sn, self.max_cmd_sn) {
            return Err(InitiatorError::NotReady("full feature phase, open window"));
        }
        let mut d = Vec::new();
        push_pair(&mut d, "SendTargets", "All");
        self.ctrl_itt = self.ctrl_itt.wrapping_add(1);
        let t = TextPdu {
            immediate: false,
            final_: true,
            cont: false,
            lun: Lun::default(),
            itt: self.ctrl_itt,
            ttt: RESERVED_TAG,
            sn: self.cmd_sn,
            exp_sn: self.exp_stat_sn,
            max_cmd_sn: 0,
        };
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        self.text = None;
        if self.send_ctrl(&Bhs::TextReq(t).encode(0, d.len() as u32), &d) {
            Ok(())
        } else {
            Err(InitiatorError::NotReady("control slot"))
        }
    }

    /// The last Text Response as `(key, value)` pairs, once.
    pub fn take_text(&mut self) -> Option<Vec<(String, String)>> {
        let t = self.text.take()?;
        Some(
            parse_text(&t)
                .map(|v| {
                    v.into_iter()
                        .map(|(k, v)| (k.to_owned(), v.to_owned()))
                        .collect()
                })
                .unwrap_or_default(),
        )
    }

    /// Log out (close the session): Logout Request, then disconnect on the
    /// response. [`IserInitiator::state`] becomes `Closed`.
    ///
    /// # Errors
    /// [`InitiatorError::NotReady`] outside full feature phase.
    pub fn logout(&mut self) -> Result<(), InitiatorError> {
        if !self.is_ready() {
            return Err(InitiatorError::NotReady("full feature phase"));
        }
        self.ctrl_itt = self.ctrl_itt.wrapping_add(1);
        let l = LogoutRequest {
            immediate: true,
            reason: LogoutReason::CloseSession,
            itt: self.ctrl_itt,
            cid: 0,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
        };
        if self.send_ctrl(&Bhs::LogoutReq(l).encode(0, 0), &[]) {
            self.state = SessionState::LoggingOut;
            Ok(())
        } else {
            Err(InitiatorError::NotReady("control slot"))
        }
    }

    /// READ(16) of `blocks` blocks at `lba` of `lun` into `bufs` (at least
    /// `blocks × block_size` bytes), with the session's PI policy.
    ///
    /// # Errors
    /// [`SubmitError`], which hands the buffers back.
    pub fn read(
        &mut self,
        lun: u16,
        lba: u64,
        blocks: u32,
        bufs: SgList,
        ctx: u64,
    ) -> Result<(), SubmitError> {
        self.block_io(false, lun, lba, blocks, bufs, ctx)
    }

    /// WRITE(16) of `blocks` blocks at `lba` of `lun` from `bufs`.
    ///
    /// # Errors
    /// [`SubmitError`], which hands the buffers back.
    pub fn write(
        &mut self,
        lun: u16,
        lba: u64,
        blocks: u32,
        bufs: SgList,
        ctx: u64,
    ) -> Result<(), SubmitError> {
        self.block_io(true, lun, lba, blocks, bufs, ctx)
    }

    fn block_io(
        &mut self,
        write: bool,
        lun: u16,
        lba: u64,
        blocks: u32,
        bufs: SgList,
        ctx: u64,
    ) -> Result<(), SubmitError> {
        let Some(g) = self.geometry(lun) else {
            return Err(SubmitError::Invalid("no geometry for the LUN", Some(bufs)));
        };
        let pol = self.opts.pi;
        let wire_pi = g.prot_en
            && if write {
                pol.generates()
            } else {
                pol.verifies()
            };
        let protect = match (wire_pi, write) {
            (false, _) => 0,
            (true, true) => 1,
            (true, false) => {
                if self.opts.target_checks {
                    1
                } else {
                    3
                }
            }
        };
        let cdb = rw16_cdb(write, lba, blocks, protect);
        let dir = if write { DataDir::Write } else { DataDir::Read };
        let pi = if !wire_pi {
            PiPath::None
        } else if self.offload {
            PiPath::Offload
        } else {
            PiPath::Software
        };
        let len = blocks as usize * g.block_size as usize;
        self.submit_inner(lun, &cdb, dir, Some(bufs), len, pi, lba, g.block_size, ctx)
    }

    /// Submit any CDB: `len` bytes of data in `dir` through `bufs`. The
    /// result arrives through [`IserInitiator::poll`].
    ///
    /// # Errors
    /// [`SubmitError`], which hands the buffers back.
    pub fn submit(
        &mut self,
        lun: u16,
        cdb: &[u8],
        dir: DataDir,
        bufs: Option<SgList>,
        len: usize,
        ctx: u64,
    ) -> Result<(), SubmitError> {
        if cdb.len() > 16 {
            return Err(SubmitError::Invalid("CDB over 16 bytes", bufs));
        }
        let mut c = [0u8; 16];
        c[..cdb.len()].copy_from_slice(cdb);
        self.submit_inner(lun, &c, dir, bufs, len, PiPath::None, 0, 512, ctx)
    }

    #[allow(clippy::too_many_arguments)]
    fn submit_inner(
        &mut self,
        lun: u16,
        cdb: &[u8; 16],
        dir: DataDir,
        bufs: Option<SgList>,
        len: usize,
        pi: PiPath,
        lba: u64,
        block: u32,
        ctx: u64,
    ) -> Result<(), SubmitError> {
        if !self.is_ready() {
            return Err(SubmitError::NotReady(bufs));
        }
        let have = bufs.as_ref().map_or(0, |b| b.total_len());
        if (dir != DataDir::None && have < len) || len > self.opts.max_io_bytes as usize {
            return Err(SubmitError::Invalid(
                "buffers shorter than the transfer or over max_io_bytes",
                bufs,
            ));
        }
        if bufs.as_ref().is_some_and(|b| b.len() > MAX_SGES) {
            return Err(SubmitError::Invalid("too many segments", bufs));
        }
        if !sn_le(self.cmd_sn, self.max_cmd_sn) {
            self.stats.busy += 1;
            return Err(SubmitError::Busy(bufs));
        }
        if self.bind_after_sends && dir != DataDir::None && len > 0 && self.sends_in_flight > 0 {
            // Its registration must not run ahead of an unacknowledged SEND.
            self.stats.busy += 1;
            return Err(SubmitError::Busy(bufs));
        }
        let Some(idx) = self.free.pop() else {
            self.stats.busy += 1;
            return Err(SubmitError::Busy(bufs));
        };
        let i = usize::from(idx);
        let blocks = if block > 0 {
            (len / block as usize) as u32
        } else {
            0
        };
        let wire_len = if pi == PiPath::None {
            len
        } else {
            blocks as usize * (block as usize + TUPLE)
        };
        // Software write-generate into the bounce slot.
        if pi == PiPath::Software && dir == DataDir::Write {
            if let (Some(b), Some(src)) = (self.bounce.as_mut(), bufs.as_ref()) {
                let off = i * self.bounce_slot;
                pi::generate(
                    src,
                    &mut b.as_mut_slice()[off..off + wire_len],
                    lba,
                    block,
                    blocks,
                );
            }
        }
        // Page list: the caller's buffers, or the bounce slot.
        let mut pages = [Sge::default(); MAX_SGES];
        let mut npages = 0;
        let mut first_arena: Option<ArenaId> = None;
        if pi == PiPath::Software {
            let Some(b) = self.bounce.as_ref() else {
                self.free.push(idx);
                return Err(SubmitError::Invalid("no bounce buffers", bufs));
            };
            let (addr, arena) = (b.addr() + i * self.bounce_slot, b.arena().clone());
            let lkey = match self.lkey_of(&arena, true) {
                Ok(k) => k,
                Err(e) => {
                    self.free.push(idx);
                    return Err(SubmitError::Verbs(e, bufs));
                }
            };
            pages[0] = Sge {
                addr: addr as u64,
                length: wire_len as u32,
                lkey,
            };
            npages = 1;
            first_arena = Some(arena.id());
        } else if let Some(sg) = bufs.as_ref() {
            let mut left = len;
            for b in sg.iter() {
                if left == 0 {
                    break;
                }
                let arena = b.arena().clone();
                let lkey = match self.lkey_of(&arena, true) {
                    Ok(k) => k,
                    Err(e) => {
                        self.free.push(idx);
                        return Err(SubmitError::Verbs(e, bufs));
                    }
                };
                let take = b.len().min(left);
                first_arena.get_or_insert(arena.id());
                pages[npages] = Sge {
                    addr: b.addr() as u64,
                    length: take as u32,
                    lkey,
                };
                npages += 1;
                left -= take;
            }
        }
        // Immediate data: plain writes only, from the first buffer.
        let imm = if dir == DataDir::Write
            && pi == PiPath::None
            && self.opts.immediate_data
            && self.params.immediate_data
        {
            len.min(pages[0].length as usize)
                .min(self.params.first_burst as usize)
                .min(self.params.initiator_send_dsl.min(8192) as usize)
        } else {
            0
        };
        let remote = dir == DataDir::Read || (dir == DataDir::Write && imm < len);
        // Pre-registered memory: the arena MR's rkey covers the transfer
        // when it is one contiguous run in one arena.
        let pre_key = if self.pre_registered && remote && len > 0 {
            let contiguous = (1..npages).all(|k| {
                pages[k].lkey == pages[0].lkey
                    && pages[k].addr == pages[k - 1].addr + u64::from(pages[k - 1].length)
            });
            match first_arena.and_then(|a| self.rkey_of(a)) {
                Some(r) if contiguous => Some(r),
                _ => {
                    self.free.push(idx);
                    return Err(SubmitError::Invalid(
                        "pre-registered memory: one contiguous buffer per task",
                        bufs,
                    ));
                }
            }
        } else {
            None
        };
        let t = &mut self.tasks[i];
        t.gen = t.gen.wrapping_add(1) & 0x7FFF;
        t.itt = u32::from(t.gen) << 16 | u32::from(idx);
        t.active = true;
        t.ctx = ctx;
        t.send_done = false;
        t.rsp = false;
        t.inv_pending = false;
        t.dir = dir;
        t.pi = pi;
        t.lba = lba;
        t.blocks = blocks;
        t.block_size = block;
        t.status = 0;
        t.sense = None;
        t.residual = 0;
        t.pi_error = None;
        t.invalidation = Invalidation::None;
        let mut wrs = [SendWr::new(WrId(0), SendOp::Send, &[]); 2];
        let mut n = 0;
        let iova = pages[0].addr;
        let mut stag = None;
        if let Some(rkey) = pre_key {
            t.key = rkey;
            t.registered = false;
            stag = Some(Stag {
                stag: rkey,
                va: iova,
            });
        } else if remote && len > 0 {
            t.key = match (pi, t.imr.as_mut()) {
                (PiPath::Offload, Some((_, k))) => {
                    *k = next_key(*k);
                    *k
                }
                _ => {
                    t.fr_key = next_key(t.fr_key);
                    t.fr_key
                }
            };
            let access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
            let op = if pi == PiPath::Offload {
                SendOp::RegMrIntegrity {
                    key: t.key,
                    iova,
                    access,
                    sig: pi::sig_attrs(dir == DataDir::Write, lba, block),
                    prot: &[],
                }
            } else {
                SendOp::RegMr {
                    key: t.key,
                    iova,
                    access,
                }
            };
            wrs[0] = SendWr::new(wr(Kind::Reg, i), op, &pages[..npages]);
            n = 1;
            t.registered = true;
            stag = Some(Stag {
                stag: t.key,
                va: iova,
            });
        }
        let hdr = match (dir, stag) {
            (DataDir::Read, Some(s)) => IserHeader::Control {
                write: None,
                read: Some(s),
            },
            (DataDir::Write, Some(s)) => IserHeader::Control {
                write: Some(Stag {
                    stag: s.stag,
                    va: s.va + imm as u64,
                }),
                read: None,
            },
            _ => IserHeader::PLAIN,
        };
        let cmd = ScsiCommand {
            immediate: false,
            final_: true,
            read: dir == DataDir::Read,
            write: dir == DataDir::Write,
            attr: TaskAttr::Simple,
            lun: Lun::from_index(lun),
            itt: t.itt,
            edtl: if dir == DataDir::None {
                0
            } else {
                wire_len as u32
            },
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            cdb: *cdb,
        };
        let off = self.nrecv * RECV_SLOT + i * HDR_SLOT;
        {
            let h = &mut self.ctrl.as_mut_slice()[off..off + ISER_HEADERS_LEN];
            h[..ISER_HDR_LEN].copy_from_slice(&hdr.encode());
            h[ISER_HDR_LEN..].copy_from_slice(&Bhs::ScsiCmd(cmd).encode(0, imm as u32));
        }
        let sges = [
            Sge {
                addr: self.ctrl_addr(off),
                length: ISER_HEADERS_LEN as u32,
                lkey: self.ctrl_lkey,
            },
            Sge {
                addr: pages[0].addr,
                length: imm as u32,
                lkey: pages[0].lkey,
            },
        ];
        let nsge = if imm > 0 { 2 } else { 1 };
        wrs[n] = SendWr::new(wr(Kind::TaskSend, i), SendOp::Send, &sges[..nsge]).signaled();
        n += 1;
        self.tasks[i].bufs = bufs;
        if let Err(e) = self.qp.post_send(&wrs[..n]) {
            let t = &mut self.tasks[i];
            t.active = false;
            t.registered = false;
            let b = t.bufs.take();
            self.free.push(idx);
            self.fail(InitiatorError::Verbs(format!("post: {e:?}")));
            return Err(SubmitError::Verbs("post failed".into(), b));
        }
        self.sends_in_flight += 1;
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        self.stats.submitted += 1;
        Ok(())
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
        let failed = matches!(self.state, SessionState::Failed(_));
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
                bufs: t.bufs.take(),
            });
        }
        PollStatus::from_work(busy)
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

    fn completion(&mut self, wc: &Wc) {
        let (kind, i) = unwr(wc.wr_id);
        let ok = wc.status == WcStatus::Success;
        match kind {
            Some(Kind::Recv) => {
                if ok && wc.opcode == WcOpcode::Recv {
                    self.on_recv(wc, i);
                }
                if i < self.nrecv
                    && !matches!(self.state, SessionState::Failed(_) | SessionState::Closed)
                {
                    self.reposts.push(i);
                }
            }
            Some(Kind::CtrlSend) => {
                self.sends_in_flight = self.sends_in_flight.saturating_sub(1);
                self.ctrl_free.push(i);
            }
            Some(Kind::TaskSend) => {
                self.sends_in_flight = self.sends_in_flight.saturating_sub(1);
                if let Some(t) = self.tasks.get_mut(i) {
                    t.send_done = true;
                }
                self.check_done(i);
            }
            Some(Kind::Inv) => {
                if let Some(t) = self.tasks.get_mut(i) {
                    t.inv_pending = false;
                    t.registered = false;
                }
                self.check_done(i);
            }
            Some(Kind::Reg) | None => {}
        }
        if !ok && wc.status != WcStatus::WrFlushErr {
            self.fail(InitiatorError::Lost(format!(
                "work request failed: {:?}",
                wc.status
            )));
        } else if !ok && self.state == SessionState::Ready {
            self.fail(InitiatorError::Lost("flushed".into()));
        }
    }

    fn check_done(&mut self, i: usize) {
        if self.tasks.get(i).is_some_and(|t| t.finished()) {
            self.done.push_back(i as u16);
        }
    }

    fn update_sn(&mut self, stat_sn: u32, exp_cmd_sn: u32, max_cmd_sn: u32, advances: bool) {
        if advances && !sn_lt(stat_sn, self.exp_stat_sn) {
            self.exp_stat_sn = stat_sn.wrapping_add(1);
        }
        // A valid window (MaxCmdSN ≥ ExpCmdSN − 1) that moves forward.
        if !sn_lt(max_cmd_sn, exp_cmd_sn.wrapping_sub(1)) {
            if sn_lt(self.exp_cmd_sn, exp_cmd_sn) {
                self.exp_cmd_sn = exp_cmd_sn;
            }
            if sn_lt(self.max_cmd_sn, max_cmd_sn) {
                self.max_cmd_sn = max_cmd_sn;
            }
        }
    }

    fn on_recv(&mut self, wc: &Wc, slot: usize) {
        let off = slot * RECV_SLOT;
        let len = (wc.byte_len as usize).min(RECV_SLOT);
        let buf = &self.ctrl.as_slice()[off..off + len];
        if IserHeader::parse(buf).is_err() {
            return self.fail(InitiatorError::Protocol("bad iSER header".into()));
        }
        let pdu = match Pdu::parse(&buf[ISER_HDR_LEN..]) {
            Ok(p) => p,
            Err(e) => return self.fail(InitiatorError::Protocol(format!("bad PDU: {e}"))),
        };
        let inv = wc.flags.contains(WcFlags::WITH_INV).then_some(wc.imm);
        match pdu.bhs {
            Bhs::ScsiRsp(r) => {
                let sense = if pdu.data.len() >= 2 {
                    let n = usize::from(u16::from_be_bytes([pdu.data[0], pdu.data[1]]));
                    pdu.data.get(2..2 + n).and_then(Sense::parse)
                } else {
                    None
                };
                self.update_sn(r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn, true);
                self.on_response(r.itt, r.status, r.residual, sense, inv);
            }
            Bhs::LoginRsp(r) => {
                let data = pdu.data.to_vec();
                self.on_login_rsp(&r, &data);
            }
            Bhs::TextRsp(t) => {
                let d = pdu.data.to_vec();
                self.update_sn(t.sn, t.exp_sn, t.max_cmd_sn, true);
                self.text = Some(d);
            }
            Bhs::LogoutRsp(l) => {
                self.update_sn(l.stat_sn, l.exp_cmd_sn, l.max_cmd_sn, true);
                self.state = SessionState::Closed;
                if let Some(id) = &self.cm {
                    let _ = id.disconnect();
                }
            }
            Bhs::NopIn(n) => {
                let ping = n.ttt != RESERVED_TAG;
                self.update_sn(n.stat_sn, n.exp_cmd_sn, n.max_cmd_sn, !ping);
                if ping {
                    let o = NopOut {
                        immediate: true,
                        lun: n.lun,
                        itt: RESERVED_TAG,
                        ttt: n.ttt,
                        cmd_sn: self.cmd_sn,
                        exp_stat_sn: self.exp_stat_sn,
                    };
                    let _ = self.send_ctrl(&Bhs::NopOut(o).encode(0, 0), &[]);
                }
            }
            Bhs::Reject(r) => {
                self.update_sn(r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn, true);
                log::warn!(
                    "iser initiator: target rejected a PDU (reason {:#x})",
                    r.reason
                );
            }
            Bhs::Async(a) => {
                self.update_sn(a.stat_sn, a.exp_cmd_sn, a.max_cmd_sn, true);
            }
            _ => self.fail(InitiatorError::Protocol("unexpected PDU".into())),
        }
    }

    fn on_login_rsp(&mut self, r: &crate::pdu::LoginResponse, data: &[u8]) {
        if self.state != SessionState::Login {
            return self.fail(InitiatorError::Protocol(
                "login response outside login".into(),
            ));
        }
        if r.status_class != 0 {
            return self.fail(InitiatorError::Login {
                class: r.status_class,
                detail: r.status_detail,
            });
        }
        self.exp_stat_sn = r.stat_sn.wrapping_add(1);
        self.exp_cmd_sn = r.exp_cmd_sn;
        self.max_cmd_sn = r.max_cmd_sn;
        let pairs = match parse_text(data) {
            Ok(p) => p,
            Err(e) => return self.fail(InitiatorError::Protocol(format!("login text: {e}"))),
        };
        for (k, v) in pairs {
            if matches!(k, "TargetPortalGroupTag" | "TargetAlias" | "TargetAddress") {
                continue;
            }
            if k == "AuthMethod" && v != "None" {
                return self.fail(InitiatorError::Protocol(format!("AuthMethod={v}")));
            }
            if let Err(e) = self.params.apply_answer(k, v) {
                return self.fail(InitiatorError::Protocol(format!("login key {}", e.0)));
            }
        }
        if !r.flags.transit {
            // The target has more to say: continue in the same stage.
            let nsg = if self.stage == Stage::Security {
                Stage::Operational
            } else {
                Stage::FullFeature
            };
            return self.send_login(self.stage, nsg);
        }
        match r.flags.nsg {
            Stage::Operational => self.send_login(Stage::Operational, Stage::FullFeature),
            Stage::FullFeature => {
                self.tsih = r.tsih;
                self.state = SessionState::Ready;
            }
            Stage::Security => self.fail(InitiatorError::Protocol("login went back".into())),
        }
    }

    fn on_response(
        &mut self,
        itt: u32,
        status: u8,
        residual: u32,
        sense: Option<Sense>,
        inv: Option<u32>,
    ) {
        let i = (itt & 0xFFFF) as usize;
        let remote_inv = self.remote_inv;
        let Some(t) = self
            .tasks
            .get_mut(i)
            .filter(|t| t.active && t.itt == itt && !t.rsp)
        else {
            return self.fail(InitiatorError::Protocol(format!(
                "response for unknown ITT {itt:#x}"
            )));
        };
        t.rsp = true;
        t.status = status;
        t.sense = sense;
        t.residual = residual;
        if let Some(k) = inv {
            if !remote_inv || !t.registered || k != t.key {
                return self.fail(InitiatorError::Protocol(format!(
                    "unexpected remote invalidation of {k:#x}"
                )));
            }
            t.registered = false;
            t.invalidation = Invalidation::Remote;
            self.stats.remote_invalidations += 1;
        }
        // PI checks (after the data moved, before the buffers go back).
        let mut fail: Option<PiFailure> = None;
        match t.pi {
            PiPath::Offload => {
                if let Some(Ok(Some(e))) = t.imr.as_ref().map(|(m, _)| m.check_sig_status()) {
                    let wb = u64::from(t.block_size) + TUPLE as u64;
                    fail = Some(PiFailure {
                        kind: e.kind,
                        lba: t.lba + e.offset / wb,
                        expected: e.expected,
                        actual: e.actual,
                    });
                }
            }
            PiPath::Software if t.dir == DataDir::Read && status == sense::GOOD => {
                if let (Some(b), Some(sg)) = (self.bounce.as_ref(), t.bufs.as_mut()) {
                    let off = i * self.bounce_slot;
                    let wl = t.blocks as usize * (t.block_size as usize + TUPLE);
                    fail = pi::verify_strip(
                        &b.as_slice()[off..off + wl],
                        sg,
                        t.lba,
                        t.block_size,
                        t.blocks,
                    );
                }
            }
            _ => {}
        }
        if let Some(f) = fail {
            self.stats.pi_errors += 1;
            t.pi_error = Some(f);
            if t.status == sense::GOOD {
                t.status = sense::CHECK_CONDITION;
                t.sense = Some(pi::pi_sense(&f));
            }
        }
        if t.registered {
            t.inv_pending = true;
            t.invalidation = Invalidation::Local;
            self.stats.local_invalidations += 1;
            let w = SendWr::new(wr(Kind::Inv, i), SendOp::LocalInv { key: t.key }, &[]).signaled();
            if let Err(e) = self.qp.post_send(&[w]) {
                return self.fail(InitiatorError::Verbs(format!("LOCAL_INV: {e:?}")));
            }
        }
        self.check_done(i);
    }
}

impl<P: Provider> Drop for IserInitiator<P> {
    fn drop(&mut self) {
        if let Some(id) = &self.cm {
            let _ = id.disconnect();
        }
    }
}
