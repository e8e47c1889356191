//! Host core ↔ target core through the in-process loopback transport.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use pollux_bdev::BdevRegistry;
use pollux_reactor::mem::{DmaBuf, SgList};
use pollux_reactor::{Reactor, TestCluster};

use super::loopback::LoopbackHost;
use super::*;
use crate::spec::transport_id::TransportId;
use crate::target::{LoopbackTransport, NamespaceConfig, SubsystemConfig, Target, TargetOptions};

const SUB: &str = "nqn.2024-01.io.pollux:hostcore";
const HOST: &str = "nqn.2024-01.io.pollux:host";

struct Fx {
    cluster: TestCluster,
    target: Arc<Target>,
    lt: Arc<LoopbackTransport>,
    trid: TransportId,
    _reg: BdevRegistry,
}

fn fx() -> Fx {
    let cluster = TestCluster::new(1);
    let target = Target::new(TargetOptions::for_tests()).unwrap();
    let lt = LoopbackTransport::new();
    target.add_transport(lt.clone()).unwrap();
    let trid = TransportId::loopback("hostcore");
    target.add_listener(trid.clone()).unwrap();
    let reg = BdevRegistry::new();
    let sub = target.add_subsystem(SubsystemConfig::new(SUB)).unwrap();
    let bdev = reg.create("malloc:size=1M,block=512,name=hm1").unwrap();
    sub.add_namespace(NamespaceConfig::new(bdev).with_nsid(1))
        .unwrap();
    Fx {
        cluster,
        target,
        lt,
        trid,
        _reg: reg,
    }
}

fn who(subnqn: &str) -> HostIdentity {
    HostIdentity {
        hostnqn: HOST.into(),
        hostid: *b"0123456789abcdef",
        subnqn: subnqn.into(),
    }
}

fn opts() -> CtrlOptions {
    CtrlOptions {
        io_queues: 2,
        timeout: Duration::from_secs(5),
        ..CtrlOptions::default()
    }
}

fn host(f: &Fx, r: &Reactor) -> LoopbackHost {
    LoopbackHost::new(f.lt.clone(), f.target.clone(), r.clone(), f.trid.clone())
}

fn buf(len: usize, byte: u8) -> SgList {
    let mut b = DmaBuf::alloc(len).unwrap();
    b.as_mut_slice().fill(byte);
    SgList::from_buf(b)
}

/// Run `qp` until `n` completions arrived, pumping the reactor.
fn reap<Q: HostQueue>(r: &Reactor, qp: &mut Qpair<Q>, n: usize) -> Vec<Completion> {
    let mut out = Vec::new();
    for _ in 0..100_000 {
        qp.poll(&mut |c| out.push(c));
        if out.len() >= n {
            return out;
        }
        r.poll_once();
    }
    panic!("only {} of {n} completions", out.len());
}

