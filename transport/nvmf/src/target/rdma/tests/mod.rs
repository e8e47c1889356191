//! RDMA transport tests over the soft provider, with a small verbs-level
//! test host ([`host`]) on a one-reactor [`TestCluster`].

mod host;
mod placement;
mod sgl;
mod teardown;

use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use pollux_bdev::BdevRegistry;
use pollux_reactor::TestCluster;
use pollux_verbs::soft::Soft;

use self::host::{spin, ConnectOutcome, Host, DYNAMIC};
use super::{RdmaOptions, RdmaPollGroup, RdmaTransport};
use crate::spec::cmd::NvmeCmd;
use crate::spec::property::{ofst, PropertyCmd, PropertySize};
use crate::spec::rdma_cm::{CmRejectStatus, CmRequest};
use crate::spec::sgl::SglDescriptor;
use crate::spec::transport_id::{AdrFam, TrType, TransportId};
use crate::target::{NamespaceConfig, SubsystemConfig, Target, TargetOptions};

const NQN: &str = "nqn.2024-01.io.pollux:rdma-test";

struct Fx {
    cl: TestCluster,
    target: Arc<Target>,
    transport: Arc<RdmaTransport<Soft>>,
    pg: Rc<RdmaPollGroup<Soft>>,
    /// Every core's poll group (`pg` is the first).
    pgs: Vec<Rc<RdmaPollGroup<Soft>>>,
    addr: String,
}

fn fixture(opts: RdmaOptions) -> Fx {
    fixture_on(1, opts)
}

/// A target on `cores` reactors, one poll group each (the first one owns
/// the listener).
fn fixture_on(cores: usize, opts: RdmaOptions) -> Fx {
    let topts = TargetOptions {
        in_capsule_data_size: 16384,
        ..TargetOptions::for_tests()
    };
    fixture_with(cores, opts, topts)
}

