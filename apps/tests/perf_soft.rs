//! `pollux-perf`'s engine against our RDMA target over the software
//! provider, in one process: the target on core 1, the host on core 0.
//! Every memory mode with data verification, the bdevperf JSON shape, and
//! a target that disappears mid-run.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use pollux_reactor::sync::Mutex;
use std::time::Duration;

use pollux_apps::perf::{run, PerfParams, TransportFactory};
use pollux_apps::workload::Workload;
use pollux_bdev::BdevRegistry;
use pollux_nvmf::host::rdma::{MemMode, RdmaHost, RdmaHostOptions};
use pollux_nvmf::host::HostTrid;
use pollux_nvmf::spec::transport_id::{AdrFam, TrType, TransportId};
use pollux_nvmf::target::rdma::{RdmaOptions, RdmaTransport};
use pollux_nvmf::target::{NamespaceConfig, SubsystemConfig, Target, TargetOptions};
use pollux_reactor::{launch, Cores, IdleMode, LaunchConfig, PollStatus, ReactorSet};
use pollux_verbs::soft::Soft;
use pollux_verbs::CmAddr;

const NQN: &str = "nqn.2024-01.io.pollux:perf-test";

/// Runs are serialized: two busy-polling runs at once on a small machine
/// would only measure each other.
static SERIAL: Mutex<()> = Mutex::new(());

struct Tgt {
    set: Option<ReactorSet>,
    addr: String,
    _target: Arc<Target>,
}

impl Drop for Tgt {
    fn drop(&mut self) {
        if let Some(s) = self.set.take() {
            s.stop_all();
            let _ = s.join();
        }
    }
}

fn target(bdev: &str) -> Tgt {
    target_idle(bdev, IdleMode::BusyPoll)
}

/// [`target`] on a reactor in idle mode `idle`.
fn target_idle(bdev: &str, idle: IdleMode) -> Tgt {
    static N: AtomicUsize = AtomicUsize::new(0);
    let addr = format!(
        "@pollux-perf-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    target_at_idle(bdev, addr, idle)
}

/// A target listening at `addr` (a restarted target reuses its address).
fn target_at(bdev: &str, addr: String) -> Tgt {
    target_at_idle(bdev, addr, IdleMode::BusyPoll)
}

/// [`target_at`] on a reactor in idle mode `idle`.
fn target_at_idle(bdev: &str, addr: String, idle: IdleMode) -> Tgt {
    let target = Target::new(TargetOptions {
        in_capsule_data_size: 4096,
        ..TargetOptions::for_tests()
    })
    .unwrap();
    let mut sc = SubsystemConfig::new(NQN);
    sc.allow_any_host = true;
    let sub = target.add_subsystem(sc).unwrap();
    let b = BdevRegistry::new().create(bdev).unwrap();
    sub.add_namespace(NamespaceConfig::new(b).with_nsid(1))
        .unwrap();
    let transport = RdmaTransport::<Soft>::new(&target, RdmaOptions::for_tests()).unwrap();
    target.add_transport(transport.clone()).unwrap();
    target
        .add_listener(TransportId {
            trtype: TrType::Rdma,
            adrfam: AdrFam::IntraHost,
            traddr: addr.clone(),
            trsvcid: String::new(),
        })
        .unwrap();
    let core = if Cores::parse("1").unwrap().check_exist().is_ok() {
        "1"
    } else {
        "0"
    };
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let cfg = LaunchConfig {
        idle,
        ..LaunchConfig::new(Cores::parse(core).unwrap())
    };
    let set = launch(cfg, move |r| {
        let pg = transport.create_poll_group(r).unwrap();
        r.add_poller("keep-poll-group", move || {
            let _ = &pg;
            PollStatus::Idle
        });
        let _ = tx.send(());
    })
    .unwrap();
    // The listener is up once the poll group exists.
    rx.recv_timeout(Duration::from_secs(10)).unwrap();
    Tgt {
        set: Some(set),
        addr,
        _target: target,
    }
}

fn params(t: &Tgt, w: Workload, verify: bool, secs: f64) -> PerfParams {
    PerfParams {
        trid: HostTrid::parse(&format!("trtype:soft traddr:{} subnqn:{NQN}", t.addr)).unwrap(),
        queue_depth: 16,
        io_size: 4096,
        workload: w,
        read_pct: 50,
        duration: Duration::from_secs_f64(secs),
        warmup: Duration::ZERO,
        qpairs_per_ns: 2,
        verify,
        inline_cap: None,
        kato: Duration::from_secs(10),
        io_timeout: Duration::from_secs(10),
        reconnect_delay: Duration::from_secs(2),
        ctrl_loss_tmo: Duration::ZERO,
        pi: pollux_nvmf::host::pi::HostPi::Pract,
        pi_software: false,
    }
}

fn factory(t: &Tgt, mem: MemMode, remote_invalidate: bool) -> TransportFactory<RdmaHost<Soft>> {
    let addr = t.addr.clone();
    Arc::new(move || {
        RdmaHost::<Soft>::open(
            None,
            CmAddr::new(addr.clone()),
            RdmaHostOptions {
                mem_mode: mem,
                remote_invalidate,
                ..RdmaHostOptions::default()
            },
        )
    })
}

#[test]
fn every_mode_verifies_data() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let t = target("malloc:size=8M,block=512,name=pv");
    for (mem, rinv, inline) in [
        (MemMode::Pool, false, None),
        (MemMode::Pool, false, Some(0)),
        (MemMode::RegisterAlways, true, None),
        (MemMode::RegisterAlways, true, Some(0)),
        (MemMode::RegisterAlways, false, Some(0)),
    ] {
        let mut p = params(&t, Workload::Write, true, 0.3);
        p.inline_cap = inline;
        let r = run(
            factory(&t, mem, rinv),
            Cores::parse("0").unwrap(),
            IdleMode::BusyPoll,
            &p,
        )
        .unwrap_or_else(|e| panic!("{mem} rinv={rinv} inline={inline:?}: {e}"));
        assert!(r.total.ios > 0, "{mem}: no I/O");
        assert_eq!(r.total.errors, 0, "{mem}: errors");
        assert_eq!(
            r.total.miscompares, 0,
            "{mem} rinv={rinv} inline={inline:?}: miscompares"
        );
    }
}

