//! A connection the target ends for the host's bad input in the middle of
//! I/O gives back everything it took: the data buffers of the writes in
//! flight, its placement seat, its queue id (the same QID connects again
//! on the same controller), its controller (an admin queue's), and its
//! socket (the host reads the end of the stream after the C2HTermReq).
//! A connection that never completes a Connect is dropped after the
//! target's connect timeout.

use super::raw::{connect_cmd, Raw};
use super::*;
use crate::host::{Controller, CtrlOptions};
use crate::spec::cmd::{IoOpcode, NvmeCmd};
use crate::spec::cpl::NvmeCompletion;
use crate::spec::sgl::SglDescriptor;
use crate::spec::tcp::{Digests, R2t};

/// Writes by R2T left in flight before the bad PDU.
const IN_FLIGHT: u16 = 4;

/// A raw connection whose Connect for `qid` of controller `cntlid`
/// succeeded.
fn queue(f: &Fx, qid: u16, cntlid: u16) -> Raw {
    let mut r = Raw::handshake(f, Digests::default());
    let (cmd, data) = connect_cmd(qid, cntlid, SglDescriptor::in_capsule(0, 1024));
    let p = r.capsule(&cmd, &data);
    r.send(&p);
    let rsp = r.pdu(f);
    let cpl = NvmeCompletion::parse(&rsp[8..24]).unwrap();
    assert!(cpl.status.is_success(), "Connect QID {qid}: {cpl:?}");
    r
}

/// Start [`IN_FLIGHT`] 64 KiB writes by R2T (each holds pool buffers
/// until its data comes) and take their R2Ts; the data never comes.
fn writes_in_flight(f: &Fx, r: &mut Raw) {
    for cid in 0..IN_FLIGHT {
        let mut w = NvmeCmd::new(IoOpcode::Write.code(), 100 + cid);
        w.nsid = 1;
        w.cdw10 = u32::from(cid) * 128;
        w.cdw12 = 127;
        w.set_sgl(&SglDescriptor::Transport { len: 65536 });
        let p = r.capsule(&w, &[]);
        r.send(&p);
        let r2t = R2t::parse(&r.pdu(f)).unwrap();
        assert_eq!(r2t.cccid, 100 + cid);
    }
}

#[test]
fn an_io_queue_ended_for_bad_input_mid_io_returns_everything() {
    let f = fixture(TcpOptions::default());
    f.cl.on(0, |_| {
        let t = f.host(false, false);
        let c = Controller::connect(&t, who(), CtrlOptions::default()).unwrap();
        let cntlid = c.info().cntlid;
        let mut r = queue(&f, 1, cntlid);
        writes_in_flight(&f, &mut r);
        let busy = f.target.data_pool();
        assert!(busy.available() < busy.count(), "the writes hold buffers");
        r.h2c_without_r2t(&f);
        // Only the admin queue is left, and every buffer is back.
        until_connections(&f, 1);
        f.assert_pool_full();
        assert_eq!(f.transport.stats().terminated, 1);
        // QID 1 of the same controller is free: it connects again and
        // its writes go through.
        let mut again = queue(&f, 1, cntlid);
        let mut w = NvmeCmd::new(IoOpcode::Write.code(), 5);
        w.nsid = 1;
        w.cdw12 = 1;
        w.set_sgl(&SglDescriptor::in_capsule(0, 1024));
        let p = again.capsule(&w, &[0x3C; 1024]);
        again.send(&p);
        let rsp = again.pdu(&f);
        let cpl = NvmeCompletion::parse(&rsp[8..24]).unwrap();
        assert!(cpl.status.is_success(), "{cpl:?}");
        drop(again);
        c.shutdown().unwrap();
    });
    f.settle();
    f.assert_pool_full();
    assert_eq!(f.transport.queues_per_group(), vec![0]);
    let st = f.transport.stats();
    assert_eq!(st.accepted, st.destroyed);
    let sub = f.target.subsystem(NQN).unwrap();
    assert_eq!(sub.controller_count(), 0, "the controller is gone");
}

