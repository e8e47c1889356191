//! Data-path rules of NVMe-oF over the software RDMA provider: with the
//! target and the host warm, 100,000 I/Os (reads by RDMA WRITE, writes in
//! the capsule or by RDMA READ) in the host's `pool` and `register-always`
//! memory modes make no heap allocation and take no lock, on either side.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::rules::{
    assert_clean, assert_counters_work, measure_from_here, measure_to_here, QueueFill, N,
};
use pollux_nvmf::host::rdma::{MemMode, RdmaHost, RdmaHostOptions};
use pollux_nvmf::host::{Controller, CtrlOptions, HostIdentity, HostQueue, Qpair, DEFAULT_HOSTNQN};
use pollux_reactor::mem::CountingAlloc;
use pollux_reactor::{Reactor, TestCluster};
use pollux_verbs::soft::Soft;
use pollux_verbs::CmAddr;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

const NQN: &str = "nqn.2024-01.io.pollux:rules";
const DEPTH: usize = 32;

/// Keep `DEPTH` I/Os in flight on `qp` until `ios` more completed.
fn run<Q: HostQueue>(r: &Reactor, qp: &mut Qpair<Q>, fill: &mut QueueFill, ios: u64) {
    fill.run(
        qp,
        ios,
        |qp, io| {
            let sub = if io.read {
                qp.read(1, io.lba, io.blocks, io.bufs, io.n)
            } else {
                qp.write(1, io.lba, io.blocks, io.bufs, io.n)
            };
            sub.map_err(|e| e.data)
        },
        |qp, done| {
            qp.poll(&mut |c| done(c.result.is_ok(), Some(c.data)));
            r.poll_once();
        },
    );
}

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
    // capsule; with no in-capsule data, 8 KiB writes are RDMA READs.
    let cases = [
        (MemMode::Pool, None, 4096),
        (MemMode::Pool, Some(0), 8192),
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
            let who = HostIdentity {
                hostnqn: DEFAULT_HOSTNQN.into(),
                hostid: *b"rules-nvmf-host1",
                subnqn: NQN.into(),
            };
            let c = Controller::connect(
                &t,
                who,
                CtrlOptions {
                    io_queues: 1,
                    ..CtrlOptions::default()
                },
            )
            .unwrap();
            let mut qp = c.connect_io(&t, 1, 64, inline_cap).unwrap();
            let mut fill = QueueFill::new("rules-nvmf", size, DEPTH);
            run(r, &mut qp, &mut fill, N / 10);
            let before = measure_from_here();
            run(r, &mut qp, &mut fill, N);
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
}
