//! iSCSI session reinstatement over the soft verbs provider, with the target
//! on two reactors: session A (core 0) logs in and has writes in flight,
//! then a second login with the same InitiatorName and ISID is placed on
//! the other core. The target closes A on A's own core (by reactor
//! message): A's in-flight writes end GOOD or failed, its next I/O fails,
//! never a wrong answer; B, and a session C of another ISID, serve
//! verified I/O; at the end every connection is gone and every pool is
//! full again.
#![allow(clippy::unwrap_used)]

mod common;

use common::iser::{iscsi_target, login_step, unique_addr, Cluster as Fx};
use pollux_bdev::BdevRegistry;
use pollux_iser::initiator::scsi::{parse_read_capacity16, read_capacity16_cdb};
use pollux_iser::initiator::{
    DataDir, InitiatorOptions, IserInitiator, PiPolicy, SessionState, TaskResult,
};
use pollux_iser::target::iser::{IserOptions, PlacementPolicy};
use pollux_reactor::mem::{DmaBuf, SgList};
use pollux_verbs::soft::Soft;

const TGT: &str = "iqn.2024-01.io.pollux:reinstatement";
const INI: &str = "iqn.2024-01.io.pollux:reinstatement-host";

fn fixture() -> Fx {
    let reg = BdevRegistry::new();
    let disk = reg.create("malloc:size=8M,block=512").unwrap();
    let addr = unique_addr("pollux-iser-reinstate");
    let target = iscsi_target(TGT, &addr, vec![(0, disk)], 64);
    let opts = IserOptions {
        placement: PlacementPolicy::LeastConnections,
        ..IserOptions::for_tests()
    };
    Fx::start(2, target, addr, opts)
}

impl Fx {
    fn login(&self, isid: u8) -> IserInitiator<Soft> {
        let mut o = InitiatorOptions::new(&self.addr, INI, TGT);
        o.queue_depth = 8;
        o.pi = PiPolicy::Off;
        o.isid[5] = isid;
        let mut ini = IserInitiator::<Soft>::connect(o).unwrap();
        let ready = self.spin(|| login_step(&mut ini));
        assert!(ready.is_some(), "login did not finish");
        let b = SgList::from_buf(DmaBuf::alloc(32).unwrap());
        ini.submit(0, &read_capacity16_cdb(), DataDir::Read, Some(b), 32, 0)
            .unwrap();
        let r = self.wait(&mut ini, 1).pop().unwrap();
        assert!(r.is_good(), "READ CAPACITY(16): {:?}", r.sense);
        let d = r.bufs.unwrap().pop().unwrap();
        ini.set_geometry(0, parse_read_capacity16(d.as_slice()).unwrap());
        ini
    }

    /// Poll the target and `ini` until `n` results arrived.
    fn wait(&self, ini: &mut IserInitiator<Soft>, n: usize) -> Vec<TaskResult> {
        let mut out = Vec::new();
        let done = self.spin(|| {
            ini.poll(&mut |r| out.push(r));
            (out.len() >= n).then_some(())
        });
        assert!(done.is_some(), "only {} of {n} tasks finished", out.len());
        out
    }

    fn verified_io(&self, ini: &mut IserInitiator<Soft>, lba: u64, seed: u8) {
        let data = pattern(seed, 65536);
        ini.write(0, lba, 128, buf_of(&data), 1).unwrap();
        assert!(self.wait(ini, 1)[0].is_good(), "write");
        let b = SgList::from_buf(DmaBuf::alloc(65536).unwrap());
        ini.read(0, lba, 128, b, 2).unwrap();
        let r = self.wait(ini, 1).pop().unwrap();
        assert!(r.is_good(), "read: {:?}", r.sense);
        assert!(r.bufs.unwrap().pop().unwrap().as_slice() == &data[..]);
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u8).wrapping_mul(31) ^ seed) | 1)
        .collect()
}

fn buf_of(data: &[u8]) -> SgList {
    let mut b = DmaBuf::alloc(data.len()).unwrap();
    b.as_mut_slice().copy_from_slice(data);
    SgList::from_buf(b)
}

#[test]
fn a_second_login_with_the_same_isid_reinstates_the_session_across_cores() {
    let fx = fixture();
    let pool_total = fx.target.pool().count();
    let recv_total: Vec<usize> = fx.pgs.iter().map(|g| g.stats().recv_buffers).collect();

    let mut a = fx.login(1);
    assert_eq!(fx.conns(), [1, 0]);
    fx.verified_io(&mut a, 0, 1);
    // A has writes in flight when its successor logs in.
    for k in 0..4u64 {
        a.write(
            0,
            1024 + 128 * k,
            128,
            buf_of(&pattern(k as u8, 65536)),
            10 + k,
        )
        .unwrap();
    }
    fx.cl.poll_once_all();
    let mut b = fx.login(1);
    assert_eq!(fx.target.reinstatements(), 1);
    // A's connection is closed on core 0. The writes A had in flight end
    // either GOOD (finished before the close) or failed, never otherwise.
    let mut a_results = Vec::new();
    let dropped = fx.spin(|| {
        a.poll(&mut |r| a_results.push(r));
        (fx.conns() == [0, 1] && a_results.len() == 4).then_some(())
    });
    assert!(
        dropped.is_some(),
        "connections {:?}, A state {:?}, A results {}",
        fx.conns(),
        a.state(),
        a_results.len()
    );
    assert!(a_results.iter().all(|r| (10..14).contains(&r.ctx)));
    // A's next I/O fails cleanly: its connection is gone.
    if a.write(0, 1536, 8, buf_of(&pattern(9, 4096)), 20).is_ok() {
        let r = fx.wait(&mut a, 1).pop().unwrap();
        assert_eq!(r.ctx, 20);
        assert!(!r.is_good(), "I/O on a reinstated session succeeded");
    }
    let failed = fx.spin(|| {
        a.poll(&mut |_| {});
        matches!(a.state(), SessionState::Failed(_)).then_some(())
    });
    assert!(failed.is_some(), "A's initiator: {:?}", a.state());
    assert_eq!(fx.target.live_sessions(), 1);

    // B works; C (another ISID) coexists with it.
    fx.verified_io(&mut b, 2048, 2);
    let mut c = fx.login(2);
    assert_eq!(fx.target.reinstatements(), 1);
    assert_eq!(fx.target.live_sessions(), 2);
    fx.verified_io(&mut c, 4096, 3);
    fx.verified_io(&mut b, 2048, 4);

    drop(a);
    fx.logout(b);
    fx.logout(c);
    let back = fx.spin(|| {
        let idle: Vec<usize> = fx.pgs.iter().map(|g| g.stats().recv_buffers_idle).collect();
        (fx.conns() == [0, 0]
            && fx.transport.connections_per_group() == [0, 0]
            && fx.target.pool().available() == pool_total
            && idle == recv_total)
            .then_some(())
    });
    assert!(
        back.is_some(),
        "connections {:?}, task buffers {}/{pool_total}",
        fx.conns(),
        fx.target.pool().available()
    );
    assert_eq!(fx.target.live_sessions(), 0);
    assert_eq!(fx.transport.stats().destroyed, 3);
}
