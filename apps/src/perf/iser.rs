//! `pollux-perf -r 'trtype:iser …'`: the iSER job engine. Our iSER
//! initiator (`pollux_iser::initiator`) against any iSCSI/iSER target,
//! with the workloads, `--verify`, the report and the JSON of the NVMe-oF
//! path, and the T10-PI policy of the session (`--pi`).
//!
//! ```text
//! pollux-perf -r 'trtype:iser traddr:@pollux-iser target:iqn.2016-06.io.pollux:disk0 lun:0' \
//!             --pi off|insert|dix -q 32 -o 4096 -w randread -t 5 --cores 1
//! pollux-perf -r 'trtype:iser traddr:10.99.0.1 trsvcid:3260 target:iqn…' …   # ibverbs build
//! pollux-perf -r 'trtype:iser …' --sweep [--sweep-pi off,insert,dix]
//! ```
//!
//! Every core logs in its own session (one connection; the ISID differs
//! per core and per run), reads the LU's geometry with READ CAPACITY(16),
//! takes `queue_depth` buffers of `io_size` bytes from a pool once, and
//! keeps them in flight: per I/O nothing is allocated (the buffer travels
//! with the task and comes back in its result). At the end it logs out.
//!
//! `--pi` follows the two modes Linux's iSER is measured in: `insert`
//! (`write_generate=0 read_verify=0`: no PI in host memory; the initiator's
//! integrity MR generates it on writes and checks and strips it on reads)
//! and `dix` (`write_generate=1 read_verify=1`: each buffer carries one
//! tuple per block after its data; this job generates them before every
//! write and verifies them after every read, as the block layer does, and
//! the integrity MR checks them on the way out and in). `write-generate`,
//! `read-verify` and `both` (= `insert`) pick one direction of `insert`.
//!
//! `--sweep` runs block sizes 512 B … 64 KiB (rows) × PI policies
//! (columns) and prints `IOPS/host CPU%` cells, then the cost of PI per
//! I/O relative to the `off` column (`IOPS(off) / IOPS(policy)`; both
//! sides busy-poll, so time per I/O is the inverse of IOPS).

use std::cell::Cell;
use std::path::PathBuf;
use std::process::ExitCode;
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use pollux_iser::initiator::scsi::{parse_read_capacity16, read_capacity16_cdb};
use pollux_iser::initiator::{
    DataDir, InitiatorOptions, IserInitiator, PiPolicy, SessionState, SubmitError, TaskResult,
};
use pollux_pi::TUPLE_SIZE;
use pollux_reactor::mem::{BufPool, BufPoolOptions, DmaBuf, SgList};
use pollux_reactor::{launch, CoreId, Cores, IdleMode, IoClock, LaunchConfig, PollStatus, Reactor};
use pollux_verbs::Provider;

use super::dix::Dix;
use super::job::{Done, Job, JobEnd, JobParams, JobQueues, Outcome, Refused};
use super::spawn::busy_pct;
use super::sweep::{cell_of, grid, to_json, SWEEP_SIZES};
use crate::report::{Report, Tally};
use crate::workload::Workload;
use crate::AppError;

/// The initiator name when the transport ID gives none.
pub const DEFAULT_INITIATOR: &str = "iqn.2016-06.io.pollux:perf-host";
/// The PI columns of a sweep.
pub const DEFAULT_SWEEP_PI: &str = "off,insert,dix";
/// How long login and the LU discovery may take.
const SETUP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the logout may take.
const LOGOUT_TIMEOUT: Duration = Duration::from_secs(3);

/// Whether a transport ID is an iSER one (`trtype:iser`).
pub fn is_iser(trid: &str) -> bool {
    trid.split_whitespace()
        .any(|kv| kv.eq_ignore_ascii_case("trtype:iser"))
}

/// A parsed `trtype:iser` transport ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IserTrid {
    /// `@name` / `/path` (soft provider) or an IP address (ibverbs).
    pub traddr: String,
    /// Port (ibverbs; 3260 when absent).
    pub trsvcid: Option<u16>,
    /// TargetName.
    pub target: String,
    /// LUN.
    pub lun: u16,
    /// InitiatorName.
    pub initiator: String,
}

