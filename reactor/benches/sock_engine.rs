//! The NVMe/TCP target's socket pattern on loopback: which socket engine?
//!
//! A "host" thread (core 0) keeps `--qd` (128) read commands outstanding
//! on one TCP connection: each poll it sends every 72-byte command capsule
//! it may (one `write`) and reads the responses (one `read` into 256 KiB).
//! A "target" thread (core 1), the engine under test, receives what
//! arrived each poll and answers each command with a 24-byte C2HData
//! header (LAST_PDU | SUCCESS, no separate response) followed by the
//! command's `--sizes` bytes (512 B, 4 KiB) from a per-command buffer,
//! sent by reference (scatter-gather, not copied), everything queued going
//! out once per poll:
//!
//! - `A` (`read+writev`, what the target does now): one non-blocking
//!   `read` into a 256 KiB receive buffer, one `writev` per poll.
//! - `B` (`uring`): [`SockRing`] with `TaskRun::Defer`: a multishot
//!   receive into 16 provided buffers of 16 KiB (256 KiB), one `SENDMSG`
//!   with the iovecs per poll, one `io_uring_enter` per poll (none when
//!   nothing is queued and no deferred work is pending), completions
//!   reaped without blocking. `B-coop` and `B-int` are the other
//!   [`TaskRun`] modes.
//!
//! First, the CPU time of one poll of one idle connection per engine (a
//! `read` that fails with `EAGAIN`, or a reap and a submit that find
//! nothing): what every mostly idle connection adds to every poll.
//!
//! Then each cell runs `--reps` times (5) for `--secs` (3 s, after 0.5 s
//! of warm-up), cells interleaved (A, B, A, B, ...). Per cell: IOPS; CPU
//! per I/O of each thread (user and system time from
//! `/proc/thread-self/stat`, 10 ms ticks); each thread's *busy* CPU per
//! I/O: the thread CPU clock read after every poll, summed over the polls
//! that moved bytes, less the cost of the clock reads themselves (measured
//! at start); the target's share of CPU in polls that moved nothing, its
//! system calls per I/O (the engine's only) and its I/Os per busy poll.
//!
//! Both threads busy-poll, so each one's CPU time is about the wall time
//! it was given: whole-thread CPU per I/O is about 1 / IOPS, mostly idle
//! spinning, and on a shared machine it follows the load more than the
//! engine. The busy CPU per I/O is what the engine costs when there is
//! work, and does not count time the thread was preempted: it is the
//! figure that decides. `--poll-clock off` leaves the clock reads out
//! (busy columns then read 0) to see the whole-thread user/system split
//! undisturbed. Medians are printed with the B/A ratios (of the medians,
//! and per round, paired), then one JSON line per cell
//! (`sock_engine_result`).
//!
//! Run: `cargo bench -p pollux-reactor --bench sock_engine`
//! (options: `-- --secs 3 --reps 5 --qd 128 --sizes 4096,512
//! --engines a,b[,b-coop,b-int] --poll-clock on|off`).

use std::io::{ErrorKind, IoSlice, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pollux_reactor::io::{SendList, SockEvent, SockRing, SockRingConfig, TaskRun};

/// Command capsule: 8-byte common header + 64-byte SQE.
const CAPSULE: usize = 72;
/// C2HData PDU header.
const C2H_HDR: usize = 24;
const PDU_CAPSULE_CMD: u8 = 0x04;
const PDU_C2H_DATA: u8 = 0x07;
const C2H_LAST_PDU: u8 = 0x04;
const C2H_SUCCESS: u8 = 0x08;
const NVM_READ: u8 = 0x02;
/// Receive buffer of the host and of engine A.
const RECV_BUF: usize = 256 * 1024;
/// Slices per `writev` of engine A, as in the target's `tx_queue.rs`: a
/// header and a payload per response, 128 responses per call.
const MAX_IOV: usize = 256;
const WARMUP: Duration = Duration::from_millis(500);

/// Read the thread CPU clock after every poll (busy time); off with
/// `--poll-clock off`, which leaves the polls as the target makes them.
static POLL_CLOCK: AtomicBool = AtomicBool::new(true);

const PHASE_WARMUP: u8 = 0;
const PHASE_MEASURE: u8 = 1;
const PHASE_STOP: u8 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Engine {
    /// Non-blocking `read` + `writev`.
    A,
    /// io_uring socket ring with the given task-run mode.
    B(TaskRun),
}

impl Engine {
    fn name(self) -> &'static str {
        match self {
            Engine::A => "A:read+writev",
            Engine::B(TaskRun::Defer) => "B:uring",
            Engine::B(TaskRun::Coop) => "B:uring-coop",
            Engine::B(TaskRun::Interrupt) => "B:uring-int",
        }
    }
}

