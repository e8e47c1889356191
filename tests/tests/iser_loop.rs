//! Our iSER initiator against our iSER target over the soft verbs
//! provider, in process on a one-reactor `TestCluster`: login, discovery,
//! LUN discovery, reads and writes with data verification, remote and
//! local invalidation, pre-registered task memory (providers without fast
//! registration), an initiator dying mid-I/O, a target dying under the
//! initiator's I/O, and the initiator's keep-alive (NOP-Out pings, a
//! silent target). T10 PI: `iser_pi.rs`.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::iser::login_step;
use common::iser_io::LIMIT;
use common::iser_loop::{fixture, logout, pattern, Fx, INI, TGT};
use pollux_iser::initiator::{
    InitiatorError, InitiatorOptions, Invalidation, IserInitiator, PiPolicy, SessionState,
    SubmitError, TaskResult,
};
use pollux_reactor::mem::{BufPool, BufPoolOptions, DmaBuf, HugepageMode, SgList};
use pollux_verbs::soft::Soft;

#[test]
fn discovery_then_login_luns_and_io() {
    let fx = fixture();
    // Discovery session: SendTargets.
    let mut d = fx.connect(InitiatorOptions::discovery(&fx.addr, INI));
    d.send_targets().unwrap();
    let text = fx
        .spin(|| {
            d.poll(&mut |_| {});
            d.take_text()
        })
        .unwrap();
    assert!(
        text.iter().any(|(k, v)| k == "TargetName" && v == TGT),
        "{text:?}"
    );
    assert!(text
        .iter()
        .any(|(k, v)| k == "TargetAddress" && v == &format!("{},1", fx.addr)));
    logout(&fx, d);

    // Normal session: LUN discovery and I/O of 512 B .. 64 KiB.
    let mut ini = fx.connect(fx.opts());
    assert!(ini.remote_invalidation());
    assert_eq!(fx.discover_luns(&mut ini), vec![0, 1, 2, 3]);
    assert!(!ini.geometry(0).unwrap().prot_en);
    assert!(ini.geometry(1).unwrap().prot_en);
    let mut lba = 0;
    for (i, len) in [512usize, 4096, 8192, 12288, 65536].into_iter().enumerate() {
        let data = pattern(i as u8, len);
        let w = fx.write(&mut ini, 0, lba, &data);
        assert!(w.is_good(), "write {len}: {:?}", w.sense);
        let r = fx.read(&mut ini, 0, lba, len);
        assert!(r.is_good(), "read {len}: {:?}", r.sense);
        assert_eq!(r.invalidation, Invalidation::Remote);
        let got = r.bufs.unwrap().pop().unwrap();
        assert_eq!(got.as_slice(), &data[..], "data of {len}");
        lba += (len / 512) as u64;
    }
    // Several tasks at once.
    for k in 0..4u64 {
        let mut b = DmaBuf::alloc(4096).unwrap();
        b.as_mut_slice()
            .copy_from_slice(&pattern(40 + k as u8, 4096));
        ini.write(0, 1000 + 8 * k, 8, SgList::from_buf(b), k)
            .unwrap();
    }
    let res = fx.wait(&mut ini, 4);
    assert!(res.iter().all(|r| r.is_good()));
    let st = ini.stats();
    assert!(st.remote_invalidations > 0);
    assert_eq!(st.local_invalidations, 0);
    logout(&fx, ini);
    assert_eq!(fx.transport.stats().destroyed, 2);
}

#[test]
fn local_invalidation_when_the_initiator_refuses_remote() {
    let fx = fixture();
    let mut o = fx.opts();
    o.remote_invalidate = false;
    let mut ini = fx.connect(o);
    assert!(!ini.remote_invalidation());
    fx.discover_luns(&mut ini);
    let data = pattern(9, 16384);
    assert!(fx.write(&mut ini, 0, 64, &data).is_good());
    let r = fx.read(&mut ini, 0, 64, 16384);
    assert!(r.is_good());
    assert_eq!(r.invalidation, Invalidation::Local);
    assert_eq!(r.bufs.unwrap().pop().unwrap().as_slice(), &data[..]);
    assert_eq!(ini.stats().remote_invalidations, 0);
    assert!(ini.stats().local_invalidations >= 2);
    logout(&fx, ini);
}

