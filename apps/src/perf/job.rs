//! One core's work in `pollux-perf`: its I/O queue pairs to one namespace,
//! `queue_depth` I/Os in flight spread over them, latency per I/O, and the
//! optional write-then-read-back verification.
//!
//! Per I/O nothing is allocated and no lock is taken: every in-flight slot
//! owns one DMA buffer (from a pool registered with the transport before
//! the run), the buffer travels with the I/O and comes back in the
//! completion, and WRs are posted once per poll (the queue pairs' flush).

use std::time::Duration;

use pollux_nvmf::host::{Completion, HostTransport, IoError, Qpair, SubmitErrorKind};
use pollux_reactor::mem::{DmaBuf, SgList};
use pollux_reactor::{IoClock, PollStatus, Reactor};

use crate::report::Tally;
use crate::workload::{check_pattern, fill_pattern, OffsetGen, Workload};

/// What a job does.
#[derive(Debug, Clone)]
pub struct JobParams {
    /// Namespace id.
    pub nsid: u32,
    /// Blocks per I/O.
    pub io_blocks: u32,
    /// Bytes per I/O.
    pub io_bytes: u64,
    /// I/O-sized units in the namespace.
    pub units: u64,
    /// I/Os in flight.
    pub queue_depth: usize,
    /// The access pattern.
    pub workload: Workload,
    /// Read percentage (rw, randrw).
    pub read_pct: u8,
    /// Write, read back and compare; with a pure-read workload, read only
    /// and compare with the generation-0 pattern (data laid down before
    /// the run, e.g. a file filled with
    /// [`known_pattern`](crate::workload::known_pattern)).
    pub verify: bool,
    /// This job's index and the number of jobs (verification partitions
    /// the units between jobs and slots).
    pub index: u64,
    /// Jobs in the run.
    pub jobs: u64,
    /// Warm-up before measuring.
    pub warmup: Duration,
    /// Measured time.
    pub duration: Duration,
    /// A dead queue pauses the job instead of ending it (the controller
    /// is reconnecting; see [`Job::is_paused`]).
    pub ride_through: bool,
}

#[derive(Debug)]
struct Slot {
    buf: Option<DmaBuf>,
    submitted: u64,
    unit: u64,
    read: bool,
    iter: u64,
}

/// How the job ended.
#[derive(Debug)]
pub enum JobEnd {
    /// Ran its time.
    Done,
    /// A queue died (the target disconnected, timed out, refused).
    Failed(String),
}

/// One core's job.
pub struct Job<T: HostTransport> {
    qps: Vec<Qpair<T::Queue>>,
    p: JobParams,
    slots: Vec<Slot>,
    free: Vec<usize>,
    next_qp: usize,
    gen: OffsetGen,
    /// Measured figures.
    pub tally: Tally,
    start_ns: u64,
    /// Per-I/O timestamps (submit and completion).
    clock: IoClock,
    measure_ns: Option<u64>,
    stopping: bool,
    in_flight: usize,
    end: Option<JobEnd>,
    busy0: (u64, u64),
    measured: (u64, u64, f64),
    paused: bool,
}

impl<T: HostTransport> Job<T> {
    /// A job over `qps` with one buffer per slot from `bufs` (exactly
    /// `queue_depth` of them, each `io_bytes` long).
    pub fn new(qps: Vec<Qpair<T::Queue>>, p: JobParams, bufs: Vec<DmaBuf>, seed: u64) -> Self {
        let slots: Vec<Slot> = bufs
            .into_iter()
            .map(|b| Slot {
                buf: Some(b),
                submitted: 0,
                unit: 0,
                read: false,
                iter: 0,
            })
            .collect();
        let free = (0..slots.len()).rev().collect();
        let gen = OffsetGen::new(p.workload, p.workload.read_pct(p.read_pct), p.units, seed);
        Job {
            qps,
            p,
            slots,
            free,
            next_qp: 0,
            gen,
            tally: Tally::default(),
            start_ns: 0,
            clock: IoClock::get(),
            measure_ns: None,
            stopping: false,
            in_flight: 0,
            end: None,
            busy0: (0, 0),
            measured: (0, 0, 0.0),
            paused: false,
        }
    }

