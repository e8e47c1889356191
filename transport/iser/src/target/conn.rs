//! One iSCSI connection (= one session: MaxConnections is 1) in the target
//! core: login, full feature phase, the CmdSN window, SCSI tasks on bdev
//! channels, T10 PI (generated, verified and reported by the bdev layer),
//! NOP, Text (SendTargets), TMF and Logout. `!Send`,
//! lives on one reactor; no allocation per command (task slots and queues
//! are preallocated at login).
//!
//! Task buffers come per command from this core's cache of the target's
//! pool ([`CoreCtx`], obtained once per connection) and go back to it when
//! the task is freed: no shared-pool atomic per I/O. With no buffer free a
//! command without unsolicited data waits (FIFO, retried at each poll); one
//! whose unsolicited data has nowhere to go is answered TASK SET FULL.
//!
//! Sessions: at full feature phase the session enters the target's table;
//! a later leading login of the same I_T nexus retires it (session
//! reinstatement) and this connection closes at its next poll.
//! MaxOutstandingUnexpectedPDUs, when the target declared it, bounds the
//! immediate PDUs outstanding: one more is rejected (reason 0x06).
//! FirstBurstLength bounds a command's unsolicited data: more immediate
//! data is rejected (reason 0x09), more unsolicited Data-Out fails the
//! task (ABORTED COMMAND 0C/0D). With ImmediateData=No a command carrying
//! data is rejected (reason 0x04); with InitialR2T=Yes unsolicited
//! Data-Out fails the task (ABORTED COMMAND 0C/0C), as LIO answers both.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;

use pollux_bdev::{CompletedIo, IoChannel, IoCompletion, IoStatus, SgList};
use pollux_reactor::mem::DmaBuf;
use pollux_reactor::{PollStatus, Reactor};

use super::config::{IscsiTarget, PortalLogin};
use super::core_ctx::CoreCtx;
use super::ops::{ConnOps, Transfer};
use super::sessions::Nexus;
use crate::pdu::text::{parse_text, push_pair};
use crate::pdu::{
    logout_response, reject_reason, tmf_response, Bhs, IserHeader, LogoutReason, LogoutRequest,
    LogoutResponse, Lun, NopIn, NopOut, Pdu, Reject, ScsiCommand, ScsiResponse, Stag, TextPdu,
    TmfFunction, TmfRequest, TmfResponse, BHS_LEN, RESERVED_TAG,
};
use crate::scsi::commands::report_luns::report_luns;
use crate::scsi::disk::{Action, BlockIo, BlockOp, Disk, DiskInfo, PiMode};
use crate::scsi::reservation::ItNexus;
use crate::scsi::sense::{self, Sense};
use crate::scsi::{cdb::op, pi};
use crate::session::{
    sn_le, sn_lt, CmdSnCheck, CmdWindow, LoginOutcome, LoginStep, SessionType, TargetLogin,
};

/// Per-connection facts from the transport.
#[derive(Debug, Clone, Copy)]
pub struct ConnParams {
    /// The portal group the connection came in on.
    pub portal_tag: u16,
    /// The initiator accepts SEND_WITH_INVALIDATE (iSER CM flag clear).
    pub send_with_inv: bool,
    /// When a silent initiator is pinged and when it is given up.
    pub nop: NopPing,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TaskState {
    Free,
    /// Waiting for a task buffer from the core's cache.
    AwaitBuf,
    /// Waiting for unsolicited Data-Out PDUs.
    AwaitDataOut,
    /// RDMA READ of solicited data in flight.
    Reading,
    /// RDMA WRITE of Data-In in flight: the task buffer is the source
    /// until it completes, so the response (and the task's reuse) waits.
    Writing,
    /// A COMPARE AND WRITE waiting for its LU's gate (another one runs).
    AwaitGate,
    /// At the bdev.
    Bdev,
    /// Data and response to send (retried on back-pressure).
    Respond,
}

struct Task {
    state: TaskState,
    itt: u32,
    lun: Option<usize>,
    /// The CDB: 16 bytes from the BHS, and bytes 16.. of a longer one
    /// (READ(32)/WRITE(32)) from the extended CDB AHS.
    cdb: [u8; 32],
    /// Bytes of `cdb` the initiator sent (16 plus the extended CDB's).
    cdb_len: usize,
    edtl: u32,
    read: Option<Stag>,
    write: Option<Stag>,
    buf: Option<DmaBuf>,
    io: Option<BlockIo>,
    /// Data-out bytes expected and received.
    need: usize,
    got: usize,
    /// Waiting for a parameter list (UNMAP / WRITE SAME) rather than blocks.
    param: bool,
    /// Data-in bytes ready in `buf` and not yet sent (after the send:
    /// those that EDTL had no room for).
    data_in: usize,
    /// Data-in bytes written to the initiator.
    sent: usize,
    result: Result<(), Sense>,
    /// The command holds a CmdSN window slot.
    slot: bool,
    /// The command's R and W bits and its F bit.
    rflag: bool,
    wflag: bool,
    final_: bool,
    /// An immediate command (counts as an unexpected PDU until answered).
    immediate: bool,
    /// Answer TASK SET FULL (no buffer for its unsolicited data).
    full: bool,
    /// Step of a multi-step medium command (verify, compare, WRITE SAME).
    step: u8,
    /// Blocks done of a WRITE SAME with a pattern.
    done: u64,
    /// The last bdev operation: (write, LBA, blocks).
    last: (bool, u64, usize),
    /// Holds its LU's COMPARE AND WRITE gate.
    caw: bool,
}

impl Task {
    fn new() -> Task {
        Task {
            state: TaskState::Free,
            itt: RESERVED_TAG,
            lun: None,
            cdb: [0; 32],
            cdb_len: 16,
            edtl: 0,
            read: None,
            write: None,
            buf: None,
            io: None,
            need: 0,
            got: 0,
            param: false,
            data_in: 0,
            sent: 0,
            result: Ok(()),
            slot: false,
            rflag: false,
            wflag: false,
            final_: false,
            immediate: false,
            full: false,
            step: 0,
            done: 0,
            last: (false, 0, 0),
            caw: false,
        }
    }
}

struct LunState {
    id: u16,
    disk: Disk,
    ch: IoChannel,
}

/// Collects bdev completions for the connection's next poll.
struct Sink {
    done: RefCell<VecDeque<(u16, IoStatus, Option<DmaBuf>)>>,
}

impl IoCompletion for Sink {
    fn complete(&self, mut io: CompletedIo<'_>) {
        let buf = io.bufs_mut().pop();
        self.done
            .borrow_mut()
            .push_back((io.ctx() as u16, io.status(), buf));
    }
}

enum Phase {
    Login(Box<TargetLogin>),
    Full,
    Closed,
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnStats {
    /// SCSI commands accepted.
    pub commands: u64,
    /// Commands answered with CHECK CONDITION.
    pub check_conditions: u64,
    /// PDUs rejected or dropped.
    pub rejected: u64,
    /// PI errors detected by the target.
    pub pi_errors: u64,
    /// Commands that waited for a task buffer.
    pub buffer_waits: u64,
    /// Commands answered TASK SET FULL (no buffer for their unsolicited
    /// data).
    pub task_set_full: u64,
    /// Immediate PDUs rejected beyond MaxOutstandingUnexpectedPDUs.
    pub unexpected_rejected: u64,
    /// NOP-In pings sent to a silent initiator.
    pub nop_pings: u64,
}

/// The core of one connection.
pub struct Connection {
    target: Arc<IscsiTarget>,
    env: PortalLogin,
    params: ConnParams,
    reactor: Reactor,
    phase: Phase,
    outcome: Option<Box<LoginOutcome>>,
    stat_sn: u32,
    window: CmdWindow,
    tasks: Vec<Task>,
    free: Vec<u16>,
    retry: VecDeque<u16>,
    luns: Vec<LunState>,
    sink: Rc<Sink>,
    cb: Rc<dyn IoCompletion>,
    text_out: Vec<u8>,
    /// Bytes of a Text answer in `text_out` already sent.
    text_sent: usize,
    /// ITT of a Text answer with more to send (reserved: none).
    text_itt: u32,
    /// The Target Transfer Tag that asks for the rest of that answer.
    text_ttt: u32,
    stats: ConnStats,
    /// This core's task-buffer cache and retired-session list.
    core: Rc<CoreCtx>,
    /// Tasks waiting for a buffer, oldest first.
    buf_wait: VecDeque<u16>,
    /// TSIH of this connection's session once in the target's table.
    tsih: Option<u16>,
    /// Immediate PDUs outstanding (answered ones leave at once; immediate
    /// SCSI commands stay until their response).
    unexpected: u32,
    /// The keep-alive ping.
    nop: NopState,
}

/// Bytes 16..32 of a CDB longer than the BHS holds, from an extended CDB
/// AHS, and how many of them came (zeroes and 0 without one; a longer one
/// is cut to 32 bytes, which is all the SCSI core decodes). The AHS area
/// was validated with the PDU.
fn extended_cdb(ahs: &[u8]) -> ([u8; 16], usize) {
    let mut ext = [0u8; 16];
    let mut len = 0;
    let _ = crate::pdu::ahs::parse_ahs(ahs, |a| {
        if let crate::pdu::ahs::Ahs::ExtendedCdb(b) = a {
            len = b.len().min(16);
            ext[..len].copy_from_slice(&b[..len]);
        }
    });
    (ext, len)
}
fn lun_slot(luns: &[LunState], lun: &Lun) -> Option<usize> {
    let id = lun.index()?;
    luns.iter().position(|l| l.id == id)
}

impl Connection {
    /// A new connection in the login phase (control path).
    pub fn new(target: &Arc<IscsiTarget>, reactor: &Reactor, params: ConnParams) -> Connection {
        let sink = Rc::new(Sink {
            done: RefCell::new(VecDeque::new()),
        });
        let cb: Rc<dyn IoCompletion> = sink.clone();
        let core = match reactor.channel(target) {
            Ok(c) => c,
            Err(never) => match never {},
        };
        Connection {
            target: Arc::clone(target),
            env: target.login_env(params.portal_tag),
            params,
            reactor: reactor.clone(),
            phase: Phase::Login(Box::new(TargetLogin::new(1))),
            outcome: None,
            stat_sn: 1,
            window: CmdWindow::new(0, 1),
            tasks: Vec::new(),
            free: Vec::new(),
            retry: VecDeque::new(),
            luns: Vec::new(),
            sink,
            cb,
            text_out: Vec::with_capacity(8192),
            text_sent: 0,
            text_itt: RESERVED_TAG,
            text_ttt: 0,
            stats: ConnStats::default(),
            core,
            buf_wait: VecDeque::new(),
            tsih: None,
            unexpected: 0,
            nop: NopState::new(params.nop, reactor.now_ns()),
        }
    }

