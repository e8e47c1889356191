//! Data-path rules of NVMe/TCP: with the target and the host warm on one
//! reactor over loopback, 100,000 I/Os each of 512 B (writes in the
//! capsule, reads copied beside their C2HData header), 4 KiB (in the
//! capsule; reads sent from the request's buffers by scatter-gather) and
//! 64 KiB (writes by R2T, reads by scatter-gather), with
//! digests off and on, make no heap allocation and take no lock, on either
//! side.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::{SocketAddr, SocketAddrV4};
use std::time::Duration;

use common::rules::{
    assert_clean, assert_counters_work, measure_from_here, measure_to_here, QueueFill, N,
};
use pollux_nvmf::host::tcp::{TcpHost, TcpHostOptions, TcpQueue};
use pollux_nvmf::host::{Controller, CtrlOptions, HostIdentity, Qpair, DEFAULT_HOSTNQN};
use pollux_nvmf::target::tcp::TcpOptions;
use pollux_nvmf::target::TargetOptions;
use pollux_reactor::mem::CountingAlloc;
use pollux_reactor::{free_tcp_port, Reactor, TestCluster};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

const NQN: &str = "nqn.2024-01.io.pollux:rules-tcp";
const DEPTH: usize = 32;

/// Keep `DEPTH` I/Os in flight on `qp` until `ios` more completed.
fn run(r: &Reactor, qp: &mut Qpair<TcpQueue>, fill: &mut QueueFill, ios: u64) {
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
fn nvmf_tcp_target_and_host_allocate_nothing_and_lock_nothing_per_io() {
    assert_counters_work();
    let port = free_tcp_port("127.0.0.1");
    let addr = SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, port);
    let (_target, transport) = common::tcp_target_with(
        NQN,
        "malloc:size=16M,block=512,name=rules-nvmf-tcp",
        addr,
        TargetOptions::default(),
        TcpOptions::default(),
    );
    let cl = TestCluster::new(1);
    let _pg = cl.on(0, |r| transport.create_poll_group(r)).unwrap();
    cl.poll_until_idle().unwrap();
    for (digests, size) in [
        (false, 512),
        (false, 4096),
        (false, 65536),
        (true, 512),
        (true, 65536),
    ] {
        cl.on(0, |r| {
            let opts = TcpHostOptions {
                header_digest: digests,
                data_digest: digests,
                connect_timeout: Duration::from_secs(5),
            };
            let t = TcpHost::new(SocketAddr::V4(addr), opts);
            let who = HostIdentity {
                hostnqn: DEFAULT_HOSTNQN.into(),
                hostid: *b"rules-nvmf-tcp-1",
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
            let mut qp = c.connect_io(&t, 1, 64, None).unwrap();
            let mut fill = QueueFill::new("rules-nvmf-tcp", size, DEPTH);
            run(r, &mut qp, &mut fill, N / 10);
            let before = measure_from_here();
            run(r, &mut qp, &mut fill, N);
            let after = measure_to_here();
            let st = qp.transport().stats();
            assert_clean(
                &format!("digests={digests} size={size} {st:?}"),
                before,
                after,
            );
            if size <= 4096 {
                assert!(st.inline > 0, "writes went in the capsule: {st:?}");
            } else {
                assert!(st.r2t > 0, "writes went by R2T: {st:?}");
            }
            assert!(st.c2h_pdus > 0, "{st:?}");
            qp.disconnect();
        });
        cl.poll_until_idle().unwrap();
    }
}
