//! Data-path rules of iSER over the software RDMA provider: with the
//! target and the initiator warm, 100,000 reads and writes on a plain LUN
//! and on a T10 PI LUN (insert and DIX, each with the signature offload
//! and in software) make no heap allocation and take no lock, on either
//! side.
#![allow(clippy::unwrap_used)]

mod common;

use common::iser::{iscsi_target, unique_addr, Cluster, SPINS};
use common::rules::{
    assert_clean, assert_counters_work, measure_from_here, measure_to_here, QueueFill, N,
};
use pollux_bdev::BdevRegistry;
use pollux_iser::initiator::scsi::{parse_read_capacity16, read_capacity16_cdb};
use pollux_iser::initiator::{
    DataDir, InitiatorOptions, IserInitiator, PiEngine, PiPolicy, SessionState,
};
use pollux_iser::target::iser::IserOptions;
use pollux_pi::{BuffersMut, PiParams, PiType};
use pollux_reactor::mem::{CountingAlloc, DmaBuf, SgList};
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

/// Keep `DEPTH` I/Os in flight on `lun` until `ios` more completed. With
/// `dix`, each write's tuples are generated into its buffer first (what
/// the block layer does before a DIX write).
fn run(
    c: &Cluster,
    ini: &mut IserInitiator<Soft>,
    lun: u16,
    dix: bool,
    fill: &mut QueueFill,
    ios: u64,
) {
    fill.run(
        ini,
        ios,
        |ini, mut io| {
            let sub = if io.read {
                ini.read(lun, io.lba, io.blocks, io.bufs, io.n)
            } else {
                if dix {
                    let b = io.bufs.iter_mut().next().unwrap();
                    let (data, pi) = b.as_mut_slice().split_at_mut(IO);
                    let p = PiParams::for_type(PiType::Type1, 512, io.lba as u32, 0);
                    pollux_pi::generate(BuffersMut::Dix { data, pi }, &p).unwrap();
                }
                ini.write(lun, io.lba, io.blocks, io.bufs, io.n)
            };
            sub.map_err(|e| panic!("submit refused: {e}"))
        },
        |ini, done| {
            c.cl.poll_once_all();
            ini.poll(&mut |r| done(r.is_good(), r.bufs));
        },
    );
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
    let mut fill = QueueFill::with_tuples("rules-iser", IO, DEPTH);
    // (LUN, PI policy, PI engine): plain; PI inserted and stripped, and
    // PI in host memory (DIX), each with the signature offload and in
    // software.
    let cases = [
        (0u16, PiPolicy::Off, PiEngine::Auto),
        (1, PiPolicy::Both, PiEngine::Auto),
        (1, PiPolicy::Both, PiEngine::Software),
        (1, PiPolicy::Dix, PiEngine::Auto),
        (1, PiPolicy::Dix, PiEngine::Software),
    ];
    for (lun, pol, engine) in cases {
        let mut opts = InitiatorOptions::new(&c.addr, INI, TGT);
        opts.queue_depth = DEPTH as u16;
        opts.pi = pol;
        opts.pi_engine = engine;
        let mut ini = connect(&c, opts);
        // `Auto` must really get the soft provider's signature offload
        // (it would fall back to software silently).
        assert_eq!(
            ini.pi_offload(),
            engine == PiEngine::Auto,
            "lun {lun} {pol:?} {engine:?}: PI engine in use"
        );
        learn_geometry(&c, &mut ini, lun);
        let dix = pol == PiPolicy::Dix;
        run(&c, &mut ini, lun, dix, &mut fill, N / 10);
        let before = measure_from_here();
        run(&c, &mut ini, lun, dix, &mut fill, N);
        let after = measure_to_here();
        assert_clean(&format!("lun {lun} {pol:?} {engine:?}"), before, after);
        // Logged out and torn down on the target too, before the next
        // case is measured (teardown is control path).
        c.logout(ini);
        let gone = c.spin(|| (c.conns().iter().sum::<usize>() == 0).then_some(()));
        assert!(gone.is_some(), "the target kept the connection");
    }
}
