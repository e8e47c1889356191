//! Tests of the soft provider's fast paths against the behaviour of the
//! general path: two-SGE receives filled straight from the ring, the
//! two-entry local key cache across MR changes, and idle polls that look
//! at the peer's words only every few steps.

#![allow(clippy::unwrap_used)]

use crate::conformance::{Fixture, Pair, SoftFixture};
use crate::provider::{CompletionQueue, MemoryRegion, ProtectionDomain};
use crate::types::{
    Access, QpAttr, QpCaps, QpState, RemoteAddr, Sge, Wc, WcOpcode, WcStatus, WrId,
};
use crate::wr::{RecvWr, SendOp, SendWr};
use crate::QueuePair;

type F = SoftFixture;
const F: SoftFixture = SoftFixture::new("pollux-softfast");

fn caps() -> QpCaps {
    QpCaps {
        max_recv_sge: 2,
        ..QpCaps::default()
    }
}

/// Post a SEND of `data` (from offset 0 of a's MR) and wait for b's
/// receive completion and a's send completion.
fn send_and_wait(p: &Pair<F>, data: &[u8]) -> (Wc, Wc) {
    p.a.fill(0, data);
    let s = [p.a.sge(0, data.len() as u32)];
    p.a.qp
        .post_send(&[SendWr::new(WrId(9), SendOp::Send, &s).signaled()])
        .unwrap();
    p.until(|p| !p.a.swc.borrow().is_empty() && !p.b.rwc.borrow().is_empty());
    (p.b.take_rwc()[0], p.a.take_swc()[0])
}

#[test]
fn two_sge_receive_scatters_over_two_mrs() {
    let p = Pair::connect(&F, caps(), 1 << 16);
    let arena2 = F.arena(1 << 16);
    let mr2 =
        p.b.pd
            .reg_mr(&arena2, 0, 1 << 16, Access::LOCAL_WRITE)
            .unwrap();
    let second = |off: u64, len: u32| Sge {
        addr: mr2.addr() + off,
        length: len,
        lkey: mr2.lkey(),
    };
    let msg: Vec<u8> = (0..100u8).collect();
    for (id, first_len) in [(1u64, 60u32), (2, 100), (3, 7)] {
        let sg = [
            p.b.sge(1024 * id as usize, first_len),
            second(1024 * id, 128),
        ];
        p.b.qp
            .post_recv(&[RecvWr {
                wr_id: WrId(id),
                sg_list: &sg,
            }])
            .unwrap();
        let (r, s) = send_and_wait(&p, &msg);
        assert_eq!(
            (r.wr_id, r.status, r.byte_len),
            (WrId(id), WcStatus::Success, 100)
        );
        assert_eq!(s.status, WcStatus::Success);
        let k = first_len as usize;
        assert_eq!(p.b.read(1024 * id as usize, k), msg[..k]);
        let mut got = vec![0u8; 100 - k];
        arena2.copy_out(1024 * id as usize, &mut got).unwrap();
        assert_eq!(got, msg[k..], "second SGE of receive {id}");
        // Nothing past the message in the second SGE.
        let mut after = [0u8; 4];
        arena2
            .copy_out(1024 * id as usize + 100 - k, &mut after)
            .unwrap();
        assert_eq!(after, [0; 4]);
    }
}

#[test]
fn two_sge_receive_too_small_is_a_length_error_and_writes_nothing() {
    let p = Pair::connect(&F, caps(), 1 << 16);
    let sg = [p.b.sge(0, 16), p.b.sge(4096, 16)];
    p.b.qp
        .post_recv(&[RecvWr {
            wr_id: WrId(1),
            sg_list: &sg,
        }])
        .unwrap();
    let (r, s) = send_and_wait(&p, &[0xab; 64]);
    assert_eq!((r.wr_id, r.status), (WrId(1), WcStatus::LocLenErr));
    assert_eq!(s.status, WcStatus::RemInvReqErr);
    assert_eq!(p.b.read(0, 16), [0; 16]);
    assert_eq!(p.b.read(4096, 16), [0; 16]);
}

#[test]
fn key_cache_forgets_a_freed_mr() {
    let p = Pair::connect(&F, QpCaps::default(), 1 << 16);
    let arena2 = F.arena(1 << 16);
    let mr2 = p.a.pd.reg_mr(&arena2, 0, 4096, Access::NONE).unwrap();
    let s2 = [Sge {
        addr: mr2.addr(),
        length: 8,
        lkey: mr2.lkey(),
    }];
    let s1 = [p.a.sge(0, 8)];
    // Alternate the two keys so both sit in the cache.
    for i in 0..6u64 {
        let s = if i % 2 == 0 { &s1 } else { &s2 };
        p.b.qp
            .post_recv(&[RecvWr {
                wr_id: WrId(i),
                sg_list: &[p.b.sge(0, 64)],
            }])
            .unwrap();
        p.a.qp
            .post_send(&[SendWr::new(WrId(i), SendOp::Send, s).signaled()])
            .unwrap();
        p.until(|p| !p.a.swc.borrow().is_empty());
        assert_eq!(p.a.take_swc()[0].status, WcStatus::Success);
    }
    drop(mr2);
    p.a.qp
        .post_send(&[SendWr::new(WrId(7), SendOp::Send, &s2).signaled()])
        .unwrap();
    p.until(|p| !p.a.swc.borrow().is_empty());
    let w = p.a.take_swc()[0];
    assert_eq!((w.wr_id, w.status), (WrId(7), WcStatus::LocProtErr));
}

