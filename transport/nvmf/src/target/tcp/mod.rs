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
//!   transport error, for in-capsule data and for H2CData alike).
//!
//! # Socket engine
//!
//! Non-blocking sockets (`std::net`), polled by the reactor: one `read`
//! into a per-connection receive buffer per round (whole PDUs are handled
//! where they lie), direct `read`s into request buffers for large H2CData
//! payloads, and one send queue per connection written once per poll
//! (every PDU a poll produced leaves in one `writev` when the socket takes
//! it, read data of a page or more straight from the request's buffers:
//! `tx_queue.rs`). The engine is the connection's `read`/`write` calls and
//! the shared send/receive buffers (`tcp_bufs.rs`) only.
//!
//! **Chosen by measurement** (2026-12-06, `cargo bench -p pollux-reactor
//! --bench sock_engine -- --reps 7`; 2-vCPU VM, Linux 6.18, release
//! build, other builds and a VM running, load 5-9). The bench replays
//! this transport's pattern on loopback: a host thread (core 0) keeps 128
//! reads outstanding on one connection (72-byte capsules, batched); the
//! target thread (core 1) answers each with a 24-byte C2HData header
//! (SUCCESS flag) and the data sent by reference from a per-command
//! buffer, sending once per poll. Engine A is what this module does
//! (`read` into 256 KiB + one `writev` per poll); engine B is
//! `pollux_reactor::io::SockRing` (io_uring, `DEFER_TASKRUN`: multishot
//! receive into provided buffers, one `SENDMSG` per poll, one
//! `io_uring_enter` per poll and none on an idle one). Both threads
//! busy-poll, so whole-thread CPU per I/O mostly counts idle spinning and
//! follows the machine's load; the deciding figure is the target's *busy*
//! CPU per I/O (thread CPU time of the polls that moved bytes), medians
//! of 7 interleaved 3 s runs:
//!
//! | size | engine | IOPS | busy CPU/I/O | syscalls/I/O | I/Os per busy poll |
//! |------|--------|------|--------------|--------------|--------------------|
//! | 4 KiB | A read+writev | 114 k | 1722 ns | 1.78 | 122 |
//! | 4 KiB | B io_uring | 87 k | 1526 ns | 0.016 | 58 |
//! | 512 B | A read+writev | 661 k | 371 ns | 0.51 | 65 |
//! | 512 B | B io_uring | 334 k | 333 ns | 0.028 | 30 |
//!
//! B/A busy CPU per I/O: 0.89 (4 KiB) and 0.90 (512 B) in that run;
//! 1.17 and 0.91, then 1.19 and 1.14, in the two runs before it (5 x 3 s,
//! 3 x 2 s); 1.09 and 1.26 in the default run after it (5 x 3 s). Eight
//! ratios from 0.89 to 1.26, median 1.12; per-round paired ratios span
//! 0.63-1.54. That is within the noise of this machine, and if anything
//! against io_uring: **it does not take clearly less CPU per I/O at queue
//! depth 128** (the 15 % bar), because a busy poll carries 30-120 I/Os
//! and the system call saved per poll is spread over them, while the
//! kernel work per byte (TCP, copies) is the same. The host thread's busy
//! CPU per I/O was 1-31 % higher with io_uring in every run (on loopback
//! the sender's softirq runs the ring's wake-up of the armed receive).
//! Wall-clock IOPS swung several-fold between runs with the load and
//! decide nothing. At queue depth 1 (`-- --qd 1`) io_uring costs more
//! (busy CPU/I/O x1.0-1.5): with deferred task work the receive runs in
//! one `io_uring_enter` and the response leaves in the next, two entries
//! per I/O like `read` + `writev`, plus the ring's bookkeeping. The
//! ring's other task-run modes did no better at queue depth 128
//! (`--engines a,b,b-coop,b-int`, 3 x 2 s: cooperative x1.16 and x0.93,
//! interrupting x1.17 and x1.46, 4 KiB and 512 B). So the
//! non-blocking engine stays: no measurable difference under load, no
//! ring state, works where io_uring is disabled (containers, seccomp), and
//! keeps this crate free of `unsafe`.
//!
//! Where io_uring wins is *idle* connections: polling one that has nothing
//! costs a failing `read`, **~340 ns** of CPU on this VM, against **~5
//! ns** for a reap and a submit that find nothing (the same bench, first
//! lines). With many mostly idle connections per core that was 340 ns per
//! connection per poll round (64 connections: ~22 us per round); quiet
//! connections (the `quiet` module: an idle socket is read only once the
//! group's epoll set reports bytes) took that cost away without a ring.
//! Should a ring be wanted still, adopt `SockRing` behind this same connection code: the
//! poll group owns one ring per core and attaches each accepted socket;
//! `receive` handles each `SockEvent::Recv` slice where it lies (a PDU cut
//! by a buffer edge is copied into the connection's `RecvBuf`, and large
//! H2CData payloads are copied out instead of read directly); the
//! `TxQueue` fills a `SendList` instead of calling `writev` (header bytes
//! copied, request data by reference: the `SendList` must own what it
//! sends, so the request's `DmaBuf`s move into it, they being
//! `StableBuf`s, and come back with `SockEvent::Sent`, which then reports
//! the requests sent), with a second list filling while one is in the
//! kernel; the group calls `submit` once per poll for all its sockets,
//! and closes through `SockRing::close`.
//!
//! Addresses: a [`TransportId`](crate::spec::transport_id::TransportId)
//! with `trtype` TCP, `adrfam` IPv4 or IPv6, `traddr` an IP address and
//! `trsvcid` the port ([`socket_addr`]).

mod conn;
mod group_counter;
mod options;
mod poll_group;
mod quiet;
mod refusal;
mod transport;
mod tx_queue;
mod wake;

#[cfg(test)]
mod tests;

pub use options::{DigestPolicy, TcpKeepalive, TcpOptions, TcpOptionsError};
pub use poll_group::TcpPollGroup;
pub use transport::{socket_addr, TcpInbox, TcpTransport, TcpTransportStats};
