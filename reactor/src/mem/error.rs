//! Errors of the DMA memory layer (control path: arena creation, pool creation).

use std::io;

/// An error creating or mapping DMA memory, or creating a pool over it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MemError {
    /// `HugepageMode::Require` was asked for but no 2 MiB hugepages could be mapped.
    #[error(
        "2 MiB hugepages required for arena `{name}` ({len} bytes) but unavailable: {source}; \
         reserve some with `echo N > /proc/sys/vm/nr_hugepages`"
    )]
    HugepagesUnavailable {
        /// The arena's name.
        name: String,
        /// The requested length, rounded to 2 MiB.
        len: usize,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// A system call failed (`memfd_create`, `ftruncate`, `mmap`, `fstat`).
    #[error("{op} failed for DMA arena `{name}`: {source}")]
    Sys {
        /// The system call.
        op: &'static str,
        /// The arena's name.
        name: String,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// A length, size, count or alignment argument is out of range.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// A foreign arena's fd does not have the expected size.
    #[error("foreign arena fd has size {actual}, expected {expected}")]
    ForeignSizeMismatch {
        /// The length the peer announced.
        expected: usize,
        /// The size of the file behind the fd.
        actual: u64,
    },
    /// A foreign arena's fd is not sealed against shrinking, so the peer could
    /// truncate it under our mapping (which would fault with SIGBUS).
    #[error("foreign arena fd is not sealed against shrinking (F_SEAL_SHRINK)")]
    ForeignNotSealed,
}

/// Shorthand for results of this module.
pub type MemResult<T> = Result<T, MemError>;
