//! Data-path rules of NVMe-oF over the software RDMA provider: with the
//! target and the host warm, 100,000 I/Os (reads by RDMA WRITE, writes in
//! the capsule or by RDMA READ) in the host's `pool` and `register-always`
//! memory modes make no heap allocation and take no lock, on either side;
//! nor do 100,000 I/Os on a PI namespace with PRACT (the target spreads,
//! generates, checks and strips) or through the host's signature offload.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::rules::{
    assert_clean, assert_counters_work, measure_from_here, measure_to_here, nvmf_queue, run_nvmf,
    run_nvmf_pi, QueueFill, N,
};
use pollux_nvmf::host::pi::{HostPi, PiNs};
use pollux_nvmf::host::rdma::{MemMode, RdmaHost, RdmaHostOptions};
use pollux_reactor::mem::CountingAlloc;
use pollux_reactor::TestCluster;
use pollux_verbs::soft::Soft;
use pollux_verbs::CmAddr;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

const NQN: &str = "nqn.2024-01.io.pollux:rules";
const DEPTH: usize = 32;

#[test]
fn nvmf_target_and_host_allocate_nothing_and_lock_nothing_per_io() {
    assert_counters_work();
    let addr = format!("@pollux-rules-nvmf-{}", std::process::id());
    let (_target, transport) =
        common::soft_rdma_target(NQN, "malloc:size=8M,block=512,name=rules-nvmf", &addr);
    let cl = TestCluster::new(1);
    let _pg = cl.on(0, |r| transport.create_poll_group(r)).unwrap();
    cl.poll_until_idle().unwrap();
    // (memory mode, inline capacity, I/O size): 4 KiB writes travel in the
    // capsule; with no in-capsule data, 8 KiB writes are RDMA READs; a
    // 128 KiB transfer takes four of the target's 32 KiB buffers (a
    // multi-segment list, its block recycled on the core).
    let cases = [
        (MemMode::Pool, None, 4096),
        (MemMode::Pool, Some(0), 8192),
        (MemMode::Pool, Some(0), 128 * 1024),
        (MemMode::RegisterAlways, None, 4096),
        (MemMode::RegisterAlways, Some(0), 8192),
    ];
    for (mode, inline_cap, size) in cases {
        cl.on(0, |r| {
            let opts = RdmaHostOptions {
                mem_mode: mode,
                remote_invalidate: true,
                connect_timeout: Duration::from_secs(5),
            };
            let t = RdmaHost::<Soft>::open(None, CmAddr::new(addr.clone()), opts).unwrap();
            let (_c, mut qp) = nvmf_queue(&t, *b"rules-nvmf-host1", NQN, inline_cap);
            let mut fill = QueueFill::new("rules-nvmf", size, DEPTH);
            run_nvmf(r, &mut qp, &mut fill, N / 10);
            let before = measure_from_here();
            run_nvmf(r, &mut qp, &mut fill, N);
            let after = measure_to_here();
            let st = qp.transport().stats();
            assert_clean(
                &format!("{mode:?} inline_cap={inline_cap:?} size={size} {st:?}"),
                before,
                after,
            );
            if inline_cap.is_none() {
                assert!(st.inline > 0, "writes went in the capsule: {st:?}");
            } else {
                assert_eq!(st.inline, 0, "writes went by RDMA READ: {st:?}");
            }
            if mode == MemMode::RegisterAlways {
                // Every read registers; writes too unless they are in the capsule.
                assert!(st.registrations >= N / 2, "{st:?}");
            }
            qp.disconnect();
        });
        cl.poll_until_idle().unwrap();
    }
    pi_namespace_allocates_nothing_and_locks_nothing_per_io();
}

/// The PI part of the test (one test per binary: the lock counter is
/// process-wide).
fn pi_namespace_allocates_nothing_and_locks_nothing_per_io() {
    let addr = format!("@pollux-rules-nvmf-pi-{}", std::process::id());
    let (_target, transport) = common::soft_rdma_target(
        NQN,
        "malloc:size=8M,block=512,md=8,md_interleave=true,pi=1,name=rules-nvmf-pi",
        &addr,
    );
    let cl = TestCluster::new(1);
    let _pg = cl.on(0, |r| transport.create_poll_group(r)).unwrap();
    cl.poll_until_idle().unwrap();
    // PRACT: the target spreads each write's blocks, generates their
    // tuples, and checks and strips each read's (4 KiB in the capsule, 8 KiB
    // by RDMA READ); insert: the host's integrity MR generates, checks and
    // strips, the target checks.
    let cases = [
        (HostPi::Pract, None, 4096),
        (HostPi::Pract, Some(0), 8192),
        (HostPi::Insert, None, 4096),
    ];
    for (mode, inline_cap, size) in cases {
        cl.on(0, |r| {
            let opts = RdmaHostOptions {
                mem_mode: MemMode::Pool,
                remote_invalidate: true,
                connect_timeout: Duration::from_secs(5),
            };
            let t = RdmaHost::<Soft>::open(None, CmAddr::new(addr.clone()), opts).unwrap();
            let (c, mut qp) = nvmf_queue(&t, *b"rules-nvmf-host2", NQN, inline_cap);
            let fmt = PiNs::of(&c.info().namespaces[0]).expect("a PI namespace");
            if mode != HostPi::Pract {
                assert!(qp.enable_pi_offload().unwrap());
            }
            let mut fill = QueueFill::new("rules-nvmf-pi", size, DEPTH);
            run_nvmf_pi(r, &mut qp, &mut fill, N / 10, Some((fmt, mode)));
            let before = measure_from_here();
            run_nvmf_pi(r, &mut qp, &mut fill, N, Some((fmt, mode)));
            let after = measure_to_here();
            assert_clean(
                &format!("PI {mode:?} inline_cap={inline_cap:?} size={size}"),
                before,
                after,
            );
            qp.disconnect();
        });
        cl.poll_until_idle().unwrap();
    }
}
