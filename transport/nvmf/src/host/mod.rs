//! The NVMe-oF host: transport IDs, controllers (admin queue, enable,
//! Identify, queue count, keep-alive, discovery), I/O queue pairs with
//! back-pressure and SQ flow control, and the host transports (RDMA over
//! any verbs provider, in-process loopback).
//!
//! ```text
//! HostTrid ──parse──> Controller<T>::connect(&transport, ..)   admin queue, this reactor
//!                         │ info(): CtrlInfo (Send)
//!                         └──> connect_io_qpair(&transport_of_core_n, &info, qid, ..) -> Qpair<T::Queue>
//! Qpair: read / write / flush / write_zeroes / deallocate -> poll(|Completion| ..)
//! Controller::poll_recover(&transport): Live -> Reconnecting -> Live | Failed
//!   (CtrlLink, shared: report_failure / reconnect_io on the I/O reactors)
//! ```
//!
//! The core ([`Qpair`], [`Controller`]) is transport-independent; a
//! transport implements [`HostTransport`] / [`HostQueue`]
//! ([`transport`] documents the contract). [`rdma::RdmaHost`] is generic
//! over a `pollux_verbs::Provider` (soft, ibverbs) and implements the
//! memory registration modes ([`rdma::MemMode`]).
//!
//! Queues are polled by their owner, and nothing they wait for (a
//! shared-memory ring, a CQ, a socket) wakes a sleeping reactor: a queue
//! holds the reactor it is used on awake
//! ([`pollux_reactor::Reactor::hold_awake`]) while it has commands
//! outstanding, so an application whose reactors run an adaptive or
//! hybrid idle mode needs to do nothing for its I/O. What it polls on a
//! schedule of its own (keep-alive, reconnects) needs a timed poller or a
//! hold of its own, as `pollux-perf` keeps one for the length of a job.

mod ctrlr;
mod error;
pub mod fabrics;
pub mod loopback;
pub mod pi;
mod qpair;
pub mod rdma;
mod reconnect;
pub mod tcp;
#[cfg(test)]
pub(crate) mod test_io;
pub mod transport;
pub mod trid;

pub use ctrlr::{
    connect_io_qpair, discover, Controller, CtrlInfo, CtrlOptions, NsInfo, ReactorLoad,
    ADMIN_QUEUE_ENTRIES, DEFAULT_CTRL_LOSS_TMO, DEFAULT_RECONNECT_DELAY, LID_POLLUX_REACTORS,
    POLLUX_REACTORS_LOG_SIZE,
};
pub use error::{HostError, InvalidParam, IoError};
pub use fabrics::HostIdentity;
pub use qpair::{Completion, Qpair, SubmitError, SubmitErrorKind, MAX_QUEUE_ENTRIES};
pub use reconnect::{CtrlLink, CtrlState};
pub use transport::{DataDir, HostQueue, HostTransport, NoSlotBufs, QueueParams, Queued, SlotBufs};
pub use trid::{HostTrType, HostTrid, DEFAULT_HOSTNQN, DISCOVERY_NQN};

#[cfg(test)]
mod tests;
