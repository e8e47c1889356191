//! The NVMe-oF RDMA target transport, generic over the verbs
//! [`Provider`](pollux_verbs::Provider) (the software provider by default,
//! `ibverbs` with that feature).
//!
//! - [`RdmaTransport`] (shared, `Send + Sync`): options, listeners (spread
//!   round robin over the poll groups), connection counters. It implements
//!   [`TargetTransport`](super::TargetTransport).
//! - [`RdmaPollGroup`] (one per reactor, `!Send`): per device one PD, one
//!   CQ shared by its queues, one SRQ (`no_srq`: per-queue receive queues
//!   fed from the group's receive buffer budget), the receive buffers
//!   (a 64 B command slot + a separate in-capsule data buffer each, see
//!   `recv_bufs.rs`: write data in the capsule is lent to the bdev in
//!   place, not copied), the CM listeners it owns and its
//!   connections. The device, PD, CQ, connection table, listeners,
//!   connect-request routing and CQ reaping are the generic
//!   [`RdmaGroup`](pollux_verbs::group::RdmaGroup) that the iSER target
//!   shares; the rest is NVMe/RDMA's. One poller: accept (CM private data checked, rejects
//!   carry the NVMe/RDMA status); poll each queue (the bdev completions
//!   of the last round become responses) and post its WRs; reap the CQ in
//!   batches (send-side completions of a batch first, so a retired
//!   response frees its request for a capsule of the same batch) and hand
//!   the capsules to the core; post what they queued; post the SRQ
//!   receives (one `post_recv`). Each queue has 1.5 times its depth in
//!   requests: a request stays busy until its response SEND is known
//!   complete, while the host already reuses the command slot.
//! - Placement (`placement.rs`, [`pollux_verbs::placement`]): the group that owns a
//!   listener validates each connect request (rejects carry their status
//!   from there), then places the queue ([`QueuePlacement`], default: the
//!   group with the fewest queues, ties round robin). A queue for another
//!   group travels as a detached verbs request by reactor message; that
//!   group attaches it to its own device, creates the QP on its own CQ and
//!   SRQ and accepts. A controller's admin and I/O queues may so live on
//!   different cores: the controller is shared (`Arc`), the keep-alive
//!   timer runs on the admin queue's core, and each queue notices a dead
//!   controller on its own core and is torn down there.
//! - `conn.rs`: one queue: QP, CM id, the core's
//!   [`QueuePair`](super::QueuePair) and the [`QpairOps`](super::QpairOps)
//!   implementation: host writes beyond in-capsule data are RDMA READs into
//!   the core's buffers (only the last READ of a request is signaled);
//!   reads are RDMA WRITEs (unsignaled) chained with the response SEND, or
//!   SEND_WITH_INVALIDATE when the host's keyed SGL asks for it. The CQE
//!   travels inline. Only the last response SEND of each flush is
//!   signaled; its completion retires the earlier ones. Send-queue slots
//!   and READ credits are counted per queue; running out answers `Busy`
//!   and the core retries.
//! - Teardown: a CM disconnect, a failed WR, a bad capsule or the core's
//!   `disconnect` move the queue to `Closing`: the QP goes to ERR, its WRs
//!   flush and complete the core's pending transfers with errors; when none
//!   is left the QP is destroyed on its own core, its receive buffers go
//!   back, and the core's queue is dropped (bdev I/O in flight completes
//!   into the void: it owns its buffers).
//!
//! Addresses: a [`TransportId`](crate::spec::transport_id::TransportId)
//! with `trtype` RDMA. `traddr` + `trsvcid` make the verbs CM address
//! ([`cm_addr`]): `ip:port` for ibverbs; for the soft provider `traddr` is
//! the socket name (`@pollux-tgt` or a path) and `trsvcid` is empty, and
//! the address family is intra-host (254).

mod conn;
mod options;
mod placement;
mod poll_group;
mod recv_bufs;
mod transport;
mod wrid;

#[cfg(test)]
mod tests;

pub use options::{OptionsError, QueuePlacement, RdmaOptions};
pub use poll_group::{PollGroupStats, RdmaPollGroup};
pub use transport::{cm_addr, RdmaTransport, RdmaTransportStats};
