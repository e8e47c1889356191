//! Our iSER initiator against our iSER target over the soft verbs
//! provider, in process on a one-reactor `TestCluster`: login, discovery,
//! LUN discovery, reads and writes with data verification, T10 PI (with
//! corruption detected by the target and by the initiator, and corrupted
//! stored metadata caught by the bdev layer under the target), remote and
//! local invalidation, pre-registered task memory (providers without fast
//! registration), and an initiator dying mid-I/O.
#![allow(clippy::unwrap_used)]

mod common;

use std::ops::Deref;
use std::rc::Rc;
use std::sync::Arc;

use common::iser::{iscsi_target, unique_addr, Cluster, SPINS};
use pollux_bdev::{Bdev, BdevRegistry, CompletedIo, IoCompletion, IoStatus};
use pollux_iser::initiator::scsi::{
    inquiry_cdb, parse_inquiry, parse_read_capacity16, parse_report_luns, read_capacity16_cdb,
    report_luns_cdb, rw16_cdb,
};
use pollux_iser::initiator::{
    DataDir, InitiatorOptions, Invalidation, IserInitiator, PiPolicy, SessionState, TaskResult,
};
use pollux_iser::target::iser::{IserOptions, IserPollGroup};
use pollux_reactor::mem::{DmaBuf, SgList};
use pollux_verbs::soft::Soft;
use pollux_verbs::SigErrKind;

const TGT: &str = "iqn.2024-01.io.pollux:iser-disk";
const INI: &str = "iqn.2024-01.io.pollux:iser-host";

/// The target on one reactor, with that reactor's poll group and the PI
/// bdev at hand.
struct Fx {
    c: Cluster,
    pg: Rc<IserPollGroup<Soft>>,
    pi_bdev: Arc<Bdev>,
}

impl Deref for Fx {
    type Target = Cluster;

    fn deref(&self) -> &Cluster {
        &self.c
    }
}

fn fixture() -> Fx {
    let reg = BdevRegistry::new();
    let plain = reg.create("malloc:size=4M,block=512").unwrap();
    let pi = reg
        .create("malloc:size=4M,block=512,md=8,md_interleave=true,pi=1")
        .unwrap();
    let addr = unique_addr("pollux-iser-test");
    let target = iscsi_target(TGT, &addr, vec![(0, plain), (1, pi.clone())], 64);
    let c = Cluster::start(1, target, addr, IserOptions::for_tests());
    let pg = Rc::clone(&c.pgs[0]);
    Fx { c, pg, pi_bdev: pi }
}

impl Fx {
    fn connect(&self, opts: InitiatorOptions) -> IserInitiator<Soft> {
        let mut ini = IserInitiator::<Soft>::connect(opts).unwrap();
        for _ in 0..SPINS {
            self.cl.poll_once_all();
            ini.poll(&mut |_| {});
            match ini.state() {
                SessionState::Ready => return ini,
                SessionState::Failed(e) => panic!("login failed: {e}"),
                _ => {}
            }
        }
        panic!("login did not finish");
    }

    fn opts(&self) -> InitiatorOptions {
        let mut o = InitiatorOptions::new(&self.addr, INI, TGT);
        o.queue_depth = 8;
        o
    }

    /// Run tasks already submitted until `n` results arrived.
    fn wait(&self, ini: &mut IserInitiator<Soft>, n: usize) -> Vec<TaskResult> {
        let mut out = Vec::new();
        for _ in 0..SPINS {
            self.cl.poll_once_all();
            ini.poll(&mut |r| out.push(r));
            if out.len() >= n {
                return out;
            }
            if let SessionState::Failed(e) = ini.state() {
                panic!("session failed: {e}");
            }
        }
        panic!("only {} of {n} tasks finished", out.len());
    }

