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
