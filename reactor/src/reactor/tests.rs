//! Unit tests of the reactor loop, driven by `TestCluster` (manual clock).

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::{IoDevice, PollStatus, PollerId, Reactor, SendError, TestCluster};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn busy_and_idle_time_follow_poller_status() {
    let c = TestCluster::new(1);
    let r = c.reactor(0);
    let work = Rc::new(Cell::new(false));
    let w = work.clone();
    let clock = c.clock().clone();
    r.add_poller("maybe", move || {
        if w.get() {
            // The work "takes" 7 ms of (manual) time.
            clock.advance(ms(7));
            PollStatus::Busy
        } else {
            PollStatus::Idle
        }
    });
    r.add_poller("idle", || PollStatus::Idle);
    assert_eq!(r.poll_once(), PollStatus::Idle);
    c.advance(ms(10));
    work.set(true);
    assert_eq!(r.poll_once(), PollStatus::Busy); // +10 ms idle (previous loop)
    work.set(false);
    c.advance(ms(5));
    assert_eq!(r.poll_once(), PollStatus::Idle); // +12 ms busy (7 inside, 5 after)
    let s = r.stats();
    assert_eq!(s.loops, 3);
    assert_eq!(s.busy_loops, 1);
    assert_eq!(s.idle_ns, 10_000_000);
    assert_eq!(s.busy_ns, 12_000_000);
    assert!((s.busy_pct() - 100.0 * 12.0 / 22.0).abs() < 1e-9);
    let p = s.poller("maybe").unwrap();
    assert_eq!((p.runs, p.busy_runs, p.busy_ns), (3, 1, 7_000_000));
    let q = s.poller("idle").unwrap();
    assert_eq!((q.runs, q.busy_runs, q.busy_ns), (3, 0, 0));
    assert_eq!(q.period, None);
}

#[test]
fn now_is_cached_per_loop() {
    let c = TestCluster::new(1);
    let r = c.reactor(0);
    let seen = Rc::new(RefCell::new(Vec::new()));
    let (s, r2, clock) = (seen.clone(), r.clone(), c.clock().clone());
    r.add_poller("a", move || {
        let before = r2.now();
        clock.advance(ms(1));
        s.borrow_mut().push((before, r2.now()));
        PollStatus::Idle
    });
    r.poll_once();
    let v = seen.borrow();
    assert_eq!(v[0].0, v[0].1, "now() does not move inside a loop");
    assert!(c.now() > r.now());
}

#[test]
fn read_clock_is_fresh_inside_a_loop_and_follows_the_test_clock() {
    let c = TestCluster::new(1);
    let r = c.reactor(0);
    let seen = Rc::new(RefCell::new(Vec::new()));
    let (s, r2, clock) = (seen.clone(), r.clone(), c.clock().clone());
    r.add_poller("a", move || {
        clock.advance(ms(3));
        s.borrow_mut().push((r2.now(), r2.read_clock()));
        PollStatus::Idle
    });
    r.poll_once();
    let (cached, fresh) = seen.borrow()[0];
    assert_eq!(
        fresh,
        cached + ms(3),
        "read_clock sees time that passed in the loop"
    );
    assert_eq!(fresh, c.now(), "and it is the test's manual clock");
}

#[test]
fn timed_pollers_run_by_deadline_and_period() {
    let c = TestCluster::new(1);
    let r = c.reactor(0);
    let log = Rc::new(RefCell::new(Vec::new()));
    for (name, period) in [("p3", 3), ("p2", 2), ("p5", 5)] {
        let l = log.clone();
        r.add_timed_poller(name, ms(period), move || {
            l.borrow_mut().push(name);
            PollStatus::Busy
        });
    }
    // Nothing is due before time moves.
    assert_eq!(r.poll_once(), PollStatus::Idle);
    let mut per_tick = Vec::new();
    for _ in 0..6 {
        c.advance(ms(1));
        r.poll_once();
        per_tick.push(std::mem::take(&mut *log.borrow_mut()));
    }
    assert_eq!(
        per_tick,
        vec![
            vec![],           // t=1
            vec!["p2"],       // t=2
            vec!["p3"],       // t=3
            vec!["p2"],       // t=4
            vec!["p5"],       // t=5
            vec!["p3", "p2"], // t=6: equal deadlines, p3 was rescheduled first (t=3)
        ]
    );
    let s = r.stats();
    assert_eq!(s.poller("p2").unwrap().runs, 3);
    assert_eq!(s.poller("p5").unwrap().period, Some(ms(5)));
}

