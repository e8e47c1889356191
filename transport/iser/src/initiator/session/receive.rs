//! Completions and received PDUs: send/registration/invalidation
//! completions, StatSN/CmdSN window updates, login responses and SCSI
//! responses that finish tasks.

use super::*;

impl<P: Provider> IserInitiator<P> {
    pub(super) fn completion(&mut self, wc: &Wc) {
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

    pub(super) fn check_done(&mut self, i: usize) {
        if self.tasks.get(i).is_some_and(|t| t.finished()) {
            self.done.push_back(i as u16);
        }
    }

    pub(super) fn update_sn(
        &mut self,
        stat_sn: u32,
        exp_cmd_sn: u32,
        max_cmd_sn: u32,
        advances: bool,
    ) {
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

    pub(super) fn on_recv(&mut self, wc: &Wc, slot: usize) {
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
        // Proof of life for the keep-alive (any PDU).
        self.heard = true;
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
                // The initiator closes the connection after the Logout
                // Response (RFC 7143 §11.14); the target waits for it.
                if let Some(id) = self.cm.as_ref().filter(|_| !self.linger_after_logout) {
                    let _ = id.disconnect();
                }
            }
            Bhs::NopIn(n) => {
                // The target's own ping asks for an answer (TTT its own).
                let ping = n.ttt != RESERVED_TAG;
                // StatSN advances only in an answer to a NOP-Out with a
                // valid ITT (RFC 7143 §11.19.4): one of our pings.
                let answer = n.itt != RESERVED_TAG;
                self.update_sn(n.stat_sn, n.exp_cmd_sn, n.max_cmd_sn, answer);
                if answer && n.itt & PING_ITT != 0 {
                    self.stats.nop_answers += 1;
                }
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

    pub(super) fn on_login_rsp(&mut self, r: &crate::pdu::LoginResponse, data: &[u8]) {
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

    pub(super) fn on_response(
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
                    let wb = u64::from(t.shape.block) + TUPLE as u64;
                    fail = Some(PiFailure {
                        kind: e.kind,
                        lba: t.shape.lba + e.offset / wb,
                        expected: e.expected,
                        actual: e.actual,
                    });
                }
            }
            // A DIX write's bad tuple, found before it went out.
            PiPath::Software if t.dir == DataDir::Write => fail = t.pi_error.take(),
            PiPath::Software if t.dir == DataDir::Read && status == sense::GOOD => {
                if let (Some(b), Some(sg)) = (self.bounce.as_ref(), t.bufs.as_mut()) {
                    let off = i * self.bounce_slot;
                    let wl = t.shape.wire_len();
                    fail = pi::verify_strip(&b.as_slice()[off..off + wl], sg, &t.shape);
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
