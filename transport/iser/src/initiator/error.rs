//! Typed errors of the initiator.

use std::time::Duration;

use pollux_reactor::mem::SgList;
use thiserror::Error;

/// Why the connection or session failed (or could not start).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum InitiatorError {
    /// A verbs object could not be created or a post failed.
    #[error("verbs: {0}")]
    Verbs(String),
    /// The target rejected the connection, or nobody listens.
    #[error("connection refused: {0}")]
    Refused(String),
    /// The connection was lost (peer disconnect, failed WR).
    #[error("connection lost: {0}")]
    Lost(String),
    /// Login failed with this status class/detail.
    #[error("login failed: status {class}/{detail}")]
    Login {
        /// Status-Class.
        class: u8,
        /// Status-Detail.
        detail: u8,
    },
    /// The target broke the protocol (bad PDU, bad key, unexpected
    /// invalidation).
    #[error("protocol error: {0}")]
    Protocol(String),
    /// Not in the state the call needs.
    #[error("not ready: {0}")]
    NotReady(&'static str),
    /// The target stayed connected but went silent: nothing was received
    /// for `after` and the NOP-Out ping sent after
    /// [`InitiatorOptions::nop_interval`](super::InitiatorOptions::nop_interval)
    /// of silence went unanswered for
    /// [`InitiatorOptions::nop_timeout`](super::InitiatorOptions::nop_timeout).
    #[error("target unresponsive: nothing received for {after:?} (NOP-Out ping unanswered)")]
    TargetUnresponsive {
        /// How long the target had been silent when the session failed.
        after: Duration,
    },
}

/// Why a task was not submitted; the caller's buffers come back.
#[derive(Debug)]
#[non_exhaustive]
pub enum SubmitError {
    /// No free task or the CmdSN window is closed: retry after a poll.
    Busy(Option<SgList>),
    /// The session is not in full feature phase.
    NotReady(Option<SgList>),
    /// Bad arguments (unknown LUN, length over the limits, too many
    /// segments, buffers shorter than the transfer).
    Invalid(&'static str, Option<SgList>),
    /// The buffers could not be registered.
    Verbs(String, Option<SgList>),
}

impl SubmitError {
    /// The buffers handed back.
    pub fn into_bufs(self) -> Option<SgList> {
        match self {
            SubmitError::Busy(b)
            | SubmitError::NotReady(b)
            | SubmitError::Invalid(_, b)
            | SubmitError::Verbs(_, b) => b,
        }
    }
}

impl std::fmt::Display for SubmitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SubmitError::Busy(_) => f.write_str("busy: no free task or CmdSN window closed"),
            SubmitError::NotReady(_) => f.write_str("session not in full feature phase"),
            SubmitError::Invalid(w, _) => write!(f, "invalid request: {w}"),
            SubmitError::Verbs(e, _) => write!(f, "registration failed: {e}"),
        }
    }
}

impl std::error::Error for SubmitError {}
