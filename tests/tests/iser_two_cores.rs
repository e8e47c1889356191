//! The iSER target on two reactors of one `TestCluster`, with our
//! initiator over the soft verbs provider: the poll group that owns the
//! listener checks each connect request and places the connection on the
//! group with the fewest connections (`pollux_verbs::placement`), handing
//! it to the other core by reactor message when that is the one; both
//! cores then serve sessions that log in and move verified data (immediate
//! data, solicited Data-Out by RDMA READ, Data-In by RDMA WRITE, T10 PI).
//! At logout every connection is destroyed on its own core, the seats go
//! back to zero and every buffer pool is full again.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicU8, Ordering};

use common::iser::{iscsi_target, login_step, unique_addr, Cluster as Fx};
use pollux_bdev::BdevRegistry;
use pollux_iser::initiator::scsi::{parse_read_capacity16, read_capacity16_cdb};
use pollux_iser::initiator::{
    DataDir, InitiatorOptions, IserInitiator, PiPolicy, SessionState, TaskResult,
};
use pollux_iser::target::iser::{IserOptions, PlacementPolicy};
use pollux_reactor::mem::{DmaBuf, SgList};
use pollux_verbs::soft::Soft;

const TGT: &str = "iqn.2024-01.io.pollux:iser-two-cores";
const INI: &str = "iqn.2024-01.io.pollux:iser-two-cores-host";

/// A target with a plain LUN 0 and a Type 1 PI LUN 1, one iSER poll group
/// on each of two reactors, listening on one address (owned by group 0).
fn fixture(placement: PlacementPolicy) -> Fx {
    let reg = BdevRegistry::new();
    let plain = reg.create("malloc:size=8M,block=512").unwrap();
    let pi = reg
        .create("malloc:size=4M,block=512,md=8,md_interleave=true,pi=1")
        .unwrap();
    let addr = unique_addr("pollux-iser-two-cores");
    let target = iscsi_target(TGT, &addr, vec![(0, plain), (1, pi)], 128);
    let opts = IserOptions {
        placement,
        ..IserOptions::for_tests()
    };
    let fx = Fx::start(2, target, addr, opts);
    assert_eq!(fx.pgs[1].listeners(), 0, "group 0 owns the listener");
    fx
}

impl Fx {
    /// Log in a session (queue depth 8, `pi` policy) and read LUN 0's and
    /// LUN 1's geometry.
    fn login(&self, pi: PiPolicy) -> IserInitiator<Soft> {
        let mut o = InitiatorOptions::new(&self.addr, INI, TGT);
        // One ISID per session: the same InitiatorName + ISID would
        // reinstate (close) the live session (RFC 7143 §6.3.5).
        static ISID: AtomicU8 = AtomicU8::new(1);
        o.isid[5] = ISID.fetch_add(1, Ordering::Relaxed);
        o.queue_depth = 8;
        o.pi = pi;
        let mut ini = IserInitiator::<Soft>::connect(o).unwrap();
        let ready = self.spin(|| login_step(&mut ini));
        assert!(ready.is_some(), "login did not finish");
        for lun in [0u16, 1] {
            let b = SgList::from_buf(DmaBuf::alloc(32).unwrap());
            ini.submit(lun, &read_capacity16_cdb(), DataDir::Read, Some(b), 32, 0)
                .unwrap();
            let r = self.wait(&mut [&mut ini], 1).pop().unwrap();
            assert!(r.is_good(), "READ CAPACITY(16): {:?}", r.sense);
            let d = r.bufs.unwrap().pop().unwrap();
            ini.set_geometry(lun, parse_read_capacity16(d.as_slice()).unwrap());
        }
        ini
    }

    /// Poll the target and every session until `n` results arrived.
    fn wait(&self, inis: &mut [&mut IserInitiator<Soft>], n: usize) -> Vec<TaskResult> {
        let mut out = Vec::new();
        let done = self.spin(|| {
            for ini in inis.iter_mut() {
                ini.poll(&mut |r| out.push(r));
                if let SessionState::Failed(e) = ini.state() {
                    panic!("session failed: {e}");
                }
            }
            (out.len() >= n).then_some(())
        });
        assert!(done.is_some(), "only {} of {n} tasks finished", out.len());
        out
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u8).wrapping_mul(29) ^ seed).wrapping_add(seed >> 1) | 1)
        .collect()
}

fn buf_of(data: &[u8]) -> SgList {
    let mut b = DmaBuf::alloc(data.len()).unwrap();
    b.as_mut_slice().copy_from_slice(data);
    SgList::from_buf(b)
}

