//! T10 PI over NVMe-oF: our host against our target, over the soft RDMA
//! provider and NVMe/TCP on loopback, on namespaces formatted with
//! metadata (Type 1 and Type 3 PI in 8 bytes, Type 1 in the last 8 of 16,
//! metadata without PI). Identify Namespace reports the extended-LBA format
//! as Linux's target does; PRACT=0 moves data and tuples interleaved and
//! the target checks what PRCHK asks; PRACT=1 moves data only and the
//! target generates and strips; each bad field comes back as its
//! end-to-end status and nothing reaches the medium; Write Zeroes leaves
//! valid tuples and deallocation is ignored on PI namespaces.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::{SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;

use pollux_bdev::BdevRegistry;
use pollux_nvmf::host::pi::{HostPi, PiIo, PiNs};
use pollux_nvmf::host::rdma::{MemMode, RdmaHost, RdmaHostOptions};
use pollux_nvmf::host::tcp::{TcpHost, TcpHostOptions};
use pollux_nvmf::host::{
    Completion, Controller, CtrlOptions, HostIdentity, HostQueue, HostTransport, IoError, Qpair,
    DEFAULT_HOSTNQN,
};
use pollux_nvmf::spec::cpl::NvmeStatus;
use pollux_nvmf::spec::nvm::{prinfo, RwPi};
use pollux_nvmf::spec::transport_id::{AdrFam, TrType, TransportId};
use pollux_nvmf::target::rdma::{RdmaOptions, RdmaTransport};
use pollux_nvmf::target::tcp::{TcpOptions, TcpTransport};
use pollux_nvmf::target::{NamespaceConfig, SubsystemConfig, Target, TargetError, TargetOptions};
use pollux_pi::{PiParams, PiType};
use pollux_reactor::mem::{DmaBuf, SgList};
use pollux_reactor::{free_tcp_port, Reactor, TestCluster};
use pollux_verbs::soft::Soft;
use pollux_verbs::CmAddr;

const NQN: &str = "nqn.2024-01.io.pollux:pi";
/// PI Type 1 in 8 bytes of metadata.
const NS_T1: u32 = 1;
/// PI Type 3 in 8 bytes.
const NS_T3: u32 = 2;
/// 4096-byte blocks, 16 bytes of metadata, Type 1 PI in the last 8.
const NS_T1_MD16: u32 = 3;
/// 8 bytes of metadata, no PI.
const NS_MD: u32 = 4;
/// PI Type 2 in 8 bytes (reference tags from the command's ILBRT).
const NS_T2: u32 = 5;

struct Fx {
    cl: TestCluster,
    target: Arc<Target>,
    rdma: Arc<RdmaTransport<Soft>>,
    tcp: Arc<TcpTransport>,
    soft_addr: String,
    tcp_addr: SocketAddrV4,
    _reg: BdevRegistry,
}