impl IserTrid {
    /// Parses `trtype:iser traddr:A [trsvcid:P] target:IQN [lun:N]
    /// [initiator:IQN]`.
    ///
    /// # Errors
    /// A message naming the bad or missing key.
    pub fn parse(s: &str) -> Result<Self, AppError> {
        let usage = |m: String| AppError::Usage(format!("-r: {m}"));
        let (mut traddr, mut svc, mut target, mut lun, mut ini) = (None, None, None, 0u16, None);
        for kv in s.split_whitespace() {
            let (k, v) = kv
                .split_once(':')
                .ok_or_else(|| usage(format!("'{kv}': expected key:value")))?;
            match k.to_ascii_lowercase().as_str() {
                "trtype" if v.eq_ignore_ascii_case("iser") => {}
                "trtype" => return Err(usage(format!("trtype '{v}': expected iser"))),
                "traddr" => traddr = Some(v.to_string()),
                "trsvcid" => {
                    svc = Some(
                        v.parse::<u16>()
                            .ok()
                            .filter(|p| *p != 0)
                            .ok_or_else(|| usage(format!("trsvcid '{v}' is not a port")))?,
                    );
                }
                "target" | "subnqn" => target = Some(v.to_string()),
                "lun" => {
                    lun = v
                        .parse::<u16>()
                        .ok()
                        .filter(|l| *l <= 16383)
                        .ok_or_else(|| usage(format!("lun '{v}' is not in 0..=16383")))?;
                }
                "initiator" | "hostnqn" => ini = Some(v.to_string()),
                "adrfam" => {}
                _ => {
                    return Err(usage(format!(
                        "unknown key '{k}' (traddr, trsvcid, target, lun, initiator)"
                    )))
                }
            }
        }
        let traddr = traddr.ok_or_else(|| usage("traddr: missing (traddr:@pollux-iser)".into()))?;
        let target = target
            .ok_or_else(|| usage("target: missing (target:iqn.2016-06.io.pollux:disk0)".into()))?;
        Ok(IserTrid {
            traddr,
            trsvcid: svc,
            target,
            lun,
            initiator: ini.unwrap_or_else(|| DEFAULT_INITIATOR.to_string()),
        })
    }

    /// Whether the soft provider carries it (`@name` or a path).
    pub fn is_soft(&self) -> bool {
        self.traddr.starts_with('@') || self.traddr.starts_with('/')
    }

    /// The verbs CM address.
    pub fn cm_addr(&self) -> String {
        if self.is_soft() {
            self.traddr.clone()
        } else if self.traddr.contains(':') {
            format!("[{}]:{}", self.traddr, self.trsvcid.unwrap_or(3260))
        } else {
            format!("{}:{}", self.traddr, self.trsvcid.unwrap_or(3260))
        }
    }
}

impl std::fmt::Display for IserTrid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} lun {} at {}", self.target, self.lun, self.cm_addr())
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct IserPerfParams {
    /// Where to log in.
    pub trid: IserTrid,
    /// Verbs device (ibverbs).
    pub device: Option<String>,
    /// PI policy of the sessions.
    pub pi: PiPolicy,
    /// PI in software even where the provider has signature offload.
    pub pi_software: bool,
    /// I/Os in flight per core.
    pub queue_depth: usize,
    /// Bytes per I/O.
    pub io_size: usize,
    /// Access pattern.
    pub workload: Workload,
    /// Read percentage (rw, randrw).
    pub read_pct: u8,
    /// Measured time.
    pub duration: Duration,
    /// Warm-up.
    pub warmup: Duration,
    /// Write, read back, compare.
    pub verify: bool,
}

enum Msg {
    Done {
        core: CoreId,
        tally: Box<Tally>,
        busy_pct: f64,
        seconds: f64,
    },
    Failed {
        core: CoreId,
        error: String,
    },
    Note(String),
}

/// Distinguishes the sessions of one process (ISID bytes 3..6).
static SESSION: AtomicU32 = AtomicU32::new(0);

