//! The engine of `pollux-perf`: an NVMe-oF host benchmark in the manner of
//! `spdk_nvme_perf`.
//!
//! The first core connects the controller (admin queue, keep-alive
//! poller); every core opens its own transport and connects its I/O queue
//! pairs (`qpairs_per_ns` per namespace), then runs a [`job::Job`] per
//! namespace. The report has the same shape as `pollux-bdevperf`'s
//! ([`Report`]), plus `target_busy_pct` when the target answers Pollux's
//! reactor-load log page.

pub mod dix;
pub mod iser;
pub mod job;
pub mod nvmf_queues;
pub mod spawn;
pub mod stats_watch;
pub mod sweep;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use pollux_nvmf::host::{
    connect_io_qpair, Controller, CtrlInfo, CtrlLink, CtrlOptions, CtrlState, HostError,
    HostIdentity, HostTransport, HostTrid, ReactorLoad,
};
use pollux_reactor::mem::{BufPool, BufPoolOptions};
use pollux_reactor::{launch, CoreId, Cores, IdleMode, LaunchConfig, PollStatus, Reactor};

use crate::report::{Report, Tally};
use crate::workload::Workload;
use crate::AppError;

use self::dix::Dix;
use self::job::{Job, JobEnd, JobParams};
use self::nvmf_queues::{NvmfPi, NvmfQueues};
use pollux_nvmf::host::pi::{HostPi, PiNs};

/// What to run.
#[derive(Debug, Clone)]
pub struct PerfParams {
    /// Where to connect.
    pub trid: HostTrid,
    /// I/Os in flight per namespace per core.
    pub queue_depth: usize,
    /// Bytes per I/O.
    pub io_size: usize,
    /// Access pattern.
    pub workload: Workload,
    /// Read percentage (rw, randrw).
    pub read_pct: u8,
    /// Measured time.
    pub duration: Duration,
    /// Warm-up before measuring.
    pub warmup: Duration,
    /// I/O queue pairs per namespace per core.
    pub qpairs_per_ns: u16,
    /// Write, read back, compare.
    pub verify: bool,
    /// Cap of in-capsule writes (`Some(0)`: none).
    pub inline_cap: Option<u32>,
    /// Keep-alive timeout.
    pub kato: Duration,
    /// I/O timeout.
    pub io_timeout: Duration,
    /// After losing the controller, try to reconnect this often.
    pub reconnect_delay: Duration,
    /// Give up (the run fails) when the controller stayed lost this long;
    /// zero: no reconnect, the first lost queue fails the run.
    pub ctrl_loss_tmo: Duration,
    /// T10 PI on a namespace formatted with it (`--pi off|insert|dix`;
    /// `off` is PRACT: the controller generates, checks and strips).
    pub pi: HostPi,
    /// `insert` and `dix` in software even where the transport has a
    /// signature offload (`--pi-engine software`).
    pub pi_software: bool,
}

/// A transport per core: made on the core that uses it.
pub type TransportFactory<T> = Arc<dyn Fn() -> Result<T, HostError> + Send + Sync>;

enum Msg {
    Ctrl(Box<Result<(CtrlInfo, CtrlLink), String>>),
    Ready,
    Done(Box<CoreDone>),
    Failed { core: CoreId, error: String },
    Load(Option<ReactorLoad>),
}

struct CoreDone {
    core: CoreId,
    tally: Tally,
    busy_pct: f64,
    seconds: f64,
}

thread_local! {
    static CTRL: RefCell<Option<Box<dyn std::any::Any>>> = const { RefCell::new(None) };
}