/// [`fixture_on`] with the target's options `topts`.
fn fixture_with(cores: usize, opts: RdmaOptions, topts: TargetOptions) -> Fx {
    static N: AtomicUsize = AtomicUsize::new(0);
    let cl = TestCluster::new(cores);
    let target = Target::new(topts).expect("target");
    let mut sc = SubsystemConfig::new(NQN);
    sc.allow_any_host = true;
    let sub = target.add_subsystem(sc).expect("subsystem");
    let bdev = BdevRegistry::new()
        .create("malloc:size=4M,block=512")
        .expect("bdev");
    sub.add_namespace(NamespaceConfig::new(bdev))
        .expect("namespace");
    let transport = RdmaTransport::<Soft>::new(&target, opts).expect("transport");
    target
        .add_transport(transport.clone())
        .expect("add transport");
    let pgs: Vec<_> = (0..cores as u32)
        .map(|c| {
            cl.on(c, |r| transport.create_poll_group(r))
                .expect("poll group")
        })
        .collect();
    let pg = Rc::clone(&pgs[0]);
    let addr = format!(
        "@pollux-rdma-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    target
        .add_listener(TransportId {
            trtype: TrType::Rdma,
            adrfam: AdrFam::IntraHost,
            traddr: addr.clone(),
            trsvcid: String::new(),
        })
        .expect("listener");
    assert!(
        spin(&cl, || (pg.listeners() == 1).then_some(())).is_some(),
        "not listening"
    );
    Fx {
        cl,
        target,
        transport,
        pg,
        pgs,
        addr,
    }
}

impl Fx {
    /// Admin queue + Connect + CC.EN; returns the host and the cntlid.
    fn admin(&self) -> (Host, u16) {
        let mut h = Host::connect(&self.cl, &self.addr, 0, 32);
        let cpl = h.fabrics_connect(&self.cl, 0, NQN, DYNAMIC);
        assert!(cpl.status.is_success(), "admin connect: {:?}", cpl.status);
        let cntlid = cpl.dw0 as u16;
        let cc = 1 | (6 << 16) | (4 << 20);
        let cpl = h
            .exec(
                &self.cl,
                &PropertyCmd::set(ofst::CC, PropertySize::Four, cc, 2),
                &[],
            )
            .cpl;
        assert!(cpl.status.is_success());
        (h, cntlid)
    }

    /// Settle, then every receive buffer of the first poll group is idle.
    fn assert_recv_buffers_back(&self) {
        let _ = self.cl.poll_until_idle_within(100_000);
        let st = self.pg.stats();
        assert_eq!(
            st.recv_buffers_idle, st.recv_buffers,
            "receive buffers leaked"
        );
    }

    fn io(&self, cntlid: u16, depth: u16) -> Host {
        let mut h = Host::connect(&self.cl, &self.addr, 1, depth);
        let cpl = h.fabrics_connect(&self.cl, 1, NQN, cntlid);
        assert!(cpl.status.is_success(), "I/O connect: {:?}", cpl.status);
        h
    }
}

fn rw(opc: u8, cid: u16, lba: u64, bytes: u32, sgl: &SglDescriptor) -> NvmeCmd {
    let mut c = NvmeCmd::new(opc, cid);
    c.nsid = 1;
    c.cdw10 = lba as u32;
    c.cdw11 = (lba >> 32) as u32;
    c.cdw12 = bytes / 512 - 1;
    c.set_sgl(sgl);
    c
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Put I/O in flight on `io` (cids 1-4): two 128 KiB writes (RDMA READ),
/// a 128 KiB read (RDMA WRITE; the target invalidates its key when
/// `invalidate`) and an in-capsule 4 KiB write of `pattern(seed)` (its
/// receive buffer lent to the bdev).
fn io_in_flight(io: &mut Host, seed: u8, invalidate: bool) {
    const L: u32 = 128 * 1024;
    let c1 = rw(0x01, 1, 0, L, &io.keyed(0, L, false));
    let c2 = rw(0x01, 2, 256, L, &io.keyed(L as usize, L, false));
    let c3 = rw(0x02, 3, 0, L, &io.keyed(2 * L as usize, L, invalidate));
    let c4 = rw(0x01, 4, 512, 4096, &SglDescriptor::in_capsule(0, 4096));
    io.send(&c1, &[]);
    io.send(&c2, &[]);
    io.send(&c3, &[]);
    io.send(&c4, &pattern(seed, 4096));
}

fn io_round_trip(opts: RdmaOptions) {
    let fx = fixture(opts);
    let (mut admin, cntlid) = fx.admin();
    // Identify Controller: 4 KiB by RDMA WRITE; IOCCSZ = (64 + 16 KiB) / 16.
    let mut id = NvmeCmd::new(0x06, 3);
    id.cdw10 = 1;
    id.set_sgl(&admin.keyed(0, 4096, false));
    assert!(admin.exec(&fx.cl, &id, &[]).cpl.status.is_success());
    let ioccsz = u32::from_le_bytes(admin.data(1792, 4).try_into().expect("4 bytes"));
    assert_eq!(ioccsz, (64 + 16384) / 16);

    let mut io = fx.io(cntlid, 32);
    // In-capsule writes: 4 KiB and 16 KiB.
    for (cid, lba, len) in [(10u16, 0u64, 4096usize), (11, 8, 16384)] {
        let data = pattern(cid as u8, len);
        let cmd = rw(
            0x01,
            cid,
            lba,
            len as u32,
            &SglDescriptor::in_capsule(0, len as u32),
        );
        let r = io.exec(&fx.cl, &cmd, &data);
        assert!(
            r.cpl.status.is_success(),
            "inline write {len}: {:?}",
            r.cpl.status
        );
    }
    // 128 KiB write by RDMA READ from the host.
    let big = pattern(99, 128 * 1024);
    io.data_mut(0, big.len()).copy_from_slice(&big);
    let cmd = rw(
        0x01,
        12,
        64,
        big.len() as u32,
        &io.keyed(0, big.len() as u32, false),
    );
    assert!(io.exec(&fx.cl, &cmd, &[]).cpl.status.is_success());
    // Read it back by RDMA WRITE, without invalidation.
    io.data_mut(0, 256 * 1024).fill(0);
    let cmd = rw(
        0x02,
        13,
        64,
        big.len() as u32,
        &io.keyed(0, big.len() as u32, false),
    );
    let r = io.exec(&fx.cl, &cmd, &[]);
    assert!(r.cpl.status.is_success());
    assert_eq!(r.invalidated, None);
    assert!(
        io.data(0, big.len()) == &big[..],
        "128 KiB read back differs"
    );
    // The 16 KiB in-capsule write, read with remote invalidation.
    let (sgl, key) = io.keyed_inv(&fx.cl, 200 * 1024, 16384);
    let cmd = rw(0x02, 14, 8, 16384, &sgl);
    let r = io.exec(&fx.cl, &cmd, &[]);
    assert!(r.cpl.status.is_success());
    let want_inv = fx.transport.options().send_with_invalidate.then_some(key);
    assert_eq!(
        r.invalidated, want_inv,
        "SEND_WITH_INV flag on the host completion"
    );
    assert!(io.data(200 * 1024, 16384) == &pattern(11, 16384)[..]);
    let cmd = rw(0x02, 15, 8, 16384, &sgl);
    if fx.transport.options().send_with_invalidate {
        // The key is invalid now: the target's WRITE fails, the queue dies.
        io.send(&cmd, &[]);
        let failed = spin(&fx.cl, || (fx.pg.stats().wc_errors > 0).then_some(()));
        assert!(failed.is_some(), "a WRITE to an invalidated key succeeded");
        let gone = spin(&fx.cl, || (fx.pg.connections() == 1).then_some(()));
        assert!(gone.is_some(), "the broken queue was not destroyed");
    } else {
        io.data_mut(200 * 1024, 16384).fill(0);
        assert!(io.exec(&fx.cl, &cmd, &[]).cpl.status.is_success());
        assert!(io.data(200 * 1024, 16384) == &pattern(11, 16384)[..]);
    }
    let st = fx.pg.stats();
    assert!(st.capsules >= 9, "{st:?}");
    assert!(st.doorbells > 0);
    assert!(fx.transport.stats().recv_memory_bytes > 0);
    drop(admin);
}

#[test]
fn connect_identify_and_io_with_srq() {
    io_round_trip(RdmaOptions::for_tests());
}

#[test]
fn connect_identify_and_io_without_srq() {
    io_round_trip(RdmaOptions {
        no_srq: true,
        ..RdmaOptions::for_tests()
    });
}

#[test]
fn send_with_invalidate_can_be_disabled() {
    io_round_trip(RdmaOptions {
        send_with_invalidate: false,
        ..RdmaOptions::for_tests()
    });
}

#[test]
fn bad_cm_private_data_is_rejected_with_its_status() {
    let fx = fixture(RdmaOptions::for_tests());
    let good = CmRequest {
        recfmt: 0,
        qid: 1,
        hrqsize: 32,
        hsqsize: 31,
        cntlid: 0,
    };
    let cases = [
        (
            CmRequest { recfmt: 1, ..good },
            CmRejectStatus::InvalidRecfmt,
        ),
        (
            CmRequest { qid: 0, ..good }.with_hsq(40),
            CmRejectStatus::InvalidHsqsize,
        ),
        (good.with_hsq(1000), CmRejectStatus::InvalidHsqsize),
        (
            CmRequest { hrqsize: 0, ..good },
            CmRejectStatus::InvalidHrqsize,
        ),
    ];
    for (req, want) in cases {
        match Host::connect_raw(&fx.cl, &fx.addr, &req.encode(), 8) {
            ConnectOutcome::Rejected(st) => assert_eq!(st, Some(want), "{req:?}"),
            ConnectOutcome::Connected(_) => panic!("{req:?} was accepted"),
        }
    }
    assert_eq!(fx.transport.stats().rejected, 4);
    assert_eq!(fx.pg.connections(), 0);
}

/// The admin queue is 32 entries deep whatever the target's I/O queue
/// limit (Linux always connects it with HSQSIZE and SQSIZE 31; the Linux
/// target and SPDK size it apart): on a target whose `max_queue_depth` is
/// 16 it connects and is enabled, its I/O queues are held to 16 entries
/// (a CM request for 32 is refused with INVALID_HSQSIZE) and serve I/O.
#[test]
fn a_target_shallower_than_32_entries_still_takes_a_32_entry_admin_queue() {
    let topts = TargetOptions {
        in_capsule_data_size: 16384,
        max_queue_depth: 16,
        ..TargetOptions::for_tests()
    };
    let fx = fixture_with(1, RdmaOptions::for_tests(), topts);
    let (mut admin, cntlid) = fx.admin();
    let mut id = NvmeCmd::new(0x06, 3);
    id.cdw10 = 1;
    id.set_sgl(&admin.keyed(0, 4096, false));
    assert!(admin.exec(&fx.cl, &id, &[]).cpl.status.is_success());
    let maxcmd = u16::from_le_bytes([admin.data(514, 1)[0], admin.data(515, 1)[0]]);
    assert_eq!(maxcmd, 16, "MAXCMD is the I/O queue limit");
    let req = CmRequest {
        recfmt: 0,
        qid: 1,
        hrqsize: 32,
        hsqsize: 31,
        cntlid,
    };
    match Host::connect_raw(&fx.cl, &fx.addr, &req.encode(), 32) {
        ConnectOutcome::Rejected(st) => assert_eq!(st, Some(CmRejectStatus::InvalidHsqsize)),
        ConnectOutcome::Connected(_) => panic!("a 32-entry I/O queue was accepted"),
    }
    let mut io = fx.io(cntlid, 16);
    let data = pattern(5, 4096);
    let w = rw(0x01, 7, 0, 4096, &SglDescriptor::in_capsule(0, 4096));
    assert!(io.exec(&fx.cl, &w, &data).cpl.status.is_success());
    let r = rw(0x02, 8, 0, 4096, &io.keyed(0, 4096, false));
    assert!(io.exec(&fx.cl, &r, &[]).cpl.status.is_success());
    assert!(io.data(0, 4096) == &data[..]);
}

impl CmRequest {
    fn with_hsq(mut self, hsqsize: u16) -> Self {
        self.hsqsize = hsqsize;
        self
    }
}

#[test]
fn a_host_running_ahead_of_its_queue_depth_is_queued_not_dropped() {
    let fx = fixture(RdmaOptions::for_tests());
    let (_admin, cntlid) = fx.admin();
    let mut io = fx.io(cntlid, 4);
    // 7 commands on a 4-entry queue right after Connect (the host ignores
    // SQHD, and the Connect's request is still held until its SEND
    // completion is reaped): the extra capsules wait, none is dropped.
    for cid in 0..7u16 {
        let cmd = rw(
            0x01,
            100 + cid,
            u64::from(cid) * 8,
            4096,
            &SglDescriptor::in_capsule(0, 4096),
        );
        io.send(&cmd, &pattern(cid as u8, 4096));
    }
    let got = spin(&fx.cl, || {
        io.poll();
        (io.rsps.len() == 7).then_some(())
    });
    assert!(
        got.is_some(),
        "only {} responses, {:?}",
        io.rsps.len(),
        fx.pg.stats()
    );
    assert!(io.rsps.iter().all(|r| r.cpl.status.is_success()));
    assert!(fx.pg.stats().capsules_queued > 0, "{:?}", fx.pg.stats());
}

/// In-capsule writes `cid0..cid0 + n` on `io`, sent at once.
fn burst(io: &mut Host, cid0: u16, n: u16) {
    for k in 0..n {
        let cmd = rw(
            0x01,
            cid0 + k,
            u64::from(k) * 8,
            4096,
            &SglDescriptor::in_capsule(0, 4096),
        );
        io.send(&cmd, &pattern(k as u8, 4096));
    }
}

/// How far a host may run ahead: a queue of depth `d` has
/// [`requests_per_queue`](RdmaOptions::requests_per_queue)`(d)` = 1.5 `d`
/// requests and keeps up to `d` more capsules in its backlog (10 at depth
/// 4): all are answered. One more (11, past 2.5 `d`) breaks flow control
/// beyond what the target holds: there is no request to answer it with,
/// so the queue is closed, and its receive and data buffers and its seat
/// come back; QID 1 connects again.
#[test]
fn a_host_running_past_its_requests_and_backlog_loses_the_queue_not_buffers() {
    const DEPTH: u16 = 4;
    let limit = RdmaOptions::requests_per_queue(DEPTH) + DEPTH;
    let fx = fixture(RdmaOptions::for_tests());
    let (_admin, cntlid) = fx.admin();
    let pool_start = fx.target.data_pool().available() + fx.cached();
    // At the limit (the Connect's request freed first): all answered.
    let mut io = fx.io(cntlid, DEPTH);
    let _ = fx.cl.poll_until_idle_within(100_000);
    let queued = fx.pg.stats().capsules_queued;
    burst(&mut io, 100, limit);
    let got = spin(&fx.cl, || {
        io.poll();
        (io.rsps.len() == usize::from(limit)).then_some(())
    });
    assert!(got.is_some(), "only {} responses", io.rsps.len());
    assert!(io.rsps.iter().all(|r| r.cpl.status.is_success()));
    let st = fx.pg.stats();
    assert_eq!(st.capsules_queued - queued, u64::from(DEPTH), "{st:?}");
    assert_eq!(st.connections, 2, "the queue went at the limit");
    io.kill();
    let gone = spin(&fx.cl, || (fx.pg.connections() == 1).then_some(()));
    assert!(gone.is_some(), "queue not destroyed");
    // One past it: the queue is closed, nothing answered after it.
    let mut io = fx.io(cntlid, DEPTH);
    let _ = fx.cl.poll_until_idle_within(100_000);
    burst(&mut io, 200, limit + 1);
    let gone = spin(&fx.cl, || (fx.pg.connections() == 1).then_some(()));
    assert!(gone.is_some(), "a queue overrun past its backlog stays");
    let dead = spin(&fx.cl, || (!io.poll()).then_some(()));
    assert!(dead.is_some(), "the host's queue stays up");
    fx.assert_recv_buffers_back();
    let held = || fx.target.data_pool().available() + fx.cached();
    let _ = spin(&fx.cl, || (held() == pool_start).then_some(()));
    assert_eq!(held(), pool_start, "data buffers leaked");
    assert_eq!(fx.transport.queues_per_group(), vec![1], "its seat is free");
    let ts = fx.transport.stats();
    assert_eq!((ts.accepted, ts.destroyed), (3, 2));
    drop(io);
    let mut again = fx.io(cntlid, DEPTH);
    let w = rw(0x01, 5, 0, 4096, &SglDescriptor::in_capsule(0, 4096));
    let rsp = again.exec(&fx.cl, &w, &pattern(3, 4096));
    assert!(rsp.cpl.status.is_success(), "{:?}", rsp.cpl);
}

#[test]
fn a_thousand_abrupt_disconnects_leak_nothing() {
    let fx = fixture(RdmaOptions::for_tests());
    let (_admin, cntlid) = fx.admin();
    let pool_start = fx.target.data_pool().available();
    let idle_start = fx.pg.stats();
    assert_eq!(idle_start.recv_buffers_idle, idle_start.recv_buffers);
    for round in 0..1000u32 {
        let mut io = fx.io(cntlid, 8);
        io_in_flight(&mut io, round as u8, round % 2 == 0);
        // Let the target start some of it (varies with the round).
        for _ in 0..(round % 7) {
            fx.cl.poll_once_all();
        }
        io.kill();
        let gone = spin(&fx.cl, || (fx.pg.connections() == 1).then_some(()));
        assert!(gone.is_some(), "round {round}: queue not destroyed");
    }
    // Let bdev I/O that completed into the void return its buffers.
    fx.assert_recv_buffers_back();
    let ts = fx.transport.stats();
    assert_eq!(ts.destroyed, 1000);
    assert_eq!(ts.accepted, 1001);
    let back = spin(&fx.cl, || {
        (fx.target.data_pool().available() + fx.cached() == pool_start + fx.cached_at_start())
            .then_some(())
    });
    let _ = back;
    assert_eq!(
        fx.target.data_pool().available() + fx.cached(),
        pool_start + fx.cached_at_start(),
        "data buffers leaked"
    );
}

impl Fx {
    /// Buffers in this core's cache of the data pool.
    fn cached(&self) -> usize {
        self.cl.on(0, |r| self.target.core_ctx(r).cached_buffers())
    }

    fn cached_at_start(&self) -> usize {
        0
    }
}

/// In-capsule writes are used in place: the receive buffer is lent to the
/// request and the bdev writes from it (no copy), and the buffers come back
/// (out of order) so more writes than receive buffers go through; an SGL
/// offset other than 0 is the one case that copies.
fn in_capsule_data_in_place(opts: RdmaOptions) {
    let fx = fixture(opts);
    let (_admin, cntlid) = fx.admin();
    let mut io = fx.io(cntlid, 16);
    // (The I/O queue's Connect data came in the capsule too.)
    let lent0 = fx.pg.stats().icd_lent;
    let total = fx.pg.stats().recv_buffers;
    // More writes than receive buffers, four in flight at a time.
    let waves = total / 4 + 20;
    let mut lba = 0u64;
    for wave in 0..waves {
        let mut cids = Vec::new();
        for k in 0..4u16 {
            let cid = 100 + k;
            let len = 512 * (1 + usize::from(k));
            let data = pattern((wave as u8).wrapping_add(k as u8), len);
            let cmd = rw(
                0x01,
                cid,
                lba % 4096,
                len as u32,
                &SglDescriptor::in_capsule(0, len as u32),
            );
            io.send(&cmd, &data);
            cids.push(cid);
            lba += 8;
        }
        let got = spin(&fx.cl, || {
            io.poll();
            (io.rsps.len() >= 4).then_some(())
        });
        assert!(got.is_some(), "wave {wave}: responses missing");
        for r in io.rsps.drain(..) {
            assert!(r.cpl.status.is_success(), "wave {wave}: {:?}", r.cpl.status);
        }
    }
    let st = fx.pg.stats();
    assert_eq!(st.icd_copies, 0, "in-capsule data was copied: {st:?}");
    assert_eq!(st.icd_lent - lent0, 4 * waves as u64, "{st:?}");
    // The data arrived intact: read the last wave back.
    let last = waves - 1;
    for k in 0..4u16 {
        let len = 512 * (1 + usize::from(k));
        let at = (lba - 8 * (4 - u64::from(k))) % 4096;
        io.data_mut(0, len).fill(0);
        let cmd = rw(
            0x02,
            200 + k,
            at,
            len as u32,
            &io.keyed(0, len as u32, false),
        );
        assert!(io.exec(&fx.cl, &cmd, &[]).cpl.status.is_success());
        let want = pattern((last as u8).wrapping_add(k as u8), len);
        assert!(
            io.data(0, len) == &want[..],
            "write {k} of the last wave differs"
        );
    }
    // An offset into the capsule cannot be lent: copied, and counted.
    let data = pattern(7, 1024);
    let cmd = rw(0x01, 300, 0, 512, &SglDescriptor::in_capsule(512, 512));
    assert!(io.exec(&fx.cl, &cmd, &data).cpl.status.is_success());
    assert_eq!(fx.pg.stats().icd_copies, 1);
    let cmd = rw(0x02, 301, 0, 512, &io.keyed(0, 512, false));
    assert!(io.exec(&fx.cl, &cmd, &[]).cpl.status.is_success());
    assert!(io.data(0, 512) == &data[512..], "offset write differs");
    // Every buffer is back once the queue is gone.
    io.kill();
    let gone = spin(&fx.cl, || (fx.pg.connections() == 1).then_some(()));
    assert!(gone.is_some(), "queue not destroyed");
    let st = fx.pg.stats();
    let idle = if fx.transport.options().no_srq {
        // The admin queue owns its receives.
        st.recv_buffers - 32
    } else {
        st.recv_buffers
    };
    assert_eq!(st.recv_buffers_idle, idle, "receive buffers leaked: {st:?}");
}

#[test]
fn in_capsule_data_is_used_in_place_with_srq() {
    in_capsule_data_in_place(RdmaOptions::for_tests());
}

#[test]
fn in_capsule_data_is_used_in_place_without_srq() {
    in_capsule_data_in_place(RdmaOptions {
        no_srq: true,
        ..RdmaOptions::for_tests()
    });
}
