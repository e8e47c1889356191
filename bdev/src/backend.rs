//! The two traits a backend implements, and the completion sink it fills.
//!
//! Like SPDK's `spdk_bdev_fn_table`: the shared half ([`BdevBackend`]) says
//! what the bdev is and makes one [`BackendChannel`] per reactor; the channel
//! takes checked I/Os ([`BackendChannel::submit`]) and reports finished ones
//! from [`BackendChannel::poll`] through [`Completions`]. Everything else
//! (bounds and length checks, the request table, back-pressure, stats,
//! delivery of completions on the submitting reactor) is the generic layer's.

use std::collections::VecDeque;
use std::rc::Rc;

use pollux_reactor::{PollStatus, Reactor};
use slab::Slab;

use crate::info::BdevInfo;
use crate::io::{BdevError, BdevIo, IoCompletion, IoStatus, IoTag, IoType};

/// The default number of I/Os a channel keeps in flight.
pub const DEFAULT_QUEUE_DEPTH: usize = 1024;

/// The shared, `Send + Sync` half of a backend: one per bdev.
pub trait BdevBackend: Send + Sync + 'static {
    /// Name, geometry, metadata layout.
    fn info(&self) -> &BdevInfo;

    /// Whether the backend handles this I/O type. I/Os of an unsupported type
    /// complete with [`IoError::Unsupported`](crate::IoError::Unsupported)
    /// before the backend sees them.
    fn supports(&self, io_type: IoType) -> bool;

    /// The most I/Os one channel may have in flight. The generic layer sizes
    /// its request table from this and refuses more with
    /// [`IoError::ChannelFull`](crate::IoError::ChannelFull), so a backend may
    /// size its own queues from it and never grow them.
    fn queue_depth(&self) -> usize {
        DEFAULT_QUEUE_DEPTH
    }

    /// Make this backend's state for one reactor (called once per core, on that core).
    ///
    /// # Errors
    ///
    /// Whatever the backend cannot set up (an io_uring, a file descriptor).
    fn create_channel(&self, reactor: &Reactor) -> Result<Box<dyn BackendChannel>, BdevError>;
}

/// The per-reactor half of a backend (`!Send` is fine: it never leaves its core).
pub trait BackendChannel {
    /// Start one checked I/O.
    ///
    /// Must not complete it here: queue it and report it from a later
    /// [`poll`](Self::poll) (the generic layer would refuse an inline
    /// completion anyway, since it holds no [`Completions`] here). The backend
    /// keeps `tag`, reads the I/O's fields from `io`, may `std::mem::take`
    /// `io.bufs` while the kernel owns them (putting them back through
    /// [`Completions::io_mut`] before completing), and may copy data at once.
    fn submit(&mut self, tag: IoTag, io: &mut BdevIo);

    /// Make progress: flush batched submissions, reap finished I/Os and
    /// report each with [`Completions::complete`]. Returns
    /// [`PollStatus::Busy`] when it did any work.
    fn poll(&mut self, done: &mut Completions) -> PollStatus;
}

/// One in-flight I/O in a channel's request table.
pub(crate) struct IoSlot {
    pub(crate) io: BdevIo,
    pub(crate) cb: Rc<dyn IoCompletion>,
    pub(crate) ctx: u64,
    /// The status, once completed.
    pub(crate) status: IoStatus,
    /// Completed by the backend (or by a check), waiting for delivery.
    pub(crate) completed: bool,
}

/// A channel's request table and its queue of finished I/Os.
///
/// Preallocated to the queue depth at channel creation: nothing here
/// allocates afterwards. Backends see it in [`BackendChannel::poll`].
pub struct Completions {
    pub(crate) slots: Slab<IoSlot>,
    /// Completed tags in completion order (the status is in the slot).
    pub(crate) ready: VecDeque<IoTag>,
    pub(crate) depth: usize,
    pub(crate) stale: u64,
}

impl Completions {
    pub(crate) fn with_depth(depth: usize) -> Self {
        Self {
            slots: Slab::with_capacity(depth),
            ready: VecDeque::with_capacity(depth),
            depth,
            stale: 0,
        }
    }

    /// Report that the I/O `tag` finished with `status`.
    ///
    /// A tag that is not in flight, or that was completed already, is counted
    /// as stale (see [`ChannelStats::stale_completions`](crate::ChannelStats))
    /// and ignored: a backend bug never corrupts another I/O.
    #[inline]
    pub fn complete(&mut self, tag: IoTag, status: IoStatus) {
        match self.slots.get_mut(tag.0 as usize) {
            Some(slot) if !slot.completed => {
                slot.completed = true;
                slot.status = status;
                self.ready.push_back(tag);
            }
            _ => {
                self.stale += 1;
                log::error!(
                    "bdev backend completed unknown or finished I/O tag {}",
                    tag.0
                );
            }
        }
    }

    /// The in-flight I/O `tag` (to put back buffers the kernel returned), or
    /// `None` when the tag is not in flight or was completed already.
    #[inline]
    pub fn io_mut(&mut self, tag: IoTag) -> Option<&mut BdevIo> {
        match self.slots.get_mut(tag.0 as usize) {
            Some(slot) if !slot.completed => Some(&mut slot.io),
            _ => None,
        }
    }

    /// How many I/Os are in flight in this channel (completed ones waiting
    /// for delivery included).
    pub fn in_flight(&self) -> usize {
        self.slots.len()
    }

    /// The channel's queue depth.
    pub fn depth(&self) -> usize {
        self.depth
    }
}
