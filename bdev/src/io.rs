//! The I/O request, its completion, and the error types.
//!
//! An I/O is described by a [`BdevIo`]: an [`IoType`], a block range and, for
//! reads and writes, a scatter-gather list of owned [`DmaBuf`]s. The I/O owns
//! its buffers until it completes; the completion ([`CompletedIo`], lent in
//! the request slot) hands them back to the submitter, with the read data in
//! them.
//!
//! Two error types: [`IoError`] is the status of one I/O (small, `Copy`,
//! delivered through the completion), [`BdevError`] is a control-path error
//! (creating, opening or destroying a bdev).

use std::fmt;

pub use pollux_reactor::mem::{DmaBuf, SgList, SG_INLINE};
use thiserror::Error;

use crate::backend::SlotReq;
pub use crate::completion::{CompletedIo, OwnedIo};
use crate::pi::{PiAction, PiErrorKind};

/// The kind of an I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IoType {
    /// Read blocks into the I/O's buffers.
    Read,
    /// Write blocks from the I/O's buffers.
    Write,
    /// Make earlier completed writes durable. Carries no buffers.
    Flush,
    /// Write zeroes to a block range. Carries no buffers.
    WriteZeroes,
    /// Discard a block range (later reads return zeroes or old data, backend-defined). Carries no buffers.
    Unmap,
}

impl IoType {
    /// Every I/O type, for iterating over capabilities.
    pub const ALL: [IoType; 5] = [
        IoType::Read,
        IoType::Write,
        IoType::Flush,
        IoType::WriteZeroes,
        IoType::Unmap,
    ];

    /// Whether this I/O carries data buffers (read and write).
    pub fn has_data(self) -> bool {
        matches!(self, IoType::Read | IoType::Write)
    }

    /// Whether this I/O changes the bdev's contents (needs a writable descriptor).
    pub fn modifies(self) -> bool {
        matches!(self, IoType::Write | IoType::WriteZeroes | IoType::Unmap)
    }

    /// A short lowercase name (`"read"`, `"write_zeroes"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            IoType::Read => "read",
            IoType::Write => "write",
            IoType::Flush => "flush",
            IoType::WriteZeroes => "write_zeroes",
            IoType::Unmap => "unmap",
        }
    }
}

impl fmt::Display for IoType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why one I/O failed. Delivered through the completion, never by a panic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum IoError {
    /// The block range does not fit in the bdev.
    #[error("blocks {lba}..+{blocks} are out of range (the bdev has {num_blocks} blocks)")]
    OutOfRange {
        /// First block of the I/O.
        lba: u64,
        /// Number of blocks of the I/O.
        blocks: u64,
        /// Number of blocks of the bdev.
        num_blocks: u64,
    },
    /// A read, write, write-zeroes or unmap of zero blocks.
    #[error("zero-length {0} I/O")]
    ZeroLength(IoType),
    /// The buffers' total length is not `num_blocks * block size`.
    #[error("buffers hold {actual} bytes, the I/O needs {expected}")]
    BadLength {
        /// Bytes the block range needs.
        expected: u64,
        /// Bytes the buffers hold.
        actual: u64,
    },
    /// The I/O carries buffers it must not carry (flush, write zeroes, unmap).
    #[error("{0} I/O must not carry data buffers")]
    UnexpectedBuffers(IoType),
    /// The bdev does not support this I/O type.
    #[error("the bdev does not support {0}")]
    Unsupported(IoType),
    /// A write-type I/O through a read-only descriptor.
    #[error("{0} through a read-only descriptor")]
    ReadOnly(IoType),
    /// The channel has as many I/Os in flight as its queue depth (back-pressure: retry later).
    #[error("the channel is full")]
    ChannelFull,
    /// The backend's device failed the I/O with this errno.
    #[error("device error (errno {0})")]
    Device(i32),
    /// The device transferred fewer bytes than asked for.
    #[error("short transfer: {done} of {expected} bytes")]
    ShortTransfer {
        /// Bytes asked for.
        expected: u64,
        /// Bytes transferred.
        done: u64,
    },
    /// A protection-information check failed (write-verify before the
    /// backend, or read-verify after it). `kind` is
    /// [`Guard`](PiErrorKind::Guard), [`AppTag`](PiErrorKind::AppTag) or
    /// [`RefTag`](PiErrorKind::RefTag), never `Length`.
    #[error("PI {kind:?} check failed at LBA {lba}: expected {expected:#x}, found {actual:#x}")]
    Pi {
        /// Which field failed.
        kind: PiErrorKind,
        /// The failing block.
        lba: u64,
        /// The value expected (guard CRC, masked app tag or ref tag).
        expected: u64,
        /// The value found in the block's tuple.
        actual: u64,
    },
    /// A [`PiAction`] on a bdev formatted without protection information.
    #[error("the bdev has no protection information")]
    NoPi,
    /// The separate metadata buffers' total length is not
    /// `num_blocks * md_size` (or they are missing where the PI action
    /// needs them).
    #[error("metadata buffers hold {actual} bytes, the I/O needs {expected}")]
    BadMdLength {
        /// Bytes the block range needs.
        expected: u64,
        /// Bytes the buffers hold.
        actual: u64,
    },
    /// Separate metadata buffers for a bdev whose metadata is interleaved
    /// or that has none.
    #[error("the bdev takes no separate metadata buffers")]
    UnexpectedMetadata,
}