struct Args {
    secs: f64,
    reps: usize,
    qd: usize,
    sizes: Vec<usize>,
    engines: Vec<Engine>,
}

fn parse_args() -> Args {
    let mut a = Args {
        secs: 3.0,
        reps: 5,
        qd: 128,
        sizes: vec![4096, 512],
        engines: vec![Engine::A, Engine::B(TaskRun::Defer)],
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut val = || it.next().expect("option needs a value");
        match k.as_str() {
            "--secs" => a.secs = val().parse().expect("--secs: a number"),
            "--reps" => a.reps = val().parse().expect("--reps: a number"),
            "--qd" => a.qd = val().parse().expect("--qd: a number"),
            "--sizes" => {
                a.sizes = val()
                    .split(',')
                    .map(|s| s.parse().expect("--sizes: numbers"))
                    .collect()
            }
            "--poll-clock" => POLL_CLOCK.store(val() != "off", Ordering::Relaxed),
            "--engines" => {
                a.engines = val()
                    .split(',')
                    .map(|s| match s {
                        "a" => Engine::A,
                        "b" => Engine::B(TaskRun::Defer),
                        "b-coop" => Engine::B(TaskRun::Coop),
                        "b-int" => Engine::B(TaskRun::Interrupt),
                        other => panic!("unknown engine {other} (a, b, b-coop, b-int)"),
                    })
                    .collect()
            }
            _ => {} // `--bench` from cargo, filters
        }
    }
    assert!(
        (1..=4096).contains(&a.qd),
        "--qd must be 1 to 4096 (one command id each)"
    );
    for &s in &a.sizes {
        assert!(
            s >= 512 && s % 512 == 0 && s <= 65536,
            "sizes: multiples of 512 up to 64 KiB"
        );
    }
    a
}

/// User and system CPU time of the calling thread, in nanoseconds.
fn thread_cpu() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/thread-self/stat").expect("read /proc/thread-self/stat");
    // Fields after the command name (which may hold spaces): state is
    // field 3, utime 14, stime 15 (USER_HZ = 100 ticks per second).
    let rest = &s[s.rfind(')').expect("stat format") + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f[i].parse::<u64>().expect("stat tick") * 10_000_000;
    (tick(11), tick(12))
}

fn pin(core: usize) {
    if let Err(e) = affinity::set_thread_affinity([core]) {
        eprintln!("warning: cannot pin to core {core}: {e}");
    }
}

/// What a thread measured over the measuring phase.
#[derive(Debug, Clone, Copy, Default)]
struct ThreadStats {
    user_ns: u64,
    sys_ns: u64,
    polls: u64,
    /// Thread CPU time of the polls that moved bytes, and of the others.
    busy_ns: u64,
    idle_ns: u64,
    busy_polls: u64,
    syscalls: u64,
    /// CPU time of one clock read (measured when the thread starts).
    clock_ns: f64,
}

/// Watches the phase from a poll loop; samples CPU at the edges.
struct Meter {
    phase: Arc<AtomicU8>,
    seen: u8,
    cpu0: (u64, u64),
    /// The thread CPU clock at the end of the last poll.
    last: u64,
    clock_ns: f64,
    stats: ThreadStats,
}

