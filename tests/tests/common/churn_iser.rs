//! The iSER side of the churn storm: the target child serving an iSCSI
//! target (one malloc LU) over iSER on the soft provider, and
//! [`IserHosts`], the initiators of the host children and of the storm's
//! one-host cycles.

use pollux_bdev::BdevRegistry;
use pollux_iser::initiator::IserInitiator;
use pollux_iser::target::iser::{IserOptions, IserTransport};
use pollux_reactor::Reactor;
use pollux_verbs::soft::Soft;

use super::churn::{serve_queries, HostSide, TargetCounts};
use super::iser::iscsi_target;
use super::iser_io;

/// The node the churn target serves.
pub const NODE: &str = "iqn.2024-01.io.pollux:churn";

/// This process's initiator name: host children must not share one (a
/// login of the same initiator and ISID from another process would
/// reinstate, and so close, a live session).
fn initiator() -> String {
    format!("iqn.2024-01.io.pollux:churn-host-{}", std::process::id())
}

/// Serve [`NODE`] at `addr` from one reactor (one poll group), at most
/// `max_connections` connections at once, answering queries until stdin
/// closes.
pub fn serve_target(addr: &str, max_connections: usize) {
    let lun = BdevRegistry::new()
        .create("malloc:size=16M,block=512,name=churn")
        .expect("bdev");
    let target = iscsi_target(NODE, addr, vec![(0, lun)], 512);
    let transport = IserTransport::<Soft>::new(
        &target,
        IserOptions {
            max_connections,
            max_connections_per_core: max_connections,
            acceptor_backlog: 1024,
            num_cqe: 1 << 20,
            ..IserOptions::for_tests()
        },
    );
    // Listening first: the poll group opens the listener as it starts,
    // before the child says it is ready.
    transport.listen_portal_groups().expect("listen");
    let t2 = transport.clone();
    let set = super::launch_with_groups("0", move |r| t2.create_poll_group(r).expect("poll group"));
    serve_queries(|| {
        let s = transport.stats();
        TargetCounts {
            live: transport.connections_per_group().iter().sum(),
            accepted: s.accepted,
            destroyed: s.destroyed,
            rejected: s.rejected,
            kato: target.nop_timeouts(),
            ..TargetCounts::default()
        }
    });
    set.stop_all();
    let _ = set.join();
}

/// iSER initiators against the churn target (another process: nothing
/// to poll between the initiator's polls).
pub struct IserHosts;

impl HostSide for IserHosts {
    type Held = IserInitiator<Soft>;

    fn new_side() -> Self {
        IserHosts
    }

    fn connect_verified(
        &self,
        _r: &Reactor,
        addr: &str,
        seed: u64,
    ) -> Result<IserInitiator<Soft>, String> {
        let mut ini = iser_io::login(addr, &initiator(), NODE, &mut || {})?;
        iser_io::verified_io(&mut ini, (seed % 2048) * 8, seed, &mut || {})?;
        Ok(ini)
    }

    fn exercise(&self, _r: &Reactor, held: &mut IserInitiator<Soft>, k: u64) -> Result<(), String> {
        iser_io::verified_io(held, k * 8, k, &mut || {})
    }

    fn clean_cycle(&self, r: &Reactor, addr: &str, n: u64) -> Result<(), String> {
        let ini = self.connect_verified(r, addr, n)?;
        iser_io::logout(ini, &mut || {})
    }
}
