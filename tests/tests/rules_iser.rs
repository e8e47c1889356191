//! Data-path rules of iSER over the software RDMA provider: with the
//! target and the initiator warm, 100,000 reads and writes on a plain LUN
//! and on a T10 PI LUN (with the signature offload and in software) make
//! no heap allocation and take no lock, on either side.
#![allow(clippy::unwrap_used)]

mod common;

use common::iser::{iscsi_target, unique_addr, Cluster, SPINS};
use common::rules::{assert_clean, assert_counters_work, N};
use pollux_bdev::BdevRegistry;
use pollux_iser::initiator::scsi::{parse_read_capacity16, read_capacity16_cdb};
use pollux_iser::initiator::{
    DataDir, InitiatorOptions, IserInitiator, PiEngine, PiPolicy, SessionState,
};
use pollux_iser::target::iser::IserOptions;
use pollux_reactor::mem::{
    BufPool, BufPoolOptions, CountingAlloc, DataPathCounts, DmaBuf, HugepageMode, SgList,
};
use pollux_verbs::soft::Soft;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

const TGT: &str = "iqn.2024-01.io.pollux:rules";
const INI: &str = "iqn.2024-01.io.pollux:rules-host";
const DEPTH: usize = 8;
const IO: usize = 4096;

fn connect(c: &Cluster, opts: InitiatorOptions) -> IserInitiator<Soft> {
    let mut ini = IserInitiator::<Soft>::connect(opts).unwrap();
    let ready = c.spin(|| {
        ini.poll(&mut |_| {});
        match ini.state() {
            SessionState::Ready => Some(()),
            SessionState::Failed(e) => panic!("login failed: {e}"),
            _ => None,
        }
    });
    assert!(ready.is_some(), "login did not finish");
    ini
}

/// READ CAPACITY(16) of `lun`, and the initiator told its geometry.
fn learn_geometry(c: &Cluster, ini: &mut IserInitiator<Soft>, lun: u16) {
    let b = SgList::from_buf(DmaBuf::alloc(32).unwrap());
    ini.submit(lun, &read_capacity16_cdb(), DataDir::Read, Some(b), 32, 0)
        .unwrap();
    let mut got = None;
    for _ in 0..SPINS {
        c.cl.poll_once_all();
        ini.poll(&mut |r| got = Some(r));
        if got.is_some() {
            break;
        }
    }
    let r = got.expect("READ CAPACITY answered");
    assert!(r.is_good(), "{:?}", r.sense);
    let d = r.bufs.unwrap().pop().unwrap();
    let g = parse_read_capacity16(d.as_slice()).unwrap();
    ini.set_geometry(lun, g);
}

/// Keep `DEPTH` I/Os in flight on `lun` until `ios` more completed.
fn run(
    c: &Cluster,
    ini: &mut IserInitiator<Soft>,
    lun: u16,
    idle: &mut Vec<SgList>,
    next: &mut u64,
    ios: u64,
) {
    let blocks = (IO / 512) as u32;
    let units = (4 << 20) / IO as u64;
    let until = *next + ios;
    let mut done = 0;
    let mut bad = 0;
    while done < ios {
        while *next < until {
            let Some(b) = idle.pop() else { break };
            let n = *next;
            let lba = (n.wrapping_mul(0x9E37_79B9) % units) * u64::from(blocks);
            let sub = if n % 2 == 0 {
                ini.write(lun, lba, blocks, b, n)
            } else {
                ini.read(lun, lba, blocks, b, n)
            };
            match sub {
                Ok(()) => *next += 1,
                Err(e) => panic!("submit refused: {e}"),
            }
        }
        c.cl.poll_once_all();
        ini.poll(&mut |r| {
            if !r.is_good() {
                bad += 1;
            }
            done += 1;
            if let Some(b) = r.bufs {
                idle.push(b);
            }
        });
    }
    assert_eq!(bad, 0, "failed tasks");
}

#[test]
fn iser_target_and_initiator_allocate_nothing_and_lock_nothing_per_io() {
    assert_counters_work();
    let reg = BdevRegistry::new();
    let plain = reg.create("malloc:size=4M,block=512").unwrap();
    let pi = reg
        .create("malloc:size=4M,block=512,md=8,md_interleave=true,pi=1")
        .unwrap();
    let addr = unique_addr("pollux-rules-iser");
    let target = iscsi_target(TGT, &addr, vec![(0, plain), (1, pi)], 64);
    let c = Cluster::start(1, target, addr, IserOptions::for_tests());
    let mut o = BufPoolOptions::new("rules-iser", IO, DEPTH);
    o.hugepages = HugepageMode::Never;
    let pool = BufPool::new(o).unwrap();
    let mut idle: Vec<SgList> = (0..DEPTH)
        .map(|_| SgList::from_buf(pool.get().unwrap()))
        .collect();
    // (LUN, PI policy, PI engine): plain; PI with the signature offload;
    // PI generated and checked in software.
    let cases = [
        (0u16, PiPolicy::Off, PiEngine::Auto),
        (1, PiPolicy::Both, PiEngine::Auto),
        (1, PiPolicy::Both, PiEngine::Software),
    ];
    for (lun, pol, engine) in cases {
        let mut opts = InitiatorOptions::new(&c.addr, INI, TGT);
        opts.queue_depth = DEPTH as u16;
        opts.pi = pol;
        opts.pi_engine = engine;
        let mut ini = connect(&c, opts);
        learn_geometry(&c, &mut ini, lun);
        let mut next = 0;
        run(&c, &mut ini, lun, &mut idle, &mut next, N / 10);
        let before = DataPathCounts::now();
        run(&c, &mut ini, lun, &mut idle, &mut next, N);
        let after = DataPathCounts::now();
        assert_clean(&format!("lun {lun} {pol:?} {engine:?}"), before, after);
        c.logout(ini);
    }
}