/// Run the benchmark over provider `P` and return the report.
///
/// # Errors
/// [`AppError::Usage`] for parameters that do not fit the LU,
/// [`AppError::Setup`] when the login fails or the target goes away,
/// [`AppError::Reactor`].
pub fn run<P: Provider>(
    cores: Cores,
    idle: IdleMode,
    p: &IserPerfParams,
) -> Result<Report, AppError> {
    if p.queue_depth == 0 || p.queue_depth > 4096 || p.duration.is_zero() || p.io_size == 0 {
        return Err(AppError::Usage(
            "queue depth (1..=4096), I/O size and run time must be positive".into(),
        ));
    }
    let core_ids: Vec<CoreId> = cores.iter().collect();
    let ncores = core_ids.len();
    let mut cfg = LaunchConfig::new(cores);
    cfg.idle = idle;
    let set = launch(cfg, |_| {}).map_err(|e| AppError::Reactor(e.to_string()))?;
    let (tx, rx) = mpsc::channel::<Msg>();
    for (index, &core) in core_ids.iter().enumerate() {
        let (tx, p) = (tx.clone(), p.clone());
        let sent = set.messenger().send(core, move |r| {
            if let Err(error) = start_core::<P>(r, p, index, ncores, tx.clone()) {
                let _ = tx.send(Msg::Failed { core, error });
            }
        });
        if let Err(e) = sent {
            set.stop_all();
            let _ = set.join();
            return Err(AppError::Reactor(e.to_string()));
        }
    }
    drop(tx);
    let mut done = Vec::with_capacity(ncores);
    let mut failure = None;
    let wait = SETUP_TIMEOUT + p.warmup + p.duration + LOGOUT_TIMEOUT + Duration::from_secs(30);
    while done.len() < ncores && failure.is_none() {
        match rx.recv_timeout(wait) {
            Ok(Msg::Done {
                core,
                tally,
                busy_pct,
                seconds,
            }) => done.push((core, *tally, busy_pct, seconds)),
            Ok(Msg::Failed { core, error }) => {
                failure = Some(AppError::Setup(format!("core {core}: {error}")));
            }
            Ok(Msg::Note(n)) => eprintln!("pollux-perf: {n}"),
            Err(_) => {
                failure = Some(AppError::Setup(
                    "the run did not finish (target unresponsive?)".into(),
                ));
            }
        }
    }
    set.stop_all();
    let joined = set.join();
    if let Some(f) = failure {
        return Err(f);
    }
    joined.map_err(|e| AppError::Reactor(e.to_string()))?;
    done.sort_by_key(|d| d.0);
    let seconds = done.iter().map(|d| d.3).fold(0.0, f64::max);
    let per_core: Vec<(u32, Tally, f64)> = done.into_iter().map(|d| (d.0, d.1, d.2)).collect();
    let mut report = Report::new(seconds, &per_core);
    report.clock = Some(IoClock::get().source().as_str().into());
    Ok(report)
}

/// Poll `ini` until `done` says so or `timeout` passes.
fn drive<P: Provider>(
    ini: &mut IserInitiator<P>,
    timeout: Duration,
    mut done: impl FnMut(&IserInitiator<P>, &mut Vec<TaskResult>) -> Result<bool, String>,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    loop {
        ini.poll(&mut |r| out.push(r));
        if let SessionState::Failed(e) = ini.state() {
            return Err(e.to_string());
        }
        if done(ini, &mut out)? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("timed out in state {:?}", ini.state()));
        }
        std::thread::yield_now();
    }
}