/// Run the benchmark and return the report.
///
/// # Errors
/// [`AppError::Setup`] when the target refuses, disappears or times out
/// (the message says which); [`AppError::Usage`] for parameters that do not
/// fit the namespace; [`AppError::Reactor`].
pub fn run<T: HostTransport + 'static>(
    factory: TransportFactory<T>,
    cores: Cores,
    idle: IdleMode,
    p: &PerfParams,
) -> Result<Report, AppError> {
    if p.queue_depth == 0 || p.duration.is_zero() {
        return Err(AppError::Usage(
            "queue depth and run time must be positive".into(),
        ));
    }
    let core_ids: Vec<CoreId> = cores.iter().collect();
    let ncores = core_ids.len();
    let mut cfg = LaunchConfig::new(cores);
    cfg.idle = idle;
    let set = launch(cfg, |_| {}).map_err(|e| AppError::Reactor(e.to_string()))?;
    let (tx, rx) = mpsc::channel::<Msg>();
    let first = core_ids[0];
    let fail = |set: pollux_reactor::ReactorSet, e: AppError| {
        set.stop_all();
        let _ = set.join();
        Err(e)
    };
    // 1. The controller, on the first core.
    let who = HostIdentity {
        hostnqn: p.trid.hostnqn.clone(),
        hostid: *b"pollux-perf-host",
        subnqn: p.trid.subnqn.clone(),
    };
    let per_core_queues = u16::try_from(ncores).unwrap_or(u16::MAX);
    let opts = CtrlOptions {
        kato: p.kato,
        io_queues: per_core_queues
            .saturating_mul(p.qpairs_per_ns.max(1))
            .saturating_mul(4),
        timeout: Duration::from_secs(10),
        io_timeout: p.io_timeout,
        hostid: who.hostid,
        reconnect_delay: p.reconnect_delay,
        ctrl_loss_tmo: p.ctrl_loss_tmo,
    };
    {
        let (f, tx) = (Arc::clone(&factory), tx.clone());
        let sent = set.messenger().send(first, move |r| {
            let res = (|| {
                let t = f()?;
                let c = Controller::connect(&t, who, opts)?;
                Ok::<_, HostError>((t, c))
            })();
            match res {
                Ok((t, c)) => {
                    let info = c.info().clone();
                    let link = c.link().clone();
                    let ctrl = Rc::new(RefCell::new((t, c)));
                    let c2 = Rc::clone(&ctrl);
                    r.add_timed_poller("perf-admin", Duration::from_millis(50), move || {
                        if let Ok(mut g) = c2.try_borrow_mut() {
                            let (t, c) = &mut *g;
                            // Keep-alive, and the reconnect state machine
                            // when the controller is lost.
                            if c.poll_recover(t) != CtrlState::Live {
                                return PollStatus::Busy;
                            }
                        }
                        PollStatus::Idle
                    });
                    CTRL.with(|s| *s.borrow_mut() = Some(Box::new(ctrl)));
                    let _ = tx.send(Msg::Ctrl(Box::new(Ok((info, link)))));
                }
                Err(e) => {
                    let _ = tx.send(Msg::Ctrl(Box::new(Err(e.to_string()))));
                }
            }
        });
        if let Err(e) = sent {
            return fail(set, AppError::Reactor(e.to_string()));
        }
    }
    let (info, link) = match rx.recv() {
        Ok(Msg::Ctrl(r)) => match *r {
            Ok(i) => i,
            Err(e) => {
                return fail(
                    set,
                    AppError::Setup(format!("connecting to {}: {e}", p.trid)),
                )
            }
        },
        _ => return fail(set, AppError::Reactor("a reactor exited early".into())),
    };
    let Some(ns) = info.namespaces.first().copied() else {
        return fail(
            set,
            AppError::Setup(format!("{} has no namespace", p.trid.subnqn)),
        );
    };
    let bs = ns.block_size as usize;
    if p.io_size % bs != 0 || p.io_size / bs == 0 || (p.io_size / bs) as u64 > ns.num_blocks {
        return fail(
            set,
            AppError::Usage(format!(
                "io size {} does not fit namespace {} ({} blocks of {bs} bytes)",
                p.io_size, ns.nsid, ns.num_blocks
            )),
        );
    }
    if let Some(m) = info.max_transfer() {
        if p.io_size as u64 > m {
            return fail(
                set,
                AppError::Usage(format!(
                    "io size {} exceeds the controller's MDTS ({m} bytes)",
                    p.io_size
                )),
            );
        }
    }
    let qpn = p.qpairs_per_ns.max(1);
    if u32::from(info.io_queues) < ncores as u32 * u32::from(qpn) {
        return fail(
            set,
            AppError::Setup(format!(
                "the controller granted {} I/O queues, {} needed",
                info.io_queues,
                ncores as u32 * u32::from(qpn)
            )),
        );
    }
    // PI: a namespace with metadata moves extended blocks; the modes here
    // cover PI in exactly the metadata's 8 bytes.
    let pi = if ns.md_size == 0 {
        if p.pi != HostPi::Pract {
            eprintln!(
                "pollux-perf: namespace {} is not formatted with PI: --pi {:?} puts no PI on the wire",
                ns.nsid, p.pi
            );
        }
        None
    } else {
        match PiNs::of(&ns) {
            Some(fmt) => Some(PiSetup {
                mode: p.pi,
                fmt,
                block: bs,
                pi_type: ns.pi_type,
                software: p.pi_software,
            }),
            None => {
                return fail(
                    set,
                    AppError::Usage(format!(
                        "namespace {} has {} bytes of metadata per block{}: pollux-perf drives PI in exactly 8",
                        ns.nsid,
                        ns.md_size,
                        if ns.pi_type == 0 { " and no PI" } else { "" }
                    )),
                )
            }
        }
    };
    // 2. Every core: its transport, queue pairs, buffers and job.
    let nsid = ns.nsid;
    let jp = JobParams {
        io_blocks: (p.io_size / bs) as u32,
        io_bytes: p.io_size as u64,
        units: ns.num_blocks / (p.io_size / bs) as u64,
        queue_depth: p.queue_depth,
        workload: p.workload,
        read_pct: p.read_pct,
        verify: p.verify,
        index: 0,
        jobs: ncores as u64,
        warmup: p.warmup,
        duration: p.duration,
        ride_through: !p.ctrl_loss_tmo.is_zero(),
    };
    if p.verify && jp.units < jp.jobs * p.queue_depth as u64 {
        return fail(
            set,
            AppError::Usage(
                "verify needs at least queue depth × cores I/O units in the namespace".into(),
            ),
        );
    }
    for (index, &core) in core_ids.iter().enumerate() {
        let (f, tx, info) = (Arc::clone(&factory), tx.clone(), info.clone());
        let link = link.clone();
        let mut jp = jp.clone();
        jp.index = index as u64;
        let (qd, inline_cap) = (p.queue_depth, p.inline_cap);
        let sent = set.messenger().send(core, move |r| {
            let q = QueueSetup {
                qpn,
                qd,
                inline_cap,
                index,
                pi,
            };
            if let Err(error) = start_core::<T>(r, &f, &info, link, (nsid, jp), q, tx.clone()) {
                let _ = tx.send(Msg::Failed { core, error });
            }
        });
        if let Err(e) = sent {
            return fail(set, AppError::Reactor(e.to_string()));
        }
    }
    drop(tx);
    let mut done = Vec::with_capacity(ncores);
    let mut failure = None;
    let mut load0 = None;
    while done.len() < ncores && failure.is_none() {
        let msg = rx.recv_timeout(p.warmup + p.duration + Duration::from_secs(60));
        match msg {
            Ok(Msg::Ready) => {}
            Ok(Msg::Load(l)) => load0 = Some(l),
            Ok(Msg::Done(d)) => done.push(*d),
            Ok(Msg::Failed { core, error }) => {
                failure = Some(AppError::Setup(format!("core {core}: {error}")))
            }
            Ok(Msg::Ctrl(_)) => {}
            Err(_) => {
                failure = Some(AppError::Setup(
                    "the run did not finish (target unresponsive?)".into(),
                ))
            }
        }
    }
    // 3. The target's load at the end, then tear down.
    let (ltx, lrx) = mpsc::channel();
    let _ = set.messenger().send(first, move |_| {
        let l = with_ctrl::<T, _>(|c| c.reactor_load()).flatten();
        let _ = ltx.send(l);
        // Shut the controller down cleanly (best effort).
        CTRL.with(|s| {
            if let Some(b) = s.borrow_mut().take() {
                if let Ok(ctrl) = b.downcast::<Rc<RefCell<(T, Controller<T>)>>>() {
                    if let Ok(cell) = Rc::try_unwrap(*ctrl) {
                        let (_t, c) = cell.into_inner();
                        let _ = c.shutdown();
                    }
                }
            }
        });
    });
    let load_end = lrx.recv_timeout(Duration::from_secs(15)).ok().flatten();
    set.stop_all();
    let joined = set.join();
    if let Some(f) = failure {
        return Err(f);
    }
    joined.map_err(|e| AppError::Reactor(e.to_string()))?;
    done.sort_by_key(|d| d.core);
    let seconds = done.iter().map(|d| d.seconds).fold(0.0, f64::max);
    let per_core: Vec<(u32, Tally, f64)> = done
        .into_iter()
        .map(|d| (d.core, d.tally, d.busy_pct))
        .collect();
    let mut report = Report::new(seconds, &per_core);
    report.reconnects = Some(link.reconnects());
    report.clock = Some(pollux_reactor::IoClock::get().source().as_str().into());
    if let (Some(Some(a)), Some(b)) = (load0, load_end) {
        report.target_busy_pct = b.busy_pct_since(&a);
    }
    Ok(report)
}

