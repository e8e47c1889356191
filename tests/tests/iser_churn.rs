//! iSER connection churn in one process over the soft provider: sessions
//! log in, write and read back, and go (logout, dropped without a word, or
//! killed mid-I/O), with refused logins mixed in; every
//! `POLLUX_SOAK_SAMPLE_EVERY` (50) cycles, with no session left, the process's descriptors, mappings and
//! RSS must stay within the stated slack of the warm-up's highest, and the
//! target's task buffers must all be back. Also: the transport's
//! connection limit refuses the connection beyond it cleanly, and serves
//! again once one goes; a connection the target ends for a malformed PDU
//! behind writes in flight gives back its task buffers, session and seat.
//!
//! Its own test binary: the samples are the whole process's, so nothing
//! else may run beside the soak.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicU32, Ordering};

use common::churn::{env_or, Sample, SLACK};
use common::iser::{iscsi_target, unique_addr, Cluster, SPINS};
use pollux_bdev::BdevRegistry;
use pollux_iser::initiator::scsi::{parse_read_capacity16, read_capacity16_cdb};
use pollux_iser::initiator::{DataDir, InitiatorOptions, IserInitiator, SessionState, TaskResult};
use pollux_iser::target::iser::IserOptions;
use pollux_reactor::mem::{DmaBuf, SgList};
use pollux_verbs::soft::Soft;

const TGT: &str = "iqn.2024-01.io.pollux:iser-churn";
const INI: &str = "iqn.2024-01.io.pollux:iser-churn-host";
/// Samples of the warm-up: the first 4 (200 cycles at the default
/// `POLLUX_SOAK_SAMPLE_EVERY` of 50).
const WARMUP_SAMPLES: u64 = 4;

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
    static ISID: AtomicU32 = AtomicU32::new(1);
    let mut o = InitiatorOptions::new(&c.addr, INI, target_name);
    o.queue_depth = 8;
    let n = ISID.fetch_add(1, Ordering::Relaxed).to_be_bytes();
    o.isid = [0x80, 0, n[0], n[1], n[2], n[3]];
    let mut ini = IserInitiator::<Soft>::connect(o).map_err(|e| e.to_string())?;
    let mut ready = false;
    for _ in 0..SPINS {
        c.cl.poll_once_all();
        ini.poll(&mut |_| {});
        match ini.state() {
            SessionState::Ready => {
                ready = true;
                break;
            }
            SessionState::Failed(e) => return Err(e.to_string()),
            _ => {}
        }
    }
    if !ready {
        return Err("login did not finish".into());
    }
    let bufs = SgList::from_buf(DmaBuf::alloc(32).map_err(|e| e.to_string())?);
    ini.submit(0, &read_capacity16_cdb(), DataDir::Read, Some(bufs), 32, 9)
        .map_err(|e| format!("{e:?}"))?;
    let r = wait(c, &mut ini);
    let d = r.bufs.and_then(|mut b| b.pop()).ok_or("no capacity data")?;
    let g = parse_read_capacity16(d.as_slice()).ok_or("bad capacity data")?;
    ini.set_geometry(0, g);
    Ok(ini)
}

fn wait(c: &Cluster, ini: &mut IserInitiator<Soft>) -> TaskResult {
    let mut out = None;
    for _ in 0..SPINS {
        c.cl.poll_once_all();
        ini.poll(&mut |r| out = Some(r));
        if let Some(r) = out.take() {
            return r;
        }
        if let SessionState::Failed(e) = ini.state() {
            panic!("session failed: {e}");
        }
    }
    panic!("a task did not finish");
}

fn pattern(seed: u64) -> Vec<u8> {
    (0..4096u64)
        .map(|i| (i.wrapping_mul(29) ^ seed) as u8)
        .collect()
}

/// Write 4 KiB at `lba`, read it back, compare.
fn verified_io(c: &Cluster, ini: &mut IserInitiator<Soft>, lba: u64, seed: u64) {
    let data = pattern(seed);
    let mut b = DmaBuf::alloc(4096).unwrap();
    b.as_mut_slice().copy_from_slice(&data);
    ini.write(0, lba, 8, SgList::from_buf(b), 1).unwrap();
    let w = wait(c, ini);
    assert!(w.is_good(), "write: {:?}", w.sense);
    ini.read(0, lba, 8, SgList::from_buf(DmaBuf::alloc(4096).unwrap()), 2)
        .unwrap();
    let r = wait(c, ini);
    assert!(r.is_good(), "read: {:?}", r.sense);
    assert_eq!(r.bufs.unwrap().pop().unwrap().as_slice(), &data[..]);
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
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn iser_churn_returns_everything() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let every = env_or("POLLUX_SOAK_SAMPLE_EVERY", 50);
    let total = env_or("POLLUX_SOAK_CYCLES", 1000).max(every * (WARMUP_SAMPLES + 1));
    let c = fixture(IserOptions::for_tests());
    let mut warm: Option<Sample> = None;
    let mut tally = [0u64; 4];
    println!("cycle,fds,maps,rss_kib,accepted,destroyed");
    for n in 1..=total {
        match n % 10 {
            3 => {
                // Refused: no such target node.
                let Err(e) = login(&c, "iqn.2024-01.io.pollux:no-such-node") else {
                    panic!("cycle {n}: a login to an unknown node was accepted");
                };
                assert!(!e.is_empty());
                tally[3] += 1;
            }
            k => {
                let mut ini = login(&c, TGT).unwrap_or_else(|e| panic!("cycle {n}: {e}"));
                verified_io(&c, &mut ini, (n % 512) * 8, n);
                match k {
                    5 => {
                        // Killed mid-I/O: a write in flight, the link cut.
                        let mut b = DmaBuf::alloc(4096).unwrap();
                        b.as_mut_slice().fill(n as u8);
                        ini.write(0, 0, 8, SgList::from_buf(b), 3).unwrap();
                        c.cl.poll_once_all();
                        ini.cm_id().unwrap().kill();
                        drop(ini);
                        tally[1] += 1;
                    }
                    7 => {
                        // Dropped without a logout.
                        drop(ini);
                        tally[2] += 1;
                    }
                    _ => {
                        c.logout(ini);
                        tally[0] += 1;
                    }
                }
            }
        }
        if n % every == 0 {
            settle(&c);
            let s = Sample::of(None);
            let st = c.transport.stats();
            println!(
                "{n},{},{},{},{},{}",
                s.fds, s.maps, s.rss_kib, st.accepted, st.destroyed
            );
            assert_eq!(st.accepted, st.destroyed);
            if n <= every * WARMUP_SAMPLES {
                warm = Some(warm.map_or(s, |w| w.max(s)));
            } else {
                s.check("process", n, warm.unwrap(), SLACK);
            }
        }
    }
    println!(
        "iser churn: {} logouts, {} killed, {} dropped, {} refused",
        tally[0], tally[1], tally[2], tally[3]
    );
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
