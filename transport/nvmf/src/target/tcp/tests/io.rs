//! The host library over TCP against the target: data verified at every
//! size, both digests on and off, in-capsule and R2T writes, reads with
//! and without C2H SUCCESS, admin, I/O and discovery commands.

use pollux_reactor::mem::{BufPool, BufPoolOptions, DmaBuf, SgList};
use pollux_reactor::Reactor;

use super::*;
use crate::host::{
    discover, Completion, Controller, CtrlOptions, HostQueue, Qpair, SubmitErrorKind,
};
use crate::spec::log_page::SUBTYPE_NVME;
use crate::spec::transport_id::{AdrFam, TrType};

fn reap<Q: HostQueue>(r: &Reactor, qp: &mut Qpair<Q>, n: usize) -> Vec<Completion> {
    let mut out = Vec::new();
    for _ in 0..2_000_000 {
        qp.poll(&mut |c| out.push(c));
        if out.len() >= n {
            return out;
        }
        r.poll_once();
    }
    panic!("only {} of {n} completions", out.len());
}

fn pattern(seed: u64, b: &mut [u8]) {
    for (i, x) in b.iter_mut().enumerate() {
        *x = (i as u64)
            .wrapping_mul(131)
            .wrapping_add(seed.wrapping_mul(7)) as u8;
    }
}

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
    f: &Fx,
    r: &Reactor,
    qp: &mut Qpair<crate::host::tcp::TcpQueue>,
    size: usize,
    n: u64,
) -> crate::host::tcp::TcpQueueStats {
    let pool = BufPool::new(BufPoolOptions::new("tcp-host-test", size, 16)).unwrap();
    let blocks = (size / 512) as u32;
    let mut submitted = 0;
    let mut done = Vec::new();
    while submitted < n {
        let Some(mut b) = pool.get() else {
            done.extend(reap(r, qp, 1));
            continue;
        };
        pattern(submitted + size as u64, b.as_mut_slice());
        match qp.write(
            1,
            submitted * u64::from(blocks),
            blocks,
            SgList::from_buf(b),
            submitted,
        ) {
            Ok(()) => submitted += 1,
            Err(e) => {
                assert_eq!(e.kind, SubmitErrorKind::Busy);
                done.extend(reap(r, qp, 1));
            }
        }
    }
    while done.len() < n as usize {
        done.extend(reap(r, qp, 1));
    }
    assert!(
        done.iter().all(|c| c.result.is_ok()),
        "a write failed at {size} B"
    );
    drop(done);
    let mut bad = 0;
    let mut got = 0;
    let mut next = 0u64;
    while got < n {
        if next < n {
            if let Some(mut b) = pool.get() {
                b.as_mut_slice().fill(0xEE);
                match qp.read(
                    1,
                    next * u64::from(blocks),
                    blocks,
                    SgList::from_buf(b),
                    next,
                ) {
                    Ok(()) => next += 1,
                    Err(e) => assert_eq!(e.kind, SubmitErrorKind::Busy),
                }
            }
        }
        qp.poll(&mut |c| {
            assert!(c.result.is_ok(), "read at {size} B: {:?}", c.result);
            let mut want = vec![0u8; size];
            pattern(c.ctx + size as u64, &mut want);
            let mut have = vec![0u8; size];
            c.data.copy_to_slice(&mut have);
            if have != want {
                bad += 1;
            }
            got += 1;
        });
        r.poll_once();
    }
    assert_eq!(bad, 0, "{bad} of {n} reads of {size} B miscompared");
    let _ = f;
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
            let st = verify(&f, r, &mut qp, size, 12);
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
            let st = verify(&f, r, &mut qp, size, 8);
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
        let st = verify(&f, r, &mut qp, 512, 8);
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