/// CPU time of one [`thread_clock`] read.
fn clock_cost() -> f64 {
    const N: u64 = 20_000;
    let t0 = thread_clock();
    for _ in 0..N {
        std::hint::black_box(thread_clock());
    }
    (thread_clock() - t0) as f64 / (N + 1) as f64
}

/// The calling thread's CPU clock (a system call: the vDSO has no
/// per-thread clock), in nanoseconds.
fn thread_clock() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

impl Meter {
    fn new(phase: Arc<AtomicU8>) -> Self {
        Meter {
            phase,
            seen: PHASE_WARMUP,
            cpu0: (0, 0),
            last: thread_clock(),
            clock_ns: if POLL_CLOCK.load(Ordering::Relaxed) {
                clock_cost()
            } else {
                0.0
            },
            stats: ThreadStats::default(),
        }
    }

    /// Whether to go on; counts only inside the measuring phase.
    fn tick(&mut self) -> bool {
        let p = self.phase.load(Ordering::Relaxed);
        if p != self.seen {
            if p >= PHASE_MEASURE && self.seen == PHASE_WARMUP {
                self.cpu0 = thread_cpu();
                self.stats = ThreadStats {
                    clock_ns: self.clock_ns,
                    ..ThreadStats::default()
                };
                self.last = thread_clock();
            }
            if p == PHASE_STOP {
                let (u, s) = thread_cpu();
                self.stats.user_ns = u - self.cpu0.0;
                self.stats.sys_ns = s - self.cpu0.1;
            }
            self.seen = p;
        }
        p != PHASE_STOP
    }

    /// Ends a poll: its CPU time (since the end of the previous one, this
    /// clock read included) counts as busy when it moved bytes.
    fn poll_done(&mut self, busy: bool, syscalls: u64) {
        if !POLL_CLOCK.load(Ordering::Relaxed) {
            self.stats.polls += 1;
            self.stats.syscalls += syscalls;
            self.stats.busy_polls += u64::from(busy);
            return;
        }
        let now = thread_clock();
        let d = now.saturating_sub(self.last);
        self.last = now;
        self.stats.polls += 1;
        self.stats.syscalls += syscalls;
        if busy {
            self.stats.busy_ns += d;
            self.stats.busy_polls += 1;
        } else {
            self.stats.idle_ns += d;
        }
    }
}

fn capsule(cid: u16, size: usize) -> [u8; CAPSULE] {
    let mut c = [0u8; CAPSULE];
    c[0] = PDU_CAPSULE_CMD;
    c[2] = CAPSULE as u8;
    c[4..8].copy_from_slice(&(CAPSULE as u32).to_le_bytes());
    let sqe = &mut c[8..];
    sqe[0] = NVM_READ;
    sqe[2..4].copy_from_slice(&cid.to_le_bytes());
    sqe[4..8].copy_from_slice(&1u32.to_le_bytes());
    sqe[40..48].copy_from_slice(&(u64::from(cid) * 8).to_le_bytes());
    let nlb = (size / 512 - 1) as u16;
    sqe[48..50].copy_from_slice(&nlb.to_le_bytes());
    c
}

/// A command's id and read length, from its capsule.
fn parse_capsule(c: &[u8]) -> (u16, usize) {
    assert!(
        c[0] == PDU_CAPSULE_CMD && c[8] == NVM_READ,
        "bad capsule {:?}",
        &c[..8]
    );
    let cid = u16::from_le_bytes([c[10], c[11]]);
    let nlb = u16::from_le_bytes([c[56], c[57]]);
    (cid, (usize::from(nlb) + 1) * 512)
}

fn c2h_header(cid: u16, len: usize) -> [u8; C2H_HDR] {
    let mut h = [0u8; C2H_HDR];
    h[0] = PDU_C2H_DATA;
    h[1] = C2H_LAST_PDU | C2H_SUCCESS;
    h[2] = C2H_HDR as u8;
    h[3] = C2H_HDR as u8;
    h[4..8].copy_from_slice(&((C2H_HDR + len) as u32).to_le_bytes());
    h[8..10].copy_from_slice(&cid.to_le_bytes());
    h[16..20].copy_from_slice(&(len as u32).to_le_bytes());
    h
}

