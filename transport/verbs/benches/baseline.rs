//! Bare baselines for `pollux-verbs-perf` (software provider), measured on
//! the same machine and cores: a shared-memory ping-pong between two pinned
//! threads (one cache line each way), a bare SPSC ring moving 64-byte
//! messages in batches, and single-core `memcpy` of one message size.
//!
//! ```text
//! cargo bench -p pollux-verbs --bench baseline -- [--cores 0,1] [--size 4096]
//! ```
//!
//! The verbs figures in `docs/benchmarks.md` are reported as ratios against
//! these numbers.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

#[repr(align(128))]
struct Line(AtomicU64);

fn pin(core: usize) {
    let _ = affinity::set_thread_affinity([core]);
}

/// Round-trip time of a one-cache-line ping-pong between two cores, in ns.
fn ping_pong(c0: usize, c1: usize, iters: u64) -> f64 {
    let lines = Arc::new((Line(AtomicU64::new(0)), Line(AtomicU64::new(0))));
    let l2 = lines.clone();
    let t = std::thread::spawn(move || {
        pin(c1);
        for i in 1..=iters {
            while l2.0 .0.load(Ordering::Acquire) != i {
                std::hint::spin_loop();
            }
            l2.1 .0.store(i, Ordering::Release);
        }
    });
    pin(c0);
    let t0 = Instant::now();
    for i in 1..=iters {
        lines.0 .0.store(i, Ordering::Release);
        while lines.1 .0.load(Ordering::Acquire) != i {
            std::hint::spin_loop();
        }
    }
    let ns = t0.elapsed().as_nanos() as f64 / iters as f64;
    t.join().unwrap();
    ns
}

/// One direction's message area: three 128-byte line pairs.
#[repr(align(128))]
struct Area([AtomicU64; 48]);