    fn cmd(&self, ini: &mut IserInitiator<Soft>, lun: u16, cdb: &[u8], len: usize) -> TaskResult {
        let bufs = SgList::from_buf(DmaBuf::alloc(len.max(1)).unwrap());
        ini.submit(lun, cdb, DataDir::Read, Some(bufs), len, 7)
            .unwrap();
        self.wait(ini, 1).pop().unwrap()
    }

    fn write(&self, ini: &mut IserInitiator<Soft>, lun: u16, lba: u64, data: &[u8]) -> TaskResult {
        let mut b = DmaBuf::alloc(data.len()).unwrap();
        b.as_mut_slice().copy_from_slice(data);
        ini.write(lun, lba, (data.len() / 512) as u32, SgList::from_buf(b), 1)
            .unwrap();
        self.wait(ini, 1).pop().unwrap()
    }

    fn read(&self, ini: &mut IserInitiator<Soft>, lun: u16, lba: u64, len: usize) -> TaskResult {
        let b = DmaBuf::alloc(len).unwrap();
        ini.read(lun, lba, (len / 512) as u32, SgList::from_buf(b), 2)
            .unwrap();
        self.wait(ini, 1).pop().unwrap()
    }

    /// REPORT LUNS, INQUIRY and READ CAPACITY(16) for every LUN; sets the
    /// geometry. Returns the LUNs.
    fn discover_luns(&self, ini: &mut IserInitiator<Soft>) -> Vec<u16> {
        let r = self.cmd(ini, 0, &report_luns_cdb(256)[..12], 256);
        assert!(r.is_good(), "{:?}", r.sense);
        let data = r.bufs.unwrap().pop().unwrap();
        let luns = parse_report_luns(data.as_slice());
        for &l in &luns {
            let r = self.cmd(ini, l, &inquiry_cdb(36)[..6], 36);
            assert!(r.is_good());
            let d = r.bufs.unwrap().pop().unwrap();
            let (q, ty, _) = parse_inquiry(d.as_slice()).unwrap();
            assert_eq!((q, ty), (0, 0));
            let r = self.cmd(ini, l, &read_capacity16_cdb(), 32);
            assert!(r.is_good());
            let d = r.bufs.unwrap().pop().unwrap();
            let g = parse_read_capacity16(d.as_slice()).unwrap();
            assert_eq!(g.block_size, 512);
            ini.set_geometry(l, g);
        }
        luns
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u8).wrapping_mul(31) ^ seed) | 1)
        .collect()
}

/// Log `ini` out (dropping it) and wait until its connection is gone.
fn logout(fx: &Fx, ini: IserInitiator<Soft>) {
    fx.logout(ini);
    assert!(fx
        .spin(|| (fx.pg.connections() == 0).then_some(()))
        .is_some());
}

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
    assert_eq!(fx.discover_luns(&mut ini), vec![0, 1]);
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

