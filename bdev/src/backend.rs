//! The two traits a backend implements, and the completion sink it fills.
//!
//! Like SPDK's `spdk_bdev_fn_table`: the shared half ([`BdevBackend`]) says
//! what the bdev is and makes one [`BackendChannel`] per reactor; the channel
//! takes checked I/Os ([`BackendChannel::submit`]), finishing them there
//! ([`Submitted::Done`]) or reporting them from [`BackendChannel::poll`]
//! through [`Completions`]. Everything else
//! (bounds and length checks, the request table, back-pressure, stats,
//! delivery of completions on the submitting reactor) is the generic layer's.

use std::cell::{RefCell, RefMut};
use std::rc::Rc;

use pollux_reactor::{PollStatus, Reactor};

use crate::info::BdevInfo;
use crate::io::{BdevError, BdevIo, IoCompletion, IoStatus, IoTag, IoType};

/// The default number of I/Os a channel keeps in flight.
pub const DEFAULT_QUEUE_DEPTH: usize = 1024;

/// The most I/Os a channel keeps in flight (the entries of the largest NVMe
/// queue). A channel preallocates its request table, about 200 bytes a slot
/// per core: [`BdevSpec::validate`](crate::BdevSpec::validate) refuses a
/// deeper `depth`, and a backend asking for more gets this many.
pub const MAX_QUEUE_DEPTH: usize = 65536;

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
    /// size its own queues from it and never grow them. The generic layer
    /// takes at most [`MAX_QUEUE_DEPTH`] of them.
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

/// What a backend did with an I/O it was handed ([`BackendChannel::submit`]).
#[must_use]
#[derive(Debug)]
pub enum Submitted {
    /// The backend owns the I/O and reports it from a later
    /// [`poll`](BackendChannel::poll) through [`Completions::complete`].
    Queued,
    /// The backend finished the I/O already (a memory backend copies at
    /// once, a synchronous fallback ran): the generic layer queues the
    /// status for delivery on the channel's next poll, exactly as if the
    /// backend had reported it then, so a completion still never runs inside
    /// a submit.
    Done(IoStatus),
}

/// The per-reactor half of a backend (`!Send` is fine: it never leaves its core).
pub trait BackendChannel {
    /// Start one checked I/O.
    ///
    /// The backend reads the I/O's fields from `io` and either finishes it
    /// here and returns [`Submitted::Done`] with its status (delivered on the
    /// channel's next poll), or keeps `tag` and returns [`Submitted::Queued`],
    /// reporting it from a later [`poll`](Self::poll). A queued I/O's
    /// backend may `std::mem::take` `io.bufs` while the kernel owns them
    /// (putting them back through [`Completions::io_mut`] before completing).
    fn submit(&mut self, tag: IoTag, io: &mut BdevIo) -> Submitted;

    /// Make progress: flush batched submissions, reap finished I/Os and
    /// report each with [`Completions::complete`]. Returns
    /// [`PollStatus::Busy`] when it did any work.
    fn poll(&mut self, done: &mut Completions<'_>) -> PollStatus;
}

/// Where a request slot is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotState {
    /// On the channel's free list.
    Free,
    /// The backend owns the I/O.
    InFlight,
    /// Completed by the backend (or by a check), waiting for delivery.
    Completed,
}

/// The part of a request slot a fast-path completion may touch
/// (see [`InPlaceIo`](crate::InPlaceIo)).
pub(crate) struct SlotReq {
    pub(crate) io: BdevIo,
    pub(crate) ctx: u64,
    /// The status, once completed.
    pub(crate) status: IoStatus,
    /// Write-type I/O allowed (the submitting handle's permission).
    pub(crate) writable: bool,
    /// Set by [`InPlaceIo::resubmit`](crate::InPlaceIo::resubmit).
    pub(crate) again: bool,
    /// Where the slot is in its life. Here rather than in [`IoSlot`], so
    /// that a completion holding only this part can free the slot.
    pub(crate) state: SlotState,
}

