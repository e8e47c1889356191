//! A queue the target ends for a malformed capsule in the middle of I/O
//! gives back everything it took: its receive buffers, the data buffers
//! of the transfers in flight, its placement seat and its queue id (the
//! same QID connects again on the same controller). The same for a queue
//! whose RDMA op fails on a stale key and one sent a capsule longer than
//! its receive buffers; bad input that leaves the queue usable (an LBA
//! out of range, an SGL type RDMA cannot serve) gets its status and takes
//! nothing.

use super::host::spin;
use super::*;
use crate::spec::cpl::NvmeStatus;

#[test]
fn a_queue_ended_for_a_malformed_capsule_mid_io_returns_everything() {
    let fx = fixture(RdmaOptions::for_tests());
    let (admin, cntlid) = fx.admin();
    let pool_start = fx.target.data_pool().available() + fx.cached();
    let mut io = fx.io(cntlid, 8);
    assert_eq!(fx.transport.queues_per_group(), vec![2]);
    // Two 128 KiB writes (RDMA READ), a read (RDMA WRITE) and an
    // in-capsule write in flight, then a 20-byte capsule in the same batch.
    io_in_flight(&mut io, 9, false);
    io.send_short(20);
    // The target closes the queue; the host sees it die.
    let gone = spin(&fx.cl, || (fx.pg.connections() == 1).then_some(()));
    assert!(gone.is_some(), "the queue was not destroyed");
    let dead = spin(&fx.cl, || (!io.poll()).then_some(()));
    assert!(dead.is_some(), "the host's queue stays up");
    fx.assert_recv_buffers_back();
    let back = || fx.target.data_pool().available() + fx.cached() == pool_start;
    let _ = spin(&fx.cl, || back().then_some(()));
    assert!(back(), "data buffers leaked");
    assert_eq!(fx.transport.queues_per_group(), vec![1], "its seat is free");
    let ts = fx.transport.stats();
    assert_eq!((ts.accepted, ts.destroyed), (2, 1));
    // QID 1 of the same controller is free: it connects again and writes.
    drop(io);
    let mut again = fx.io(cntlid, 8);
    let w = rw(0x01, 5, 0, 4096, &SglDescriptor::in_capsule(0, 4096));
    let rsp = again.exec(&fx.cl, &w, &pattern(3, 4096));
    assert!(rsp.cpl.status.is_success(), "{:?}", rsp.cpl);
    drop(again);
    drop(admin);
}

/// A queue connected at the RDMA CM level whose host never sends a
/// Fabrics Connect has no controller, so no keep-alive ends it: the
/// target disconnects it once `connect_timeout_ms` has passed on its
/// (manual) clock, not before, counts it, and gives back its receive
/// buffers; the connected admin queue stays.
#[test]
fn a_queue_with_no_connect_is_dropped_after_the_connect_timeout() {
    use std::time::Duration;
    const LIMIT: Duration = Duration::from_millis(300);
    let topts = TargetOptions {
        in_capsule_data_size: 16384,
        connect_timeout_ms: LIMIT.as_millis() as u32,
        ..TargetOptions::for_tests()
    };
    let fx = fixture_with(1, RdmaOptions::for_tests(), topts);
    let (admin, _) = fx.admin();
    let mut silent = host::Host::connect(&fx.cl, &fx.addr, 1, 8);
    assert_eq!(fx.pg.connections(), 2);
    fx.cl.advance(LIMIT - Duration::from_millis(1));
    let _ = fx.cl.poll_until_idle_within(100_000);
    assert_eq!(fx.pg.connections(), 2, "dropped before the timeout");
    fx.cl.advance(Duration::from_millis(1));
    let gone = spin(&fx.cl, || (fx.pg.connections() == 1).then_some(()));
    assert!(gone.is_some(), "the queue with no Connect stays");
    assert!(
        spin(&fx.cl, || (!silent.poll()).then_some(())).is_some(),
        "the host's queue stays up"
    );
    assert_eq!(fx.target.connect_timeouts(), 1);
    fx.assert_recv_buffers_back();
    let ts = fx.transport.stats();
    assert_eq!((ts.accepted, ts.destroyed), (2, 1));
    // The admin queue outlives the timeout by far.
    fx.cl.advance(LIMIT * 10);
    let _ = fx.cl.poll_until_idle_within(100_000);
    assert_eq!(fx.pg.connections(), 1);
    drop(silent);
    drop(admin);
}