#[test]
fn initiator_death_mid_io_returns_every_buffer() {
    let fx = fixture();
    let mut ini = fx.connect(fx.opts());
    fx.discover_luns(&mut ini);
    let pool_total = fx.target.pool().count();
    let recv_total = fx.pg.stats().recv_buffers;
    for k in 0..6u64 {
        let mut b = DmaBuf::alloc(65536).unwrap();
        b.as_mut_slice().fill(k as u8 + 1);
        if k % 2 == 0 {
            ini.write(0, 128 * k, 128, SgList::from_buf(b), k).unwrap();
        } else {
            ini.read(0, 128 * k, 128, SgList::from_buf(b), k).unwrap();
        }
    }
    // Let the target start on them, then kill the initiator's end.
    fx.cl.poll_once_all();
    fx.cl.poll_once_all();
    ini.cm_id().unwrap().kill();
    drop(ini);
    assert!(
        fx.spin(|| (fx.pg.connections() == 0).then_some(()))
            .is_some(),
        "connection not torn down"
    );
    let back = fx.spin(|| {
        let st = fx.pg.stats();
        (fx.target.pool().available() == pool_total && st.recv_buffers_idle == recv_total)
            .then_some(())
    });
    assert!(
        back.is_some(),
        "task buffers {}/{pool_total}, receive buffers {}/{recv_total}",
        fx.target.pool().available(),
        fx.pg.stats().recv_buffers_idle
    );
    assert_eq!(fx.transport.stats().destroyed, 1);
}

/// Tasks in flight when the target dies (submitted from the caller's
/// buffer pool).
const IN_FLIGHT: u64 = 6;

/// `IN_FLIGHT` 64 KiB tasks, writes and reads alternating, from buffers of
/// a pool of the caller's; the target is polled once, so it has them all
/// and has answered none. Returns the pool.
fn submit_from_pool(fx: &common::iser_loop::Fx, ini: &mut IserInitiator<Soft>) -> BufPool {
    let mut o = BufPoolOptions::new("iser-target-death", 65536, IN_FLIGHT as usize);
    o.hugepages = HugepageMode::Never;
    let pool = BufPool::new(o).unwrap();
    for k in 0..IN_FLIGHT {
        let mut b = pool.get().unwrap();
        b.as_mut_slice().fill(k as u8 + 1);
        let lba = 128 * k;
        if k % 2 == 0 {
            ini.write(0, lba, 128, SgList::from_buf(b), k).unwrap();
        } else {
            ini.read(0, lba, 128, SgList::from_buf(b), k).unwrap();
        }
    }
    assert_eq!(pool.available(), 0);
    fx.cl.poll_once_all();
    pool
}

/// Poll `ini` (and `world`, what is left of the target) until its session
/// failed and no task is outstanding, within [`LIMIT`], then some more:
/// every result it handed over.
fn results_after_target_death(
    ini: &mut IserInitiator<Soft>,
    world: &mut dyn FnMut(),
) -> Vec<TaskResult> {
    let mut out = Vec::new();
    let start = Instant::now();
    loop {
        world();
        ini.poll(&mut |r| out.push(r));
        if matches!(ini.state(), SessionState::Failed(_)) && ini.outstanding() == 0 {
            break;
        }
        assert!(
            start.elapsed() < LIMIT,
            "hung: {} of {IN_FLIGHT} tasks back, {:?}",
            out.len(),
            ini.state()
        );
    }
    // Nothing more may come (each task exactly once).
    for _ in 0..1000 {
        world();
        ini.poll(&mut |r| out.push(r));
    }
    out
}

/// Each task came back exactly once, as a transport error (none was
/// answered), with its buffer; once the results go, every buffer is back
/// in the caller's pool (the initiator kept none).
fn check_every_task_back(ini: &IserInitiator<Soft>, results: Vec<TaskResult>, pool: &BufPool) {
    let mut ctxs: Vec<u64> = results.iter().map(|r| r.ctx).collect();
    ctxs.sort_unstable();
    assert_eq!(ctxs, (0..IN_FLIGHT).collect::<Vec<_>>(), "each task once");
    for r in &results {
        assert!(
            r.transport_error && !r.is_good(),
            "task {} did not fail: status {:#x}",
            r.ctx,
            r.status
        );
        let len = r.bufs.as_ref().map_or(0, SgList::total_len);
        assert_eq!(len, 65536, "task {}: its buffer did not come back", r.ctx);
    }
    assert_eq!(ini.outstanding(), 0);
    assert_eq!(ini.stats().completed, ini.stats().submitted);
    drop(results);
    assert_eq!(
        pool.available(),
        pool.count(),
        "buffers still held by the initiator"
    );
}

