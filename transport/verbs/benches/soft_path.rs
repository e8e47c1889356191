//! Per-message cost of the software provider's SEND path, in one thread
//! (both QPs of a loopback connection driven alternately), so that an
//! instruction counter sees exactly the provider's work and no spinning:
//!
//! ```text
//! cargo bench -p pollux-verbs --bench soft_path -- [lat|bw] [N]
//! valgrind --tool=callgrind target/release/deps/soft_path-* bw 200000
//! ```
//!
//! - `lat`: SEND ping-pong (the send-lat pattern of `pollux-verbs-perf`):
//!   a posts one SEND, b polls its receive CQ, reposts the receive and
//!   answers, a polls; every 32nd SEND is signaled.
//! - `bw`: batches of 32 SENDs (the last signaled), b drains and reposts,
//!   a reaps its send completions.
//!
//! - `idle`: nothing in flight; one poll of each CQ of a connected QP
//!   (what a poller that finds nothing pays).
//! - `recv2`: `bw` into two-SGE receives whose SGEs are in two MRs (the
//!   NVMe-oF target's capsule + in-capsule data receives).
//!
//! Per-message instruction cost = difference of two runs' totals divided by
//! the difference of their message counts (setup cancels out).
//!
//! `lat2` and `bw2` run the same patterns between two threads pinned to
//! two cores (`--cores 0,1`), each side with its own device and endpoint,
//! connected through the CM: the cross-core behaviour of
//! `pollux-verbs-perf --spawn` without the app crate (threads instead of
//! processes: the same shared-memory traffic).

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use pollux_verbs::conformance::{spin, Endpoint, Fixture, Pair, SoftFixture};
use pollux_verbs::{
    Access, CmAddr, CmEvent, CmId, CmListener, CompletionQueue, ConnParam, Device, MemoryRegion,
    ProtectionDomain, QpAttr, QpCaps, QpState, QueuePair, RecvWr, SendOp, SendWr, Sge, Wc,
    WcStatus, WrId,
};

type F = SoftFixture;
const F: SoftFixture = SoftFixture::new("pollux-softpath");

const SIZE: u32 = 64;
const BATCH: usize = 32;

fn poll(cq: &impl CompletionQueue, buf: &mut [Wc]) -> usize {
    let n = cq.poll(buf).unwrap();
    for w in &buf[..n] {
        assert_eq!(w.status, WcStatus::Success, "{w:?}");
    }
    n
}

fn lat(p: &Pair<F>, iters: u64) {
    let (a, b) = (&p.a, &p.b);
    let (ar, asrc) = ([a.sge(0, SIZE)], [a.sge(4096, SIZE)]);
    let (br, bsrc) = ([b.sge(0, SIZE)], [b.sge(4096, SIZE)]);
    let ra = [RecvWr {
        wr_id: WrId(0),
        sg_list: &ar,
    }; 16];
    let rb = [RecvWr {
        wr_id: WrId(0),
        sg_list: &br,
    }; 16];
    a.qp.post_recv(&ra).unwrap();
    b.qp.post_recv(&rb).unwrap();
    let mut buf = [Wc::default(); 16];
    for i in 0..iters {
        let mut wr = SendWr::new(WrId(i), SendOp::Send, &asrc);
        if i % 32 == 31 {
            wr = wr.signaled();
        }
        a.qp.post_send(&[wr]).unwrap();
        while poll(&b.rcq, &mut buf[..1]) == 0 {}
        b.qp.post_recv(&rb[..1]).unwrap();
        let mut wr = SendWr::new(WrId(i), SendOp::Send, &bsrc);
        if i % 32 == 31 {
            wr = wr.signaled();
        }
        b.qp.post_send(&[wr]).unwrap();
        poll(&b.scq, &mut buf);
        loop {
            if poll(&a.rcq, &mut buf[..1]) == 1 {
                break;
            }
            poll(&a.scq, &mut buf[1..]);
        }
        a.qp.post_recv(&ra[..1]).unwrap();
        poll(&a.scq, &mut buf);
    }
}

fn bw(p: &Pair<F>, iters: u64) {
    let (a, b) = (&p.a, &p.b);
    let asrc = [a.sge(4096, SIZE)];
    let br = [b.sge(0, SIZE)];
    let rb = [RecvWr {
        wr_id: WrId(0),
        sg_list: &br,
    }; 256];
    send_batches(p, &asrc, &rb, iters);
}

