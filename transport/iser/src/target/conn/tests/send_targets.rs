//! A SendTargets answer longer than one PDU may carry goes out in several
//! Text Responses (RFC 7143 §11.11: C bit and a Target Transfer Tag; the
//! initiator asks for the rest with that tag), not cut short.

use super::*;

/// A discovery login that declares InitiatorRecvDataSegmentLength `dsl`.
fn discovery_with_dsl(fx: &mut Fx, dsl: u32) {
    let mut t = Vec::new();
    push_pair(&mut t, "InitiatorName", INI);
    push_pair(&mut t, "SessionType", "Discovery");
    SessionParams::initiator_offer(&mut t, dsl, 1 << 20, 65536);
    fx.pdu(IserHeader::PLAIN, &login_req(&t));
    assert!(fx.conn.is_full_feature());
}

fn text_req(fx: &mut Fx, itt: u32, ttt: u32, data: &[u8]) -> (TextPdu, Vec<u8>) {
    let tp = TextPdu {
        immediate: false,
        final_: true,
        itt,
        ttt,
        sn: fx.cmd_sn,
        ..Default::default()
    };
    fx.cmd_sn = fx.cmd_sn.wrapping_add(1);
    let mut v = Bhs::TextReq(tp).encode(0, data.len() as u32).to_vec();
    v.extend_from_slice(data);
    assert!(fx.pdu(IserHeader::PLAIN, &v));
    let p = fx.last();
    let Bhs::TextRsp(r) = p.bhs else {
        panic!("no Text Response: {:?}", p.bhs);
    };
    (r, p.data.to_vec())
}

#[test]
fn a_long_send_targets_answer_continues_over_several_responses() {
    let mut fx = fixture(false);
    let names: Vec<String> = (0..20)
        .map(|i| format!("iqn.2024-01.io.pollux:a-rather-long-target-name-{i:03}"))
        .collect();
    for n in &names {
        fx.target
            .add_node(TargetNode {
                name: n.clone(),
                alias: None,
                luns: Vec::new(),
                allowed_initiators: Vec::new(),
                portal_groups: vec![1],
            })
            .expect("node");
    }
    discovery_with_dsl(&mut fx, 512);
    let mut q = Vec::new();
    push_pair(&mut q, "SendTargets", "All");
    let (mut r, mut all) = text_req(&mut fx, 9, RESERVED_TAG, &q);
    let mut pdus = 1;
    while !r.final_ {
        assert!(r.cont, "F=0 without C");
        assert_ne!(r.ttt, RESERVED_TAG, "a continued answer names its TTT");
        let (n, d) = text_req(&mut fx, 9, r.ttt, &[]);
        assert!(d.len() <= 512);
        all.extend_from_slice(&d);
        r = n;
        pdus += 1;
        assert!(pdus < 100);
    }
    assert_eq!(r.ttt, RESERVED_TAG);
    assert!(pdus > 1, "{} bytes in one PDU", all.len());
    // TargetName repeats (one per target): split the pairs by hand.
    let pairs: Vec<&[u8]> = all.split(|&b| b == 0).filter(|p| !p.is_empty()).collect();
    assert_eq!(all.last(), Some(&0), "the answer ends a pair");
    for n in &names {
        let want = format!("TargetName={n}");
        assert!(pairs.contains(&want.as_bytes()), "{n} missing");
    }
    // A continuation with a tag the target did not give is refused.
    let (n, _) = text_req(&mut fx, 10, RESERVED_TAG, &q);
    assert!(n.cont);
    let tp = TextPdu {
        final_: true,
        itt: 10,
        ttt: n.ttt.wrapping_add(1),
        sn: fx.cmd_sn,
        ..Default::default()
    };
    fx.pdu(IserHeader::PLAIN, &Bhs::TextReq(tp).encode(0, 0));
    assert!(matches!(fx.last().bhs, Bhs::Reject(_)));
}

/// `SendTargets=<target name>` answers for that target only (nothing for
/// an unknown one), and on a normal session `SendTargets=` (no value)
/// answers for the session's target (RFC 7143 Appendix D); neither is
/// NotUnderstood.
#[test]
fn send_targets_for_one_target_and_for_the_session_target() {
    let mut fx = fixture(false);
    fx.target
        .add_node(TargetNode {
            name: "iqn.2024-01.io.pollux:other".into(),
            alias: None,
            luns: Vec::new(),
            allowed_initiators: Vec::new(),
            portal_groups: vec![1],
        })
        .expect("node");
    discovery_with_dsl(&mut fx, 8192);
    let ask = |fx: &mut Fx, itt: u32, v: &str| {
        let mut q = Vec::new();
        push_pair(&mut q, "SendTargets", v);
        let (r, d) = text_req(fx, itt, RESERVED_TAG, &q);
        assert!(r.final_);
        String::from_utf8(d).expect("utf-8")
    };
    assert_eq!(
        ask(&mut fx, 1, TGT),
        format!("TargetName={TGT}\0TargetAddress=@t,1\0")
    );
    assert_eq!(ask(&mut fx, 2, "iqn.2024-01.io.pollux:nope"), "");
    let mut fx = fixture(false);
    assert!(fx.login(INI, "Normal").is_some_and(|r| r.status_class == 0));
    fx.cmd_sn = 1;
    let mut q = Vec::new();
    push_pair(&mut q, "SendTargets", "");
    let (_, d) = text_req(&mut fx, 3, RESERVED_TAG, &q);
    assert_eq!(
        d,
        format!("TargetName={TGT}\0TargetAddress=@t,1\0").into_bytes()
    );
}
