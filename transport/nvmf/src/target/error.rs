//! Control-path errors of the target and the capsule errors a transport sees.

use pollux_bdev::BdevError;
use pollux_reactor::mem::MemError;

use super::transport::TransportError;
use crate::spec::transport_id::{TrType, TransportId};

/// A configuration or control-path failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TargetError {
    /// The NQN is malformed.
    #[error("invalid NQN {0:?}")]
    InvalidNqn(String),
    /// A subsystem with that NQN exists already.
    #[error("subsystem {0} already exists")]
    SubsystemExists(String),
    /// No subsystem has that NQN.
    #[error("no subsystem {0}")]
    NoSuchSubsystem(String),
    /// The subsystem still has controllers.
    #[error("subsystem {nqn} has {controllers} controller(s)")]
    SubsystemInUse {
        /// The subsystem.
        nqn: String,
        /// Its live controllers.
        controllers: usize,
    },
    /// The operation is not allowed on the discovery subsystem.
    #[error("not allowed on the discovery subsystem")]
    DiscoverySubsystem,
    /// The NSID is already in use.
    #[error("namespace {0} exists already")]
    NamespaceExists(u32),
    /// No namespace has that NSID.
    #[error("no namespace {0}")]
    NoSuchNamespace(u32),
    /// The NSID is 0, broadcast or above the subsystem's maximum.
    #[error("invalid NSID {0}")]
    InvalidNsid(u32),
    /// Every NSID is taken.
    #[error("the subsystem has no free NSID")]
    NamespaceLimit,
    /// The bdev cannot back a namespace.
    #[error("bdev {name} cannot back a namespace: {why}")]
    UnsupportedBdev {
        /// The bdev.
        name: String,
        /// Why.
        why: &'static str,
    },
    /// A bdev error (opening, creating a channel).
    #[error(transparent)]
    Bdev(#[from] BdevError),
    /// A memory error (creating buffer pools).
    #[error(transparent)]
    Memory(#[from] MemError),
    /// No transport of that type was added.
    #[error("no transport of type {0:?}")]
    NoTransport(TrType),
    /// A transport of that type was added already.
    #[error("a transport of type {0:?} exists already")]
    TransportExists(TrType),
    /// That listener exists already.
    #[error("already listening at {0}")]
    ListenerExists(TransportId),
    /// No such listener.
    #[error("not listening at {0}")]
    NoSuchListener(TransportId),
    /// A transport error.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// An option is out of range.
    #[error("invalid option: {0}")]
    InvalidOption(&'static str),
}

/// Why [`QueuePair::submit_capsule`](super::QueuePair::submit_capsule)
/// refused a capsule. Both mean a broken host; Linux tears the queue down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CapsuleError {
    /// Fewer than 64 bytes.
    #[error("capsule of {0} bytes is shorter than an SQE")]
    Malformed(usize),
    /// More commands outstanding than the queue depth.
    #[error("more commands than the queue depth")]
    QueueFull,
    /// The queue is being torn down.
    #[error("the queue is disconnecting")]
    Disconnecting,
}
