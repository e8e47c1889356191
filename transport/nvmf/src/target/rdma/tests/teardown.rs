//! A queue the target ends for a malformed capsule in the middle of I/O
//! gives back everything it took: its receive buffers, the data buffers
//! of the transfers in flight, its placement seat and its queue id (the
//! same QID connects again on the same controller).

use super::host::spin;
use super::*;

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