fn start_core<P: Provider>(
    r: &Reactor,
    p: IserPerfParams,
    index: usize,
    jobs: usize,
    tx: mpsc::Sender<Msg>,
) -> Result<(), String> {
    let core = r.core();
    // Control path: log in and read the geometry right here (the reactor
    // has nothing else to do yet).
    let mut o = InitiatorOptions::new(&p.trid.cm_addr(), &p.trid.initiator, &p.trid.target);
    o.device = p.device.clone();
    o.queue_depth = u16::try_from(p.queue_depth).unwrap_or(u16::MAX);
    o.max_io_bytes = u32::try_from(p.io_size.max(4096)).map_err(|_| "I/O size too large")?;
    o.max_segments = 1;
    o.pi = p.pi;
    if p.pi_software {
        o.pi_engine = pollux_iser::initiator::PiEngine::Software;
    }
    let n = SESSION.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    o.isid = [
        0x80,
        (pid >> 8) as u8,
        pid as u8,
        (n >> 8) as u8,
        n as u8,
        index as u8,
    ];
    let mut ini = IserInitiator::<P>::connect(o).map_err(|e| format!("connect: {e}"))?;
    drive(&mut ini, SETUP_TIMEOUT, |i, _| Ok(i.is_ready())).map_err(|e| format!("login: {e}"))?;
    let cap = SgList::from_buf(DmaBuf::alloc(32).map_err(|e| e.to_string())?);
    ini.submit(
        p.trid.lun,
        &read_capacity16_cdb(),
        DataDir::Read,
        Some(cap),
        32,
        0,
    )
    .map_err(|e| format!("READ CAPACITY(16): {e}"))?;
    let mut geo = None;
    drive(&mut ini, SETUP_TIMEOUT, |_, out| {
        let Some(res) = out.pop() else {
            return Ok(false);
        };
        if !res.is_good() {
            return Err(format!(
                "READ CAPACITY(16) of LUN {}: status {:#x} sense {:?}",
                p.trid.lun,
                res.status,
                res.sense_code()
            ));
        }
        let b = res.bufs.and_then(|mut b| b.pop()).ok_or("no data")?;
        geo = parse_read_capacity16(b.as_slice());
        Ok(true)
    })?;
    let g = geo.ok_or("READ CAPACITY(16): short data")?;
    let bs = g.block_size as usize;
    if bs == 0 || p.io_size % bs != 0 || (p.io_size / bs) as u64 > g.blocks {
        return Err(format!(
            "io size {} does not fit LUN {} ({} blocks of {bs} bytes)",
            p.io_size, p.trid.lun, g.blocks
        ));
    }
    if index == 0 && p.pi != PiPolicy::Off && !g.prot_en {
        let _ = tx.send(Msg::Note(format!(
            "LUN {} is not formatted with PI: --pi {:?} puts no PI on the wire",
            p.trid.lun, p.pi
        )));
    }
    // Say so when the session runs outside the fast path (software PI or
    // pre-registered memory: the ibverbs provider on rxe); a sweep on the
    // soft provider stays quiet.
    let pi_sw = p.pi != PiPolicy::Off && g.prot_en && !ini.pi_offload();
    if index == 0 && (pi_sw || ini.pre_registered()) {
        let _ = tx.send(Msg::Note(format!(
            "iSER session: PI {}, task memory {}",
            match (p.pi == PiPolicy::Off || !g.prot_en, ini.pi_offload()) {
                (true, _) => "off",
                (false, true) => "on (signature offload)",
                (false, false) => "on (software)",
            },
            if ini.pre_registered() {
                "pre-registered (no fast registration on this device)"
            } else {
                "registered per task"
            }
        )));
    }
    ini.set_geometry(p.trid.lun, g);
    let io_blocks = (p.io_size / bs) as u32;
    let units = g.blocks / u64::from(io_blocks);
    if p.verify && units < (jobs * p.queue_depth) as u64 {
        return Err("verify needs at least queue depth × cores I/O units in the LU".into());
    }
    // DIX: one tuple per block after the data.
    let dix = (p.pi == PiPolicy::Dix && g.prot_en).then(|| Dix::new(bs, p.io_size, g.pi_type));
    let tuples = if p.pi == PiPolicy::Dix {
        p.io_size / bs * TUPLE_SIZE
    } else {
        0
    };
    let pool = BufPool::new(BufPoolOptions::new(
        format!("perf-iser-{index}"),
        p.io_size + tuples,
        p.queue_depth,
    ))
    .map_err(|e| format!("buffers: {e}"))?;
    let mut bufs = Vec::with_capacity(p.queue_depth);
    for _ in 0..p.queue_depth {
        bufs.push(pool.get().ok_or("buffer pool empty")?);
    }
    let seed = 0x9E37_79B9_7F4A_7C15u64 ^ (index as u64 + 1);
    let jp = JobParams {
        io_blocks,
        io_bytes: p.io_size as u64,
        units,
        queue_depth: p.queue_depth,
        workload: p.workload,
        read_pct: p.read_pct,
        verify: p.verify,
        index: index as u64,
        jobs: jobs as u64,
        warmup: p.warmup,
        duration: p.duration,
        ride_through: false,
    };
    let lu = IserLu::new(ini, p.trid.lun, p.queue_depth, dix);
    let mut job = Job::new(lu, jp, bufs, seed);
    job.start(r);
    let mut logout = Logout::default();
    let rr = r.clone();
    let pid = Rc::new(Cell::new(None));
    let pid2 = Rc::clone(&pid);
    // The session holds the reactor awake while it waits for the target;
    // the job's own schedule (its end, keep-alives, logout) is polled, not
    // timed: keep polling until the job ends.
    let awake = r.hold_awake();
    let id = r.add_poller("perf-iser-job", move || {
        let _keep = (&pool, &awake);
        let st = job.poll(&rr);
        if !job.is_drained() || !logout.step(job.queues_mut().session()) {
            return st;
        }
        let msg = match job.end() {
            Some(JobEnd::Failed(why)) => Msg::Failed {
                core,
                error: format!("lost the target: {why}"),
            },
            _ => {
                let (busy_pct, seconds) = job.measured();
                Msg::Done {
                    core,
                    tally: Box::new(std::mem::take(&mut job.tally)),
                    busy_pct,
                    seconds,
                }
            }
        };
        let _ = tx.send(msg);
        if let Some(i) = pid2.get() {
            rr.remove_poller(i);
        }
        st
    });
    pid.set(Some(id));
    Ok(())
}