#[test]
fn connect_identify_and_io_round_trip() {
    let f = fx();
    f.cluster.on(0, |r| {
        let t = host(&f, r);
        let mut c = Controller::connect(&t, who(SUB), opts()).unwrap();
        let info = c.info().clone();
        assert_eq!(info.namespaces.len(), 1);
        let ns = info.namespaces[0];
        assert_eq!((ns.nsid, ns.block_size, ns.num_blocks), (1, 512, 2048));
        assert!(info.io_queues >= 1);
        assert!(info.inline_limit() > 0);
        let mut qp = c.connect_io(&t, 1, 16, None).unwrap();
        // A keyed write (larger than the in-capsule limit), an in-capsule
        // write, and reads of both.
        let big = 8192usize;
        assert!(big as u32 > qp.max_inline());
        let mut w = DmaBuf::alloc(big).unwrap();
        for (i, b) in w.as_mut_slice().iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        qp.write(1, 0, 16, SgList::from_buf(w), 1).unwrap();
        qp.write(1, 100, 1, buf(512, 0xA5), 2).unwrap();
        let done = reap(r, &mut qp, 2);
        assert!(done.iter().all(|c| c.result.is_ok()), "{done:?}");
        qp.read(1, 0, 16, buf(big, 0), 3).unwrap();
        qp.read(1, 100, 1, buf(512, 0), 4).unwrap();
        let mut done = reap(r, &mut qp, 2);
        done.sort_by_key(|c| c.ctx);
        let mut got = vec![0u8; big];
        done[0].data.copy_to_slice(&mut got);
        assert!(got.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8));
        let mut one = vec![0u8; 512];
        done[1].data.copy_to_slice(&mut one);
        assert_eq!(one, vec![0xA5; 512]);
        // Flush, write zeroes, deallocate.
        qp.flush_ns(1, 5).unwrap();
        qp.write_zeroes(1, 100, 1, 6).unwrap();
        let range = buf(16, 0);
        qp.deallocate(1, 200, 8, range, 7).unwrap();
        let done = reap(r, &mut qp, 3);
        assert!(done.iter().all(|c| c.result.is_ok()), "{done:?}");
        qp.read(1, 100, 1, buf(512, 0xFF), 8).unwrap();
        let done = reap(r, &mut qp, 1);
        let mut one = vec![1u8; 512];
        done[0].data.copy_to_slice(&mut one);
        assert_eq!(one, vec![0; 512]);
        // Keep-alive goes through; shutdown completes.
        c.poll().unwrap();
        drop(qp);
        c.shutdown().unwrap();
    });
}

/// A queue holds its reactor awake (a sleeping reactor would not see its
/// completions) while commands are outstanding, and only then; a queue
/// that dies lets go once its commands are failed.
#[test]
fn a_queue_holds_its_reactor_awake_while_commands_are_outstanding() {
    let f = fx();
    f.cluster.on(0, |r| {
        let t = host(&f, r);
        let c = Controller::connect(&t, who(SUB), opts()).unwrap();
        let mut qp = c.connect_io(&t, 1, 16, None).unwrap();
        assert!(!r.is_held_awake(), "connected, idle");
        qp.read(1, 0, 1, buf(512, 0), 1).unwrap();
        qp.write(1, 8, 1, buf(512, 7), 2).unwrap();
        assert!(r.is_held_awake(), "two commands outstanding");
        let done = reap(r, &mut qp, 1);
        assert!(done[0].result.is_ok(), "{done:?}");
        if qp.outstanding() > 0 {
            assert!(r.is_held_awake(), "one command outstanding");
            assert!(reap(r, &mut qp, 1)[0].result.is_ok());
        }
        assert!(!r.is_held_awake(), "every command delivered");
        qp.read(1, 0, 1, buf(512, 0), 3).unwrap();
        assert!(r.is_held_awake());
        qp.disconnect();
        let done = reap(r, &mut qp, 1);
        assert!(done[0].result.is_err(), "{done:?}");
        assert!(!r.is_held_awake(), "the dead queue's commands failed");
        drop(qp);
        c.shutdown().unwrap();
    });
}

#[test]
fn submission_back_pressure_never_overflows_the_queue() {
    let f = fx();
    f.cluster.on(0, |r| {
        let t = host(&f, r);
        let c = Controller::connect(&t, who(SUB), opts()).unwrap();
        let mut qp = c.connect_io(&t, 1, 4, None).unwrap();
        assert_eq!(qp.entries(), 4);
        for i in 0..4 {
            qp.read(1, i, 1, buf(512, 0), i).unwrap();
        }
        let e = qp.read(1, 9, 1, buf(512, 0), 9).unwrap_err();
        assert_eq!(e.kind, SubmitErrorKind::Busy);
        assert_eq!(e.data.total_len(), 512, "the buffers come back");
        let done = reap(r, &mut qp, 4);
        assert_eq!(done.len(), 4);
        assert!(qp.can_submit());
    });
}