#[test]
fn idle_qp_learns_of_the_peer_error_within_a_few_polls() {
    let p = Pair::connect(&F, QpCaps::default(), 1 << 16);
    p.b.qp
        .post_recv(&[RecvWr {
            wr_id: WrId(1),
            sg_list: &[p.b.sge(0, 64)],
        }])
        .unwrap();
    for _ in 0..100 {
        p.poll();
    }
    p.a.qp.modify(&QpAttr::to(QpState::Err)).unwrap();
    let mut wc = [Wc::default(); 4];
    let mut got = Vec::new();
    let mut polls = 0;
    while p.b.qp.state() != QpState::Err {
        let n = p.b.rcq.poll(&mut wc).unwrap();
        got.extend_from_slice(&wc[..n]);
        polls += 1;
        assert!(polls <= 2 * super::qp::SLOW_CHECK_EVERY, "{polls} polls");
    }
    let n = p.b.rcq.poll(&mut wc).unwrap();
    got.extend_from_slice(&wc[..n]);
    // The receive is flushed, not completed.
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (got[0].wr_id, got[0].status),
        (WrId(1), WcStatus::WrFlushErr)
    );
}

#[test]
fn direct_write_then_send_completes_in_order_and_a_bad_rkey_still_fails() {
    let p = Pair::connect(&F, QpCaps::default(), 1 << 16);
    p.b.qp
        .post_recv(&[RecvWr {
            wr_id: WrId(5),
            sg_list: &[p.b.sge(0, 64)],
        }])
        .unwrap();
    let data: Vec<u8> = (0..200u8).rev().collect();
    p.a.fill(4096, &data);
    p.a.fill(0, b"after the write");
    let w = [p.a.sge(4096, 200)];
    let s = [p.a.sge(0, 15)];
    let to = RemoteAddr {
        addr: p.b.addr(8192),
        rkey: p.b.mr.rkey(),
    };
    p.a.qp
        .post_send(&[
            SendWr::new(WrId(1), SendOp::RdmaWrite { remote: to }, &w).signaled(),
            SendWr::new(WrId(2), SendOp::Send, &s).signaled(),
        ])
        .unwrap();
    p.until(|p| p.a.swc.borrow().len() == 2 && !p.b.rwc.borrow().is_empty());
    // The WRITE's data is there when the SEND that follows it arrives.
    assert_eq!(p.b.read(8192, 200), data);
    assert_eq!(p.b.read(0, 15), b"after the write");
    let c = p.a.take_swc();
    assert_eq!(
        c.iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
            .collect::<Vec<_>>(),
        [
            (WrId(1), WcStatus::Success, WcOpcode::RdmaWrite, 200),
            (WrId(2), WcStatus::Success, WcOpcode::Send, 15),
        ]
    );
    // A WRITE the fast path refuses (bad rkey) fails as before.
    let bad = RemoteAddr {
        addr: p.b.addr(8192),
        rkey: p.b.mr.rkey() ^ 0x100,
    };
    p.a.qp
        .post_send(&[SendWr::new(WrId(3), SendOp::RdmaWrite { remote: bad }, &w).signaled()])
        .unwrap();
    p.until(|p| !p.a.swc.borrow().is_empty());
    let e = p.a.take_swc()[0];
    assert_eq!((e.wr_id, e.status), (WrId(3), WcStatus::RemAccessErr));
}

/// Remote keys of the peer's regular MRs cached on a's link.
fn cached_rkeys(p: &Pair<F>) -> usize {
    p.a.qp.0.link.borrow().as_ref().map_or(0, |l| l.rkeys.len())
}

/// Post one signaled WR on a and return its completion status.
fn post_one(p: &Pair<F>, wr: SendWr<'_>) -> WcStatus {
    p.a.qp.post_send(&[wr]).unwrap();
    p.until(|p| !p.a.swc.borrow().is_empty());
    p.a.take_swc()[0].status
}

