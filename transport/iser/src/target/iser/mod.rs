//! The iSER target transport, generic over the verbs
//! [`Provider`](pollux_verbs::Provider) (the software provider by default,
//! `ibverbs` with that feature). Modelled on `pollux_nvmf::target::rdma`.
//!
//! - [`IserTransport`] (shared, `Send + Sync`): options, listeners (one
//!   per address, each owned by one poll group, spread round robin),
//!   connection counters, and the connections' placement over the poll
//!   groups ([`pollux_verbs::placement`], shared with the NVMe-oF target).
//! - [`IserPollGroup`] (one per reactor, `!Send`): one PD, one CQ shared by
//!   its connections, one SRQ with receive buffers of 76 + 8192 bytes (iSER
//!   header + BHS + immediate data or login text), the target's task-buffer
//!   arenas registered once, and its connections. One poller: accept
//!   (iSER CM header checked: reserved bits set → reject; REP =
//!   ZBVA_NOT_USED, plus SEND_W_INV_NOT_USED unless the initiator allows
//!   remote invalidation and the device supports it), reap the CQ, hand
//!   PDUs to the [`Connection`](super::Connection) cores, poll them, and
//!   post each connection's WRs with one `post_send`.
//! - Placement: the group that owns a listener checks each connect request
//!   (iSER CM header, READ resources; rejects go from there), then places
//!   the connection ([`PlacementPolicy`], default: the group with the
//!   fewest connections, ties round robin). A connection for another group
//!   travels as a detached verbs request, with its portal group tag, by
//!   reactor message; that group attaches it to its own device, creates
//!   the QP on its own CQ and SRQ, accepts, serves it (the connection core
//!   and its bdev channels live on that core) and destroys it there,
//!   giving its seat back.
//! - `conn.rs`: the [`ConnOps`](super::ConnOps) implementation: every PDU
//!   (login responses included) is one signaled SEND from a registered
//!   send slot (SEND_WITH_INV of the initiator's STag when allowed);
//!   Data-In is an unsignaled RDMA WRITE queued before the response SEND on
//!   the same QP; solicited Data-Out is a signaled RDMA READ into the task
//!   buffer, completed through [`Connection::data_done`](super::Connection::data_done).
//!   Send-queue room is counted by WR sequence numbers (a signaled
//!   completion retires every WR before it), READs by credits; running
//!   out answers `Busy` / `false` and the core retries.
//! - Teardown: a CM disconnect, a failed WR, a bad PDU or the core's
//!   `close` move the connection to `Closing`: the QP goes to ERR, its WRs
//!   flush; once no signaled WR is outstanding the QP, the core (its task
//!   buffers) and the send slots are dropped on this core. After a logout
//!   (the core's `close_after_logout`) the initiator closes: once the
//!   Logout Response's SEND has completed the connection waits, taking no
//!   more PDUs, for the initiator's CM disconnect, and disconnects itself
//!   only after [`IserOptions::logout_grace`] ([`LOGOUT_GRACE`]).
//!   Receive buffers never leave the SRQ's pool: each is reposted as soon
//!   as the core has consumed its PDU.

mod conn;
mod options;
mod poll_group;
mod transport;
mod wrid;

#[cfg(test)]
mod tests;

pub use options::{IserOptions, LOGOUT_GRACE, RECV_BUF_LEN, RECV_DATA_LEN};
pub use poll_group::{IserPollGroup, IserPollGroupStats};
pub use pollux_verbs::placement::PlacementPolicy;
pub use transport::{IserTransport, IserTransportError, IserTransportStats};