#[test]
fn errors_are_typed() {
    let f = fx();
    f.cluster.on(0, |r| {
        let t = host(&f, r);
        // Unknown subsystem: the Connect is refused.
        let e = Controller::connect(&t, who("nqn.2024-01.io.pollux:nope"), opts()).unwrap_err();
        assert!(matches!(e, HostError::ConnectRefused { qid: 0, .. }), "{e}");
        // Nobody listens.
        let other = LoopbackHost::new(
            f.lt.clone(),
            f.target.clone(),
            r.clone(),
            TransportId::loopback("none"),
        );
        let e = Controller::connect(&other, who(SUB), opts()).unwrap_err();
        assert!(matches!(e, HostError::Unreachable(_)), "{e}");
        // An I/O beyond the namespace completes with an NVMe status.
        let c = Controller::connect(&t, who(SUB), opts()).unwrap();
        let mut qp = c.connect_io(&t, 1, 8, None).unwrap();
        qp.read(1, 4096, 1, buf(512, 0), 1).unwrap();
        let done = reap(r, &mut qp, 1);
        assert!(
            matches!(done[0].result, Err(IoError::Nvme(_))),
            "{:?}",
            done[0].result
        );
        // A queue beyond the granted count is refused before the wire.
        assert!(matches!(
            c.connect_io(&t, 99, 8, None),
            Err(HostError::Unsupported(_))
        ));
        // Outstanding I/O of a queue that dies completes with an error.
        qp.read(1, 0, 1, buf(512, 0), 2).unwrap();
        qp.read(1, 1, 1, buf(512, 0), 3).unwrap();
        qp.flush();
        qp.disconnect();
        let done = reap(r, &mut qp, 2);
        assert!(
            done.iter().all(|c| c.result == Err(IoError::Aborted)),
            "{done:?}"
        );
        let e = qp.read(1, 0, 1, buf(512, 0), 4).unwrap_err();
        assert_eq!(e.kind, SubmitErrorKind::Dead);
    });
}

#[test]
fn discovery_lists_the_subsystem() {
    let f = fx();
    f.cluster.on(0, |r| {
        let t = host(&f, r);
        let log = discover(&t, HOST, opts()).unwrap();
        assert!(log.iter().any(|e| e.subnqn == SUB), "{log:?}");
    });
}

/// The refused Connect of `e`: its status and the blamed field.
fn refused(e: &HostError) -> (crate::spec::cpl::NvmeStatus, Option<InvalidParam>) {
    match e {
        HostError::ConnectRefused { status, param, .. } => (*status, *param),
        other => panic!("not a refused Connect: {other}"),
    }
}

