//! The host library over TCP against the target: data verified at every
//! size, both digests on and off, in-capsule and R2T writes, reads with
//! and without C2H SUCCESS, admin, I/O and discovery commands.

use pollux_reactor::mem::{BufPool, BufPoolOptions, DmaBuf, SgList};
use pollux_reactor::Reactor;

use super::*;
use crate::host::test_io::{reap, write_read_verify};
use crate::host::{discover, Completion, Controller, CtrlOptions, Qpair};
use crate::spec::log_page::SUBTYPE_NVME;
use crate::spec::transport_id::{AdrFam, TrType};

fn small_pdus() -> TcpOptions {
    TcpOptions {
        // Several R2Ts per large write and several C2HData PDUs per read.
        maxh2cdata: 16 * 1024,
        max_c2h_data: 32 * 1024,
        ..TcpOptions::default()
    }
}

/// Write `n` I/Os of `size` bytes, read them back, compare; returns the
/// queue's counters.
fn verify(
    r: &Reactor,
    qp: &mut Qpair<crate::host::tcp::TcpQueue>,
    size: usize,
    n: u64,
) -> crate::host::tcp::TcpQueueStats {
    let pool = BufPool::new(BufPoolOptions::new("tcp-host-test", size, 16)).unwrap();
    let bad = write_read_verify(r, qp, &pool, size as u64, n);
    assert_eq!(bad, 0, "{bad} of {n} reads of {size} B miscompared");
    qp.transport().stats()
}

fn sizes_with_digests(header: bool, data: bool) {
    let f = fixture(small_pdus());
    f.cl.on(0, |r| {
        let t = f.host(header, data);
        let c = Controller::connect(&t, who(), CtrlOptions::default()).unwrap();
        assert_eq!(c.info().namespaces.len(), 1);
        let mut qp = c.connect_io(&t, 1, 16, None).unwrap();
        let d = qp.transport().digests();
        assert_eq!((d.header, d.data), (header, data));
        for size in [512usize, 4096, 8192, 65536, 1 << 20] {
            let before = qp.transport().stats();
            let st = verify(r, &mut qp, size, 12);
            if size <= 4096 {
                assert!(st.inline > before.inline, "{size} B: {st:?}");
                assert_eq!(st.r2t, before.r2t, "{size} B went by R2T");
            } else {
                assert!(
                    st.r2t >= before.r2t + 12 * (size as u64 / 16384).max(1),
                    "{size} B: {st:?}"
                );
            }
            // Every read but none of the others ended with SUCCESS.
            assert_eq!(st.c2h_success - before.c2h_success, 12, "{size} B: {st:?}");
            assert_eq!(st.data_digest_errors, 0);
        }
        drop(qp);
        drop(c);
    });
    f.settle();
    f.assert_pool_full();
}

#[test]
fn every_size_without_digests() {
    sizes_with_digests(false, false);
}

#[test]
fn every_size_with_header_digest() {
    sizes_with_digests(true, false);
}

#[test]
fn every_size_with_data_digest() {
    sizes_with_digests(false, true);
}

#[test]
fn every_size_with_both_digests() {
    sizes_with_digests(true, true);
}

#[test]
fn reads_without_c2h_success_end_with_a_response_capsule() {
    let f = fixture(TcpOptions {
        c2h_success: false,
        ..small_pdus()
    });
    f.cl.on(0, |r| {
        let t = f.host(true, true);
        let c = Controller::connect(&t, who(), CtrlOptions::default()).unwrap();
        let mut qp = c.connect_io(&t, 1, 16, None).unwrap();
        for size in [512usize, 65536] {
            let st = verify(r, &mut qp, size, 8);
            assert_eq!(st.c2h_success, 0, "{st:?}");
            assert!(st.c2h_pdus >= 8);
        }
    });
    f.settle();
    f.assert_pool_full();
}

#[test]
fn in_capsule_writes_can_be_turned_off_by_the_host() {
    let f = fixture(small_pdus());
    f.cl.on(0, |r| {
        let t = f.host(false, false);
        let c = Controller::connect(&t, who(), CtrlOptions::default()).unwrap();
        let mut qp = c.connect_io(&t, 1, 16, Some(0)).unwrap();
        let st = verify(r, &mut qp, 512, 8);
        assert_eq!(st.inline, 0);
        // The queue's Connect data went by R2T too.
        assert_eq!(st.r2t, 8 + 1);
    });
    f.settle();
}

fn one(r: &Reactor, qp: &mut Qpair<crate::host::tcp::TcpQueue>) -> Completion {
    reap(r, qp, 1).pop().unwrap()
}

