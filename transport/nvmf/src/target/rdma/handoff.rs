//! Handing a connect request to another poll group's core: the shared
//! [`pollux_verbs::placement`] hand-off, carrying the listener's
//! [`TransportId`].
//!
//! Verbs CM ids are `!Send`, so the poll group whose listener received a
//! request detaches it ([`CmId::detach`](pollux_verbs::CmId::detach)) into
//! the provider's `Send` `PendingConn` and sends it by reactor message
//! ([`send`]). On the destination core the message drops it into that poll
//! group's [`Inbox`] (the transport's placer channel on that core); the
//! group's poller attaches it to its own device and creates the QP on its
//! own CQ and SRQ. A request that cannot be delivered (the core stopped,
//! the group is gone) is dropped, which rejects it.

use std::sync::Arc;

use pollux_reactor::{CoreId, Reactor};
use pollux_verbs::{placement, Provider};

use super::transport::RdmaTransport;
use crate::spec::transport_id::TransportId;

/// A validated connect request and the listener it arrived on.
pub(crate) type Handoff<P> = placement::Handoff<P, TransportId>;

/// Requests handed to this core's poll group, taken by its poller.
pub(crate) type Inbox<P> = placement::Inbox<P, TransportId>;

/// Send `h` to poll group `group` on `core` (control path: boxes one
/// message). On failure the request is dropped (rejected) and its seat
/// given back.
pub(crate) fn send<P: Provider>(
    t: &Arc<RdmaTransport<P>>,
    from: &Reactor,
    group: usize,
    core: CoreId,
    h: Handoff<P>,
) {
    t.placer.hand_off(from, group, core, h);
}

/// A request placed on `group` was refused before it became a queue
/// (counted in [`RdmaTransportStats::rejected`](super::RdmaTransportStats)).
pub(crate) fn refused<P: Provider>(t: &RdmaTransport<P>, group: usize) {
    t.placer.refuse(group);
}