impl Fx {
    /// Settle, then the data pool (with this core's cache) holds `start`
    /// buffers again.
    fn assert_data_buffers_back(&self, start: usize) {
        let held = || self.target.data_pool().available() + self.cached();
        let _ = spin(&self.cl, || (held() == start).then_some(()));
        assert_eq!(held(), start, "data buffers leaked");
    }
}

/// `sgl` with its key changed to one no region has (a stale key).
fn stale(sgl: &SglDescriptor) -> SglDescriptor {
    let SglDescriptor::Keyed {
        addr,
        len,
        key,
        invalidate,
    } = *sgl
    else {
        panic!("not a keyed SGL: {sgl:?}");
    };
    SglDescriptor::keyed(addr, len, key ^ 0x100, invalidate).expect("sgl")
}

/// On the connected queue `io`: an 8 KiB write of `pattern(seed)` by RDMA
/// READ at `lba` (cid `cid`), read back by RDMA WRITE (cid `cid + 1`).
fn write_read_back(fx: &Fx, io: &mut Host, cid: u16, lba: u64, seed: u8) {
    const L: usize = 8192;
    let data = pattern(seed, L);
    io.data_mut(0, L).copy_from_slice(&data);
    let w = rw(0x01, cid, lba, L as u32, &io.keyed(0, L as u32, false));
    let r = io.exec(&fx.cl, &w, &[]);
    assert!(r.cpl.status.is_success(), "write: {:?}", r.cpl);
    io.data_mut(0, L).fill(0);
    let rd = rw(0x02, cid + 1, lba, L as u32, &io.keyed(0, L as u32, false));
    let r = io.exec(&fx.cl, &rd, &[]);
    assert!(r.cpl.status.is_success(), "read: {:?}", r.cpl);
    assert!(io.data(0, L) == &data[..], "read back differs");
}

/// A command whose keyed SGL names a stale key: the target's RDMA WRITE
/// (a read, `read`) or RDMA READ (a write) fails with a remote access
/// error, which puts both QPs in ERR (verbs: REM_ACCESS_ERR, no status
/// can reach the host any more), so the target ends that queue, and only
/// it: no response comes, its receive and data buffers and its seat go
/// back, the admin queue and another I/O queue of the controller keep
/// working, and QID 1 connects again and moves data.
fn a_stale_rkey_ends_only_its_queue(read: bool) {
    const L: u32 = 64 * 1024;
    let fx = fixture(RdmaOptions::for_tests());
    let (mut admin, cntlid) = fx.admin();
    let pool_start = fx.target.data_pool().available() + fx.cached();
    let mut other = Host::connect(&fx.cl, &fx.addr, 2, 8);
    let cpl = other.fabrics_connect(&fx.cl, 2, NQN, cntlid);
    assert!(cpl.status.is_success(), "QID 2 connect: {:?}", cpl.status);
    let mut io = fx.io(cntlid, 8);
    assert_eq!(fx.transport.queues_per_group(), vec![3]);
    let errors = fx.pg.stats().wc_errors;
    let opc = if read { 0x02 } else { 0x01 };
    io.send(&rw(opc, 21, 0, L, &stale(&io.keyed(0, L, false))), &[]);
    let failed = spin(&fx.cl, || (fx.pg.stats().wc_errors > errors).then_some(()));
    assert!(failed.is_some(), "an RDMA op on a stale key succeeded");
    let gone = spin(&fx.cl, || (fx.pg.connections() == 2).then_some(()));
    assert!(gone.is_some(), "the broken queue was not destroyed");
    let dead = spin(&fx.cl, || (!io.poll()).then_some(()));
    assert!(dead.is_some(), "the host's queue stays up");
    assert!(
        io.rsps.iter().all(|r| r.cpl.cid != 21),
        "a response came on a queue in ERR: {:?}",
        io.rsps
    );
    fx.assert_recv_buffers_back();
    fx.assert_data_buffers_back(pool_start);
    assert_eq!(fx.transport.queues_per_group(), vec![2], "its seat is free");
    let ts = fx.transport.stats();
    assert_eq!((ts.accepted, ts.destroyed), (3, 1));
    // The rest of the controller is untouched.
    write_read_back(&fx, &mut other, 30, 64, 5);
    let mut id = NvmeCmd::new(0x06, 31);
    id.cdw10 = 1;
    id.set_sgl(&admin.keyed(0, 4096, false));
    let cpl = admin.exec(&fx.cl, &id, &[]).cpl;
    assert!(cpl.status.is_success(), "admin after the failure: {cpl:?}");
    // QID 1 is free again: a fresh queue connects and moves data.
    drop(io);
    let mut again = fx.io(cntlid, 8);
    write_read_back(&fx, &mut again, 40, 0, 6);
    assert_eq!(fx.pg.connections(), 3);
}

