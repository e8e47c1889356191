//! iSER connection churn in one process over the soft provider: sessions
//! log in, write and read back, and go (logout, dropped without a word,
//! killed mid-I/O, or stopped: alive but silent, until the target's NOP-In
//! ping goes unanswered and it drops them), with logins refused for an
//! unknown node and connections refused beyond `max_connections` mixed in;
//! every
//! `POLLUX_SOAK_SAMPLE_EVERY` (50) cycles, with no session left, the process's descriptors, mappings and
//! RSS must stay within the stated slack of the warm-up's highest, and the
//! target's task buffers must all be back. Also: the transport's
//! connection limit refuses the connection beyond it cleanly, and serves
//! again once one goes; a connection the target ends for a malformed PDU
//! behind writes in flight, or because a command's STag made its RDMA
//! READ or WRITE fail, gives back its task buffers, session and seat.
//!
//! Its own test binary: the samples are the whole process's, so nothing
//! else may run beside the soak.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::churn::{env_or, Sample, SLACK};
use common::iser::{iscsi_target, unique_addr, Cluster};
use common::iser_io;
use pollux_bdev::BdevRegistry;
use pollux_iser::initiator::scsi::rw16_cdb;
use pollux_iser::initiator::{IserInitiator, SessionState};
use pollux_iser::pdu::{Bhs, IserHeader, Lun, ScsiCommand, Stag, TaskAttr};
use pollux_iser::target::iser::IserOptions;
use pollux_reactor::mem::{DmaBuf, SgList};
use pollux_verbs::soft::Soft;

const TGT: &str = "iqn.2024-01.io.pollux:iser-churn";
const INI: &str = "iqn.2024-01.io.pollux:iser-churn-host";
/// Samples of the warm-up: the first 4 (200 cycles at the default
/// `POLLUX_SOAK_SAMPLE_EVERY` of 50).
const WARMUP_SAMPLES: u64 = 4;
/// The churn target's `nop_in_interval` and `nop_timeout` (the clock is
/// the test cluster's manual one: it moves only when a cycle moves it).
const NOP: Duration = Duration::from_secs(1);
/// The churn target's `max_connections`.
const MAX_CONNECTIONS: usize = 4;
/// Cluster polls that let a ping and its answer cross.
const ROUNDS: usize = 200;

/// What cycle `n` of the churn does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Logout,
    Killed,
    Dropped,
    Refused,
    Stopped,
    OverLimit,
}

fn kind(n: u64) -> Kind {
    match n % 10 {
        1 => Kind::OverLimit,
        3 => Kind::Refused,
        5 => Kind::Killed,
        7 => Kind::Dropped,
        9 => Kind::Stopped,
        _ => Kind::Logout,
    }
}

fn fixture(opts: IserOptions) -> Cluster {
    let lun = BdevRegistry::new()
        .create("malloc:size=4M,block=512")
        .unwrap();
    let addr = unique_addr("pollux-iser-churn");
    let target = iscsi_target(TGT, &addr, vec![(0, lun)], 64);
    Cluster::start(1, target, addr, opts)
}

/// Log in to `target_name` (a session of its own: a fresh ISID) and read
/// LUN 0's capacity: the session, or why it failed.
fn login(c: &Cluster, target_name: &str) -> Result<IserInitiator<Soft>, String> {
    iser_io::login(&c.addr, INI, target_name, &mut || {
        c.cl.poll_once_all();
    })
}

/// Write 4 KiB at `lba`, read it back, compare.
fn verified_io(c: &Cluster, ini: &mut IserInitiator<Soft>, lba: u64, seed: u64) {
    iser_io::verified_io(ini, lba, seed, &mut || {
        c.cl.poll_once_all();
    })
    .unwrap_or_else(|e| panic!("verified I/O: {e}"));
}

/// Poll until the target serves no connection and has every task buffer
/// back.
fn settle(c: &Cluster) {
    let total = c.target.pool().count();
    let idle = c.spin(|| {
        (c.conns().iter().sum::<usize>() == 0 && c.target.pool().available() == total).then_some(())
    });
    assert!(
        idle.is_some(),
        "connections {:?}, task buffers {}/{total}",
        c.conns(),
        c.target.pool().available()
    );
}

