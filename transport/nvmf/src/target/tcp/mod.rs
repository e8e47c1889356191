//! The NVMe/TCP target transport (NVM Express TCP Transport
//! Specification), beside RDMA on the same target core.
//!
//! - [`TcpTransport`] (shared, `Send + Sync`): options ([`TcpOptions`]),
//!   listening sockets (bound by [`listen`](super::TargetTransport::listen),
//!   each owned by one poll group, spread round robin), the placement seats
//!   and connection counters. It implements
//!   [`TargetTransport`](super::TargetTransport).
//! - [`TcpPollGroup`] (one per reactor, `!Send`): accepts on the listeners
//!   it owns and places each socket with the placement shared with the RDMA
//!   targets ([`pollux_verbs::placement::Seats`]: fewest connections first,
//!   or the listener's core); a socket for another core travels by reactor
//!   message. Each group owns and polls its sockets.
//! - `refusal.rs`: a connection beyond `max_qpairs` or
//!   `max_qpairs_per_core` (no free seat): accepted, its ICReq answered,
//!   its Connect failed with Connect Controller Busy, closed; it takes no
//!   queue.
//! - `conn.rs`: one queue: the receive state machine over the byte stream
//!   (ICReq first; CapsuleCmd, H2CData, H2CTermReq), in-capsule data
//!   handed to the core where it lies, H2CData payloads written into the
//!   request's buffers (straight from the socket once the receive buffer
//!   is drained), R2Ts of at most MAXH2CDATA each (one outstanding per
//!   command, any number per connection), reads as C2HData PDUs split at
//!   `max_c2h_data` with the SUCCESS flag when the host disabled SQ flow
//!   control and `c2h_success` is on, the CapsuleResp otherwise. Bad input
//!   ends the connection with a C2HTermReq (fatal error status and field
//!   offset); a data digest mismatch fails only its command (transient
//!   transport error for in-capsule data, data transfer error after R2T).
//!
//! # Socket engine
//!
//! Non-blocking sockets (`std::net`), polled by the reactor: one `read`
//! into a per-connection receive buffer per round (whole PDUs are handled
//! where they lie), direct `read`s into request buffers for large H2CData
//! payloads, and one send queue per connection written once per poll
//! (every PDU a poll produced leaves in one `writev` when the socket takes
//! it, read data of a page or more straight from the request's buffers:
//! `tx_queue.rs`). Chosen without a measurement (the shared development machine
//! cannot give one; the benchmarks on a quiet machine decide): the reactor
//! already polls, so a non-blocking call per socket per poll needs no ring
//! state; it works where io_uring is disabled (containers, seccomp); and it
//! keeps this crate free of `unsafe` (a ring with provided or registered
//! buffers would live in `pollux_reactor::io`, where `unsafe` is allowed).
//! The engine is the connection's `read`/`write` calls and the shared
//! send/receive buffers (`tcp_bufs.rs`) only, so an io_uring engine
//! (multishot receive into provided buffers, one send SQE per socket per
//! poll) can replace them behind the same connection code if it wins.
//!
//! Addresses: a [`TransportId`](crate::spec::transport_id::TransportId)
//! with `trtype` TCP, `adrfam` IPv4 or IPv6, `traddr` an IP address and
//! `trsvcid` the port ([`socket_addr`]).

mod conn;
mod options;
mod poll_group;
mod refusal;
mod transport;
mod tx_queue;

#[cfg(test)]
mod tests;

pub use options::{DigestPolicy, TcpOptions, TcpOptionsError};
pub use poll_group::TcpPollGroup;
pub use transport::{socket_addr, TcpInbox, TcpTransport, TcpTransportStats};
