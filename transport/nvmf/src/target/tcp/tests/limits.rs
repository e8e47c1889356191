//! `max_qpairs`: with room for two connections, a host's admin and I/O
//! queues take both seats; a third connection gets its ICResp, then
//! Connect Controller Busy for its Connect, and the target closes it,
//! while the host's I/O goes on. When the host drops its I/O queue, the
//! seat comes back and the next connection is served.

use pollux_reactor::mem::{BufPool, BufPoolOptions};

use super::raw::{connect_cmd, Raw};
use super::*;
use crate::host::test_io::write_read_verify;
use crate::host::{Controller, CtrlOptions};
use crate::spec::cpl::{NvmeCompletion, NvmeStatus};
use crate::spec::sgl::SglDescriptor;
use crate::spec::tcp::{Digests, PduType};

/// A new connection's admin Connect and its completion.
fn connect_admin(f: &Fx) -> (Raw, NvmeCompletion) {
    connect_admin_with(f, Digests::default())
}

/// The same with `digests` asked for (and granted).
fn connect_admin_with(f: &Fx, digests: Digests) -> (Raw, NvmeCompletion) {
    let mut r = Raw::handshake(f, digests);
    let p = r.admin_connect();
    r.send(&p);
    let rsp = r.pdu(f);
    assert_eq!(rsp[0], PduType::CapsuleResp.code(), "not a CapsuleResp");
    let hdgst = if digests.header { 4 } else { 0 };
    assert_eq!(
        rsp.len(),
        24 + hdgst,
        "CapsuleResp length with the granted digests"
    );
    let cpl = NvmeCompletion::parse(&rsp[8..24]).unwrap();
    (r, cpl)
}

/// A target with `max_qpairs` 1 and the connection that holds it.
fn full_at_one() -> (Fx, Raw) {
    let f = fixture(TcpOptions {
        max_qpairs: 1,
        ..TcpOptions::default()
    });
    let (first, cpl) = connect_admin(&f);
    assert!(cpl.status.is_success(), "{cpl:?}");
    (f, first)
}

/// Poll the cluster until `done` (bounded: the caller asserts after).
fn poll_until(f: &Fx, done: impl Fn() -> bool) {
    for _ in 0..200_000 {
        if done() {
            return;
        }
        f.cl.poll_once_all();
    }
}

/// Connect, expect Controller Busy and the target's close.
fn expect_refused(f: &Fx) {
    let (mut r, cpl) = connect_admin(f);
    assert_eq!(cpl.status, NvmeStatus::CONNECT_CONTROLLER_BUSY, "{cpl:?}");
    assert!(r.try_recv(f, 1).is_none(), "the refused socket stays open");
}

#[test]
fn a_connection_beyond_max_qpairs_is_refused_busy_and_its_seat_comes_back() {
    let f = fixture(TcpOptions {
        max_qpairs: 2,
        ..TcpOptions::default()
    });
    let t = f.host(false, false);
    let (c, mut qp) = f.cl.on(0, |_| {
        let c = Controller::connect(&t, who(), CtrlOptions::default()).unwrap();
        let qp = c.connect_io(&t, 1, 16, None).unwrap();
        (c, qp)
    });
    assert_eq!(f.transport.queues_per_group(), [2]);

    expect_refused(&f);
    let st = f.transport.stats();
    assert_eq!((st.accepted, st.refused, st.refused_at_limit), (2, 1, 1));
    assert_eq!(f.pgs[0].connections(), 2);

    // The host's queues keep working.
    let pool = BufPool::new(BufPoolOptions::new("tcp-limit-test", 4096, 8)).unwrap();
    let bad =
        f.cl.on(0, |r| write_read_verify(r, &mut qp, &pool, 4096, 8));
    assert_eq!(bad, 0);

    // The I/O queue goes: its seat is free again.
    f.cl.on(0, |_| drop(qp));
    poll_until(&f, || f.transport.queues_per_group() == [1]);
    assert_eq!(f.transport.queues_per_group(), [1]);
    let (second, cpl) = connect_admin(&f);
    assert!(cpl.status.is_success(), "{cpl:?}");
    assert_eq!(f.transport.queues_per_group(), [2]);
    // Full again.
    expect_refused(&f);
    assert_eq!(f.transport.stats().refused_at_limit, 2);

    drop(second);
    f.cl.on(0, |_| drop(c));
    f.settle();
    assert_eq!(f.transport.queues_per_group(), [0]);
    f.assert_pool_full();
}