#[test]
fn an_admin_queue_ended_for_bad_input_frees_its_controller() {
    let f = fixture(TcpOptions::default());
    let sub = f.target.subsystem(NQN).unwrap();
    // The admin queue of a new controller over a raw connection.
    let mut admin = Raw::handshake(&f, Digests::default());
    let p = admin.admin_connect();
    admin.send(&p);
    let rsp = admin.pdu(&f);
    let cpl = NvmeCompletion::parse(&rsp[8..24]).unwrap();
    assert!(cpl.status.is_success(), "{cpl:?}");
    let cntlid = cpl.dw0 as u16;
    assert!(sub.controller(cntlid).is_some());
    admin.h2c_without_r2t(&f);
    f.settle();
    f.assert_pool_full();
    assert_eq!(f.transport.queues_per_group(), vec![0]);
    assert!(
        sub.controller(cntlid).is_none(),
        "controller {cntlid} is freed"
    );
    assert_eq!(sub.controller_count(), 0);
    // A new host is served.
    f.cl.on(0, |_| {
        let t = f.host(false, false);
        let c = Controller::connect(&t, who(), CtrlOptions::default()).unwrap();
        c.shutdown().unwrap();
    });
    f.settle();
    f.assert_pool_full();
}

/// A connection silent after the TCP handshake and one silent after its
/// ICReq hold a queue without a controller, so no keep-alive ends them:
/// the target drops both once `connect_timeout_ms` has passed on its
/// (manual) clock, not before, counts them, and keeps the connected admin
/// queue.
#[test]
fn a_queue_with_no_connect_is_dropped_after_the_connect_timeout() {
    use std::time::Duration;
    const LIMIT: Duration = Duration::from_millis(300);
    let topts = TargetOptions {
        connect_timeout_ms: LIMIT.as_millis() as u32,
        ..target_options()
    };
    let f = fixture_with(1, "127.0.0.1", TcpOptions::default(), topts);
    let _admin = queue(&f, 0, crate::spec::connect::CNTLID_DYNAMIC);
    let mut silent = Raw::connect(&f);
    let mut icreq_only = Raw::handshake(&f, Digests::default());
    until_connections(&f, 3);
    f.cl.advance(LIMIT - Duration::from_millis(1));
    assert!(
        !silent.closed_within(&f, Duration::from_millis(100)),
        "dropped before the timeout"
    );
    assert_eq!(f.target.connect_timeouts(), 0);
    f.cl.advance(Duration::from_millis(1));
    assert!(
        silent.closed_within(&f, Duration::from_secs(10)),
        "a connection that sent nothing stays open"
    );
    assert!(
        icreq_only.closed_within(&f, Duration::from_secs(10)),
        "a connection that sent only its ICReq stays open"
    );
    until_connections(&f, 1);
    assert_eq!(f.target.connect_timeouts(), 2);
    // The admin queue (KATO 30 s) outlives the timeout by far.
    f.cl.advance(LIMIT * 10);
    let _ = f.cl.poll_until_idle_within(100_000);
    assert_eq!(f.transport.queues_per_group(), vec![1]);
    assert_eq!(f.target.connect_timeouts(), 2);
}

/// Dropping a poll group takes its poller off the reactor, and with it
/// what its connections held there (a connected admin queue's keep-alive
/// timer), and closes their sockets.
#[test]
fn a_dropped_poll_group_leaves_no_poller_behind() {
    let mut f = fixture(TcpOptions::default());
    let r = f.cl.reactor(0);
    let with_group = r.poller_count();
    // The raw admin Connect asks for a 30 s KATO: one timer more.
    let mut admin = queue(&f, 0, crate::spec::connect::CNTLID_DYNAMIC);
    assert_eq!(r.poller_count(), with_group + 1, "the keep-alive timer");
    drop(std::mem::take(&mut f.pgs));
    f.cl.poll_once_all();
    assert_eq!(
        r.poller_count(),
        with_group - 1,
        "the group's poller and the timer"
    );
    assert!(admin.closed_within(&f, Duration::from_secs(2)));
}