    /// Start the clock.
    pub fn start(&mut self, r: &Reactor) {
        self.start_ns = r.now_ns();
        if self.p.warmup.is_zero() {
            self.begin_measuring(r);
        }
    }

    fn begin_measuring(&mut self, r: &Reactor) {
        self.tally = Tally::default();
        self.measure_ns = Some(r.now_ns());
        let s = r.stats();
        self.busy0 = (s.busy_ns, s.idle_ns);
    }

    /// How it ended (once finished).
    pub fn end(&self) -> Option<&JobEnd> {
        self.end.as_ref()
    }

    /// `(busy_pct, seconds)` of the measured period.
    pub fn measured(&self) -> (f64, f64) {
        let (b, i, secs) = self.measured;
        let pct = if b + i == 0 {
            0.0
        } else {
            b as f64 * 100.0 / (b + i) as f64
        };
        (pct, secs)
    }

    /// The queue pairs (for teardown).
    pub fn take_qpairs(&mut self) -> Vec<Qpair<T::Queue>> {
        std::mem::take(&mut self.qps)
    }

    /// Whether a queue died and the job waits for
    /// [`resume`](Self::resume) (only with `ride_through`).
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// The queue pairs, to replace dead ones while paused.
    pub fn qpairs_mut(&mut self) -> &mut [Qpair<T::Queue>] {
        &mut self.qps
    }

    /// Submit again after the dead queues were replaced.
    pub fn resume(&mut self) {
        self.paused = false;
    }

    /// End the job: the controller is lost for good.
    pub fn give_up(&mut self, why: String) {
        self.p.ride_through = false;
        self.paused = false;
        self.fail(why);
    }

    /// `--verify` with a pure-read workload: read and compare only.
    fn read_only_verify(&self) -> bool {
        self.p.verify && self.p.workload.read_pct(self.p.read_pct) == 100
    }

    fn unit_for(&mut self, slot: usize) -> (u64, bool) {
        if self.p.verify {
            let s = &self.slots[slot];
            // Slot `slot` of job `index` owns units congruent to it.
            let lanes = self.p.jobs * self.p.queue_depth as u64;
            let lane = self.p.index * self.p.queue_depth as u64 + slot as u64;
            let unit = (lane + s.iter * lanes) % self.p.units.max(1);
            (unit, self.read_only_verify())
        } else {
            (self.gen.next_unit(), self.gen.next_is_read())
        }
    }

    fn submit_slot(&mut self, slot: usize, unit: u64, read: bool) -> bool {
        let Some(mut buf) = self.slots[slot].buf.take() else {
            return false;
        };
        let offset = unit * self.p.io_bytes;
        if self.p.verify {
            if read {
                buf.as_mut_slice().fill(0xA5);
            } else {
                fill_pattern(buf.as_mut_slice(), offset, self.slots[slot].iter);
            }
        }
        let slba = unit * u64::from(self.p.io_blocks);
        let mut data = SgList::from_buf(buf);
        let n = self.qps.len();
        for k in 0..n {
            let qi = (self.next_qp + k) % n;
            let qp = &mut self.qps[qi];
            let res = if read {
                qp.read(self.p.nsid, slba, self.p.io_blocks, data, slot as u64)
            } else {
                qp.write(self.p.nsid, slba, self.p.io_blocks, data, slot as u64)
            };
            match res {
                Ok(()) => {
                    self.next_qp = (qi + 1) % n;
                    let s = &mut self.slots[slot];
                    s.submitted = self.clock.now();
                    s.unit = unit;
                    s.read = read;
                    self.in_flight += 1;
                    return true;
                }
                Err(e) => {
                    data = e.data;
                    match e.kind {
                        SubmitErrorKind::Busy => continue,
                        SubmitErrorKind::Dead => {
                            let why = qp
                                .dead_reason()
                                .map_or_else(|| "queue dead".to_string(), |d| d.to_string());
                            self.fail(why);
                            break;
                        }
                        SubmitErrorKind::Invalid(err) => {
                            self.fail(err.to_string());
                            break;
                        }
                    }
                }
            }
        }
        self.slots[slot].buf = data.pop();
        false
    }