#[test]
fn admin_io_and_discovery_commands_work_over_tcp() {
    let f = fixture(TcpOptions::default());
    f.cl.on(0, |r| {
        let t = f.host(false, true);
        // Discovery: the TCP listener, with its transport type and family.
        let log = discover(&t, DEFAULT_HOSTNQN, CtrlOptions::default()).unwrap();
        let e = log.iter().find(|e| e.subtype == SUBTYPE_NVME).unwrap();
        assert_eq!(e.subnqn, NQN);
        assert_eq!((e.trtype, e.adrfam), (TrType::Tcp, AdrFam::Ipv4));
        assert_eq!(e.trsvcid, f.addr.port().to_string());
        assert_eq!(e.traddr, "127.0.0.1");
        assert!(e.rdma.is_none(), "TSAS of a TCP entry: security type none");
        let mut c = Controller::connect(&t, who(), CtrlOptions::default()).unwrap();
        let ns = &c.info().namespaces[0];
        assert_eq!(ns.block_size, 512);
        // Get Log Page through the admin queue (error log, 4 KiB).
        let page = c.get_log_page(0x01, 0xFFFF_FFFF, 4096, 0).unwrap();
        assert_eq!(page.len(), 4096);
        let mut qp = c.connect_io(&t, 1, 8, None).unwrap();
        // Write a pattern, zero part of it, deallocate another part, flush.
        let mut b = DmaBuf::alloc(8192).unwrap();
        b.as_mut_slice().fill(0xA5);
        qp.write(1, 0, 16, SgList::from_buf(b), 1).unwrap();
        assert!(one(r, &mut qp).result.is_ok());
        qp.write_zeroes(1, 0, 4, 2).unwrap();
        assert!(one(r, &mut qp).result.is_ok());
        let range = DmaBuf::alloc(16).unwrap();
        qp.deallocate(1, 8, 8, SgList::from_buf(range), 3).unwrap();
        assert!(one(r, &mut qp).result.is_ok());
        qp.flush_ns(1, 4).unwrap();
        assert!(one(r, &mut qp).result.is_ok());
        qp.read(1, 0, 8, SgList::from_buf(DmaBuf::alloc(4096).unwrap()), 5)
            .unwrap();
        let c5 = one(r, &mut qp);
        assert!(c5.result.is_ok());
        let mut have = vec![0u8; 4096];
        c5.data.copy_to_slice(&mut have);
        assert!(have[..2048].iter().all(|&x| x == 0), "write zeroes");
        assert!(have[2048..].iter().all(|&x| x == 0xA5), "data kept");
        // An I/O beyond the namespace fails with an NVMe status, not a
        // transport error.
        qp.read(
            1,
            1 << 40,
            1,
            SgList::from_buf(DmaBuf::alloc(512).unwrap()),
            6,
        )
        .unwrap();
        assert!(one(r, &mut qp).result.is_err());
        drop(qp);
        c.poll().unwrap();
        c.shutdown().unwrap();
    });
    f.settle();
    f.assert_pool_full();
    let st = f.transport.stats();
    assert_eq!(st.accepted, st.destroyed);
    assert_eq!(st.terminated, 0);
}

#[test]
fn io_queues_beyond_max_io_qpairs_per_ctrlr_are_refused() {
    let f = fixture(TcpOptions {
        max_io_qpairs_per_ctrlr: 1,
        ..TcpOptions::default()
    });
    f.cl.on(0, |_| {
        let t = f.host(false, false);
        let opts = CtrlOptions {
            io_queues: 2,
            ..CtrlOptions::default()
        };
        let c = Controller::connect(&t, who(), opts).unwrap();
        assert_eq!(c.info().io_queues, 2, "the subsystem grants two");
        let q1 = c.connect_io(&t, 1, 8, None).unwrap();
        match c.connect_io(&t, 2, 8, None) {
            Err(crate::host::HostError::ConnectRefused { qid, status, .. }) => {
                assert_eq!(qid, 2);
                assert_eq!(
                    status,
                    crate::spec::cpl::NvmeStatus::CONNECT_INVALID_PARAMETERS
                );
            }
            other => panic!("queue 2 connected: {other:?}"),
        }
        drop(q1);
    });
    f.settle();
}

