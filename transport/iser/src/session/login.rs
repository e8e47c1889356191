//! The target side of the login phase (RFC 7143 §6): stages and
//! transitions, ISID/TSIH/CID checks, text continuation, key negotiation,
//! authorization and TSIH assignment. Transport-independent; control path
//! (it allocates).

use super::params::{SessionParams, TargetLimits};
use crate::pdu::text::{parse_text, push_pair, MAX_TEXT_LEN};
use crate::pdu::{LoginFlags, LoginRequest, LoginResponse, Stage};

/// A login Status-Class / Status-Detail pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LoginStatus {
    /// Status-Class.
    pub class: u8,
    /// Status-Detail.
    pub detail: u8,
}

impl LoginStatus {
    /// 0/0 success.
    pub const SUCCESS: LoginStatus = LoginStatus {
        class: 0,
        detail: 0,
    };
    /// 2/0 initiator error.
    pub const INITIATOR_ERROR: LoginStatus = LoginStatus {
        class: 2,
        detail: 0,
    };
    /// 2/1 authentication failed.
    pub const AUTH_FAILED: LoginStatus = LoginStatus {
        class: 2,
        detail: 1,
    };
    /// 2/2 authorization failure (ACL).
    pub const FORBIDDEN: LoginStatus = LoginStatus {
        class: 2,
        detail: 2,
    };
    /// 2/3 target not found.
    pub const NOT_FOUND: LoginStatus = LoginStatus {
        class: 2,
        detail: 3,
    };
    /// 2/5 unsupported version.
    pub const UNSUPPORTED_VERSION: LoginStatus = LoginStatus {
        class: 2,
        detail: 5,
    };
    /// 2/6 too many connections on this session (a connection added to a
    /// session that negotiated MaxConnections=1).
    pub const TOO_MANY_CONNECTIONS: LoginStatus = LoginStatus {
        class: 2,
        detail: 6,
    };
    /// 2/7 missing parameter.
    pub const MISSING_PARAMETER: LoginStatus = LoginStatus {
        class: 2,
        detail: 7,
    };
    /// 2/9 session type not supported.
    pub const SESSION_TYPE: LoginStatus = LoginStatus {
        class: 2,
        detail: 9,
    };
    /// 2/0x0A session does not exist.
    pub const NO_SESSION: LoginStatus = LoginStatus {
        class: 2,
        detail: 0x0A,
    };
    /// 2/0x0B invalid request during login.
    pub const INVALID_REQUEST: LoginStatus = LoginStatus {
        class: 2,
        detail: 0x0B,
    };
    /// 3/2 out of resources.
    pub const OUT_OF_RESOURCES: LoginStatus = LoginStatus {
        class: 3,
        detail: 2,
    };
}

/// Normal or discovery session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SessionType {
    /// A normal session to one target.
    Normal,
    /// A discovery session (SendTargets).
    Discovery,
}

/// What the target portal tells the login about the target asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginTargetInfo {
    /// TargetPortalGroupTag of the portal the connection came in on.
    pub tpgt: u16,
    /// TargetAlias to send, if any.
    pub alias: Option<String>,
    /// Negotiation limits.
    pub limits: TargetLimits,
}

/// The target core's answers during login.
pub trait LoginEnv {
    /// Authorize `initiator` for `target` (`None` for discovery).
    ///
    /// # Errors
    /// The login status to answer with (2/3 unknown target, 2/2 ACL).
    fn authorize(
        &self,
        initiator: &str,
        target: Option<&str>,
    ) -> Result<LoginTargetInfo, LoginStatus>;

    /// A fresh non-zero TSIH.
    fn new_tsih(&self) -> u16;

    /// Whether a live session has ISID `isid` and TSIH `tsih` (a login
    /// with a non-zero TSIH names it). The default knows no session.
    fn session_exists(&self, isid: [u8; 6], tsih: u16) -> bool {
        let _ = (isid, tsih);
        false
    }
}

/// The result of a successful login.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginOutcome {
    /// Session type.
    pub session_type: SessionType,
    /// InitiatorName.
    pub initiator_name: String,
    /// TargetName (normal sessions).
    pub target_name: Option<String>,
    /// ISID.
    pub isid: [u8; 6],
    /// The TSIH assigned.
    pub tsih: u16,
    /// CID.
    pub cid: u16,
    /// Negotiated parameters.
    pub params: SessionParams,
    /// ExpCmdSN at the start of full feature phase.
    pub exp_cmd_sn: u32,
    /// The next StatSN to send.
    pub stat_sn: u32,
    /// Target info (limits, TPGT).
    pub info: LoginTargetInfo,
}

/// What one login request led to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoginStep {
    /// Send the response and wait for the next request.
    Continue,
    /// Send the response; the connection is in full feature phase.
    Done(Box<LoginOutcome>),
    /// Send the (failure) response and close the connection.
    Failed(LoginStatus),
}

