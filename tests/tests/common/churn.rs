//! Connection churn against a target process: the target child, host
//! children that are SIGKILLed, the in-process host cycles, and samples of
//! a process's descriptors, mappings and RSS (the soak and storm tests).
//!
//! The target is the test binary re-executed with `POLLUX_CHURN_TARGET`
//! set (the `child_target` entry of the test binary) and the fabric in
//! [`FABRIC_ENV`]; it serves a malloc namespace over the soft RDMA
//! provider or NVMe/TCP on loopback (or a malloc LU over iSER,
//! [`super::churn_iser`]) and answers `q` on its stdin with one
//! `live N accepted A destroyed D rejected R kato K` line (queues or
//! connections placed and not yet destroyed, the transport's counters and
//! the subsystem's keep-alive timeouts or the iSCSI target's NOP
//! timeouts). The host children run NVMe-oF hosts or iSER initiators
//! through [`HostSide`].

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pollux_nvmf::host::{
    connect_io_qpair, Controller, CtrlOptions, DataDir, HostIdentity, HostTransport, Qpair,
    DEFAULT_HOSTNQN,
};
use pollux_nvmf::spec::features::{fid, FeatureCmd};
use pollux_nvmf::target::rdma::RdmaOptions;
use pollux_nvmf::target::tcp::TcpOptions;
use pollux_nvmf::target::{Target, TargetOptions, TargetTransport};
use pollux_reactor::mem::{BufPool, BufPoolOptions, CountingAlloc, SgList};
use pollux_reactor::Reactor;

use super::churn_fabric::{ChurnHost, Fabric, FABRIC_ENV};

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
/// Keep-alive timeout of every host while its cycle runs: long, so a
/// cycle slowed down by a loaded machine is never ended by it.
const KATO: Duration = Duration::from_secs(60);
/// Keep-alive timeout a stalled host sets once its cycle is done.
const STALL_KATO: Duration = Duration::from_secs(1);
/// Longest wait for one I/O (a bound against a hang, not a speed check).
const IO_LIMIT: Duration = Duration::from_secs(120);
/// Bytes of one verified I/O (blocks of 512).
const IO: usize = 4096;
/// Longest (ms) the target child serves without a query from the parent
/// (in case the parent hangs; a parent that died closes the child's stdin).
const CHILD_IDLE_MS: u64 = 600_000;

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
    /// Its fabric.
    pub fabric: Fabric,
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
    /// Connect requests (RDMA) or connections (TCP) refused so far.
    pub rejected: u64,
    /// Controllers the subsystem ended by keep-alive timeout so far
    /// (iSER: connections the target ended by NOP timeout).
    pub kato: u64,
    /// Bytes live on the target's heap ([`CountingAlloc::live_bytes`]:
    /// 0 unless the test binary installs the counting allocator); filled
    /// in by [`serve_queries`].
    pub heap: u64,
}