/// The soak samples the whole process: the other tests here wait for it.
static SERIAL: pollux_reactor::sync::Mutex<()> = pollux_reactor::sync::Mutex::new(());

#[test]
fn iser_churn_returns_everything() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let every = env_or("POLLUX_SOAK_SAMPLE_EVERY", 50);
    let total = env_or("POLLUX_SOAK_CYCLES", 1000).max(every * (WARMUP_SAMPLES + 1));
    let c = fixture(IserOptions {
        nop_in_interval: NOP,
        nop_timeout: NOP,
        max_connections: MAX_CONNECTIONS,
        ..IserOptions::for_tests()
    });
    let mut warm: Option<Sample> = None;
    let mut tally = [0u64; 6];
    println!("cycle,fds,maps,rss_kib,accepted,destroyed,rejected,nop_timeouts");
    for n in 1..=total {
        let k = kind(n);
        match k {
            Kind::Refused => {
                // Refused: no such target node.
                let Err(e) = login(&c, "iqn.2024-01.io.pollux:no-such-node") else {
                    panic!("cycle {n}: a login to an unknown node was accepted");
                };
                assert!(!e.is_empty());
            }
            Kind::OverLimit => over_limit(&c, n),
            Kind::Stopped => stopped(&c, n),
            _ => {
                let mut ini = login(&c, TGT).unwrap_or_else(|e| panic!("cycle {n}: {e}"));
                verified_io(&c, &mut ini, (n % 512) * 8, n);
                match k {
                    Kind::Killed => {
                        // Killed mid-I/O: a write in flight, the link cut.
                        let mut b = DmaBuf::alloc(4096).unwrap();
                        b.as_mut_slice().fill(n as u8);
                        ini.write(0, 0, 8, SgList::from_buf(b), 3).unwrap();
                        c.cl.poll_once_all();
                        ini.cm_id().unwrap().kill();
                        drop(ini);
                    }
                    // Dropped without a logout.
                    Kind::Dropped => drop(ini),
                    _ => c.logout(ini),
                }
            }
        }
        tally[k as usize] += 1;
        if n % every == 0 {
            settle(&c);
            let s = Sample::of(None);
            let st = c.transport.stats();
            let nop_timeouts = c.target.nop_timeouts();
            println!(
                "{n},{},{},{},{},{},{},{nop_timeouts}",
                s.fds, s.maps, s.rss_kib, st.accepted, st.destroyed, st.rejected
            );
            assert_eq!(st.accepted, st.destroyed);
            let stopped = (1..=n).filter(|&m| kind(m) == Kind::Stopped).count() as u64;
            assert_eq!(
                nop_timeouts, stopped,
                "every stopped initiator (and nothing else) ended by a NOP timeout"
            );
            if n <= every * WARMUP_SAMPLES {
                warm = Some(warm.map_or(s, |w| w.max(s)));
            } else {
                s.check("process", n, warm.unwrap(), SLACK);
            }
        }
    }
    println!(
        "iser churn: {} logouts, {} killed, {} dropped, {} refused, {} stopped ({} NOP timeouts counted), {} over the connection limit",
        tally[Kind::Logout as usize],
        tally[Kind::Killed as usize],
        tally[Kind::Dropped as usize],
        tally[Kind::Refused as usize],
        tally[Kind::Stopped as usize],
        c.target.nop_timeouts(),
        tally[Kind::OverLimit as usize]
    );
}

/// NOP-In pings the target sent so far.
fn pings(c: &Cluster) -> u64 {
    c.pgs.iter().map(|g| g.stats().nop_pings).sum()
}

/// Move the manual clock by `d`, then poll the target (and `ini`, when
/// given, as a live initiator does) `ROUNDS` times.
fn pass(c: &Cluster, d: Duration, mut ini: Option<&mut IserInitiator<Soft>>) {
    c.cl.advance(d);
    for _ in 0..ROUNDS {
        c.cl.poll_once_all();
        if let Some(i) = ini.as_deref_mut() {
            i.poll(&mut |_| {});
        }
    }
}

