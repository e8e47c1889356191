//! Message round-trip latency between two reactors: busy-poll vs adaptive.
//!
//! Core 0 `call`s core 1 (a no-op) and, in the reply, issues the next call;
//! after a warm-up, it times `ROUNDS` round trips with `Instant` and prints
//! nanoseconds per round trip. In adaptive mode (`sleep_after` = 0) both
//! reactors sleep in `epoll_wait` between messages, so each round trip pays
//! two eventfd wake-ups.
//!
//! Run: `cargo bench -p pollux-reactor --bench wake_latency`.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crossbeam_channel::bounded;
use pollux_reactor::{launch, Cores, IdleMode, LaunchConfig, Reactor};

const WARMUP: u64 = 2_000;
const ROUNDS: u64 = 50_000;

fn ping(
    r: &Reactor,
    left: Rc<Cell<u64>>,
    start: Rc<Cell<Option<Instant>>>,
    done: crossbeam_channel::Sender<f64>,
) {
    let n = left.get();
    if n == ROUNDS {
        start.set(Some(Instant::now()));
    }
    if n == 0 {
        let ns = start
            .get()
            .map_or(0.0, |s| s.elapsed().as_nanos() as f64 / ROUNDS as f64);
        let _ = done.send(ns);
        r.stop_all();
        return;
    }
    left.set(n - 1);
    let res = r.call(1, |_| (), move |home, ()| ping(home, left, start, done));
    if let Err(e) = res {
        eprintln!("send failed: {e}");
        r.stop_all();
    }
}

fn measure(idle: IdleMode) -> Option<f64> {
    let cores = Cores::parse("0-1").ok()?;
    if cores.check_exist().is_err() {
        eprintln!("skipped: needs 2 cores");
        return None;
    }
    let (tx, rx) = bounded(1);
    let set = launch(
        LaunchConfig {
            idle,
            ..LaunchConfig::new(cores)
        },
        move |r| {
            if r.core() == 0 {
                let left = Rc::new(Cell::new(ROUNDS + WARMUP));
                ping(r, left, Rc::new(Cell::new(None)), tx.clone());
            }
        },
    )
    .ok()?;
    let ns = rx.recv_timeout(Duration::from_secs(120)).ok();
    if let Err(e) = set.join() {
        eprintln!("join: {e}");
    }
    ns
}

fn main() {
    for (label, idle) in [
        ("busy-poll", IdleMode::BusyPoll),
        (
            "adaptive (sleep_after=0)",
            IdleMode::Adaptive {
                sleep_after: Duration::ZERO,
            },
        ),
    ] {
        match measure(idle) {
            Some(ns) => {
                println!("wake_latency {label}: {ns:.0} ns per round trip ({ROUNDS} round trips)")
            }
            None => println!("wake_latency {label}: not measured"),
        }
    }
}