/// The iSER side of a `pollux-perf` job: LUN `lun` behind one session.
pub struct IserLu<P: Provider> {
    ini: IserInitiator<P>,
    lun: u16,
    /// Task results of one poll (capacity fixed at the start).
    results: Vec<TaskResult>,
    /// A failed task was logged (the first one only).
    warned: bool,
    /// DIX: the tuples' work, and each read in flight's LBA by its context
    /// (fixed size: the job's slots).
    dix: Option<Dix>,
    read_lba: Vec<Option<u64>>,
}

impl<P: Provider> IserLu<P> {
    /// I/O to `lun` over the logged-in session `ini`; `queue_depth` tasks
    /// at most in flight; `dix` when the buffers carry PI.
    pub fn new(ini: IserInitiator<P>, lun: u16, queue_depth: usize, dix: Option<Dix>) -> Self {
        IserLu {
            ini,
            lun,
            results: Vec::with_capacity(queue_depth + 8),
            warned: false,
            dix,
            read_lba: vec![None; if dix.is_some() { queue_depth } else { 0 }],
        }
    }

    /// The session (to log out at the end).
    pub fn session(&mut self) -> &mut IserInitiator<P> {
        &mut self.ini
    }
}

impl<P: Provider> JobQueues for IserLu<P> {
    fn submit(
        &mut self,
        read: bool,
        lba: u64,
        blocks: u32,
        data: SgList,
        ctx: u64,
    ) -> Result<(), Refused> {
        let mut data = data;
        if let Some(d) = &self.dix {
            if read {
                if let Some(s) = self.read_lba.get_mut(ctx as usize) {
                    *s = Some(lba);
                }
            } else if let Some(b) = data.iter_mut().next() {
                d.generate(b.as_mut_slice(), lba);
            }
        }
        let res = if read {
            self.ini.read(self.lun, lba, blocks, data, ctx)
        } else {
            self.ini.write(self.lun, lba, blocks, data, ctx)
        };
        res.map_err(|e| {
            let fatal = match &e {
                SubmitError::Busy(_) => None,
                other => Some(other.to_string()),
            };
            Refused {
                buf: e.into_bufs().and_then(|mut b| b.pop()),
                fatal,
            }
        })
    }

