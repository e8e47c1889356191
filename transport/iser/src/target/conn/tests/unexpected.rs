//! MaxOutstandingUnexpectedPDUs: declared by the target when the initiator
//! sends the key, then enforced: immediate PDUs beyond it are rejected
//! (reason 0x06); without the key nothing is limited.

use super::*;
use crate::pdu::reject_reason;

fn fixture_limit(limit: u32) -> Fx {
    fixture_with(
        true,
        TargetOptions {
            limits: TargetLimits {
                queue_depth: 4,
                max_unexpected_pdus: limit,
                ..TargetLimits::default()
            },
            max_io_bytes: 64 * 1024,
            task_buffers: 16,
        },
    )
}

impl Fx {
    fn login_declaring(&mut self, value: Option<&str>) -> Vec<(String, String)> {
        let mut t = login_text(INI, "Normal");
        if let Some(v) = value {
            push_pair(&mut t, "MaxOutstandingUnexpectedPDUs", v);
        }
        self.pdu(IserHeader::PLAIN, &login_req(&t));
        let p = self.last();
        assert!(matches!(p.bhs, Bhs::LoginRsp(r) if r.status_class == 0));
        parse_text(p.data)
            .expect("text")
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    /// Send an immediate INQUIRY (its Data-In WRITE is deferred, so it
    /// stays outstanding); returns the PDU the target answered with now.
    fn immediate_inquiry(&mut self) -> Option<Bhs> {
        self.itt += 1;
        let (hdr, v) = inquiry(self.itt, self.cmd_sn, true);
        let before = self.ops.sent.len();
        assert!(self.pdu(hdr, &v));
        self.ops
            .sent
            .get(before)
            .map(|(p, _)| Pdu::parse(p).expect("valid").bhs)
    }

    fn immediate_nop(&mut self) -> Bhs {
        self.itt += 1;
        let nop = NopOut {
            immediate: true,
            lun: Lun::default(),
            itt: self.itt,
            ttt: RESERVED_TAG,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: 0,
        };
        self.pdu(IserHeader::PLAIN, &Bhs::NopOut(nop).encode(0, 0));
        self.last().bhs
    }
}

#[test]
fn immediate_pdus_beyond_the_declared_limit_are_rejected() {
    let mut fx = fixture_limit(2);
    let keys = fx.login_declaring(Some("16"));
    // Our declaration, not the initiator's value echoed.
    assert!(keys.contains(&("MaxOutstandingUnexpectedPDUs".into(), "2".into())));
    fx.ops.defer_writes = true;
    assert_eq!(fx.immediate_inquiry(), None, "first outstanding");
    assert_eq!(fx.immediate_inquiry(), None, "second outstanding");
    assert_eq!(fx.conn.tasks_in_flight(), 2);
    // A third immediate PDU of either kind exceeds the limit.
    match fx.immediate_inquiry() {
        Some(Bhs::Reject(r)) => assert_eq!(r.reason, reject_reason::IMMEDIATE_REJECTED),
        other => panic!("expected a Reject, got {other:?}"),
    }
    match fx.immediate_nop() {
        Bhs::Reject(r) => assert_eq!(r.reason, reject_reason::IMMEDIATE_REJECTED),
        other => panic!("expected a Reject, got {other:?}"),
    }
    assert_eq!(fx.conn.stats().unexpected_rejected, 2);
    assert_eq!(fx.conn.tasks_in_flight(), 2, "the rejected one got no task");
    // Non-immediate commands are bounded by the CmdSN window, not this.
    fx.ops.defer_writes = false;
    let (rsp, _, _) = fx.cmd(&[0x00, 0, 0, 0, 0, 0], 0, None, 0);
    assert_eq!(rsp.status, 0);
    // One immediate command answers: room for one more.
    let t = fx.ops.deferred[0];
    fx.conn.data_done(t, true, &mut fx.ops);
    assert!(matches!(fx.immediate_nop(), Bhs::NopIn(_)));
    assert!(!fx.ops.closed);
}

#[test]
fn without_the_key_immediate_pdus_are_not_limited() {
    let mut fx = fixture_limit(2);
    let keys = fx.login_declaring(None);
    assert!(
        !keys
            .iter()
            .any(|(k, _)| k == "MaxOutstandingUnexpectedPDUs"),
        "never volunteered (open-iscsi refuses unknown keys)"
    );
    fx.ops.defer_writes = true;
    for _ in 0..3 {
        assert_eq!(fx.immediate_inquiry(), None);
    }
    assert!(matches!(fx.immediate_nop(), Bhs::NopIn(_)));
    assert_eq!(fx.conn.stats().unexpected_rejected, 0);
}
