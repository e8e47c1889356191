//! RDMA host ↔ the RDMA target core over the software provider, in one
//! process on a one-reactor `TestCluster`: every memory mode, in-capsule
//! writes, data verification, a target that goes away.
#![allow(clippy::unwrap_used)]

use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pollux_bdev::BdevRegistry;
use pollux_reactor::mem::{BufPool, BufPoolOptions, SgList};
use pollux_reactor::TestCluster;
use pollux_verbs::soft::Soft;
use pollux_verbs::CmAddr;

use super::{MemMode, RdmaHost, RdmaHostOptions};
use crate::host::test_io::write_read_verify;
use crate::host::*;
use crate::spec::transport_id::{AdrFam, TrType, TransportId};
use crate::target::rdma::{RdmaOptions, RdmaPollGroup, RdmaTransport};
use crate::target::{NamespaceConfig, SubsystemConfig, Target, TargetOptions};

const NQN: &str = "nqn.2024-01.io.pollux:rdma-host";

struct Fx {
    cl: TestCluster,
    _target: Arc<Target>,
    pg: Rc<RdmaPollGroup<Soft>>,
    addr: String,
    _reg: BdevRegistry,
}

fn fixture(send_with_invalidate: bool) -> Fx {
    static N: AtomicUsize = AtomicUsize::new(0);
    let cl = TestCluster::new(1);
    let target = Target::new(TargetOptions {
        in_capsule_data_size: 4096,
        ..TargetOptions::for_tests()
    })
    .unwrap();
    let mut sc = SubsystemConfig::new(NQN);
    sc.allow_any_host = true;
    let sub = target.add_subsystem(sc).unwrap();
    let reg = BdevRegistry::new();
    let bdev = reg.create("malloc:size=4M,block=512,name=rh").unwrap();
    sub.add_namespace(NamespaceConfig::new(bdev).with_nsid(1))
        .unwrap();
    let opts = RdmaOptions {
        send_with_invalidate,
        ..RdmaOptions::for_tests()
    };
    let transport = RdmaTransport::<Soft>::new(&target, opts).unwrap();
    target.add_transport(transport.clone()).unwrap();
    let pg = cl.on(0, |r| transport.create_poll_group(r)).unwrap();
    let addr = format!(
        "@pollux-rdma-host-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    target
        .add_listener(TransportId {
            trtype: TrType::Rdma,
            adrfam: AdrFam::IntraHost,
            traddr: addr.clone(),
            trsvcid: String::new(),
        })
        .unwrap();
    cl.poll_until_idle().unwrap();
    Fx {
        cl,
        _target: target,
        pg,
        addr,
        _reg: reg,
    }
}

fn who() -> HostIdentity {
    HostIdentity {
        hostnqn: DEFAULT_HOSTNQN.into(),
        hostid: *b"rdma-host-test-1",
        subnqn: NQN.into(),
    }
}

/// Write `n` I/Os of `size` bytes with a pattern, read them back, compare.
fn verify_mode(
    mode: MemMode,
    remote_inv: bool,
    target_inv: bool,
    inline_cap: Option<u32>,
    size: usize,
) {
    let f = fixture(target_inv);
    f.cl.on(0, |r| {
        let opts = RdmaHostOptions {
            mem_mode: mode,
            remote_invalidate: remote_inv,
            connect_timeout: Duration::from_secs(5),
        };
        let t = RdmaHost::<Soft>::open(None, CmAddr::new(f.addr.clone()), opts).unwrap();
        let c = Controller::connect(
            &t,
            who(),
            CtrlOptions {
                io_queues: 2,
                ..CtrlOptions::default()
            },
        )
        .unwrap();
        assert_eq!(c.info().namespaces.len(), 1);
        let mut qp = c.connect_io(&t, 1, 32, inline_cap).unwrap();
        let pool = BufPool::new(BufPoolOptions::new("rdma-host-test", size, 64)).unwrap();
        let n = 48u64;
        let bad = write_read_verify(r, &mut qp, &pool, 0, n);
        assert_eq!(bad, 0, "{bad} of {n} reads miscompared");
        let st = qp.transport().stats();
        let inline_on = inline_cap != Some(0) && size <= 4096;
        assert_eq!(st.inline > 0, inline_on, "{st:?}");
        if mode == MemMode::RegisterAlways {
            assert!(st.registrations > 0, "{st:?}");
            assert_eq!(
                st.registrations,
                st.remote_invalidations + st.local_invalidations,
                "{st:?}"
            );
            assert_eq!(
                st.remote_invalidations > 0,
                remote_inv && target_inv,
                "{st:?}"
            );
            assert_eq!(
                st.local_invalidations > 0,
                !(remote_inv && target_inv),
                "{st:?}"
            );
        } else {
            assert_eq!(
                st.registrations + st.remote_invalidations + st.local_invalidations,
                0,
                "{st:?}"
            );
        }
        if mode == MemMode::Pool {
            assert!(!t.mr_cache().is_empty());
        }
    });
}

#[test]
fn pool_mode_round_trip() {
    verify_mode(MemMode::Pool, false, true, None, 4096);
    verify_mode(MemMode::Pool, false, true, Some(0), 8192);
}

#[test]
fn register_always_remote_invalidation() {
    verify_mode(MemMode::RegisterAlways, true, true, None, 4096);
    verify_mode(MemMode::RegisterAlways, true, true, Some(0), 16384);
}

#[test]
fn register_always_local_invalidation() {
    verify_mode(MemMode::RegisterAlways, false, true, Some(0), 4096);
    // The host asks for remote invalidation but the target does not do it:
    // the host falls back to LOCAL_INV.
    verify_mode(MemMode::RegisterAlways, true, false, Some(0), 4096);
}

#[test]
fn nobody_listening_is_unreachable() {
    let cl = TestCluster::new(1);
    cl.on(0, |_| {
        let t = RdmaHost::<Soft>::open(
            None,
            CmAddr::new("@pollux-nobody-here"),
            RdmaHostOptions::default(),
        )
        .unwrap();
        let e = Controller::connect(&t, who(), CtrlOptions::default()).unwrap_err();
        assert!(
            matches!(e, HostError::Unreachable(_) | HostError::Disconnected(_)),
            "{e}"
        );
    });
}

#[test]
fn target_shutdown_fails_outstanding_io() {
    let f = fixture(true);
    f.cl.on(0, |r| {
        let t = RdmaHost::<Soft>::open(
            None,
            CmAddr::new(f.addr.clone()),
            RdmaHostOptions::default(),
        )
        .unwrap();
        let mut c = Controller::connect(&t, who(), CtrlOptions::default()).unwrap();
        let mut qp = c.connect_io(&t, 1, 16, None).unwrap();
        let pool = BufPool::new(BufPoolOptions::new("rdma-host-death", 4096, 16)).unwrap();
        for i in 0..8 {
            qp.read(1, i * 8, 8, SgList::from_buf(pool.get().unwrap()), i)
                .unwrap();
        }
        qp.flush();
        // The target goes away before serving them.
        f.pg.shutdown();
        let mut done = Vec::new();
        for _ in 0..2_000_000 {
            qp.poll(&mut |c| done.push(c));
            if done.len() == 8 {
                break;
            }
            r.poll_once();
        }
        assert_eq!(done.len(), 8, "every outstanding I/O completes");
        assert!(done.iter().any(|c| c.result.is_err()));
        assert!(!qp.is_alive() || done.iter().all(|c| c.result.is_ok()));
        let mut admin_dead = false;
        for _ in 0..2_000_000 {
            if let Err(e) = c.poll() {
                assert!(matches!(e, HostError::Disconnected(_)), "{e}");
                admin_dead = true;
                break;
            }
            r.poll_once();
        }
        assert!(admin_dead);
    });
}
