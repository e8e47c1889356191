//! How an iSER connection ends after a logout: our initiator against our
//! iSER target over the software RDMA provider, on a one-reactor
//! `TestCluster` whose manual clock moves only when a test moves it.
//!
//! After the Logout Response the initiator closes the connection (RFC 7143
//! §11.14); the target waits for its CM disconnect and disconnects itself
//! only after [`IserOptions::logout_grace`]. An error still closes at once.
//! Each test ends with every connection destroyed, the session gone, every
//! task and receive buffer back and the seat free.
//!
//! A soft-provider SEND completes at its sender only once the receiver has
//! polled it in, so the initiator must be polled for the target's Logout
//! Response to be "out"; the lingering initiator
//! ([`IserInitiator::linger_after_logout`]) reads it and leaves the
//! connection up until it is dropped.

use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pollux_bdev::BdevRegistry;
use pollux_reactor::mem::{DmaBuf, SgList};
use pollux_reactor::TestCluster;
use pollux_verbs::soft::Soft;

use super::{IserOptions, IserPollGroup, IserTransport, LOGOUT_GRACE};
use crate::initiator::scsi::{parse_read_capacity16, read_capacity16_cdb};
use crate::initiator::{DataDir, InitiatorOptions, IserInitiator, SessionState, TaskResult};
use crate::session::TargetLimits;
use crate::target::{IscsiTarget, PortalGroup, TargetNode, TargetOptions};

const TGT: &str = "iqn.2024-01.io.pollux:logout-disk";
const INI: &str = "iqn.2024-01.io.pollux:logout-host";
/// Most cluster polls a test waits for one event.
const SPINS: usize = 200_000;
/// Polls of target and initiator while a test expects the connection to
/// stay: many CM rounds (one every 16 polls) and SEND completions.
const QUIET_SPINS: usize = 4_000;

/// A soft-provider listen address unique to this process and test.
fn unique_addr() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "@pollux-iser-logout-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The target (one malloc LU) served by its iSER transport on one reactor.
struct Fx {
    cl: TestCluster,
    target: Arc<IscsiTarget>,
    transport: Arc<IserTransport<Soft>>,
    pg: Rc<IserPollGroup<Soft>>,
    addr: String,
}

impl Fx {
    fn new(opts: IserOptions) -> Fx {
        let reg = BdevRegistry::new();
        let lu = reg.create("malloc:size=4M,block=512").expect("bdev");
        let addr = unique_addr();
        let target = IscsiTarget::new(TargetOptions {
            limits: TargetLimits {
                queue_depth: 16,
                ..TargetLimits::default()
            },
            max_io_bytes: 128 * 1024,
            task_buffers: 32,
        })
        .expect("target");
        target
            .add_portal_group(PortalGroup {
                tag: 1,
                addrs: vec![addr.clone()],
            })
            .expect("portal group");
        target
            .add_node(TargetNode {
                name: TGT.into(),
                alias: None,
                luns: vec![(0, lu)],
                allowed_initiators: vec![],
                portal_groups: vec![1],
            })
            .expect("node");
        let cl = TestCluster::new(1);
        let transport = IserTransport::<Soft>::new(&target, opts);
        let pg = cl
            .on(0, |r| transport.create_poll_group(r))
            .expect("poll group");
        assert_eq!(transport.listen_portal_groups().expect("listen"), 1);
        let fx = Fx {
            cl,
            target,
            transport,
            pg,
            addr,
        };
        assert!(
            fx.spin(|| (fx.pg.listeners() == 1).then_some(())).is_some(),
            "the poll group does not listen"
        );
        fx
    }

    /// Poll the target's reactor until `f` gives a value (`None` after
    /// [`SPINS`]).
    fn spin<T>(&self, mut f: impl FnMut() -> Option<T>) -> Option<T> {
        for _ in 0..SPINS {
            self.cl.poll_once_all();
            if let Some(v) = f() {
                return Some(v);
            }
        }
        None
    }

    /// Poll the target and `ini` `n` times each.
    fn run(&self, ini: &mut IserInitiator<Soft>, n: usize) {
        for _ in 0..n {
            self.cl.poll_once_all();
            ini.poll(&mut |_| {});
        }
    }

    /// Log in, read LUN 0's capacity, write 4 KiB and read it back (task
    /// buffers, RDMA READs and WRITEs in use before the logout).
    fn session(&self) -> IserInitiator<Soft> {
        let mut o = InitiatorOptions::new(&self.addr, INI, TGT);
        o.queue_depth = 8;
        // No pings of the initiator's own while the manual clock jumps.
        o.nop_interval = Duration::ZERO;
        let mut ini = IserInitiator::<Soft>::connect(o).expect("connect");
        let ready = self.spin(|| {
            ini.poll(&mut |_| {});
            match ini.state() {
                SessionState::Ready => Some(()),
                SessionState::Failed(e) => panic!("login failed: {e}"),
                _ => None,
            }
        });
        assert!(ready.is_some(), "login did not finish");
        let cap = SgList::from_buf(DmaBuf::alloc(32).expect("buffer"));
        ini.submit(0, &read_capacity16_cdb(), DataDir::Read, Some(cap), 32, 1)
            .expect("READ CAPACITY");
        let r = self.task(&mut ini);
        let data = r.bufs.and_then(|mut b| b.pop()).expect("capacity data");
        ini.set_geometry(0, parse_read_capacity16(data.as_slice()).expect("capacity"));
        let mut w = DmaBuf::alloc(4096).expect("buffer");
        for (i, b) in w.as_mut_slice().iter_mut().enumerate() {
            *b = (i * 7) as u8;
        }
        let written = w.as_slice().to_vec();
        ini.write(0, 8, 8, SgList::from_buf(w), 2).expect("write");
        assert!(self.task(&mut ini).is_good(), "write failed");
        let rb = DmaBuf::alloc(4096).expect("buffer");
        ini.read(0, 8, 8, SgList::from_buf(rb), 3).expect("read");
        let r = self.task(&mut ini);
        assert!(r.is_good(), "read failed");
        let got = r.bufs.and_then(|mut b| b.pop()).expect("read data");
        assert_eq!(got.as_slice(), &written[..], "read back differs");
        assert_eq!(self.pg.connections(), 1);
        assert_eq!(self.target.live_sessions(), 1);
        ini
    }

