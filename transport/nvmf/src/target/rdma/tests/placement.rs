//! Queue placement over two poll groups (two reactors of one
//! [`TestCluster`](pollux_reactor::TestCluster)): the group that owns the
//! listener validates each connect request and hands the queue to the
//! group with the fewest queues; that group accepts, serves and destroys it
//! on its own core.

use super::host::{spin, Host};
use super::{fixture_on, pattern, rw, Fx, NQN};
use crate::spec::sgl::SglDescriptor;
use crate::target::rdma::{QueuePlacement, RdmaOptions};

impl Fx {
    /// Live connections per poll group.
    fn conns(&self) -> Vec<usize> {
        self.pgs.iter().map(|g| g.connections()).collect()
    }

    /// I/O queue `qid` of controller `cntlid`.
    fn io_qid(&self, cntlid: u16, qid: u16, depth: u16) -> Host {
        let mut h = Host::connect(&self.cl, &self.addr, qid, depth);
        let cpl = h.fabrics_connect(&self.cl, qid, NQN, cntlid);
        assert!(
            cpl.status.is_success(),
            "I/O connect {qid}: {:?}",
            cpl.status
        );
        h
    }

    /// Data buffers in every core's cache of the data pool.
    fn cached_all(&self) -> usize {
        (0..self.pgs.len() as u32)
            .map(|c| self.cl.on(c, |r| self.target.core_ctx(r).cached_buffers()))
            .sum()
    }
}

/// Write `len` bytes of a pattern at `lba` through `io` (in capsule up to
/// 16 KiB, else RDMA READ from the host), read them back by RDMA WRITE,
/// and compare.
fn write_read_verify(fx: &Fx, io: &mut Host, cid: u16, lba: u64, len: usize) {
    let data = pattern(cid as u8, len);
    let cmd = if len <= 16384 {
        rw(
            0x01,
            cid,
            lba,
            len as u32,
            &SglDescriptor::in_capsule(0, len as u32),
        )
    } else {
        io.data_mut(0, len).copy_from_slice(&data);
        rw(0x01, cid, lba, len as u32, &io.keyed(0, len as u32, false))
    };
    let icd: &[u8] = if len <= 16384 { &data } else { &[] };
    let r = io.exec(&fx.cl, &cmd, icd);
    assert!(r.cpl.status.is_success(), "write: {:?}", r.cpl.status);
    io.data_mut(0, len).fill(0);
    let cmd = rw(
        0x02,
        cid + 1,
        lba,
        len as u32,
        &io.keyed(0, len as u32, false),
    );
    let r = io.exec(&fx.cl, &cmd, &[]);
    assert!(r.cpl.status.is_success(), "read: {:?}", r.cpl.status);
    assert!(io.data(0, len) == &data[..], "data read back differs");
}

#[test]
fn queues_of_one_host_land_on_both_cores_and_serve_verified_io() {
    let fx = fixture_on(2, RdmaOptions::for_tests());
    assert_eq!(fx.pgs[1].listeners(), 0, "group 0 owns the listener");
    let (admin, cntlid) = fx.admin();
    // Admin on core 0 (both empty, round robin starts there), then the
    // I/O queues alternate: 1, 0, 1.
    let mut ios: Vec<Host> = (1..4).map(|q| fx.io_qid(cntlid, q, 16)).collect();
    assert_eq!(fx.conns(), [2, 2], "queues per core");
    assert_eq!(fx.transport.queues_per_group(), [2, 2]);
    let (s0, s1) = (fx.pgs[0].stats(), fx.pgs[1].stats());
    assert_eq!((s0.handed_off, s0.adopted), (2, 0), "{s0:?}");
    assert_eq!((s1.handed_off, s1.adopted), (0, 2), "{s1:?}");

    // Every queue, on either core, moves verified data both ways (RDMA
    // READ of host data, in-capsule data, RDMA WRITE back).
    for (k, io) in ios.iter_mut().enumerate() {
        let lba = k as u64 * 1024;
        write_read_verify(&fx, io, 10 + 4 * k as u16, lba, 128 * 1024);
        write_read_verify(&fx, io, 12 + 4 * k as u16, lba + 512, 8192);
    }
    // One namespace behind both cores: what queue 0 (core 1) wrote reads
    // back through queue 1 (core 0).
    let want = pattern(10, 128 * 1024);
    ios[1].data_mut(0, want.len()).fill(0);
    let cmd = rw(
        0x02,
        40,
        0,
        want.len() as u32,
        &ios[1].keyed(0, want.len() as u32, false),
    );
    assert!(ios[1].exec(&fx.cl, &cmd, &[]).cpl.status.is_success());
    assert!(ios[1].data(0, want.len()) == &want[..]);
    assert!(fx.pgs[1].stats().capsules >= 8, "{:?}", fx.pgs[1].stats());

    // Tear the controller down from the admin queue's core: the I/O
    // queues notice on their own cores and are destroyed there.
    admin.kill();
    let gone = spin(&fx.cl, || (fx.conns() == [0, 0]).then_some(()));
    assert!(gone.is_some(), "queues left: {:?}", fx.conns());
    assert_eq!(fx.transport.stats().destroyed, 4);
    assert_eq!(fx.transport.queues_per_group(), [0, 0]);
    assert_eq!(fx.target.controller_count(), 0);
}

