//! Control PDUs of the session: login steps, SendTargets text, logout,
//! keep-alive NOP-Out pings and raw PDUs (tests), each through one
//! control slot.

use super::*;

impl<P: Provider> IserInitiator<P> {
    /// Send a control PDU (login, text, NOP-Out, logout).
    pub(super) fn send_ctrl(&mut self, bhs: &[u8; BHS_LEN], data: &[u8]) -> bool {
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
    #[cfg(any(test, feature = "test-util"))]
    pub fn send_raw(&mut self, raw: &[u8]) -> bool {
        self.post_ctrl(raw.len(), |b| b.copy_from_slice(raw))
    }

    /// Misbehave after logout: read the Logout Response (the session
    /// becomes `Closed`) but leave the connection up, as an initiator that
    /// never disconnects would; dropping the session disconnects it. For
    /// the target's tests.
    #[cfg(any(test, feature = "test-util"))]
    pub fn linger_after_logout(&mut self) {
        self.linger_after_logout = true;
    }

    /// Post one control SEND of `len` bytes that `fill` writes into a free
    /// control slot.
    pub(super) fn post_ctrl(&mut self, len: usize, fill: impl FnOnce(&mut [u8])) -> bool {
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

    /// The keep-alive check (full feature phase, every [`CM_PERIOD`]
    /// rounds): after `nop_interval` without a PDU received, a NOP-Out
    /// ping; `nop_timeout` after it became due with still nothing heard,
    /// the session fails with [`InitiatorError::TargetUnresponsive`]. The
    /// time is the clock of the reactor the session was connected on,
    /// wherever it is polled (read here, not per I/O), else the monotonic
    /// clock. No allocation.
    pub(super) fn keep_alive(&mut self) {
        let now = self.clock.now();
        let last = match self.last_heard {
            Some(t) if !self.heard => t,
            // Heard from (or the first check): proof of life.
            _ => {
                self.heard = false;
                self.last_heard = Some(now);
                self.ping = None;
                return;
            }
        };
        let quiet = now.saturating_duration_since(last);
        match self.ping {
            None if quiet >= self.opts.nop_interval => {
                self.ping_seq = self.ping_seq.wrapping_add(1);
                self.ping = Some(Ping {
                    itt: PING_ITT | (self.ping_seq & 0x0FFF_FFFF),
                    since: now,
                    sent: false,
                });
                self.send_ping();
            }
            Some(p) if now.saturating_duration_since(p.since) >= self.opts.nop_timeout => {
                self.fail(InitiatorError::TargetUnresponsive { after: quiet });
            }
            // No control slot was free last time: the timeout runs anyway.
            Some(p) if !p.sent => self.send_ping(),
            _ => {}
        }
    }

    /// Post the outstanding ping: NOP-Out with its ITT, TTT 0xffffffff,
    /// Immediate (CmdSN carried, not advanced), no data (RFC 7143 §11.18).
    fn send_ping(&mut self) {
        let Some(p) = self.ping else {
            return;
        };
        let o = NopOut {
            immediate: true,
            lun: Lun::default(),
            itt: p.itt,
            ttt: RESERVED_TAG,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
        };
        if self.send_ctrl(&Bhs::NopOut(o).encode(0, 0), &[]) {
            self.stats.nop_pings += 1;
            if let Some(p) = self.ping.as_mut() {
                p.sent = true;
            }
        }
    }

    pub(super) fn send_login(&mut self, csg: Stage, nsg: Stage) {
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
}
