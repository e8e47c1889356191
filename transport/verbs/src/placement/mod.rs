//! Connection placement over per-core poll groups, shared by the RDMA
//! target transports (NVMe-oF RDMA, iSER).
//!
//! A target transport runs one poll group per reactor, each with its own
//! device context, CQ and SRQ. A listener belongs to one group, so every
//! connect request arrives on that group's core; placement spreads the
//! connections over all groups:
//!
//! 1. The group that owns the listener validates the request (a reject
//!    carries its transport's reason from there).
//! 2. [`Placer::route`] chooses the group that serves it
//!    ([`PlacementPolicy`], by the [`Seats`] table: the group with the
//!    fewest connections, ties round robin) and takes a seat there.
//! 3. A request for another group is detached
//!    ([`CmId::detach`](crate::CmId::detach)) into the provider's `Send`
//!    [`PendingConn`](crate::provider::PendingConn) and travels, with what
//!    the transport needs to serve it (a [`Handoff`] context: NVMe-oF's
//!    transport id, iSER's portal group tag), by reactor message to that
//!    group's [`Inbox`].
//! 4. The destination group pops it, attaches it to its own device and
//!    creates the QP on its own CQ and SRQ. A request that cannot be
//!    delivered (the core stopped, the group is gone) or attached is
//!    dropped, which rejects it, and its seat is given back
//!    ([`Placer::refuse`], counted in [`Placer::refused`]).
//! 5. The group gives the seat back when it destroys the connection
//!    ([`Seats::release`]).
//!
//! Control path only: the seat table takes a `Mutex`, a hand-off boxes one
//! reactor message; nothing here runs per I/O.

mod handoff;
mod placer;
mod policy;
mod seats;

pub use handoff::{Handoff, Inbox};
pub use placer::{Placer, Route};
pub use policy::PlacementPolicy;
pub use seats::{SeatLimits, Seats};
