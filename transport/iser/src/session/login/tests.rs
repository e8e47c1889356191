//! Login state machine tests.

use super::*;
use crate::pdu::text::parse_text;
use std::cell::Cell;

const TGT: &str = "iqn.2024-01.io.pollux:t0";
const INI: &str = "iqn.2024-01.io.pollux:i0";

struct Env {
    tsih: Cell<u16>,
}

impl LoginEnv for Env {
    fn authorize(
        &self,
        initiator: &str,
        target: Option<&str>,
    ) -> Result<LoginTargetInfo, LoginStatus> {
        if initiator == "iqn.bad" {
            return Err(LoginStatus::FORBIDDEN);
        }
        match target {
            None | Some(TGT) => Ok(LoginTargetInfo {
                tpgt: 1,
                alias: None,
                limits: TargetLimits::default(),
            }),
            Some(_) => Err(LoginStatus::NOT_FOUND),
        }
    }
    fn new_tsih(&self) -> u16 {
        self.tsih.set(self.tsih.get() + 1);
        self.tsih.get()
    }
}

fn env() -> Env {
    Env { tsih: Cell::new(0) }
}

fn req(csg: Stage, nsg: Option<Stage>, cont: bool) -> LoginRequest {
    LoginRequest {
        flags: LoginFlags {
            transit: nsg.is_some(),
            cont,
            csg,
            nsg: nsg.unwrap_or(csg),
        },
        version_max: 0,
        version_min: 0,
        isid: [0x80, 0, 0, 0, 0, 1],
        tsih: 0,
        itt: 1,
        cid: 0,
        cmd_sn: 1,
        exp_stat_sn: 0,
    }
}

fn normal_text() -> Vec<u8> {
    let mut t = Vec::new();
    push_pair(&mut t, "InitiatorName", INI);
    push_pair(&mut t, "TargetName", TGT);
    push_pair(&mut t, "SessionType", "Normal");
    SessionParams::initiator_offer(&mut t, 262144, 16776192, 262144);
    t
}

#[test]
fn open_iscsi_style_login_in_one_pdu() {
    let e = env();
    let mut l = TargetLogin::new(100);
    let mut out = Vec::new();
    let (rsp, step) = l.on_request(
        &req(Stage::Operational, Some(Stage::FullFeature), false),
        &normal_text(),
        &e,
        &mut out,
    );
    let LoginStep::Done(o) = step else {
        panic!("{step:?}")
    };
    assert_eq!(rsp.status_class, 0);
    assert!(rsp.flags.transit);
    assert_eq!(rsp.flags.nsg, Stage::FullFeature);
    assert_eq!(rsp.tsih, 1);
    assert_eq!(rsp.stat_sn, 100);
    assert_eq!(rsp.exp_cmd_sn, 1);
    assert_eq!(rsp.max_cmd_sn, 128);
    assert_eq!(o.stat_sn, 101);
    assert_eq!(o.exp_cmd_sn, 1);
    assert!(o.params.rdma_extensions);
    let keys = parse_text(&out).unwrap();
    assert!(keys.contains(&("TargetPortalGroupTag", "1")));
    assert!(keys.contains(&("RDMAExtensions", "Yes")));
    assert!(keys.contains(&("MaxConnections", "1")));
    assert!(!keys
        .iter()
        .any(|(k, _)| *k == "MaxOutstandingUnexpectedPDUs"));
}

#[test]
fn security_then_operational_with_continuation() {
    let e = env();
    let mut l = TargetLogin::new(0);
    let mut out = Vec::new();
    let mut t = Vec::new();
    push_pair(&mut t, "InitiatorName", INI);
    push_pair(&mut t, "TargetName", TGT);
    push_pair(&mut t, "AuthMethod", "CHAP,None");
    let (rsp, step) = l.on_request(
        &req(Stage::Security, Some(Stage::Operational), false),
        &t,
        &e,
        &mut out,
    );
    assert_eq!(step, LoginStep::Continue);
    assert_eq!(rsp.flags.nsg, Stage::Operational);
    assert!(parse_text(&out).unwrap().contains(&("AuthMethod", "None")));
    // Operational keys split over two PDUs (C bit).
    let mut ops = Vec::new();
    SessionParams::initiator_offer(&mut ops, 262144, 16776192, 262144);
    let (a, b) = ops.split_at(40);
    let (rsp, step) = l.on_request(&req(Stage::Operational, None, true), a, &e, &mut out);
    assert_eq!(
        (step, rsp.flags.transit, out.len()),
        (LoginStep::Continue, false, 0)
    );
    let (_, step) = l.on_request(
        &req(Stage::Operational, Some(Stage::FullFeature), false),
        b,
        &e,
        &mut out,
    );
    assert!(matches!(step, LoginStep::Done(_)));
}