    fn fail(&mut self, why: String) {
        if self.p.ride_through && self.end.is_none() {
            // Wait for the controller to come back; no new I/O until then.
            self.paused = true;
            return;
        }
        if self.end.is_none() {
            self.end = Some(JobEnd::Failed(why));
        }
        self.stopping = true;
        for qp in &mut self.qps {
            qp.disconnect();
        }
    }

    fn on_completion(&mut self, c: Completion, resubmit: &mut Vec<(usize, bool)>) {
        let slot = c.ctx as usize;
        let mut data = c.data;
        self.in_flight -= 1;
        let Some(s) = self.slots.get_mut(slot) else {
            return;
        };
        s.buf = data.pop();
        let measuring = self.measure_ns.is_some();
        let ro = self.p.verify && self.p.workload.read_pct(self.p.read_pct) == 100;
        match c.result {
            Ok(_) => {
                if measuring {
                    self.tally.ios += 1;
                    self.tally.bytes += self.p.io_bytes;
                    let ticks = self.clock.now().wrapping_sub(s.submitted);
                    self.tally.latency.record(self.clock.ticks_to_ns(ticks));
                }
                if self.p.verify {
                    if s.read {
                        let offset = s.unit * self.p.io_bytes;
                        let generation = if ro { 0 } else { s.iter };
                        if let Some(b) = &s.buf {
                            if check_pattern(b.as_slice(), offset, generation).is_err() {
                                self.tally.miscompares += 1;
                            }
                        }
                        s.iter += 1;
                    } else {
                        resubmit.push((slot, true));
                        return;
                    }
                }
            }
            Err(e) => {
                self.tally.errors += 1;
                if matches!(e, IoError::Aborted | IoError::TimedOut) {
                    let why = self
                        .qps
                        .iter()
                        .find_map(|q| q.dead_reason().map(|d| d.to_string()))
                        .unwrap_or_else(|| e.to_string());
                    self.fail(why);
                }
            }
        }
        self.free.push(slot);
    }

    /// One round: reap, resubmit, keep the queue full; `Busy` when it did
    /// work. Finished when [`Job::end`] is `Some`.
    pub fn poll(
        &mut self,
        r: &Reactor,
        scratch: &mut Vec<Completion>,
        resubmit: &mut Vec<(usize, bool)>,
    ) -> PollStatus {
        if self.end.is_some() && self.in_flight == 0 {
            return PollStatus::Idle;
        }
        let now = r.now_ns();
        if self.measure_ns.is_none()
            && !self.stopping
            && now.saturating_sub(self.start_ns) >= self.p.warmup.as_nanos() as u64
        {
            self.begin_measuring(r);
        }
        if let Some(m) = self.measure_ns {
            if !self.stopping && now.saturating_sub(m) >= self.p.duration.as_nanos() as u64 {
                self.stopping = true;
                let s = r.stats();
                self.measured = (
                    s.busy_ns.saturating_sub(self.busy0.0),
                    s.idle_ns.saturating_sub(self.busy0.1),
                    now.saturating_sub(m) as f64 / 1e9,
                );
            }
        }
        let mut work = 0;
        for qp in &mut self.qps {
            work += qp.poll(&mut |c| scratch.push(c));
        }
        for c in scratch.drain(..) {
            self.on_completion(c, resubmit);
        }
        for &(slot, read) in resubmit.iter() {
            let unit = self.slots[slot].unit;
            if self.stopping || !self.submit_slot(slot, unit, read) {
                self.free.push(slot);
            }
        }
        resubmit.clear();
        if !self.stopping && !self.paused {
            while let Some(slot) = self.free.pop() {
                let (unit, read) = self.unit_for(slot);
                if !self.submit_slot(slot, unit, read) {
                    self.free.push(slot);
                    break;
                }
                work += 1;
            }
            for qp in &mut self.qps {
                qp.flush();
            }
        }
        if self.stopping && self.in_flight == 0 && self.end.is_none() {
            self.end = Some(JobEnd::Done);
        }
        PollStatus::from_work(work > 0)
    }
}