/// Every session writes its own pattern at its own LBAs (all writes in
/// flight at once), then reads back what the *next* session wrote: data
/// written through one core is read through the other.
fn cross_verified_io(fx: &Fx, inis: &mut [IserInitiator<Soft>], lun: u16, len: usize) {
    let blocks = (len / 512) as u32;
    let lba = |k: usize| 4096 * lun as u64 + (k as u64) * u64::from(blocks);
    for (k, ini) in inis.iter_mut().enumerate() {
        let data = pattern(k as u8 * 7 + len as u8, len);
        ini.write(lun, lba(k), blocks, buf_of(&data), k as u64)
            .unwrap();
    }
    let n = inis.len();
    let mut refs: Vec<&mut IserInitiator<Soft>> = inis.iter_mut().collect();
    let res = fx.wait(&mut refs, n);
    for r in &res {
        assert!(
            r.is_good(),
            "write {len} (session {}): {:?}",
            r.ctx,
            r.sense
        );
    }
    for (k, ini) in inis.iter_mut().enumerate() {
        let b = SgList::from_buf(DmaBuf::alloc(len).unwrap());
        ini.read(lun, lba((k + 1) % n), blocks, b, k as u64)
            .unwrap();
    }
    let mut refs: Vec<&mut IserInitiator<Soft>> = inis.iter_mut().collect();
    for r in fx.wait(&mut refs, n) {
        assert!(r.is_good(), "read {len} (session {}): {:?}", r.ctx, r.sense);
        let from = (r.ctx as usize + 1) % n;
        let want = pattern(from as u8 * 7 + len as u8, len);
        let got = r.bufs.unwrap().pop().unwrap();
        assert!(
            got.as_slice() == &want[..],
            "session {} read back other than session {from} wrote ({len} B, LUN {lun})",
            r.ctx
        );
    }
}

#[test]
fn sessions_spread_over_both_cores_serve_verified_io_and_give_everything_back() {
    let fx = fixture(PlacementPolicy::LeastConnections);
    let pool_total = fx.target.pool().count();
    let recv_total: Vec<usize> = fx.pgs.iter().map(|g| g.stats().recv_buffers).collect();

    // Four sessions: group 0 (both empty, the turn starts there), then the
    // cores alternate: 0, 1, 0, 1. Two of them travel to core 1.
    let mut inis: Vec<_> = (0..4)
        .map(|k| {
            let pi = if k % 2 == 1 {
                PiPolicy::Both
            } else {
                PiPolicy::Off
            };
            fx.login(pi)
        })
        .collect();
    assert_eq!(fx.conns(), [2, 2], "connections per core");
    assert_eq!(fx.transport.connections_per_group(), [2, 2]);
    let (s0, s1) = (fx.pgs[0].stats(), fx.pgs[1].stats());
    assert_eq!((s0.handed_off, s0.adopted), (2, 0), "{s0:?}");
    assert_eq!((s1.handed_off, s1.adopted), (0, 2), "{s1:?}");

    // Immediate data (512 B, 8 KiB), solicited Data-Out by RDMA READ
    // (64 KiB, 128 KiB), on the plain LUN and on the PI LUN (sessions 1
    // and 3, on core 1, generate and verify PI; 0 and 2 send none and the
    // target's bdev layer inserts and strips it).
    for len in [512usize, 8192, 65536, 131072] {
        cross_verified_io(&fx, &mut inis, 0, len);
    }
    for len in [512usize, 4096, 65536] {
        cross_verified_io(&fx, &mut inis, 1, len);
    }
    let (s0, s1) = (fx.pgs[0].stats(), fx.pgs[1].stats());
    assert!(s0.pdus > 20 && s1.pdus > 20, "{s0:?} {s1:?}");
    assert_eq!(fx.transport.stats().accepted, 4);

    // Log out: each connection is destroyed on its own core.
    for ini in inis.drain(..) {
        fx.logout(ini);
    }
    let gone = fx.spin(|| (fx.conns() == [0, 0]).then_some(()));
    assert!(gone.is_some(), "connections left: {:?}", fx.conns());
    assert_eq!(fx.transport.connections_per_group(), [0, 0], "seats");
    assert_eq!(fx.transport.stats().destroyed, 4);
    assert_eq!(fx.transport.stats().rejected, 0);
    let back = fx.spin(|| {
        let idle: Vec<usize> = fx.pgs.iter().map(|g| g.stats().recv_buffers_idle).collect();
        (fx.target.pool().available() == pool_total && idle == recv_total).then_some(())
    });
    assert!(
        back.is_some(),
        "task buffers {}/{pool_total}, receive buffers {:?}/{recv_total:?}",
        fx.target.pool().available(),
        fx.pgs
            .iter()
            .map(|g| g.stats().recv_buffers_idle)
            .collect::<Vec<_>>()
    );

    // The seats balance again: the next session goes to group 0 or 1 and a
    // second one to the other.
    let a = fx.login(PiPolicy::Off);
    let b = fx.login(PiPolicy::Off);
    assert_eq!(fx.conns(), [1, 1]);
    fx.logout(a);
    fx.logout(b);
    assert!(fx
        .spin(
            || (fx.transport.connections_per_group() == [0, 0] && fx.conns() == [0, 0])
                .then_some(())
        )
        .is_some());
}