/// Target and host reactors that sleep when idle (`--idle adaptive`,
/// `hybrid`): the soft provider's rings cannot wake a reactor, so the
/// target's poll group (connected) and the perf job hold theirs awake; a
/// target that only listens sleeps, and its listener wakes it. Before they did, each I/O waited for a timer: the host's 50 ms
/// admin tick or the target's keep-alive, a few I/Os in the run.
#[test]
fn sleeping_reactors_serve_and_drive_io() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let modes = [
        IdleMode::Adaptive {
            sleep_after: Duration::ZERO,
        },
        IdleMode::Hybrid {
            sleep_after: Duration::from_millis(1),
        },
    ];
    for idle in modes {
        let t = target_idle("malloc:size=8M,block=512,name=pidle", idle);
        // Listening only, the target's reactor sleeps (its listener's
        // descriptor wakes it for the host's connect request).
        let slept = || t.set.as_ref().unwrap().stats().unwrap()[0].sleeps;
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while slept() == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "{idle:?}: never slept"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let p = params(&t, Workload::RandRw, true, 0.3);
        let r = run(
            factory(&t, MemMode::Pool, false),
            Cores::parse("0").unwrap(),
            idle,
            &p,
        )
        .unwrap_or_else(|e| panic!("{idle:?}: {e}"));
        assert_eq!((r.total.errors, r.total.miscompares), (0, 0), "{idle:?}");
        // Tens of thousands here (68,124 adaptive, 71,731 hybrid); 224
        // (adaptive) when the host's 50 ms admin tick drove the I/O.
        assert!(r.total.ios >= 2000, "{idle:?}: {} I/Os", r.total.ios);
        assert!(
            r.total.lat_max_us < 500_000.0,
            "{idle:?}: an I/O waited {} us",
            r.total.lat_max_us
        );
    }
}

/// `--pi off|insert|dix` on a PI namespace (Types 1 and 3), with data
/// verification: every I/O checked by the target's bdev layer and (insert,
/// DIX) by the host, through the soft provider's signature offload and in
/// software; a namespace with metadata but no PI is refused.
#[test]
fn pi_modes_verify_data_on_pi_namespaces() {
    use pollux_nvmf::host::pi::HostPi;
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    for (ty, name) in [(1, "ppi1"), (3, "ppi3")] {
        let t = target(&format!(
            "malloc:size=8M,block=512,md=8,md_interleave=true,pi={ty},name={name}"
        ));
        let modes = [
            (HostPi::Pract, false),
            (HostPi::Insert, false),
            (HostPi::Insert, true),
            (HostPi::Dix, false),
            (HostPi::Dix, true),
        ];
        for (mode, software) in modes {
            for (w, io) in [(Workload::Write, 4096), (Workload::RandRw, 512)] {
                let mut p = params(&t, w, w == Workload::Write, 0.3);
                p.pi = mode;
                p.pi_software = software;
                p.io_size = io;
                let r = run(
                    factory(&t, MemMode::Pool, false),
                    Cores::parse("0").unwrap(),
                    IdleMode::BusyPoll,
                    &p,
                )
                .unwrap_or_else(|e| panic!("type {ty} {mode:?} software={software} {w:?}: {e}"));
                assert!(r.total.ios > 0, "type {ty} {mode:?}: no I/O");
                assert_eq!(
                    (r.total.errors, r.total.miscompares),
                    (0, 0),
                    "type {ty} {mode:?} {w:?} {io}"
                );
            }
        }
    }
    let t = target("malloc:size=8M,block=512,md=8,md_interleave=true,name=pmd");
    let e = run(
        factory(&t, MemMode::Pool, false),
        Cores::parse("0").unwrap(),
        IdleMode::BusyPoll,
        &params(&t, Workload::RandRead, false, 0.2),
    )
    .unwrap_err();
    assert!(e.to_string().contains("no PI"), "{e}");
}