#[test]
fn late_timed_poller_runs_once_then_reschedules_from_now() {
    let c = TestCluster::new(1);
    let r = c.reactor(0);
    let runs = Rc::new(Cell::new(0));
    let n = runs.clone();
    r.add_timed_poller("t", ms(2), move || {
        n.set(n.get() + 1);
        PollStatus::Idle
    });
    c.advance(ms(11));
    r.poll_once();
    assert_eq!(runs.get(), 1, "no catch-up burst");
    c.advance(ms(1));
    r.poll_once();
    assert_eq!(runs.get(), 1);
    c.advance(ms(1));
    r.poll_once();
    assert_eq!(runs.get(), 2);
}

#[test]
fn zero_period_timed_poller_is_active() {
    let c = TestCluster::new(1);
    let r = c.reactor(0);
    let runs = Rc::new(Cell::new(0));
    let n = runs.clone();
    r.add_timed_poller("z", Duration::ZERO, move || {
        n.set(n.get() + 1);
        PollStatus::Idle
    });
    r.poll_once();
    r.poll_once();
    assert_eq!(runs.get(), 2);
}

#[test]
fn poller_removes_itself_and_others_from_inside() {
    let c = TestCluster::new(1);
    let r = c.reactor(0);
    let runs = Rc::new(RefCell::new(Vec::new()));
    let ids: Rc<RefCell<Vec<PollerId>>> = Rc::default();
    for name in ["a", "b", "c"] {
        let (rr, log, ids2) = (r.clone(), runs.clone(), ids.clone());
        let id = r.add_poller(name, move || {
            log.borrow_mut().push(name);
            if name == "a" {
                // Remove "b" (later in this loop) and itself.
                let ids = ids2.borrow();
                assert!(rr.remove_poller(ids[1]));
                assert!(rr.remove_poller(ids[0]));
                assert!(!rr.remove_poller(ids[0]), "already removed");
            }
            PollStatus::Busy
        });
        ids.borrow_mut().push(id);
    }
    r.poll_once();
    assert_eq!(*runs.borrow(), ["a", "c"], "b never runs once removed");
    r.poll_once();
    assert_eq!(*runs.borrow(), ["a", "c", "c"]);
    assert_eq!(r.poller_count(), 1);
    assert_eq!(r.stats().pollers.len(), 1);
}

#[test]
fn removing_a_timed_poller_from_inside_itself() {
    let c = TestCluster::new(1);
    let r = c.reactor(0);
    let runs = Rc::new(Cell::new(0));
    let me: Rc<Cell<Option<PollerId>>> = Rc::default();
    let (n, m, rr) = (runs.clone(), me.clone(), r.clone());
    let id = r.add_timed_poller("once", ms(1), move || {
        n.set(n.get() + 1);
        if let Some(id) = m.get() {
            rr.remove_poller(id);
        }
        PollStatus::Busy
    });
    me.set(Some(id));
    for _ in 0..5 {
        c.advance(ms(1));
        r.poll_once();
    }
    assert_eq!(runs.get(), 1);
    assert_eq!(r.poller_count(), 0);
    assert!(!r.remove_poller(id));
}

#[test]
fn removal_outside_a_loop_is_immediate_and_drops_on_this_thread() {
    struct Flag(Rc<Cell<bool>>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.set(true);
        }
    }
    let c = TestCluster::new(1);
    let r = c.reactor(0);
    let dropped = Rc::new(Cell::new(false));
    let flag = Flag(dropped.clone());
    let id = r.add_timed_poller("t", ms(1), move || {
        let _keep = &flag;
        PollStatus::Idle
    });
    assert!(r.remove_poller(id));
    assert!(dropped.get());
    c.advance(ms(5));
    assert_eq!(r.poll_once(), PollStatus::Idle);
}