/// The target's poll group shuts down under reads and writes in flight:
/// every task completes exactly once with a transport error and hands
/// back the caller's buffer, within a bounded wait; the target ends the
/// connection and has every task buffer back.
#[test]
fn target_shutdown_mid_io_fails_every_task_once() {
    let fx = fixture();
    let mut ini = fx.connect(fx.opts());
    fx.discover_luns(&mut ini);
    let target_bufs = fx.target.pool().count();
    let pool = submit_from_pool(&fx, &mut ini);
    fx.pg.shutdown();
    let results = results_after_target_death(&mut ini, &mut || {
        fx.cl.poll_once_all();
    });
    check_every_task_back(&ini, results, &pool);
    drop(ini);
    let idle = fx.spin(|| {
        (fx.pg.connections() == 0 && fx.target.pool().available() == target_bufs).then_some(())
    });
    assert!(
        idle.is_some(),
        "connections {}, task buffers {}/{target_bufs}",
        fx.pg.connections(),
        fx.target.pool().available()
    );
    let st = fx.transport.stats();
    assert_eq!(st.accepted, st.destroyed);
}

/// The whole target goes at once, without a word (its reactors, poll
/// group and connections dropped, as when its process dies) under reads
/// and writes in flight: every task completes exactly once with a
/// transport error and hands back the caller's buffer, within a bounded
/// wait, with nothing left to poll but the initiator.
#[test]
fn target_vanishing_mid_io_fails_every_task_once() {
    let fx = fixture();
    let mut ini = fx.connect(fx.opts());
    fx.discover_luns(&mut ini);
    let pool = submit_from_pool(&fx, &mut ini);
    drop(fx);
    let results = results_after_target_death(&mut ini, &mut || {});
    check_every_task_back(&ini, results, &pool);
}

#[test]
fn bad_iser_cm_header_is_rejected() {
    use pollux_verbs::{
        CmAddr, CmEvent, CmId, ConnParam, Device, ProtectionDomain, Provider, QpAttr, QpCaps,
        QpInit, QpState, QueuePair,
    };
    let fx = fixture();
    let dev = Soft::open_device("soft0").unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16).unwrap();
    let qp = pd
        .create_qp(&QpInit {
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            caps: QpCaps::default(),
            sq_sig_all: false,
        })
        .unwrap();
    qp.modify(&QpAttr::to(QpState::Init)).unwrap();
    let id = dev
        .connect(
            &CmAddr::new(fx.addr.clone()),
            &qp,
            &ConnParam::with_data(&[0x81, 0, 0, 0]),
        )
        .unwrap();
    let ev = fx.spin(|| id.get_event().ok().flatten()).unwrap();
    assert!(matches!(ev, CmEvent::Rejected { .. }), "{ev:?}");
    assert_eq!(fx.transport.stats().rejected, 1);
}

#[test]
fn pre_registered_task_memory_moves_data_without_invalidation() {
    let fx = fixture();
    let mut o = fx.opts();
    o.pre_registered = true;
    let mut ini = fx.connect(o);
    assert!(ini.pre_registered());
    // The target is told not to invalidate (arena MRs must survive).
    assert!(!ini.remote_invalidation());
    fx.discover_luns(&mut ini);
    for (i, len) in [512usize, 4096, 65536].into_iter().enumerate() {
        let data = pattern(90 + i as u8, len);
        let lba = 2000 + 256 * i as u64;
        let w = fx.write(&mut ini, 0, lba, &data);
        assert!(w.is_good(), "write {len}: {:?}", w.sense);
        let r = fx.read(&mut ini, 0, lba, len);
        assert!(r.is_good(), "read {len}: {:?}", r.sense);
        assert_eq!(r.invalidation, Invalidation::None);
        assert_eq!(r.bufs.unwrap().pop().unwrap().as_slice(), &data[..]);
    }
    // Software PI through the (pre-registered) bounce slots.
    logout(&fx, ini);
    let mut o = fx.opts();
    o.pre_registered = true;
    o.pi = PiPolicy::Both;
    o.pi_engine = pollux_iser::initiator::PiEngine::Software;
    let mut ini = fx.connect(o);
    fx.discover_luns(&mut ini);
    let data = pattern(7, 8192);
    assert!(fx.write(&mut ini, 1, 64, &data).is_good());
    let r = fx.read(&mut ini, 1, 64, 8192);
    assert!(r.is_good(), "{:?} {:?}", r.sense, r.pi_error);
    assert_eq!(r.bufs.unwrap().pop().unwrap().as_slice(), &data[..]);
    let st = ini.stats();
    assert_eq!((st.remote_invalidations, st.local_invalidations), (0, 0));
    logout(&fx, ini);
}