/// `--verify` with a pure-read workload reads only and compares with the
/// generation-0 pattern: a fresh (zeroed) malloc bdev miscompares on every
/// read, and nothing is written (used by the VM interop against a kernel
/// target's file namespace filled with that pattern).
#[test]
fn read_only_verify_compares_known_data() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let t = target("malloc:size=8M,block=512,name=pro");
    for w in [Workload::Read, Workload::RandRead] {
        let r = run(
            factory(&t, MemMode::Pool, false),
            Cores::parse("0").unwrap(),
            IdleMode::BusyPoll,
            &params(&t, w, true, 0.2),
        )
        .unwrap();
        assert!(r.total.ios > 0, "{w:?}: no I/O");
        assert_eq!(r.total.errors, 0);
        assert_eq!(
            r.total.miscompares, r.total.ios,
            "{w:?}: every read of zeros miscompares"
        );
    }
}

#[test]
fn json_has_the_bdevperf_shape() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let t = target("null:size=64M,block=512,name=pj");
    let p = params(&t, Workload::RandRead, false, 0.3);
    let r = run(
        factory(&t, MemMode::RegisterAlways, true),
        Cores::parse("0").unwrap(),
        IdleMode::BusyPoll,
        &p,
    )
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    for k in [
        "iops",
        "mibps",
        "lat_avg_us",
        "lat_min_us",
        "lat_max_us",
        "lat_p50_us",
        "lat_p99_us",
        "lat_p999_us",
    ] {
        assert!(v[k].is_number(), "{k} missing: {v}");
    }
    assert!(v["iops"].as_f64().unwrap() > 0.0);
    let cores = v["cores"].as_array().unwrap();
    assert_eq!(cores.len(), 1);
    assert!(cores[0]["busy_pct"].is_number() && cores[0]["core"].is_number());
}

#[test]
fn target_death_mid_run_is_a_clear_error() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut t = target("null:size=64M,block=512,name=pd");
    let p = params(&t, Workload::RandRead, false, 30.0);
    let set = t.set.take().unwrap();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        set.stop_all();
        let _ = set.join();
    });
    let start = std::time::Instant::now();
    let e = run(
        factory(&t, MemMode::RegisterAlways, true),
        Cores::parse("0").unwrap(),
        IdleMode::BusyPoll,
        &p,
    )
    .unwrap_err();
    killer.join().unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "took {:?}",
        start.elapsed()
    );
    let msg = e.to_string();
    assert!(
        msg.contains("lost the target") || msg.contains("connect"),
        "{msg}"
    );
}

/// Stop `t` after `after`, and start a new target on the same address
/// `back` later (`None`: never); the thread returns the new target.
fn kill_and_restart(
    mut t: Tgt,
    bdev: &'static str,
    after: Duration,
    back: Option<Duration>,
) -> std::thread::JoinHandle<Option<Tgt>> {
    std::thread::spawn(move || {
        std::thread::sleep(after);
        let addr = t.addr.clone();
        drop(t.set.take());
        drop(t);
        let back = back?;
        std::thread::sleep(back);
        Some(target_at(bdev, addr))
    })
}

/// The target dies mid-run and comes back on the same address: the host
/// reconnects, the paused job resumes, and verification (write, read back,
/// compare) passes on the new target.
#[test]
fn target_restart_mid_run_reconnects_and_verifies() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    const BDEV: &str = "malloc:size=8M,block=512,name=prr";
    let t = target(BDEV);
    let mut p = params(&t, Workload::Write, true, 4.0);
    p.reconnect_delay = Duration::from_millis(200);
    p.ctrl_loss_tmo = Duration::from_secs(30);
    let f = factory(&t, MemMode::Pool, false);
    let restarter = kill_and_restart(
        t,
        BDEV,
        Duration::from_millis(700),
        Some(Duration::from_millis(600)),
    );
    let r = run(f, Cores::parse("0").unwrap(), IdleMode::BusyPoll, &p)
        .unwrap_or_else(|e| panic!("the run did not survive the restart: {e}"));
    let _t2 = restarter.join().unwrap();
    assert!(
        r.reconnects.is_some_and(|n| n >= 1),
        "no reconnect: {:?}",
        r.reconnects
    );
    assert!(r.total.ios > 0, "no I/O");
    assert_eq!(r.total.miscompares, 0, "miscompares after the reconnect");
    let table = r.to_table();
    assert!(table.contains("reconnects: "), "{table}");
}

