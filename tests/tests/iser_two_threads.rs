//! The iSER target on two launched reactors (two pinned threads), our
//! initiator on the test thread over the soft verbs provider: connect
//! requests that the listener's core places on the other core travel there
//! as detached verbs requests by reactor message (between threads, not
//! just between reactors of one thread), and the sessions they become move
//! verified data. At logout the seats go back to zero and every task
//! buffer is back in the pool.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::iser::{iscsi_target, login_step};
use pollux_bdev::BdevRegistry;
use pollux_iser::initiator::scsi::{parse_read_capacity16, read_capacity16_cdb};
use pollux_iser::initiator::{
    DataDir, InitiatorOptions, IserInitiator, PiPolicy, SessionState, TaskResult,
};
use pollux_iser::target::iser::{IserOptions, IserTransport};
use pollux_reactor::mem::{DmaBuf, SgList};
use pollux_verbs::soft::Soft;

const TGT: &str = "iqn.2024-01.io.pollux:iser-two-threads";
const INI: &str = "iqn.2024-01.io.pollux:iser-two-threads-host";
const LIMIT: Duration = Duration::from_secs(30);

/// Poll `f` until it gives a value (panics after [`LIMIT`] naming `what`).
fn until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out: {what}");
        std::thread::yield_now();
    }
}

fn wait(ini: &mut IserInitiator<Soft>, n: usize) -> Vec<TaskResult> {
    let mut out = Vec::new();
    until("tasks", || {
        ini.poll(&mut |r| out.push(r));
        if let SessionState::Failed(e) = ini.state() {
            panic!("session failed: {e}");
        }
        (out.len() >= n).then_some(())
    });
    out
}

fn login(addr: &str, pi: PiPolicy) -> IserInitiator<Soft> {
    let mut o = InitiatorOptions::new(addr, INI, TGT);
    // One ISID per session: the same InitiatorName + ISID would reinstate
    // (close) the live session (RFC 7143 §6.3.5).
    static ISID: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(1);
    o.isid[5] = ISID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    o.queue_depth = 8;
    o.pi = pi;
    let mut ini = IserInitiator::<Soft>::connect(o).unwrap();
    until("login", || login_step(&mut ini));
    for lun in [0u16, 1] {
        let b = SgList::from_buf(DmaBuf::alloc(32).unwrap());
        ini.submit(lun, &read_capacity16_cdb(), DataDir::Read, Some(b), 32, 0)
            .unwrap();
        let r = wait(&mut ini, 1).pop().unwrap();
        assert!(r.is_good(), "READ CAPACITY(16): {:?}", r.sense);
        let d = r.bufs.unwrap().pop().unwrap();
        ini.set_geometry(lun, parse_read_capacity16(d.as_slice()).unwrap());
    }
    ini
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(37).wrapping_add(seed) | 2)
        .collect()
}

#[test]
fn sessions_handed_between_threads_serve_verified_io() {
    let addr = format!("@pollux-iser-two-threads-{}", std::process::id());
    let reg = BdevRegistry::new();
    let plain = reg.create("malloc:size=8M,block=512").unwrap();
    let pi = reg
        .create("malloc:size=4M,block=512,md=8,md_interleave=true,pi=1")
        .unwrap();
    let target = iscsi_target(TGT, &addr, vec![(0, plain), (1, pi)], 128);
    let transport = IserTransport::<Soft>::new(&target, IserOptions::for_tests());
    // Listen first: the first poll group created opens the listener.
    assert_eq!(transport.listen_portal_groups().unwrap(), 1);
    let t2 = Arc::clone(&transport);
    let set = common::launch_with_groups("0-1", move |r| t2.create_poll_group(r).unwrap());
    let pool_total = target.pool().count();

    // Four sessions, one after another: the cores alternate.
    let mut inis: Vec<_> = (0..4)
        .map(|k| {
            login(
                &addr,
                if k == 3 {
                    PiPolicy::Both
                } else {
                    PiPolicy::Off
                },
            )
        })
        .collect();
    assert_eq!(transport.connections_per_group(), [2, 2]);
    assert_eq!(transport.stats().accepted, 4);

    // Each session writes its own blocks (immediate data and RDMA READ),
    // then reads back what the next one wrote (served on the other core).
    for (lun, len) in [(0u16, 4096usize), (0, 131072), (1, 8192)] {
        let blocks = (len / 512) as u32;
        for (k, ini) in inis.iter_mut().enumerate() {
            let mut b = DmaBuf::alloc(len).unwrap();
            b.as_mut_slice()
                .copy_from_slice(&pattern(k as u8 + lun as u8 * 16, len));
            ini.write(lun, k as u64 * 512, blocks, SgList::from_buf(b), 0)
                .unwrap();
            let r = wait(ini, 1).pop().unwrap();
            assert!(r.is_good(), "write {len} LUN {lun}: {:?}", r.sense);
        }
        for k in 0..inis.len() {
            let from = (k + 1) % inis.len();
            let ini = &mut inis[k];
            let b = SgList::from_buf(DmaBuf::alloc(len).unwrap());
            ini.read(lun, from as u64 * 512, blocks, b, 0).unwrap();
            let r = wait(ini, 1).pop().unwrap();
            assert!(r.is_good(), "read {len} LUN {lun}: {:?}", r.sense);
            let got = r.bufs.unwrap().pop().unwrap();
            assert!(
                got.as_slice() == &pattern(from as u8 + lun as u8 * 16, len)[..],
                "session {k} read other than session {from} wrote ({len} B, LUN {lun})"
            );
        }
    }

    for mut ini in inis.drain(..) {
        ini.logout().unwrap();
        until("logout", || {
            ini.poll(&mut |_| {});
            (*ini.state() == SessionState::Closed).then_some(())
        });
    }
    until(
        "every connection destroyed, seats back to 0, task buffers back",
        || {
            (transport.stats().destroyed == 4
                && transport.connections_per_group() == [0, 0]
                && target.pool().available() == pool_total)
                .then_some(())
        },
    );
    assert_eq!(transport.stats().rejected, 0);
    set.stop_all();
    let _ = set.join();
}