fn fixture() -> Fx {
    let target = Target::new(TargetOptions::for_tests()).unwrap();
    let mut sc = SubsystemConfig::new(NQN);
    sc.allow_any_host = true;
    let sub = target.add_subsystem(sc).unwrap();
    let reg = BdevRegistry::new();
    for (nsid, spec) in [
        (
            NS_T1,
            "malloc:size=1M,block=512,md=8,md_interleave=true,pi=1",
        ),
        (
            NS_T3,
            "malloc:size=1M,block=512,md=8,md_interleave=true,pi=3",
        ),
        (
            NS_T1_MD16,
            "malloc:size=1M,block=4096,md=16,md_interleave=true,pi=1",
        ),
        (NS_MD, "malloc:size=1M,block=512,md=8,md_interleave=true"),
        (
            NS_T2,
            "malloc:size=1M,block=512,md=8,md_interleave=true,pi=2",
        ),
    ] {
        let b = reg.create(spec).unwrap();
        sub.add_namespace(NamespaceConfig::new(b).with_nsid(nsid))
            .unwrap();
    }
    // Separate metadata cannot cross a fabric: refused, by name.
    let dix = reg
        .create("malloc:size=1M,block=512,md=8,md_interleave=false,pi=1,name=pi-dix")
        .unwrap();
    let e = sub.add_namespace(NamespaceConfig::new(dix)).unwrap_err();
    assert!(
        matches!(&e, TargetError::UnsupportedBdev { name, .. } if name == "pi-dix"),
        "{e}"
    );
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let soft_addr = format!("@pollux-nvmf-pi-{}-{n}", std::process::id());
    let rdma = RdmaTransport::<Soft>::new(&target, RdmaOptions::for_tests()).unwrap();
    target.add_transport(rdma.clone()).unwrap();
    target
        .add_listener(TransportId {
            trtype: TrType::Rdma,
            adrfam: AdrFam::IntraHost,
            traddr: soft_addr.clone(),
            trsvcid: String::new(),
        })
        .unwrap();
    let port = free_tcp_port("127.0.0.1");
    let tcp_addr = SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, port);
    let tcp = TcpTransport::new(&target, TcpOptions::default()).unwrap();
    target.add_transport(tcp.clone()).unwrap();
    target
        .add_listener(TransportId::tcp_ipv4("127.0.0.1", port.to_string()))
        .unwrap();
    Fx {
        cl: TestCluster::new(1),
        target,
        rdma,
        tcp,
        soft_addr,
        tcp_addr,
        _reg: reg,
    }
}

fn connect<T: HostTransport>(t: &T) -> (Controller<T>, Qpair<T::Queue>) {
    let who = HostIdentity {
        hostnqn: DEFAULT_HOSTNQN.into(),
        hostid: *b"nvmf-pi-test-h01",
        subnqn: NQN.into(),
    };
    let opts = CtrlOptions {
        io_queues: 1,
        ..CtrlOptions::default()
    };
    let c = Controller::connect(t, who, opts).unwrap();
    let qp = c.connect_io(t, 1, 32, None).unwrap();
    (c, qp)
}

fn run_one<Q: HostQueue>(r: &Reactor, qp: &mut Qpair<Q>) -> Completion {
    let mut out = None;
    for _ in 0..1_000_000 {
        qp.poll(&mut |c| out = Some(c));
        if let Some(c) = out.take() {
            return c;
        }
        r.poll_once();
    }
    panic!("no completion");
}

/// Submit one Read or Write with `pi` and wait for it.
#[allow(clippy::too_many_arguments)]
fn io<Q: HostQueue>(
    r: &Reactor,
    qp: &mut Qpair<Q>,
    write: bool,
    nsid: u32,
    slba: u64,
    nlb: u32,
    data: &[u8],
    pi: RwPi,
) -> (Result<(), NvmeStatus>, Vec<u8>) {
    submit_wait(r, qp, data, |qp, b| {
        qp.rw_pi(write, nsid, slba, nlb, b, &pi, 1).unwrap();
    })
}

/// Submit one command over a copy of `data` with `submit` and wait for
/// it: its status and the buffer's bytes afterwards.
fn submit_wait<Q: HostQueue>(
    r: &Reactor,
    qp: &mut Qpair<Q>,
    data: &[u8],
    submit: impl FnOnce(&mut Qpair<Q>, SgList),
) -> (Result<(), NvmeStatus>, Vec<u8>) {
    let mut b = DmaBuf::alloc(data.len()).unwrap();
    b.as_mut_slice().copy_from_slice(data);
    submit(qp, SgList::from_buf(b));
    let c = run_one(r, qp);
    let mut got = vec![0u8; data.len()];
    c.data.copy_to_slice(&mut got);
    let res = match c.result {
        Ok(_) => Ok(()),
        Err(IoError::Nvme(s)) => Err(s),
        Err(e) => panic!("{e}"),
    };
    (res, got)
}