#[test]
fn zero_limits_are_refused_by_the_transport() {
    let target = Target::new(target_options()).unwrap();
    for o in [
        TcpOptions {
            max_qpairs: 0,
            ..TcpOptions::default()
        },
        TcpOptions {
            max_qpairs_per_core: 0,
            ..TcpOptions::default()
        },
    ] {
        let e = TcpTransport::new(&target, o).unwrap_err().to_string();
        assert!(e.contains("max_qpairs"), "{e}");
    }
}

#[test]
fn max_qpairs_per_core_spreads_then_refuses() {
    let f = fixture_on(
        2,
        "127.0.0.1",
        TcpOptions {
            max_qpairs_per_core: 1,
            ..TcpOptions::default()
        },
    );
    let mut held = Vec::new();
    for _ in 0..2 {
        let (r, cpl) = connect_admin(&f);
        assert!(cpl.status.is_success(), "{cpl:?}");
        held.push(r);
    }
    assert_eq!(f.transport.queues_per_group(), [1, 1]);
    expect_refused(&f);
    assert_eq!(f.transport.stats().refused_at_limit, 1);
    drop(held);
    f.settle();
    assert_eq!(f.transport.queues_per_group(), [0, 0]);
}

#[test]
fn a_refused_host_that_leaves_early_is_let_go() {
    let (f, _first) = full_at_one();
    // Connects, is refused on accept, and goes before sending its ICReq.
    let quiet = Raw::connect(&f);
    poll_until(&f, || f.pgs[0].refusing() == 1);
    assert_eq!(f.pgs[0].refusing(), 1);
    drop(quiet);
    poll_until(&f, || f.pgs[0].refusing() == 0);
    assert_eq!(f.pgs[0].refusing(), 0, "the refused socket is held");
    assert_eq!(f.transport.queues_per_group(), [1]);
}

#[test]
fn a_refusal_speaks_the_digests_it_granted() {
    let (f, _first) = full_at_one();
    let both = Digests {
        header: true,
        data: true,
    };
    let (mut r, cpl) = connect_admin_with(&f, both);
    assert_eq!(cpl.status, NvmeStatus::CONNECT_CONTROLLER_BUSY, "{cpl:?}");
    assert!(r.try_recv(&f, 1).is_none(), "the refused socket stays open");
}

/// A TCP transport shallower than the target: its controllers report the
/// transport's depth (CAP.MQES + 1 and MAXCMD, what Linux's host sizes its
/// I/O queues by), and an I/O queue that deep connects. The target's own
/// depth (128) was reported, so a host asking for it was refused. Below 32
/// the admin queue still takes the 32 entries Linux's host asks for (its
/// Connect was refused), and an I/O queue deeper than the limit is not.
#[test]
fn controllers_report_the_transports_queue_depth() {
    for depth in [32u16, 16] {
        let f = fixture(TcpOptions {
            max_queue_depth: depth,
            ..TcpOptions::default()
        });
        assert_eq!(f.target.options().max_queue_depth, 128);
        let t = f.host(false, false);
        f.cl.on(0, |_| {
            let c = Controller::connect(&t, who(), CtrlOptions::default()).unwrap();
            let info = c.info();
            assert_eq!((info.cap.mqes, info.ident.maxcmd), (depth - 1, depth));
            assert_eq!(info.max_io_entries(), depth);
            let qp = c.connect_io(&t, 1, depth, None).unwrap();
            drop(qp);
            drop(c);
        });
        f.settle();
    }
}

/// With the I/O queue limit at 16, an I/O queue's Connect for 32 entries
/// (the admin queue's depth) is refused with an invalid SQSIZE.
#[test]
fn an_io_queue_deeper_than_the_transport_is_refused() {
    let f = fixture(TcpOptions {
        max_queue_depth: 16,
        ..TcpOptions::default()
    });
    let t = f.host(false, false);
    let c = f.cl.on(0, |_| {
        Controller::connect(&t, who(), CtrlOptions::default()).unwrap()
    });
    let cntlid = c.info().cntlid;
    for (entries, ok) in [(32u16, false), (17, false), (16, true)] {
        let mut r = Raw::handshake(&f, Digests::default());
        let (mut cmd, data) = connect_cmd(1, cntlid, SglDescriptor::in_capsule(0, 1024));
        // CDW11 bits 15:0: SQSIZE, 0's based.
        cmd.cdw11 = (cmd.cdw11 & !0xFFFF) | u32::from(entries - 1);
        let p = r.capsule(&cmd, &data);
        r.send(&p);
        let rsp = r.pdu(&f);
        let cpl = NvmeCompletion::parse(&rsp[8..24]).unwrap();
        assert_eq!(cpl.status.is_success(), ok, "{entries} entries: {cpl:?}");
    }
    f.cl.on(0, |_| drop(c));
    f.settle();
}