fn with_ctrl<T: HostTransport + 'static, R>(f: impl FnOnce(&mut Controller<T>) -> R) -> Option<R> {
    CTRL.with(|s| {
        let s = s.borrow();
        let ctrl = s
            .as_ref()?
            .downcast_ref::<Rc<RefCell<(T, Controller<T>)>>>()?;
        let mut g = ctrl.try_borrow_mut().ok()?;
        Some(f(&mut g.1))
    })
}

/// How one core sets up its queue pairs.
#[derive(Debug, Clone, Copy)]
struct QueueSetup {
    /// Queue pairs per namespace.
    qpn: u16,
    /// I/Os in flight (spread over the queue pairs).
    qd: usize,
    /// In-capsule write cap.
    inline_cap: Option<u32>,
    /// The core's index (its queue ids follow from it).
    index: usize,
    /// PI of a PI namespace.
    pi: Option<PiSetup>,
}

/// How a job drives a PI namespace.
#[derive(Debug, Clone, Copy)]
struct PiSetup {
    mode: HostPi,
    fmt: PiNs,
    block: usize,
    pi_type: u8,
    /// No signature offload, even where the transport has one.
    software: bool,
}

fn start_core<T: HostTransport + 'static>(
    r: &Reactor,
    factory: &TransportFactory<T>,
    info: &CtrlInfo,
    link: CtrlLink,
    (nsid, jp): (u32, JobParams),
    q: QueueSetup,
    tx: mpsc::Sender<Msg>,
) -> Result<(), String> {
    let QueueSetup {
        qpn,
        qd,
        inline_cap,
        index,
        pi,
    } = q;
    let t = factory().map_err(|e| e.to_string())?;
    let per_qp = qd.div_ceil(usize::from(qpn)).max(1);
    let entries = u16::try_from(per_qp).unwrap_or(u16::MAX);
    let mut qps = Vec::with_capacity(usize::from(qpn));
    for j in 0..qpn {
        let qid = 1 + index as u16 * qpn + j;
        qps.push(
            connect_io_qpair(&t, info, qid, entries, inline_cap)
                .map_err(|e| format!("I/O queue {qid}: {e}"))?,
        );
    }
    let blocks = jp.io_blocks as usize;
    // DIX: room for the tuples after the data.
    let mem_len = pi.map_or(jp.io_bytes as usize, |s| s.fmt.mem_len(s.mode, blocks));
    let pool = BufPool::new(BufPoolOptions::new(format!("perf-{index}"), mem_len, qd))
        .map_err(|e| format!("buffers: {e}"))?;
    let mut bufs = Vec::with_capacity(qd);
    for _ in 0..qd {
        let b = pool.get().ok_or("buffer pool empty")?;
        t.register_memory(b.arena()).map_err(|e| e.to_string())?;
        bufs.push(b);
    }
    // Insert and DIX: the transport's signature offload where it has one,
    // else one buffer per slot for the wire's extended blocks.
    let mut wire_pool = None;
    let nvmf_pi = match pi {
        None => None,
        Some(s) => {
            let mut wire = Vec::new();
            let mut offload = false;
            if s.mode != HostPi::Pract && !s.software {
                offload = true;
                for qp in &mut qps {
                    offload &= qp
                        .enable_pi_offload()
                        .map_err(|e| format!("PI offload: {e}"))?;
                }
                if index == 0 {
                    eprintln!(
                        "pollux-perf: PI {:?}: {}",
                        s.mode,
                        if offload {
                            "signature offload (one integrity MR per I/O)"
                        } else {
                            "in software (the transport has no signature offload)"
                        }
                    );
                }
            }
            if s.mode != HostPi::Pract && !offload {
                let wp = BufPool::new(BufPoolOptions::new(
                    format!("perf-pi-{index}"),
                    s.fmt.wire_len(s.mode, blocks),
                    qd,
                ))
                .map_err(|e| format!("PI buffers: {e}"))?;
                for _ in 0..qd {
                    let b = wp.get().ok_or("PI buffer pool empty")?;
                    t.register_memory(b.arena()).map_err(|e| e.to_string())?;
                    wire.push(b);
                }
                wire_pool = Some(wp);
            }
            let dix =
                (s.mode == HostPi::Dix).then(|| Dix::new(s.block, jp.io_bytes as usize, s.pi_type));
            Some(NvmfPi::new(s.mode, s.fmt, (blocks, qd), dix, offload, wire))
        }
    };
    // Take the first core's load sample once the warm-up is over.
    let warm = jp.warmup;
    let seed = 0x9E37_79B9_7F4A_7C15u64 ^ (index as u64 + 1);
    let queues = NvmfQueues::<T>::new(qps, nsid, nvmf_pi);
    let job = Rc::new(RefCell::new(Job::new(queues, jp, bufs, seed)));
    job.borrow_mut().start(r);
    let core = r.core();
    let _ = tx.send(Msg::Ready);
    if index == 0 {
        let tx2 = tx.clone();
        let rr = r.clone();
        let id = Rc::new(std::cell::Cell::new(None));
        let id2 = Rc::clone(&id);
        let pid = r.add_timed_poller("perf-load", warm.max(Duration::from_millis(1)), move || {
            let l = with_ctrl::<T, _>(|c| c.reactor_load()).flatten();
            let _ = tx2.send(Msg::Load(l));
            if let Some(i) = id2.get() {
                rr.remove_poller(i);
            }
            PollStatus::Busy
        });
        id.set(Some(pid));
    }
    let rr = r.clone();
    let pid = Rc::new(std::cell::Cell::new(None));
    let pid2 = Rc::clone(&pid);
    // The queues hold the reactor awake while commands are outstanding;
    // the job's own schedule (its end, reconnects, keep-alives) is polled,
    // not timed: keep polling until the job ends (`--idle adaptive|hybrid`).
    let keep = (t, pool, wire_pool, r.hold_awake());
    let mut recovery = Recovery {
        link,
        seen: Vec::new(),
        entries,
        inline_cap,
        next_check_ns: 0,
    };
    let id = r.add_poller("perf-job", move || {
        let keep = &keep;
        let mut j = job.borrow_mut();
        let st = j.poll(&rr);
        if j.is_paused() {
            recovery.step(&rr, &keep.0, &mut j);
        }
        if let Some(end) = j.end() {
            let msg = match end {
                JobEnd::Done => {
                    let (busy_pct, seconds) = j.measured();
                    Msg::Done(Box::new(CoreDone {
                        core,
                        tally: std::mem::take(&mut j.tally),
                        busy_pct,
                        seconds,
                    }))
                }
                JobEnd::Failed(why) => Msg::Failed {
                    core,
                    error: format!("lost the target: {why}"),
                },
            };
            let _ = tx.send(msg);
            drop(std::mem::take(j.queues_mut().qpairs_mut()));
            if let Some(i) = pid2.get() {
                rr.remove_poller(i);
            }
        }
        st
    });
    pid.set(Some(id));
    Ok(())
}