/// `nlb` extended blocks (`block` data bytes, `md` metadata bytes, the
/// tuple in the last 8) at `slba`, with valid tuples of type `ty` and
/// application tag `app`.
fn ext_blocks(
    block: usize,
    md: usize,
    nlb: usize,
    slba: u64,
    ty: PiType,
    app: u16,
    seed: u8,
) -> Vec<u8> {
    let seed_ref = if ty == PiType::Type3 { 0 } else { slba as u32 };
    let p = PiParams::for_type(ty, block, seed_ref, app);
    let mut v = Vec::new();
    for i in 0..nlb {
        let d: Vec<u8> = (0..block)
            .map(|j| (j as u8).wrapping_mul(13) ^ seed ^ i as u8)
            .collect();
        v.extend_from_slice(&d);
        let pre = vec![0xEEu8; md - 8];
        v.extend_from_slice(&pre);
        // The guard covers the data and the metadata bytes before the tuple.
        let mut covered = d.clone();
        covered.extend_from_slice(&pre);
        let g = pollux_pi::crc16_t10dif(0, &covered);
        v.extend_from_slice(&p.tuple_with_guard(i as u64, g).encode());
    }
    v
}

/// `nlb` 512+8 Type 2 blocks whose reference tags start at `seed`.
fn ext_blocks_seeded(nlb: usize, seed: u32, fill: u8) -> Vec<u8> {
    let p = PiParams::for_type(PiType::Type2, 512, seed, 0);
    let mut v = Vec::new();
    for i in 0..nlb {
        let d = vec![fill ^ i as u8; 512];
        v.extend_from_slice(&d);
        v.extend_from_slice(&p.tuple_for(i as u64, &d).encode());
    }
    v
}

fn data_of(ext: &[u8], block: usize, md: usize) -> Vec<u8> {
    ext.chunks(block + md)
        .flat_map(|c| c[..block].to_vec())
        .collect()
}

const CHECK_ALL: u8 = prinfo::PRCHK_GUARD | prinfo::PRCHK_REF | prinfo::PRCHK_APP;

fn pi(prinfo: u8, slba: u64, app: u16) -> RwPi {
    RwPi {
        prinfo,
        ilbrt: slba as u32,
        lbat: app,
        lbatm: 0xFFFF,
    }
}