/// One request slot of a channel's table (preallocated, reused: the buffers
/// of an I/O are moved in once at submit time and stay here until the I/O
/// is delivered; a fast-path completion may resubmit them in place).
pub(crate) struct IoSlot {
    pub(crate) req: SlotReq,
    /// The submitter's callback while the slot is in use.
    pub(crate) cb: Option<Rc<dyn IoCompletion>>,
    /// Delivered through [`IoCompletion::complete_in_place`].
    pub(crate) in_place: bool,
}

impl IoSlot {
    pub(crate) fn empty() -> Self {
        Self {
            req: SlotReq {
                io: BdevIo {
                    io_type: IoType::Read,
                    offset_blocks: 0,
                    num_blocks: 0,
                    bufs: crate::io::SgList::new(),
                    md_bufs: crate::io::SgList::new(),
                    pi: None,
                },
                ctx: 0,
                status: Ok(()),
                writable: false,
                again: false,
                state: SlotState::Free,
            },
            cb: None,
            in_place: false,
        }
    }
}

/// The queue of completed tags (in completion order) and the stale counter.
pub(crate) struct ReadyQueue {
    /// Each slot is queued at most once at a time, so this never grows
    /// past the depth it was created with.
    pub(crate) ready: Vec<IoTag>,
    pub(crate) stale: u64,
}

impl ReadyQueue {
    pub(crate) fn with_depth(depth: usize) -> Self {
        Self {
            ready: Vec::with_capacity(depth),
            stale: 0,
        }
    }
}

/// A channel's request table and its queue of finished I/Os, as a backend
/// sees them in [`BackendChannel::poll`].
///
/// Preallocated to the queue depth at channel creation: nothing here
/// allocates afterwards.
pub struct Completions<'a> {
    pub(crate) slots: &'a [RefCell<IoSlot>],
    pub(crate) q: &'a mut ReadyQueue,
    pub(crate) in_flight: usize,
}

impl Completions<'_> {
    /// Report that the I/O `tag` finished with `status`.
    ///
    /// A tag that is not in flight, or that was completed already, is counted
    /// as stale (see [`ChannelStats::stale_completions`](crate::ChannelStats))
    /// and ignored: a backend bug never corrupts another I/O.
    #[inline(always)]
    pub fn complete(&mut self, tag: IoTag, status: IoStatus) {
        let slot = self
            .slots
            .get(tag.0 as usize)
            .and_then(|c| c.try_borrow_mut().ok());
        match slot {
            Some(mut slot) if slot.req.state == SlotState::InFlight => {
                slot.req.state = SlotState::Completed;
                slot.req.status = status;
                self.q.ready.push(tag);
            }
            _ => self.stale(tag),
        }
    }

    /// A completion for a tag that is not in flight: counted and logged.
    #[cold]
    #[inline(never)]
    fn stale(&mut self, tag: IoTag) {
        self.q.stale += 1;
        log::error!(
            "bdev backend completed unknown or finished I/O tag {}",
            tag.0
        );
    }

    /// The in-flight I/O `tag` (to put back buffers the kernel returned), or
    /// `None` when the tag is not in flight or was completed already. Drop
    /// the guard before calling [`complete`](Self::complete) for the same tag.
    #[inline]
    pub fn io_mut(&mut self, tag: IoTag) -> Option<RefMut<'_, BdevIo>> {
        let slot = self.slots.get(tag.0 as usize)?.try_borrow_mut().ok()?;
        if slot.req.state != SlotState::InFlight {
            return None;
        }
        Some(RefMut::map(slot, |s| &mut s.req.io))
    }

    /// How many I/Os are in flight in this channel (completed ones waiting
    /// for delivery included).
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The channel's queue depth.
    pub fn depth(&self) -> usize {
        self.slots.len()
    }
}