#[test]
fn an_initiator_dying_on_the_other_core_is_torn_down_there() {
    let fx = fixture(PlacementPolicy::LeastConnections);
    let pool_total = fx.target.pool().count();
    let mut a = fx.login(PiPolicy::Off);
    let mut b = fx.login(PiPolicy::Off);
    assert_eq!(fx.conns(), [1, 1]);
    // Session b (core 1) dies with I/O in flight.
    for k in 0..4u64 {
        let data = pattern(k as u8, 65536);
        b.write(0, 256 * k, 128, buf_of(&data), k).unwrap();
    }
    fx.cl.poll_once_all();
    b.cm_id().unwrap().kill();
    drop(b);
    let gone = fx.spin(|| (fx.conns() == [1, 0]).then_some(()));
    assert!(gone.is_some(), "connections: {:?}", fx.conns());
    assert_eq!(fx.transport.connections_per_group(), [1, 0]);
    // Session a (core 0) goes on.
    let data = pattern(99, 4096);
    a.write(0, 4000, 8, buf_of(&data), 1).unwrap();
    assert!(fx.wait(&mut [&mut a], 1)[0].is_good());
    a.read(
        0,
        4000,
        8,
        SgList::from_buf(DmaBuf::alloc(4096).unwrap()),
        2,
    )
    .unwrap();
    let r = fx.wait(&mut [&mut a], 1).pop().unwrap();
    assert!(r.is_good());
    assert!(r.bufs.unwrap().pop().unwrap().as_slice() == &data[..]);
    // The next session fills the free seat on core 1.
    let c = fx.login(PiPolicy::Off);
    assert_eq!(fx.conns(), [1, 1]);
    fx.logout(a);
    fx.logout(c);
    let back = fx.spin(|| {
        (fx.conns() == [0, 0]
            && fx.transport.connections_per_group() == [0, 0]
            && fx.target.pool().available() == pool_total)
            .then_some(())
    });
    assert!(
        back.is_some(),
        "connections {:?}, seats {:?}, task buffers {}/{pool_total}",
        fx.conns(),
        fx.transport.connections_per_group(),
        fx.target.pool().available()
    );
    assert_eq!(fx.transport.stats().destroyed, 3);
}

#[test]
fn listener_core_placement_keeps_every_session_on_the_listeners_core() {
    let fx = fixture(PlacementPolicy::ListenerCore);
    let mut inis: Vec<_> = (0..3).map(|_| fx.login(PiPolicy::Off)).collect();
    assert_eq!(fx.conns(), [3, 0]);
    assert_eq!(fx.transport.connections_per_group(), [3, 0]);
    assert_eq!(fx.pgs[0].stats().handed_off, 0);
    assert_eq!(fx.pgs[1].stats().adopted, 0);
    cross_verified_io(&fx, &mut inis, 0, 8192);
    for ini in inis.drain(..) {
        fx.logout(ini);
    }
    assert!(fx
        .spin(|| (fx.transport.connections_per_group() == [0, 0]).then_some(()))
        .is_some());
}

#[test]
fn a_stopped_group_takes_no_new_session() {
    let fx = fixture(PlacementPolicy::LeastConnections);
    // Group 1 shuts down: every session lands on group 0.
    fx.pgs[1].shutdown();
    let a = fx.login(PiPolicy::Off);
    let b = fx.login(PiPolicy::Off);
    assert_eq!(fx.conns(), [2, 0]);
    assert_eq!(fx.pgs[0].stats().handed_off, 0);
    fx.logout(a);
    fx.logout(b);
    assert!(fx
        .spin(|| (fx.transport.connections_per_group() == [0, 0]).then_some(()))
        .is_some());
}