#[test]
fn refused_connect_names_the_bad_field() {
    use crate::spec::cpl::NvmeStatus;
    let f = fx();
    let locked = "nqn.2024-01.io.pollux:locked";
    f.target
        .add_subsystem(SubsystemConfig::new(locked).allow_hosts(["nqn.2024-01.io.pollux:other"]))
        .unwrap();
    f.cluster.on(0, |r| {
        let t = host(&f, r);
        // Unknown subsystem: SUBNQN, offset 256 of the data.
        let e = Controller::connect(&t, who("nqn.2024-01.io.pollux:nope"), opts()).unwrap_err();
        let (status, param) = refused(&e);
        assert_eq!(status, NvmeStatus::CONNECT_INVALID_PARAMETERS);
        assert_eq!(
            param,
            Some(InvalidParam {
                offset: 256,
                in_data: true
            })
        );
        let msg = e.to_string();
        assert!(
            msg.contains("invalid parameter at offset 256 of the Connect data (subnqn)"),
            "{msg}"
        );
        // A host the subsystem does not allow: Invalid Host, HOSTNQN.
        let e = Controller::connect(&t, who(locked), opts()).unwrap_err();
        let (status, param) = refused(&e);
        assert_eq!(status, NvmeStatus::CONNECT_INVALID_HOST);
        assert_eq!(
            param,
            Some(InvalidParam {
                offset: 512,
                in_data: true
            })
        );
        let msg = e.to_string();
        assert!(msg.contains("host not allowed"), "{msg}");
        assert!(
            msg.contains("offset 512 of the Connect data (hostnqn)"),
            "{msg}"
        );
        // An I/O queue naming a controller that does not exist: CNTLID.
        let c = Controller::connect(&t, who(SUB), opts()).unwrap();
        let mut wrong = c.info().clone();
        wrong.cntlid = wrong.cntlid.wrapping_add(100);
        let e = connect_io_qpair(&t, &wrong, 1, 8, None).unwrap_err();
        let (status, param) = refused(&e);
        assert_eq!(status, NvmeStatus::CONNECT_INVALID_PARAMETERS);
        assert_eq!(
            param,
            Some(InvalidParam {
                offset: 16,
                in_data: true
            })
        );
        assert!(e.to_string().contains("(cntlid)"), "{e}");
        // An I/O queue larger than the target allows: SQSIZE in the SQE.
        let mut big = c.info().clone();
        big.cap.mqes = MAX_QUEUE_ENTRIES;
        big.ident.maxcmd = 0;
        let e = connect_io_qpair(&t, &big, 1, MAX_QUEUE_ENTRIES, None).unwrap_err();
        let (status, param) = refused(&e);
        assert_eq!(status, NvmeStatus::CONNECT_INVALID_PARAMETERS);
        assert_eq!(
            param,
            Some(InvalidParam {
                offset: 44,
                in_data: false
            })
        );
        assert!(
            e.to_string()
                .contains("invalid parameter at offset 44 of the Connect command (sqsize)"),
            "{e}"
        );
        // A status without IATTR/IPO blames nothing.
        assert_eq!(
            InvalidParam::from_completion(NvmeStatus::CONNECT_CONTROLLER_BUSY, 0x1_0100),
            None
        );
    });
}

fn reconnect_opts(delay_ms: u64, loss_ms: u64) -> CtrlOptions {
    CtrlOptions {
        reconnect_delay: Duration::from_millis(delay_ms),
        ctrl_loss_tmo: Duration::from_millis(loss_ms),
        ..opts()
    }
}

/// The target "dies": it stops listening and tears every controller down.
fn kill_target(f: &Fx) {
    f.target.remove_listener(&f.trid).unwrap();
    for s in f.target.subsystems() {
        for c in s.controllers() {
            c.fatal();
        }
    }
}

