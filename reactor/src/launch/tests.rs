//! Tests of `launch` with real, pinned threads. Most use the adaptive idle
//! mode so that parallel tests do not spin every core; none depends on
//! timing to pass (waits have generous timeouts and only fail on a hang).

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::sync::Mutex;
use std::time::Duration;

use crossbeam_channel::{bounded, unbounded};
use rustix::event::{eventfd, EventfdFlags};

use crate::{launch, Cores, CoresError, IdleMode, LaunchConfig, LaunchError, PollStatus};

const WAIT: Duration = Duration::from_secs(20);

fn adaptive() -> IdleMode {
    IdleMode::Adaptive {
        sleep_after: Duration::ZERO,
    }
}

/// Cores 0 and 1, or `None` (after [`crate::test_env::skip`]) on a 1-core
/// machine.
fn two_cores() -> Option<Cores> {
    if affinity::get_core_num() < 2 {
        crate::test_env::skip(
            "2 cores (this machine has 1)",
            "run on a machine or VM with at least 2 CPUs",
        );
        return None;
    }
    Cores::parse("0-1").ok()
}

fn thread_name() -> String {
    std::thread::current().name().unwrap_or("?").to_owned()
}

fn cfg(cores: Cores, idle: IdleMode) -> LaunchConfig {
    LaunchConfig {
        idle,
        ..LaunchConfig::new(cores)
    }
}

#[test]
fn messages_and_calls_cross_real_threads() {
    let Some(cores) = two_cores() else { return };
    for idle in [IdleMode::BusyPoll, adaptive()] {
        let set = launch(cfg(cores.clone(), idle), |_| {}).unwrap();
        let (tx, rx) = bounded(1);
        set.messenger()
            .send(0, move |r| {
                r.call(
                    1,
                    |r1| (r1.core(), thread_name()),
                    move |home, (core, name)| {
                        tx.send((home.core(), thread_name(), core, name)).unwrap();
                    },
                )
                .unwrap();
            })
            .unwrap();
        let got = rx.recv_timeout(WAIT).unwrap();
        assert_eq!(
            got,
            (0, "pollux-r0".to_owned(), 1, "pollux-r1".to_owned()),
            "{idle:?}"
        );
        set.stop_all();
        set.join().unwrap();
    }
}

#[test]
fn stats_of_every_core() {
    let Some(cores) = two_cores() else { return };
    let set = launch(cfg(cores, adaptive()), |r| {
        r.add_poller("p", || PollStatus::Idle);
    })
    .unwrap();
    let s = set.stats().unwrap();
    assert_eq!(s.iter().map(|s| s.core).collect::<Vec<_>>(), [0, 1]);
    assert!(s.iter().all(|s| s.poller("p").is_some()));
    let again = set.stats().unwrap();
    for (a, b) in s.iter().zip(&again) {
        assert!(b.loops > a.loops && b.messages > a.messages);
        assert!(b.busy_pct() <= 100.0);
    }
    set.stop_all();
    set.join().unwrap();
}

#[test]
fn teardown_runs_on_each_core_and_join_leaves_no_thread() {
    struct Guard(u32, Arc<Mutex<Vec<(u32, String)>>>);
    impl Drop for Guard {
        fn drop(&mut self) {
            self.1.lock().unwrap().push((self.0, thread_name()));
        }
    }
    let Some(cores) = two_cores() else { return };
    let drops = Arc::new(Mutex::new(Vec::new()));
    let d = drops.clone();
    let set = launch(cfg(cores, IdleMode::BusyPoll), move |r| {
        let g = Guard(r.core(), d.clone());
        r.add_poller("guard", move || {
            let _ = &g;
            PollStatus::Idle
        });
    })
    .unwrap();
    set.stop_all();
    set.join().unwrap();
    let mut v = drops.lock().unwrap().clone();
    v.sort();
    assert_eq!(
        v,
        [(0, "pollux-r0".to_owned()), (1, "pollux-r1".to_owned())]
    );
}

#[test]
fn dropping_the_set_stops_and_joins() {
    let Some(cores) = two_cores() else { return };
    let alive = Arc::new(AtomicU64::new(0));
    let a = alive.clone();
    let set = launch(cfg(cores, adaptive()), move |_| {
        a.fetch_add(1, Ordering::SeqCst);
    })
    .unwrap();
    let m = set.messenger().clone();
    // Wait until both reactors have run init (a stats round trip).
    set.stats().unwrap();
    drop(set);
    assert_eq!(alive.load(Ordering::SeqCst), 2);
    assert!(m.is_stopped(0) && m.is_stopped(1));
    assert!(m.send(0, |_| {}).is_err());
}

