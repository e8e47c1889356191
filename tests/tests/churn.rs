//! Connection churn against a target process, NVMe-oF over the soft RDMA
//! provider and over NVMe/TCP on loopback (and, for the storm, iSCSI over
//! iSER): whichever way a host goes, the target gives back everything its
//! queues took (descriptors, mappings, memory).
//!
//! - `soak_connect_io_disconnect_returns_everything` (RDMA) and
//!   `tcp_soak_connect_io_disconnect_returns_everything`:
//!   `POLLUX_SOAK_CYCLES` (default 500 each) cycles of connect → verified
//!   write/read → end, the end mixing clean disconnects, hosts dropped
//!   without a word, hosts that stop sending keep-alives (the target's KATO
//!   ends them; every one is counted by the subsystem), SIGKILLed host
//!   processes with I/O in flight, connects refused for an unknown
//!   subsystem and I/O-queue Connects refused beyond the controller's
//!   granted queues. Every `POLLUX_SOAK_SAMPLE_EVERY` (50) cycles, once
//!   the target serves no queue, it samples the target's descriptors,
//!   mappings and RSS (and this process's, the host side) and prints a CSV
//!   line; after the warm-up, a sample above the warm-up's highest plus
//!   the stated slack ([`SLACK`]) fails the test. `scripts/soak.sh` runs
//!   them long.
//! - `storm_of_256_hosts_then_all_killed` (RDMA),
//!   `tcp_storm_of_256_hosts_then_all_killed` and
//!   `iser_storm_of_256_initiators_then_all_killed` (iSCSI over iSER on
//!   the soft provider): 256 hosts in 8 processes connect at once to a
//!   target that serves at most 192 of them (384 NVMe-oF queues, or 192
//!   iSER connections; the others are refused cleanly), then all 8
//!   processes are SIGKILLed at once; the target then serves the next host
//!   normally and is back to its descriptors and mappings; twice, and the
//!   bytes live on its heap after the second storm are those after the
//!   first (the target counts them with `CountingAlloc`).
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::churn::{
    env_or, run_host_child, serve_target_child, sigkill, start_host_child, End, HeldHost, HostSide,
    Hosts, Sample, TargetProc, SLACK,
};
use common::churn_fabric::{ChurnHost, Fabric};
use common::churn_iser::IserHosts;
use pollux_nvmf::host::rdma::RdmaHost;
use pollux_nvmf::host::tcp::TcpHost;
use pollux_reactor::mem::CountingAlloc;
use pollux_verbs::soft::Soft;

/// The target child reports the bytes live on its heap (a leak check that
/// RSS, which keeps what the system allocator holds for reuse, cannot be).
#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Samples of the warm-up (caches, pools, allocator arenas fill): the
/// first 4 (200 cycles at the default `POLLUX_SOAK_SAMPLE_EVERY` of 50).
const WARMUP_SAMPLES: u64 = 4;
/// How long the target may take to notice hosts that went (KATO 1 s for
/// stalled hosts, plus its keep-alive poll period).
const NOTICE: Duration = Duration::from_secs(60);

/// How many more bytes the target's heap may hold after a storm than
/// before it (log lines, maps grown to a new capacity): the 192 connections
/// the storm served took about 100 KiB each.
const HEAP_SLACK: u64 = 1 << 20;
/// How many more bytes it may hold after the second storm than after the
/// first.
const REPEAT_SLACK: u64 = 64 << 10;

/// The soak samples this process too (the host side): the storm must not
/// run beside it.
static SERIAL: pollux_reactor::sync::Mutex<()> = pollux_reactor::sync::Mutex::new(());

/// Not a test on its own: the target child's body (`TargetProc::start`).
#[test]
#[ignore = "child process entry point, spawned by the churn tests (TargetProc::start)"]
fn child_target() {
    serve_target_child();
}

/// Not a test on its own: a host child's body (`start_host_child`).
#[test]
#[ignore = "child process entry point, spawned by the churn tests (start_host_child)"]
fn child_host() {
    run_host_child();
}

/// What cycle `n` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    End(End),
    /// A clean cycle through the host transport kept across cycles.
    LongLived,
    Refused,
    /// An I/O-queue Connect beyond the granted queues.
    OverLimit,
    Killed,
}

fn kind(n: u64) -> Kind {
    match n % 20 {
        3 | 13 => Kind::End(End::Drop),
        7 => Kind::End(End::Stall),
        11 => Kind::Refused,
        17 if n % 100 == 17 => Kind::Killed,
        19 => Kind::OverLimit,
        k if k % 2 == 0 => Kind::LongLived,
        _ => Kind::End(End::Clean),
    }
}