#[test]
fn pollers_added_inside_a_loop_run_from_the_next_loop() {
    let c = TestCluster::new(1);
    let r = c.reactor(0);
    let runs = Rc::new(Cell::new(0));
    let (rr, n) = (r.clone(), runs.clone());
    let added = Rc::new(Cell::new(false));
    r.add_poller("spawner", move || {
        if !added.replace(true) {
            let n = n.clone();
            rr.add_poller("child", move || {
                n.set(n.get() + 1);
                PollStatus::Idle
            });
        }
        PollStatus::Idle
    });
    r.poll_once();
    assert_eq!(runs.get(), 0);
    r.poll_once();
    assert_eq!(runs.get(), 1);
}

#[test]
fn poll_once_is_not_reentrant() {
    let c = TestCluster::new(1);
    let r = c.reactor(0);
    let rr = r.clone();
    r.add_poller("nested", move || {
        assert_eq!(rr.poll_once(), PollStatus::Idle);
        PollStatus::Busy
    });
    assert_eq!(r.poll_once(), PollStatus::Busy);
}

#[test]
fn current_is_set_while_polling_and_inside_on() {
    let c = TestCluster::new(2);
    assert!(Reactor::current().is_none());
    assert_eq!(c.on(1, |_| Reactor::current().map(|r| r.core())), Some(1));
    assert!(Reactor::current().is_none());
    let seen = Rc::new(Cell::new(None));
    let s = seen.clone();
    c.reactor(0).add_poller("who", move || {
        s.set(Reactor::current().map(|r| r.core()));
        PollStatus::Idle
    });
    c.poll_once_all();
    assert_eq!(seen.get(), Some(0));
}

#[test]
fn messages_cross_cores_in_order_and_count_as_work() {
    let c = TestCluster::new(3);
    let log = Arc::new(crate::sync::Mutex::new(Vec::new()));
    c.on(0, |r| {
        for i in 0..5 {
            let l = log.clone();
            r.send(2, move |r2| l.lock().unwrap().push((r2.core(), i)))
                .unwrap();
        }
        assert_eq!(r.send(9, |_| {}), Err(SendError::UnknownCore(9)));
    });
    assert_eq!(c.reactor(2).poll_once(), PollStatus::Busy);
    assert_eq!(
        *log.lock().unwrap(),
        (0..5).map(|i| (2, i)).collect::<Vec<_>>()
    );
    assert_eq!(c.reactor(2).stats().messages, 5);
    assert_eq!(c.reactor(2).poll_once(), PollStatus::Idle);
}

#[test]
fn message_batch_is_bounded_per_loop() {
    let c = TestCluster::new(1);
    let n = Arc::new(AtomicUsize::new(0));
    for _ in 0..(crate::MSG_BATCH + 3) {
        let n = n.clone();
        c.messenger()
            .send(0, move |_| {
                n.fetch_add(1, Ordering::Relaxed);
            })
            .unwrap();
    }
    c.reactor(0).poll_once();
    assert_eq!(n.load(Ordering::Relaxed), crate::MSG_BATCH);
    c.reactor(0).poll_once();
    assert_eq!(n.load(Ordering::Relaxed), crate::MSG_BATCH + 3);
}

