//! Connections over two poll groups (two reactors of one `TestCluster`):
//! the group that owns the listener accepts each socket and hands it to
//! the group with the fewest connections by reactor message; that group
//! serves it (ICReq, Connect) and tears it down on its own core. With
//! `ListenerCore` placement every connection stays on the listener's core.

use super::raw::Raw;
use super::*;
use crate::spec::cpl::NvmeCompletion;
use crate::spec::tcp::Digests;
use pollux_verbs::placement::PlacementPolicy;

/// A connection with a connected admin queue (its own controller).
fn admin(f: &Fx) -> Raw {
    let mut r = Raw::handshake(f, Digests::default());
    let p = r.admin_connect();
    r.send(&p);
    let rsp = r.pdu(f);
    let cpl = NvmeCompletion::parse(&rsp[8..24]).unwrap();
    assert!(cpl.status.is_success(), "{cpl:?}");
    r
}

fn conns(f: &Fx) -> Vec<usize> {
    f.pgs.iter().map(|g| g.connections()).collect()
}

#[test]
fn connections_spread_over_both_cores_and_close_there() {
    let f = fixture_on(2, "127.0.0.1", TcpOptions::default());
    let raws: Vec<Raw> = (0..4).map(|_| admin(&f)).collect();
    assert_eq!(conns(&f), [2, 2], "connections per core");
    assert_eq!(f.transport.queues_per_group(), [2, 2]);
    drop(raws);
    f.settle();
    assert_eq!(f.transport.queues_per_group(), [0, 0]);
    f.assert_pool_full();
    let st = f.transport.stats();
    assert_eq!((st.accepted, st.destroyed, st.refused), (4, 4, 0));
}

#[test]
fn listener_core_placement_keeps_every_connection_on_core_0() {
    let f = fixture_on(
        2,
        "127.0.0.1",
        TcpOptions {
            placement: PlacementPolicy::ListenerCore,
            ..TcpOptions::default()
        },
    );
    let raws: Vec<Raw> = (0..3).map(|_| admin(&f)).collect();
    assert_eq!(conns(&f), [3, 0]);
    drop(raws);
    f.settle();
    assert_eq!(f.transport.queues_per_group(), [0, 0]);
}