#[test]
fn a_stale_rkey_on_a_read_ends_only_its_queue() {
    a_stale_rkey_ends_only_its_queue(true);
}

#[test]
fn a_stale_rkey_on_a_write_ends_only_its_queue() {
    a_stale_rkey_ends_only_its_queue(false);
}

/// A SEND longer than a receive buffer (64 B + in-capsule data size)
/// cannot be received: the target's receive completes in error (verbs:
/// LOC_LEN_ERR there, REM_INV_REQ_ERR at the host, both QPs in ERR), the
/// capsule never reaches the core, and the queue is torn down with the
/// I/O it had in flight; every buffer and its seat come back and QID 1
/// connects again.
#[test]
fn an_oversized_send_ends_its_queue_and_returns_everything() {
    const AT: usize = 400 * 1024;
    let fx = fixture(RdmaOptions::for_tests());
    let (_admin, cntlid) = fx.admin();
    let pool_start = fx.target.data_pool().available() + fx.cached();
    let mut io = fx.io(cntlid, 8);
    let before = fx.pg.stats();
    // A write claiming 16 KiB + 512 B in the capsule: 64 + 16896 bytes on
    // the wire for a 64 + 16384-byte receive buffer.
    let len = 16384 + 512;
    let cmd = rw(0x01, 22, 0, len, &SglDescriptor::in_capsule(0, len));
    io.data_mut(AT, 64).copy_from_slice(&cmd.encode());
    io.data_mut(AT + 64, len as usize)
        .copy_from_slice(&pattern(4, len as usize));
    io_in_flight(&mut io, 4, false);
    io.send_from_data(AT, 64 + len as usize);
    let gone = spin(&fx.cl, || (fx.pg.connections() == 1).then_some(()));
    assert!(gone.is_some(), "the queue was not destroyed");
    let dead = spin(&fx.cl, || (!io.poll()).then_some(()));
    assert!(dead.is_some(), "the host's queue stays up");
    let st = fx.pg.stats();
    assert!(st.wc_errors > before.wc_errors, "no receive failed: {st:?}");
    assert_eq!(
        st.capsules - before.capsules,
        4,
        "only the four capsules before it reached the core"
    );
    assert!(io.rsps.iter().all(|r| r.cpl.cid != 22));
    fx.assert_recv_buffers_back();
    fx.assert_data_buffers_back(pool_start);
    assert_eq!(fx.transport.queues_per_group(), vec![1], "its seat is free");
    let ts = fx.transport.stats();
    assert_eq!((ts.accepted, ts.destroyed), (2, 1));
    drop(io);
    let mut again = fx.io(cntlid, 8);
    write_read_back(&fx, &mut again, 40, 0, 7);
}

