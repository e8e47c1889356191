//! The apps' error type: what went wrong, in words a user can act on.

/// An application error; the binaries print it and exit non-zero.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AppError {
    /// A bad command line.
    #[error("usage: {0}")]
    Usage(String),
    /// A bad configuration file (the message names the line and field).
    #[error("config: {0}")]
    Config(String),
    /// A bdev could not be created or opened.
    #[error("bdev: {0}")]
    Bdev(String),
    /// Reactors could not start or stop.
    #[error("reactor: {0}")]
    Reactor(String),
    /// A core failed to set up its work.
    #[error("setup: {0}")]
    Setup(String),
}