/// Batches of `BATCH` SENDs of `asrc` from `a` to `b` (the last of each
/// signaled), `b` re-posting each receive `rb` it consumes, until `iters`
/// SENDs went through.
fn send_batches(p: &Pair<F>, asrc: &[Sge], rb: &[RecvWr<'_>; 256], iters: u64) {
    let (a, b) = (&p.a, &p.b);
    b.qp.post_recv(rb).unwrap();
    let mut buf = [Wc::default(); 256];
    let mut wrs = [SendWr::new(WrId(0), SendOp::Send, asrc); BATCH];
    let mut sent = 0u64;
    while sent < iters {
        for (k, wr) in wrs.iter_mut().enumerate() {
            *wr = SendWr::new(WrId(sent + k as u64), SendOp::Send, asrc);
        }
        wrs[BATCH - 1] = wrs[BATCH - 1].signaled();
        a.qp.post_send(&wrs).unwrap();
        sent += BATCH as u64;
        let mut got = 0;
        while got < BATCH {
            let n = poll(&b.rcq, &mut buf);
            if n > 0 {
                b.qp.post_recv(&rb[..n]).unwrap();
            }
            got += n;
        }
        while poll(&a.scq, &mut buf) == 0 {}
    }
}

/// `idle`: `iters` rounds of one poll of each CQ, nothing in flight.
fn idle(p: &Pair<F>, iters: u64) {
    let mut buf = [Wc::default(); 16];
    for _ in 0..iters {
        assert_eq!(poll(&p.b.rcq, &mut buf), 0);
        assert_eq!(poll(&p.b.scq, &mut buf), 0);
    }
}

/// `recv2`: batches of 32 SENDs of 64 B into receives of two SGEs (32 B
/// each) in two MRs of the receiver.
fn recv2(p: &Pair<F>, iters: u64) {
    let (a, b) = (&p.a, &p.b);
    let arena2 = F.arena(1 << 16);
    let mr2 =
        b.pd.reg_mr(&arena2, 0, 1 << 16, Access::LOCAL_WRITE)
            .unwrap();
    let asrc = [a.sge(4096, SIZE)];
    let br = [
        b.sge(0, SIZE / 2),
        Sge {
            addr: mr2.addr(),
            length: SIZE / 2,
            lkey: mr2.lkey(),
        },
    ];
    let rb = [RecvWr {
        wr_id: WrId(0),
        sg_list: &br,
    }; 256];
    send_batches(p, &asrc, &rb, iters);
}

fn pin(core: usize) {
    let _ = affinity::set_thread_affinity([core]);
}

/// The server thread of `lat2`/`bw2`: answer every SEND (`lat`) or count
/// and repost receives (`bw`), then stay connected until `done`.
fn serve(lat: bool, iters: u64, caps: QpCaps, addr: CmAddr, up: &AtomicBool, done: &AtomicBool) {
    let e = Endpoint::<F>::new(&F, caps, 1 << 16, 8192);
    // RDMA CM puts QPs in INIT before connecting: receives can be posted.
    e.qp.modify(&QpAttr::to(QpState::Init)).unwrap();
    let r = [e.sge(0, SIZE)];
    let src = [e.sge(4096, SIZE)];
    let rw = [RecvWr {
        wr_id: WrId(0),
        sg_list: &r,
    }; 256];
    for _ in 0..4 {
        e.qp.post_recv(&rw).unwrap();
    }
    let l = e.dev.listen(&addr, 4).unwrap();
    up.store(true, Ordering::Release);
    let id = spin(|| l.get_request().unwrap()).expect("connect request");
    id.accept(&e.qp, &ConnParam::with_data(b"ok")).unwrap();
    let ev = spin(|| id.get_event().unwrap()).expect("established");
    assert!(matches!(ev, CmEvent::Established { .. }), "{ev:?}");
    let mut buf = [Wc::default(); 256];
    let mut got = 0u64;
    while got < iters {
        let n = poll(&e.rcq, &mut buf);
        if n > 0 {
            e.qp.post_recv(&rw[..n]).unwrap();
        }
        if lat {
            for _ in 0..n {
                let mut wr = SendWr::new(WrId(got), SendOp::Send, &src);
                if got % 32 == 31 {
                    wr = wr.signaled();
                }
                e.qp.post_send(&[wr]).unwrap();
                got += 1;
            }
            poll(&e.scq, &mut buf);
        } else {
            got += n as u64;
        }
    }
    while !done.load(Ordering::Acquire) {
        poll(&e.scq, &mut buf);
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
}

/// `lat2`/`bw2`: client on `cores.0`, server thread on `cores.1`.
fn two_cores(lat: bool, iters: u64, caps: QpCaps, cores: (usize, usize)) {
    let addr = F.listen_addr();
    let up = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let server = {
        let (addr, up, done) = (addr.clone(), up.clone(), done.clone());
        std::thread::spawn(move || {
            pin(cores.1);
            serve(lat, iters, caps, addr, &up, &done);
        })
    };
    pin(cores.0);
    let e = Endpoint::<F>::new(&F, caps, 1 << 16, 8192);
    // RDMA CM puts QPs in INIT before connecting: receives can be posted.
    e.qp.modify(&QpAttr::to(QpState::Init)).unwrap();
    let r = [e.sge(0, SIZE)];
    let src = [e.sge(4096, SIZE)];
    let rw = [RecvWr {
        wr_id: WrId(0),
        sg_list: &r,
    }; 16];
    e.qp.post_recv(&rw).unwrap();
    while !up.load(Ordering::Acquire) {
        std::hint::spin_loop();
    }
    let id = e
        .dev
        .connect(&addr, &e.qp, &ConnParam::with_data(b"hi"))
        .unwrap();
    let ev = spin(|| id.get_event().unwrap()).expect("established");
    assert!(matches!(ev, CmEvent::Established { .. }), "{ev:?}");
    let mut buf = [Wc::default(); 64];
    let t0 = Instant::now();
    if lat {
        let mut ns = Vec::with_capacity(iters as usize);
        for i in 0..iters {
            let t = Instant::now();
            let mut wr = SendWr::new(WrId(i), SendOp::Send, &src);
            if i % 32 == 31 {
                wr = wr.signaled();
            }
            e.qp.post_send(&[wr]).unwrap();
            loop {
                if poll(&e.rcq, &mut buf[..1]) == 1 {
                    break;
                }
                poll(&e.scq, &mut buf[1..]);
            }
            ns.push(t.elapsed().as_nanos() as u64);
            e.qp.post_recv(&rw[..1]).unwrap();
            poll(&e.scq, &mut buf);
        }
        ns.sort_unstable();
        let q = |f: f64| ns[((ns.len() - 1) as f64 * f) as usize] as f64 / 1000.0;
        println!(
            "soft_path lat2 (cores {cores:?}): {iters} round trips, p50 {:.3} us, p99 {:.3} us",
            q(0.5),
            q(0.99)
        );
    } else {
        let depth = u64::from(caps.max_send_wr);
        let mut wrs = [SendWr::new(WrId(0), SendOp::Send, &src); BATCH];
        let (mut posted, mut completed) = (0u64, 0u64);
        while completed < iters {
            if posted < iters && depth - (posted - completed) >= BATCH as u64 {
                for (k, wr) in wrs.iter_mut().enumerate() {
                    *wr = SendWr::new(WrId(posted + k as u64 + 1), SendOp::Send, &src);
                }
                wrs[BATCH - 1] = wrs[BATCH - 1].signaled();
                e.qp.post_send(&wrs).unwrap();
                posted += BATCH as u64;
            }
            let n = poll(&e.scq, &mut buf);
            for w in &buf[..n] {
                completed = completed.max(w.wr_id.0);
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        println!(
            "soft_path bw2 (cores {cores:?}): {iters} SENDs of {SIZE} B, batch {BATCH}, \
             depth {depth}: {:.2} M/s",
            iters as f64 / secs / 1e6
        );
    }
    done.store(true, Ordering::Release);
    let _ = id.disconnect();
    server.join().unwrap();
}

fn main() {
    let mut args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let mut cores = (0, 1);
    if let Some(i) = args.iter().position(|a| a == "--cores") {
        let v: Vec<usize> = args
            .get(i + 1)
            .map(|s| s.split(',').filter_map(|c| c.parse().ok()).collect())
            .unwrap_or_default();
        if let [a, b] = v[..] {
            cores = (a, b);
        }
        args.drain(i..(i + 2).min(args.len()));
    }
    let mode = args.first().map_or("bw", String::as_str).to_owned();
    let iters: u64 = args
        .get(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let caps = QpCaps {
        max_send_wr: 1024,
        max_recv_wr: 1024,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    match mode.as_str() {
        "lat2" => return two_cores(true, iters, caps, cores),
        "bw2" => return two_cores(false, iters.next_multiple_of(BATCH as u64), caps, cores),
        _ => {}
    }
    let caps = if mode == "recv2" {
        QpCaps {
            max_recv_sge: 2,
            ..caps
        }
    } else {
        caps
    };
    let p = Pair::connect_with(&F, caps, 1 << 16, 8192, 7);
    let t0 = Instant::now();
    match mode.as_str() {
        "lat" => lat(&p, iters),
        "idle" => idle(&p, iters),
        "recv2" => recv2(&p, iters.next_multiple_of(BATCH as u64)),
        _ => bw(&p, iters),
    }
    let ns = t0.elapsed().as_nanos() as f64 / iters as f64;
    println!("soft_path {mode}: {iters} messages, {ns:.1} ns/message (one thread, both sides)");
}