/// A stopped initiator: it logs in and does verified I/O; while it polls,
/// the target's pings are answered and the session lives on; then it
/// stops reading and sending without a logout (its QP alive), and the
/// target must ping it, drop it at `nop_timeout`, count it and give back
/// everything it held.
fn stopped(c: &Cluster, n: u64) {
    // Alone on the target: only this connection sees the clock move.
    settle(c);
    let mut ini = login(c, TGT).unwrap_or_else(|e| panic!("cycle {n}: {e}"));
    verified_io(c, &mut ini, (n % 512) * 8, n);
    let (p0, t0) = (pings(c), c.target.nop_timeouts());
    pass(c, NOP, Some(&mut ini));
    assert_eq!(pings(c), p0 + 1, "cycle {n}: no ping after nop_in_interval");
    pass(c, NOP, Some(&mut ini));
    assert_eq!(
        (c.conns(), c.target.nop_timeouts()),
        (vec![1], t0),
        "cycle {n}: a live initiator answering the ping was dropped"
    );
    verified_io(c, &mut ini, (n % 512) * 8, n + 1);
    // Stopped: no more polls of `ini`.
    let p1 = pings(c);
    pass(c, NOP, None);
    assert_eq!(
        pings(c),
        p1 + 1,
        "cycle {n}: the stopped initiator was not pinged"
    );
    c.cl.advance(NOP);
    let gone = c.spin(|| (c.conns() == [0]).then_some(()));
    assert!(
        gone.is_some(),
        "cycle {n}: the stopped initiator was not dropped ({} NOP timeouts, {:?})",
        c.target.nop_timeouts(),
        c.pgs[0].stats()
    );
    assert_eq!(c.target.nop_timeouts(), t0 + 1);
    assert_eq!(
        c.target.live_sessions(),
        0,
        "cycle {n}: its session is gone"
    );
    settle(c);
    drop(ini);
}

/// `MAX_CONNECTIONS` sessions at once, then one more that the connection
/// limit refuses; the held ones keep working, and go.
fn over_limit(c: &Cluster, n: u64) {
    settle(c);
    let rejected = c.transport.stats().rejected;
    let mut held: Vec<_> = (0..MAX_CONNECTIONS)
        .map(|_| login(c, TGT).unwrap_or_else(|e| panic!("cycle {n}: {e}")))
        .collect();
    assert!(
        login(c, TGT).is_err(),
        "cycle {n}: a connection beyond max_connections {MAX_CONNECTIONS} was served"
    );
    assert!(c.transport.stats().rejected > rejected);
    verified_io(c, &mut held[0], (n % 512) * 8, n);
    for ini in held {
        c.logout(ini);
    }
}

#[test]
fn iser_bad_pdu_mid_io_returns_everything() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let c = fixture(IserOptions::for_tests());
    let mut ini = login(&c, TGT).unwrap();
    verified_io(&c, &mut ini, 0, 1);
    let sessions = c.target.live_sessions();
    assert_eq!(sessions, 1);
    // Four writes in flight (the target reads their data by RDMA READ)...
    for k in 0..4u64 {
        let mut b = DmaBuf::alloc(4096).unwrap();
        b.as_mut_slice().fill(k as u8);
        ini.write(0, k * 8, 8, SgList::from_buf(b), 10 + k).unwrap();
    }
    // ...and behind them a SEND too short for an iSER header.
    assert!(ini.send_raw(&[0x10, 0, 0]), "the bad PDU was not sent");
    let failed = c.spin(|| {
        ini.poll(&mut |_| {});
        matches!(ini.state(), SessionState::Failed(_)).then_some(())
    });
    assert!(failed.is_some(), "the target kept the connection");
    drop(ini);
    // No connection, every task buffer back, the session gone.
    settle(&c);
    assert_eq!(c.target.live_sessions(), 0, "the session is gone");
    let st = c.transport.stats();
    assert_eq!(st.accepted, st.destroyed);
    assert_eq!(c.transport.connections_per_group(), vec![0], "seats free");
    // The next initiator is served.
    let mut again = login(&c, TGT).unwrap();
    verified_io(&c, &mut again, 16, 2);
    c.logout(again);
    settle(&c);
}

