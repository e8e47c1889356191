//! The engine of `pollux-bdevperf`: one job per bdev on every selected core,
//! each keeping `queue_depth` I/Os in flight on its core's I/O channel for
//! the run's duration, then reporting per-core and total figures.
//!
//! It measures like SPDK's bdevperf by default: the generic path
//! (`IoChannel::submit` with a fresh request per I/O, the completion
//! callback submitting the next one) and two timestamps per I/O, at submit
//! and at completion, from the reactor's calibrated [`IoClock`] (the TSC
//! where it is invariant, else `CLOCK_MONOTONIC`). `in_place` selects the
//! in-place path instead (`submit_in_place`, each completion resubmitting
//! its own request slot), the same timestamps included.
//!
//! Per I/O the job does no allocation and takes no lock: each of its slots
//! owns one DMA buffer that travels with the I/O and comes back in the
//! completion.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pollux_bdev::{
    Bdev, BdevDesc, CompletedIo, InPlaceIo, IoChannel, IoCompletion, IoType, PiAction, Rejected,
    SgList,
};
use pollux_reactor::mem::{BufPool, BufPoolOptions, DmaBuf};
use pollux_reactor::{launch, CoreId, Cores, IdleMode, IoClock, LaunchConfig, PollStatus, Reactor};

use crate::report::{Report, Tally};
use crate::workload::{check_pattern, fill_pattern, OffsetGen, Workload};
use crate::AppError;

/// What to run.
#[derive(Clone, Debug)]
pub struct PerfParams {
    /// I/Os in flight per job.
    pub queue_depth: usize,
    /// Bytes per I/O (a multiple of every bdev's block size).
    pub io_size: usize,
    /// The access pattern.
    pub workload: Workload,
    /// Read percentage for `rw`/`randrw`.
    pub read_pct: u8,
    /// How long to run.
    pub duration: Duration,
    /// The in-place path (`submit_in_place` and `InPlaceIo::resubmit`)
    /// instead of the generic one (`submit` with a fresh request and a
    /// callback per I/O, as SPDK's bdevperf).
    pub in_place: bool,
}

impl PerfParams {
    /// `"in-place"` or `"generic"` (the report's `path`).
    pub fn path_name(&self) -> &'static str {
        if self.in_place {
            "in-place"
        } else {
            "generic"
        }
    }
}

/// What the bdev layer does about protection information on every I/O
/// (`--pi`; the bdevs must have PI).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PiMode {
    /// No PI action (the metadata passes through).
    #[default]
    Off,
    /// Writes generate their tuples.
    WriteGenerate,
    /// Reads verify guard and reference tag.
    ReadVerify,
    /// Both.
    Both,
}

impl PiMode {
    /// The action each I/O carries.
    pub fn action(self) -> Option<PiAction> {
        match self {
            PiMode::Off => None,
            PiMode::WriteGenerate => Some(PiAction::write_generate()),
            PiMode::ReadVerify => Some(PiAction::read_verify()),
            PiMode::Both => Some(PiAction::both()),
        }
    }
}

impl std::str::FromStr for PiMode {
    type Err = AppError;

    fn from_str(s: &str) -> Result<Self, AppError> {
        match s {
            "off" => Ok(PiMode::Off),
            "write-generate" => Ok(PiMode::WriteGenerate),
            "read-verify" => Ok(PiMode::ReadVerify),
            "both" => Ok(PiMode::Both),
            _ => Err(AppError::Usage(format!(
                "--pi `{s}`: expected off, write-generate, read-verify or both"
            ))),
        }
    }
}

/// Progress or results sent from a reactor to the main thread.
enum Msg {
    Progress { core: CoreId, ios: u64 },
    Done(Box<CoreDone>),
    Failed { core: CoreId, error: String },
}

struct CoreDone {
    core: CoreId,
    tally: Tally,
    busy_pct: f64,
    seconds: f64,
}

