//! Typed errors of the verbs layer.

use std::io;

use crate::types::QpState;

/// A control-path error (open, allocate, register, create, modify, connect).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// No device with that name.
    #[error("no RDMA device named `{0}`")]
    NoDevice(String),
    /// An argument is out of range or inconsistent.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// The device does not support this.
    #[error("unsupported by this provider: {0}")]
    Unsupported(&'static str),
    /// A device limit would be exceeded.
    #[error("resource limit reached: {0}")]
    Limit(&'static str),
    /// The memory is not inside a framework DMA arena (soft provider).
    #[error("memory {addr:#x}+{len} is not inside a DMA arena")]
    NotInArena {
        /// Start address.
        addr: u64,
        /// Length.
        len: u64,
    },
    /// The object is still in use (a CQ with QPs, a PD with children).
    #[error("busy: {0}")]
    Busy(&'static str),
    /// A QP state transition the state table forbids (no change was made).
    #[error("invalid QP transition {from:?} -> {to:?}")]
    InvalidTransition {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// Private data longer than the limit for this CM message.
    #[error("private data of {len} bytes exceeds the {max}-byte limit")]
    PrivateDataTooLong {
        /// Given length.
        len: usize,
        /// The limit (56 connect, 196 accept, 148 reject).
        max: usize,
    },
    /// The CM object is not in a state that allows this call.
    #[error("connection manager: {0}")]
    CmState(&'static str),
    /// The peer broke the connection-manager protocol.
    #[error("connection manager protocol error: {0}")]
    Protocol(&'static str),
    /// A system call failed.
    #[error("{op}: {source}")]
    Sys {
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl VerbsError {
    /// Wrap an OS error.
    pub fn sys(op: &'static str, e: impl Into<io::Error>) -> Self {
        VerbsError::Sys {
            op,
            source: e.into(),
        }
    }
}

/// Why one work request of a posted list was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PostErrorKind {
    /// The queue is full (`ENOMEM`).
    #[error("queue full")]
    QueueFull,
    /// More SGEs than the queue allows.
    #[error("too many SGEs")]
    TooManySge,
    /// Inline payload longer than `max_inline_data`.
    #[error("inline data too long")]
    InlineTooLong,
    /// The QP state does not accept this queue's WRs.
    #[error("wrong QP state {0:?}")]
    WrongState(QpState),
    /// The opcode is not valid here (or not supported by the provider).
    #[error("invalid opcode for this QP")]
    InvalidOpcode,
    /// The message is larger than the device's maximum.
    #[error("message too long")]
    MessageTooLong,
    /// Receives must go to the SRQ, not the QP.
    #[error("QP uses an SRQ")]
    UsesSrq,
    /// The provider cannot carry out this WR as asked (for example a
    /// fast registration that a memory window cannot express); the text
    /// says why.
    #[error("refused: {0}")]
    Refused(&'static str),
}

/// A post failed at WR `index` of the list; WRs before it stay posted
/// (verbs `bad_wr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("work request {index} refused: {kind}")]
pub struct PostError {
    /// Index of the first refused WR.
    pub index: usize,
    /// Why.
    pub kind: PostErrorKind,
}

/// A CQ poll error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CqError {
    /// The CQ overflowed; it is dead and its QPs are in ERR.
    #[error("completion queue overflow")]
    Overflow,
}