/// One SEND of a SCSI WRITE (or READ) of 8 blocks at LBA 0 of LUN 0
/// whose iSER header hands the target a write (read) STag that no
/// registration of the initiator carries. Immediate: it needs no CmdSN of
/// the session's.
fn bogus_stag_command(write: bool) -> Vec<u8> {
    let bogus = Some(Stag {
        stag: 0xBAD5_7A00,
        va: 0x1000,
    });
    let hdr = IserHeader::Control {
        write: if write { bogus } else { None },
        read: if write { None } else { bogus },
    };
    let cmd = ScsiCommand {
        immediate: true,
        final_: true,
        read: !write,
        write,
        attr: TaskAttr::Simple,
        lun: Lun::from_index(0),
        itt: 0x0BAD_0001,
        edtl: 4096,
        cmd_sn: 0,
        exp_stat_sn: 0,
        cdb: rw16_cdb(write, 0, 8, 0),
    };
    let mut v = hdr.encode().to_vec();
    v.extend_from_slice(&Bhs::ScsiCmd(cmd).encode(0, 0));
    v
}

/// A WRITE whose write STag (then a READ whose read STag) is bogus, after
/// a good login and verified I/O: the target's RDMA READ (WRITE) fails
/// with a remote access error, the initiator sees its session fail, the
/// target tears the connection down and gives back the session, the seat,
/// every task and receive buffer (accepted = destroyed), and the next
/// login is served.
#[test]
fn iser_bogus_stag_ends_the_connection_cleanly() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let c = fixture(IserOptions::for_tests());
    let recv_total = c.pgs[0].stats().recv_buffers;
    for (n, write) in [(1u64, true), (2, false)] {
        let what = if write { "write" } else { "read" };
        let mut ini = login(&c, TGT).unwrap();
        verified_io(&c, &mut ini, 8 * n, n);
        assert_eq!(c.target.live_sessions(), 1);
        let wc_errors = c.pgs[0].stats().wc_errors;
        assert!(
            ini.send_raw(&bogus_stag_command(write)),
            "the {what} was not sent"
        );
        let failed = c.spin(|| {
            ini.poll(&mut |_| {});
            matches!(ini.state(), SessionState::Failed(_)).then_some(())
        });
        assert!(
            failed.is_some(),
            "bogus {what} STag: the session lives on ({:?})",
            ini.state()
        );
        drop(ini);
        settle(&c);
        assert!(
            c.pgs[0].stats().wc_errors > wc_errors,
            "bogus {what} STag: no failed work request at the target"
        );
        assert_eq!(c.target.live_sessions(), 0, "{what}: the session is gone");
        let st = c.transport.stats();
        assert_eq!(st.accepted, st.destroyed, "{what}: {st:?}");
        assert_eq!(c.transport.connections_per_group(), vec![0], "seats free");
        let idle = c.spin(|| (c.pgs[0].stats().recv_buffers_idle == recv_total).then_some(()));
        assert!(
            idle.is_some(),
            "{what}: receive buffers {}/{recv_total}",
            c.pgs[0].stats().recv_buffers_idle
        );
    }
    // The next initiator is served.
    let mut again = login(&c, TGT).unwrap();
    verified_io(&c, &mut again, 24, 3);
    c.logout(again);
    settle(&c);
}

#[test]
fn iser_connection_limit_refuses_cleanly_and_serves_again() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let c = fixture(IserOptions {
        max_connections: 2,
        ..IserOptions::for_tests()
    });
    let mut a = login(&c, TGT).unwrap();
    let b = login(&c, TGT).unwrap();
    let refused = login(&c, TGT);
    assert!(
        refused.is_err(),
        "a third connection beyond max_connections 2: loads {:?}, {:?}",
        c.transport.connections_per_group(),
        c.transport.stats()
    );
    assert!(c.transport.stats().rejected >= 1);
    verified_io(&c, &mut a, 8, 1);
    c.logout(b);
    settle_one(&c, 1);
    let mut again = login(&c, TGT).unwrap();
    verified_io(&c, &mut again, 16, 2);
    c.logout(again);
    c.logout(a);
    settle(&c);
}

fn settle_one(c: &Cluster, n: usize) {
    assert!(c
        .spin(|| (c.conns().iter().sum::<usize>() == n).then_some(()))
        .is_some());
}