    /// This core's target context (its task-buffer cache).
    pub fn core_ctx(&self) -> &CoreCtx {
        &self.core
    }

    /// The TSIH of this connection's session, once in full feature phase.
    pub fn tsih(&self) -> Option<u16> {
        self.tsih
    }

    /// Counters.
    pub fn stats(&self) -> ConnStats {
        self.stats
    }

    /// Whether the connection reached full feature phase.
    pub fn is_full_feature(&self) -> bool {
        matches!(self.phase, Phase::Full)
    }

    /// Whether the connection is closed.
    pub fn is_closed(&self) -> bool {
        matches!(self.phase, Phase::Closed)
    }

    /// Tasks holding buffers or I/O.
    pub fn tasks_in_flight(&self) -> usize {
        self.tasks
            .iter()
            .filter(|t| t.state != TaskState::Free)
            .count()
    }

    fn next_stat_sn(&mut self) -> u32 {
        let s = self.stat_sn;
        self.stat_sn = self.stat_sn.wrapping_add(1);
        s
    }

    fn close(&mut self, ops: &mut dyn ConnOps) {
        if !matches!(self.phase, Phase::Closed) {
            self.phase = Phase::Closed;
            ops.close();
        }
    }

    /// Close now, without waiting for queued sends (the initiator went
    /// silent: they may never complete).
    fn abort(&mut self, ops: &mut dyn ConnOps) {
        if !matches!(self.phase, Phase::Closed) {
            self.phase = Phase::Closed;
            ops.abort();
        }
    }

    fn reject(&mut self, raw: &[u8; BHS_LEN], reason: u8, ops: &mut dyn ConnOps) {
        self.stats.rejected += 1;
        let r = Reject {
            reason,
            stat_sn: self.next_stat_sn(),
            exp_cmd_sn: self.window.exp_cmd_sn(),
            max_cmd_sn: self.window.max_cmd_sn(),
            data_sn: 0,
        };
        if !ops.send_pdu(&Bhs::Reject(r).encode(0, BHS_LEN as u32), raw, None) {
            self.close(ops);
        }
    }