#[derive(Debug, Clone, Copy)]
struct First {
    isid: [u8; 6],
    tsih: u16,
    cid: u16,
    itt: u32,
    cmd_sn: u32,
}

/// The target's login state machine for one connection.
#[derive(Debug)]
pub struct TargetLogin {
    stage: Stage,
    first: Option<First>,
    text_in: Vec<u8>,
    seen: Vec<String>,
    params: SessionParams,
    initiator_name: Option<String>,
    target_name: Option<String>,
    session_type: SessionType,
    info: Option<LoginTargetInfo>,
    stat_sn: u32,
    tpgt_sent: bool,
    failed: bool,
}

const DECLARATIVE: [&str; 4] = [
    "InitiatorName",
    "InitiatorAlias",
    "TargetName",
    "SessionType",
];

impl TargetLogin {
    /// A fresh login whose first response carries StatSN `initial_stat_sn`.
    pub fn new(initial_stat_sn: u32) -> TargetLogin {
        TargetLogin {
            stage: Stage::Security,
            first: None,
            text_in: Vec::new(),
            seen: Vec::new(),
            params: SessionParams::default(),
            initiator_name: None,
            target_name: None,
            session_type: SessionType::Normal,
            info: None,
            stat_sn: initial_stat_sn,
            tpgt_sent: false,
            failed: false,
        }
    }

    fn response(
        &mut self,
        req: &LoginRequest,
        flags: LoginFlags,
        st: LoginStatus,
        tsih: u16,
    ) -> LoginResponse {
        let depth = self
            .info
            .as_ref()
            .map_or(1, |i| i.limits.queue_depth.max(1));
        let stat_sn = self.stat_sn;
        self.stat_sn = self.stat_sn.wrapping_add(1);
        LoginResponse {
            flags,
            version_max: 0,
            version_active: 0,
            isid: req.isid,
            tsih,
            itt: req.itt,
            stat_sn,
            exp_cmd_sn: req.cmd_sn,
            max_cmd_sn: req.cmd_sn.wrapping_add(depth - 1),
            status_class: st.class,
            status_detail: st.detail,
        }
    }

    fn fail(
        &mut self,
        req: &LoginRequest,
        st: LoginStatus,
        out: &mut Vec<u8>,
    ) -> (LoginResponse, LoginStep) {
        out.clear();
        self.failed = true;
        let flags = LoginFlags {
            transit: false,
            cont: false,
            csg: req.flags.csg,
            nsg: req.flags.csg,
        };
        (self.response(req, flags, st, 0), LoginStep::Failed(st))
    }

    /// Process one Login Request with data segment `data`; the answer's text
    /// goes to `out` (cleared first).
    pub fn on_request(
        &mut self,
        req: &LoginRequest,
        data: &[u8],
        env: &dyn LoginEnv,
        out: &mut Vec<u8>,
    ) -> (LoginResponse, LoginStep) {
        out.clear();
        if self.failed {
            return self.fail(req, LoginStatus::INVALID_REQUEST, out);
        }
        match self.first {
            None => {
                if req.version_min > 0 {
                    return self.fail(req, LoginStatus::UNSUPPORTED_VERSION, out);
                }
                if req.tsih != 0 {
                    // A connection for an existing session: not supported
                    // (MaxConnections=1), and 2/0A when there is no such
                    // session (RFC 7143 §6.3.1, status 0x020A).
                    let st = if env.session_exists(req.isid, req.tsih) {
                        LoginStatus::TOO_MANY_CONNECTIONS
                    } else {
                        LoginStatus::NO_SESSION
                    };
                    return self.fail(req, st, out);
                }
                self.stage = req.flags.csg;
                self.first = Some(First {
                    isid: req.isid,
                    tsih: req.tsih,
                    cid: req.cid,
                    itt: req.itt,
                    cmd_sn: req.cmd_sn,
                });
            }
            Some(f) => {
                if f.isid != req.isid
                    || f.tsih != req.tsih
                    || f.cid != req.cid
                    || f.cmd_sn != req.cmd_sn
                {
                    return self.fail(req, LoginStatus::INITIATOR_ERROR, out);
                }
                let _ = f.itt;
            }
        }
        if req.flags.csg != self.stage {
            return self.fail(req, LoginStatus::INITIATOR_ERROR, out);
        }
        if self.text_in.len() + data.len() > MAX_TEXT_LEN {
            return self.fail(req, LoginStatus::INITIATOR_ERROR, out);
        }
        self.text_in.extend_from_slice(data);
        if req.flags.cont {
            let flags = LoginFlags {
                transit: false,
                cont: false,
                csg: self.stage,
                nsg: self.stage,
            };
            return (
                self.response(req, flags, LoginStatus::SUCCESS, 0),
                LoginStep::Continue,
            );
        }
        let text = std::mem::take(&mut self.text_in);
        if let Err(st) = self.keys(&text, env, out) {
            return self.fail(req, st, out);
        }
        if self.initiator_name.is_none() {
            return self.fail(req, LoginStatus::MISSING_PARAMETER, out);
        }
        if !req.flags.transit {
            let flags = LoginFlags {
                transit: false,
                cont: false,
                csg: self.stage,
                nsg: self.stage,
            };
            return (
                self.response(req, flags, LoginStatus::SUCCESS, 0),
                LoginStep::Continue,
            );
        }
        let nsg = req.flags.nsg;
        let mut tsih = 0;
        let mut done = None;
        if nsg == Stage::FullFeature {
            let Some(info) = self.info.clone() else {
                return self.fail(req, LoginStatus::MISSING_PARAMETER, out);
            };
            if info.limits.rdma
                && self.session_type == SessionType::Normal
                && !self.params.rdma_extensions
            {
                return self.fail(req, LoginStatus::INITIATOR_ERROR, out);
            }
            self.params.finish();
            tsih = env.new_tsih();
            let f = self.first.unwrap_or(First {
                isid: req.isid,
                tsih: 0,
                cid: req.cid,
                itt: req.itt,
                cmd_sn: req.cmd_sn,
            });
            done = Some(LoginOutcome {
                session_type: self.session_type,
                initiator_name: self.initiator_name.clone().unwrap_or_default(),
                target_name: self.target_name.clone(),
                isid: f.isid,
                tsih,
                cid: f.cid,
                params: self.params.clone(),
                exp_cmd_sn: f.cmd_sn,
                stat_sn: self.stat_sn.wrapping_add(1),
                info,
            });
        }
        self.stage = nsg;
        let flags = LoginFlags {
            transit: true,
            cont: false,
            csg: req.flags.csg,
            nsg,
        };
        let rsp = self.response(req, flags, LoginStatus::SUCCESS, tsih);
        match done {
            Some(o) => (rsp, LoginStep::Done(Box::new(o))),
            None => (rsp, LoginStep::Continue),
        }
    }

