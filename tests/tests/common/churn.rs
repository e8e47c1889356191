//! Connection churn against a target process: the target child, host
//! children that are SIGKILLed, the in-process host cycles, and samples of
//! a process's descriptors, mappings and RSS (the soak and storm tests).
//!
//! The target is the test binary re-executed with `POLLUX_CHURN_TARGET`
//! set (the `child_target` entry of the test binary); it serves a malloc
//! namespace over the soft provider and answers `q` on its stdin with one
//! `live N accepted A destroyed D rejected R` line (queues placed and not
//! yet destroyed, and the transport's counters).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pollux_nvmf::host::rdma::{MemMode, RdmaHost, RdmaHostOptions};
use pollux_nvmf::host::{Controller, CtrlOptions, HostIdentity, Qpair, DEFAULT_HOSTNQN};
use pollux_nvmf::target::rdma::RdmaOptions;
use pollux_nvmf::target::TargetOptions;
use pollux_reactor::mem::{BufPool, BufPoolOptions, SgList};
use pollux_reactor::{launch, Cores, LaunchConfig, PollStatus, Reactor};
use pollux_verbs::soft::Soft;
use pollux_verbs::CmAddr;

/// The subsystem the churn target serves.
pub const NQN: &str = "nqn.2024-01.io.pollux:churn";
/// Environment variable that turns the test binary into the target.
pub const TARGET_ENV: &str = "POLLUX_CHURN_TARGET";
/// `max_qpairs` of the target child (environment; default 4096).
pub const MAX_QPAIRS_ENV: &str = "POLLUX_CHURN_MAX_QPAIRS";
/// Environment variable that turns the test binary into a host child
/// (`ADDR,HOSTS`: connect HOSTS controllers, print READY, run I/O until
/// killed).
pub const HOST_ENV: &str = "POLLUX_CHURN_HOST";
/// Bytes of one verified I/O (blocks of 512).
const IO: usize = 4096;
/// Longest the target child serves (in case the parent died).
const CHILD_LIFE: Duration = Duration::from_secs(1800);

/// Descriptors, mappings and resident memory of one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// Entries of `/proc/PID/fd`.
    pub fds: usize,
    /// Lines of `/proc/PID/maps`.
    pub maps: usize,
    /// `VmRSS`, KiB.
    pub rss_kib: u64,
}

impl Sample {
    /// Sample process `pid` (`None`: this process).
    pub fn of(pid: Option<u32>) -> Sample {
        let p = pid.map_or_else(|| "self".to_string(), |p| p.to_string());
        let fds = std::fs::read_dir(format!("/proc/{p}/fd")).map_or(0, |d| d.count());
        let maps =
            std::fs::read_to_string(format!("/proc/{p}/maps")).map_or(0, |s| s.lines().count());
        let rss_kib = std::fs::read_to_string(format!("/proc/{p}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmRSS:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|v| v.parse().ok())
            })
            .unwrap_or(0);
        Sample { fds, maps, rss_kib }
    }

    /// The larger of each field.
    pub fn max(self, o: Sample) -> Sample {
        Sample {
            fds: self.fds.max(o.fds),
            maps: self.maps.max(o.maps),
            rss_kib: self.rss_kib.max(o.rss_kib),
        }
    }

    /// Panic unless this sample of `label`, after `n` cycles, is within
    /// `slack` of the warm-up's highest `warm`.
    pub fn check(self, label: &str, n: u64, warm: Sample, slack: Sample) {
        assert!(
            self.fds <= warm.fds + slack.fds,
            "{label}: descriptors grew to {} after {n} cycles (warm-up highest {}, slack {})",
            self.fds,
            warm.fds,
            slack.fds
        );
        assert!(
            self.maps <= warm.maps + slack.maps,
            "{label}: mappings grew to {} after {n} cycles (warm-up highest {}, slack {})",
            self.maps,
            warm.maps,
            slack.maps
        );
        assert!(
            self.rss_kib <= warm.rss_kib + slack.rss_kib,
            "{label}: RSS grew to {} KiB after {n} cycles (warm-up highest {} KiB, slack {} KiB)",
            self.rss_kib,
            warm.rss_kib,
            slack.rss_kib
        );
    }
}

/// The slack of the soak tests over the warm-up's highest sample: 4
/// descriptors, 8 mappings, 8 MiB of RSS (allocator noise).
pub const SLACK: Sample = Sample {
    fds: 4,
    maps: 8,
    rss_kib: 8 * 1024,
};