    /// Handle one received PDU (`buf` = BHS + AHS + data, after the iSER
    /// header `hdr`). Returns `false` when the connection closed.
    pub fn on_pdu(&mut self, hdr: &IserHeader, buf: &[u8], ops: &mut dyn ConnOps) -> bool {
        if matches!(self.phase, Phase::Closed) {
            return false;
        }
        // Any PDU is a sign of life (answers a ping, restarts the silence).
        self.nop.touch(self.reactor.now_ns());
        let (write, read) = match *hdr {
            IserHeader::Control { write, read } => (write, read),
            // Hello/HelloReply: not used on IB/RoCE; ignored.
            _ => return true,
        };
        let pdu = match Pdu::parse(buf) {
            Ok(p) => p,
            Err(_) => {
                match buf
                    .get(..BHS_LEN)
                    .and_then(|s| <&[u8; BHS_LEN]>::try_from(s).ok())
                {
                    Some(raw) if self.is_full_feature() => {
                        self.reject(raw, reject_reason::INVALID_PDU_FIELD, ops)
                    }
                    _ => self.close(ops),
                }
                return !self.is_closed();
            }
        };
        if let Phase::Login(_) = self.phase {
            self.on_login_pdu(&pdu, ops);
            return !self.is_closed();
        }
        if self.over_unexpected(&pdu.bhs) {
            self.stats.unexpected_rejected += 1;
            self.reject(pdu.raw, reject_reason::IMMEDIATE_REJECTED, ops);
            return !self.is_closed();
        }
        match pdu.bhs {
            Bhs::ScsiCmd(cmd) => {
                let ext = extended_cdb(pdu.ahs);
                self.on_command(&cmd, ext, pdu.data, (write, read), ops)
            }
            Bhs::DataOut(d) => self.on_data_out(&d, pdu.data, ops),
            Bhs::NopOut(n) => self.on_nop(&n, pdu.data, ops),
            Bhs::TextReq(t) => self.on_text(&t, pdu.data, ops),
            Bhs::TmfReq(t) => self.on_tmf(&t, ops),
            Bhs::LogoutReq(l) => self.on_logout(&l, ops),
            _ => self.reject(pdu.raw, reject_reason::PROTOCOL_ERROR, ops),
        }
        !self.is_closed()
    }

    /// The negotiated FirstBurstLength: the most unsolicited data
    /// (immediate and unsolicited Data-Out) one command may carry.
    fn first_burst(&self) -> usize {
        self.outcome
            .as_ref()
            .map_or(0, |o| o.params.first_burst as usize)
    }

    /// The negotiated ImmediateData: whether a SCSI Command may carry
    /// unsolicited data in its own data segment.
    fn immediate_data(&self) -> bool {
        self.outcome
            .as_ref()
            .is_some_and(|o| o.params.immediate_data)
    }

    /// The negotiated InitialR2T: when set, no unsolicited Data-Out may
    /// follow a command (only immediate data is unsolicited).
    fn initial_r2t(&self) -> bool {
        self.outcome.as_ref().map_or(true, |o| o.params.initial_r2t)
    }

    /// Whether `bhs` is an unexpected (immediate) PDU one beyond the
    /// MaxOutstandingUnexpectedPDUs the target declared.
    fn over_unexpected(&self, bhs: &Bhs) -> bool {
        let limit = self
            .outcome
            .as_ref()
            .map_or(0, |o| o.params.target_unexpected_pdus);
        if limit == 0 {
            return false;
        }
        let immediate = match bhs {
            Bhs::ScsiCmd(c) => c.immediate,
            // A NOP-Out answering our ping (ITT reserved) is expected.
            Bhs::NopOut(n) => n.immediate && n.itt != RESERVED_TAG,
            Bhs::TmfReq(t) => t.immediate,
            Bhs::TextReq(t) => t.immediate,
            Bhs::LogoutReq(l) => l.immediate,
            _ => false,
        };
        immediate && self.unexpected >= limit
    }

    /// Most data this target sends in one PDU: what the initiator can
    /// receive (InitiatorRecvDataSegmentLength), at most 8 KiB.
    fn send_limit(&self) -> usize {
        self.outcome
            .as_ref()
            .map_or(8192, |o| o.params.target_send_dsl as usize)
            .min(8192)
    }

    /// Whether this is a discovery session.
    fn is_discovery(&self) -> bool {
        self.outcome
            .as_ref()
            .is_some_and(|o| o.session_type == SessionType::Discovery)
    }

    fn on_login_pdu(&mut self, pdu: &Pdu<'_>, ops: &mut dyn ConnOps) {
        let Bhs::LoginReq(req) = pdu.bhs else {
            self.close(ops);
            return;
        };
        let Phase::Login(login) = &mut self.phase else {
            return;
        };
        let (rsp, step) = login.on_request(&req, pdu.data, &self.env, &mut self.text_out);
        let bhs = Bhs::LoginRsp(rsp).encode(0, self.text_out.len() as u32);
        let sent = ops.send_pdu(&bhs, &self.text_out, None);
        match step {
            LoginStep::Continue if sent => {}
            LoginStep::Done(o) if sent => self.enter_full_feature(o),
            _ => self.close(ops),
        }
    }

    fn enter_full_feature(&mut self, o: Box<LoginOutcome>) {
        let depth = o.info.limits.queue_depth.max(1) as usize;
        self.stat_sn = o.stat_sn;
        self.window = CmdWindow::new(o.exp_cmd_sn, depth as u32);
        // Task slots with buffers: control path.
        self.tasks = (0..depth).map(|_| Task::new()).collect();
        self.free = (0..depth as u16).rev().collect();
        self.retry = VecDeque::with_capacity(depth);
        self.buf_wait = VecDeque::with_capacity(depth);
        self.sink.done.borrow_mut().reserve(depth);
        // Into the target's session table (control path); a live session of
        // the same I_T nexus is reinstated by this one.
        let nexus = Nexus {
            initiator: o.initiator_name.clone(),
            isid: o.isid,
            target: o.target_name.clone(),
            tpgt: o.info.tpgt,
        };
        // A stale retirement of an earlier session with this TSIH (one
        // that ended before the message came) must not hit this one.
        self.core.take_doomed(o.tsih);
        self.target.start_session(nexus, o.tsih, &self.reactor);
        self.tsih = Some(o.tsih);
        if o.session_type == SessionType::Normal {
            let node = o.target_name.as_deref().and_then(|n| self.target.node(n));
            for (id, bdev) in node.map(|n| n.luns.clone()).unwrap_or_default() {
                let desc = match bdev.open(true).or_else(|_| bdev.open(false)) {
                    Ok(d) => d,
                    Err(_) => continue,
                };
                let writable = desc.is_writable();
                let Ok(ch) = desc.channel(&self.reactor) else {
                    continue;
                };
                let unmap = bdev.supports(pollux_bdev::IoType::Unmap);
                let info = DiskInfo::from_bdev(
                    bdev.info(),
                    writable,
                    unmap,
                    self.target.options().max_io_bytes,
                );
                let nexus = ItNexus {
                    initiator: o.initiator_name.clone(),
                    isid: o.isid,
                    tpgt: o.info.tpgt,
                };
                let shared = self
                    .target
                    .lun_shared(o.target_name.as_deref().unwrap_or(""), id);
                self.luns.push(LunState {
                    id,
                    disk: Disk::shared(info, shared, nexus),
                    ch,
                });
            }
        }
        self.outcome = Some(o);
        self.phase = Phase::Full;
    }

