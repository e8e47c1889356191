//! Soft-provider fault injection: a stalled CQ, a starved SRQ and a torn
//! inbound ring (what a peer crashing mid-write could leave). The survivor
//! never hangs, never reads out of bounds, and loses nothing that was not
//! flushed with an error. Waits are bounded by poll counts, not time.

#![allow(clippy::unwrap_used, clippy::panic)]

use pollux_verbs::conformance::{Fixture, Pair, SoftFixture};
use pollux_verbs::soft::fault::{self, Fault};
use pollux_verbs::*;

const SOFT: SoftFixture = SoftFixture::new("pollux-fault");

fn recv(p: &Pair<SoftFixture>, id: u64, off: usize) {
    let s = [p.b.sge(off, 256)];
    p.b.qp
        .post_recv(&[RecvWr {
            wr_id: WrId(id),
            sg_list: &s,
        }])
        .unwrap();
}

fn send(p: &Pair<SoftFixture>, id: u64, data: &[u8]) {
    p.a.fill(0, data);
    let s = [p.a.sge(0, data.len() as u32)];
    p.a.qp
        .post_send(&[SendWr::new(WrId(id), SendOp::Send, &s).signaled()])
        .unwrap();
}

#[test]
fn stalled_cq_delays_but_loses_nothing() {
    let p = Pair::connect(&SOFT, QpCaps::default(), 1 << 20);
    recv(&p, 1, 4096);
    fault::stall_cq(&p.b.rcq, 10);
    send(&p, 2, b"stalled");
    let mut wc = [Wc::default(); 4];
    for _ in 0..10 {
        assert_eq!(
            p.b.rcq.poll(&mut wc).unwrap(),
            0,
            "a stalled CQ yields nothing"
        );
        let _ = p.a.scq.poll(&mut wc).unwrap();
    }
    assert_eq!(p.b.rcq.poll(&mut wc).unwrap(), 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].byte_len),
        (WrId(1), WcStatus::Success, 7)
    );
    assert_eq!(p.b.read(4096, 7), b"stalled");
    p.until(|p| !p.a.swc.borrow().is_empty());
    assert_eq!(p.a.take_swc()[0].status, WcStatus::Success);
}

#[test]
fn starved_srq_is_rnr_then_delivers() {
    // Side b: a QP on an SRQ, connected to a plain endpoint a.
    let f = SOFT;
    let a =
        pollux_verbs::conformance::Endpoint::<SoftFixture>::new(&f, QpCaps::default(), 1 << 16, 64);
    let dev = f.open();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    let srq = pd.create_srq(16, 1).unwrap();
    let qp = pd
        .create_qp(&QpInit {
            send_cq: &cq,
            recv_cq: &cq,
            srq: Some(&srq),
            caps: QpCaps::default(),
            sq_sig_all: false,
        })
        .unwrap();
    let arena = f.arena(1 << 16);
    let mr = pd.reg_mr(&arena, 0, 1 << 16, Access::LOCAL_WRITE).unwrap();
    let addr = f.listen_addr();
    let l = dev.listen(&addr, 4).unwrap();
    let ida = a
        .dev
        .connect(&addr, &a.qp, &ConnParam::with_data(b""))
        .unwrap();
    let idb = pollux_verbs::conformance::spin(|| l.get_request().unwrap()).unwrap();
    idb.accept(&qp, &ConnParam::with_data(b"")).unwrap();
    pollux_verbs::conformance::spin(|| ida.get_event().unwrap()).unwrap();
    let s = [Sge {
        addr: mr.addr(),
        length: 256,
        lkey: mr.lkey(),
    }];
    srq.post_recv(&[RecvWr {
        wr_id: WrId(7),
        sg_list: &s,
    }])
    .unwrap();
    fault::starve_srq(&srq, 50);
    a.fill(0, b"hungry");
    let g = [a.sge(0, 6)];
    a.qp.post_send(&[SendWr::new(WrId(1), SendOp::Send, &g).signaled()])
        .unwrap();
    let mut wc = [Wc::default(); 4];
    for _ in 0..50 {
        assert_eq!(cq.poll(&mut wc).unwrap(), 0, "starved SRQ: RNR, no receive");
        assert_eq!(a.scq.poll(&mut wc).unwrap(), 0, "the SEND is not acked yet");
    }
    assert_eq!(cq.poll(&mut wc).unwrap(), 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].byte_len),
        (WrId(7), WcStatus::Success, 6)
    );
    let mut got = [0u8; 6];
    arena.copy_out(0, &mut got).unwrap();
    assert_eq!(&got, b"hungry");
    let w = pollux_verbs::conformance::spin(|| {
        let n = a.scq.poll(&mut wc).unwrap();
        (n == 1).then_some(wc[0])
    })
    .unwrap();
    assert_eq!((w.wr_id, w.status), (WrId(1), WcStatus::Success));
}

#[test]
fn torn_ring_fails_the_qp_without_hanging() {
    let p = Pair::connect(&SOFT, QpCaps::default(), 1 << 20);
    recv(&p, 1, 0);
    recv(&p, 2, 4096);
    send(&p, 10, b"first");
    p.until(|p| !p.b.rwc.borrow().is_empty());
    assert_eq!(p.b.take_rwc()[0].status, WcStatus::Success);
    // The peer "dies" leaving an impossible tail behind.
    fault::inject(p.b.id.as_ref().unwrap(), &p.b.qp, Fault::TearInboundRing);
    p.until(|p| p.b.qp.state() == QpState::Err);
    let mut ev = Vec::new();
    while let Some(e) = p.b.dev.poll_async_event() {
        ev.push(e);
    }
    assert!(
        ev.contains(&AsyncEvent::QpFatal {
            qp_num: p.b.qp.qp_num()
        }),
        "{ev:?}"
    );
    // The pending receive flushes; the requester learns of it and flushes too.
    p.until(|p| !p.b.rwc.borrow().is_empty());
    let w = p.b.take_rwc()[0];
    assert_eq!((w.wr_id, w.status), (WrId(2), WcStatus::WrFlushErr));
    send(&p, 11, b"lost");
    p.until(|p| p.a.qp.state() == QpState::Err && !p.a.swc.borrow().is_empty());
    assert!(p
        .a
        .take_swc()
        .iter()
        .all(|w| w.status != WcStatus::Success || w.wr_id == WrId(10)));
    // The memory outside what was delivered is untouched.
    assert_eq!(p.b.read(4096, 4), [0; 4]);
}
