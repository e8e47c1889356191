//! Data-path rules of the reactor itself: while a bdev job keeps I/O in
//! flight on core 0, messages travel between two reactors and timed
//! pollers fire on both, and 100,000 I/Os later nothing was allocated and
//! no lock taken by the loop, the inboxes, the wake-up path or the timer
//! heap. The messages carry nothing (a capture-free closure boxes without
//! allocating): the box of a message that captures data is the sender's
//! allocation, control path by the rules.
#![allow(clippy::unwrap_used)]

mod common;

use std::cell::Cell;
use std::time::Duration;

use common::rules::{
    assert_clean, assert_counters_work, measure_from_here, measure_to_here, BdevJob, N,
};
use pollux_bdev::BdevRegistry;
use pollux_reactor::mem::CountingAlloc;
use pollux_reactor::{PollStatus, Reactor, TestCluster};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

thread_local! {
    static PINGS: Cell<u64> = const { Cell::new(0) };
    static TICKS: Cell<u64> = const { Cell::new(0) };
}

/// A message to the other core that sends the next one back (forever).
fn ping(r: &Reactor) {
    PINGS.with(|p| p.set(p.get() + 1));
    let other = 1 - r.core();
    r.send(other, ping).unwrap();
}

#[test]
fn reactor_messages_and_timers_allocate_nothing_and_lock_nothing_under_io() {
    assert_counters_work();
    let reg = BdevRegistry::new();
    let bdev = reg
        .create("null:size=64M,block=512,name=rules-reactor")
        .unwrap();
    let desc = bdev.open(true).unwrap();
    let cl = TestCluster::new(2);
    for core in 0..2 {
        cl.on(core, |r| {
            r.add_timed_poller("rules-tick", Duration::from_micros(50), || {
                TICKS.with(|t| t.set(t.get() + 1));
                PollStatus::Busy
            });
            // Two messages in flight at all times.
            r.send(1 - core, ping).unwrap();
        });
    }
    let ch = cl.on(0, |r| desc.channel(r).unwrap());
    let job = BdevJob::new(ch, 32, 8, false);
    // Time moves on every round (the manual clock), so the timers fire.
    let step = || cl.advance(Duration::from_micros(20));
    job.run_with(&cl, N / 10, step);
    let (pings, ticks) = (PINGS.with(Cell::get), TICKS.with(Cell::get));
    let before = measure_from_here();
    job.run_with(&cl, N, step);
    let after = measure_to_here();
    let (pings, ticks) = (PINGS.with(Cell::get) - pings, TICKS.with(Cell::get) - ticks);
    assert_clean("reactor messages and timers under I/O", before, after);
    assert!(pings >= 1000, "messages ran: {pings}");
    assert!(ticks >= 1000, "timers fired: {ticks}");
    job.close();
}