/// A positive number from the environment variable `name`, or `default`.
pub fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&v| v > 0)
        .unwrap_or(default)
}

/// Kills and reaps a child when dropped, whatever happened.
pub struct Reaper(pub Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// SIGKILL process `pid` (the host children: no chance to disconnect).
pub fn sigkill(pid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
}

/// The target child: its process, stdin (queries) and stdout (answers).
pub struct TargetProc {
    child: Reaper,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// Its listen address.
    pub addr: String,
}

/// What the target child reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TargetCounts {
    /// Queues placed and not yet destroyed.
    pub live: usize,
    /// Queues accepted so far.
    pub accepted: u64,
    /// Queues destroyed so far.
    pub destroyed: u64,
    /// Connect requests rejected so far.
    pub rejected: u64,
}

impl TargetProc {
    /// Start the target child (the test binary's `entry` test) listening
    /// at a fresh address, with `max_qpairs`; returns once it listens.
    pub fn start(entry: &str, tag: &str, max_qpairs: usize) -> TargetProc {
        let addr = format!("@pollux-churn-{tag}-{}", std::process::id());
        let mut child = Command::new(std::env::current_exe().expect("exe"))
            .args(["--exact", entry, "--nocapture", "--test-threads", "1"])
            .env(TARGET_ENV, &addr)
            .env(MAX_QPAIRS_ENV, max_qpairs.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the target child");
        let stdin = child.stdin.take().expect("stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        loop {
            line.clear();
            let n = stdout.read_line(&mut line).expect("target stdout");
            assert!(n > 0, "the target child ended before it listened");
            if line.contains("POLLUX-CHURN-READY") {
                break;
            }
        }
        TargetProc {
            child: Reaper(child),
            stdin,
            stdout,
            addr,
        }
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.0.id()
    }

    /// Its descriptors, mappings and RSS now.
    pub fn sample(&self) -> Sample {
        Sample::of(Some(self.pid()))
    }

    /// Ask the child for its counts.
    pub fn counts(&mut self) -> TargetCounts {
        writeln!(self.stdin, "q").expect("query the target");
        self.stdin.flush().expect("flush");
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stdout.read_line(&mut line).expect("target stdout");
            assert!(n > 0, "the target child is gone");
            if let Some(rest) = line.trim().split("POLLUX-CHURN-COUNTS ").nth(1) {
                let v: Vec<u64> = rest
                    .split_whitespace()
                    .filter_map(|w| w.parse().ok())
                    .collect();
                assert_eq!(v.len(), 4, "bad counts line {line:?}");
                return TargetCounts {
                    live: v[0] as usize,
                    accepted: v[1],
                    destroyed: v[2],
                    rejected: v[3],
                };
            }
        }
    }