fn pi_round_trip(offload_off: bool) {
    let fx = fixture();
    let mut o = fx.opts();
    o.pi = PiPolicy::Both;
    if offload_off {
        o.pi_engine = pollux_iser::initiator::PiEngine::Software;
    }
    let mut ini = fx.connect(o);
    fx.discover_luns(&mut ini);
    for (i, len) in [512usize, 4096, 65536].into_iter().enumerate() {
        let data = pattern(70 + i as u8, len);
        let w = fx.write(&mut ini, 1, 8 * i as u64, &data);
        assert!(
            w.is_good(),
            "PI write {len}: {:?} {:?}",
            w.sense,
            w.pi_error
        );
        let r = fx.read(&mut ini, 1, 8 * i as u64, len);
        assert!(r.is_good(), "PI read {len}: {:?} {:?}", r.sense, r.pi_error);
        assert_eq!(r.bufs.unwrap().pop().unwrap().as_slice(), &data[..]);
    }
    // Corrupt the medium: a raw WRITE(16) with WRPROTECT 011b (no checks)
    // of 4 blocks with a bad guard in block 2 and a bad ref tag in block 3.
    let lba = 200u64;
    let mut wire = Vec::new();
    for b in 0..4u64 {
        let blk = pattern(b as u8, 512);
        let crc = pollux_pi::crc16_t10dif(0, &blk);
        wire.extend_from_slice(&blk);
        let guard = if b == 2 { crc ^ 0x5A5A } else { crc };
        let rtag = if b == 3 { 0xDEAD } else { (lba + b) as u32 };
        wire.extend_from_slice(&guard.to_be_bytes());
        wire.extend_from_slice(&0u16.to_be_bytes());
        wire.extend_from_slice(&rtag.to_be_bytes());
    }
    let mut b = DmaBuf::alloc(wire.len()).unwrap();
    b.as_mut_slice().copy_from_slice(&wire);
    ini.submit(
        1,
        &rw16_cdb(true, lba, 4, 3),
        DataDir::Write,
        Some(SgList::from_buf(b)),
        wire.len(),
        5,
    )
    .unwrap();
    assert!(fx.wait(&mut ini, 1).pop().unwrap().is_good());
    // The target checks (RDPROTECT 001b): ABORTED COMMAND 10/01, LBA 202.
    let r = fx.read(&mut ini, 1, lba, 2048);
    assert_eq!(r.sense_code(), Some((0xB, 0x10, 0x01)), "{:?}", r.sense);
    assert_eq!(r.sense.unwrap().info, Some(lba + 2));
    let r = fx.read(&mut ini, 1, lba + 3, 512);
    assert_eq!(r.sense_code(), Some((0xB, 0x10, 0x03)), "{:?}", r.sense);
    logout(&fx, ini);

    // Only the initiator checks (RDPROTECT 011b): a signature error (or
    // the software check) with the LBA, reported as ILLEGAL REQUEST 10/0x.
    let mut o = fx.opts();
    o.pi = PiPolicy::ReadVerify;
    o.target_checks = false;
    if offload_off {
        o.pi_engine = pollux_iser::initiator::PiEngine::Software;
    }
    let mut ini = fx.connect(o);
    fx.discover_luns(&mut ini);
    let r = fx.read(&mut ini, 1, lba, 2048);
    let e = r.pi_error.expect("initiator-detected PI error");
    assert_eq!((e.kind, e.lba), (SigErrKind::BadGuard, lba + 2));
    assert_eq!(r.sense_code(), Some((0x5, 0x10, 0x01)));
    let r = fx.read(&mut ini, 1, lba + 3, 512);
    let e = r.pi_error.expect("ref tag error");
    assert_eq!((e.kind, e.lba), (SigErrKind::BadRefTag, lba + 3));
    assert_eq!(r.sense_code(), Some((0x5, 0x10, 0x03)));
    assert!(ini.stats().pi_errors >= 2);
    logout(&fx, ini);
}

#[test]
fn pi_with_signature_offload() {
    pi_round_trip(false);
}