/// The initiator's keep-alive timing in the NOP tests (the defaults,
/// open-iscsi's `noop_out_interval` / `noop_out_timeout`).
const NOP_INTERVAL: Duration = Duration::from_secs(5);
const NOP_TIMEOUT: Duration = Duration::from_secs(5);
const MS: Duration = Duration::from_millis(1);
/// Initiator polls per step of the NOP tests (its keep-alive check runs
/// every 64).
const NOP_ROUNDS: usize = 300;

/// Connect on reactor 0, so that the session's keep-alive reads the
/// cluster's manual clock, and log in.
fn connect_on_reactor(fx: &Fx, opts: InitiatorOptions) -> IserInitiator<Soft> {
    let mut ini = fx
        .cl
        .on(0, |_| IserInitiator::<Soft>::connect(opts))
        .unwrap();
    assert!(fx.spin(|| login_step(&mut ini)).is_some(), "login");
    ini
}

/// Move the manual clock by `d`, then poll `inis` on reactor 0
/// `NOP_ROUNDS` times, and the target too while `target_alive` (else it
/// stays connected but silent): the results handed over.
fn nop_pass(
    fx: &Fx,
    inis: &mut [&mut IserInitiator<Soft>],
    d: Duration,
    target_alive: bool,
) -> Vec<TaskResult> {
    fx.cl.advance(d);
    let mut out = Vec::new();
    for _ in 0..NOP_ROUNDS {
        if target_alive {
            fx.cl.poll_once_all();
        }
        fx.cl.on(0, |_| {
            for ini in inis.iter_mut() {
                ini.poll(&mut |r| out.push(r));
            }
        });
    }
    out
}

/// An idle session whose target answers stays up over several NOP
/// intervals: no ping before `nop_interval` of silence, one at it, each
/// answered by the target's NOP-In (an unanswered one would fail the
/// session at the next step, `nop_timeout` after it); I/O still works
/// afterwards (the immediate pings took no CmdSN).
#[test]
fn idle_session_is_pinged_and_every_ping_answered() {
    let fx = fixture();
    let mut ini = connect_on_reactor(&fx, fx.opts());
    assert_eq!(
        (fx.opts().nop_interval, fx.opts().nop_timeout),
        (NOP_INTERVAL, NOP_TIMEOUT),
        "defaults"
    );
    fx.discover_luns(&mut ini);
    nop_pass(&fx, &mut [&mut ini], Duration::ZERO, true);
    for k in 1..=4u64 {
        nop_pass(&fx, &mut [&mut ini], NOP_INTERVAL - MS, true);
        assert_eq!(ini.stats().nop_pings, k - 1, "pinged before the interval");
        nop_pass(&fx, &mut [&mut ini], MS, true);
        let st = ini.stats();
        assert_eq!(
            (st.nop_pings, st.nop_answers),
            (k, k),
            "ping {k}: one sent at the interval, and answered"
        );
        assert!(ini.is_ready(), "ping {k}: {:?}", ini.state());
    }
    let data = pattern(77, 4096);
    assert!(fx.write(&mut ini, 0, 300, &data).is_good());
    let r = fx.read(&mut ini, 0, 300, 4096);
    assert!(r.is_good(), "{:?}", r.sense);
    assert_eq!(r.bufs.unwrap().pop().unwrap().as_slice(), &data[..]);
    logout(&fx, ini);
}

