//! One core's work in `pollux-perf`, whatever it runs over: `queue_depth`
//! I/Os in flight to one device, latency per I/O, the measured window, and
//! the optional write-then-read-back verification.
//!
//! The device is a [`JobQueues`]: an NVMe-oF namespace behind one or more
//! I/O queue pairs ([`NvmfQueues`](super::nvmf_queues::NvmfQueues)) or a
//! SCSI LU behind an iSER session
//! ([`IserLu`](super::iser::IserLu)). The job owns the slots, the
//! workload, the tally and the clock; the queues only submit and reap.
//!
//! Per I/O nothing is allocated and no lock is taken: every in-flight slot
//! owns one DMA buffer (taken from a pool before the run), the buffer
//! travels with the I/O and comes back in the completion, and work
//! requests are posted once per poll ([`JobQueues::flush`]).

use std::time::Duration;

use pollux_reactor::mem::{DmaBuf, SgList};
use pollux_reactor::{IoClock, PollStatus, Reactor};

use crate::report::Tally;
use crate::workload::{check_pattern, fill_pattern, OffsetGen, Workload};

/// A submission the device did not take; the buffer comes back.
#[derive(Debug)]
pub struct Refused {
    /// The I/O's buffer.
    pub buf: Option<DmaBuf>,
    /// `None`: full for now, try again next poll; `Some`: the device can
    /// take no more I/O (dead queue, invalid request), and why.
    pub fatal: Option<String>,
}

/// How an I/O ended.
#[derive(Debug)]
pub enum Outcome {
    /// Completed with success.
    Good,
    /// Completed with an error status (counted; the job goes on).
    Failed,
    /// The path to the device is gone (aborted, timed out, connection
    /// lost): the job stops, or pauses when it rides through.
    Lost(String),
}

/// One completed I/O.
#[derive(Debug)]
pub struct Done {
    /// The slot given at submission.
    pub ctx: u64,
    /// The I/O's buffer.
    pub buf: Option<DmaBuf>,
    /// How it ended.
    pub outcome: Outcome,
}

/// The device a [`Job`] drives: submit a read or a write of `blocks`
/// blocks at `lba` from `data`, and reap what completed.
pub trait JobQueues {
    /// Submits one I/O tagged `ctx`.
    ///
    /// # Errors
    /// [`Refused`], with the buffer, when it was not taken.
    fn submit(
        &mut self,
        read: bool,
        lba: u64,
        blocks: u32,
        data: SgList,
        ctx: u64,
    ) -> Result<(), Refused>;

    /// Reaps completions into `out`; returns the work done (for the
    /// poller's busy/idle accounting).
    fn reap(&mut self, out: &mut Vec<Done>) -> usize;

    /// Posts what the submissions of this poll staged.
    fn flush(&mut self) {}

    /// Whether a submission can be taken now (a refusal would be `Busy`).
    fn can_submit(&self) -> bool {
        true
    }

    /// The path is gone and no completion will come for the I/O in
    /// flight (an iSER session that failed); `None` while it is up or
    /// when the I/O in flight will still complete as errors.
    fn lost(&self) -> Option<String> {
        None
    }

    /// The job failed: let go of the device (disconnect).
    fn halt(&mut self) {}
}

/// What a job does.
#[derive(Debug, Clone)]
pub struct JobParams {
    /// Blocks per I/O.
    pub io_blocks: u32,
    /// Bytes per I/O.
    pub io_bytes: u64,
    /// I/O-sized units in the device.
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
    /// A lost path pauses the job instead of ending it (the controller
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
    /// The device went away (the target disconnected, timed out, refused).
    Failed(String),
}

/// One core's job over the device `Q`.
pub struct Job<Q: JobQueues> {
    queues: Q,
    p: JobParams,
    slots: Vec<Slot>,
    free: Vec<usize>,
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
    /// Completions of one poll (capacity fixed at the start).
    done: Vec<Done>,
    /// Slots whose write completed and which read it back at once.
    read_back: Vec<usize>,
}