#[test]
fn rdma_and_tcp_listeners_serve_at_once_started_through_the_target() {
    use crate::host::rdma::{RdmaHost, RdmaHostOptions};
    use crate::target::rdma::{RdmaOptions, RdmaTransport};
    use pollux_verbs::soft::Soft;
    use pollux_verbs::CmAddr;

    let cl = TestCluster::new(1);
    let target = Target::new(target_options()).unwrap();
    let mut sc = SubsystemConfig::new(NQN);
    sc.allow_any_host = true;
    let sub = target.add_subsystem(sc).unwrap();
    let reg = BdevRegistry::new();
    sub.add_namespace(NamespaceConfig::new(
        reg.create("malloc:size=1M,block=512,name=m").unwrap(),
    ))
    .unwrap();
    let rdma = RdmaTransport::<Soft>::new(&target, RdmaOptions::for_tests()).unwrap();
    target.add_transport(rdma.clone()).unwrap();
    let tcp = TcpTransport::new(&target, TcpOptions::default()).unwrap();
    target.add_transport(tcp.clone()).unwrap();
    let soft_addr = format!("@pollux-tcp-mixed-{}", std::process::id());
    target
        .add_listener(TransportId {
            trtype: TrType::Rdma,
            adrfam: AdrFam::IntraHost,
            traddr: soft_addr.clone(),
            trsvcid: String::new(),
        })
        .unwrap();
    let port = free_port("127.0.0.1");
    target
        .add_listener(TransportId::tcp_ipv4("127.0.0.1", port.to_string()))
        .unwrap();
    // The application's way: one call, no transport named.
    let groups = cl.on(0, |r| target.start_poll_groups(r)).unwrap();
    let names: Vec<_> = groups.iter().map(|g| g.transport_name()).collect();
    assert_eq!(names, ["rdma", "tcp"]);
    cl.poll_until_idle().unwrap();
    assert_eq!(groups.iter().map(|g| g.listeners()).sum::<usize>(), 2);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    cl.on(0, |_| {
        let t = TcpHost::new(addr, TcpHostOptions::default());
        let log = discover(&t, DEFAULT_HOSTNQN, CtrlOptions::default()).unwrap();
        let mut kinds: Vec<_> = log
            .iter()
            .filter(|e| e.subtype == SUBTYPE_NVME)
            .map(|e| e.trtype)
            .collect();
        kinds.sort_by_key(|t| t.code());
        assert_eq!(kinds, [TrType::Rdma, TrType::Tcp]);
        let c_tcp = Controller::connect(&t, who(), CtrlOptions::default()).unwrap();
        let r = RdmaHost::<Soft>::open(
            None,
            CmAddr::new(soft_addr.clone()),
            RdmaHostOptions::default(),
        )
        .unwrap();
        let c_rdma = Controller::connect(&r, who(), CtrlOptions::default()).unwrap();
        assert_ne!(c_tcp.info().cntlid, c_rdma.info().cntlid);
        assert_eq!(groups.iter().map(|g| g.connections()).sum::<usize>(), 2);
        for g in &groups {
            g.shutdown();
        }
        drop((c_tcp, c_rdma));
    });
    for _ in 0..100_000 {
        cl.poll_once_all();
        if groups.iter().all(|g| g.connections() == 0) {
            break;
        }
    }
    assert!(groups.iter().all(|g| g.connections() == 0));
    let st = target.transport_stats();
    assert_eq!(st.accepted, st.destroyed);
    assert_eq!(
        st.accepted, 3,
        "discovery and one controller over TCP, one over RDMA"
    );
}

#[test]
fn the_host_reconnects_when_the_target_comes_back() {
    use crate::host::CtrlState;
    use std::time::{Duration, Instant};

    let f = fixture(TcpOptions::default());
    let trid = TransportId::tcp_ipv4("127.0.0.1", f.addr.port().to_string());
    f.cl.on(0, |r| {
        let t = f.host(true, true);
        let opts = CtrlOptions {
            reconnect_delay: Duration::from_millis(20),
            ctrl_loss_tmo: Duration::from_secs(10),
            ..CtrlOptions::default()
        };
        let mut c = Controller::connect(&t, who(), opts).unwrap();
        let link = c.link().clone();
        let mut seen = link.generation();
        let mut qp = c.connect_io(&t, 1, 8, None).unwrap();
        let pool = BufPool::new(BufPoolOptions::new("tcp-reconnect", 8192, 8)).unwrap();
        assert_eq!(write_read_verify(r, &mut qp, &pool, 1, 4), 0);
        // The target goes away: no listener, every controller torn down.
        f.target.remove_listener(&trid).unwrap();
        for s in f.target.subsystems() {
            for ctl in s.controllers() {
                ctl.fatal();
            }
        }
        let until = |c: &mut Controller<_>, want: CtrlState| {
            let start = Instant::now();
            loop {
                let s = c.poll_recover(&t);
                if s == want || start.elapsed() > Duration::from_secs(10) {
                    return s;
                }
                r.poll_once();
                std::thread::sleep(Duration::from_millis(2));
            }
        };
        assert_eq!(
            until(&mut c, CtrlState::Reconnecting),
            CtrlState::Reconnecting
        );
        // It comes back on the same address.
        f.target.add_listener(trid.clone()).unwrap();
        assert_eq!(until(&mut c, CtrlState::Live), CtrlState::Live);
        assert_eq!(link.reconnects(), 1);
        let mut qp = link
            .reconnect_io(&t, &mut seen, 1, 8, None)
            .unwrap()
            .expect("a new I/O queue once the controller is back");
        // Verified I/O on the new queue.
        assert_eq!(write_read_verify(r, &mut qp, &pool, 7, 4), 0);
        drop(qp);
        c.poll().unwrap();
    });
    f.settle();
    f.assert_pool_full();
}
