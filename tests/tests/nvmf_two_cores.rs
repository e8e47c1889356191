//! The NVMe-oF RDMA target on two real reactors (two pinned threads): the
//! poll group that owns the listener validates each connect request and
//! hands the queue to the other core by reactor message (a detached soft
//! verbs request travels between threads), so one host's queues are
//! served on both cores; `pollux-perf` writes, reads back and compares
//! through them.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use pollux_reactor::sync::Mutex;
use std::time::{Duration, Instant};

use pollux_apps::perf::{run, PerfParams};
use pollux_apps::workload::Workload;
use pollux_nvmf::host::rdma::{RdmaHost, RdmaHostOptions};
use pollux_nvmf::host::HostTrid;
use pollux_reactor::{Cores, IdleMode};
use pollux_verbs::soft::Soft;
use pollux_verbs::CmAddr;

const NQN: &str = "nqn.2024-01.io.pollux:two-cores";

#[test]
fn one_hosts_queues_are_served_on_both_target_cores_with_verified_io() {
    let addr = format!("@pollux-two-cores-{}", std::process::id());
    let (_target, transport) =
        common::soft_rdma_target(NQN, "malloc:size=16M,block=512,name=two-cores", &addr);
    let t2 = transport.clone();
    let set = common::launch_with_groups("0-1", move |r| t2.create_poll_group(r).unwrap());
    // One host core, two I/O queues: with the admin queue, three queues.
    let host_core = if std::thread::available_parallelism().map_or(1, |n| n.get()) >= 3 {
        "2"
    } else {
        "0"
    };
    let p = PerfParams {
        trid: HostTrid::parse(&format!("trtype:soft traddr:{addr} subnqn:{NQN}")).unwrap(),
        queue_depth: 8,
        io_size: 8192,
        workload: Workload::RandRw,
        read_pct: 50,
        duration: Duration::from_secs(2),
        warmup: Duration::ZERO,
        qpairs_per_ns: 2,
        verify: true,
        inline_cap: None,
        kato: Duration::from_secs(10),
        io_timeout: Duration::from_secs(20),
        reconnect_delay: Duration::from_secs(2),
        ctrl_loss_tmo: Duration::ZERO,
        pi: pollux_nvmf::host::pi::HostPi::Pract,
        pi_software: false,
    };
    // Watch the placement while the run goes on.
    let seen = Arc::new(Mutex::new(Vec::<usize>::new()));
    let (watch_t, watch_seen) = (transport.clone(), seen.clone());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let watcher = std::thread::spawn(move || {
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            let q = watch_t.queues_per_group();
            if q.iter().sum::<usize>() == 3 {
                *watch_seen.lock().unwrap() = q;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let a2 = addr.clone();
    let factory = Arc::new(move || {
        RdmaHost::<Soft>::open(None, CmAddr::new(a2.clone()), RdmaHostOptions::default())
    });
    let rep = run(
        factory,
        Cores::parse(host_core).unwrap(),
        IdleMode::BusyPoll,
        &p,
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    watcher.join().unwrap();
    let rep = rep.unwrap();
    assert!(rep.total.ios > 0, "no I/O completed");
    assert_eq!(rep.total.errors, 0, "I/O errors");
    assert_eq!(rep.total.miscompares, 0, "data read back differs");
    let placed = seen.lock().unwrap().clone();
    assert_eq!(
        placed,
        [2, 1],
        "admin + two I/O queues over the two cores (least connections)"
    );
    let ts = transport.stats();
    assert_eq!(ts.accepted, 3, "{ts:?}");
    // The host disconnected at the end: every queue is destroyed, each on
    // its own core.
    let deadline = Instant::now() + Duration::from_secs(20);
    while transport.stats().destroyed < 3 {
        assert!(Instant::now() < deadline, "{:?}", transport.stats());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(transport.queues_per_group(), [0, 0]);
    set.stop_all();
    let _ = set.join();
}
