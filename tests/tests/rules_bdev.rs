//! Data-path rules of the bdev layer: with the null and malloc bdevs warm,
//! 100,000 I/Os through the generic path (`IoChannel::submit`, a fresh
//! request and a callback per I/O) and through the in-place path make no
//! heap allocation and take no lock.
#![allow(clippy::unwrap_used)]

mod common;

use common::rules::{
    assert_clean, assert_counters_work, measure_from_here, measure_to_here, BdevJob, N,
};
use pollux_bdev::BdevRegistry;
use pollux_reactor::mem::CountingAlloc;
use pollux_reactor::TestCluster;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

#[test]
fn bdev_null_and_malloc_allocate_nothing_and_lock_nothing_per_io() {
    assert_counters_work();
    let reg = BdevRegistry::new();
    let cases = [
        ("null:size=64M,block=512,name=rules-null", 8),
        ("malloc:size=8M,block=512,name=rules-malloc", 8),
    ];
    for (spec, io_blocks) in cases {
        let bdev = reg.create(spec).unwrap();
        let desc = bdev.open(true).unwrap();
        for in_place in [false, true] {
            let cl = TestCluster::new(1);
            let ch = cl.on(0, |r| desc.channel(r).unwrap());
            let job = BdevJob::new(ch, 32, io_blocks, in_place);
            job.run(&cl, N / 10);
            let before = measure_from_here();
            job.run(&cl, N);
            let after = measure_to_here();
            assert_clean(&format!("{spec} in_place={in_place}"), before, after);
            job.close();
        }
    }
}