/// Everything, over one host transport; `check` then looks at the I/O
/// queue (the transport's settings took effect).
fn pi_over<T: HostTransport>(r: &Reactor, t: &T, check: impl FnOnce(&Qpair<T::Queue>)) {
    let (mut c, mut qp) = connect(t);
    // Identify: the extended-LBA format, as Linux's target reports it.
    let info = c.info().clone();
    let ns = |id| *info.namespaces.iter().find(|n| n.nsid == id).unwrap();
    assert_eq!(
        (ns(NS_T1).md_size, ns(NS_T1).pi_type, ns(NS_T1).pi_first),
        (8, 1, false)
    );
    assert_eq!((ns(NS_T3).md_size, ns(NS_T3).pi_type), (8, 3));
    assert_eq!(
        (ns(NS_T1_MD16).block_size, ns(NS_T1_MD16).md_size),
        (4096, 16)
    );
    assert_eq!((ns(NS_MD).md_size, ns(NS_MD).pi_type), (8, 0));
    for (nsid, dps, dpc) in [(NS_T1, 1, 0x11), (NS_T3, 3, 0x14), (NS_MD, 0, 0)] {
        let id = c.identify_namespace(nsid).unwrap();
        assert_eq!(
            (id.flbas, id.mc, id.dps, id.dpc),
            (0x10, 1, dps, dpc),
            "ns {nsid}"
        );
        assert_eq!((id.lbaf[0].ms, id.lbaf[0].lbads), (8, 9), "ns {nsid}");
    }

    // PRACT=0: data and tuples interleaved on the wire, checked by the
    // target, stored and read back as they are (1, 8 and 64 blocks).
    for (slba, nlb) in [(0u64, 1usize), (16, 8), (100, 64)] {
        let w = ext_blocks(512, 8, nlb, slba, PiType::Type1, 0x0042, slba as u8);
        let (res, _) = io(
            r,
            &mut qp,
            true,
            NS_T1,
            slba,
            nlb as u32,
            &w,
            pi(CHECK_ALL, slba, 0x0042),
        );
        assert_eq!(res, Ok(()), "write {nlb} at {slba}");
        let got = read_ok(
            r,
            &mut qp,
            NS_T1,
            slba,
            nlb as u32,
            w.len(),
            pi(CHECK_ALL, slba, 0x0042),
        );
        assert!(got == w, "{nlb} blocks at {slba} round trip");
    }

    // PRACT=1 with PI-only metadata: the wire carries data only; the
    // target generates (app tag from LBAT) and, on the way back, checks and
    // strips.
    let slba = 300u64;
    let w = ext_blocks(512, 8, 16, slba, PiType::Type1, 0x0007, 9);
    let data = data_of(&w, 512, 8);
    let pract = prinfo::PRACT | prinfo::PRCHK_GUARD | prinfo::PRCHK_REF;
    let (res, _) = io(
        r,
        &mut qp,
        true,
        NS_T1,
        slba,
        16,
        &data,
        pi(pract, slba, 0x0007),
    );
    assert_eq!(res, Ok(()));
    let got = read_ok(r, &mut qp, NS_T1, slba, 16, data.len(), pi(pract, slba, 0));
    let diff = got.iter().zip(&data).position(|(a, b)| a != b);
    assert!(
        got == data,
        "PRACT read: the data only (first difference at {diff:?}: {:?} / {:?})",
        &got[diff.unwrap_or(0)..][..8],
        &data[diff.unwrap_or(0)..][..8]
    );
    let got = read_ok(
        r,
        &mut qp,
        NS_T1,
        slba,
        16,
        w.len(),
        pi(CHECK_ALL, slba, 0x0007),
    );
    assert!(
        got == w,
        "the target's tuples: guard, app tag 7, ref tag = LBA"
    );
    // One block: in the capsule, copied out of it into room for the tuple.
    let w1 = ext_blocks(512, 8, 1, 320, PiType::Type1, 0, 4);
    let d1 = data_of(&w1, 512, 8);
    assert_eq!(
        io(r, &mut qp, true, NS_T1, 320, 1, &d1, pi(pract, 320, 0)).0,
        Ok(())
    );
    let got = read_ok(r, &mut qp, NS_T1, 320, 1, 520, pi(CHECK_ALL, 320, 0));
    assert!(got == w1, "in-capsule PRACT write");

    // Bad fields on a write: refused with their status before the medium.
    let old = w.clone();
    let cases: [(usize, NvmeStatus, u8); 3] = [
        (520 + 100, NvmeStatus::GUARD_CHECK_ERROR, CHECK_ALL), // data of block 1
        (
            2 * 520 + 512 + 2,
            NvmeStatus::APP_TAG_CHECK_ERROR,
            CHECK_ALL,
        ), // app tag of block 2
        (3 * 520 + 519, NvmeStatus::REF_TAG_CHECK_ERROR, CHECK_ALL), // ref tag of block 3
    ];
    for (byte, status, p) in cases {
        let mut bad = ext_blocks(512, 8, 16, slba, PiType::Type1, 0x0007, 77);
        bad[byte] ^= 0x20;
        let (res, _) = io(r, &mut qp, true, NS_T1, slba, 16, &bad, pi(p, slba, 0x0007));
        assert_eq!(res, Err(status), "byte {byte}");
        let got = read_ok(
            r,
            &mut qp,
            NS_T1,
            slba,
            16,
            old.len(),
            pi(CHECK_ALL, slba, 0x0007),
        );
        assert!(got == old, "byte {byte}: the medium kept the old blocks");
    }
    // A Type 1 reference tag check whose initial tag is not the LBA.
    let (res, _) = io(
        r,
        &mut qp,
        false,
        NS_T1,
        slba,
        1,
        &[0; 520],
        RwPi {
            ilbrt: 5,
            ..pi(CHECK_ALL, slba, 7)
        },
    );
    assert_eq!(res, Err(NvmeStatus::INVALID_PI));
    // A bad tuple stored without checks (PRCHK 0) is found by the checks of
    // a later read, PRACT or not, and read back as stored without them.
    let mut stored = ext_blocks(512, 8, 2, 500, PiType::Type1, 0, 3);
    stored[520 + 512] ^= 0x01; // guard of LBA 501
    assert_eq!(
        io(r, &mut qp, true, NS_T1, 500, 2, &stored, pi(0, 500, 0)).0,
        Ok(())
    );
    let g = prinfo::PRCHK_GUARD;
    assert_eq!(
        io(r, &mut qp, false, NS_T1, 500, 2, &[0; 1040], pi(g, 500, 0)).0,
        Err(NvmeStatus::GUARD_CHECK_ERROR)
    );
    assert_eq!(
        io(
            r,
            &mut qp,
            false,
            NS_T1,
            500,
            2,
            &[0; 1024],
            pi(prinfo::PRACT | g, 500, 0)
        )
        .0,
        Err(NvmeStatus::GUARD_CHECK_ERROR)
    );
    let got = read_ok(r, &mut qp, NS_T1, 500, 2, 1040, pi(0, 500, 0));
    assert!(got == stored);

    // Type 3: the reference tag is opaque (never checked); PRACT writes
    // the command's initial tag.
    let w3 = ext_blocks(512, 8, 4, 40, PiType::Type3, 0, 5);
    let mut w3_odd_ref = w3.clone();
    w3_odd_ref[2 * 520 + 519] ^= 0x5A;
    assert_eq!(
        io(
            r,
            &mut qp,
            true,
            NS_T3,
            40,
            4,
            &w3_odd_ref,
            pi(CHECK_ALL, 40, 0)
        )
        .0,
        Ok(())
    );
    let got = read_ok(r, &mut qp, NS_T3, 40, 4, w3.len(), pi(CHECK_ALL, 40, 0));
    assert!(got == w3_odd_ref);
    let d3 = data_of(&w3, 512, 8);
    let t3 = RwPi {
        ilbrt: 0xABCD_0000,
        ..pi(prinfo::PRACT | g, 40, 0)
    };
    assert_eq!(io(r, &mut qp, true, NS_T3, 40, 4, &d3, t3).0, Ok(()));
    let (_, got) = io(
        r,
        &mut qp,
        false,
        NS_T3,
        40,
        4,
        &vec![0; w3.len()],
        pi(0, 40, 0),
    );
    assert_eq!(
        &got[512 + 4..520],
        &0xABCD_0000u32.to_be_bytes(),
        "Type 3 PRACT: the command's ref tag"
    );

    // 16 bytes of metadata: PRACT moves the metadata too; the target
    // generates the tuple in its last 8 bytes over the data and the first 8.
    let w16 = ext_blocks(4096, 16, 2, 8, PiType::Type1, 0, 1);
    assert_eq!(
        io(
            r,
            &mut qp,
            true,
            NS_T1_MD16,
            8,
            2,
            &w16,
            pi(CHECK_ALL, 8, 0)
        )
        .0,
        Ok(())
    );
    let mut scrambled = w16.clone();
    for blk in 0..2 {
        scrambled[blk * 4112 + 4104..blk * 4112 + 4112].fill(0); // tuples zeroed
    }
    assert_eq!(
        io(
            r,
            &mut qp,
            true,
            NS_T1_MD16,
            8,
            2,
            &scrambled,
            pi(prinfo::PRACT | g, 8, 0)
        )
        .0,
        Ok(())
    );
    let got = read_ok(r, &mut qp, NS_T1_MD16, 8, 2, w16.len(), pi(CHECK_ALL, 8, 0));
    assert!(
        got == w16,
        "PRACT regenerated the 16-byte metadata's tuples"
    );

    // Type 2: the reference tags start at the command's ILBRT, whatever
    // the LBA; a read must name the same seed.
    let w2 = ext_blocks_seeded(4, 0x00C0_FFEE, 6);
    let t2 = |p| RwPi {
        ilbrt: 0x00C0_FFEE,
        ..pi(p, 60, 0)
    };
    assert_eq!(
        io(r, &mut qp, true, NS_T2, 60, 4, &w2, t2(CHECK_ALL)).0,
        Ok(())
    );
    let got = read_ok(r, &mut qp, NS_T2, 60, 4, w2.len(), t2(CHECK_ALL));
    assert!(got == w2);
    let other = RwPi {
        ilbrt: 60,
        ..pi(CHECK_ALL, 60, 0)
    };
    assert_eq!(
        io(r, &mut qp, false, NS_T2, 60, 4, &vec![0; w2.len()], other).0,
        Err(NvmeStatus::REF_TAG_CHECK_ERROR)
    );

    // The host's own checks (insert mode, software): a tuple stored wrong
    // and read without the target's checks is found by the host with its
    // block.
    let fmt = PiNs::of(&ns(NS_T1)).unwrap();
    let (res, _) = io(
        r,
        &mut qp,
        false,
        NS_T1,
        500,
        2,
        &[0; 1040],
        fmt.rw_pi(HostPi::Insert, 500),
    );
    assert_eq!(
        res,
        Err(NvmeStatus::GUARD_CHECK_ERROR),
        "the target checks first"
    );
    let (res, wire2) = io(r, &mut qp, false, NS_T1, 500, 2, &[0; 1040], pi(0, 500, 0));
    assert_eq!(res, Ok(()));
    let mut mem = [0u8; 1024];
    let e = fmt
        .from_wire(HostPi::Insert, &wire2, &mut mem, 500)
        .unwrap_err();
    assert_eq!(
        (e.kind, e.offset / 520),
        (pollux_pi::PiErrorKind::Guard, 1),
        "LBA 501"
    );

    // Metadata without PI: moved as it is, PRINFO ignored.
    let mut m = vec![0x11u8; 4 * 520];
    m[520 + 513] = 0x99;
    assert_eq!(
        io(r, &mut qp, true, NS_MD, 0, 4, &m, pi(CHECK_ALL, 0, 0)).0,
        Ok(())
    );
    let got = read_ok(r, &mut qp, NS_MD, 0, 4, m.len(), pi(CHECK_ALL, 0, 0));
    assert!(got == m);

    // Write Zeroes leaves zeroed blocks with valid tuples (guard of zeroes,
    // app tag 0, ref tag = LBA) that PRACT and checked reads accept;
    // deallocation is advisory and leaves the blocks as they are.
    qp.write_zeroes(NS_T1, 700, 4, 2).unwrap();
    assert!(run_one(r, &mut qp).result.is_ok());
    let got = read_ok(r, &mut qp, NS_T1, 700, 4, 2048, pi(pract, 700, 0));
    assert!(got.iter().all(|b| *b == 0));
    let got = read_ok(r, &mut qp, NS_T1, 700, 4, 2080, pi(CHECK_ALL, 700, 0));
    for b in 0..4 {
        let tuple = [0, 0, 0, 0, 0, 0, 2, (700 + b - 512) as u8];
        assert_eq!(&got[b * 520 + 512..b * 520 + 520], &tuple, "block {b}");
    }
    let range = SgList::from_buf(DmaBuf::alloc(16).unwrap());
    qp.deallocate(NS_T1, slba, 16, range, 3).unwrap();
    assert!(run_one(r, &mut qp).result.is_ok());
    let got = read_ok(
        r,
        &mut qp,
        NS_T1,
        slba,
        16,
        old.len(),
        pi(CHECK_ALL, slba, 0x0007),
    );
    assert!(got == old);

    check(&qp);
    drop(qp);
    c.shutdown().unwrap();
}