    fn reap(&mut self, out: &mut Vec<Done>) -> usize {
        let mut results = std::mem::take(&mut self.results);
        let st = self.ini.poll(&mut |t| results.push(t));
        let work = results.len() + usize::from(st == PollStatus::Busy);
        for mut t in results.drain(..) {
            // DIX reads: the block layer's read-verify of the tuples.
            let lba = self.read_lba.get_mut(t.ctx as usize).and_then(Option::take);
            let tuples_ok = match (&self.dix, lba, &t.bufs) {
                (Some(d), Some(lba), Some(b)) if t.is_good() => {
                    b.iter().next().is_some_and(|b| d.verify(b.as_slice(), lba))
                }
                _ => true,
            };
            let outcome = if t.is_good() && tuples_ok {
                Outcome::Good
            } else if t.transport_error {
                Outcome::Lost("connection lost".into())
            } else {
                if !self.warned {
                    self.warned = true;
                    log::warn!(
                        "pollux-perf: iSER task failed: status {:#x} sense {:?} PI {:?}{}",
                        t.status,
                        t.sense_code(),
                        t.pi_error,
                        if tuples_ok {
                            ""
                        } else {
                            " (DIX read-verify of the tuples failed)"
                        }
                    );
                }
                Outcome::Failed
            };
            out.push(Done {
                ctx: t.ctx,
                buf: t.bufs.take().and_then(|mut b| b.pop()),
                outcome,
            });
        }
        self.results = results;
        work
    }

    fn can_submit(&self) -> bool {
        self.ini.can_submit()
    }

    fn lost(&self) -> Option<String> {
        match self.ini.state() {
            SessionState::Failed(e) => Some(e.to_string()),
            _ => None,
        }
    }
}

/// The end of an iSER job: log out once the I/O is drained, and say when
/// the session is closed (or lost, or the logout took too long).
#[derive(Default)]
struct Logout {
    deadline: Option<Instant>,
}

impl Logout {
    /// `true` once the session is closed or given up on.
    fn step<P: Provider>(&mut self, ini: &mut IserInitiator<P>) -> bool {
        if self.deadline.is_none() {
            self.deadline = Some(Instant::now() + LOGOUT_TIMEOUT);
            if ini.is_ready() {
                let _ = ini.logout();
            }
        }
        ini.poll(&mut |_| {});
        let closed = matches!(ini.state(), SessionState::Closed | SessionState::Failed(_));
        closed || self.deadline.is_some_and(|d| Instant::now() >= d)
    }
}

/// The command line of the iSER path, as `pollux-perf` parsed it.
#[derive(Debug, Clone)]
pub struct IserCli {
    /// The `-r` text.
    pub trid: String,
    /// `--pi`.
    pub pi: String,
    /// `--pi-engine software`: no signature offload.
    pub pi_software: bool,
    /// `-q`.
    pub queue_depth: usize,
    /// `-o`, in bytes.
    pub io_size: usize,
    /// `-w`.
    pub workload: String,
    /// `-M`.
    pub read_pct: u8,
    /// `-t`.
    pub duration: Duration,
    /// `-a`.
    pub warmup: Duration,
    /// `--verify`.
    pub verify: bool,
    /// `--device`.
    pub device: Option<String>,
    /// `--target-stats`.
    pub target_stats: Option<PathBuf>,
    /// `--sweep`.
    pub sweep: bool,
    /// `--sweep-pi`.
    pub sweep_pi: String,
    /// `--json`.
    pub json: bool,
    /// Host cores.
    pub cores: Cores,
    /// Idle policy.
    pub idle: IdleMode,
}

/// Parses a comma-separated list of PI policies.
///
/// # Errors
/// [`AppError::Usage`]: the first unknown name; an empty list.
pub fn parse_pi_list(s: &str) -> Result<Vec<(String, PiPolicy)>, AppError> {
    let v: Vec<(String, PiPolicy)> = s
        .split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(|x| {
            x.parse::<PiPolicy>()
                .map(|p| (x.to_string(), p))
                .map_err(|e| AppError::Usage(format!("--sweep-pi: {e}")))
        })
        .collect::<Result<_, _>>()?;
    if v.is_empty() {
        return Err(AppError::Usage("--sweep-pi: no PI policy given".into()));
    }
    Ok(v)
}

