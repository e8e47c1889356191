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