    /// A NOP-Out: a ping (valid ITT) is answered with its ping data
    /// reflected (RFC 7143 §11.18.5), cut to what the initiator can
    /// receive (InitiatorRecvDataSegmentLength, at most 8 KiB per send).
    fn on_nop(&mut self, n: &NopOut, data: &[u8], ops: &mut dyn ConnOps) {
        if !n.immediate && self.window.check(n.cmd_sn, false, false) == CmdSnCheck::Drop {
            return;
        }
        if n.itt == RESERVED_TAG {
            return; // answer to our ping
        }
        let r = NopIn {
            lun: n.lun,
            itt: n.itt,
            ttt: RESERVED_TAG,
            stat_sn: self.next_stat_sn(),
            exp_cmd_sn: self.window.exp_cmd_sn(),
            max_cmd_sn: self.window.max_cmd_sn(),
        };
        let limit = self.send_limit();
        let echo = &data[..data.len().min(limit)];
        if !ops.send_pdu(&Bhs::NopIn(r).encode(0, echo.len() as u32), echo, None) {
            self.close(ops);
        }
    }

    fn on_text(&mut self, t: &TextPdu, data: &[u8], ops: &mut dyn ConnOps) {
        if !t.immediate && self.window.check(t.sn, false, false) == CmdSnCheck::Drop {
            return;
        }
        if t.ttt != RESERVED_TAG {
            // A follow-on for the rest of a long answer: only with the tag
            // this target gave it (RFC 7143 §11.10.4).
            if self.text_itt == RESERVED_TAG || t.itt != self.text_itt || t.ttt != self.text_ttt {
                let raw = Bhs::TextReq(*t).encode(0, data.len() as u32);
                self.reject(&raw, reject_reason::INVALID_PDU_FIELD, ops);
                return;
            }
            return self.send_text(t, ops);
        }
        // A new request ends any unfinished answer.
        self.text_itt = RESERVED_TAG;
        self.text_sent = 0;
        self.text_out.clear();
        let initiator = self
            .outcome
            .as_ref()
            .map(|o| o.initiator_name.clone())
            .unwrap_or_default();
        // `SendTargets=` (no value) names the session's target (RFC 7143
        // Appendix D); a discovery session has none.
        let own = self
            .outcome
            .as_ref()
            .and_then(|o| o.target_name.clone())
            .filter(|_| !self.is_discovery());
        match parse_text(data) {
            Ok(pairs) => {
                for (k, v) in pairs {
                    if k == "SendTargets" && v == "All" {
                        self.target.send_targets(&initiator, &mut self.text_out);
                    } else if k == "SendTargets" {
                        let name = if v.is_empty() {
                            own.as_deref()
                        } else {
                            Some(v)
                        };
                        if let Some(name) = name {
                            self.target
                                .send_target(&initiator, name, &mut self.text_out);
                        }
                    } else {
                        push_pair(&mut self.text_out, k, "NotUnderstood");
                    }
                }
            }
            Err(_) => {
                let raw = Bhs::TextReq(*t).encode(0, data.len() as u32);
                self.reject(&raw, reject_reason::PROTOCOL_ERROR, ops);
                return;
            }
        }
        self.send_text(t, ops);
    }

    /// Send the next part of the answer in `text_out` to Text Request `t`:
    /// at most what the initiator can receive (and 8 KiB per send), cut on
    /// a pair boundary where one fits. A part that is not the last goes
    /// with C=1, F=0 and a Target Transfer Tag the initiator echoes to ask
    /// for the rest (RFC 7143 §11.11).
    fn send_text(&mut self, t: &TextPdu, ops: &mut dyn ConnOps) {
        let limit = self.send_limit();
        let start = self.text_sent.min(self.text_out.len());
        let rest = &self.text_out[start..];
        let mut n = rest.len().min(limit);
        if n < rest.len() {
            if let Some(p) = rest[..n].iter().rposition(|&b| b == 0) {
                n = p + 1;
            }
        }
        let more = n < rest.len();
        let ttt = if more {
            self.text_ttt = match self.text_ttt.wrapping_add(1) {
                RESERVED_TAG => 0,
                v => v,
            };
            self.text_itt = t.itt;
            self.text_ttt
        } else {
            self.text_itt = RESERVED_TAG;
            RESERVED_TAG
        };
        self.text_sent = start + n;
        let r = TextPdu {
            immediate: false,
            final_: !more,
            cont: more,
            lun: t.lun,
            itt: t.itt,
            ttt,
            sn: self.next_stat_sn(),
            exp_sn: self.window.exp_cmd_sn(),
            max_cmd_sn: self.window.max_cmd_sn(),
        };
        let bhs = Bhs::TextRsp(r).encode(0, n as u32);
        if !ops.send_pdu(&bhs, &self.text_out[start..start + n], None) {
            self.close(ops);
        }
    }

    fn on_tmf(&mut self, t: &TmfRequest, ops: &mut dyn ConnOps) {
        if !t.immediate && self.window.check(t.cmd_sn, false, false) == CmdSnCheck::Drop {
            return;
        }
        let busy = self.tasks_in_flight() > 0;
        let response = match t.function {
            TmfFunction::AbortTask => {
                if self
                    .tasks
                    .iter()
                    .any(|x| x.state != TaskState::Free && x.itt == t.ref_task_tag)
                {
                    // Running tasks finish on their own (their data is in flight).
                    tmf_response::REJECTED
                } else if sn_le(self.window.exp_cmd_sn(), t.ref_cmd_sn)
                    && sn_le(t.ref_cmd_sn, self.window.max_cmd_sn())
                    && sn_lt(t.ref_cmd_sn, t.cmd_sn)
                {
                    // Never received (RFC 7143 §11.6.1 b): "Function
                    // complete", and its CmdSN counts as received, so the
                    // commands after it are no gap (a later hole stays).
                    if t.ref_cmd_sn == self.window.exp_cmd_sn() {
                        let _ = self.window.check(t.ref_cmd_sn, false, false);
                    }
                    tmf_response::COMPLETE
                } else {
                    // Answered already, or outside the window (c).
                    tmf_response::NO_TASK
                }
            }
            TmfFunction::AbortTaskSet
            | TmfFunction::ClearTaskSet
            | TmfFunction::LogicalUnitReset
            | TmfFunction::TargetWarmReset => {
                if lun_slot(&self.luns, &t.lun).is_none()
                    && t.function != TmfFunction::TargetWarmReset
                {
                    tmf_response::NO_LUN
                } else if busy {
                    tmf_response::REJECTED
                } else {
                    // A logical unit reset releases the RESERVE(6)
                    // reservation (SPC-2 semantics, as LIO's LUN reset);
                    // a target reset resets every LU.
                    let slot = lun_slot(&self.luns, &t.lun);
                    for (i, l) in self.luns.iter().enumerate() {
                        let reset = match t.function {
                            TmfFunction::LogicalUnitReset => slot == Some(i),
                            TmfFunction::TargetWarmReset => true,
                            _ => false,
                        };
                        if reset {
                            l.disk.lun().change(|r| r.lu_reset());
                        }
                    }
                    tmf_response::COMPLETE
                }
            }
            // Reassignment needs ErrorRecoveryLevel 2; this session is at 0
            // (RFC 7143 §11.6.1).
            TmfFunction::TaskReassign => tmf_response::NO_REASSIGN,
            _ => tmf_response::NOT_SUPPORTED,
        };
        let r = TmfResponse {
            response,
            itt: t.itt,
            stat_sn: self.next_stat_sn(),
            exp_cmd_sn: self.window.exp_cmd_sn(),
            max_cmd_sn: self.window.max_cmd_sn(),
        };
        if !ops.send_pdu(&Bhs::TmfRsp(r).encode(0, 0), &[], None) {
            self.close(ops);
        }
    }

