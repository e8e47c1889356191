//! The plumbing every RDMA target poll group shares (NVMe-oF RDMA, iSER):
//! one group per reactor, each with its own device context, PD and CQ,
//! its connections and the CM listeners it owns.
//!
//! - [`RdmaGroup`]: device, PD, CQ; the [`ConnTable`]; listeners, connect
//!   requests (taken, routed by [`placement`](crate::placement), rejected
//!   and held, adopted from other groups; what the transport decides about
//!   them is its [`Acceptor`]) and the pacing of CM work; CQ reaping;
//!   closing and removing connections.
//! - [`Link`] and [`GroupConn`]: a connection's QP and CM id, and what a
//!   group needs of a transport's connection.
//! - [`ListenTable`]: the transport's listen addresses, shared by its
//!   groups, each address owned by one.
//! - [`MrTable`]: memory regions of whole arenas.
//! - [`GroupPoller`]: the group's state behind its reactor poller.
//! - [`post_sends`]: a connection's queued send work requests, posted
//!   [`POST_CHUNK`] to a call.
//! - [`RecvRepost`](crate::recv_repost::RecvRepost) (its own module):
//!   receive buffers waiting to be posted.
//!
//! A transport keeps what is its own: its receive queue and buffers, its
//! connection type, what a connect request must carry and what a
//! completion means (its [`WrToken`](crate::token::WrToken) kinds).

mod conn_table;
mod link;
mod listen_table;
mod mr_table;
mod poller;
mod post_sends;
mod rdma_group;

pub use conn_table::{ConnTable, MAX_CONNS};
pub use link::{GroupConn, Link};
pub use listen_table::ListenTable;
pub use mr_table::MrTable;
pub use poller::GroupPoller;
pub use post_sends::{post_sends, POST_CHUNK};
pub use rdma_group::{
    Acceptor, GroupCounters, GroupError, GroupSpec, ListenError, RdmaGroup, WC_BATCH,
};