#[test]
fn main_core_runs_on_the_callers_thread() {
    let Some(cores) = two_cores() else { return };
    let (tx, rx) = unbounded();
    let mut set = launch(
        LaunchConfig {
            main_core: Some(0),
            ..cfg(cores, adaptive())
        },
        move |r| {
            tx.send((r.core(), std::thread::current().id())).unwrap();
            if r.core() == 1 {
                // Core 1 asks the main core to stop everything.
                r.send(0, |r0| r0.stop_all()).unwrap();
            }
        },
    )
    .unwrap();
    assert_eq!(set.main_core(), Some(0));
    set.run_on_current().unwrap();
    assert!(matches!(set.run_on_current(), Err(LaunchError::NoMainCore)));
    set.join().unwrap();
    let mut seen: Vec<_> = rx.try_iter().collect();
    seen.sort_by_key(|s| s.0);
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].1, std::thread::current().id());
    assert_ne!(seen[1].1, std::thread::current().id());
}

#[test]
fn a_panicking_reactor_is_reported_by_join() {
    let set = launch(cfg(Cores::default(), adaptive()), |_| {
        panic!("boom in init")
    })
    .unwrap();
    match set.join() {
        Err(LaunchError::Panicked { core: 0, message }) => assert!(message.contains("boom")),
        other => panic!("expected a panic report, got {other:?}"),
    }
}

#[test]
fn launch_refuses_bad_configurations() {
    let missing = Cores::from_ids([affinity::get_core_num() as u32]).unwrap();
    assert!(matches!(
        launch(LaunchConfig::new(missing), |_| {}),
        Err(LaunchError::Cores(CoresError::NoSuchCore { .. }))
    ));
    assert!(matches!(
        launch(
            LaunchConfig {
                main_core: Some(3),
                ..LaunchConfig::default()
            },
            |_| {}
        ),
        Err(LaunchError::MainCoreNotInSet(3))
    ));
}

#[test]
fn adaptive_reactor_sleeps_and_wakes_on_messages() {
    let set = launch(cfg(Cores::default(), adaptive()), |r| {
        r.add_poller("idle", || PollStatus::Idle);
    })
    .unwrap();
    let first = set.stats().unwrap().remove(0);
    // Give a busy-polling reactor time to run many loops; an asleep one runs
    // none. (Not a timing assertion: an adaptive reactor runs about two loops
    // per message however long this takes.)
    std::thread::sleep(Duration::from_millis(30));
    let second = set.stats().unwrap().remove(0);
    let third = set.stats().unwrap().remove(0);
    assert!(second.sleeps >= 1, "it slept: {second:?}");
    assert!(
        second.loops - first.loops <= 4 && third.loops - second.loops <= 4,
        "loops stop growing while asleep: {first:?} {second:?} {third:?}"
    );
    assert!(second.idle_ns > 0);
    set.stop_all();
    set.join().unwrap();
}

#[test]
fn adaptive_reactor_wakes_for_timed_pollers() {
    let (tx, rx) = bounded(1);
    let set = launch(cfg(Cores::default(), adaptive()), move |r| {
        let (tx, mut n) = (tx.clone(), 0);
        r.add_timed_poller("tick", Duration::from_millis(1), move || {
            n += 1;
            if n == 3 {
                let _ = tx.try_send(());
            }
            PollStatus::Busy
        });
    })
    .unwrap();
    // Nothing but the deadline can wake the reactor: a hang fails here.
    rx.recv_timeout(WAIT).unwrap();
    set.stop_all();
    set.join().unwrap();
}

#[test]
fn adaptive_reactor_wakes_on_a_registered_fd() {
    let efd: Arc<OwnedFd> =
        Arc::new(eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).unwrap());
    let (tx, rx) = bounded(1);
    let fd = efd.clone();
    let set = launch(cfg(Cores::default(), adaptive()), move |r| {
        r.register_wake_fd(&*fd).unwrap();
        let (fd, tx, rr) = (fd.clone(), tx.clone(), r.clone());
        r.add_poller("efd", move || {
            let mut buf = [0u8; 8];
            match rustix::io::read(&*fd, &mut buf) {
                Ok(8) => {
                    let _ = tx.try_send((u64::from_ne_bytes(buf), rr.stats().sleeps));
                    PollStatus::Busy
                }
                _ => PollStatus::Idle,
            }
        });
    })
    .unwrap();
    // Let it fall asleep (an asleep reactor wakes only for the fd).
    set.stats().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    rustix::io::write(&*efd, &5u64.to_ne_bytes()).unwrap();
    let (value, sleeps) = rx.recv_timeout(WAIT).unwrap();
    assert_eq!(value, 5);
    assert!(sleeps >= 1);
    set.stop_all();
    set.join().unwrap();
}

