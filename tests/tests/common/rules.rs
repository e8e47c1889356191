//! The data-path rule tests' shared drivers: keep a bdev channel's queue
//! full through the generic path (`IoChannel::submit` and a callback that
//! submits a fresh request per completion) or the in-place path
//! (`submit_in_place` and `InPlaceIo::resubmit`), for a given number of
//! I/Os, and check the counts taken around a run.
#![allow(clippy::unwrap_used)]

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use pollux_bdev::{CompletedIo, InPlaceIo, IoChannel, IoCompletion, IoType, SgList};
use pollux_reactor::mem::{BufPool, BufPoolOptions, CountingAlloc, DataPathCounts, HugepageMode};
use pollux_reactor::TestCluster;

/// I/Os per measured run (the rule is checked over at least this many).
pub const N: u64 = 100_000;

/// The counts now, with the first allocations after this traced (their
/// backtraces show in a failing test's output).
pub fn measure_from_here() -> DataPathCounts {
    CountingAlloc::trace(8);
    DataPathCounts::now()
}

/// The counts now, tracing stopped (call it before formatting anything).
pub fn measure_to_here() -> DataPathCounts {
    CountingAlloc::trace(0);
    DataPathCounts::now()
}

/// Assert that nothing was allocated and no lock taken between `before` and
/// `after`.
pub fn assert_clean(what: &str, before: DataPathCounts, after: DataPathCounts) {
    let d = DataPathCounts {
        allocations: after.allocations - before.allocations,
        locks: after.locks - before.locks,
    };
    assert!(
        d.is_zero(),
        "{what}: {} heap allocations and {} lock acquisitions over the measured I/Os",
        d.allocations,
        d.locks
    );
}

/// Prove the counters count in this binary (so a clean run means something).
pub fn assert_counters_work() {
    assert!(
        pollux_reactor::sync::locks_counted(),
        "feature count-locks is off"
    );
    let c = DataPathCounts::now();
    let v = std::hint::black_box(vec![1u8; 64]);
    let m = pollux_reactor::sync::Mutex::new(v.len());
    drop(m.lock().unwrap());
    let d = c.since();
    assert!(d.allocations >= 1 && d.locks >= 1, "{d:?}");
    // Another thread's allocations (the harness's) are not this thread's:
    // the other thread allocates between two readings here, which spin
    // (allocating nothing) while it does.
    use std::sync::atomic::{AtomicU8, Ordering::SeqCst};
    let step = std::sync::Arc::new(AtomicU8::new(0));
    let other = std::sync::Arc::clone(&step);
    let t = std::thread::spawn(move || {
        while other.load(SeqCst) != 1 {
            std::hint::spin_loop();
        }
        drop(std::hint::black_box(vec![2u8; 64]));
        other.store(2, SeqCst);
    });
    let (mine, all) = (DataPathCounts::now(), CountingAlloc::allocations());
    step.store(1, SeqCst);
    while step.load(SeqCst) != 2 {
        std::hint::spin_loop();
    }
    let (mine, all) = (mine.since().allocations, CountingAlloc::allocations() - all);
    t.join().unwrap();
    assert!(
        all >= 1,
        "the other thread's allocation is in the process total"
    );
    assert_eq!(
        mine, 0,
        "the other thread's allocation counted as this one's"
    );
}

/// `n` one-buffer lists of `len` bytes from a pool of their own (which
/// they keep alive).
pub fn buffers(name: &str, len: usize, n: usize) -> Vec<SgList> {
    let mut o = BufPoolOptions::new(name, len, n);
    o.hugepages = HugepageMode::Never;
    let pool = BufPool::new(o).unwrap();
    (0..n)
        .map(|_| SgList::from_buf(pool.get().unwrap()))
        .collect()
}

/// One bdev job: `depth` buffers, reads and writes alternating over the
/// first `span` blocks, `io_blocks` blocks per I/O.
pub struct BdevJob {
    ch: IoChannel,
    cb: RefCell<Option<Rc<dyn IoCompletion>>>,
    in_place: bool,
    io_blocks: u64,
    span: u64,
    /// Buffers not in flight (capacity `depth`: pushing never allocates).
    idle: RefCell<Vec<SgList>>,
    next: Cell<u64>,
    /// Submit until `next` reaches it.
    until: Cell<u64>,
    done: Cell<u64>,
    errors: Cell<u64>,
}