/// The target dies and never comes back: the run fails once
/// `ctrl_loss_tmo` passed, with an error that says so.
#[test]
fn target_gone_for_good_fails_after_ctrl_loss_tmo() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    const BDEV: &str = "null:size=64M,block=512,name=pgone";
    let t = target(BDEV);
    let mut p = params(&t, Workload::RandRead, false, 30.0);
    p.reconnect_delay = Duration::from_millis(200);
    p.ctrl_loss_tmo = Duration::from_secs(1);
    let f = factory(&t, MemMode::RegisterAlways, true);
    // Taken before the killer starts its 300 ms wait: the target goes at least
    // 300 ms after `start`, and the host may give up only ctrl_loss_tmo after that.
    let start = std::time::Instant::now();
    let killer = kill_and_restart(t, BDEV, Duration::from_millis(300), None);
    let e = run(f, Cores::parse("0").unwrap(), IdleMode::BusyPoll, &p).unwrap_err();
    assert!(killer.join().unwrap().is_none());
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(1300),
        "gave up after {took:?}"
    );
    assert!(took < Duration::from_secs(20), "took {took:?}");
    let msg = e.to_string();
    assert!(msg.contains("ctrl_loss_tmo"), "{msg}");
}

/// A host that stays connected but sends nothing (an AER waiting on the
/// admin queue) lets a sleeping target's reactor sleep (the poll group arms
/// its CQ once its queues are settled),
/// and the host's next command wakes it through the CQ's descriptor, in
/// well under the group's 100 ms sleep tick.
#[test]
fn an_idle_connection_lets_the_target_sleep_and_a_command_wakes_it() {
    use pollux_nvmf::host::{Controller, CtrlOptions, DataDir, HostIdentity, DEFAULT_HOSTNQN};
    use pollux_nvmf::spec::{AdminOpcode, NvmeCmd};
    use pollux_reactor::mem::{DmaBuf, SgList};
    use std::time::Instant;
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let idle = IdleMode::Adaptive {
        sleep_after: Duration::ZERO,
    };
    let t = target_idle("malloc:size=8M,block=512,name=psettle", idle);
    let host = RdmaHost::<Soft>::open(
        None,
        CmAddr::new(t.addr.clone()),
        RdmaHostOptions::default(),
    )
    .unwrap();
    let who = HostIdentity {
        hostnqn: DEFAULT_HOSTNQN.into(),
        hostid: *b"pollux-settle-01",
        subnqn: NQN.into(),
    };
    let mut c = Controller::connect(&host, who, CtrlOptions::default()).unwrap();
    let mut qp = c.connect_io(&host, 1, 16, None).unwrap();
    // An Asynchronous Event Request left with the target, as hosts do: it
    // waits for an event, and must not keep the target polling.
    let aer = NvmeCmd::new(AdminOpcode::AsyncEventRequest.code(), 0);
    c.admin()
        .submit(aer, DataDir::None, SgList::new(), 77)
        .unwrap();
    c.admin().flush();
    // One 4 KiB read, polled on this thread; how long it took.
    let mut read = |lba: u64| {
        let start = Instant::now();
        let b = SgList::from_buf(DmaBuf::alloc(4096).unwrap());
        qp.read(1, lba, 8, b, lba).unwrap();
        let mut done = None;
        while done.is_none() {
            assert!(start.elapsed() < Duration::from_secs(5), "no completion");
            qp.poll(&mut |c| done = Some(c.result.is_ok()));
        }
        assert_eq!(done, Some(true));
        start.elapsed()
    };
    read(0);
    let sleeps = || t.set.as_ref().unwrap().stats().unwrap()[0].sleeps;
    let before = sleeps();
    std::thread::sleep(Duration::from_millis(350));
    let idle_sleeps = sleeps() - before;
    // The tick wakes it every 100 ms, and it sleeps again.
    assert!(
        idle_sleeps >= 2,
        "{idle_sleeps} sleeps in 350 ms while idle"
    );
    let mut lat: Vec<Duration> = (1..=9)
        .map(|i| {
            std::thread::sleep(Duration::from_millis(15));
            read(i * 8)
        })
        .collect();
    lat.sort();
    assert!(
        lat[4] < Duration::from_millis(20),
        "median read after an idle gap {:?} (all {lat:?}): woken by the tick, not the CQ",
        lat[4]
    );
    drop(qp);
    drop(c);
}