/// A target that stays connected but goes silent (its reactor no longer
/// polled: a hung process) under reads and writes in flight: nothing
/// happens before `nop_interval`, then one ping; at `nop_timeout` after it
/// the session fails with `TargetUnresponsive` and every task completes
/// exactly once with that error and its buffer (the caller's pool full
/// again); later submits are refused at once, and the target, polled
/// again, sees the connection closed.
#[test]
fn silent_target_fails_every_task_at_the_nop_timeout() {
    let fx = fixture();
    let mut ini = connect_on_reactor(&fx, fx.opts());
    fx.discover_luns(&mut ini);
    nop_pass(&fx, &mut [&mut ini], Duration::ZERO, true);
    let pool = submit_from_pool(&fx, &mut ini);
    let mut out = nop_pass(&fx, &mut [&mut ini], NOP_INTERVAL - MS, false);
    assert_eq!(ini.stats().nop_pings, 0, "pinged before the interval");
    out.extend(nop_pass(&fx, &mut [&mut ini], MS, false));
    assert_eq!(ini.stats().nop_pings, 1, "no ping at the interval");
    out.extend(nop_pass(&fx, &mut [&mut ini], NOP_TIMEOUT - MS, false));
    assert!(
        out.is_empty() && ini.is_ready(),
        "gave up before the timeout: {} results, {:?}",
        out.len(),
        ini.state()
    );
    out.extend(nop_pass(&fx, &mut [&mut ini], MS, false));
    assert_eq!(
        *ini.state(),
        SessionState::Failed(InitiatorError::TargetUnresponsive {
            after: NOP_INTERVAL + NOP_TIMEOUT
        })
    );
    out.extend(results_after_target_death(&mut ini, &mut || {}));
    for r in &out {
        assert!(
            matches!(r.error, Some(InitiatorError::TargetUnresponsive { .. })),
            "task {}: {:?}",
            r.ctx,
            r.error
        );
    }
    check_every_task_back(&ini, out, &pool);
    assert_eq!(ini.stats().nop_answers, 0);
    let b = SgList::from_buf(DmaBuf::alloc(512).unwrap());
    match ini.read(0, 0, 1, b, 99) {
        Err(SubmitError::NotReady(Some(b))) => assert_eq!(b.total_len(), 512),
        other => panic!("a submit on the failed session: {other:?}"),
    }
    assert!(
        fx.spin(|| (fx.pg.connections() == 0).then_some(()))
            .is_some(),
        "the target still holds the connection"
    );
}

/// A session connected on a reactor and then polled off one (here the
/// test's own thread, with no reactor current) keeps its keep-alive on
/// that reactor's clock (the cluster's manual clock, moved by hand): with
/// the target silent, one ping at `nop_interval`, the failure at
/// `nop_timeout` after it, as on the reactor.
#[test]
fn a_session_polled_off_its_reactor_keeps_its_keep_alive() {
    let fx = fixture();
    let mut ini = connect_on_reactor(&fx, fx.opts());
    fx.discover_luns(&mut ini);
    let mut results = 0;
    // The target's reactor is not polled: connected but silent.
    let mut off_reactor = |ini: &mut IserInitiator<Soft>, d: Duration| {
        fx.cl.advance(d);
        for _ in 0..NOP_ROUNDS {
            ini.poll(&mut |_| results += 1);
        }
    };
    off_reactor(&mut ini, Duration::ZERO);
    off_reactor(&mut ini, NOP_INTERVAL - MS);
    assert_eq!(ini.stats().nop_pings, 0, "pinged before the interval");
    off_reactor(&mut ini, MS);
    assert_eq!(ini.stats().nop_pings, 1, "no ping at the interval");
    off_reactor(&mut ini, NOP_TIMEOUT - MS);
    assert!(ini.is_ready(), "gave up early: {:?}", ini.state());
    off_reactor(&mut ini, MS);
    assert_eq!(
        *ini.state(),
        SessionState::Failed(InitiatorError::TargetUnresponsive {
            after: NOP_INTERVAL + NOP_TIMEOUT
        })
    );
    assert_eq!(results, 0, "no task was in flight");
}

/// `nop_interval` zero turns the keep-alive off: through 30 s of target
/// silence that fails a session with the default interval (connected
/// beside it, as the control), the session without it sends no ping and
/// stays up, and its I/O works once the target is polled again.
#[test]
fn zero_nop_interval_never_pings() {
    let fx = fixture();
    let mut o = fx.opts();
    o.nop_interval = Duration::ZERO;
    let mut off = connect_on_reactor(&fx, o);
    let mut o = fx.opts();
    o.isid[5] = 2;
    let mut on = connect_on_reactor(&fx, o);
    fx.discover_luns(&mut off);
    nop_pass(&fx, &mut [&mut off, &mut on], Duration::ZERO, true);
    for _ in 0..6 {
        nop_pass(&fx, &mut [&mut off, &mut on], NOP_INTERVAL, false);
    }
    assert!(
        matches!(
            on.state(),
            SessionState::Failed(InitiatorError::TargetUnresponsive { .. })
        ),
        "the control session: {:?}",
        on.state()
    );
    assert_eq!(on.stats().nop_pings, 1);
    assert_eq!(off.stats().nop_pings, 0, "pinged with nop_interval 0");
    assert!(off.is_ready(), "{:?}", off.state());
    let data = pattern(78, 8192);
    assert!(fx.write(&mut off, 0, 400, &data).is_good());
    let r = fx.read(&mut off, 0, 400, 8192);
    assert!(r.is_good(), "{:?}", r.sense);
    assert_eq!(r.bufs.unwrap().pop().unwrap().as_slice(), &data[..]);
    assert_eq!(off.stats().nop_pings, 0);
    logout(&fx, off);
}