/// The per-command read buffers of the target.
fn data_bufs(qd: usize, size: usize) -> Vec<Rc<[u8]>> {
    (0..qd)
        .map(|i| vec![i as u8; size].into_boxed_slice().into())
        .collect()
}

/// The host: keeps `qd` reads outstanding; returns (stats, completions, seconds).
fn host(
    sock: TcpStream,
    qd: usize,
    size: usize,
    secs: f64,
    phase: Arc<AtomicU8>,
) -> (ThreadStats, u64, f64) {
    pin(0);
    let mut sock = sock;
    sock.set_nonblocking(true).expect("host nonblocking");
    let mut free: Vec<u16> = (0..qd as u16).rev().collect();
    let mut tx: Vec<u8> = Vec::with_capacity(2 * qd * CAPSULE);
    let mut tx_off = 0;
    let mut rx = vec![0u8; RECV_BUF];
    let mut hdr = [0u8; C2H_HDR];
    let mut hdr_have = 0;
    let mut data_left = 0usize;
    let mut cur_cid = 0u16;
    let mut done = 0u64;
    let mut meter = Meter::new(phase.clone());
    let mut done0 = 0;
    let start = Instant::now();
    let mut t_measure = start;
    let mut polls = 0u64;
    let measure_end = WARMUP + Duration::from_secs_f64(secs);
    while meter.tick() {
        let mut busy = false;
        let mut calls = 0;
        // Send every command it may.
        if tx_off == tx.len() {
            tx.clear();
            tx_off = 0;
        }
        while let Some(cid) = free.pop() {
            tx.extend_from_slice(&capsule(cid, size));
        }
        if tx_off < tx.len() {
            calls += 1;
            match sock.write(&tx[tx_off..]) {
                Ok(n) => {
                    tx_off += n;
                    busy = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => panic!("host write: {e}"),
            }
        }
        // Read responses.
        calls += 1;
        match sock.read(&mut rx) {
            Ok(0) => panic!("host: target closed"),
            Ok(n) => {
                busy = true;
                let mut b = &rx[..n];
                while !b.is_empty() {
                    if data_left > 0 {
                        let k = data_left.min(b.len());
                        data_left -= k;
                        b = &b[k..];
                    } else {
                        let k = (C2H_HDR - hdr_have).min(b.len());
                        hdr[hdr_have..hdr_have + k].copy_from_slice(&b[..k]);
                        hdr_have += k;
                        b = &b[k..];
                        if hdr_have < C2H_HDR {
                            break;
                        }
                        hdr_have = 0;
                        assert!(
                            hdr[0] == PDU_C2H_DATA && hdr[1] & C2H_SUCCESS != 0,
                            "bad response {hdr:?}"
                        );
                        let plen = u32::from_le_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]) as usize;
                        cur_cid = u16::from_le_bytes([hdr[8], hdr[9]]);
                        assert!(usize::from(cur_cid) < qd && plen == C2H_HDR + size);
                        data_left = plen - C2H_HDR;
                    }
                    if data_left == 0 && hdr_have == 0 {
                        free.push(cur_cid);
                        done += 1;
                    }
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => panic!("host read: {e}"),
        }
        meter.poll_done(busy, calls);
        polls += 1;
        if polls % 64 == 0 {
            let el = start.elapsed();
            let p = phase.load(Ordering::Relaxed);
            if p == PHASE_WARMUP && el >= WARMUP {
                phase.store(PHASE_MEASURE, Ordering::Relaxed);
                done0 = done;
                t_measure = Instant::now();
            } else if p == PHASE_MEASURE && el >= measure_end {
                phase.store(PHASE_STOP, Ordering::Relaxed);
                let secs = t_measure.elapsed().as_secs_f64();
                meter.tick();
                return (meter.stats, done - done0, secs);
            }
        }
    }
    unreachable!("the host ends the run")
}

/// Engine A: one `read`, one `writev` per poll.
fn target_a(sock: TcpStream, qd: usize, size: usize, phase: Arc<AtomicU8>) -> ThreadStats {
    pin(1);
    let mut sock = sock;
    sock.set_nonblocking(true).expect("target nonblocking");
    let data = data_bufs(qd, size);
    let mut rbuf = vec![0u8; RECV_BUF];
    let mut have = 0;
    // The send queue: headers back to back in `hdrs`; each response is
    // (header offset, command id); `sent` bytes of the queue are out.
    let mut hdrs: Vec<u8> = Vec::with_capacity(qd * C2H_HDR);
    let mut resps: Vec<(usize, u16)> = Vec::with_capacity(qd);
    let mut head = 0; // first response not fully sent
    let mut head_off = 0; // bytes of it sent
    let mut meter = Meter::new(phase);
    while meter.tick() {
        let mut busy = false;
        let mut calls = 1;
        match sock.read(&mut rbuf[have..]) {
            Ok(0) => break,
            Ok(n) => {
                busy = true;
                have += n;
                let whole = have - have % CAPSULE;
                for c in rbuf[..whole].chunks_exact(CAPSULE) {
                    let (cid, len) = parse_capsule(c);
                    assert_eq!(len, size);
                    resps.push((hdrs.len(), cid));
                    hdrs.extend_from_slice(&c2h_header(cid, len));
                }
                rbuf.copy_within(whole..have, 0);
                have -= whole;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => {
                if meter.phase.load(Ordering::Relaxed) == PHASE_STOP {
                    break;
                }
                panic!("target read: {e}");
            }
        }
        if head < resps.len() {
            calls += 1;
            let res = {
                let mut iov = [IoSlice::new(&[]); MAX_IOV];
                let mut n = 0;
                for (i, &(off, cid)) in resps[head..].iter().enumerate() {
                    if n + 2 > iov.len() {
                        break;
                    }
                    let h = &hdrs[off..off + C2H_HDR];
                    let d = &data[usize::from(cid)][..];
                    let skip = if i == 0 { head_off } else { 0 };
                    if skip < C2H_HDR {
                        iov[n] = IoSlice::new(&h[skip..]);
                        iov[n + 1] = IoSlice::new(d);
                    } else {
                        iov[n] = IoSlice::new(&d[skip - C2H_HDR..]);
                        iov[n + 1] = IoSlice::new(&[]);
                    }
                    n += 2;
                }
                sock.write_vectored(&iov[..n])
            };
            match res {
                Ok(mut n) => {
                    busy = true;
                    while n > 0 {
                        let left = C2H_HDR + size - head_off;
                        if n >= left {
                            n -= left;
                            head += 1;
                            head_off = 0;
                        } else {
                            head_off += n;
                            n = 0;
                        }
                    }
                    if head == resps.len() {
                        resps.clear();
                        hdrs.clear();
                        head = 0;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => {
                    if meter.phase.load(Ordering::Relaxed) == PHASE_STOP {
                        break;
                    }
                    panic!("target writev: {e}");
                }
            }
        }
        meter.poll_done(busy, calls);
    }
    meter.tick();
    meter.stats
}

/// Engine B: the io_uring socket ring, one send and one submit per poll.
fn target_b(
    sock: TcpStream,
    qd: usize,
    size: usize,
    phase: Arc<AtomicU8>,
    taskrun: TaskRun,
) -> ThreadStats {
    pin(1);
    let data = data_bufs(qd, size);
    let mut ring: SockRing<Rc<[u8]>> = SockRing::new(SockRingConfig {
        entries: 64,
        bufs: 16,
        buf_size: 16 * 1024,
        taskrun,
    })
    .expect("io_uring socket ring (io_uring disabled?)");
    let id = ring.attach(sock.into()).expect("attach");
    let mut fill: SendList<Rc<[u8]>> = SendList::with_capacity(qd * C2H_HDR, 2 * qd);
    let mut spare = Some(SendList::with_capacity(qd * C2H_HDR, 2 * qd));
    let mut carry: Vec<u8> = Vec::with_capacity(CAPSULE);
    let mut meter = Meter::new(phase);
    let mut ended = false;
    let mut enters0 = 0;
    // The host closes its end as soon as it stops the run: read the phase
    // when the end shows up, not before the poll.
    let phase = meter.phase.clone();
    let stopping = || phase.load(Ordering::Relaxed) == PHASE_STOP;
    while meter.tick() && !ended {
        let queue = |c: &[u8], fill: &mut SendList<Rc<[u8]>>| {
            let (cid, len) = parse_capsule(c);
            assert_eq!(len, size);
            fill.push_bytes(&c2h_header(cid, len));
            fill.push_buf(data[usize::from(cid)].clone());
        };
        let events = ring.reap(256, |ev| match ev {
            SockEvent::Recv { data: mut b, .. } => {
                if !carry.is_empty() {
                    let k = (CAPSULE - carry.len()).min(b.len());
                    carry.extend_from_slice(&b[..k]);
                    b = &b[k..];
                    if carry.len() == CAPSULE {
                        queue(&carry, &mut fill);
                        carry.clear();
                    }
                }
                let mut it = b.chunks_exact(CAPSULE);
                for c in &mut it {
                    queue(c, &mut fill);
                }
                carry.extend_from_slice(it.remainder());
            }
            SockEvent::Sent {
                mut list, result, ..
            } => {
                if let Err(e) = result {
                    assert!(stopping(), "target send: {e}");
                    ended = true;
                }
                list.clear();
                spare = Some(list);
            }
            SockEvent::RecvEnd { error, .. } => {
                assert!(stopping(), "target receive ended: {error:?}");
                ended = true;
            }
            SockEvent::Closed { .. } => ended = true,
        });
        if !fill.is_empty() && !ring.is_sending(id) {
            let next = spare.take().unwrap_or_default();
            let list = std::mem::replace(&mut fill, next);
            ring.send(id, list).expect("target send");
        }
        let submitted = ring.submit().expect("io_uring_enter");
        let enters = ring.stats().enters;
        meter.poll_done(
            events > 0 || submitted > 0 || enters > enters0,
            enters - enters0,
        );
        enters0 = enters;
    }
    meter.tick();
    meter.stats
}

/// One measured run of one cell (times in ns per I/O).
#[derive(Debug, Clone, Copy)]
struct Sample {
    iops: f64,
    t_user: f64,
    t_sys: f64,
    /// Target CPU time in polls that moved bytes.
    t_busy: f64,
    /// Share of the target's CPU time spent in polls that moved nothing.
    t_idle: f64,
    /// Target system calls (engine only, clock reads left out).
    t_calls: f64,
    /// I/Os per target poll that moved bytes.
    t_batch: f64,
    h_user: f64,
    h_sys: f64,
    h_busy: f64,
}

impl Sample {
    fn t_cpu(&self) -> f64 {
        self.t_user + self.t_sys
    }
    fn h_cpu(&self) -> f64 {
        self.h_user + self.h_sys
    }
}

fn run_cell(engine: Engine, size: usize, a: &Args) -> Sample {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("local addr");
    let phase = Arc::new(AtomicU8::new(PHASE_WARMUP));
    let p = phase.clone();
    let qd = a.qd;
    let target = std::thread::spawn(move || {
        let (s, _) = l.accept().expect("accept");
        s.set_nodelay(true).expect("nodelay");
        match engine {
            Engine::A => target_a(s, qd, size, p),
            Engine::B(tr) => target_b(s, qd, size, p, tr),
        }
    });
    let c = TcpStream::connect(addr).expect("connect");
    c.set_nodelay(true).expect("nodelay");
    let secs = a.secs;
    let h = std::thread::spawn(move || host(c, qd, size, secs, phase));
    let (hs, ios, secs) = h.join().expect("host thread");
    let ts = target.join().expect("target thread");
    let n = ios.max(1) as f64;
    Sample {
        iops: ios as f64 / secs,
        t_user: ts.user_ns as f64 / n,
        t_sys: ts.sys_ns as f64 / n,
        t_busy: (ts.busy_ns as f64 - ts.busy_polls as f64 * ts.clock_ns) / n,
        t_batch: ios as f64 / ts.busy_polls.max(1) as f64,
        t_idle: ts.idle_ns as f64 / (ts.busy_ns + ts.idle_ns).max(1) as f64,
        t_calls: ts.syscalls as f64 / n,
        h_user: hs.user_ns as f64 / n,
        h_sys: hs.sys_ns as f64 / n,
        h_busy: (hs.busy_ns as f64 - hs.busy_polls as f64 * hs.clock_ns) / n,
    }
}

/// CPU time of one poll of one idle connection (nothing arrives, nothing
/// to send), in ns: what each mostly idle connection adds to every poll.
fn idle_poll_cost(engine: Engine) -> f64 {
    const POLLS: u64 = 100_000;
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let c = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
    let (s, _) = l.accept().expect("accept");
    let ns = match engine {
        Engine::A => {
            s.set_nonblocking(true).expect("nonblocking");
            let mut buf = vec![0u8; RECV_BUF];
            let t0 = thread_clock();
            for _ in 0..POLLS {
                match (&s).read(&mut buf) {
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    other => panic!("idle read: {other:?}"),
                }
            }
            thread_clock() - t0
        }
        Engine::B(taskrun) => {
            let mut ring: SockRing<Rc<[u8]>> = SockRing::new(SockRingConfig {
                entries: 64,
                bufs: 16,
                buf_size: 16 * 1024,
                taskrun,
            })
            .expect("io_uring socket ring");
            ring.attach(s.into()).expect("attach");
            ring.submit().expect("submit");
            let mut events = 0;
            let t0 = thread_clock();
            for _ in 0..POLLS {
                events += ring.reap(256, |_| {});
                ring.submit().expect("submit");
            }
            let ns = thread_clock() - t0;
            assert_eq!(events, 0, "idle connection had events");
            ns
        }
    };
    drop(c);
    ns as f64 / POLLS as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn med(s: &[Sample], f: impl Fn(&Sample) -> f64) -> f64 {
    median(s.iter().map(f).collect())
}

fn main() {
    let a = parse_args();
    if affinity::get_core_num() < 2 {
        eprintln!("skipped: needs 2 cores");
        return;
    }
    println!(
        "sock_engine: qd {}, {} x {:.1} s per cell (interleaved), sizes {:?}, engines {:?}",
        a.qd,
        a.reps,
        a.secs,
        a.sizes,
        a.engines.iter().map(|e| e.name()).collect::<Vec<_>>()
    );
    pin(1);
    for &e in &a.engines {
        let ns: Vec<f64> = (0..5).map(|_| idle_poll_cost(e)).collect();
        println!(
            "idle connection, one poll: {:>13} {:>6.1} ns CPU (median of 5)",
            e.name(),
            median(ns)
        );
    }
    let cells: Vec<(usize, Engine)> = a
        .sizes
        .iter()
        .flat_map(|&s| a.engines.iter().map(move |&e| (s, e)))
        .collect();
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); cells.len()];
    for rep in 0..a.reps {
        for (i, &(size, engine)) in cells.iter().enumerate() {
            let s = run_cell(engine, size, &a);
            println!(
                "rep {rep} {:>13} {:>5} B: {:>7.0} IOPS; target {:>5.0}+{:>5.0} ns/IO user+sys, busy {:>5.0} ns/IO, idle {:>4.1}% of CPU, {:.3} syscalls/IO; host {:>5.0}+{:>5.0} ns/IO, busy {:>5.0}",
                engine.name(),
                size,
                s.iops,
                s.t_user,
                s.t_sys,
                s.t_busy,
                s.t_idle * 100.0,
                s.t_calls,
                s.h_user,
                s.h_sys,
                s.h_busy,
            );
            samples[i].push(s);
        }
    }
    println!();
    println!(
        "medians of {} runs; ns per I/O; CPU = user + sys of the whole thread; busy = CPU of the polls that moved bytes:",
        a.reps
    );
    println!(
        "| engine | size | IOPS | target user | target sys | target CPU | target busy | target idle CPU | target syscalls/IO | I/Os per busy target poll | host user | host sys | host CPU | host busy |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (i, &(size, engine)) in cells.iter().enumerate() {
        let s = &samples[i];
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.1} % | {:.3} | {:.1} | {:.0} | {:.0} | {:.0} | {:.0} |",
            engine.name(),
            size,
            med(s, |x| x.iops),
            med(s, |x| x.t_user),
            med(s, |x| x.t_sys),
            med(s, Sample::t_cpu),
            med(s, |x| x.t_busy),
            med(s, |x| x.t_idle) * 100.0,
            med(s, |x| x.t_calls),
            med(s, |x| x.t_batch),
            med(s, |x| x.h_user),
            med(s, |x| x.h_sys),
            med(s, Sample::h_cpu),
            med(s, |x| x.h_busy),
        );
    }
    println!();
    for &size in &a.sizes {
        let Some(ia) = cells.iter().position(|&c| c == (size, Engine::A)) else {
            continue;
        };
        for (i, &(s2, e)) in cells.iter().enumerate() {
            if s2 != size || e == Engine::A {
                continue;
            }
            let r = |f: &dyn Fn(&Sample) -> f64| med(&samples[i], f) / med(&samples[ia], f);
            println!(
                "{size:>5} B {}/A: IOPS x{:.3}; target busy/IO x{:.3}, CPU/IO x{:.3} (user x{:.3}, sys x{:.3}); host busy/IO x{:.3}, CPU/IO x{:.3}",
                e.name(),
                r(&|x| x.iops),
                r(&|x| x.t_busy),
                r(&Sample::t_cpu),
                r(&|x| x.t_user),
                r(&|x| x.t_sys),
                r(&|x| x.h_busy),
                r(&Sample::h_cpu),
            );
            // Each B run next to the A run of the same round: drift and
            // load changes between rounds cancel.
            let paired = |f: &dyn Fn(&Sample) -> f64| {
                let v: Vec<f64> = samples[i]
                    .iter()
                    .zip(&samples[ia])
                    .map(|(b, a)| f(b) / f(a))
                    .collect();
                let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = v.iter().copied().fold(0.0, f64::max);
                format!("x{:.3} [{lo:.3}..{hi:.3}]", median(v))
            };
            println!(
                "{size:>5} B {}/A paired by round, median [min..max]: IOPS {}; target busy/IO {}, CPU/IO {}, sys/IO {}; host CPU/IO {}",
                e.name(),
                paired(&|x| x.iops),
                paired(&|x| x.t_busy),
                paired(&Sample::t_cpu),
                paired(&|x| x.t_sys),
                paired(&Sample::h_cpu),
            );
        }
    }
    println!();
    for (i, &(size, engine)) in cells.iter().enumerate() {
        let s = &samples[i];
        println!(
            "sock_engine_result {{\"engine\":\"{}\",\"size\":{},\"qd\":{},\"reps\":{},\"secs\":{},\"iops\":{:.0},\"target_user_ns\":{:.1},\"target_sys_ns\":{:.1},\"target_busy_ns\":{:.1},\"target_idle_cpu\":{:.4},\"target_syscalls_per_io\":{:.4},\"host_user_ns\":{:.1},\"host_sys_ns\":{:.1},\"host_busy_ns\":{:.1}}}",
            engine.name(),
            size,
            a.qd,
            a.reps,
            a.secs,
            med(s, |x| x.iops),
            med(s, |x| x.t_user),
            med(s, |x| x.t_sys),
            med(s, |x| x.t_busy),
            med(s, |x| x.t_idle),
            med(s, |x| x.t_calls),
            med(s, |x| x.h_user),
            med(s, |x| x.h_sys),
            med(s, |x| x.h_busy),
        );
    }
}
