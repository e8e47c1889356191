//! Errors of the reactor core.

use std::io;

use crate::cores::CoreId;

/// A reactor could not be set up or could not register a wake fd.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReactorError {
    /// A system call failed.
    #[error("{op} failed")]
    Os {
        /// The call (`eventfd`, `epoll_ctl`, ...).
        op: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl ReactorError {
    pub(crate) fn os(op: &'static str, e: impl Into<io::Error>) -> Self {
        Self::Os {
            op,
            source: e.into(),
        }
    }
}

/// A message could not be queued. The message is dropped (on the sending
/// thread).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// No reactor runs on that core in this set.
    #[error("no reactor on core {0}")]
    UnknownCore(CoreId),
    /// The reactor on that core has stopped (or is stopping).
    #[error("the reactor on core {0} has stopped")]
    Stopped(CoreId),
    /// The core's inbox is full (back-pressure: retry later).
    #[error("the inbox of core {0} is full")]
    Full(CoreId),
}