#[test]
fn pi_over_soft_rdma_in_both_memory_modes() {
    let fx = fixture();
    let _pg = fx.cl.on(0, |r| fx.rdma.create_poll_group(r)).unwrap();
    fx.cl.poll_until_idle().unwrap();
    for mode in [MemMode::Pool, MemMode::RegisterAlways] {
        fx.cl.on(0, |r| {
            let opts = RdmaHostOptions {
                mem_mode: mode,
                remote_invalidate: true,
                connect_timeout: Duration::from_secs(5),
            };
            let t = RdmaHost::<Soft>::open(None, CmAddr::new(fx.soft_addr.clone()), opts).unwrap();
            pi_over(r, &t, |qp| {
                let q = qp.transport();
                let st = q.stats();
                assert_eq!(q.mem_mode(), mode);
                // Reads always go keyed: RegisterAlways registers each
                // one (and every key is invalidated again); Pool never
                // registers on the data path.
                if mode == MemMode::RegisterAlways {
                    assert!(st.registrations > 0, "{mode:?}: {st:?}");
                    assert_eq!(
                        st.registrations,
                        st.remote_invalidations + st.local_invalidations,
                        "{mode:?}: {st:?}"
                    );
                } else {
                    assert_eq!(st.registrations, 0, "{mode:?}: {st:?}");
                }
            });
        });
        fx.cl.poll_until_idle().unwrap();
    }
    assert!(fx.target.subsystem(NQN).is_some());
}