#[test]
fn soak_connect_io_disconnect_returns_everything() {
    soak::<RdmaHost<Soft>>(Fabric::Rdma);
}

#[test]
fn tcp_soak_connect_io_disconnect_returns_everything() {
    soak::<TcpHost>(Fabric::Tcp);
}

/// The soak over `fabric` (host transport `H`).
fn soak<H: ChurnHost>(fabric: Fabric) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let every = env_or("POLLUX_SOAK_SAMPLE_EVERY", 50);
    let total = env_or("POLLUX_SOAK_CYCLES", 500).max(every * (WARMUP_SAMPLES + 1));
    let mut tgt = TargetProc::start("child_target", fabric, "soak", 4096);
    let start = tgt.sample();
    println!(
        "soak: {} target pid {}, {total} cycles",
        fabric.name(),
        tgt.pid()
    );
    println!("cycle,tgt_fds,tgt_maps,tgt_rss_kib,host_fds,host_maps,host_rss_kib,accepted,destroyed,rejected,kato");
    println!(
        "0,{},{},{},,,,0,0,0,0",
        start.fds, start.maps, start.rss_kib
    );
    let cl = pollux_reactor::TestCluster::new(1);
    let mut warm_t: Option<Sample> = None;
    let mut warm_h: Option<Sample> = None;
    let mut stalled: Vec<HeldHost<H>> = Vec::new();
    let mut tally = [0u64; 7];
    let mut last_kato = 0;
    cl.on(0, |r| {
        let hosts = Hosts::<H>::new();
        for n in 1..=total {
            match kind(n) {
                Kind::End(end) => {
                    match hosts.cycle(r, &tgt.addr, n, end) {
                        Ok(Some(h)) => stalled.push(h),
                        Ok(None) => {}
                        Err(e) => panic!("cycle {n} ({end:?}): {e}"),
                    }
                    tally[end as usize] += 1;
                }
                Kind::LongLived => {
                    hosts
                        .cycle_long_lived(r, &tgt.addr, n)
                        .unwrap_or_else(|e| panic!("cycle {n} (long-lived host): {e}"));
                    tally[5] += 1;
                }
                Kind::Refused => {
                    hosts
                        .refused(&tgt.addr, n)
                        .unwrap_or_else(|e| panic!("cycle {n}: {e}"));
                    tally[3] += 1;
                }
                Kind::OverLimit => {
                    hosts
                        .over_limit(&tgt.addr, n)
                        .unwrap_or_else(|e| panic!("cycle {n} (over the limit): {e}"));
                    tally[6] += 1;
                }
                Kind::Killed => {
                    let (child, ok) = start_host_child("child_host", fabric, &tgt.addr, 1, 1, true);
                    assert_eq!(ok, 1, "cycle {n}: the host child could not connect");
                    sigkill(child.0.id());
                    drop(child);
                    tally[4] += 1;
                }
            }
            if n % every == 0 {
                // Quiescent point: the stalled hosts' KATO ended them, the
                // killed and dropped ones were noticed.
                let c = tgt.wait_idle(NOTICE);
                stalled.clear();
                let t = tgt.sample();
                let h = Sample::of(None);
                println!(
                    "{n},{},{},{},{},{},{},{},{},{},{}",
                    t.fds,
                    t.maps,
                    t.rss_kib,
                    h.fds,
                    h.maps,
                    h.rss_kib,
                    c.accepted,
                    c.destroyed,
                    c.rejected,
                    c.kato
                );
                if n <= every * WARMUP_SAMPLES {
                    warm_t = Some(warm_t.map_or(t, |w| w.max(t)));
                    warm_h = Some(warm_h.map_or(h, |w| w.max(h)));
                } else {
                    t.check("target", n, warm_t.unwrap(), SLACK);
                    h.check("host side", n, warm_h.unwrap(), SLACK);
                }
                assert_eq!(c.accepted, c.destroyed, "every accepted queue is destroyed");
                last_kato = c.kato;
            }
        }
    });
    println!(
        "soak: {} {} clean, {} clean through the long-lived host, {} dropped, {} stalled ({} keep-alive timeouts counted), {} refused, {} over the limit, {} killed",
        fabric.name(),
        tally[0],
        tally[5],
        tally[1],
        tally[2],
        last_kato,
        tally[3],
        tally[6],
        tally[4]
    );
    assert!(
        tally.iter().all(|&t| t > 0),
        "every kind of cycle ran: {tally:?}"
    );
    // Counted up to the last sample: stalled hosts after it are not.
    let stalled_sampled = (1..=total - total % every)
        .filter(|&n| kind(n) == Kind::End(End::Stall))
        .count() as u64;
    assert!(
        last_kato >= stalled_sampled,
        "{stalled_sampled} hosts stopped their keep-alives, {last_kato} keep-alive timeouts counted"
    );
}