/// The status of a completed I/O.
pub type IoStatus = Result<(), IoError>;

/// A control-path error: creating, opening or destroying a bdev or a channel.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum BdevError {
    /// The bdev's geometry or metadata layout is invalid.
    #[error("invalid bdev geometry: {0}")]
    InvalidGeometry(String),
    /// A spec string or [`crate::BdevSpec`] value is invalid; `key` names the offending key.
    #[error("bad bdev spec key `{key}`: {reason}")]
    Spec {
        /// The key (or `"type"` for the part before the colon).
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No bdev of that name.
    #[error("no bdev named `{0}`")]
    NotFound(String),
    /// A bdev of that name exists already.
    #[error("a bdev named `{0}` exists already")]
    AlreadyExists(String),
    /// The bdev still has open descriptors.
    #[error("bdev `{name}` is open ({opens} descriptors)")]
    InUse {
        /// The bdev.
        name: String,
        /// Its open descriptors.
        opens: usize,
    },
    /// The backend cannot do what was asked (an option or layout it lacks).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The file or device refused `O_DIRECT`.
    #[error("`{path}` refused O_DIRECT ({source}); pass direct=false to use the page cache")]
    DirectRefused {
        /// The file or device.
        path: String,
        /// The error from `open`.
        #[source]
        source: std::io::Error,
    },
    /// An operating-system error on a file or device.
    #[error("{what} `{path}`: {source}")]
    Os {
        /// What was being done (`"open"`, `"stat"`, ...).
        what: &'static str,
        /// The file or device.
        path: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Backing memory could not be allocated.
    #[error("memory: {0}")]
    Memory(String),
    /// The I/O engine (io_uring or Linux AIO) could not be set up.
    #[error("I/O engine: {0}")]
    Engine(String),
    /// There is no reactor on this thread.
    #[error("no reactor on this thread")]
    NoReactor,
}

/// Identifies one in-flight I/O inside its channel (a slot of the channel's request table).
///
/// Backends keep it while the I/O is in flight (in a queue, or as the
/// `user_data` of a kernel submission) and give it back to
/// [`Completions::complete`](crate::Completions::complete).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IoTag(pub(crate) u32);

impl IoTag {
    /// The tag as a number, for use as a kernel `user_data`.
    pub fn as_u64(self) -> u64 {
        u64::from(self.0)
    }

    /// The tag from a number made by [`IoTag::as_u64`]. A number that was not
    /// a live tag is rejected by [`Completions`](crate::Completions), never trusted.
    pub fn from_u64(v: u64) -> Option<Self> {
        u32::try_from(v).ok().map(IoTag)
    }
}

/// One I/O as a backend sees it: already checked by the generic layer.
///
/// When a backend gets it, the range is inside the bdev, the type is supported,
/// and for reads and writes the buffers hold exactly
/// `num_blocks * buf_block_size` bytes (other types carry no buffers).
#[derive(Debug)]
pub struct BdevIo {
    pub(crate) io_type: IoType,
    pub(crate) offset_blocks: u64,
    pub(crate) num_blocks: u64,
    /// The data buffers. A backend may `std::mem::take` them while the kernel
    /// owns them and must put them back before completing the I/O.
    pub bufs: SgList,
    /// The separate metadata buffers (DIX: `md_size` bytes per block), only
    /// on a bdev with metadata that is not interleaved; empty otherwise, and
    /// empty when the submitter passed none (a write then leaves the stored
    /// metadata as it is, a read does not return it).
    pub md_bufs: SgList,
    pub(crate) pi: Option<PiAction>,
}

impl BdevIo {
    /// The I/O type.
    pub fn io_type(&self) -> IoType {
        self.io_type
    }

    /// The first block.
    pub fn offset_blocks(&self) -> u64 {
        self.offset_blocks
    }

    /// The number of blocks.
    pub fn num_blocks(&self) -> u64 {
        self.num_blocks
    }

    /// The submitter's PI action, if any. The generic layer has already
    /// generated or verified a write's tuples and verifies a read's after
    /// completion; a backend that makes up read data (null) uses it to
    /// generate tuples the read will verify.
    pub fn pi_action(&self) -> Option<&PiAction> {
        self.pi.as_ref()
    }
}

/// The receiver of completions, registered once by a submitter and shared
/// (`Rc`) by all its I/Os. Runs on the submitting reactor, from the channel's
/// poller, never inside a submit call.
///
/// A submitter with many outstanding I/Os tells them apart by
/// [`CompletedIo::ctx`]. The callback may submit new I/Os on the same channel.
pub trait IoCompletion {
    /// Called once per I/O, when it finishes (successfully or not), with the
    /// I/O lent in its request slot (see [`CompletedIo`]): the slot is freed
    /// when `io` is dropped, or at once by [`CompletedIo::into_bufs`], so
    /// that a submission from the callback can take it again.
    fn complete(&self, io: CompletedIo<'_>);

    /// The fast path, for I/Os submitted with
    /// [`IoChannel::submit_in_place`](crate::IoChannel::submit_in_place):
    /// the finished I/O is lent in its request slot, buffers and all, instead
    /// of being moved out. The callback may look at or change the buffers,
    /// take them ([`InPlaceIo::take_bufs`]), or resubmit the slot as a new
    /// I/O with the buffers it holds ([`InPlaceIo::resubmit`]: no buffer
    /// moves, no callback clone, the slot is never freed). A slot that is not
    /// resubmitted is freed when this returns (buffers left in it are dropped).
    ///
    /// While it runs, the channel holds this one slot: the callback may submit
    /// other I/Os (they take other slots), but the slot is not free until it
    /// returns. The default lends the I/O to [`complete`](Self::complete)
    /// (cancelling nothing: `complete` cannot resubmit).
    fn complete_in_place(&self, mut io: InPlaceIo<'_>) {
        self.complete(io.as_completed());
    }
}

/// A finished I/O lent to [`IoCompletion::complete_in_place`], still in its
/// channel's request slot.
pub struct InPlaceIo<'a> {
    pub(crate) req: &'a mut SlotReq,
}

impl InPlaceIo<'_> {
    /// The submitter's context value.
    #[inline]
    pub fn ctx(&self) -> u64 {
        self.req.ctx
    }

    /// The I/O type.
    #[inline]
    pub fn io_type(&self) -> IoType {
        self.req.io.io_type
    }

    /// The first block.
    #[inline]
    pub fn offset_blocks(&self) -> u64 {
        self.req.io.offset_blocks
    }

    /// The number of blocks.
    #[inline]
    pub fn num_blocks(&self) -> u64 {
        self.req.io.num_blocks
    }

    /// Success, or why the I/O failed.
    #[inline]
    pub fn status(&self) -> IoStatus {
        self.req.status
    }

    /// The buffers (read data is in them).
    #[inline]
    pub fn bufs(&self) -> &SgList {
        &self.req.io.bufs
    }

    /// The buffers, mutably (to refill them before a resubmit, or to swap them).
    #[inline]
    pub fn bufs_mut(&mut self) -> &mut SgList {
        &mut self.req.io.bufs
    }

    /// Takes the buffers out of the slot (leaving it empty).
    #[inline]
    pub fn take_bufs(&mut self) -> SgList {
        std::mem::take(&mut self.req.io.bufs)
    }

    /// The separate metadata buffers (empty if none).
    #[inline]
    pub fn md_bufs(&self) -> &SgList {
        &self.req.io.md_bufs
    }

    /// The separate metadata buffers, mutably.
    #[inline]
    pub fn md_bufs_mut(&mut self) -> &mut SgList {
        &mut self.req.io.md_bufs
    }

    /// Takes the metadata buffers out of the slot.
    #[inline]
    pub fn take_md_bufs(&mut self) -> SgList {
        std::mem::take(&mut self.req.io.md_bufs)
    }

    /// The I/O's PI action (a [`resubmit`](Self::resubmit) keeps it).
    #[inline]
    pub fn pi_action(&self) -> Option<PiAction> {
        self.req.io.pi
    }

    /// Sets the PI action for a [`resubmit`](Self::resubmit).
    #[inline]
    pub fn set_pi_action(&mut self, pi: Option<PiAction>) {
        self.req.io.pi = pi;
    }

    /// Resubmits this slot, when the callback returns, as a new I/O of
    /// `io_type` on `offset_blocks..+num_blocks` with the buffers the slot
    /// holds then, the same callback and the given `ctx`. It goes through the
    /// same checks as any submission (a failed check completes it with the
    /// error on a later poll), never completes inside the call, and cannot
    /// be refused for a full channel (it keeps its slot). The last call wins.
    /// The metadata buffers and the PI action stay as they are (see
    /// [`set_pi_action`](Self::set_pi_action)).
    #[inline]
    pub fn resubmit(&mut self, io_type: IoType, offset_blocks: u64, num_blocks: u64, ctx: u64) {
        let io = &mut self.req.io;
        io.io_type = io_type;
        io.offset_blocks = offset_blocks;
        io.num_blocks = num_blocks;
        self.req.ctx = ctx;
        self.req.again = true;
    }

    /// The I/O as a [`CompletedIo`], lent from this slot (the slot is still
    /// freed when the callback returns; a pending
    /// [`resubmit`](Self::resubmit) is cancelled).
    #[inline(always)]
    pub fn as_completed(&mut self) -> CompletedIo<'_> {
        self.req.again = false;
        CompletedIo::lent(self.req)
    }
}