#[test]
fn pi_over_tcp_with_and_without_digests() {
    let fx = fixture();
    let _pg = fx.cl.on(0, |r| fx.tcp.create_poll_group(r)).unwrap();
    fx.cl.poll_until_idle().unwrap();
    for digests in [false, true] {
        fx.cl.on(0, |r| {
            let opts = TcpHostOptions {
                header_digest: digests,
                data_digest: digests,
                connect_timeout: Duration::from_secs(5),
            };
            let t = TcpHost::new(SocketAddr::V4(fx.tcp_addr), opts);
            pi_over(r, &t, |qp| {
                let d = qp.transport().digests();
                assert_eq!(
                    (d.header, d.data),
                    (digests, digests),
                    "digests the target granted"
                );
            });
        });
        fx.cl.poll_until_idle().unwrap();
    }
}

/// The host's signature offload (the soft provider's integrity MRs): insert
/// and DIX round trips, a DIX write whose tuple in memory lies (caught on
/// the way out; the target, checking the wire, refuses it too), and a
/// tuple stored wrong that only the host checks (PRCHK clear): the
/// integrity MR's status turns the completion into the guard error.
#[test]
fn pi_through_the_hosts_signature_offload() {
    let fx = fixture();
    let _pg = fx.cl.on(0, |r| fx.rdma.create_poll_group(r)).unwrap();
    fx.cl.poll_until_idle().unwrap();
    fx.cl.on(0, |r| {
        let opts = RdmaHostOptions {
            mem_mode: MemMode::Pool,
            remote_invalidate: true,
            connect_timeout: Duration::from_secs(5),
        };
        let t = RdmaHost::<Soft>::open(None, CmAddr::new(fx.soft_addr.clone()), opts).unwrap();
        let (c, mut qp) = connect(&t);
        assert!(
            qp.enable_pi_offload().unwrap(),
            "the soft provider has signature offload"
        );
        let ns1 = *c
            .info()
            .namespaces
            .iter()
            .find(|n| n.nsid == NS_T1)
            .unwrap();
        let fmt = PiNs::of(&ns1).unwrap();
        let run = |qp: &mut Qpair<_>, io: PiIo, mem: &[u8]| {
            submit_wait(r, qp, mem, |qp, b| {
                qp.rw_pi_offload(NS_T1, &io, b, 9).unwrap();
            })
        };
        let pio = |mode, slba, nlb, write, target_checks| PiIo {
            mode,
            fmt,
            slba,
            nlb,
            write,
            target_checks,
        };
        // Insert: data only in memory; the target stores the tuples the
        // host's MR generated.
        let data: Vec<u8> = (0..8 * 512).map(|i| (i % 253) as u8).collect();
        let (res, _) = run(&mut qp, pio(HostPi::Insert, 800, 8, true, true), &data);
        assert_eq!(res, Ok(()));
        let (res, got) = run(
            &mut qp,
            pio(HostPi::Insert, 800, 8, false, true),
            &vec![0; data.len()],
        );
        assert_eq!(res, Ok(()));
        assert!(got == data);
        let want = ext_blocks_from(&data, 800);
        let (_, stored) = io_plain(r, &mut qp, NS_T1, 800, 8, want.len());
        assert!(stored == want, "the tuples on the medium are the host MR's");
        // DIX: data then tuples in memory, both ways.
        let mut mem = data.clone();
        mem.extend(want.chunks(520).flat_map(|b| b[512..].to_vec()));
        let (res, _) = run(
            &mut qp,
            pio(HostPi::Dix, 900, 8, true, true),
            &dix_retag(&mem, 800, 900),
        );
        assert_eq!(res, Ok(()));
        let (res, got) = run(
            &mut qp,
            pio(HostPi::Dix, 900, 8, false, true),
            &vec![0; mem.len()],
        );
        assert_eq!(res, Ok(()));
        assert!(got == dix_retag(&mem, 800, 900));
        // A DIX write whose block 2 guard lies in memory.
        let mut bad = dix_retag(&mem, 800, 900);
        bad[8 * 512 + 2 * 8] ^= 0x40;
        let (res, _) = run(&mut qp, pio(HostPi::Dix, 900, 8, true, true), &bad);
        assert_eq!(res, Err(NvmeStatus::GUARD_CHECK_ERROR));
        // LBA 501's stored guard is bad (written raw, unchecked); with
        // PRCHK clear only the host's integrity MR checks it.
        let mut stored = ext_blocks(512, 8, 2, 500, PiType::Type1, 0, 3);
        stored[520 + 512] ^= 0x01;
        assert_eq!(
            io(r, &mut qp, true, NS_T1, 500, 2, &stored, pi(0, 500, 0)).0,
            Ok(())
        );
        let before = qp.transport().stats().pi_errors;
        let (res, _) = run(
            &mut qp,
            pio(HostPi::Insert, 500, 2, false, false),
            &[0; 1024],
        );
        assert_eq!(res, Err(NvmeStatus::GUARD_CHECK_ERROR));
        assert_eq!(qp.transport().stats().pi_errors, before + 1);
        drop(qp);
        c.shutdown().unwrap();
    });
}