impl Area {
    fn new() -> Area {
        Area(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

/// How a message is laid out and read in a [`pp_lines`] variant.
#[derive(Clone, Copy)]
struct Layout {
    name: &'static str,
    /// Word index of the stamp the reader waits on.
    flag: usize,
    /// Word indices of the data written before the stamp.
    data: &'static [usize],
    /// Word indices the reader also loads in every empty poll (to pull
    /// their lines in parallel with the stamp's).
    touch: &'static [usize],
    /// Every listed word is its own line's stamp: the reader waits for all
    /// of them (per-line stamps, no ordering between the lines).
    per_line: bool,
    /// The writer demotes the written lines to the shared cache (`cldemote`).
    demote: bool,
}

/// The layouts compared by `--lines`: a 64 B SEND is a 16-byte header
/// plus 64 bytes, so it spans two lines.
const LAYOUTS: &[Layout] = &[
    Layout {
        name: "1 line",
        flag: 0,
        data: &[1, 2, 3, 4, 5, 6, 7],
        touch: &[],
        per_line: false,
        demote: false,
    },
    Layout {
        name: "1 line, cldemote",
        flag: 0,
        data: &[1, 2, 3, 4, 5, 6, 7],
        touch: &[],
        per_line: false,
        demote: true,
    },
    Layout {
        name: "2 lines, one pair, stamp then data",
        flag: 0,
        data: &[1, 7, 8, 9],
        touch: &[],
        per_line: false,
        demote: false,
    },
    Layout {
        name: "2 lines, two pairs, stamp then data",
        flag: 8,
        data: &[9, 15, 16, 17],
        touch: &[],
        per_line: false,
        demote: false,
    },
    Layout {
        name: "2 lines, one pair, reader touches line 2",
        flag: 0,
        data: &[1, 7, 8, 9],
        touch: &[8],
        per_line: false,
        demote: false,
    },
    Layout {
        name: "2 lines, per-line stamps",
        flag: 0,
        data: &[0, 8],
        touch: &[],
        per_line: true,
        demote: false,
    },
    Layout {
        name: "2 lines, one pair, line 2 written first",
        flag: 0,
        data: &[8, 9, 1, 7],
        touch: &[],
        per_line: false,
        demote: false,
    },
    Layout {
        name: "2 lines, one pair, stamp in line 2",
        flag: 15,
        data: &[1, 7, 8, 9],
        touch: &[],
        per_line: false,
        demote: false,
    },
    Layout {
        name: "2 lines, one pair, stamp in line 2, reader touches line 1",
        flag: 15,
        data: &[1, 7, 8, 9],
        touch: &[0],
        per_line: false,
        demote: false,
    },
    Layout {
        name: "2 lines, one pair, line 2 first, reader touches line 2",
        flag: 0,
        data: &[8, 9, 1, 7],
        touch: &[8],
        per_line: false,
        demote: false,
    },
    Layout {
        name: "2 lines, one pair, cldemote",
        flag: 0,
        data: &[1, 7, 8, 9],
        touch: &[],
        per_line: false,
        demote: true,
    },
    Layout {
        name: "2 lines, per-line stamps, cldemote",
        flag: 0,
        data: &[0, 8],
        touch: &[],
        per_line: true,
        demote: true,
    },
];

fn demote(p: *const AtomicU64) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `cldemote` is a cache hint on a valid address (a NOP where
    // unsupported); it changes no architectural state.
    unsafe {
        std::arch::asm!("cldemote [{0}]", in(reg) p, options(nostack, preserves_flags));
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

fn lines_send(a: &Area, l: &Layout, seq: u64) {
    if l.per_line {
        for &w in l.data {
            a.0[w].store(seq, Ordering::Release);
        }
    } else {
        for &w in l.data {
            a.0[w].store(seq, Ordering::Relaxed);
        }
        a.0[l.flag].store(seq, Ordering::Release);
    }
    if l.demote {
        demote(&a.0[l.flag]);
        for &w in l.data {
            demote(&a.0[w]);
        }
    }
}

fn lines_wait(a: &Area, l: &Layout, seq: u64) -> u64 {
    if l.per_line {
        loop {
            let mut all = true;
            for &w in l.data {
                all &= a.0[w].load(Ordering::Acquire) == seq;
            }
            if all {
                return seq;
            }
            std::hint::spin_loop();
        }
    }
    loop {
        let f = a.0[l.flag].load(Ordering::Acquire);
        if f == seq {
            break;
        }
        for &w in l.touch {
            std::hint::black_box(a.0[w].load(Ordering::Relaxed));
        }
        std::hint::spin_loop();
    }
    l.data
        .iter()
        .fold(0, |s, &w| s.wrapping_add(a.0[w].load(Ordering::Relaxed)))
}

/// Round trip (ns) of a ping-pong whose messages use layout `l`: the best
/// and the median of `batches` batch means of `per` round trips each (on a
/// shared machine a preempted batch lands in the tail; the best batch is
/// the figure to compare layouts by).
fn pp_lines(c0: usize, c1: usize, l: Layout, batches: usize, per: u64) -> (f64, f64) {
    let areas = Arc::new((Area::new(), Area::new()));
    let a2 = areas.clone();
    let total = batches as u64 * per;
    let t = std::thread::spawn(move || {
        pin(c1);
        let mut sum = 0u64;
        for i in 1..=total {
            sum = sum.wrapping_add(lines_wait(&a2.0, &l, i));
            lines_send(&a2.1, &l, i);
        }
        sum
    });
    pin(c0);
    let mut means = Vec::with_capacity(batches);
    let mut seq = 0u64;
    let mut sum = 0u64;
    for _ in 0..batches {
        let t0 = Instant::now();
        for _ in 0..per {
            seq += 1;
            lines_send(&areas.0, &l, seq);
            sum = sum.wrapping_add(lines_wait(&areas.1, &l, seq));
        }
        means.push(t0.elapsed().as_nanos() as f64 / per as f64);
    }
    std::hint::black_box(sum.wrapping_add(t.join().unwrap()));
    means.sort_by(f64::total_cmp);
    (means[0], means[means.len() / 2])
}

const SLOTS: usize = 4096;

/// A bare SPSC ring of 64-byte slots (tail/head on their own lines),
/// producer publishes every `batch` messages. Returns messages per second.
fn spsc(c0: usize, c1: usize, msgs: u64, batch: u64) -> f64 {
    struct Ring {
        tail: Line,
        head: Line,
        data: Box<[[AtomicU64; 8]]>,
    }
    let ring = Arc::new(Ring {
        tail: Line(AtomicU64::new(0)),
        head: Line(AtomicU64::new(0)),
        data: (0..SLOTS)
            .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
            .collect(),
    });
    let r2 = ring.clone();
    let consumer = std::thread::spawn(move || {
        pin(c1);
        let mut head = 0u64;
        let mut sum = 0u64;
        while head < msgs {
            let tail = r2.tail.0.load(Ordering::Acquire);
            while head < tail {
                let slot = &r2.data[(head as usize) % SLOTS];
                let mut m = [0u64; 8];
                for (d, s) in m.iter_mut().zip(slot) {
                    *d = s.load(Ordering::Relaxed);
                }
                sum = sum.wrapping_add(m[0]);
                head += 1;
            }
            r2.head.0.store(head, Ordering::Release);
        }
        sum
    });
    pin(c0);
    let t0 = Instant::now();
    let mut tail = 0u64;
    let mut head_cache = 0u64;
    while tail < msgs {
        let n = batch.min(msgs - tail);
        while tail + n - head_cache > SLOTS as u64 {
            head_cache = ring.head.0.load(Ordering::Acquire);
        }
        for i in tail..tail + n {
            let slot = &ring.data[(i as usize) % SLOTS];
            for w in slot {
                w.store(i, Ordering::Relaxed);
            }
        }
        tail += n;
        ring.tail.0.store(tail, Ordering::Release);
    }
    let sum = consumer.join().unwrap();
    let secs = t0.elapsed().as_secs_f64();
    std::hint::black_box(sum);
    msgs as f64 / secs
}

/// Single-core memcpy bandwidth of `size`-byte copies between two
/// cache-warm buffers (as the WRITE benchmark reuses one buffer), bytes/s.
fn memcpy_bw(core: usize, size: usize, total: usize) -> f64 {
    pin(core);
    let src = vec![0xa5u8; size];
    let mut dst = vec![0u8; size];
    let iters = (total / size).max(1);
    let t0 = Instant::now();
    for _ in 0..iters {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
    }
    (iters * size) as f64 / t0.elapsed().as_secs_f64()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let cores: Vec<usize> = arg("--cores")
        .unwrap_or_else(|| "0,1".into())
        .split(',')
        .filter_map(|s| s.parse().ok())
        .collect();
    let (c0, c1) = (
        cores.first().copied().unwrap_or(0),
        cores.get(1).copied().unwrap_or(1),
    );
    let size: usize = arg("--size").and_then(|s| s.parse().ok()).unwrap_or(4096);
    if args.iter().any(|a| a == "--lines") {
        for l in LAYOUTS {
            let (best, p50) = pp_lines(c0, c1, *l, 200, 2000);
            println!(
                "lines ping-pong (cores {c0},{c1}) {}: round trip best batch {:.3} us, median batch {:.3} us",
                l.name,
                best / 1000.0,
                p50 / 1000.0
            );
        }
        return;
    }
    let rtt = ping_pong(c0, c1, 2_000_000);
    println!(
        "baseline ping-pong (cores {c0},{c1}): round trip {:.3} us",
        rtt / 1000.0
    );
    for batch in [1u64, 32] {
        let rate = spsc(c0, c1, 50_000_000, batch);
        println!(
            "baseline spsc 64 B (cores {c0}->{c1}, batch {batch}): {:.1} M msgs/s",
            rate / 1e6
        );
    }
    for s in [64, size] {
        let bw = memcpy_bw(c0, s, 8 << 30);
        println!("baseline memcpy {s} B (core {c0}): {:.2} GB/s", bw / 1e9);
    }
}
