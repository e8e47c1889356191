//! Data-path rules of NVMe/TCP: with the target and the host warm on one
//! reactor over loopback, 100,000 I/Os each of 512 B (writes in the
//! capsule, copied into the send buffer; reads copied beside their
//! C2HData header), 4 KiB (writes in the capsule sent from the caller's
//! buffers by scatter-gather; reads sent from the request's buffers by
//! scatter-gather) and 64 KiB (writes by R2T, their H2CData from the
//! caller's buffers; reads by scatter-gather), with digests off and on,
//! make no heap allocation and take no lock, on either side. The host
//! receives read data straight into the caller's buffers.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::{SocketAddr, SocketAddrV4};
use std::time::Duration;

use common::rules::{
    assert_clean, assert_counters_work, measure_from_here, measure_to_here, nvmf_queue, run_nvmf,
    QueueFill, N,
};
use pollux_nvmf::host::tcp::{TcpHost, TcpHostOptions};
use pollux_nvmf::target::tcp::TcpOptions;
use pollux_nvmf::target::TargetOptions;
use pollux_reactor::mem::CountingAlloc;
use pollux_reactor::{free_tcp_port, TestCluster};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

const NQN: &str = "nqn.2024-01.io.pollux:rules-tcp";
const DEPTH: usize = 32;

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
        (true, 4096),
        (true, 65536),
    ] {
        cl.on(0, |r| {
            let opts = TcpHostOptions {
                header_digest: digests,
                data_digest: digests,
                connect_timeout: Duration::from_secs(5),
            };
            let t = TcpHost::new(SocketAddr::V4(addr), opts);
            let (_c, mut qp) = nvmf_queue(&t, *b"rules-nvmf-tcp-1", NQN, None);
            let mut fill = QueueFill::new("rules-nvmf-tcp", size, DEPTH);
            run_nvmf(r, &mut qp, &mut fill, N / 10);
            let before = measure_from_here();
            run_nvmf(r, &mut qp, &mut fill, N);
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
            if size >= 4096 {
                assert!(
                    st.sent_by_ref > 0,
                    "writes left from the caller's buffers: {st:?}"
                );
            } else {
                assert_eq!(st.sent_by_ref, 0, "small writes were copied: {st:?}");
            }
            qp.disconnect();
        });
        cl.poll_until_idle().unwrap();
    }
}