/// `data`'s 512-byte blocks at `slba` with Type 1 tuples (app tag 0).
fn ext_blocks_from(data: &[u8], slba: u64) -> Vec<u8> {
    let p = PiParams::for_type(PiType::Type1, 512, slba as u32, 0);
    let mut v = Vec::new();
    for (i, d) in data.chunks(512).enumerate() {
        v.extend_from_slice(d);
        v.extend_from_slice(&p.tuple_for(i as u64, d).encode());
    }
    v
}

/// A DIX image (data then tuples) of blocks at `from` with its reference
/// tags moved to start at `to`.
fn dix_retag(mem: &[u8], from: u64, to: u64) -> Vec<u8> {
    let mut m = mem.to_vec();
    let n = m.len() / 520;
    for i in 0..n {
        let at = n * 512 + i * 8 + 4;
        let r = u32::from_be_bytes(m[at..at + 4].try_into().unwrap());
        m[at..at + 4].copy_from_slice(&(r - from as u32 + to as u32).to_be_bytes());
    }
    m
}

/// Read `len` wire bytes of `nlb` blocks without PI checks.
fn io_plain<Q: HostQueue>(
    r: &Reactor,
    qp: &mut Qpair<Q>,
    nsid: u32,
    slba: u64,
    nlb: u32,
    len: usize,
) -> (Result<(), NvmeStatus>, Vec<u8>) {
    io(r, qp, false, nsid, slba, nlb, &vec![0; len], pi(0, slba, 0))
}

/// A Read with `pi` into `len` bytes of 0xA5 (so that data which did not
/// arrive shows) that must succeed; its data.
fn read_ok<Q: HostQueue>(
    r: &Reactor,
    qp: &mut Qpair<Q>,
    nsid: u32,
    slba: u64,
    nlb: u32,
    len: usize,
    pi: RwPi,
) -> Vec<u8> {
    let (res, got) = io(r, qp, false, nsid, slba, nlb, &vec![0xA5; len], pi);
    assert_eq!(
        res,
        Ok(()),
        "read of {nlb} blocks at {slba} of namespace {nsid}"
    );
    got
}