/// A paused job's way back: reconnect its dead queue pairs once the
/// controller is live again (control path; checked every 10 ms while the
/// job is paused, never on the I/O path).
struct Recovery {
    link: CtrlLink,
    /// Controller generation each queue pair was connected under.
    seen: Vec<u64>,
    entries: u16,
    inline_cap: Option<u32>,
    next_check_ns: u64,
}

impl Recovery {
    fn step<T: HostTransport>(&mut self, r: &Reactor, t: &T, j: &mut Job<NvmfQueues<T>>) {
        let now = r.now_ns();
        if now < self.next_check_ns {
            return;
        }
        self.next_check_ns = now + 10_000_000;
        if self.link.state() == CtrlState::Failed {
            j.give_up(self.link.lost_error().to_string());
            return;
        }
        let qps = j.queues_mut().qpairs_mut();
        if self.seen.len() < qps.len() {
            self.seen.resize(qps.len(), 0);
        }
        let mut all_alive = true;
        for (i, qp) in qps.iter_mut().enumerate() {
            if qp.is_alive() {
                continue;
            }
            // Commands still outstanding on the dead queue complete (as
            // errors) at the job's next poll; reconnect after that.
            if qp.outstanding() > 0 {
                all_alive = false;
                continue;
            }
            let qid = qp.qid();
            match self
                .link
                .reconnect_io(t, &mut self.seen[i], qid, self.entries, self.inline_cap)
            {
                Ok(Some(new)) => *qp = new,
                Ok(None) => all_alive = false,
                Err(e) => {
                    j.give_up(e.to_string());
                    return;
                }
            }
        }
        if all_alive {
            j.resume();
        }
    }
}
