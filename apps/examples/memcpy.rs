//! Baseline for the malloc bdev: one core copying 4 KiB blocks from a 4 KiB
//! source into random 4 KiB-aligned blocks of a 1 GiB region (what a malloc
//! randwrite does per I/O), for `SECONDS` (default 3). Prints copies/s and GB/s.
//!
//! `cargo run --release -p pollux-apps --example memcpy [SECONDS]`

use std::hint::black_box;
use std::time::{Duration, Instant};

fn main() {
    const REGION: usize = 1 << 30;
    const BLOCK: usize = 4096;
    let secs: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let mut region = vec![0u8; REGION];
    let src = vec![0xA5u8; BLOCK];
    // Touch every page first so page faults are not measured.
    for b in region.chunks_mut(4096) {
        b[0] = 1;
    }
    let blocks = (REGION / BLOCK) as u64;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut n: u64 = 0;
    let end = Instant::now() + Duration::from_secs(secs);
    let t0 = Instant::now();
    while Instant::now() < end {
        for _ in 0..4096 {
            // xorshift64: a random block, like bdevperf's randwrite.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let off = (x % blocks) as usize * BLOCK;
            region[off..off + BLOCK].copy_from_slice(black_box(&src));
            n += 1;
        }
    }
    let dt = t0.elapsed().as_secs_f64();
    black_box(&region);
    println!(
        "memcpy 4KiB random blocks over 1 GiB: {:.0} copies/s, {:.2} GB/s",
        n as f64 / dt,
        n as f64 * BLOCK as f64 / dt / 1e9
    );
}
