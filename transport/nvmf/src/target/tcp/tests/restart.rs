//! A target that is dropped lets go of its TCP listeners: another target
//! in the same process listens on the same port.

use std::sync::Arc;

use super::{fixture, target_options, Fx};
use crate::spec::transport_id::TransportId;
use crate::target::tcp::{TcpOptions, TcpTransport};
use crate::target::Target;

#[test]
fn a_dropped_target_closes_its_listener_and_the_port_can_be_listened_on_again() {
    let f = fixture(TcpOptions::default());
    let port = f.addr.port().to_string();
    let target = Arc::downgrade(&f.target);
    let transport = Arc::downgrade(&f.transport);
    drop::<Fx>(f);
    assert!(target.upgrade().is_none(), "the target is freed");
    assert!(transport.upgrade().is_none(), "its TCP transport is freed");
    let again = Target::new(target_options()).unwrap();
    let tcp = TcpTransport::new(&again, TcpOptions::default()).unwrap();
    again.add_transport(tcp).unwrap();
    again
        .add_listener(TransportId::tcp_ipv4("127.0.0.1", port))
        .unwrap();
}

#[test]
fn a_dropped_target_closes_its_soft_rdma_listener_and_the_address_can_be_listened_on_again() {
    use crate::spec::transport_id::{AdrFam, TrType};
    use crate::target::rdma::{RdmaOptions, RdmaTransport};
    use pollux_reactor::TestCluster;
    use pollux_verbs::soft::Soft;

    let trid = TransportId {
        trtype: TrType::Rdma,
        adrfam: AdrFam::IntraHost,
        traddr: format!("@pollux-restart-{}", std::process::id()),
        trsvcid: String::new(),
    };
    let cl = TestCluster::new(1);
    let start = || {
        let target = Target::new(target_options()).unwrap();
        let rdma = RdmaTransport::<Soft>::new(&target, RdmaOptions::for_tests()).unwrap();
        target.add_transport(rdma).unwrap();
        target.add_listener(trid.clone()).unwrap();
        let groups = cl.on(0, |r| target.start_poll_groups(r)).unwrap();
        cl.poll_until_idle().unwrap();
        assert_eq!(groups.iter().map(|g| g.listeners()).sum::<usize>(), 1);
        (target, groups)
    };
    let (target, groups) = start();
    let weak = Arc::downgrade(&target);
    drop(groups);
    drop(target);
    cl.poll_until_idle().unwrap();
    assert!(weak.upgrade().is_none(), "the target is freed");
    let (_target, _groups) = start();
}

#[test]
fn a_removed_listener_is_closed_once_the_groups_apply_the_change() {
    use crate::target::TransportPollGroup;
    use std::net::TcpListener;

    let f = fixture(TcpOptions::default());
    let trid = TransportId::tcp_ipv4("127.0.0.1", f.addr.port().to_string());
    // The group took the listener up on its first polls.
    assert!(TcpListener::bind(f.addr).is_err(), "the target listens");
    f.target.remove_listener(&trid).unwrap();
    // No poll since: the management plane applies the change on each core
    // before it answers, and the port is free then.
    for pg in &f.pgs {
        pg.apply_listeners().unwrap();
    }
    TcpListener::bind(f.addr).expect("the removed listener's port is free");
}
