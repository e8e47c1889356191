//! Baseline for the malloc bdev: one core copying 4 KiB blocks from a 4 KiB
//! source into random 4 KiB-aligned blocks of a 1 GiB region (what a malloc
//! randwrite does per I/O), for `SECONDS` (default 3) each way:
//!
//! 1. `memcpy` (`copy_from_slice`) into an ordinary heap region (pages
//!    touched first), the plain loop;
//! 2. `DmaArena::copy_in` into a 1 GiB arena (2 MiB hugepages when reserved):
//!    non-temporal stores on x86-64 and a fence after each copy;
//! 3. the same copies with one fence per 128 (`copy_in_unfenced`, then
//!    `streaming_fence`): exactly the malloc bdev's copy, which fences once
//!    per poll (a poll completes up to the queue depth, 128 in the
//!    benchmarks).
//!
//! Prints copies/s and GB/s for each.
//!
//! `cargo run --release -p pollux-apps --example memcpy [SECONDS]`

use std::hint::black_box;
use std::time::{Duration, Instant};

use pollux_reactor::mem::{streaming_fence, ArenaOptions, DmaArena, HugepageMode};

const REGION: usize = 1 << 30;
const BLOCK: usize = 4096;

/// Runs `copy(offset)` on random block offsets for `secs`; copies per second.
fn run(secs: u64, mut copy: impl FnMut(usize)) -> f64 {
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
            copy((x % blocks) as usize * BLOCK);
            n += 1;
        }
    }
    n as f64 / t0.elapsed().as_secs_f64()
}

fn print(what: &str, rate: f64) {
    println!(
        "{what}: {rate:.0} copies/s, {:.2} GB/s",
        rate * BLOCK as f64 / 1e9
    );
}

fn main() {
    let secs: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let src = vec![0xA5u8; BLOCK];

    let mut region = vec![0u8; REGION];
    // Touch every page first so page faults are not measured.
    for b in region.chunks_mut(4096) {
        b[0] = 1;
    }
    let rate = run(secs, |off| {
        region[off..off + BLOCK].copy_from_slice(black_box(&src));
    });
    black_box(&region);
    drop(region);
    print(
        "memcpy 4KiB random blocks over 1 GiB heap (ordinary pages)",
        rate,
    );

    let arena = match DmaArena::new(
        REGION,
        ArenaOptions::named("memcpy-example").hugepages(HugepageMode::Auto),
    ) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("arena: {e}");
            std::process::exit(1);
        }
    };
    // Fault every page in first.
    let _ = arena.fill(0, REGION, 1);
    let pages = if arena.is_hugepage() {
        "2 MiB hugepages"
    } else {
        "ordinary pages"
    };
    let rate = run(secs, |off| {
        let _ = arena.copy_in(off, black_box(&src));
    });
    print(
        &format!("DmaArena::copy_in 4KiB random blocks over 1 GiB arena ({pages})"),
        rate,
    );
    let mut n = 0u32;
    let rate = run(secs, |off| {
        let _ = arena.copy_in_unfenced(off, black_box(&src));
        n += 1;
        if n % 128 == 0 {
            streaming_fence();
        }
    });
    streaming_fence();
    print(
        &format!(
            "DmaArena batched: copy_in_unfenced, a fence per 128 copies, same blocks ({pages})"
        ),
        rate,
    );
}