/// A keyed write past the namespace's end (4 MiB of 512 B blocks: 8192
/// LBAs) is answered LBA Out of Range | DNR before any data moves: no
/// RDMA READ is posted (with a stale key one would fail and end the
/// queue), no data buffer is held, no block is written, the queue stays.
#[test]
fn an_out_of_range_keyed_write_reads_nothing_from_the_host() {
    const L: u32 = 8192;
    let fx = fixture(RdmaOptions::for_tests());
    let (_admin, cntlid) = fx.admin();
    let pool_start = fx.target.data_pool().available() + fx.cached();
    let mut io = fx.io(cntlid, 8);
    let data = pattern(9, L as usize);
    io.data_mut(0, L as usize).copy_from_slice(&data);
    let errors = fx.pg.stats().wc_errors;
    let good = io.keyed(0, L, false);
    let cases = [
        (50u16, 8188u64, good),
        (51, 8192, good),
        (52, u64::MAX - 3, good),
        (53, 8188, stale(&good)),
        (54, 1 << 40, stale(&good)),
    ];
    for (cid, lba, sgl) in cases {
        let r = io.exec(&fx.cl, &rw(0x01, cid, lba, L, &sgl), &[]);
        assert_eq!(
            r.cpl.status,
            NvmeStatus::LBA_OUT_OF_RANGE,
            "cid {cid} lba {lba}"
        );
    }
    assert_eq!(fx.pg.stats().wc_errors, errors, "an RDMA op was posted");
    assert_eq!(fx.pg.connections(), 2, "the queue went");
    assert!(io.data(0, L as usize) == &data[..], "host memory changed");
    fx.assert_recv_buffers_back();
    fx.assert_data_buffers_back(pool_start);
    // The blocks in range of the first write were not written.
    let rd = rw(0x02, 55, 8188, 2048, &io.keyed(L as usize, 2048, false));
    assert!(io.exec(&fx.cl, &rd, &[]).cpl.status.is_success());
    assert!(
        io.data(L as usize, 2048) != &data[..2048],
        "part of an out-of-range write landed"
    );
    write_read_back(&fx, &mut io, 56, 8176, 10);
}

/// SGL descriptors the RDMA transport cannot serve are answered SGL
/// Descriptor Type Invalid | DNR with no data moved and the queue kept: a
/// Transport SGL Data Block (0x5A, NVMe/TCP's, which names no host memory
/// or key to move data with here) on a write and a read, a Data Block
/// with an address and no key (0x00) and types that do not exist (0x60,
/// 0xE0).
#[test]
fn sgl_types_rdma_cannot_serve_are_answered_descriptor_type_invalid() {
    let fx = fixture(RdmaOptions::for_tests());
    let (_admin, cntlid) = fx.admin();
    let pool_start = fx.target.data_pool().available() + fx.cached();
    let mut io = fx.io(cntlid, 8);
    let errors = fx.pg.stats().wc_errors;
    let cases = [
        (60u16, 0x01u8, 0x5Au8),
        (61, 0x02, 0x5A),
        (62, 0x01, 0x00),
        (63, 0x02, 0x00),
        (64, 0x01, 0x60),
        (65, 0x02, 0xE0),
    ];
    for (cid, opc, ident) in cases {
        let mut cmd = rw(opc, cid, 0, 4096, &SglDescriptor::Transport { len: 4096 });
        cmd.dptr[..8].copy_from_slice(&0x1000u64.to_le_bytes());
        cmd.dptr[15] = ident;
        let r = io.exec(&fx.cl, &cmd, &[]);
        assert_eq!(
            r.cpl.status,
            NvmeStatus::SGL_DESCRIPTOR_TYPE_INVALID,
            "SGL {ident:#04x}, opcode {opc:#x}"
        );
    }
    assert_eq!(fx.pg.stats().wc_errors, errors, "an RDMA op was posted");
    assert_eq!(fx.pg.connections(), 2, "the queue went");
    fx.assert_recv_buffers_back();
    fx.assert_data_buffers_back(pool_start);
    write_read_back(&fx, &mut io, 66, 0, 11);
}

/// Dropping a poll group takes its poller off the reactor, and with it
/// what its connections held there (a connected admin queue's keep-alive
/// timer).
#[test]
fn a_dropped_poll_group_leaves_no_poller_behind() {
    let fx = fixture(RdmaOptions::for_tests());
    let r = fx.cl.reactor(0);
    let with_group = r.poller_count();
    // The test host's admin Connect asks for a 30 s KATO: one timer more.
    let (_admin, _) = fx.admin();
    assert_eq!(r.poller_count(), with_group + 1, "the keep-alive timer");
    let Fx {
        cl,
        target: _target,
        transport: _transport,
        pg,
        pgs,
        ..
    } = fx;
    drop(pg);
    drop(pgs);
    cl.poll_once_all();
    assert_eq!(
        r.poller_count(),
        with_group - 1,
        "the group's poller and the timer"
    );
}