    /// Wait (bounded by `limit`) until the target serves no queue: every
    /// host that went has been noticed and its queues destroyed.
    pub fn wait_idle(&mut self, limit: Duration) -> TargetCounts {
        let start = Instant::now();
        loop {
            let c = self.counts();
            if c.live == 0 {
                return c;
            }
            assert!(
                start.elapsed() < limit,
                "the target still serves {} queue(s) after {limit:?}: {c:?}",
                c.live
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The body of the target child: serve until stdin closes (answering `q`
/// queries), then stop. Returns at once unless [`TARGET_ENV`] is set.
pub fn serve_target_child() {
    let Ok(addr) = std::env::var(TARGET_ENV) else {
        return;
    };
    let max_qpairs = std::env::var(MAX_QPAIRS_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4096);
    let (_target, transport) = super::soft_rdma_target_with(
        NQN,
        "malloc:size=16M,block=512,name=churn",
        &addr,
        TargetOptions {
            num_slot_buffers: 4096,
            ..TargetOptions::for_tests()
        },
        RdmaOptions {
            num_cqe: 1 << 20,
            max_srq_depth: 1024,
            max_qpairs,
            max_qpairs_per_core: max_qpairs,
            acceptor_backlog: 1024,
            ..RdmaOptions::for_tests()
        },
    );
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let tx = std::sync::Mutex::new(tx);
    let t2 = transport.clone();
    let set = launch(
        LaunchConfig::new(Cores::parse("0").expect("core")),
        move |r| {
            let pg = t2.create_poll_group(r).expect("poll group");
            r.add_poller("keep", move || {
                let _ = &pg;
                PollStatus::Idle
            });
            let _ = tx.lock().map(|t| t.send(()));
        },
    )
    .expect("launch");
    rx.recv_timeout(Duration::from_secs(30))
        .expect("poll group");
    println!("POLLUX-CHURN-READY");
    let done = Arc::new(AtomicBool::new(false));
    let d2 = done.clone();
    // Bounded life even if the parent never closes stdin.
    std::thread::spawn(move || {
        let start = Instant::now();
        while !d2.load(Ordering::Relaxed) && start.elapsed() < CHILD_LIFE {
            std::thread::sleep(Duration::from_millis(100));
        }
        if !d2.load(Ordering::Relaxed) {
            std::process::exit(0);
        }
    });
    for line in std::io::stdin().lines() {
        let Ok(line) = line else { break };
        if line.trim() == "q" {
            let s = transport.stats();
            let live: usize = transport.queues_per_group().iter().sum();
            println!(
                "POLLUX-CHURN-COUNTS {live} {} {} {}",
                s.accepted, s.destroyed, s.rejected
            );
        }
    }
    done.store(true, Ordering::Relaxed);
    set.stop_all();
    let _ = set.join();
}

/// How a host cycle ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Disconnect the I/O queue and shut the controller down.
    Clean,
    /// Drop everything without a word to the target (a host that
    /// vanished: the target sees its connections hang up).
    Drop,
    /// Stop polling and sending keep-alives, keeping the connections
    /// open: the target's keep-alive timer ends the controller.
    Stall,
}

/// The connections of a host kept past its cycle ([`End::Stall`]).
pub struct HeldHost {
    _qp: HeldQp,
    _ctrl: Controller<RdmaHost<Soft>>,
    _host: RdmaHost<Soft>,
}

/// Host side of the cycles: one reactor on this thread and one pool of
/// I/O buffers for every cycle.
pub struct Hosts {
    pool: BufPool,
    /// One host transport kept across cycles (as `pollux-perf` keeps its
    /// own while it reconnects): opened on first use.
    long_lived: std::cell::RefCell<Option<RdmaHost<Soft>>>,
}

impl Default for Hosts {
    fn default() -> Self {
        Hosts::new()
    }
}

fn who(subnqn: &str, n: u64) -> HostIdentity {
    let mut hostid = *b"churn-host-00000";
    let d = format!("{:05}", n % 100_000);
    hostid[11..].copy_from_slice(d.as_bytes());
    HostIdentity {
        hostnqn: DEFAULT_HOSTNQN.into(),
        hostid,
        subnqn: subnqn.into(),
    }
}

fn pattern(seed: u64, b: &mut [u8]) {
    for (i, x) in b.iter_mut().enumerate() {
        *x = (i as u64).wrapping_mul(131).wrapping_add(seed) as u8;
    }
}

/// Connect a host to `addr` (KATO `kato`) with one I/O queue.
pub fn connect(addr: &str, subnqn: &str, n: u64, kato: Duration) -> Result<Connected, String> {
    let host = open_host(addr, n)?;
    let (ctrl, qp) = connect_on(&host, subnqn, n, kato)?;
    Ok((host, ctrl, qp))
}

/// A host transport to `addr` (`register-always` for even `n`, `pool` for
/// odd).
pub fn open_host(addr: &str, n: u64) -> Result<RdmaHost<Soft>, String> {
    let opts = RdmaHostOptions {
        mem_mode: if n % 2 == 0 {
            MemMode::RegisterAlways
        } else {
            MemMode::Pool
        },
        connect_timeout: Duration::from_secs(120),
        ..RdmaHostOptions::default()
    };
    RdmaHost::<Soft>::open(None, CmAddr::new(addr.to_string()), opts)
        .map_err(|e| format!("open: {e}"))
}

/// Connect a controller with one I/O queue through `host`.
pub fn connect_on(
    host: &RdmaHost<Soft>,
    subnqn: &str,
    n: u64,
    kato: Duration,
) -> Result<(Controller<RdmaHost<Soft>>, HeldQp), String> {
    let ctrl = Controller::connect(
        host,
        who(subnqn, n),
        CtrlOptions {
            kato,
            io_queues: 1,
            timeout: Duration::from_secs(120),
            io_timeout: Duration::from_secs(120),
            ..CtrlOptions::default()
        },
    )
    .map_err(|e| format!("connect: {e}"))?;
    let qp = ctrl
        .connect_io(host, 1, 16, None)
        .map_err(|e| format!("I/O queue: {e}"))?;
    Ok((ctrl, qp))
}

/// The host's I/O queue type.
pub type HeldQp = Qpair<<RdmaHost<Soft> as pollux_nvmf::host::HostTransport>::Queue>;

/// A connected host: its transport, controller and I/O queue.
pub type Connected = (RdmaHost<Soft>, Controller<RdmaHost<Soft>>, HeldQp);

impl Hosts {
    /// A host side (call on the thread that runs the cycles).
    pub fn new() -> Hosts {
        Hosts {
            pool: BufPool::new(BufPoolOptions::new("churn-host", IO, 8)).expect("host pool"),
            long_lived: std::cell::RefCell::new(None),
        }
    }

    /// Write a pattern to `lba`, read it back, compare.
    pub fn verified_io(
        &self,
        r: &Reactor,
        qp: &mut HeldQp,
        lba: u64,
        seed: u64,
    ) -> Result<(), String> {
        let blocks = (IO / 512) as u32;
        let mut b = self.pool.get().ok_or("host pool empty")?;
        pattern(seed, b.as_mut_slice());
        qp.write(1, lba, blocks, SgList::from_buf(b), 1)
            .map_err(|e| format!("write: {e:?}"))?;
        self.wait_one(r, qp, |_| Ok(()))?;
        let mut b = self.pool.get().ok_or("host pool empty")?;
        b.as_mut_slice().fill(0xEE);
        qp.read(1, lba, blocks, SgList::from_buf(b), 2)
            .map_err(|e| format!("read: {e:?}"))?;
        self.wait_one(r, qp, |data| {
            let mut want = vec![0u8; IO];
            pattern(seed, &mut want);
            let mut have = vec![0u8; IO];
            data.copy_to_slice(&mut have);
            if have == want {
                Ok(())
            } else {
                Err(format!(
                    "lba {lba}: read back differs from what was written"
                ))
            }
        })
    }

    fn wait_one(
        &self,
        r: &Reactor,
        qp: &mut HeldQp,
        check: impl FnOnce(&SgList) -> Result<(), String>,
    ) -> Result<(), String> {
        let start = Instant::now();
        let mut got = None;
        while got.is_none() {
            qp.poll(&mut |c| got = Some(c));
            if start.elapsed() > Duration::from_secs(20) {
                return Err("an I/O did not complete in 20 s".into());
            }
            r.poll_once();
        }
        let c = got.ok_or("no completion")?;
        c.result.map_err(|e| format!("I/O failed: {e:?}"))?;
        check(&c.data)
    }

    /// A clean cycle through the long-lived host transport: connect,
    /// verified I/O, disconnect and shut down, the transport kept.
    pub fn cycle_long_lived(&self, r: &Reactor, addr: &str, n: u64) -> Result<(), String> {
        let mut slot = self.long_lived.borrow_mut();
        if slot.is_none() {
            *slot = Some(open_host(addr, 0)?);
        }
        let host = slot.as_ref().ok_or("no host")?;
        let (ctrl, mut qp) = connect_on(host, NQN, n, Duration::from_secs(10))?;
        self.verified_io(r, &mut qp, (n % 2048) * 8, n)?;
        qp.disconnect();
        drop(qp);
        ctrl.shutdown().map_err(|e| format!("shutdown: {e}"))
    }

    /// One cycle: connect, verified I/O, end as `end`. A stalled host is
    /// returned to be held by the caller.
    pub fn cycle(
        &self,
        r: &Reactor,
        addr: &str,
        n: u64,
        end: End,
    ) -> Result<Option<HeldHost>, String> {
        let kato = if end == End::Stall {
            Duration::from_secs(1)
        } else {
            Duration::from_secs(10)
        };
        let (host, mut ctrl, mut qp) = connect(addr, NQN, n, kato)?;
        self.verified_io(r, &mut qp, (n % 2048) * 8, n)?;
        ctrl.poll().map_err(|e| format!("admin poll: {e}"))?;
        match end {
            End::Clean => {
                qp.disconnect();
                drop(qp);
                ctrl.shutdown().map_err(|e| format!("shutdown: {e}"))?;
                drop(host);
                Ok(None)
            }
            End::Drop => {
                drop(qp);
                drop(ctrl);
                drop(host);
                Ok(None)
            }
            End::Stall => Ok(Some(HeldHost {
                _qp: qp,
                _ctrl: ctrl,
                _host: host,
            })),
        }
    }

    /// A connect that must be refused (an unknown subsystem): `Ok` when it
    /// was, with the error the host saw.
    pub fn refused(&self, addr: &str, n: u64) -> Result<String, String> {
        match connect(
            addr,
            "nqn.2024-01.io.pollux:no-such-subsystem",
            n,
            Duration::ZERO,
        ) {
            Ok(_) => Err("a connect to an unknown subsystem was accepted".into()),
            Err(e) => Ok(e),
        }
    }
}

/// The body of a host child (`ADDR,HOSTS,THREADS[,io]`): THREADS threads
/// at once connect HOSTS controllers in all (each its share, one after the
/// other, KATO 0), each with one verified I/O; prints
/// `POLLUX-CHURN-HOST-READY ok refused`, then holds the connections until
/// killed (bounded), idle or, with `io`, running I/O. Returns at once unless [`HOST_ENV`] is
/// set.
pub fn run_host_child() {
    let Ok(v) = std::env::var(HOST_ENV) else {
        return;
    };
    let mut it = v.split(',');
    let addr = it.next().unwrap_or_default().to_string();
    let hosts: u64 = it.next().and_then(|h| h.parse().ok()).unwrap_or(1);
    let threads: u64 = it
        .next()
        .and_then(|h| h.parse().ok())
        .unwrap_or(1)
        .clamp(1, hosts.max(1));
    let busy = it.next() == Some("io");
    let (tx, rx) = std::sync::mpsc::channel::<bool>();
    for t in 0..threads {
        let addr = addr.clone();
        let tx = tx.clone();
        let share = hosts / threads + u64::from(t < hosts % threads);
        std::thread::spawn(move || {
            let cl = pollux_reactor::TestCluster::new(1);
            cl.on(0, |r| {
                let h = Hosts::new();
                let mut held = Vec::new();
                for k in 0..share {
                    let seed = u64::from(std::process::id()) * 1000 + t * 100 + k;
                    let res = connect(&addr, NQN, seed, Duration::ZERO).and_then(
                        |(host, ctrl, mut qp)| {
                            h.verified_io(r, &mut qp, (seed % 2048) * 8, seed)?;
                            Ok((host, ctrl, qp))
                        },
                    );
                    match res {
                        Ok(c) => {
                            held.push(c);
                            let _ = tx.send(true);
                        }
                        Err(e) => {
                            eprintln!("POLLUX-CHURN-HOST-REFUSED {e}");
                            let _ = tx.send(false);
                        }
                    }
                }
                // Hold the connections until killed: idle, or with I/O
                // in flight (4 KiB writes and reads, one at a time).
                let start = Instant::now();
                while start.elapsed() < Duration::from_secs(300) {
                    if !busy || held.is_empty() {
                        std::thread::sleep(Duration::from_millis(100));
                        continue;
                    }
                    for (k, (_, _, qp)) in held.iter_mut().enumerate() {
                        let _ = h.verified_io(r, qp, k as u64 * 8, k as u64);
                    }
                }
                drop(held);
            });
        });
    }
    drop(tx);
    let results: Vec<bool> = rx.iter().take(hosts as usize).collect();
    let ok = results.iter().filter(|&&b| b).count();
    println!("POLLUX-CHURN-HOST-READY {ok} {}", results.len() - ok);
    std::thread::sleep(Duration::from_secs(300));
}

/// Start a host child running `hosts` hosts from `threads` threads
/// against `addr` (the test binary's `entry` test; `io`: keep I/O going);
/// returns it and, once all connected or were refused, how many
/// connected.
pub fn start_host_child(
    entry: &str,
    addr: &str,
    hosts: usize,
    threads: usize,
    io: bool,
) -> (Reaper, usize) {
    let mut child = Command::new(std::env::current_exe().expect("exe"))
        .args(["--exact", entry, "--nocapture", "--test-threads", "1"])
        .env(
            HOST_ENV,
            format!(
                "{addr},{hosts},{threads},{}",
                if io { "io" } else { "idle" }
            ),
        )
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn a host child");
    let out = child.stdout.take().expect("stdout");
    let mut ok = None;
    for l in BufReader::new(out).lines() {
        let Ok(l) = l else { break };
        // libtest's "test NAME ... " may start the same line.
        if let Some(rest) = l.split("POLLUX-CHURN-HOST-READY ").nth(1) {
            ok = rest.split_whitespace().next().and_then(|v| v.parse().ok());
            break;
        }
    }
    (Reaper(child), ok.expect("the host child did not report"))
}