#[test]
fn call_runs_remotely_and_replies_at_home() {
    let c = TestCluster::new(2);
    let got = Rc::new(RefCell::new(Vec::new()));
    c.on(0, |r| {
        // The reply closure holds an Rc: it cannot travel, and need not.
        let g = got.clone();
        r.call(
            1,
            |r1| r1.core() + 40,
            move |home, v| g.borrow_mut().push((home.core(), v)),
        )
        .unwrap();
        let g = got.clone();
        r.call(
            0,
            |r0| r0.core() + 7,
            move |home, v| g.borrow_mut().push((home.core(), v)),
        )
        .unwrap();
        assert_eq!(r.pending_replies(), 2);
        assert_eq!(
            r.call(5, |_| 0, |_, _: i32| {}),
            Err(SendError::UnknownCore(5))
        );
        assert_eq!(
            r.pending_replies(),
            2,
            "a failed call leaves nothing parked"
        );
    });
    assert!(got.borrow().is_empty(), "never runs inline");
    c.poll_until_idle().unwrap();
    let mut v = got.borrow().clone();
    v.sort_unstable();
    assert_eq!(v, [(0, 7), (0, 41)]);
    assert_eq!(c.reactor(0).pending_replies(), 0);
}

#[test]
fn stats_of_another_core_via_call() {
    let c = TestCluster::new(2);
    c.reactor(1).add_poller("remote", || PollStatus::Busy);
    c.poll_once_all();
    let got = Rc::new(RefCell::new(None));
    let g = got.clone();
    c.on(0, |r| {
        r.call(1, |r1| r1.stats(), move |_, s| *g.borrow_mut() = Some(s))
            .unwrap()
    });
    for _ in 0..3 {
        c.poll_once_all();
    }
    let s = got.borrow_mut().take().unwrap();
    assert_eq!(s.core, 1);
    assert!(s.poller("remote").unwrap().busy_runs >= 1);
}

#[test]
fn for_each_core_visits_all_then_completes_at_home() {
    let c = TestCluster::new(3);
    let visited = Arc::new(crate::sync::Mutex::new(Vec::new()));
    let done = Rc::new(Cell::new(None));
    let (v, d) = (visited.clone(), done.clone());
    let n = c.on(1, |r| {
        r.for_each_core(
            move |r| v.lock().unwrap().push(r.core()),
            move |home| d.set(Some(home.core())),
        )
    });
    assert_eq!(n, 3);
    assert_eq!(done.get(), None);
    c.poll_until_idle().unwrap();
    let mut seen = visited.lock().unwrap().clone();
    seen.sort_unstable();
    assert_eq!(seen, [0, 1, 2]);
    assert_eq!(done.get(), Some(1));
}

#[test]
fn for_each_core_skips_stopped_cores() {
    let c = TestCluster::new(2);
    c.reactor(1).stop();
    c.poll_once_all();
    let done = Rc::new(Cell::new(false));
    let d = done.clone();
    let n = c.on(0, |r| r.for_each_core(|_| {}, move |_| d.set(true)));
    assert_eq!(n, 1);
    c.poll_until_idle().unwrap();
    assert!(done.get());
}

#[test]
fn poll_until_idle_gives_up_on_a_busy_poller() {
    let c = TestCluster::new(1);
    c.reactor(0).add_poller("spin", || PollStatus::Busy);
    assert_eq!(
        c.poll_until_idle_within(50),
        Err(crate::NotSettled { rounds: 50 })
    );
}

#[test]
fn stopped_reactor_refuses_messages_and_tears_down() {
    let c = TestCluster::new(2);
    let dropped = Rc::new(Cell::new(false));
    struct OnDrop(Rc<Cell<bool>>);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            self.0.set(true);
        }
    }
    let guard = OnDrop(dropped.clone());
    c.reactor(1).add_poller("holds", move || {
        let _g = &guard;
        PollStatus::Idle
    });
    c.on(0, |r| r.send(1, |r1| r1.stop()).unwrap());
    c.poll_until_idle().unwrap();
    assert!(dropped.get(), "pollers torn down");
    assert_eq!(c.reactor(1).poller_count(), 0);
    assert_eq!(c.messenger().send(1, |_| {}), Err(SendError::Stopped(1)));
    // stop_all from a reactor stops every one.
    c.on(0, |r| r.stop_all());
    assert!(c.reactor(0).is_stopping());
}

// ---- io_device / channels ----