    /// The next task `ini` completes.
    fn task(&self, ini: &mut IserInitiator<Soft>) -> TaskResult {
        let mut out = None;
        self.spin(|| {
            ini.poll(&mut |r| out = Some(r));
            if let SessionState::Failed(e) = ini.state() {
                panic!("session failed: {e}");
            }
            out.take()
        })
        .expect("a task did not finish")
    }

    /// Log a lingering `ini` out and poll both sides until it has read the
    /// Logout Response (the target's SEND of it has completed).
    fn logout_lingering(&self, ini: &mut IserInitiator<Soft>) {
        ini.linger_after_logout();
        ini.logout().expect("logout");
        let read = self.spin(|| {
            ini.poll(&mut |_| {});
            (*ini.state() == SessionState::Closed).then_some(())
        });
        assert!(read.is_some(), "no Logout Response ({:?})", ini.state());
    }

    /// The target is back where it started: no connection (every accepted
    /// one destroyed), no session, every task buffer, receive buffer and
    /// seat back.
    fn assert_clean(&self) {
        let total = self.target.pool().count();
        let recv_total = self.pg.stats().recv_buffers;
        let idle = self.spin(|| {
            (self.pg.connections() == 0
                && self.target.pool().available() == total
                && self.pg.stats().recv_buffers_idle == recv_total)
                .then_some(())
        });
        assert!(
            idle.is_some(),
            "connections {}, task buffers {}/{total}, receive buffers {}/{recv_total}",
            self.pg.connections(),
            self.target.pool().available(),
            self.pg.stats().recv_buffers_idle
        );
        assert_eq!(self.target.live_sessions(), 0, "the session is gone");
        let st = self.transport.stats();
        assert!(st.accepted > 0 && st.accepted == st.destroyed, "{st:?}");
        assert_eq!(
            self.transport.connections_per_group(),
            vec![0],
            "seats free"
        );
    }
}

/// After its Logout Response the target leaves the disconnect to the
/// initiator: with the response read and almost the whole grace gone it
/// still holds the connection (before, it disconnected as soon as the
/// response's SEND completed, and Linux's initiator, not done with its
/// logout yet, logged a connection error); once the initiator
/// disconnects, the connection is destroyed without the clock moving on,
/// and everything is back.
#[test]
fn target_waits_for_the_initiator_to_disconnect_after_logout() {
    let fx = Fx::new(IserOptions::for_tests());
    let mut ini = fx.session();
    fx.logout_lingering(&mut ini);
    fx.run(&mut ini, QUIET_SPINS);
    fx.cl.advance(LOGOUT_GRACE - Duration::from_millis(1));
    fx.run(&mut ini, QUIET_SPINS);
    assert_eq!(
        fx.pg.connections(),
        1,
        "the target disconnected first, inside the grace"
    );
    assert_eq!(fx.transport.stats().destroyed, 0);
    // The initiator disconnects (dropping the session does); the clock
    // stands still.
    drop(ini);
    let gone = fx.spin(|| (fx.pg.connections() == 0).then_some(()));
    assert!(gone.is_some(), "the initiator's disconnect was not seen");
    fx.assert_clean();
}

/// An initiator that never disconnects after the Logout Response is
/// disconnected by the target once `logout_grace` has passed, not before,
/// and everything comes back.
#[test]
fn target_disconnects_a_lingering_initiator_after_the_logout_grace() {
    let grace = Duration::from_millis(500);
    let fx = Fx::new(IserOptions {
        logout_grace: grace,
        ..IserOptions::for_tests()
    });
    let mut ini = fx.session();
    fx.logout_lingering(&mut ini);
    fx.run(&mut ini, QUIET_SPINS);
    fx.cl.advance(grace - Duration::from_millis(1));
    fx.run(&mut ini, QUIET_SPINS);
    assert_eq!(
        fx.pg.connections(),
        1,
        "the target disconnected before the grace was over"
    );
    fx.cl.advance(Duration::from_millis(2));
    let gone = fx.spin(|| {
        ini.poll(&mut |_| {});
        (fx.pg.connections() == 0).then_some(())
    });
    assert!(
        gone.is_some(),
        "the target kept a logged-out connection past the grace"
    );
    fx.assert_clean();
    assert_eq!(*ini.state(), SessionState::Closed);
}

/// An error still closes at once: a PDU too short for an iSER header,
/// after a good session, ends the connection while the clock stands still
/// and the initiator, not polled, has not disconnected.
#[test]
fn bad_pdu_is_disconnected_at_once() {
    let fx = Fx::new(IserOptions::for_tests());
    let mut ini = fx.session();
    assert!(ini.send_raw(&[0x10, 0, 0]), "the bad PDU was not sent");
    let gone = fx.spin(|| (fx.pg.connections() == 0).then_some(()));
    assert!(
        gone.is_some(),
        "the target kept the connection after a bad PDU"
    );
    fx.assert_clean();
    let failed = fx.spin(|| {
        ini.poll(&mut |_| {});
        matches!(ini.state(), SessionState::Failed(_)).then_some(())
    });
    assert!(failed.is_some(), "initiator state {:?}", ini.state());
}