fn run_provider(cli: &IserCli, p: &IserPerfParams) -> Result<Report, AppError> {
    let before = cli.target_stats.as_deref().and_then(stats_file_load);
    let mut r = if p.trid.is_soft() {
        run::<pollux_verbs::soft::Soft>(cli.cores.clone(), cli.idle, p)?
    } else {
        #[cfg(feature = "ibverbs")]
        {
            run::<pollux_verbs::ibv::Ibverbs>(cli.cores.clone(), cli.idle, p)?
        }
        #[cfg(not(feature = "ibverbs"))]
        {
            return Err(AppError::Usage(format!(
                "traddr:{} needs the ibverbs feature (cargo build --features ibverbs); the soft provider takes traddr:@name",
                p.trid.traddr
            )));
        }
    };
    if let Some(path) = &cli.target_stats {
        // The stats file is rewritten every second: let it catch up.
        std::thread::sleep(Duration::from_millis(1100));
        if let (Some(a), Some(b)) = (before, stats_file_load(path)) {
            r.target_busy_pct = busy_pct(a, b);
        }
    }
    Ok(r)
}

/// `(busy_ns, idle_ns)` summed over the cores of a `pollux-tgt` stats file.
fn stats_file_load(path: &std::path::Path) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(path).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let sum =
        |k: &str| -> Option<u64> { v[k].as_array()?.iter().map(serde_json::Value::as_u64).sum() };
    Some((sum("busy_ns")?, sum("idle_ns")?))
}

/// One sweep cell: IOPS and host CPU % (`None`: the run failed).
pub type PiCell = super::sweep::Cell;

/// The sweep tables: `IOPS/CPU%` per block size (rows) and PI policy
/// (columns), then, when an `off` column exists, the cost of PI per I/O
/// relative to it (`IOPS(off) / IOPS(policy)`).
pub fn pi_table(cols: &[String], rows: &[(usize, Vec<PiCell>)]) -> String {
    let names: Vec<&str> = cols.iter().map(String::as_str).collect();
    let mut s = String::new();
    grid(&mut s, &names, 14, rows, |c| match c {
        Some((iops, cpu)) => format!("{iops:.0}/{cpu:.0}%"),
        None => "failed".to_string(),
    });
    if let Some(off) = cols.iter().position(|c| c == "off" || c == "none") {
        s.push_str("cost of PI per I/O, relative to off (IOPS(off) / IOPS(policy)):\n");
        // Each cell divided by its row's `off` cell.
        let ratios: Vec<(usize, Vec<PiCell>)> = rows
            .iter()
            .map(|(bs, cells)| {
                let base = cells.get(off).copied().flatten().map(|c| c.0);
                let r = cells
                    .iter()
                    .map(|c| match (base, c) {
                        (Some(b), Some((iops, _))) if *iops > 0.0 => Some((b / iops, 0.0)),
                        _ => None,
                    })
                    .collect();
                (*bs, r)
            })
            .collect();
        grid(&mut s, &names, 14, &ratios, |c| match c {
            Some((ratio, _)) => format!("{ratio:.2}"),
            None => "-".to_string(),
        });
    }
    s
}