    fn on_logout(&mut self, l: &LogoutRequest, ops: &mut dyn ConnOps) {
        if !l.immediate && self.window.check(l.cmd_sn, false, false) == CmdSnCheck::Drop {
            return;
        }
        let response = self.logout_response(l);
        let r = LogoutResponse {
            response,
            itt: l.itt,
            stat_sn: self.next_stat_sn(),
            exp_cmd_sn: self.window.exp_cmd_sn(),
            max_cmd_sn: self.window.max_cmd_sn(),
            time2wait: 0,
            time2retain: 0,
        };
        if !ops.send_pdu(&Bhs::LogoutRsp(r).encode(0, 0), &[], None) {
            // No response went out: nothing to wait for.
            self.close(ops);
            return;
        }
        if response != logout_response::SUCCESS {
            // Refused: the connection stays in full feature phase.
            return;
        }
        // The session is over now, not when the connection goes (that
        // waits for the initiator's disconnect): a new login of the nexus
        // meanwhile is a new session, not a reinstatement of this one.
        self.end_session();
        if !matches!(self.phase, Phase::Closed) {
            self.phase = Phase::Closed;
            ops.close_after_logout();
        }
    }

    /// What a Logout Request gets on this session, which has one connection
    /// (MaxConnections=1) at ErrorRecoveryLevel 0 (RFC 7143 §11.14-11.15):
    /// closing the session, or this connection by its own CID, succeeds;
    /// closing a connection by any other CID finds no such connection;
    /// removing a connection for recovery needs ErrorRecoveryLevel 2.
    fn logout_response(&self, l: &LogoutRequest) -> u8 {
        let own_cid = self.outcome.as_ref().map(|o| o.cid);
        match l.reason {
            LogoutReason::CloseSession => logout_response::SUCCESS,
            LogoutReason::CloseConnection if own_cid == Some(l.cid) => logout_response::SUCCESS,
            LogoutReason::CloseConnection => logout_response::CID_NOT_FOUND,
            LogoutReason::RemoveForRecovery => logout_response::RECOVERY_NOT_SUPPORTED,
        }
    }

    /// End the session (once: at a successful logout or when the
    /// connection goes): its RESERVE(6) reservations end and it leaves the
    /// target's session table. A connection has LUNs only once its session
    /// is in the table.
    fn end_session(&mut self) {
        if let Some(tsih) = self.tsih.take() {
            for l in &self.luns {
                l.disk.end_nexus();
            }
            self.target.end_session(tsih);
            // A retirement that raced with the session's own end.
            self.core.take_doomed(tsih);
        }
    }

    fn on_command(
        &mut self,
        cmd: &ScsiCommand,
        (ext_cdb, ext_len): ([u8; 16], usize),
        data: &[u8],
        (write, read): (Option<Stag>, Option<Stag>),
        ops: &mut dyn ConnOps,
    ) {
        let discovery = self.is_discovery();
        let raw = Bhs::ScsiCmd(*cmd).encode(0, data.len() as u32);
        if discovery {
            self.reject(&raw, reject_reason::PROTOCOL_ERROR, ops);
            return;
        }
        if self.window.check(cmd.cmd_sn, cmd.immediate, true) == CmdSnCheck::Drop {
            self.stats.rejected += 1;
            return;
        }
        if !data.is_empty() && !self.immediate_data() {
            // Immediate data with ImmediateData=No (RFC 7143 §13.11): a
            // protocol error, rejected as LIO does ("ImmediateData=No but
            // DataSegmentLength=..."). As below, no task is made and its
            // CmdSN is used up.
            self.window.release();
            self.reject(&raw, reject_reason::PROTOCOL_ERROR, ops);
            return;
        }
        if data.len() > self.first_burst() {
            // More unsolicited data than FirstBurstLength (RFC 7143
            // §4.2.5.2): rejected as an invalid PDU field, as LIO does. No
            // task is made and nothing is kept; its CmdSN is used up (and
            // its window slot freed) so that the session goes on.
            self.window.release();
            self.reject(&raw, reject_reason::INVALID_PDU_FIELD, ops);
            return;
        }
        let Some(idx) = self.free.pop() else {
            // The window guarantees a slot to well-behaved initiators.
            self.window.release();
            self.reject(&raw, reject_reason::OUT_OF_RESOURCES, ops);
            return;
        };
        self.stats.commands += 1;
        let lun = lun_slot(&self.luns, &cmd.lun);
        let t = &mut self.tasks[usize::from(idx)];
        t.state = TaskState::Respond;
        t.itt = cmd.itt;
        t.lun = lun;
        t.cdb[..16].copy_from_slice(&cmd.cdb);
        t.cdb[16..].copy_from_slice(&ext_cdb);
        // A READ(32)/WRITE(32) whose extended CDB is missing or short is
        // decoded as that, and refused, not read as zero-padded.
        t.cdb_len = 16 + ext_len;
        t.edtl = cmd.edtl;
        t.read = if cmd.read { read } else { None };
        t.write = if cmd.write { write } else { None };
        t.io = None;
        t.need = 0;
        t.got = 0;
        t.param = false;
        t.data_in = 0;
        t.sent = 0;
        t.result = Ok(());
        t.slot = true;
        t.rflag = cmd.read;
        t.wflag = cmd.write;
        t.final_ = cmd.final_;
        t.immediate = cmd.immediate;
        t.full = false;
        t.step = 0;
        t.done = 0;
        t.caw = false;
        if cmd.immediate {
            self.unexpected += 1;
        }
        // No overtaking of waiting tasks.
        let buf = if self.buf_wait.is_empty() {
            self.core.get()
        } else {
            None
        };
        let t = &mut self.tasks[usize::from(idx)];
        match buf {
            Some(b) => t.buf = Some(b),
            None if data.is_empty() && cmd.final_ => {
                // Nothing of it to keep meanwhile: wait for a buffer.
                t.state = TaskState::AwaitBuf;
                self.stats.buffer_waits += 1;
                self.buf_wait.push_back(idx);
                return;
            }
            None => {
                // Its unsolicited data has nowhere to go: SCSI back-pressure.
                t.full = true;
                self.stats.task_set_full += 1;
                return self.respond(idx, ops);
            }
        }
        self.execute(idx, data, ops);
    }