/// Runs the benchmark on `bdevs` and returns the report.
///
/// `progress`, when set, receives the total IOPS of each second while the
/// run lasts (the binary prints it on a terminal).
///
/// # Errors
///
/// [`AppError`] when the parameters do not fit a bdev, a bdev cannot be
/// opened, the reactors cannot start, or a core fails to set up its jobs.
pub fn run(
    bdevs: &[Arc<Bdev>],
    cores: Cores,
    idle: IdleMode,
    params: &PerfParams,
    progress: Option<&mut dyn FnMut(f64)>,
) -> Result<Report, AppError> {
    run_with_pi(bdevs, cores, idle, params, PiMode::Off, progress)
}

/// [`run`] with a PI action on every I/O (`--pi`): every bdev must have PI,
/// and the workload may not be `verify` (its pattern covers the metadata).
/// Bdevs with separate metadata get one metadata buffer per slot.
///
/// # Errors
///
/// As [`run`], and [`AppError::Usage`] for a bdev without PI.
pub fn run_with_pi(
    bdevs: &[Arc<Bdev>],
    cores: Cores,
    idle: IdleMode,
    params: &PerfParams,
    pi: PiMode,
    mut progress: Option<&mut dyn FnMut(f64)>,
) -> Result<Report, AppError> {
    check_params(bdevs, params)?;
    if pi != PiMode::Off {
        if params.workload == Workload::Verify {
            return Err(AppError::Usage(
                "--pi does not combine with -w verify".into(),
            ));
        }
        if let Some(b) = bdevs
            .iter()
            .find(|b| b.info().pi_type() == pollux_bdev::PiType::None)
        {
            return Err(AppError::Usage(format!(
                "--pi needs bdevs with PI; {} has none (md=8,pi=1)",
                b.name()
            )));
        }
    }
    let writable = params.workload != Workload::Read && params.workload != Workload::RandRead;
    let mut descs = Vec::with_capacity(bdevs.len());
    for b in bdevs {
        descs.push(
            b.open(writable)
                .map_err(|e| AppError::Bdev(e.to_string()))?,
        );
    }
    let descs = Arc::new(descs);
    let ncores = cores.len();
    let core_ids: Vec<CoreId> = cores.iter().collect();
    let mut cfg = LaunchConfig::new(cores);
    cfg.idle = idle;
    let set = launch(cfg, |_| {}).map_err(|e| AppError::Reactor(e.to_string()))?;
    let (tx, rx) = mpsc::channel::<Msg>();
    for (index, &core) in core_ids.iter().enumerate() {
        let (descs, params, tx) = (Arc::clone(&descs), params.clone(), tx.clone());
        let sent = set.messenger().send(core, move |r| {
            if let Err(error) = start_core(r, &descs, &params, pi, index, ncores, tx.clone()) {
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
    let mut second: Vec<u64> = Vec::new();
    let mut last: Vec<u64> = vec![0; ncores];
    while done.len() + usize::from(failure.is_some()) < ncores {
        match rx.recv() {
            Ok(Msg::Progress { core, ios }) => {
                let i = core_ids.iter().position(|c| *c == core).unwrap_or(0);
                second.push(ios.saturating_sub(last[i]));
                last[i] = ios;
                if second.len() == ncores {
                    if let Some(p) = progress.as_mut() {
                        p(second.iter().sum::<u64>() as f64);
                    }
                    second.clear();
                }
            }
            Ok(Msg::Done(d)) => done.push(*d),
            Ok(Msg::Failed { core, error }) => {
                failure = Some(AppError::Setup(format!("core {core}: {error}")));
                break;
            }
            Err(_) => {
                failure = Some(AppError::Reactor("a reactor exited early".into()));
                break;
            }
        }
    }
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
    report.path = Some(params.path_name().into());
    report.clock = Some(IoClock::get().source().as_str().into());
    Ok(report)
}

fn check_params(bdevs: &[Arc<Bdev>], p: &PerfParams) -> Result<(), AppError> {
    if bdevs.is_empty() {
        return Err(AppError::Usage(
            "no bdev given (use --bdev or --config)".into(),
        ));
    }
    if p.queue_depth == 0 {
        return Err(AppError::Usage("queue depth must be at least 1".into()));
    }
    if p.duration.is_zero() {
        return Err(AppError::Usage("run time must be positive".into()));
    }
    for b in bdevs {
        let info = b.info();
        let bs = info.buf_block_size() as usize;
        if p.io_size % bs != 0 {
            return Err(AppError::Usage(format!(
                "io size {} is not a multiple of bdev {}'s block size {bs}",
                p.io_size,
                info.name()
            )));
        }
        if (p.io_size / bs) as u64 > info.num_blocks() {
            return Err(AppError::Usage(format!(
                "io size {} is larger than bdev {}",
                p.io_size,
                info.name()
            )));
        }
    }
    Ok(())
}

/// Per-core state shared by that core's jobs.
struct CoreRun {
    core: CoreId,
    jobs_left: usize,
    tally: Tally,
    started: Instant,
    busy0: (u64, u64),
    tx: mpsc::Sender<Msg>,
}

fn start_core(
    r: &Reactor,
    descs: &[BdevDesc],
    p: &PerfParams,
    pi: PiMode,
    index: usize,
    ncores: usize,
    tx: mpsc::Sender<Msg>,
) -> Result<(), String> {
    let s0 = r.stats();
    let run = Rc::new(RefCell::new(CoreRun {
        core: r.core(),
        jobs_left: descs.len(),
        tally: Tally::default(),
        started: r.now(),
        busy0: (s0.busy_ns, s0.idle_ns),
        tx: tx.clone(),
    }));
    let mut jobs = Vec::with_capacity(descs.len());
    for (j, desc) in descs.iter().enumerate() {
        let ch = desc.channel(r).map_err(|e| e.to_string())?;
        let job = Job::new(r, ch, (p, pi), index, ncores, j, Rc::clone(&run))?;
        jobs.push(job);
    }
    // Start every job, then arm the end-of-run timer and the progress ticker.
    for job in &jobs {
        Job::start(job);
    }
    let stop_jobs = jobs.clone();
    let rr = r.clone();
    let end = Rc::new(std::cell::Cell::new(None));
    let end2 = Rc::clone(&end);
    let id = r.add_timed_poller("bdevperf-end", p.duration, move || {
        for job in &stop_jobs {
            Job::stop(job);
        }
        if let Some(id) = end2.get() {
            rr.remove_poller(id);
        }
        PollStatus::Busy
    });
    end.set(Some(id));
    let tick_jobs = jobs.clone();
    let core = r.core();
    let ticker = Rc::new(std::cell::Cell::new(None));
    let ticker2 = Rc::clone(&ticker);
    let rr = r.clone();
    let id = r.add_timed_poller("bdevperf-progress", Duration::from_secs(1), move || {
        let ios: u64 = tick_jobs.iter().map(|j| j.0.borrow().tally.ios).sum();
        let running = tick_jobs.iter().any(|j| !j.0.borrow().stopping);
        if running {
            let _ = tx.send(Msg::Progress { core, ios });
        } else if let Some(id) = ticker2.get() {
            rr.remove_poller(id);
        }
        PollStatus::Idle
    });
    ticker.set(Some(id));
    // A poller retries I/Os that the channel pushed back (queue full).
    let retry_jobs = jobs;
    let rr = r.clone();
    let retry = Rc::new(std::cell::Cell::new(None));
    let retry2 = Rc::clone(&retry);
    let id = r.add_poller("bdevperf-retry", move || {
        let mut busy = PollStatus::Idle;
        let mut all_done = true;
        for job in &retry_jobs {
            if Job::retry_parked(job) {
                busy = PollStatus::Busy;
            }
            all_done &= job.0.borrow().finished;
        }
        if all_done {
            if let Some(id) = retry2.get() {
                rr.remove_poller(id);
            }
        }
        busy
    });
    retry.set(Some(id));
    Ok(())
}

/// What a verify slot does next with its unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Write,
    Read,
}

struct Slot {
    bufs: Option<SgList>,
    /// Separate metadata buffers (`--pi` on a DIX bdev; else empty).
    md: Option<SgList>,
    /// Submit time, [`IoClock`] ticks.
    submitted: u64,
    unit: u64,
    phase: Phase,
    generation: u64,
}

struct JobState {
    ch: IoChannel,
    clock: IoClock,
    in_place: bool,
    cb: Option<Rc<dyn IoCompletion>>,
    gen: OffsetGen,
    workload: Workload,
    io_blocks: u64,
    io_bytes: u64,
    /// `--pi`: the action every I/O carries.
    pi: Option<PiAction>,
    first_block: u64,
    units: u64,
    slots: Vec<Slot>,
    parked: Vec<usize>,
    in_flight: usize,
    stopping: bool,
    finished: bool,
    tally: Tally,
    run: Rc<RefCell<CoreRun>>,
}

struct Job(RefCell<JobState>);

impl IoCompletion for Job {
    #[inline]
    fn complete(&self, io: CompletedIo<'_>) {
        self.0.borrow_mut().on_complete_generic(io);
    }

    #[inline]
    fn complete_in_place(&self, mut io: InPlaceIo<'_>) {
        self.0.borrow_mut().on_complete(&mut io);
    }
}

/// The submission of [`Job::submit_bufs`] with PI: the slot's metadata
/// buffers and the job's PI action go along.
#[cold]
#[allow(clippy::result_large_err)] // IoChannel's own result, passed through
fn submit_pi(
    ch: &IoChannel,
    in_place: bool,
    (t, lba, n): (IoType, u64, u64),
    (bufs, md): (SgList, SgList),
    a: PiAction,
    cb: &Rc<dyn IoCompletion>,
    ctx: u64,
) -> Result<(), Rejected> {
    if in_place {
        ch.submit_in_place_with_pi(t, lba, n, bufs, md, Some(a), cb, ctx)
    } else {
        ch.submit_with_pi(t, lba, n, bufs, md, Some(a), cb, ctx)
    }
}

impl Job {
    #[allow(clippy::too_many_arguments)]
    fn new(
        r: &Reactor,
        ch: IoChannel,
        (p, pi): (&PerfParams, PiMode),
        core_index: usize,
        ncores: usize,
        job_index: usize,
        run: Rc<RefCell<CoreRun>>,
    ) -> Result<Rc<Job>, String> {
        let bs = ch.buf_block_size();
        let io_blocks = p.io_size as u64 / bs;
        let total_units = ch.num_blocks() / io_blocks;
        // Verify gives each core its own stripe of the bdev, and each slot its
        // own units within it, so no two I/Os ever touch the same blocks.
        let (first_unit, units) = if p.workload == Workload::Verify {
            let per = total_units / ncores as u64;
            (per * core_index as u64, per)
        } else {
            (0, total_units)
        };
        if units == 0 {
            return Err(format!(
                "bdev too small for {} cores at io size {}",
                ncores, p.io_size
            ));
        }
        let depth = if p.workload == Workload::Verify {
            p.queue_depth.min(units as usize)
        } else {
            p.queue_depth
        };
        let pool = BufPool::new(BufPoolOptions::new(
            format!("bdevperf-c{}-j{job_index}", r.core()),
            p.io_size,
            depth,
        ))
        .map_err(|e| format!("buffers: {e}"))?;
        let pi = pi.action();
        let md_len = if pi.is_some() {
            (ch.md_buf_block_size() * io_blocks) as usize
        } else {
            0
        };
        let mut slots = Vec::with_capacity(depth);
        for i in 0..depth {
            let mut buf = pool.get().ok_or("buffer pool smaller than its count")?;
            fill_pattern(buf.as_mut_slice(), i as u64 * p.io_size as u64, 0);
            let md = if md_len > 0 {
                SgList::from_buf(
                    DmaBuf::alloc(md_len).map_err(|e| format!("metadata buffer: {e}"))?,
                )
            } else {
                SgList::new()
            };
            slots.push(Slot {
                bufs: Some(SgList::from_buf(buf)),
                md: Some(md),
                submitted: 0,
                unit: i as u64,
                phase: Phase::Write,
                generation: 0,
            });
        }
        let seed = 0x5EED ^ ((r.core() as u64) << 32) ^ job_index as u64;
        let job = Rc::new(Job(RefCell::new(JobState {
            ch,
            clock: IoClock::get(),
            in_place: p.in_place,
            cb: None,
            gen: OffsetGen::new(p.workload, p.read_pct, units, seed),
            workload: p.workload,
            io_blocks,
            io_bytes: p.io_size as u64,
            pi,
            first_block: first_unit * io_blocks,
            units,
            slots,
            parked: Vec::with_capacity(depth),
            in_flight: 0,
            stopping: false,
            finished: false,
            tally: Tally::default(),
            run,
        })));
        let cb: Rc<dyn IoCompletion> = job.clone();
        job.0.borrow_mut().cb = Some(cb);
        Ok(job)
    }

    fn start(job: &Rc<Job>) {
        let mut s = job.0.borrow_mut();
        for i in 0..s.slots.len() {
            s.submit(i);
        }
    }

    fn stop(job: &Rc<Job>) {
        let mut s = job.0.borrow_mut();
        s.stopping = true;
        s.parked.clear();
        s.maybe_finish();
    }

    /// Resubmits parked slots; whether any went out.
    fn retry_parked(job: &Rc<Job>) -> bool {
        let mut s = job.0.borrow_mut();
        if s.parked.is_empty() || s.stopping {
            return false;
        }
        let n = s.parked.len();
        for _ in 0..n {
            let Some(i) = s.parked.pop() else { break };
            s.submit(i);
        }
        s.parked.len() < n
    }
}

impl JobState {
    /// Picks slot `i`'s next I/O: (unit, is_read), preparing a verify buffer.
    #[inline(always)]
    fn next_io(&mut self, i: usize, bufs: Option<&mut SgList>) -> (u64, bool) {
        if self.workload == Workload::Verify {
            return self.next_verify_io(i, bufs);
        }
        (self.gen.next_unit(), self.gen.next_is_read())
    }

    /// [`next_io`](Self::next_io) of the verify workload: the slot's own
    /// unit, its buffer filled with the pattern (write) or poisoned (read).
    #[cold]
    fn next_verify_io(&mut self, i: usize, bufs: Option<&mut SgList>) -> (u64, bool) {
        let slot = &self.slots[i];
        let unit = slot.unit;
        let offset = (self.first_block + unit * self.io_blocks) * self.ch.buf_block_size();
        if let Some(b) = bufs.and_then(|l| l.iter_mut().next()) {
            match slot.phase {
                Phase::Write => fill_pattern(b.as_mut_slice(), offset, slot.generation),
                // Poison the buffer so that a read which moves no data
                // cannot pass for one that returned what was written.
                Phase::Read => b.as_mut_slice().fill(0xDB),
            }
        }
        (unit, slot.phase == Phase::Read)
    }

    /// Submit slot `i`'s next I/O as a fresh request (the generic path's
    /// every I/O; the in-place path's first one, and any after
    /// back-pressure): its buffers move into the channel's request slot.
    #[inline]
    fn submit(&mut self, i: usize) {
        if let Some(bufs) = self.slots[i].bufs.take() {
            self.submit_bufs(i, bufs);
        }
    }

    /// [`submit`](Self::submit) with the slot's buffers in hand.
    #[inline(always)]
    fn submit_bufs(&mut self, i: usize, mut bufs: SgList) {
        let (unit, is_read) = self.next_io(i, Some(&mut bufs));
        let now = self.clock.now();
        let slot = &mut self.slots[i];
        slot.unit = unit;
        slot.submitted = now;
        let Some(cb) = self.cb.as_ref() else {
            self.slots[i].bufs = Some(bufs);
            return;
        };
        let lba = self.first_block + unit * self.io_blocks;
        let t = if is_read { IoType::Read } else { IoType::Write };
        let (n, ctx) = (self.io_blocks, i as u64);
        let r = if let Some(a) = self.pi {
            let md = self.slots[i].md.take().unwrap_or_default();
            submit_pi(&self.ch, self.in_place, (t, lba, n), (bufs, md), a, cb, ctx)
        } else if self.in_place {
            self.ch.submit_in_place(t, lba, n, bufs, cb, ctx)
        } else {
            self.ch.submit(t, lba, n, bufs, cb, ctx)
        };
        match r {
            Ok(()) => self.in_flight += 1,
            Err(rej) => {
                self.slots[i].bufs = Some(rej.bufs);
                self.slots[i].md = Some(rej.md_bufs);
                self.parked.push(i);
            }
        }
    }

    /// Count a completion of slot `i` (latency from its submit timestamp).
    #[inline(always)]
    fn account(&mut self, i: usize, ok: bool) {
        let now = self.clock.now();
        let Some(slot) = self.slots.get(i) else {
            return;
        };
        let latency = self.clock.ticks_to_ns(now.wrapping_sub(slot.submitted));
        self.tally.ios += 1;
        self.tally.latency.record(latency);
        if ok {
            self.tally.bytes += self.io_bytes;
        } else {
            self.tally.errors += 1;
        }
    }

    /// A completion on the generic path: count it, take the buffers back
    /// (which frees the channel's request slot) and submit the slot's next
    /// I/O as a fresh request.
    #[inline]
    fn on_complete_generic(&mut self, mut io: CompletedIo<'_>) {
        let i = io.ctx() as usize;
        let ok = io.status().is_ok();
        if i >= self.slots.len() {
            return;
        }
        self.account(i, ok);
        self.in_flight -= 1;
        if self.pi.is_none() && self.workload != Workload::Verify && !self.stopping {
            // The common case in one straight line: the buffers go from the
            // completion to the next submission in one expression.
            let (unit, is_read) = (self.gen.next_unit(), self.gen.next_is_read());
            let now = self.clock.now();
            let lba = self.first_block + unit * self.io_blocks;
            let t = if is_read { IoType::Read } else { IoType::Write };
            let (Some(slot), Some(cb)) = (self.slots.get_mut(i), self.cb.as_ref()) else {
                return;
            };
            slot.unit = unit;
            slot.submitted = now;
            match self
                .ch
                .submit(t, lba, self.io_blocks, io.into_bufs(), cb, i as u64)
            {
                Ok(()) => self.in_flight += 1,
                Err(rej) => {
                    slot.bufs = Some(rej.bufs);
                    self.parked.push(i);
                }
            }
            return;
        }
        if self.pi.is_some() {
            self.slots[i].md = Some(io.take_md_bufs());
        }
        if self.workload == Workload::Verify {
            self.verify_account(i, ok, io.offset_blocks(), io.bufs());
        }
        let bufs = io.into_bufs();
        if self.stopping {
            self.slots[i].bufs = Some(bufs);
            self.maybe_finish();
            return;
        }
        self.submit_bufs(i, bufs);
    }

    /// A completion, in the channel's slot: count it and resubmit in place.
    #[inline]
    fn on_complete(&mut self, io: &mut InPlaceIo<'_>) {
        let i = io.ctx() as usize;
        let ok = io.status().is_ok();
        if i >= self.slots.len() {
            return;
        }
        self.account(i, ok);
        if self.workload == Workload::Verify {
            self.verify_complete(i, ok, io);
            return;
        }
        if self.stopping {
            // Not resubmitted: the slot is freed and the buffers go back to
            // the job's pool.
            self.in_flight -= 1;
            self.maybe_finish();
            return;
        }
        let unit = self.gen.next_unit();
        let t = if self.gen.next_is_read() {
            IoType::Read
        } else {
            IoType::Write
        };
        self.slots[i].submitted = self.clock.now();
        io.resubmit(
            t,
            self.first_block + unit * self.io_blocks,
            self.io_blocks,
            i as u64,
        );
    }

    /// The verify half of [`on_complete`](Self::on_complete): check what a
    /// read returned, move the slot to its next unit, refill and resubmit.
    #[cold]
    fn verify_complete(&mut self, i: usize, ok: bool, io: &mut InPlaceIo<'_>) {
        self.verify_account(i, ok, io.offset_blocks(), io.bufs());
        if self.stopping {
            self.in_flight -= 1;
            self.maybe_finish();
            return;
        }
        let (unit, is_read) = self.next_io(i, Some(io.bufs_mut()));
        self.slots[i].unit = unit;
        self.slots[i].submitted = self.clock.now();
        let lba = self.first_block + unit * self.io_blocks;
        let t = if is_read { IoType::Read } else { IoType::Write };
        io.resubmit(t, lba, self.io_blocks, i as u64);
    }

    /// Check what a verify read of slot `i` at `offset_blocks` returned in
    /// `bufs`, and move the slot to its next phase and unit.
    #[cold]
    fn verify_account(&mut self, i: usize, ok: bool, offset_blocks: u64, bufs: &SgList) {
        let depth = self.slots.len() as u64;
        let bbs = self.ch.buf_block_size();
        let units = self.units;
        let Some(slot) = self.slots.get_mut(i) else {
            return;
        };
        if ok {
            match slot.phase {
                Phase::Write => slot.phase = Phase::Read,
                Phase::Read => {
                    let offset = offset_blocks * bbs;
                    if let Some(b) = bufs.iter().next() {
                        if check_pattern(b.as_slice(), offset, slot.generation).is_err() {
                            self.tally.miscompares += 1;
                        }
                    }
                    slot.phase = Phase::Write;
                    let mut next = slot.unit + depth;
                    if next >= units {
                        next = i as u64;
                        slot.generation += 1;
                    }
                    slot.unit = next;
                }
            }
        }
    }

    fn maybe_finish(&mut self) {
        if self.finished || self.in_flight > 0 {
            return;
        }
        self.finished = true;
        self.cb = None; // breaks the job <-> callback cycle
        let mut run = self.run.borrow_mut();
        run.tally.merge(&self.tally);
        run.jobs_left -= 1;
        if run.jobs_left == 0 {
            let r = self.ch.reactor();
            let s = r.stats();
            let busy = s.busy_ns.saturating_sub(run.busy0.0);
            let idle = s.idle_ns.saturating_sub(run.busy0.1);
            let busy_pct = if busy + idle == 0 {
                0.0
            } else {
                busy as f64 * 100.0 / (busy + idle) as f64
            };
            let done = CoreDone {
                core: run.core,
                tally: std::mem::take(&mut run.tally),
                busy_pct,
                seconds: r.now().saturating_duration_since(run.started).as_secs_f64(),
            };
            let _ = run.tx.send(Msg::Done(Box::new(done)));
        }
    }
}

#[cfg(test)]
mod tests {
    use pollux_bdev::BdevRegistry;

    use super::*;

    fn pi_run(
        spec: &str,
        workload: Workload,
        io_size: usize,
        pi: PiMode,
    ) -> Result<Report, AppError> {
        let reg = BdevRegistry::new();
        let b = reg.create(spec).unwrap();
        let p = PerfParams {
            queue_depth: 8,
            io_size,
            workload,
            read_pct: 50,
            duration: Duration::from_millis(150),
            in_place: false,
        };
        run_with_pi(
            &[b],
            Cores::parse("0").unwrap(),
            IdleMode::BusyPoll,
            &p,
            pi,
            None,
        )
    }

    #[test]
    fn pi_both_runs_clean_on_null_and_malloc_dif_and_dix() {
        for (spec, io) in [
            ("null:size=1M,block=512,md=8,md_interleave=true,pi=1", 4160),
            (
                "malloc:size=1M,block=512,md=8,md_interleave=true,pi=1",
                4160,
            ),
            ("malloc:size=1M,block=4096,md=8,pi=1", 4096),
            ("null:size=1M,block=4096,md=8,pi=3", 4096),
        ] {
            let rep = pi_run(spec, Workload::RandRw, io, PiMode::Both).unwrap();
            assert!(rep.total.ios > 0, "{spec}: no I/O");
            assert_eq!(rep.total.errors, 0, "{spec}: PI errors");
        }
    }

    #[test]
    fn pi_needs_a_pi_bdev_and_no_verify() {
        assert!(matches!(
            pi_run("null:size=1M", Workload::RandRead, 4096, PiMode::ReadVerify),
            Err(AppError::Usage(_))
        ));
        assert!(matches!(
            pi_run(
                "null:size=1M,md=8,pi=1",
                Workload::Verify,
                4096,
                PiMode::Both
            ),
            Err(AppError::Usage(_))
        ));
        assert!("sideways".parse::<PiMode>().is_err());
        assert_eq!("both".parse::<PiMode>().unwrap(), PiMode::Both);
    }
}