/// Drive the controller's recovery (and the in-process target) until it
/// reaches `want` or `limit` passes; returns the state reached.
fn recover_until<T: HostTransport>(
    r: &Reactor,
    c: &mut Controller<T>,
    t: &T,
    want: CtrlState,
    limit: Duration,
) -> CtrlState {
    let start = std::time::Instant::now();
    loop {
        let s = c.poll_recover(t);
        if s == want || start.elapsed() > limit {
            return s;
        }
        r.poll_once();
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn write_read_verify<Q: HostQueue>(r: &Reactor, qp: &mut Qpair<Q>, slba: u64, byte: u8) {
    qp.write(1, slba, 8, buf(4096, byte), 100).unwrap();
    let done = reap(r, qp, 1);
    assert!(done[0].result.is_ok(), "{:?}", done[0].result);
    check_blocks(r, qp, slba, byte);
}

fn check_blocks<Q: HostQueue>(r: &Reactor, qp: &mut Qpair<Q>, slba: u64, byte: u8) {
    qp.read(1, slba, 8, buf(4096, !byte), 101).unwrap();
    let done = reap(r, qp, 1);
    assert!(done[0].result.is_ok(), "{:?}", done[0].result);
    let mut got = vec![0u8; 4096];
    done[0].data.copy_to_slice(&mut got);
    assert!(got.iter().all(|b| *b == byte), "read back wrong data");
}

#[test]
fn lost_controller_reconnects_and_io_resumes() {
    let f = fx();
    f.cluster.on(0, |r| {
        let t = host(&f, r);
        let mut c = Controller::connect(&t, who(SUB), reconnect_opts(50, 10_000)).unwrap();
        let link = c.link().clone();
        let first_cntlid = c.info().cntlid;
        let mut qp = c.connect_io(&t, 1, 16, None).unwrap();
        write_read_verify(r, &mut qp, 0, 0x3C);
        // I/O in flight when the target goes away completes with an error.
        qp.read(1, 8, 8, buf(4096, 0), 7).unwrap();
        qp.read(1, 16, 8, buf(4096, 0), 8).unwrap();
        qp.flush();
        kill_target(&f);
        // (Aborted, or the dying controller's Command Sequence Error.)
        let done = reap(r, &mut qp, 2);
        assert!(done.iter().all(|c| c.result.is_err()), "{done:?}");
        assert_eq!(
            recover_until(
                r,
                &mut c,
                &t,
                CtrlState::Reconnecting,
                Duration::from_secs(5)
            ),
            CtrlState::Reconnecting
        );
        assert_eq!(link.state(), CtrlState::Reconnecting);
        assert!(link.lost_because().is_some());
        // While nobody listens, attempts fail and the I/O side waits.
        let mut seen = link.generation();
        for _ in 0..10 {
            assert_eq!(c.poll_recover(&t), CtrlState::Reconnecting);
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(matches!(
            link.reconnect_io(&t, &mut seen, 1, 16, None),
            Ok(None)
        ));
        assert_eq!(link.reconnects(), 0);
        // The target comes back on the same address.
        f.target.add_listener(f.trid.clone()).unwrap();
        assert_eq!(
            recover_until(r, &mut c, &t, CtrlState::Live, Duration::from_secs(5)),
            CtrlState::Live
        );
        assert_eq!((link.generation(), link.reconnects()), (1, 1));
        assert!(c.is_alive());
        assert_eq!(link.info().cntlid, c.info().cntlid);
        log::debug!("cntlid {first_cntlid} -> {}", c.info().cntlid);
        let mut qp = link
            .reconnect_io(&t, &mut seen, 1, 16, None)
            .unwrap()
            .expect("a new queue pair once the controller is back");
        assert_eq!(seen, 1);
        // The data written before the loss is there; new I/O works.
        check_blocks(r, &mut qp, 0, 0x3C);
        write_read_verify(r, &mut qp, 8, 0xC3);
        c.poll().unwrap();
    });
}

#[test]
fn controller_fails_after_ctrl_loss_tmo() {
    let f = fx();
    f.cluster.on(0, |r| {
        let t = host(&f, r);
        let mut c = Controller::connect(&t, who(SUB), reconnect_opts(30, 300)).unwrap();
        let link = c.link().clone();
        let mut qp = c.connect_io(&t, 1, 8, None).unwrap();
        kill_target(&f);
        let lost_at = std::time::Instant::now();
        assert_eq!(
            recover_until(r, &mut c, &t, CtrlState::Failed, Duration::from_secs(10)),
            CtrlState::Failed
        );
        let took = lost_at.elapsed();
        assert!(took >= Duration::from_millis(300), "failed after {took:?}");
        assert!(took < Duration::from_secs(5), "failed after {took:?}");
        // It stays failed, and new I/O fails fast with a typed error.
        assert_eq!(c.poll_recover(&t), CtrlState::Failed);
        let mut seen = 0;
        let e = link.reconnect_io(&t, &mut seen, 1, 8, None).unwrap_err();
        assert!(matches!(e, HostError::CtrlLost(_)), "{e}");
        assert!(e.to_string().contains("ctrl_loss_tmo"), "{e}");
        reap(r, &mut qp, 0);
        let e = qp.read(1, 0, 1, buf(512, 0), 1).unwrap_err();
        assert_eq!(e.kind, SubmitErrorKind::Dead);
        // Even a target that comes back later is not reconnected.
        f.target.add_listener(f.trid.clone()).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(c.poll_recover(&t), CtrlState::Failed);
        assert_eq!(link.reconnects(), 0);
    });
}

#[test]
fn no_reconnect_when_ctrl_loss_tmo_is_zero() {
    let f = fx();
    f.cluster.on(0, |r| {
        let t = host(&f, r);
        let mut c = Controller::connect(&t, who(SUB), reconnect_opts(10, 0)).unwrap();
        kill_target(&f);
        f.target.add_listener(f.trid.clone()).unwrap();
        assert_eq!(
            recover_until(r, &mut c, &t, CtrlState::Failed, Duration::from_secs(5)),
            CtrlState::Failed
        );
        assert_eq!(c.link().reconnects(), 0);
    });
}

#[test]
fn a_failed_io_queue_resets_the_controller() {
    let f = fx();
    f.cluster.on(0, |r| {
        let t = host(&f, r);
        let mut c = Controller::connect(&t, who(SUB), reconnect_opts(10, 5_000)).unwrap();
        let link = c.link().clone();
        let mut qp = c.connect_io(&t, 1, 8, None).unwrap();
        write_read_verify(r, &mut qp, 0, 0x77);
        assert_eq!(c.poll_recover(&t), CtrlState::Live);
        // The queue dies (say, an I/O timeout); the admin queue is fine.
        qp.disconnect();
        let mut seen = link.generation();
        assert!(matches!(
            link.reconnect_io(&t, &mut seen, 1, 8, None),
            Ok(None)
        ));
        assert_eq!(
            recover_until(r, &mut c, &t, CtrlState::Live, Duration::from_secs(5)),
            CtrlState::Live
        );
        // poll_recover returns Live at once only after the reset happened.
        let start = std::time::Instant::now();
        while link.generation() == 0 && start.elapsed() < Duration::from_secs(5) {
            c.poll_recover(&t);
            r.poll_once();
        }
        assert_eq!(link.reconnects(), 1);
        let mut qp = link
            .reconnect_io(&t, &mut seen, 1, 8, None)
            .unwrap()
            .expect("reconnected");
        check_blocks(r, &mut qp, 0, 0x77);
    });
}

#[test]
fn target_counts_keep_alives_and_keep_alive_timeouts() {
    let f = fx();
    let sub = f.target.subsystem(SUB).unwrap();
    f.cluster.on(0, |r| {
        let t = host(&f, r);
        let o = CtrlOptions {
            kato: Duration::from_millis(200),
            ..opts()
        };
        let mut c = Controller::connect(&t, who(SUB), o.clone()).unwrap();
        let before = sub.counters().snapshot();
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_millis(700) {
            c.poll().unwrap();
            r.poll_once();
            std::thread::sleep(Duration::from_millis(5));
        }
        let after = sub.counters().snapshot();
        // A Keep Alive every KATO/2: about 7 in 700 ms.
        let sent = after.keep_alives - before.keep_alives;
        assert!((4..=10).contains(&sent), "{sent} keep-alives");
        assert_eq!(after.keep_alive_timeouts, 0);
        assert_eq!(sub.controller_count(), 1);
        // A silent host: the target tears the controller down after KATO.
        // (The test cluster's clock is virtual: move it past KATO.)
        drop(c);
        r.poll_once();
        assert_eq!(sub.controller_count(), 0, "a disconnect is no timeout");
        let _silent = Controller::connect(&t, who(SUB), o).unwrap();
        assert_eq!(sub.controller_count(), 1);
        for _ in 0..4 {
            f.cluster.advance(Duration::from_millis(150));
            r.poll_once();
        }
        let end = sub.counters().snapshot();
        assert_eq!(end.keep_alive_timeouts, 1, "{end:?}");
        assert_eq!(end.controllers_created, before.controllers_created + 1);
        assert_eq!(sub.controller_count(), 0, "the silent one is gone");
    });
}