impl TargetProc {
    /// Start the target child (the test binary's `entry` test) over
    /// `fabric`, listening at a fresh address, with `max_qpairs` (RDMA);
    /// returns once it listens.
    pub fn start(entry: &str, fabric: Fabric, tag: &str, max_qpairs: usize) -> TargetProc {
        let addr = fabric.fresh_addr(tag);
        let mut child = pollux_reactor::test_env::child_test(entry)
            .env(TARGET_ENV, &addr)
            .env(FABRIC_ENV, fabric.name())
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
            fabric,
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
                assert_eq!(v.len(), 6, "bad counts line {line:?}");
                return TargetCounts {
                    live: v[0] as usize,
                    accepted: v[1],
                    destroyed: v[2],
                    rejected: v[3],
                    kato: v[4],
                    heap: v[5],
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

/// The target's options in the child: 4,096 slot buffers (thousands of
/// queues may be live in the storm).
fn child_target_options() -> TargetOptions {
    TargetOptions {
        num_slot_buffers: 4096,
        ..TargetOptions::for_tests()
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
    let bdev = "malloc:size=16M,block=512,name=churn";
    match Fabric::from_env() {
        Fabric::Rdma => {
            let (target, transport) = super::soft_rdma_target_with(
                NQN,
                bdev,
                &addr,
                child_target_options(),
                RdmaOptions {
                    num_cqe: 1 << 20,
                    max_srq_depth: 1024,
                    max_qpairs,
                    max_qpairs_per_core: max_qpairs,
                    acceptor_backlog: 1024,
                    ..RdmaOptions::for_tests()
                },
            );
            let t2 = transport.clone();
            serve(&target, transport, move || {
                t2.queues_per_group().iter().sum()
            });
        }
        Fabric::Tcp => {
            let sa = addr.parse().expect("the TCP target's address");
            let topts = child_target_options();
            let tcp = TcpOptions {
                max_qpairs,
                max_qpairs_per_core: max_qpairs,
                ..TcpOptions::for_target(&topts)
            };
            let (target, transport) = super::tcp_target_with(NQN, bdev, sa, topts, tcp);
            let t2 = transport.clone();
            serve(&target, transport, move || {
                t2.queues_per_group().iter().sum()
            });
        }
        Fabric::Iser => super::churn_iser::serve_target(&addr, max_qpairs),
    }
}

/// Serve `target` over `transport` from one reactor on core 0 (one poll
/// group), answering queries ([`serve_queries`]; `live`: its queues now)
/// until stdin closes.
fn serve<T: TargetTransport>(target: &Arc<Target>, transport: Arc<T>, live: impl Fn() -> usize) {
    let t2 = transport.clone();
    let set = super::launch_with_groups("0", move |r| {
        t2.clone().start_poll_group(r).expect("poll group")
    });
    serve_queries(|| {
        let s = TargetTransport::stats(&*transport);
        TargetCounts {
            live: live(),
            accepted: s.accepted,
            destroyed: s.destroyed,
            rejected: s.rejected,
            kato: target
                .subsystem(NQN)
                .map_or(0, |s| s.counters().snapshot().keep_alive_timeouts),
            ..TargetCounts::default()
        }
    });
    set.stop_all();
    let _ = set.join();
}

/// Say the target child is ready, then answer `q` on stdin with the
/// `counts` until stdin closes.
pub fn serve_queries(counts: impl Fn() -> TargetCounts) {
    println!("POLLUX-CHURN-READY");
    let done = Arc::new(AtomicBool::new(false));
    let d2 = done.clone();
    let start = Instant::now();
    // Milliseconds since `start` of the parent's last query.
    let last = Arc::new(AtomicU64::new(0));
    let l2 = last.clone();
    // Bounded life even if the parent hangs without closing stdin.
    std::thread::spawn(move || {
        while !d2.load(Ordering::Relaxed) {
            let now = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
            if now.saturating_sub(l2.load(Ordering::Relaxed)) > CHILD_IDLE_MS {
                std::process::exit(0);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    for line in std::io::stdin().lines() {
        let Ok(line) = line else { break };
        let now = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
        last.store(now, Ordering::Relaxed);
        if line.trim() == "q" {
            let c = counts();
            println!(
                "POLLUX-CHURN-COUNTS {} {} {} {} {} {}",
                c.live,
                c.accepted,
                c.destroyed,
                c.rejected,
                c.kato,
                CountingAlloc::live_bytes()
            );
        }
    }
    done.store(true, Ordering::Relaxed);
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
pub struct HeldHost<H: HostTransport> {
    _qp: HeldQp<H>,
    _ctrl: Controller<H>,
    _host: H,
}

/// Host side of the cycles: one reactor on this thread and one pool of
/// I/O buffers for every cycle.
pub struct Hosts<H: ChurnHost> {
    pool: BufPool,
    /// One host transport kept across cycles (as `pollux-perf` keeps its
    /// own while it reconnects): opened on first use.
    long_lived: std::cell::RefCell<Option<H>>,
}

impl<H: ChurnHost> Default for Hosts<H> {
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
pub fn connect<H: ChurnHost>(
    addr: &str,
    subnqn: &str,
    n: u64,
    kato: Duration,
) -> Result<Connected<H>, String> {
    let host = H::open(addr, n)?;
    let (ctrl, qp) = connect_on(&host, subnqn, n, kato)?;
    Ok((host, ctrl, qp))
}

/// Connect a controller (one I/O queue granted) through `host`.
fn connect_ctrl<H: ChurnHost>(
    host: &H,
    subnqn: &str,
    n: u64,
    kato: Duration,
) -> Result<Controller<H>, String> {
    Controller::connect(
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
    .map_err(|e| format!("connect: {e}"))
}

/// Connect a controller with one I/O queue through `host`.
pub fn connect_on<H: ChurnHost>(
    host: &H,
    subnqn: &str,
    n: u64,
    kato: Duration,
) -> Result<(Controller<H>, HeldQp<H>), String> {
    let ctrl = connect_ctrl(host, subnqn, n, kato)?;
    let qp = ctrl
        .connect_io(host, 1, 16, None)
        .map_err(|e| format!("I/O queue: {e}"))?;
    Ok((ctrl, qp))
}

/// The host's I/O queue type.
pub type HeldQp<H> = Qpair<<H as HostTransport>::Queue>;

/// A connected host: its transport, controller and I/O queue.
pub type Connected<H> = (H, Controller<H>, HeldQp<H>);

impl<H: ChurnHost> Hosts<H> {
    /// A host side (call on the thread that runs the cycles).
    pub fn new() -> Hosts<H> {
        Hosts {
            pool: BufPool::new(BufPoolOptions::new("churn-host", IO, 8)).expect("host pool"),
            long_lived: std::cell::RefCell::new(None),
        }
    }

    /// Write a pattern to `lba`, read it back, compare.
    pub fn verified_io(
        &self,
        r: &Reactor,
        qp: &mut HeldQp<H>,
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
        qp: &mut HeldQp<H>,
        check: impl FnOnce(&SgList) -> Result<(), String>,
    ) -> Result<(), String> {
        let start = Instant::now();
        let mut got = None;
        while got.is_none() {
            qp.poll(&mut |c| got = Some(c));
            if start.elapsed() > IO_LIMIT {
                return Err(format!("an I/O did not complete in {IO_LIMIT:?}"));
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
            *slot = Some(H::open(addr, 0)?);
        }
        let host = slot.as_ref().ok_or("no host")?;
        let (ctrl, mut qp) = connect_on(host, NQN, n, KATO)?;
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
    ) -> Result<Option<HeldHost<H>>, String> {
        let (host, mut ctrl, mut qp) = connect::<H>(addr, NQN, n, KATO)?;
        self.verified_io(r, &mut qp, (n % 2048) * 8, n)?;
        ctrl.poll().map_err(|e| format!("admin poll: {e}"))?;
        if end == End::Stall {
            // From now on no Keep Alive: the target must end the
            // controller after STALL_KATO (set only now, so a slow
            // cycle on a loaded machine is not ended early).
            let ms = u32::try_from(STALL_KATO.as_millis()).unwrap_or(u32::MAX);
            let cmd = FeatureCmd::set(fid::KEEP_ALIVE_TIMER, ms, 0);
            ctrl.admin()
                .exec(
                    "Set Features (Keep Alive Timer)",
                    cmd,
                    DataDir::None,
                    SgList::new(),
                    Duration::from_secs(120),
                )
                .map_err(|e| format!("set KATO: {e}"))?;
        }
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
        match connect::<H>(
            addr,
            "nqn.2024-01.io.pollux:no-such-subsystem",
            n,
            Duration::ZERO,
        ) {
            Ok(_) => Err("a connect to an unknown subsystem was accepted".into()),
            Err(e) => Ok(e),
        }
    }

    /// A Connect beyond a limit, which must be refused with its status: a
    /// controller granted one I/O queue asks for I/O queue 2 (the target
    /// answers Connect Invalid Parameters naming the QID). Then the
    /// controller goes cleanly. `Ok` with the error the host saw.
    pub fn over_limit(&self, addr: &str, n: u64) -> Result<String, String> {
        let host = H::open(addr, n)?;
        let ctrl = connect_ctrl(&host, NQN, n, KATO)?;
        let mut info = ctrl.info().clone();
        let granted = info.io_queues;
        info.io_queues = granted.saturating_add(1);
        let seen = match connect_io_qpair(&host, &info, granted.saturating_add(1), 16, None) {
            Ok(_) => Err(format!(
                "I/O queue {} was accepted though the controller was granted {granted}",
                granted.saturating_add(1)
            )),
            Err(e) => Ok(e.to_string()),
        };
        ctrl.shutdown().map_err(|e| format!("shutdown: {e}"))?;
        seen
    }
}

/// The hosts of one fabric, as the host children and the storm's one-host
/// cycles run them: NVMe-oF controllers ([`Hosts`]) or iSER sessions
/// ([`IserHosts`](super::churn_iser::IserHosts)). Lives on the thread
/// that runs its hosts (with a reactor of its own, `r`).
pub trait HostSide {
    /// One connected host.
    type Held;
    /// A host side for this thread.
    fn new_side() -> Self;
    /// Connect host `seed` to `addr` (no keep-alive) and do one verified
    /// I/O.
    ///
    /// # Errors
    /// Why it could not (refused by a limit, I/O failed).
    fn connect_verified(&self, r: &Reactor, addr: &str, seed: u64) -> Result<Self::Held, String>;
    /// One more verified I/O on a held host (the host children run it
    /// until they are killed).
    ///
    /// # Errors
    /// Why the I/O failed or read back the wrong data.
    fn exercise(&self, r: &Reactor, held: &mut Self::Held, k: u64) -> Result<(), String>;
    /// A clean cycle: connect, verified I/O, go cleanly.
    ///
    /// # Errors
    /// What went wrong.
    fn clean_cycle(&self, r: &Reactor, addr: &str, n: u64) -> Result<(), String>;
}

impl<H: ChurnHost> HostSide for Hosts<H> {
    type Held = Connected<H>;

    fn new_side() -> Self {
        Hosts::new()
    }

    fn connect_verified(&self, r: &Reactor, addr: &str, seed: u64) -> Result<Connected<H>, String> {
        let (host, ctrl, mut qp) = connect::<H>(addr, NQN, seed, Duration::ZERO)?;
        self.verified_io(r, &mut qp, (seed % 2048) * 8, seed)?;
        Ok((host, ctrl, qp))
    }

    fn exercise(&self, r: &Reactor, held: &mut Connected<H>, k: u64) -> Result<(), String> {
        self.verified_io(r, &mut held.2, k * 8, k)
    }

    fn clean_cycle(&self, r: &Reactor, addr: &str, n: u64) -> Result<(), String> {
        self.cycle(r, addr, n, End::Clean).map(|_| ())
    }
}

/// The body of a host child (`ADDR,HOSTS,THREADS[,io]`, the fabric in
/// [`FABRIC_ENV`]): THREADS threads at once connect HOSTS hosts in all
/// (each its share, one after the other, no keep-alive), each with one
/// verified I/O; prints `POLLUX-CHURN-HOST-READY ok refused`, then holds
/// the connections until killed (bounded), idle or, with `io`, running
/// verified I/O (`POLLUX-CHURN-HOST-IO-RUNNING` once it runs,
/// `POLLUX-CHURN-HOST-IO-FAILED why` if an I/O fails). Returns at once
/// unless [`HOST_ENV`] is set.
pub fn run_host_child() {
    let Ok(v) = std::env::var(HOST_ENV) else {
        return;
    };
    match Fabric::from_env() {
        Fabric::Rdma => {
            host_child::<Hosts<pollux_nvmf::host::rdma::RdmaHost<pollux_verbs::soft::Soft>>>(&v)
        }
        Fabric::Tcp => host_child::<Hosts<pollux_nvmf::host::tcp::TcpHost>>(&v),
        Fabric::Iser => host_child::<super::churn_iser::IserHosts>(&v),
    }
}

fn host_child<S: HostSide>(v: &str) {
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
                let h = S::new_side();
                let mut held = Vec::new();
                for k in 0..share {
                    let seed = u64::from(std::process::id()) * 1000 + t * 100 + k;
                    match h.connect_verified(r, &addr, seed) {
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
                // in flight (4 KiB writes and reads, one at a time). With
                // I/O, each thread says once that its held hosts have
                // completed two verified rounds (the parent kills it then,
                // with I/O running), and any thread says when one failed
                // (and stops: the parent fails the test).
                let start = Instant::now();
                let mut rounds = 0u64;
                let mut failed = false;
                while start.elapsed() < Duration::from_secs(300) {
                    if !busy || held.is_empty() || failed {
                        std::thread::sleep(Duration::from_millis(100));
                        continue;
                    }
                    for (k, c) in held.iter_mut().enumerate() {
                        if let Err(e) = h.exercise(r, c, k as u64) {
                            println!("POLLUX-CHURN-HOST-IO-FAILED host {k} round {rounds}: {e}");
                            failed = true;
                            break;
                        }
                    }
                    rounds += 1;
                    if rounds == 2 && !failed {
                        println!("POLLUX-CHURN-HOST-IO-RUNNING");
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

/// Start a host child over `fabric` running `hosts` hosts from `threads`
/// threads against `addr` (the test binary's `entry` test; `io`: keep I/O
/// going); returns it and, once all connected or were refused, how many
/// connected.
pub fn start_host_child(
    entry: &str,
    fabric: Fabric,
    addr: &str,
    hosts: usize,
    threads: usize,
    io: bool,
) -> (Reaper, usize) {
    let mut child = pollux_reactor::test_env::child_test(entry)
        .env(
            HOST_ENV,
            format!(
                "{addr},{hosts},{threads},{}",
                if io { "io" } else { "idle" }
            ),
        )
        .env(FABRIC_ENV, fabric.name())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn a host child");
    let out = child.stdout.take().expect("stdout");
    // READY, and with `io` RUNNING too (so a kill lands mid-I/O); the
    // threads print RUNNING as they get there, before or after READY. An
    // I/O that did not verify fails the test.
    let (mut ok, mut running) = (None, false);
    for l in BufReader::new(out).lines() {
        let Ok(l) = l else { break };
        if let Some(why) = l.split("POLLUX-CHURN-HOST-IO-FAILED ").nth(1) {
            panic!("a host child's I/O failed: {why}");
        }
        running |= l.contains("POLLUX-CHURN-HOST-IO-RUNNING");
        // libtest's "test NAME ... " may start the same line.
        if let Some(rest) = l.split("POLLUX-CHURN-HOST-READY ").nth(1) {
            ok = rest.split_whitespace().next().and_then(|v| v.parse().ok());
        }
        if ok.is_some_and(|n: usize| !io || n == 0 || running) {
            break;
        }
    }
    let ok = ok.expect("the host child did not report");
    assert!(
        !io || ok == 0 || running,
        "the host child ended before its I/O ran"
    );
    (Reaper(child), ok)
}