impl<Q: JobQueues> Job<Q> {
    /// A job over `queues` with one buffer per slot from `bufs` (exactly
    /// `queue_depth` of them, each `io_bytes` long).
    pub fn new(queues: Q, p: JobParams, bufs: Vec<DmaBuf>, seed: u64) -> Self {
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
        let n = slots.len() + 8;
        Job {
            queues,
            p,
            slots,
            free,
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
            done: Vec::with_capacity(n),
            read_back: Vec::with_capacity(n),
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

    /// Ended, with no I/O in flight any more.
    pub fn is_drained(&self) -> bool {
        self.end.is_some() && self.in_flight == 0
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

    /// The device (to tear it down, or to replace dead queues while
    /// paused).
    pub fn queues_mut(&mut self) -> &mut Q {
        &mut self.queues
    }

    /// Whether the path was lost and the job waits for
    /// [`resume`](Self::resume) (only with `ride_through`).
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Submit again after the dead queues were replaced.
    pub fn resume(&mut self) {
        self.paused = false;
    }

    /// End the job: the device is lost for good.
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

    /// Submits `slot`; `false` when the device did not take it (the
    /// buffer stays in the slot).
    fn submit_slot(&mut self, slot: usize, unit: u64, read: bool) -> bool {
        let Some(mut buf) = self.slots[slot].buf.take() else {
            return false;
        };
        let offset = unit * self.p.io_bytes;
        if self.p.verify {
            // The data only: a buffer may have room for PI after it.
            let n = self.p.io_bytes as usize;
            if read {
                buf.as_mut_slice()[..n].fill(0xA5);
            } else {
                fill_pattern(&mut buf.as_mut_slice()[..n], offset, self.slots[slot].iter);
            }
        }
        let lba = unit * u64::from(self.p.io_blocks);
        let data = SgList::from_buf(buf);
        match self
            .queues
            .submit(read, lba, self.p.io_blocks, data, slot as u64)
        {
            Ok(()) => {
                let s = &mut self.slots[slot];
                s.submitted = self.clock.now();
                s.unit = unit;
                s.read = read;
                self.in_flight += 1;
                true
            }
            Err(Refused { buf, fatal }) => {
                self.slots[slot].buf = buf;
                if let Some(why) = fatal {
                    self.fail(why);
                }
                false
            }
        }
    }

    fn fail(&mut self, why: String) {
        if self.p.ride_through && self.end.is_none() {
            // Wait for the device to come back; no new I/O until then.
            self.paused = true;
            return;
        }
        if self.end.is_none() {
            self.end = Some(JobEnd::Failed(why));
        }
        self.stopping = true;
        self.queues.halt();
    }

    /// Books one completion; `true` when the slot reads its write back
    /// at once (verify), else it is free again.
    fn on_completion(&mut self, d: Done) -> bool {
        let slot = d.ctx as usize;
        self.in_flight = self.in_flight.saturating_sub(1);
        let ro = self.read_only_verify();
        let Some(s) = self.slots.get_mut(slot) else {
            return false;
        };
        s.buf = d.buf;
        match d.outcome {
            Outcome::Good => {
                if self.measure_ns.is_some() {
                    self.tally.ios += 1;
                    self.tally.bytes += self.p.io_bytes;
                    let ticks = self.clock.now().wrapping_sub(s.submitted);
                    self.tally.latency.record(self.clock.ticks_to_ns(ticks));
                }
                if self.p.verify {
                    if !s.read {
                        return true;
                    }
                    let offset = s.unit * self.p.io_bytes;
                    let generation = if ro { 0 } else { s.iter };
                    if let Some(b) = &s.buf {
                        let data = &b.as_slice()[..self.p.io_bytes as usize];
                        if check_pattern(data, offset, generation).is_err() {
                            self.tally.miscompares += 1;
                        }
                    }
                    s.iter += 1;
                }
            }
            Outcome::Failed => self.tally.errors += 1,
            Outcome::Lost(why) => {
                self.tally.errors += 1;
                self.fail(why);
            }
        }
        false
    }

    fn check_window(&mut self, r: &Reactor) {
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
    }

    /// One round: reap, read writes back, keep the queue full; `Busy`
    /// when it did work. Finished when [`Job::end`] is `Some`.
    pub fn poll(&mut self, r: &Reactor) -> PollStatus {
        if self.end.is_some() && self.in_flight == 0 {
            return PollStatus::Idle;
        }
        self.check_window(r);
        let mut done = std::mem::take(&mut self.done);
        let mut work = self.queues.reap(&mut done);
        if let Some(why) = self.queues.lost() {
            if self.end.is_none() || self.in_flight > 0 {
                // No completion will come for the I/O in flight.
                self.fail(why);
                self.in_flight = 0;
            }
        }
        let mut read_back = std::mem::take(&mut self.read_back);
        for d in done.drain(..) {
            let slot = d.ctx as usize;
            if self.on_completion(d) {
                read_back.push(slot);
            } else if slot < self.slots.len() {
                self.free.push(slot);
            }
        }
        self.done = done;
        for slot in read_back.drain(..) {
            let unit = self.slots[slot].unit;
            if self.stopping || !self.submit_slot(slot, unit, true) {
                self.free.push(slot);
            }
        }
        self.read_back = read_back;
        if !self.stopping && !self.paused {
            while self.queues.can_submit() {
                let Some(slot) = self.free.pop() else { break };
                let (unit, read) = self.unit_for(slot);
                if !self.submit_slot(slot, unit, read) {
                    self.free.push(slot);
                    break;
                }
                work += 1;
            }
            self.queues.flush();
        }
        if self.stopping && self.in_flight == 0 && self.end.is_none() {
            self.end = Some(JobEnd::Done);
        }
        PollStatus::from_work(work > 0)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use pollux_reactor::mem::{DmaBuf, SgList};
    use pollux_reactor::TestCluster;

    use super::{Done, Job, JobEnd, JobParams, JobQueues, Outcome, Refused};
    use crate::workload::Workload;

    const BLOCK: usize = 512;

    /// A device in memory: I/O is done at submission and completes at the
    /// next reap; `room` I/Os at most in flight.
    struct MemDevice {
        store: Vec<u8>,
        pending: Vec<Done>,
        room: usize,
        /// Flip a byte of every read's data.
        corrupt_reads: bool,
        /// After this many submissions the path is gone, with no
        /// completion for what was in flight.
        lose_after: Option<u64>,
        submitted: u64,
        halted: bool,
    }

    impl MemDevice {
        fn new(blocks: usize, room: usize) -> Self {
            MemDevice {
                store: vec![0; blocks * BLOCK],
                pending: Vec::new(),
                room,
                corrupt_reads: false,
                lose_after: None,
                submitted: 0,
                halted: false,
            }
        }
    }

    impl JobQueues for MemDevice {
        fn submit(
            &mut self,
            read: bool,
            lba: u64,
            blocks: u32,
            mut data: SgList,
            ctx: u64,
        ) -> Result<(), Refused> {
            if self.pending.len() >= self.room || self.halted {
                return Err(Refused {
                    buf: data.pop(),
                    fatal: self.halted.then(|| "halted".to_string()),
                });
            }
            let mut buf = data.pop();
            let b = buf.as_mut().expect("one buffer").as_mut_slice();
            let at = lba as usize * BLOCK;
            let len = blocks as usize * BLOCK;
            if read {
                b[..len].copy_from_slice(&self.store[at..at + len]);
                if self.corrupt_reads {
                    b[7] ^= 0xFF;
                }
            } else {
                self.store[at..at + len].copy_from_slice(&b[..len]);
            }
            self.submitted += 1;
            self.pending.push(Done {
                ctx,
                buf,
                outcome: Outcome::Good,
            });
            Ok(())
        }

        fn reap(&mut self, out: &mut Vec<Done>) -> usize {
            if self.lost().is_some() {
                self.pending.clear();
                return 0;
            }
            let n = self.pending.len();
            out.append(&mut self.pending);
            n
        }

        fn lost(&self) -> Option<String> {
            self.lose_after
                .filter(|&n| self.submitted >= n)
                .map(|_| "gone".to_string())
        }

        fn halt(&mut self) {
            self.halted = true;
        }
    }

    fn params(verify: bool, workload: Workload) -> JobParams {
        JobParams {
            io_blocks: 8,
            io_bytes: 8 * BLOCK as u64,
            units: 64,
            queue_depth: 8,
            workload,
            read_pct: 50,
            verify,
            index: 0,
            jobs: 1,
            warmup: Duration::ZERO,
            duration: Duration::from_millis(20),
            ride_through: false,
        }
    }

    /// Runs `job` on a test reactor, 1 ms of manual time a round, until it
    /// drains (at most 1,000 rounds).
    fn run(job: &mut Job<MemDevice>) {
        let cluster = TestCluster::new(1);
        let r = cluster.reactor(0);
        job.start(&r);
        for _ in 0..1000 {
            job.poll(&r);
            if job.is_drained() {
                return;
            }
            cluster.advance(Duration::from_millis(1));
            // The reactor reads its clock once a round.
            cluster.poll_once_all();
        }
        panic!(
            "the job did not end: {} in flight, {:?}, {} I/Os",
            job.in_flight,
            job.end(),
            job.tally.ios
        );
    }

    fn bufs(n: usize) -> Vec<DmaBuf> {
        (0..n)
            .map(|_| DmaBuf::alloc(8 * BLOCK).expect("buffer"))
            .collect()
    }

    #[test]
    fn verify_writes_reads_back_and_finds_a_corrupted_read() {
        let mut job = Job::new(
            MemDevice::new(512, 3),
            params(true, Workload::RandRw),
            bufs(8),
            1,
        );
        run(&mut job);
        assert!(matches!(job.end(), Some(JobEnd::Done)));
        // Every slot wrote and read back, round after round, through a
        // device that takes 3 at a time.
        assert!(job.tally.ios > 16, "{}", job.tally.ios);
        assert_eq!((job.tally.errors, job.tally.miscompares), (0, 0));

        let mut dev = MemDevice::new(512, 8);
        dev.corrupt_reads = true;
        let mut job = Job::new(dev, params(true, Workload::RandRw), bufs(8), 1);
        run(&mut job);
        assert!(job.tally.miscompares > 0);
        assert_eq!(job.tally.miscompares * 2, job.tally.ios);
    }

    #[test]
    fn a_lost_path_with_io_in_flight_ends_the_job_failed_and_drained() {
        let mut dev = MemDevice::new(512, 8);
        dev.lose_after = Some(20);
        let mut job = Job::new(dev, params(false, Workload::RandRead), bufs(8), 1);
        run(&mut job);
        match job.end() {
            Some(JobEnd::Failed(why)) => assert_eq!(why, "gone"),
            other => panic!("{other:?}"),
        }
        assert!(job.queues_mut().halted);
        assert!(
            job.tally.ios >= 8 && job.tally.ios < 20,
            "{}",
            job.tally.ios
        );
    }
}
