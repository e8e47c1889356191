//! The fixture of the in-process iSER tests: our initiator against our
//! iSER target over the soft verbs provider on a one-reactor `TestCluster`,
//! with a plain LU and two PI LUs.

use std::ops::Deref;
use std::rc::Rc;
use std::sync::Arc;

use super::iser::{iscsi_target, unique_addr, Cluster, SPINS};
use pollux_bdev::{Bdev, BdevRegistry};
use pollux_iser::initiator::scsi::{
    inquiry_cdb, parse_inquiry, parse_read_capacity16, parse_report_luns, read_capacity16_cdb,
    report_luns_cdb,
};
use pollux_iser::initiator::{DataDir, InitiatorOptions, IserInitiator, SessionState, TaskResult};
use pollux_iser::target::iser::{IserOptions, IserPollGroup};
use pollux_reactor::mem::{DmaBuf, SgList};
use pollux_verbs::soft::Soft;

pub const TGT: &str = "iqn.2024-01.io.pollux:iser-disk";
pub const INI: &str = "iqn.2024-01.io.pollux:iser-host";

/// The target on one reactor, with that reactor's poll group and the PI
/// bdev at hand.
pub struct Fx {
    /// The cluster.
    pub c: Cluster,
    /// Reactor 0's iSER poll group.
    pub pg: Rc<IserPollGroup<Soft>>,
    /// The bdev behind LUN 1 (Type 1 PI).
    pub pi_bdev: Arc<Bdev>,
}

impl Deref for Fx {
    type Target = Cluster;

    fn deref(&self) -> &Cluster {
        &self.c
    }
}

/// LUN 0 plain, LUN 1 Type 1 PI, LUN 2 Type 3 PI, LUN 3 Type 2 PI
/// (512-byte blocks, 8 bytes of interleaved metadata), on one reactor.
pub fn fixture() -> Fx {
    let reg = BdevRegistry::new();
    let plain = reg.create("malloc:size=4M,block=512").unwrap();
    let pi = reg
        .create("malloc:size=4M,block=512,md=8,md_interleave=true,pi=1")
        .unwrap();
    let pi3 = reg
        .create("malloc:size=4M,block=512,md=8,md_interleave=true,pi=3")
        .unwrap();
    let pi2 = reg
        .create("malloc:size=4M,block=512,md=8,md_interleave=true,pi=2")
        .unwrap();
    let addr = unique_addr("pollux-iser-test");
    let target = iscsi_target(
        TGT,
        &addr,
        vec![(0, plain), (1, pi.clone()), (2, pi3), (3, pi2)],
        64,
    );
    let c = Cluster::start(1, target, addr, IserOptions::for_tests());
    let pg = Rc::clone(&c.pgs[0]);
    Fx { c, pg, pi_bdev: pi }
}

impl Fx {
    pub fn connect(&self, opts: InitiatorOptions) -> IserInitiator<Soft> {
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

    pub fn opts(&self) -> InitiatorOptions {
        let mut o = InitiatorOptions::new(&self.addr, INI, TGT);
        o.queue_depth = 8;
        o
    }

    /// Run tasks already submitted until `n` results arrived.
    pub fn wait(&self, ini: &mut IserInitiator<Soft>, n: usize) -> Vec<TaskResult> {
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

    pub fn cmd(
        &self,
        ini: &mut IserInitiator<Soft>,
        lun: u16,
        cdb: &[u8],
        len: usize,
    ) -> TaskResult {
        let bufs = SgList::from_buf(DmaBuf::alloc(len.max(1)).unwrap());
        ini.submit(lun, cdb, DataDir::Read, Some(bufs), len, 7)
            .unwrap();
        self.wait(ini, 1).pop().unwrap()
    }

    pub fn write(
        &self,
        ini: &mut IserInitiator<Soft>,
        lun: u16,
        lba: u64,
        data: &[u8],
    ) -> TaskResult {
        let mut b = DmaBuf::alloc(data.len()).unwrap();
        b.as_mut_slice().copy_from_slice(data);
        ini.write(lun, lba, (data.len() / 512) as u32, SgList::from_buf(b), 1)
            .unwrap();
        self.wait(ini, 1).pop().unwrap()
    }

    pub fn read(
        &self,
        ini: &mut IserInitiator<Soft>,
        lun: u16,
        lba: u64,
        len: usize,
    ) -> TaskResult {
        let b = DmaBuf::alloc(len).unwrap();
        ini.read(lun, lba, (len / 512) as u32, SgList::from_buf(b), 2)
            .unwrap();
        self.wait(ini, 1).pop().unwrap()
    }

    /// REPORT LUNS, INQUIRY and READ CAPACITY(16) for every LUN; sets the
    /// geometry. Returns the LUNs.
    pub fn discover_luns(&self, ini: &mut IserInitiator<Soft>) -> Vec<u16> {
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

pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u8).wrapping_mul(31) ^ seed) | 1)
        .collect()
}

/// Log `ini` out (dropping it) and wait until its connection is gone.
pub fn logout(fx: &Fx, ini: IserInitiator<Soft>) {
    fx.logout(ini);
    assert!(fx
        .spin(|| (fx.pg.connections() == 0).then_some(()))
        .is_some());
}

/// 512-byte blocks with valid Type 1 tuples (ref tag = LBA) for `lba..`.
pub fn pi_blocks(lba: u64, n: u64, seed: u8) -> Vec<u8> {
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