    fn keys(
        &mut self,
        text: &[u8],
        env: &dyn LoginEnv,
        out: &mut Vec<u8>,
    ) -> Result<(), LoginStatus> {
        let pairs = parse_text(text).map_err(|_| LoginStatus::INITIATOR_ERROR)?;
        for (k, _) in &pairs {
            if self.seen.iter().any(|s| s == k) {
                return Err(LoginStatus::INITIATOR_ERROR);
            }
        }
        self.seen.extend(pairs.iter().map(|(k, _)| (*k).to_owned()));
        // Declarative keys first: they decide who we are talking to.
        for (k, v) in &pairs {
            match *k {
                "InitiatorName" => {
                    if v.is_empty() {
                        return Err(LoginStatus::MISSING_PARAMETER);
                    }
                    self.initiator_name = Some((*v).to_owned());
                }
                "TargetName" => self.target_name = Some((*v).to_owned()),
                "SessionType" => {
                    self.session_type = match *v {
                        "Normal" => SessionType::Normal,
                        "Discovery" => SessionType::Discovery,
                        _ => return Err(LoginStatus::SESSION_TYPE),
                    }
                }
                _ => {}
            }
        }
        if self.info.is_none() {
            let Some(ini) = self.initiator_name.as_deref() else {
                return Err(LoginStatus::MISSING_PARAMETER);
            };
            let target = match self.session_type {
                SessionType::Normal => Some(
                    self.target_name
                        .as_deref()
                        .ok_or(LoginStatus::MISSING_PARAMETER)?,
                ),
                SessionType::Discovery => None,
            };
            self.info = Some(env.authorize(ini, target)?);
        }
        let limits = self
            .info
            .as_ref()
            .map(|i| i.limits.clone())
            .unwrap_or_default();
        for (k, v) in &pairs {
            if DECLARATIVE.contains(k) {
                continue;
            }
            if *k == "AuthMethod" {
                if v.split(',').any(|m| m == "None") {
                    push_pair(out, k, "None");
                    continue;
                }
                return Err(LoginStatus::AUTH_FAILED);
            }
            match self.params.negotiate(k, v, &limits, out) {
                Ok(true) => {}
                Ok(false) => push_pair(out, k, "NotUnderstood"),
                Err(_) => return Err(LoginStatus::INITIATOR_ERROR),
            }
        }
        if !self.tpgt_sent && self.session_type == SessionType::Normal {
            if let Some(info) = &self.info {
                push_pair(out, "TargetPortalGroupTag", &info.tpgt.to_string());
                if let Some(a) = &info.alias {
                    push_pair(out, "TargetAlias", a);
                }
            }
            self.tpgt_sent = true;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
