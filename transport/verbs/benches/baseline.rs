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