#[test]
fn login_failures_have_the_right_status() {
    let e = env();
    let run = |text: Vec<u8>, r: LoginRequest| {
        let mut l = TargetLogin::new(0);
        let mut out = Vec::new();
        l.on_request(&r, &text, &e, &mut out)
    };
    let op = || req(Stage::Operational, Some(Stage::FullFeature), false);
    let mut t = Vec::new();
    push_pair(&mut t, "InitiatorName", INI);
    push_pair(&mut t, "TargetName", "iqn.nope");
    assert_eq!(run(t, op()).1, LoginStep::Failed(LoginStatus::NOT_FOUND));
    let mut t = Vec::new();
    push_pair(&mut t, "InitiatorName", "iqn.bad");
    push_pair(&mut t, "TargetName", TGT);
    assert_eq!(run(t, op()).1, LoginStep::Failed(LoginStatus::FORBIDDEN));
    let mut t = Vec::new();
    push_pair(&mut t, "InitiatorName", INI);
    assert_eq!(
        run(t, op()).1,
        LoginStep::Failed(LoginStatus::MISSING_PARAMETER)
    );
    let mut t = Vec::new();
    push_pair(&mut t, "TargetName", TGT);
    assert_eq!(
        run(t, op()).1,
        LoginStep::Failed(LoginStatus::MISSING_PARAMETER)
    );
    let mut t = normal_text();
    push_pair(&mut t, "AuthMethod", "CHAP");
    let (rsp, step) = run(t, req(Stage::Security, Some(Stage::Operational), false));
    assert_eq!(step, LoginStep::Failed(LoginStatus::AUTH_FAILED));
    assert_eq!((rsp.status_class, rsp.status_detail), (2, 1));
    let mut t = Vec::new();
    push_pair(&mut t, "InitiatorName", INI);
    push_pair(&mut t, "TargetName", TGT);
    push_pair(&mut t, "RDMAExtensions", "No");
    assert_eq!(
        run(t, op()).1,
        LoginStep::Failed(LoginStatus::INITIATOR_ERROR)
    );
    let mut r = op();
    r.tsih = 5;
    assert_eq!(
        run(normal_text(), r).1,
        LoginStep::Failed(LoginStatus::NO_SESSION)
    );
    let mut r = op();
    r.version_min = 1;
    r.version_max = 1;
    assert_eq!(
        run(normal_text(), r).1,
        LoginStep::Failed(LoginStatus::UNSUPPORTED_VERSION)
    );
    let mut t = normal_text();
    push_pair(&mut t, "SessionType2", "x");
    t.extend_from_slice(b"SessionType=Bogus\0");
    assert!(
        matches!(run(t, op()).1, LoginStep::Failed(_)),
        "duplicate key"
    );
    let mut t = Vec::new();
    push_pair(&mut t, "InitiatorName", INI);
    push_pair(&mut t, "SessionType", "Weird");
    assert_eq!(run(t, op()).1, LoginStep::Failed(LoginStatus::SESSION_TYPE));
    assert_eq!(
        run(b"garbage".to_vec(), op()).1,
        LoginStep::Failed(LoginStatus::INITIATOR_ERROR)
    );
}

#[test]
fn unknown_keys_are_not_understood_and_stage_changes_are_checked() {
    let e = env();
    let mut l = TargetLogin::new(0);
    let mut out = Vec::new();
    let mut t = normal_text();
    push_pair(&mut t, "X-Vendor", "1");
    let (_, step) = l.on_request(&req(Stage::Operational, None, false), &t, &e, &mut out);
    assert_eq!(step, LoginStep::Continue);
    assert!(parse_text(&out)
        .unwrap()
        .contains(&("X-Vendor", "NotUnderstood")));
    // Going back to the security stage is refused.
    let (_, step) = l.on_request(
        &req(Stage::Security, Some(Stage::Operational), false),
        &[],
        &e,
        &mut out,
    );
    assert!(matches!(step, LoginStep::Failed(_)));
}

#[test]
fn discovery_sessions_need_no_target_name() {
    let e = env();
    let mut l = TargetLogin::new(0);
    let mut out = Vec::new();
    let mut t = Vec::new();
    push_pair(&mut t, "InitiatorName", INI);
    push_pair(&mut t, "SessionType", "Discovery");
    let (_, step) = l.on_request(
        &req(Stage::Operational, Some(Stage::FullFeature), false),
        &t,
        &e,
        &mut out,
    );
    let LoginStep::Done(o) = step else { panic!() };
    assert_eq!(o.session_type, SessionType::Discovery);
    assert!(!parse_text(&out)
        .unwrap()
        .iter()
        .any(|(k, _)| *k == "TargetPortalGroupTag"));
}