struct Dev {
    created: AtomicUsize,
    dropped_on: Arc<crate::sync::Mutex<Vec<u32>>>,
}

struct Chan {
    core: u32,
    dropped_on: Arc<crate::sync::Mutex<Vec<u32>>>,
}

impl Drop for Chan {
    fn drop(&mut self) {
        let here = Reactor::current().map(|r| r.core());
        assert_eq!(here, Some(self.core), "dropped on its own core");
        self.dropped_on.lock().unwrap().push(self.core);
    }
}

impl IoDevice for Dev {
    type Channel = Chan;
    type Error = &'static str;
    fn create_channel(&self, r: &Reactor) -> Result<Chan, &'static str> {
        if r.core() == 7 {
            return Err("no channel on core 7");
        }
        self.created.fetch_add(1, Ordering::SeqCst);
        Ok(Chan {
            core: r.core(),
            dropped_on: self.dropped_on.clone(),
        })
    }
}

fn dev() -> Arc<Dev> {
    Arc::new(Dev {
        created: AtomicUsize::new(0),
        dropped_on: Arc::default(),
    })
}

#[test]
fn channels_are_cached_per_core_and_released_with_the_last_rc() {
    let c = TestCluster::new(2);
    let d = dev();
    let d2 = dev();
    c.on(0, |r| {
        assert!(r.existing_channel(&d).is_none());
        let a = r.channel(&d).unwrap();
        let b = r.channel(&d).unwrap();
        assert!(Rc::ptr_eq(&a, &b));
        let other = r.channel(&d2).unwrap();
        assert!(!Rc::ptr_eq(&a, &other));
        assert_eq!(r.channel_count(), 2);
        drop((a, other));
        assert_eq!(d.dropped_on.lock().unwrap().len(), 0, "b still holds it");
        drop(b);
        assert_eq!(*d.dropped_on.lock().unwrap(), [0]);
        assert!(r.existing_channel(&d).is_none());
        // A new one is created on next use.
        let _again = r.channel(&d).unwrap();
    });
    c.on(1, |r| {
        let ch = r.channel(&d).unwrap();
        assert_eq!(ch.core, 1);
    });
    assert_eq!(d.created.load(Ordering::SeqCst), 3);
}

#[test]
fn channel_creation_error_caches_nothing() {
    let c = TestCluster::with_cores(&crate::Cores::parse("7").unwrap());
    let d = dev();
    c.on(7, |r| {
        assert_eq!(r.channel(&d).err(), Some("no channel on core 7"));
        assert_eq!(r.channel_count(), 0);
    });
}

#[test]
fn channels_held_by_pollers_are_released_at_shutdown_on_their_core() {
    let c = TestCluster::new(2);
    let d = dev();
    for core in [0, 1] {
        c.on(core, |r| {
            let ch = r.channel(&d).unwrap();
            r.add_poller("user", move || {
                let _ = ch.core;
                PollStatus::Idle
            });
        });
    }
    drop(c);
    let mut on = d.dropped_on.lock().unwrap().clone();
    on.sort_unstable();
    assert_eq!(on, [0, 1]);
}

#[test]
fn for_each_core_reaches_every_channel() {
    let c = TestCluster::new(3);
    let d = dev();
    // Only cores 0 and 2 hold a channel.
    let held: Vec<_> = [0, 2]
        .iter()
        .map(|&core| (core, c.on(core, |r| r.channel(&d).unwrap())))
        .collect();
    let hits = Arc::new(crate::sync::Mutex::new(Vec::new()));
    let (h, dd) = (hits.clone(), d.clone());
    c.on(0, |r| {
        r.for_each_core(
            move |r| {
                if let Some(ch) = r.existing_channel(&dd) {
                    h.lock().unwrap().push(ch.core);
                }
            },
            |_| {},
        )
    });
    c.poll_until_idle().unwrap();
    let mut v = hits.lock().unwrap().clone();
    v.sort_unstable();
    assert_eq!(v, [0, 2]);
    for (core, ch) in held {
        c.on(core, move |_| drop(ch));
    }
}