#[test]
fn storm_of_256_hosts_then_all_killed() {
    storm::<Hosts<RdmaHost<Soft>>>(Fabric::Rdma);
}

#[test]
fn tcp_storm_of_256_hosts_then_all_killed() {
    storm::<Hosts<TcpHost>>(Fabric::Tcp);
}

#[test]
fn iser_storm_of_256_initiators_then_all_killed() {
    storm::<IserHosts>(Fabric::Iser);
}

/// The storm over `fabric` (hosts `S`), twice: 256 hosts in 8 processes
/// connect at once to a target that serves at most 192 of them, then all 8
/// processes are SIGKILLed; the next host is served, the target is back to
/// its descriptors and mappings, its live heap is within [`HEAP_SLACK`] of
/// where it was before the storms and within [`REPEAT_SLACK`] of where the
/// first storm left it. (Its RSS is printed, not bounded: the system
/// allocator keeps freed memory for reuse.)
fn storm<S: HostSide>(fabric: Fabric) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    const PROCS: usize = 8;
    const PER_PROC: usize = 32;
    // Connecting from a thread spins; 2 per process keeps a small machine
    // able to run the target.
    const THREADS: usize = 2;
    const SERVED: usize = 192;
    let limit = SERVED * fabric.queues_per_host();
    let mut tgt = TargetProc::start("child_target", fabric, "storm", limit);
    let cl = pollux_reactor::TestCluster::new(1);
    // One host first: warm the target's pools and caches.
    cl.on(0, |r| S::new_side().clean_cycle(r, &tgt.addr, 1).unwrap());
    let warm = tgt.wait_idle(NOTICE);
    let before = tgt.sample();
    let mut first_heap = None;
    for round in 1..=2u64 {
        // All 8 processes connect at once (their 32 threads each).
        let addr = tgt.addr.clone();
        let starters: Vec<_> = (0..PROCS)
            .map(|_| {
                let a = addr.clone();
                std::thread::spawn(move || {
                    start_host_child("child_host", fabric, &a, PER_PROC, THREADS, false)
                })
            })
            .collect();
        let children: Vec<_> = starters.into_iter().map(|t| t.join().unwrap()).collect();
        let connected: usize = children.iter().map(|(_, ok)| ok).sum();
        let during = tgt.counts();
        let peak = tgt.sample();
        println!(
            "storm {round}: {} {connected} of {} hosts connected, target served {} queues (limit {limit}), {} rejected; fds {} -> {}, maps {} -> {}",
            fabric.name(),
            PROCS * PER_PROC,
            during.live,
            during.rejected,
            before.fds,
            peak.fds,
            before.maps,
            peak.maps
        );
        assert!(during.live <= limit, "{during:?}");
        assert!(
            connected >= SERVED - PROCS,
            "only {connected} hosts connected under a limit of {limit} queues"
        );
        assert!(
            connected < PROCS * PER_PROC && during.rejected > 0,
            "the limit refused the hosts beyond it: {connected} connected, {during:?}"
        );
        // All killed at once.
        for (c, _) in &children {
            sigkill(c.0.id());
        }
        drop(children);
        let after_kill = tgt.wait_idle(NOTICE);
        assert_eq!(after_kill.accepted, after_kill.destroyed, "{after_kill:?}");
        // The next host is served normally.
        cl.on(0, |r| {
            S::new_side().clean_cycle(r, &tgt.addr, 1 + round).unwrap()
        });
        let idle = tgt.wait_idle(NOTICE);
        let after = tgt.sample();
        println!(
            "storm {round}: {} after: fds {} maps {} rss {} KiB heap {} B (before: {} {} {} KiB {} B)",
            fabric.name(),
            after.fds,
            after.maps,
            after.rss_kib,
            idle.heap,
            before.fds,
            before.maps,
            before.rss_kib,
            warm.heap
        );
        assert!(
            after.fds <= before.fds + SLACK.fds,
            "{before:?} -> {after:?}"
        );
        assert!(
            after.maps <= before.maps + SLACK.maps,
            "{before:?} -> {after:?}"
        );
        assert!(
            idle.heap > 0 && idle.heap <= warm.heap + HEAP_SLACK,
            "the target's live heap grew from {} to {} bytes over storm {round}",
            warm.heap,
            idle.heap
        );
        // What the first storm grew (map capacities) the second reuses.
        let first = *first_heap.get_or_insert(idle.heap);
        assert!(
            idle.heap <= first + REPEAT_SLACK,
            "the target's live heap grew from {first} bytes after the first storm to {} after the second",
            idle.heap
        );
    }
}
