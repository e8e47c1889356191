//! Queue placement over the transport's poll groups: the shared
//! [`pollux_verbs::placement`] (seat table, least-connections choice with
//! round-robin ties, hand-off by reactor message), whose requests carry
//! the listener's [`TransportId`].

use pollux_verbs::placement::Placer;

use crate::spec::transport_id::TransportId;

/// The RDMA transport's placement state: the poll groups' [seats](pollux_verbs::placement::Seats)
/// (cores and queue counts) and their inboxes.
pub(crate) type QueuePlacer<P> = Placer<P, TransportId>;