impl fmt::Debug for InPlaceIo<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InPlaceIo")
            .field("ctx", &self.req.ctx)
            .field("io", &self.req.io)
            .field("status", &self.req.status)
            .finish()
    }
}

/// Any `Fn(CompletedIo)` closure is a completion target.
impl<F: for<'a> Fn(CompletedIo<'a>)> IoCompletion for F {
    fn complete(&self, io: CompletedIo<'_>) {
        self(io)
    }
}

/// A submission the channel refused at once, with the buffers handed back.
///
/// Only back-pressure is reported this way ([`IoError::ChannelFull`]): retry
/// after some of the channel's I/Os complete. Every other error is delivered
/// through the completion.
#[derive(Debug)]
pub struct Rejected {
    /// Why the I/O was refused.
    pub error: IoError,
    /// The buffers of the refused I/O.
    pub bufs: SgList,
    /// The separate metadata buffers of the refused I/O (empty if none).
    pub md_bufs: SgList,
}

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "I/O rejected: {}", self.error)
    }
}

impl std::error::Error for Rejected {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_type_properties() {
        assert!(IoType::Read.has_data() && IoType::Write.has_data());
        assert!(!IoType::Flush.has_data() && !IoType::Unmap.has_data());
        assert!(!IoType::Read.modifies() && !IoType::Flush.modifies());
        assert!(IoType::WriteZeroes.modifies() && IoType::Unmap.modifies());
        assert_eq!(IoType::WriteZeroes.to_string(), "write_zeroes");
    }

    #[test]
    fn tags_round_trip_and_reject_wide_values() {
        let t = IoTag(77);
        assert_eq!(IoTag::from_u64(t.as_u64()), Some(t));
        assert_eq!(IoTag::from_u64(u64::MAX), None);
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let e = IoError::OutOfRange {
            lba: 10,
            blocks: 4,
            num_blocks: 12,
        };
        assert!(e.to_string().contains("12 blocks"));
        let e = BdevError::Spec {
            key: "size".into(),
            reason: "bad".into(),
        };
        assert!(e.to_string().contains("`size`"));
    }
}