/// `pollux-perf`'s iSER path: one run or a sweep, printed as a table or
/// JSON. Exit status 1 when an I/O failed or miscompared.
///
/// # Errors
/// [`AppError::Usage`] for a bad transport ID, workload or PI policy;
/// the run's errors.
pub fn main(cli: &IserCli) -> Result<ExitCode, AppError> {
    let trid = IserTrid::parse(&cli.trid)?;
    let workload: Workload = cli
        .workload
        .parse()
        .map_err(|e| AppError::Usage(format!("{e}")))?;
    if workload == Workload::Verify {
        return Err(AppError::Usage(
            "use --verify with a write or rw workload".into(),
        ));
    }
    let pi: PiPolicy = cli
        .pi
        .parse()
        .map_err(|e| AppError::Usage(format!("--pi: {e}")))?;
    let mut p = IserPerfParams {
        trid: trid.clone(),
        device: cli.device.clone(),
        pi,
        pi_software: cli.pi_software,
        queue_depth: cli.queue_depth,
        io_size: cli.io_size,
        workload,
        read_pct: cli.read_pct,
        duration: cli.duration,
        warmup: cli.warmup,
        verify: cli.verify,
    };
    if cli.sweep {
        let cols = parse_pi_list(&cli.sweep_pi)?;
        let mut rows = Vec::new();
        let mut failed = false;
        for bs in SWEEP_SIZES {
            let mut cells = Vec::new();
            for (name, pol) in &cols {
                p.io_size = bs;
                p.pi = *pol;
                match run_provider(cli, &p) {
                    Ok(r) => {
                        let (cell, bad) = cell_of(&r);
                        failed |= bad;
                        cells.push(cell);
                    }
                    Err(e) => {
                        eprintln!("pollux-perf: {bs} B, pi {name}: {e}");
                        failed = true;
                        cells.push(None);
                    }
                }
            }
            rows.push((bs, cells));
        }
        let names: Vec<String> = cols.iter().map(|c| c.0.clone()).collect();
        if cli.json {
            let cols: Vec<&str> = names.iter().map(String::as_str).collect();
            println!("{}", to_json(&cols, &rows));
        } else {
            println!(
                "IOPS/host CPU% per block size and PI policy (iser to {trid}, -q {} -w {}, {} s each)",
                cli.queue_depth,
                cli.workload,
                cli.duration.as_secs_f64()
            );
            print!("{}", pi_table(&names, &rows));
        }
        return Ok(if failed {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        });
    }
    let report = run_provider(cli, &p)?;
    if cli.json {
        println!("{}", report.to_json());
    } else {
        println!(
            "iser {trid}: -q {} -o {} -w {} pi {}",
            p.queue_depth, p.io_size, cli.workload, cli.pi
        );
        print!("{}", report.to_table());
    }
    Ok(if report.total.errors + report.total.miscompares > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trids_parse() {
        let t = "trtype:iser traddr:@pollux-iser target:iqn.2016-06.io.pollux:disk0 lun:1";
        assert!(is_iser(t));
        assert!(!is_iser("trtype:soft traddr:@x subnqn:nqn.x"));
        let p = IserTrid::parse(t).unwrap();
        assert_eq!(
            (p.cm_addr().as_str(), p.lun, p.target.as_str()),
            ("@pollux-iser", 1, "iqn.2016-06.io.pollux:disk0")
        );
        assert_eq!(p.initiator, DEFAULT_INITIATOR);
        let p = IserTrid::parse("trtype:iser traddr:10.99.0.1 target:iqn.x").unwrap();
        assert_eq!((p.cm_addr().as_str(), p.lun), ("10.99.0.1:3260", 0));
        assert!(IserTrid::parse("trtype:iser target:iqn.x")
            .unwrap_err()
            .to_string()
            .contains("traddr"));
        assert!(IserTrid::parse("trtype:iser traddr:@x")
            .unwrap_err()
            .to_string()
            .contains("target"));
        assert!(IserTrid::parse("trtype:iser traddr:@x target:iqn.x lun:99999").is_err());
        assert!(IserTrid::parse("trtype:iser traddr:@x target:iqn.x bogus:1").is_err());
    }

    #[test]
    fn pi_lists_and_table() {
        let v = parse_pi_list(DEFAULT_SWEEP_PI).unwrap();
        assert_eq!(v.len(), 3);
        assert_eq!((v[1].1, v[2].1), (PiPolicy::Both, PiPolicy::Dix));
        let v = parse_pi_list("off,write-generate,read-verify,both").unwrap();
        assert!(parse_pi_list("off,fast").is_err());
        assert!(parse_pi_list(",").is_err());
        let cols: Vec<String> = v.iter().map(|c| c.0.clone()).collect();
        let t = pi_table(
            &cols,
            &[(
                4096,
                vec![
                    Some((1000.0, 100.0)),
                    Some((500.0, 100.0)),
                    None,
                    Some((800.0, 99.0)),
                ],
            )],
        );
        assert!(t.contains("1000/100%") && t.contains("failed"), "{t}");
        assert!(
            t.contains("2.00") && t.contains("1.25") && t.contains("cost of PI"),
            "{t}"
        );
    }
}