impl BdevJob {
    /// A job on `ch` with `depth` buffers of `io_blocks` blocks.
    pub fn new(ch: IoChannel, depth: usize, io_blocks: u64, in_place: bool) -> Rc<BdevJob> {
        let len = (io_blocks * ch.buf_block_size()) as usize;
        let idle = buffers("rules-bdev", len, depth);
        let span = ch.num_blocks() / io_blocks * io_blocks;
        let job = Rc::new(BdevJob {
            ch,
            cb: RefCell::new(None),
            in_place,
            io_blocks,
            span,
            idle: RefCell::new(idle),
            next: Cell::new(0),
            until: Cell::new(0),
            done: Cell::new(0),
            errors: Cell::new(0),
        });
        let cb: Rc<dyn IoCompletion> = job.clone();
        *job.cb.borrow_mut() = Some(cb);
        job
    }

    /// The next I/O's type and first block.
    fn next_io(&self) -> (IoType, u64) {
        let n = self.next.get();
        self.next.set(n + 1);
        let t = if n % 2 == 0 {
            IoType::Read
        } else {
            IoType::Write
        };
        let lba = (n.wrapping_mul(0x9E37_79B9) * self.io_blocks) % self.span;
        (t, lba)
    }

    fn submit(&self, bufs: SgList) {
        let cb = self.cb.borrow();
        let cb = cb.as_ref().unwrap();
        let (t, lba) = self.next_io();
        let r = if self.in_place {
            self.ch.submit_in_place(t, lba, self.io_blocks, bufs, cb, 0)
        } else {
            self.ch.submit(t, lba, self.io_blocks, bufs, cb, 0)
        };
        if let Err(rej) = r {
            panic!("rejected: {:?}", rej.error);
        }
    }

    /// Run `ios` more I/Os to completion on `cl`.
    pub fn run(&self, cl: &TestCluster, ios: u64) {
        self.run_with(cl, ios, || {});
    }

    /// [`run`](Self::run), calling `each_round` before every round of polls.
    pub fn run_with(&self, cl: &TestCluster, ios: u64, each_round: impl Fn()) {
        self.until.set(self.next.get() + ios);
        let target = self.done.get() + ios;
        loop {
            let b = self.idle.borrow_mut().pop();
            match b {
                Some(b) if self.next.get() < self.until.get() => self.submit(b),
                Some(b) => {
                    self.idle.borrow_mut().push(b);
                    break;
                }
                None => break,
            }
        }
        while self.done.get() < target {
            each_round();
            cl.poll_once_all();
        }
        assert_eq!(self.errors.get(), 0, "I/O errors");
        assert_eq!(self.ch.in_flight(), 0);
    }

    /// Break the job ↔ callback cycle.
    pub fn close(&self) {
        self.cb.borrow_mut().take();
    }
}

impl IoCompletion for BdevJob {
    fn complete(&self, io: CompletedIo<'_>) {
        self.done.set(self.done.get() + 1);
        if io.status().is_err() {
            self.errors.set(self.errors.get() + 1);
        }
        let bufs = io.into_bufs();
        if self.next.get() < self.until.get() {
            self.submit(bufs);
        } else {
            self.idle.borrow_mut().push(bufs);
        }
    }

    fn complete_in_place(&self, mut io: InPlaceIo<'_>) {
        self.done.set(self.done.get() + 1);
        if io.status().is_err() {
            self.errors.set(self.errors.get() + 1);
        }
        if self.next.get() < self.until.get() {
            let (t, lba) = self.next_io();
            io.resubmit(t, lba, self.io_blocks, 0);
        } else {
            self.idle.borrow_mut().push(io.take_bufs());
        }
    }
}

/// A queue kept full of alternating reads and writes over the first 4 MiB
/// of a device, by any host (NVMe-oF, iSER): `idle` buffers wait for a
/// slot, `next` numbers the I/Os.
pub struct QueueFill {
    /// Buffers not in flight.
    pub idle: Vec<SgList>,
    /// The next I/O's number (even: read, odd: write).
    pub next: u64,
    /// Bytes per I/O (512-byte blocks).
    pub size: usize,
}

/// One I/O to submit: read or write, first block, blocks, buffers, number.
pub struct Io {
    /// Read (else write).
    pub read: bool,
    /// First 512-byte block.
    pub lba: u64,
    /// Blocks.
    pub blocks: u32,
    /// The buffers.
    pub bufs: SgList,
    /// The I/O's number (its context value).
    pub n: u64,
}

impl QueueFill {
    /// `depth` idle buffers of `size` bytes, I/O number 0 next.
    pub fn new(name: &str, size: usize, depth: usize) -> Self {
        QueueFill {
            idle: buffers(name, size, depth),
            next: 0,
            size,
        }
    }

    /// Like [`QueueFill::new`], with room after each buffer's `size` data
    /// bytes for one 8-byte PI tuple per block (DIX).
    pub fn with_tuples(name: &str, size: usize, depth: usize) -> Self {
        QueueFill {
            idle: buffers(name, size + size / 512 * 8, depth),
            next: 0,
            size,
        }
    }