    /// Run command `idx` (its task holds a buffer) with its immediate data.
    fn execute(&mut self, idx: u16, data: &[u8], ops: &mut dyn ConnOps) {
        let t = &mut self.tasks[usize::from(idx)];
        let lun = t.lun;
        let (cdb, edtl, wflag, rflag, final_) = (t.cdb, t.edtl, t.wflag, t.rflag, t.final_);
        let cdb_len = t.cdb_len;
        let Some(buf) = t.buf.as_mut() else {
            t.result = Err(Sense::INTERNAL_FAILURE);
            self.respond(idx, ops);
            return;
        };
        let cap = buf.capacity();
        let _ = buf.set_len(cap);
        let opcode = cdb[0];
        let action = if opcode == op::REPORT_LUNS {
            crate::scsi::Cdb::parse(&cdb).map(|c| {
                let alloc = match c {
                    crate::scsi::Cdb::ReportLuns { alloc } => alloc as usize,
                    _ => 0,
                };
                let out = &mut buf.as_mut_slice()[..alloc.min(cap)];
                Action::DataIn(report_luns(self.luns.iter().map(|l| l.id), out))
            })
        } else if let Some(l) = lun {
            self.luns[l].disk.exec(&cdb[..cdb_len], buf.as_mut_slice())
        } else if opcode == op::INQUIRY && cdb[1] & 1 == 0 {
            // Unmapped LUN: peripheral qualifier 3, type 1Fh.
            let b = buf.as_mut_slice();
            b[..36].fill(0);
            b[0] = 0x7F;
            b[2] = 6;
            b[3] = 2;
            b[4] = 31;
            Ok(Action::DataIn(
                36.min(usize::from(u16::from_be_bytes([cdb[3], cdb[4]]))),
            ))
        } else if opcode == op::REQUEST_SENSE {
            // Unmapped LUN: GOOD with the sense data LOGICAL UNIT NOT
            // SUPPORTED (SAM-5 incorrect logical unit selection).
            crate::scsi::Cdb::parse(&cdb).map(|c| {
                let alloc = match c {
                    crate::scsi::Cdb::RequestSense { alloc } => alloc as usize,
                    _ => 0,
                };
                let f = Sense::LUN_NOT_SUPPORTED.fixed();
                let n = f.len().min(alloc).min(cap);
                buf.as_mut_slice()[..n].copy_from_slice(&f[..n]);
                Action::DataIn(n)
            })
        } else {
            Err(Sense::LUN_NOT_SUPPORTED)
        };
        let t = &mut self.tasks[usize::from(idx)];
        match action {
            Err(s) => t.result = Err(s),
            Ok(Action::Good) => {}
            Ok(Action::DataIn(n)) => t.data_in = n,
            Ok(Action::NeedData(len)) => {
                t.param = true;
                t.need = len as usize;
            }
            Ok(Action::Io(io)) => {
                t.io = Some(io);
                if io.op.has_data_out() {
                    let info = &self.luns[lun.unwrap_or(0)].disk.info;
                    let wire = io.wire_len(info);
                    if u64::from(edtl) != wire || !wflag {
                        t.result = Err(Sense::INVALID_FIELD_IN_CDB);
                        t.io = None;
                    } else {
                        t.need = wire as usize;
                    }
                } else if io.op == BlockOp::Read && !rflag {
                    t.result = Err(Sense::INVALID_FIELD_IN_CDB);
                    t.io = None;
                }
            }
        }
        if t.need > 0 {
            if u64::from(edtl) < t.need as u64 || !wflag {
                t.result = Err(Sense::INVALID_FIELD_IN_CDB);
                t.need = 0;
                t.io = None;
            } else {
                // Immediate data first.
                let n = data.len().min(t.need);
                if let Some(b) = t.buf.as_mut() {
                    b.as_mut_slice()[..n].copy_from_slice(&data[..n]);
                }
                t.got = n;
                if t.got < t.need && !final_ {
                    t.state = TaskState::AwaitDataOut;
                    return;
                }
            }
        }
        self.continue_data(idx, ops);
    }

    fn on_data_out(&mut self, d: &crate::pdu::DataOut, data: &[u8], ops: &mut dyn ConnOps) {
        let Some(idx) = self
            .tasks
            .iter()
            .position(|t| t.state == TaskState::AwaitDataOut && t.itt == d.itt)
        else {
            let raw = Bhs::DataOut(*d).encode(0, data.len() as u32);
            self.reject(&raw, reject_reason::PROTOCOL_ERROR, ops);
            return;
        };
        let first_burst = self.first_burst();
        let initial_r2t = self.initial_r2t();
        let t = &mut self.tasks[idx];
        let off = d.buffer_offset as usize;
        let end = off.saturating_add(data.len());
        if initial_r2t {
            // Unsolicited Data-Out with InitialR2T=Yes (RFC 7143 §13.10).
            // This target never sends an R2T (over iSER the solicited data
            // is fetched by RDMA READ, RFC 7145), so every Data-Out is
            // unsolicited: the task ends with "unexpected unsolicited data",
            // as LIO answers it (TCM_UNEXPECTED_UNSOLICITED_DATA).
            t.result = Err(Sense::UNEXPECTED_UNSOLICITED);
            t.need = 0;
            t.io = None;
        } else if end > first_burst {
            // Unsolicited data (immediate and Data-Out) beyond
            // FirstBurstLength (RFC 7143 §4.2.5.2): the task ends with
            // "incorrect amount of data" (§11.4.7.2), as LIO answers it.
            t.result = Err(Sense::NOT_ENOUGH_UNSOLICITED);
            t.need = 0;
            t.io = None;
        } else if off != t.got || end > t.need {
            t.result = Err(Sense::INVALID_FIELD_IN_PARAM);
            t.need = 0;
            t.io = None;
        } else if let Some(b) = t.buf.as_mut() {
            b.as_mut_slice()[off..end].copy_from_slice(data);
            t.got = end;
        }
        if d.final_ || t.need == 0 {
            self.continue_data(idx as u16, ops);
        }
    }

    /// Fetch missing data-out (RDMA READ) or go on.
    fn continue_data(&mut self, idx: u16, ops: &mut dyn ConnOps) {
        let t = &mut self.tasks[usize::from(idx)];
        if t.result.is_ok() && t.got < t.need {
            let Some(from) = t.write else {
                t.result = Err(Sense::NOT_ENOUGH_UNSOLICITED);
                return self.respond(idx, ops);
            };
            let Some(buf) = t.buf.as_ref() else {
                return;
            };
            // The VA points at the first solicited byte: everything after
            // the unsolicited data.
            let len = t.need - t.got;
            t.state = TaskState::Reading;
            match ops.read_data(idx, from, buf, t.got, len) {
                Transfer::Pending => return,
                Transfer::Done => t.got = t.need,
                Transfer::Busy => {
                    t.state = TaskState::AwaitDataOut;
                    self.retry.push_back(idx);
                    return;
                }
            }
        }
        self.data_ready(idx, ops);
    }