#[test]
fn remote_key_cache_serves_writes_and_reads_and_forgets_a_deregistered_mr() {
    let p = Pair::connect(&F, QpCaps::default(), 1 << 16);
    let arena2 = F.arena(1 << 16);
    let mr2 =
        p.b.pd
            .reg_mr(
                &arena2,
                0,
                1 << 16,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            )
            .unwrap();
    let at = |off: u64| RemoteAddr {
        addr: mr2.addr() + off,
        rkey: mr2.rkey(),
    };
    let w = [p.a.sge(0, 64)];
    for i in 0..4u8 {
        p.a.fill(0, &[i + 1; 64]);
        let wr = SendWr::new(WrId(1), SendOp::RdmaWrite { remote: at(128) }, &w).signaled();
        assert_eq!(post_one(&p, wr), WcStatus::Success);
        let mut got = [0u8; 64];
        arena2.copy_out(128, &mut got).unwrap();
        assert_eq!(got, [i + 1; 64], "write {i}");
    }
    assert_eq!(cached_rkeys(&p), 1, "the MR's key is cached after a write");
    // A READ through the cached key.
    arena2.copy_in(4096, &[0x5a; 32]).unwrap();
    let r = [p.a.sge(8192, 32)];
    let wr = SendWr::new(WrId(2), SendOp::RdmaRead { remote: at(4096) }, &r).signaled();
    assert_eq!(post_one(&p, wr), WcStatus::Success);
    assert_eq!(p.a.read(8192, 32), [0x5a; 32]);
    // Out of bounds and missing rights fail even with the key cached.
    let wr = SendWr::new(
        WrId(3),
        SendOp::RdmaWrite {
            remote: at((1 << 16) - 32),
        },
        &w,
    )
    .signaled();
    assert_eq!(post_one(&p, wr), WcStatus::RemAccessErr);
    drop(p);
    let p = Pair::connect(&F, QpCaps::default(), 1 << 16);
    let (w, r) = ([p.a.sge(0, 64)], [p.a.sge(8192, 32)]);
    let ro =
        p.b.pd
            .reg_mr(&arena2, 0, 4096, Access::REMOTE_READ)
            .unwrap();
    let to_ro = RemoteAddr {
        addr: ro.addr(),
        rkey: ro.rkey(),
    };
    let rd = SendWr::new(WrId(4), SendOp::RdmaRead { remote: to_ro }, &r).signaled();
    assert_eq!(post_one(&p, rd), WcStatus::Success);
    assert_eq!(cached_rkeys(&p), 1);
    let wr = SendWr::new(WrId(5), SendOp::RdmaWrite { remote: to_ro }, &w).signaled();
    assert_eq!(post_one(&p, wr), WcStatus::RemAccessErr);
    // Deregistered: the next WR naming the key fails.
    drop(p);
    let p = Pair::connect(&F, QpCaps::default(), 1 << 16);
    let w = [p.a.sge(0, 64)];
    let mr3 =
        p.b.pd
            .reg_mr(&arena2, 0, 4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
    let to3 = RemoteAddr {
        addr: mr3.addr(),
        rkey: mr3.rkey(),
    };
    let wr = SendWr::new(WrId(6), SendOp::RdmaWrite { remote: to3 }, &w).signaled();
    assert_eq!(post_one(&p, wr), WcStatus::Success);
    assert_eq!(cached_rkeys(&p), 1);
    drop(mr3);
    let wr = SendWr::new(WrId(7), SendOp::RdmaWrite { remote: to3 }, &w).signaled();
    assert_eq!(post_one(&p, wr), WcStatus::RemAccessErr);
}

#[test]
fn remote_key_cache_notices_the_same_key_registered_again_elsewhere() {
    let p = Pair::connect(&F, QpCaps::default(), 1 << 16);
    let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::ZERO_BASED;
    let old = F.arena(1 << 16);
    let mr = p.b.pd.reg_mr(&old, 0, 4096, rights).unwrap();
    let key = mr.rkey();
    let to = RemoteAddr { addr: 0, rkey: key };
    let w = [p.a.sge(0, 16)];
    p.a.fill(0, &[1; 16]);
    let wr = SendWr::new(WrId(1), SendOp::RdmaWrite { remote: to }, &w).signaled();
    assert_eq!(post_one(&p, wr), WcStatus::Success);
    assert_eq!(cached_rkeys(&p), 1);
    // Free the entry and register other memory until the same key value
    // comes back (the consumer byte wraps after 256 registrations).
    let new = F.arena(1 << 16);
    // One MR keeps `new` registered throughout, so the churn below ships
    // its arena to the peer once (the last MR over an arena going sends
    // the peer an unmap, and registering it again ships it again).
    let _hold = p.b.pd.reg_mr(&new, 4096, 4096, rights).unwrap();
    drop(mr);
    let mut again = None;
    for _ in 0..300 {
        let m = p.b.pd.reg_mr(&new, 0, 4096, rights).unwrap();
        if m.rkey() == key {
            again = Some(m);
            break;
        }
    }
    let _again = again.expect("the key value came back");
    p.a.fill(0, &[2; 16]);
    let wr = SendWr::new(WrId(2), SendOp::RdmaWrite { remote: to }, &w).signaled();
    assert_eq!(post_one(&p, wr), WcStatus::Success);
    let (mut in_old, mut in_new) = ([0u8; 16], [0u8; 16]);
    old.copy_out(0, &mut in_old).unwrap();
    new.copy_out(0, &mut in_new).unwrap();
    assert_eq!(
        in_new, [2; 16],
        "the write went to the memory the key names now"
    );
    assert_eq!(in_old, [1; 16], "not to the memory it named before");
}
