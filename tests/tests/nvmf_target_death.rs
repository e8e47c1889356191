//! Abrupt death of a target process mid-run: the host's outstanding I/O
//! completes with an error and `pollux-perf`'s engine ends with a clear
//! error, quickly.
//!
//! The target is this test binary re-executed as a child
//! (`POLLUX_NVMF_CHILD_TARGET=<address>` runs only `child_target`), killed
//! with SIGKILL while the host has I/O in flight.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pollux_apps::perf::{run, PerfParams};
use pollux_apps::workload::Workload;
use pollux_nvmf::host::rdma::{RdmaHost, RdmaHostOptions};
use pollux_nvmf::host::HostTrid;
use pollux_reactor::{launch, Cores, IdleMode, LaunchConfig, PollStatus};
use pollux_verbs::soft::Soft;
use pollux_verbs::CmAddr;

const NQN: &str = "nqn.2024-01.io.pollux:death";
const ENV: &str = "POLLUX_NVMF_CHILD_TARGET";

/// Not a test on its own: the child process's body (returns at once
/// unless the environment variable is set), run only by `spawn_target`.
#[test]
#[ignore = "child process entry point, spawned by killing_the_target_process_fails_the_run_clearly"]
fn child_target() {
    let Ok(addr) = std::env::var(ENV) else {
        return;
    };
    let (_target, transport) =
        common::soft_rdma_target(NQN, "null:size=64M,block=512,name=death", &addr);
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let set = launch(LaunchConfig::new(Cores::parse("0").unwrap()), move |r| {
        let pg = transport.create_poll_group(r).unwrap();
        r.add_poller("keep", move || {
            let _ = &pg;
            PollStatus::Idle
        });
        let _ = tx.send(());
    })
    .unwrap();
    // The listener is up once the poll group exists.
    rx.recv_timeout(Duration::from_secs(10)).unwrap();
    println!("POLLUX-CHILD-READY");
    // Serve until killed (bounded, in case the parent died first).
    std::thread::sleep(Duration::from_secs(60));
    set.stop_all();
    let _ = set.join();
}

/// Kills the child when the test ends, whatever happened.
struct Reaper(Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_target(addr: &str) -> Child {
    pollux_reactor::test_env::child_test("child_target")
        .env(ENV, addr)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn killing_the_target_process_fails_the_run_clearly() {
    let addr = format!("@pollux-death-{}", std::process::id());
    let mut child = Reaper(spawn_target(&addr));
    let child = &mut child.0;
    let host_core = if std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2 {
        "1"
    } else {
        "0"
    };
    let p = PerfParams {
        trid: HostTrid::parse(&format!("trtype:soft traddr:{addr} subnqn:{NQN}")).unwrap(),
        queue_depth: 32,
        io_size: 4096,
        workload: Workload::RandRead,
        read_pct: 50,
        duration: Duration::from_secs(30),
        warmup: Duration::ZERO,
        qpairs_per_ns: 1,
        verify: false,
        inline_cap: None,
        kato: Duration::from_secs(10),
        io_timeout: Duration::from_secs(10),
        reconnect_delay: Duration::from_secs(2),
        ctrl_loss_tmo: Duration::ZERO,
        pi: pollux_nvmf::host::pi::HostPi::Pract,
        pi_software: false,
    };
    let a2 = addr.clone();
    let factory = Arc::new(move || {
        RdmaHost::<Soft>::open(None, CmAddr::new(a2.clone()), RdmaHostOptions::default())
    });
    // Wait until the child listens, then kill it half a second into the run.
    let out = child.stdout.take().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(out));
    assert!(
        lines.any(|l| l.is_ok_and(|l| l.contains("POLLUX-CHILD-READY"))),
        "the child target did not start"
    );
    let pid = child.id();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    });
    let start = Instant::now();
    let res = run(
        factory,
        Cores::parse(host_core).unwrap(),
        IdleMode::BusyPoll,
        &p,
    );
    killer.join().unwrap();
    let _ = child.wait();
    let e = res.unwrap_err().to_string();
    assert!(e.contains("lost the target"), "{e}");
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "took {:?}",
        start.elapsed()
    );
}