#[test]
fn hybrid_reactor_naps_between_steady_work_and_wakes_for_early_work() {
    use std::time::Instant;
    // A tick every 400 ms is the steady work: after two, the reactor
    // sleeps about 200 ms after each. An eventfd written 40 ms into such
    // a sleep must be read long before the sleep would end.
    let efd: Arc<OwnedFd> =
        Arc::new(eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).unwrap());
    let (tick_tx, tick_rx) = unbounded();
    let (read_tx, read_rx) = bounded(1);
    let fd = efd.clone();
    let idle = IdleMode::Hybrid {
        sleep_after: Duration::from_secs(10),
    };
    let set = launch(cfg(Cores::default(), idle), move |r| {
        r.register_wake_fd(&*fd).unwrap();
        let rr = r.clone();
        let tick_tx = tick_tx.clone();
        r.add_timed_poller("tick", Duration::from_millis(400), move || {
            let s = rr.stats();
            let _ = tick_tx.send((s.sleeps, s.idle_stretch_ns));
            PollStatus::Busy
        });
        let (fd, read_tx) = (fd.clone(), read_tx.clone());
        r.add_poller("efd", move || {
            let mut buf = [0u8; 8];
            match rustix::io::read(&*fd, &mut buf) {
                Ok(8) => {
                    let _ = read_tx.try_send(Instant::now());
                    PollStatus::Busy
                }
                _ => PollStatus::Idle,
            }
        });
    })
    .unwrap();
    let mut last = (0, 0);
    for _ in 0..3 {
        last = tick_rx.recv_timeout(WAIT).unwrap();
    }
    // Two stretches of ~400 ms seen: the average is about that (a loaded
    // machine delays ticks, never hastens them).
    assert!(last.1 >= 300_000_000, "average stretch {} ns", last.1);
    std::thread::sleep(Duration::from_millis(40));
    let written = Instant::now();
    rustix::io::write(&*efd, &1u64.to_ne_bytes()).unwrap();
    let read = read_rx.recv_timeout(WAIT).unwrap();
    let waited = read.saturating_duration_since(written);
    assert!(
        waited < Duration::from_millis(120),
        "an early event waited {waited:?}: the sleep did not end for it"
    );
    let (sleeps, _) = tick_rx.recv_timeout(WAIT).unwrap();
    assert!(sleeps >= 2, "the reactor slept {sleeps} times");
    set.stop_all();
    set.join().unwrap();
}

#[test]
fn an_awake_hold_keeps_an_adaptive_reactor_polling() {
    // A poller that sees work only through shared memory (an atomic the
    // test thread sets): while it holds the reactor awake, the reactor
    // never sleeps and sees the work; once it lets go, the reactor sleeps.
    let flag = Arc::new(AtomicU64::new(0));
    let (tx, rx) = bounded(4);
    let f = flag.clone();
    let set = launch(cfg(Cores::default(), adaptive()), move |r| {
        let mut hold = Some(r.hold_awake());
        let (f, tx, rr) = (f.clone(), tx.clone(), r.clone());
        r.add_poller("shm", move || match f.swap(0, Ordering::SeqCst) {
            0 => PollStatus::Idle,
            v => {
                let _ = tx.try_send((v, rr.stats().sleeps));
                if v == 2 {
                    drop(hold.take());
                }
                PollStatus::Busy
            }
        });
    })
    .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    flag.store(1, Ordering::SeqCst);
    // Nothing but polling can see the flag: a sleeping reactor hangs here.
    let (v, sleeps) = rx.recv_timeout(WAIT).unwrap();
    assert_eq!((v, sleeps), (1, 0), "held awake: no sleep");
    flag.store(2, Ordering::SeqCst);
    let (v, _) = rx.recv_timeout(WAIT).unwrap();
    assert_eq!(v, 2);
    // Let go: it falls asleep, and a message (which wakes it) reads the count.
    std::thread::sleep(Duration::from_millis(50));
    let (stx, srx) = bounded(1);
    set.messenger()
        .send_blocking(0, move |r| {
            let _ = stx.try_send((r.stats().sleeps, r.is_held_awake()));
        })
        .unwrap();
    let (sleeps, held) = srx.recv_timeout(WAIT).unwrap();
    assert!(sleeps >= 1 && !held, "sleeps {sleeps}, held {held}");
    set.stop_all();
    set.join().unwrap();
}