#[test]
fn pi_in_software() {
    pi_round_trip(true);
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

/// 512-byte blocks with valid Type 1 tuples (ref tag = LBA) for `lba..`.
fn pi_blocks(lba: u64, n: u64, seed: u8) -> Vec<u8> {
    let mut wire = Vec::new();
    for b in 0..n {
        let blk = pattern(seed.wrapping_add(b as u8), 512);
        wire.extend_from_slice(&blk);
        wire.extend_from_slice(&pollux_pi::crc16_t10dif(0, &blk).to_be_bytes());
        wire.extend_from_slice(&0u16.to_be_bytes());
        wire.extend_from_slice(&((lba + b) as u32).to_be_bytes());
    }
    wire
}

#[test]
fn corrupted_stored_pi_is_caught_by_the_bdev_layer_with_the_right_sense() {
    let fx = fixture();
    let mut o = fx.opts();
    o.pi = PiPolicy::Both; // RDPROTECT/WRPROTECT 001b: the target checks
    let mut ini = fx.connect(o);
    fx.discover_luns(&mut ini);
    let lba = 300u64;
    let data = pattern(3, 4 * 512);
    assert!(fx.write(&mut ini, 1, lba, &data).is_good());
    // Corrupt the stored metadata behind the target, straight through the
    // bdev (an I/O without a PI action passes metadata untouched): block 1
    // gets a bad guard, block 3 a bad reference tag; the data stay intact.
    let mut raw = pi_blocks(lba, 4, 0);
    for b in 0..4 {
        raw[b * 520..b * 520 + 512].copy_from_slice(&data[b * 512..(b + 1) * 512]);
        let g = pollux_pi::crc16_t10dif(0, &data[b * 512..(b + 1) * 512]);
        raw[b * 520 + 512..b * 520 + 514].copy_from_slice(&g.to_be_bytes());
    }
    raw[520 + 512] ^= 0x80; // guard of LBA 301
    raw[3 * 520 + 519] ^= 0x01; // ref tag of LBA 303
    let done: Rc<std::cell::RefCell<Option<IoStatus>>> = Rc::default();
    let d2 = done.clone();
    let keep = fx.cl.on(0, |r| {
        let ch = fx.pi_bdev.open(true).unwrap().channel(r).unwrap();
        let mut b = DmaBuf::alloc(raw.len()).unwrap();
        b.as_mut_slice().copy_from_slice(&raw);
        let cb: Rc<dyn IoCompletion> =
            Rc::new(move |io: CompletedIo| *d2.borrow_mut() = Some(io.status));
        ch.write(lba, 4, SgList::from_buf(b), &cb, 0).unwrap();
        ch
    });
    assert!(fx.spin(|| done.borrow().is_some().then_some(())).is_some());
    assert_eq!(*done.borrow(), Some(Ok(())));
    drop(keep);
    // READ with RDPROTECT 001b: the bdev's read-verify fails the I/O and
    // the target answers ABORTED COMMAND 10/01 with the first bad LBA.
    let r = fx.read(&mut ini, 1, lba, 4 * 512);
    assert_eq!(r.sense_code(), Some((0xB, 0x10, 0x01)), "{:?}", r.sense);
    assert_eq!(r.sense.unwrap().info, Some(lba + 1));
    assert!(
        r.pi_error.is_none(),
        "found by the target, not the initiator"
    );
    let r = fx.read(&mut ini, 1, lba + 2, 2 * 512);
    assert_eq!(r.sense_code(), Some((0xB, 0x10, 0x03)), "{:?}", r.sense);
    assert_eq!(r.sense.unwrap().info, Some(lba + 3));
    // The intact blocks still read back.
    let r = fx.read(&mut ini, 1, lba + 2, 512);
    assert!(r.is_good(), "{:?}", r.sense);
    assert_eq!(
        r.bufs.unwrap().pop().unwrap().as_slice(),
        &data[2 * 512..3 * 512]
    );
    // WRITE with WRPROTECT 001b and a bad guard from the wire: the bdev's
    // write-verify refuses it before the medium (10/01 at that LBA) and
    // the old data stay.
    let mut wire = pi_blocks(lba + 2, 1, 9);
    wire[512] ^= 0x01;
    let mut b = DmaBuf::alloc(wire.len()).unwrap();
    b.as_mut_slice().copy_from_slice(&wire);
    ini.submit(
        1,
        &rw16_cdb(true, lba + 2, 1, 1),
        DataDir::Write,
        Some(SgList::from_buf(b)),
        wire.len(),
        5,
    )
    .unwrap();
    let w = fx.wait(&mut ini, 1).pop().unwrap();
    assert_eq!(w.sense_code(), Some((0xB, 0x10, 0x01)), "{:?}", w.sense);
    assert_eq!(w.sense.unwrap().info, Some(lba + 2));
    let r = fx.read(&mut ini, 1, lba + 2, 512);
    assert!(r.is_good());
    assert_eq!(
        r.bufs.unwrap().pop().unwrap().as_slice(),
        &data[2 * 512..3 * 512]
    );
    logout(&fx, ini);
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