    /// The transport finished the RDMA READ (Data-Out) or the RDMA WRITE
    /// (Data-In) of task `idx` (`ok` = success).
    pub fn data_done(&mut self, idx: u16, ok: bool, ops: &mut dyn ConnOps) {
        let Some(t) = self.tasks.get_mut(usize::from(idx)) else {
            return;
        };
        if t.state == TaskState::Writing {
            // The buffer is free again; now the response may go out.
            t.state = TaskState::Respond;
            if !ok {
                t.result = Err(Sense::TRANSFER_FAILED);
            }
            return self.respond(idx, ops);
        }
        if t.state != TaskState::Reading {
            return;
        }
        if ok {
            t.got = t.need;
        } else {
            t.result = Err(Sense::TRANSFER_FAILED);
        }
        self.data_ready(idx, ops);
    }

    fn data_ready(&mut self, idx: u16, ops: &mut dyn ConnOps) {
        let t = &mut self.tasks[usize::from(idx)];
        if t.result.is_ok() && t.param {
            t.param = false;
            let lun = t.lun.unwrap_or(0);
            let data = t.buf.as_ref().map_or(&[][..], |b| &b.as_slice()[..t.need]);
            match self
                .luns
                .get(lun)
                .map(|l| l.disk.exec_with_data(&t.cdb[..t.cdb_len], data))
            {
                Some(Ok(Action::Io(io))) => t.io = Some(io),
                Some(Ok(_)) => {}
                Some(Err(s)) => t.result = Err(s),
                None => t.result = Err(Sense::LUN_NOT_SUPPORTED),
            }
        }
        if t.result.is_err() || t.io.is_none() {
            return self.respond(idx, ops);
        }
        if t.io.is_some_and(|io| io.op == BlockOp::CompareAndWrite) && !t.caw {
            let Some(lun) = t.lun.and_then(|l| self.luns.get(l)) else {
                t.result = Err(Sense::LUN_NOT_SUPPORTED);
                return self.respond(idx, ops);
            };
            if !lun.disk.lun().try_caw() {
                // Another COMPARE AND WRITE on this LU: retried at each poll.
                t.state = TaskState::AwaitGate;
                self.retry.push_back(idx);
                return;
            }
            t.caw = true;
        }
        self.submit_io(idx, ops);
    }

    fn submit_io(&mut self, idx: u16, ops: &mut dyn ConnOps) {
        let t = &mut self.tasks[usize::from(idx)];
        let (Some(io), Some(l)) = (t.io, t.lun) else {
            return self.respond(idx, ops);
        };
        if io.op.is_multi_step() {
            return self.advance(idx, ops);
        }
        let lun = &self.luns[l];
        let info = &lun.disk.info;
        let bbs = info.buf_block_size as usize;
        let bs = info.block_size as usize;
        let n = io.blocks as usize;
        let write = io.op == BlockOp::Write;
        // PI is the bdev's work: it generates, verifies and reports; the
        // target only moves plain wire blocks to and from the bdev's
        // interleaved layout.
        let pi = match io.op {
            BlockOp::Read | BlockOp::Write => {
                pi::action(io.pi, info.pi_type, io.lba, write, io.tags)
            }
            _ => None,
        };
        let bufs = match io.op {
            BlockOp::Read | BlockOp::Write => {
                let Some(mut buf) = t.buf.take() else {
                    return;
                };
                if write && io.pi == PiMode::Strip {
                    pi::spread(buf.as_mut_slice(), bs, n);
                }
                let _ = buf.set_len(n * bbs);
                SgList::from_buf(buf)
            }
            _ => SgList::new(),
        };
        let ty = match io.op {
            BlockOp::Read => pollux_bdev::IoType::Read,
            BlockOp::Write => pollux_bdev::IoType::Write,
            BlockOp::Flush => pollux_bdev::IoType::Flush,
            BlockOp::Unmap => pollux_bdev::IoType::Unmap,
            BlockOp::WriteZeroes => pollux_bdev::IoType::WriteZeroes,
            _ => {
                t.result = Err(Sense::INTERNAL_FAILURE);
                return self.respond(idx, ops);
            }
        };
        t.state = TaskState::Bdev;
        let ctx = u64::from(idx);
        let submitted = match pi {
            Some(a) => lun.ch.submit_with_pi(
                ty,
                io.lba,
                io.blocks,
                bufs,
                SgList::new(),
                Some(a),
                &self.cb,
                ctx,
            ),
            None => lun.ch.submit(ty, io.lba, io.blocks, bufs, &self.cb, ctx),
        };
        if let Err(mut rej) = submitted {
            t.buf = rej.bufs.pop();
            t.result = Err(Sense::INTERNAL_FAILURE);
            self.respond(idx, ops);
        }
    }

    /// FUA: flush the range task `idx` wrote (`io`, on LUN `l`) before its
    /// GOOD; the flush completes as step `next`. A flush the channel refuses
    /// answers the task at once.
    fn flush_for_fua(&mut self, idx: u16, l: usize, io: BlockIo, next: u8, ops: &mut dyn ConnOps) {
        let t = &mut self.tasks[usize::from(idx)];
        t.step = next;
        t.state = TaskState::Bdev;
        let submitted = self.luns[l].ch.submit(
            pollux_bdev::IoType::Flush,
            io.lba,
            io.blocks,
            SgList::new(),
            &self.cb,
            u64::from(idx),
        );
        if submitted.is_err() {
            t.result = Err(Sense::INTERNAL_FAILURE);
            self.respond(idx, ops);
        }
    }

    fn on_bdev_done(
        &mut self,
        idx: u16,
        status: IoStatus,
        buf: Option<DmaBuf>,
        ops: &mut dyn ConnOps,
    ) {
        let Some(t) = self.tasks.get_mut(usize::from(idx)) else {
            return;
        };
        if t.state != TaskState::Bdev {
            return;
        }
        if buf.is_some() {
            t.buf = buf;
        }
        let io = t.io;
        if let Err(e) = status {
            let read =
                io.is_some_and(|i| i.op == BlockOp::Read || (i.op.is_multi_step() && !t.last.0));
            t.result = Err(if let Some(s) = pi::sense_of(&e) {
                // Found by the bdev's write-verify or read-verify.
                self.stats.pi_errors += 1;
                s
            } else {
                match e {
                    pollux_bdev::IoError::OutOfRange { lba, .. } => {
                        Sense::LBA_OUT_OF_RANGE.with_info(lba)
                    }
                    _ if read => Sense::READ_ERROR,
                    _ => Sense::WRITE_ERROR,
                }
            });
            return self.respond(idx, ops);
        }
        if io.is_some_and(|i| i.op.is_multi_step()) {
            return self.advance(idx, ops);
        }
        if let (Some(io), Some(l)) = (io, t.lun) {
            if io.op == BlockOp::Write && io.fua && t.step == 0 {
                // FUA: the written range is flushed before GOOD.
                return self.flush_for_fua(idx, l, io, 1, ops);
            }
            if io.op == BlockOp::Read {
                let info = &self.luns[l].disk.info;
                if let Some(buf) = t.buf.as_mut() {
                    let cap = buf.capacity();
                    let _ = buf.set_len(cap);
                    // The bdev verified the tuples (read-verify); PROTECT
                    // 000b sends the data without them.
                    if io.pi == PiMode::Strip {
                        pi::strip(
                            buf.as_mut_slice(),
                            info.block_size as usize,
                            io.blocks as usize,
                        );
                    }
                }
                t.data_in = io.wire_len(info) as usize;
            }
        }
        self.respond(idx, ops);
    }

