//! The transport-independent NVMe-oF target core, and the loopback
//! transport.
//!
//! - [`Target`] ([`TargetOptions`]): subsystems, transports, listeners, the
//!   discovery subsystem, the shared data buffer pool (control plane, `Arc`).
//! - [`Subsystem`] ([`SubsystemConfig`], [`NamespaceConfig`], [`Namespace`]):
//!   NQN, serial, model, namespaces (bdevs) with stable NGUID/EUI-64/UUID,
//!   host access.
//! - [`Controller`]: dynamic-model controllers, CC/CSTS, queues, keep-alive,
//!   events.
//! - [`QueuePair`]: one NVMe queue on one reactor; owns the preallocated
//!   requests and their state machine (`req.rs`) and executes fabrics
//!   (`fabrics_cmd.rs`), admin (`admin_cmd.rs`) and I/O (`io_cmd.rs`)
//!   commands.
//! - [`transport`]: the [`TargetTransport`] and [`QpairOps`] traits, the
//!   contract a transport implements (read its module docs first).
//! - [`LoopbackTransport`]: the in-process transport the tests use.
//!
//! The RDMA transport ([`rdma`]) and the NVMe/TCP transport ([`tcp`]) need
//! nothing else from the core than what [`transport`] describes.

mod admin_cmd;
mod cmd_effects;
pub mod conformance;
mod core_ctx;
mod ctrlr;
mod ctrlr_stats;
mod discovery;
mod error;
pub mod error_loc;
mod exec;
mod fabrics_cmd;
pub mod health;
mod io_cmd;
mod loopback;
mod pi_layout;
mod qpair;
pub mod rdma;
mod req;
mod subsystem;
#[allow(clippy::module_inception)]
mod target;
pub mod tcp;
pub mod transport;

pub use core_ctx::CoreCtx;
pub use ctrlr::{Controller, ERROR_LOG_ENTRIES};
pub use ctrlr_stats::{CtrlCounterSnapshot, CtrlCounters};
pub use error::{CapsuleError, TargetError};
pub use loopback::{LoopbackEndpoint, LoopbackPollGroup, LoopbackQueueOptions, LoopbackTransport};
pub use qpair::{QpairStats, QueuePair};
pub use req::ReqState;
pub use subsystem::{
    Namespace, NamespaceConfig, Subsystem, SubsystemConfig, SubsystemKind, DEFAULT_CNTLID_RANGE,
    DEFAULT_MAX_NAMESPACES, DISCOVERY_NQN,
};
pub use target::{Listener, Target, TargetOptions, SLOT_BUF_SIZE};
pub use transport::{
    QpairOps, QpairParams, RemoteBuf, ReqTag, Response, ResponseData, TargetTransport, Transfer,
    TransportError, TransportPollGroup, TransportStats,
};