    /// Run `ios` more I/Os on `host`: `submit` hands the buffers back when
    /// the host refuses one for now, `reap` polls everything once and
    /// reports each completion (success, buffers).
    pub fn run<H>(
        &mut self,
        host: &mut H,
        ios: u64,
        mut submit: impl FnMut(&mut H, Io) -> Result<(), SgList>,
        mut reap: impl FnMut(&mut H, &mut dyn FnMut(bool, Option<SgList>)),
    ) {
        let blocks = (self.size / 512) as u32;
        let units = (4 << 20) / self.size as u64;
        let until = self.next + ios;
        let (mut done, mut failed) = (0, 0);
        while done < ios {
            while self.next < until {
                let Some(bufs) = self.idle.pop() else { break };
                let n = self.next;
                let lba = (n.wrapping_mul(0x9E37_79B9) % units) * u64::from(blocks);
                let io = Io {
                    read: n % 2 == 0,
                    lba,
                    blocks,
                    bufs,
                    n,
                };
                match submit(host, io) {
                    Ok(()) => self.next += 1,
                    Err(bufs) => {
                        self.idle.push(bufs);
                        break;
                    }
                }
            }
            let idle = &mut self.idle;
            reap(host, &mut |ok, bufs| {
                done += 1;
                failed += u64::from(!ok);
                idle.extend(bufs);
            });
        }
        assert_eq!(failed, 0, "failed I/Os");
    }
}

/// Keep a [`QueueFill`] going on namespace 1 of an NVMe-oF queue pair
/// until `ios` more completed, polling the reactor `r` (the target's poll
/// group runs there too) between rounds.
pub fn run_nvmf<Q: pollux_nvmf::host::HostQueue>(
    r: &pollux_reactor::Reactor,
    qp: &mut pollux_nvmf::host::Qpair<Q>,
    fill: &mut QueueFill,
    ios: u64,
) {
    run_nvmf_pi(r, qp, fill, ios, None);
}

/// [`run_nvmf`] on a PI namespace of format `pi` in a host mode: PRACT
/// (the target spreads, generates, checks and strips), or insert/DIX
/// through the queue's signature offload (enabled by the caller).
pub fn run_nvmf_pi<Q: pollux_nvmf::host::HostQueue>(
    r: &pollux_reactor::Reactor,
    qp: &mut pollux_nvmf::host::Qpair<Q>,
    fill: &mut QueueFill,
    ios: u64,
    pi: Option<(pollux_nvmf::host::pi::PiNs, pollux_nvmf::host::pi::HostPi)>,
) {
    use pollux_nvmf::host::pi::{HostPi, PiIo};
    fill.run(
        qp,
        ios,
        |qp, io| {
            let sub = match &pi {
                Some((f, HostPi::Pract)) => {
                    let rw = f.rw_pi(HostPi::Pract, io.lba);
                    qp.rw_pi(!io.read, 1, io.lba, io.blocks, io.bufs, &rw, io.n)
                }
                Some((f, mode)) => {
                    let p = PiIo {
                        mode: *mode,
                        fmt: *f,
                        slba: io.lba,
                        nlb: io.blocks,
                        write: !io.read,
                        target_checks: true,
                    };
                    qp.rw_pi_offload(1, &p, io.bufs, io.n)
                }
                None if io.read => qp.read(1, io.lba, io.blocks, io.bufs, io.n),
                None => qp.write(1, io.lba, io.blocks, io.bufs, io.n),
            };
            sub.map_err(|e| e.data)
        },
        |qp, done| {
            qp.poll(&mut |c| done(c.result.is_ok(), Some(c.data)));
            r.poll_once();
        },
    );
}

/// A controller of `subnqn` over `t` with one I/O queue pair (64 entries,
/// in-capsule writes up to `inline_cap`).
pub fn nvmf_queue<T: pollux_nvmf::host::HostTransport>(
    t: &T,
    hostid: [u8; 16],
    subnqn: &str,
    inline_cap: Option<u32>,
) -> (
    pollux_nvmf::host::Controller<T>,
    pollux_nvmf::host::Qpair<T::Queue>,
) {
    use pollux_nvmf::host::{Controller, CtrlOptions, HostIdentity, DEFAULT_HOSTNQN};
    let who = HostIdentity {
        hostnqn: DEFAULT_HOSTNQN.into(),
        hostid,
        subnqn: subnqn.into(),
    };
    let opts = CtrlOptions {
        io_queues: 1,
        ..CtrlOptions::default()
    };
    let c = Controller::connect(t, who, opts).unwrap();
    let qp = c.connect_io(t, 1, 64, inline_cap).unwrap();
    (c, qp)
}