    /// Send read data (if any) and the SCSI Response; frees the task.
    fn respond(&mut self, idx: u16, ops: &mut dyn ConnOps) {
        if self.is_closed() {
            // Closed (logout, protocol error, reinstated): the task ends
            // here, into the void; its buffer goes back to the cache.
            return self.free_task(idx);
        }
        let t = &mut self.tasks[usize::from(idx)];
        t.state = TaskState::Respond;
        let mut flags = 0u8;
        let mut residual = 0u32;
        let mut sense_buf = [0u8; 20];
        let mut sense_len = 0;
        let status = match t.result {
            Ok(()) if t.full => sense::TASK_SET_FULL,
            Ok(()) => {
                // What EDTL leaves room for; the rest stays in `data_in`
                // and is reported as a residual overflow.
                let ready = t.data_in.min((t.edtl as usize).saturating_sub(t.sent));
                if ready > 0 {
                    let (Some(to), Some(buf)) = (t.read, t.buf.as_ref()) else {
                        t.result = Err(Sense::INVALID_FIELD_IN_CDB);
                        return self.respond(idx, ops);
                    };
                    match ops.write_data(idx, to, buf, ready) {
                        Transfer::Busy => {
                            self.retry.push_back(idx);
                            return;
                        }
                        Transfer::Pending => {
                            t.data_in -= ready;
                            t.sent = ready;
                            t.state = TaskState::Writing;
                            return;
                        }
                        Transfer::Done => {}
                    }
                    t.data_in -= ready;
                    t.sent = ready;
                }
                let sent = t.sent;
                let expected = t.edtl as usize;
                let moved = if t.io.is_some_and(|i| i.op == BlockOp::Write) || t.need > 0 {
                    t.need
                } else {
                    sent
                };
                if moved < expected {
                    flags |= crate::pdu::scsi::RSP_UNDERFLOW;
                    residual = (expected - moved) as u32;
                } else if t.data_in > 0 {
                    // More data-in than EDTL lets through (RFC 7143
                    // §11.4.5.1: O bit, the bytes not transferred).
                    flags |= crate::pdu::scsi::RSP_OVERFLOW;
                    residual = u32::try_from(t.data_in).unwrap_or(u32::MAX);
                }
                sense::GOOD
            }
            Err(s) if s.status() != sense::CHECK_CONDITION => s.status(),
            Err(s) => {
                self.stats.check_conditions += 1;
                let f = s.fixed();
                sense_buf[..2].copy_from_slice(&(f.len() as u16).to_be_bytes());
                sense_buf[2..].copy_from_slice(&f);
                sense_len = 2 + f.len();
                sense::CHECK_CONDITION
            }
        };
        let invalidate = if self.params.send_with_inv {
            t.read.or(t.write).map(|s| s.stag)
        } else {
            None
        };
        // Release the window slot before computing MaxCmdSN.
        if t.slot {
            self.window.release();
        }
        let rsp = ScsiResponse {
            flags,
            response: 0,
            status,
            itt: t.itt,
            snack_tag: 0,
            stat_sn: self.stat_sn,
            exp_cmd_sn: self.window.exp_cmd_sn(),
            max_cmd_sn: self.window.max_cmd_sn(),
            exp_data_sn: 0,
            bidi_residual: 0,
            residual,
        };
        let bhs = Bhs::ScsiRsp(rsp).encode(0, sense_len as u32);
        if !ops.send_pdu(&bhs, &sense_buf[..sense_len], invalidate) {
            // Keep the slot until the response goes out.
            if t.slot {
                let _ = self.window.check(0, true, true);
            }
            self.retry.push_back(idx);
            return;
        }
        self.stat_sn = self.stat_sn.wrapping_add(1);
        self.free_task(idx);
    }

    /// Task `idx` is done: back to the free list, its buffer back to this
    /// core's cache (the drop finds it; no shared atomic).
    fn free_task(&mut self, idx: u16) {
        let t = &mut self.tasks[usize::from(idx)];
        if t.state == TaskState::Free {
            return;
        }
        t.state = TaskState::Free;
        t.slot = false;
        t.buf = None;
        if t.caw {
            t.caw = false;
            if let Some(lun) = t.lun.and_then(|l| self.luns.get(l)) {
                lun.disk.lun().end_caw();
            }
        }
        if t.immediate {
            t.immediate = false;
            self.unexpected = self.unexpected.saturating_sub(1);
        }
        self.free.push(idx);
    }

    /// Deliver bdev completions and retry parked tasks. Call once per
    /// reactor loop.
    pub fn poll(&mut self, ops: &mut dyn ConnOps) -> PollStatus {
        let mut busy = false;
        if self.core.any_doomed() {
            if let Some(tsih) = self.tsih {
                if self.core.take_doomed(tsih) {
                    // Reinstated by a new login, or its target node was
                    // deleted: close; I/O in flight completes into the
                    // void (the bdev owns its buffers).
                    log::info!("iscsi: session {tsih:#x} retired (reinstated elsewhere or its target deleted); closing");
                    self.close(ops);
                    return PollStatus::Busy;
                }
            }
        }
        if self.check_nop(ops) != NopCheck::Quiet {
            busy = true;
        }
        if self.is_closed() {
            while let Some(idx) = self.buf_wait.pop_front() {
                self.free_task(idx);
            }
        }
        while let Some(&idx) = self.buf_wait.front() {
            let Some(b) = self.core.get() else {
                break;
            };
            self.buf_wait.pop_front();
            busy = true;
            let t = &mut self.tasks[usize::from(idx)];
            t.buf = Some(b);
            t.state = TaskState::Respond;
            self.execute(idx, &[], ops);
        }
        loop {
            let next = self.sink.done.borrow_mut().pop_front();
            let Some((idx, status, buf)) = next else {
                break;
            };
            busy = true;
            self.on_bdev_done(idx, status, buf, ops);
        }
        for _ in 0..self.retry.len() {
            let Some(idx) = self.retry.pop_front() else {
                break;
            };
            busy = true;
            match self.tasks[usize::from(idx)].state {
                TaskState::AwaitDataOut => self.continue_data(idx, ops),
                TaskState::AwaitGate => self.data_ready(idx, ops),
                TaskState::Respond => self.respond(idx, ops),
                _ => {}
            }
        }
        if busy {
            PollStatus::Busy
        } else {
            PollStatus::Idle
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        for t in &mut self.tasks {
            if t.caw {
                t.caw = false;
                if let Some(lun) = t.lun.and_then(|l| self.luns.get(l)) {
                    lun.disk.lun().end_caw();
                }
            }
        }
        self.end_session();
    }
}

mod nop;
mod steps;

pub use nop::NopPing;
use nop::{NopCheck, NopState};

#[cfg(test)]
mod tests;