#[test]
fn listener_core_placement_keeps_every_queue_on_the_listeners_core() {
    let fx = fixture_on(
        2,
        RdmaOptions {
            placement: QueuePlacement::ListenerCore,
            ..RdmaOptions::for_tests()
        },
    );
    let (_admin, cntlid) = fx.admin();
    let mut ios: Vec<Host> = (1..4).map(|q| fx.io_qid(cntlid, q, 8)).collect();
    assert_eq!(fx.conns(), [4, 0]);
    assert_eq!(fx.pgs[0].stats().handed_off, 0);
    write_read_verify(&fx, &mut ios[2], 1, 0, 4096);
}

#[test]
fn abrupt_disconnects_on_two_cores_return_every_buffer() {
    let fx = fixture_on(2, RdmaOptions::for_tests());
    let (_admin, cntlid) = fx.admin();
    // One long-lived I/O queue on core 1 evens the load: the short-lived
    // queues below then alternate between the cores (ties, round robin).
    let _keep = fx.io_qid(cntlid, 2, 8);
    let pool_start = fx.target.data_pool().available() + fx.cached_all();
    for round in 0..300u32 {
        let mut io = fx.io(cntlid, 8);
        let c1 = rw(0x01, 1, 0, 128 * 1024, &io.keyed(0, 128 * 1024, false));
        let c2 = rw(
            0x02,
            2,
            0,
            128 * 1024,
            &io.keyed(128 * 1024, 128 * 1024, round % 2 == 0),
        );
        let c3 = rw(0x01, 3, 512, 4096, &SglDescriptor::in_capsule(0, 4096));
        io.send(&c1, &[]);
        io.send(&c2, &[]);
        io.send(&c3, &pattern(round as u8, 4096));
        for _ in 0..(round % 7) {
            fx.cl.poll_once_all();
        }
        io.kill();
        let gone = spin(&fx.cl, || {
            (fx.conns().iter().sum::<usize>() == 2).then_some(())
        });
        assert!(gone.is_some(), "round {round}: queue not destroyed");
    }
    let _ = fx.cl.poll_until_idle_within(100_000);
    for (i, g) in fx.pgs.iter().enumerate() {
        let st = g.stats();
        assert_eq!(
            st.recv_buffers_idle, st.recv_buffers,
            "core {i}: receive buffers leaked"
        );
    }
    let (s0, s1) = (fx.pgs[0].stats(), fx.pgs[1].stats());
    assert_eq!(s0.handed_off, 151, "every other I/O queue went to core 1");
    assert_eq!(s1.adopted, 151);
    let ts = fx.transport.stats();
    assert_eq!((ts.accepted, ts.destroyed), (302, 300));
    assert_eq!(fx.transport.queues_per_group(), [1, 1]);
    let back = spin(&fx.cl, || {
        (fx.target.data_pool().available() + fx.cached_all() == pool_start).then_some(())
    });
    assert!(
        back.is_some(),
        "data buffers leaked: {} + {} cached, started with {pool_start}",
        fx.target.data_pool().available(),
        fx.cached_all()
    );
}
