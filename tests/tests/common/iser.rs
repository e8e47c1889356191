//! Shared set-up of the in-process iSER tests: an iSCSI target with one
//! node behind one portal group, a listen address unique to the test, the
//! target's iSER transport with a poll group on every reactor of a
//! `TestCluster`, and the polling step of a login.

use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use pollux_bdev::Bdev;
use pollux_iser::initiator::{IserInitiator, SessionState};
use pollux_iser::session::TargetLimits;
use pollux_iser::target::iser::{IserOptions, IserPollGroup, IserTransport};
use pollux_iser::target::{IscsiTarget, PortalGroup, TargetNode, TargetOptions};
use pollux_reactor::TestCluster;
use pollux_verbs::soft::Soft;

/// How many cluster polls a test waits for one event at most.
pub const SPINS: usize = 200_000;

/// A soft-provider listen address `@{prefix}-{pid}-{n}`, `n` counting the
/// addresses this test binary made, so tests running in parallel never
/// share one.
pub fn unique_addr(prefix: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "@{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// An iSCSI target (queue depth 16, 128 KiB I/O, `task_buffers` task
/// buffers) with portal group 1 on `addr` and the node `node` (any
/// initiator) exporting `luns`.
pub fn iscsi_target(
    node: &str,
    addr: &str,
    luns: Vec<(u16, Arc<Bdev>)>,
    task_buffers: usize,
) -> Arc<IscsiTarget> {
    let target = IscsiTarget::new(TargetOptions {
        limits: TargetLimits {
            queue_depth: 16,
            ..TargetLimits::default()
        },
        max_io_bytes: 128 * 1024,
        task_buffers,
    })
    .expect("target");
    target
        .add_portal_group(PortalGroup {
            tag: 1,
            addrs: vec![addr.to_string()],
        })
        .expect("portal group");
    target
        .add_node(TargetNode {
            name: node.into(),
            alias: None,
            luns,
            allowed_initiators: vec![],
            portal_groups: vec![1],
        })
        .expect("node");
    target
}

/// One login step for `ini`: polls it and says `Some` once the session is
/// ready (panics when the login failed).
pub fn login_step(ini: &mut IserInitiator<Soft>) -> Option<()> {
    ini.poll(&mut |_| {});
    match ini.state() {
        SessionState::Ready => Some(()),
        SessionState::Failed(e) => panic!("login failed: {e}"),
        _ => None,
    }
}

/// An iSCSI target served by its iSER transport with one poll group on
/// each reactor of a `TestCluster`, listening on `addr` (group 0 owns the
/// listener).
pub struct Cluster {
    /// The reactors (polled by the test thread).
    pub cl: TestCluster,
    /// The iSCSI target.
    pub target: Arc<IscsiTarget>,
    /// Its iSER transport.
    pub transport: Arc<IserTransport<Soft>>,
    /// The poll group of each reactor, in core order.
    pub pgs: Vec<Rc<IserPollGroup<Soft>>>,
    /// The portal group's listen address.
    pub addr: String,
}

impl Cluster {
    /// `cores` reactors, one poll group on each, the portal groups
    /// listening; returns once group 0 holds the listener.
    pub fn start(cores: u32, target: Arc<IscsiTarget>, addr: String, opts: IserOptions) -> Self {
        let cl = TestCluster::new(cores as usize);
        let transport = IserTransport::<Soft>::new(&target, opts);
        let pgs: Vec<_> = (0..cores)
            .map(|c| {
                cl.on(c, |r| transport.create_poll_group(r))
                    .expect("poll group")
            })
            .collect();
        assert_eq!(transport.listen_portal_groups().expect("listen"), 1);
        let fx = Cluster {
            cl,
            target,
            transport,
            pgs,
            addr,
        };
        assert!(fx
            .spin(|| (fx.pgs[0].listeners() == 1).then_some(()))
            .is_some());
        fx
    }

    /// Poll every reactor until `f` gives a value (`None` after [`SPINS`]).
    pub fn spin<T>(&self, mut f: impl FnMut() -> Option<T>) -> Option<T> {
        for _ in 0..SPINS {
            self.cl.poll_once_all();
            if let Some(v) = f() {
                return Some(v);
            }
        }
        None
    }

    /// Live connections per poll group (as the groups count them).
    pub fn conns(&self) -> Vec<usize> {
        self.pgs.iter().map(|g| g.connections()).collect()
    }

    /// Log `ini` out and poll until its session is closed.
    pub fn logout(&self, ini: IserInitiator<Soft>) {
        super::iser_io::logout(ini, &mut || {
            self.cl.poll_once_all();
        })
        .expect("logout");
    }
}
