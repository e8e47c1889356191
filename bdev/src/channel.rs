//! The per-core I/O channel: where I/O is submitted and completions are delivered.
//!
//! One [`ChannelCore`] per bdev per core (the reactor's io_device channel),
//! shared through cheap [`IoChannel`] handles by every submitter on that core.
//! It owns the backend's per-core state, a request table preallocated to the
//! queue depth, and one poller that drives the backend and runs completion
//! callbacks. Nothing here locks or allocates per I/O, and a completion
//! callback never runs inside a submit call: errors found at submission are
//! queued like any completion and delivered by the next poll.

// `Rejected` carries the refused I/O's buffers back by value (an inline
// `SgList`): boxing it would allocate on the back-pressure path.
#![allow(clippy::result_large_err)]

use std::cell::{Cell, OnceCell, RefCell};
use std::rc::{Rc, Weak};

use pollux_reactor::{AwakeHold, PollStatus, PollerGuard, Reactor};

use crate::backend::{
    BackendChannel, Completions, IoSlot, ReadyQueue, SlotReq, SlotState, Submitted, MAX_QUEUE_DEPTH,
};
use crate::bdev::{type_bit, Bdev};
use crate::io::{
    BdevError, BdevIo, CompletedIo, InPlaceIo, IoCompletion, IoError, IoStatus, IoTag, IoType,
    Rejected, SgList,
};
use crate::pi::{PiAction, PiFormat};

/// Per-channel counters (successful I/Os by type, bytes, failures).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChannelStats {
    /// Successful reads.
    pub read_ops: u64,
    /// Successful writes.
    pub write_ops: u64,
    /// Successful flushes.
    pub flush_ops: u64,
    /// Successful write-zeroes.
    pub write_zeroes_ops: u64,
    /// Successful unmaps.
    pub unmap_ops: u64,
    /// Bytes read by successful reads.
    pub bytes_read: u64,
    /// Bytes written by successful writes.
    pub bytes_written: u64,
    /// I/Os completed with an error.
    pub errors: u64,
    /// Submissions refused with [`IoError::ChannelFull`].
    pub rejected: u64,
    /// Completions a backend reported for a tag that was not in flight (backend bugs).
    pub stale_completions: u64,
}

impl ChannelStats {
    #[inline]
    fn record(&mut self, io: &BdevIo, status: &IoStatus, block_size: u64) {
        if status.is_err() {
            self.errors += 1;
            return;
        }
        let bytes = io.num_blocks * block_size;
        match io.io_type {
            IoType::Read => {
                self.read_ops += 1;
                self.bytes_read += bytes;
            }
            IoType::Write => {
                self.write_ops += 1;
                self.bytes_written += bytes;
            }
            IoType::Flush => self.flush_ops += 1,
            IoType::WriteZeroes => self.write_zeroes_ops += 1,
            IoType::Unmap => self.unmap_ops += 1,
        }
    }

    /// Adds `other`'s counters (all but `stale_completions`) to these
    /// (to sum the cores' channels of a bdev, for instance).
    #[inline]
    pub fn add(&mut self, o: &ChannelStats) {
        self.read_ops += o.read_ops;
        self.write_ops += o.write_ops;
        self.flush_ops += o.flush_ops;
        self.write_zeroes_ops += o.write_zeroes_ops;
        self.unmap_ops += o.unmap_ops;
        self.bytes_read += o.bytes_read;
        self.bytes_written += o.bytes_written;
        self.errors += o.errors;
        self.rejected += o.rejected;
    }

    /// All successful I/Os.
    pub fn ops(&self) -> u64 {
        self.read_ops + self.write_ops + self.flush_ops + self.write_zeroes_ops + self.unmap_ops
    }
}

/// The free slot indexes of a channel: the most recently freed one in a
/// cell of its own (a completion frees a slot and its callback's next
/// submission takes it back, without touching the stack), the others in a
/// stack of `depth` cells (no borrow flag, no growth check: it never holds
/// more than the table's slots).
struct FreeStack {
    hot: Cell<u32>,
    tags: Box<[Cell<u32>]>,
    len: Cell<usize>,
}

/// `FreeStack::hot` when it holds no slot.
const NO_TAG: u32 = u32::MAX;

impl FreeStack {
    /// Every slot free; slot 0 first.
    fn new(depth: usize) -> Self {
        Self {
            hot: Cell::new(NO_TAG),
            tags: (0..depth as u32).rev().map(Cell::new).collect(),
            len: Cell::new(depth),
        }
    }

    #[inline(always)]
    fn pop(&self) -> Option<u32> {
        let hot = self.hot.replace(NO_TAG);
        if hot != NO_TAG {
            return Some(hot);
        }
        let n = self.len.get().checked_sub(1)?;
        let tag = self.tags.get(n)?.get();
        self.len.set(n);
        Some(tag)
    }

    /// Push a tag popped before (so there is room for it).
    #[inline(always)]
    fn push(&self, tag: u32) {
        let older = self.hot.replace(tag);
        if older != NO_TAG {
            let n = self.len.get();
            if let Some(c) = self.tags.get(n) {
                c.set(older);
                self.len.set(n + 1);
            }
        }
    }

    #[inline(always)]
    fn len(&self) -> usize {
        self.len.get() + usize::from(self.hot.get() != NO_TAG)
    }
}

struct ChannelState {
    backend: Box<dyn BackendChannel>,
    q: ReadyQueue,
    /// The other half of the ready queue's double buffer: delivery takes the
    /// ready tags as one batch and leaves this (empty) buffer in their place.
    spare: Vec<IoTag>,
    stats: ChannelStats,
}

/// A bdev's state on one core (the reactor's io_device channel for [`Bdev`]).
/// Used through [`IoChannel`] handles; `!Send`.
pub struct ChannelCore {
    reactor: Reactor,
    /// The poller that drives the channel, from the first handle on.
    poller: OnceCell<PollerGuard>,
    /// While I/Os are in flight: a reference to itself, so that dropping
    /// every handle early still delivers their completions (then the
    /// channel goes), and a hold that keeps the reactor polling (a sleeping
    /// reactor would not see a backend finish them: Linux AIO, for one,
    /// wakes nothing).
    keepalive: Cell<Option<(Rc<ChannelCore>, AwakeHold)>>,
    pinned: Cell<bool>,
    name: String,
    num_blocks: u64,
    block_size: u64,
    buf_block_size: u64,
    /// Bytes per block in separate metadata buffers (0: the bdev takes none).
    md_sep_size: u64,
    /// The PI layout, when the bdev has PI.
    pi: Option<PiFormat>,
    supported: u8,
    state: RefCell<ChannelState>,
    /// Free slot indexes (the most recently freed slot is reused first);
    /// outside `state`, so a completion frees its slot without borrowing it.
    free: FreeStack,
    /// The request table, one cell per slot and outside `state`, so that a
    /// fast-path completion can hold its slot while submitting others.
    slots: Box<[RefCell<IoSlot>]>,
}

impl ChannelCore {
    /// Control path: the backend's per-core state and a request table of
    /// `queue_depth` slots.
    pub(crate) fn new(bdev: &Bdev, reactor: &Reactor) -> Result<Self, BdevError> {
        let info = bdev.info();
        let depth = bdev.backend().queue_depth().clamp(1, MAX_QUEUE_DEPTH);
        let backend = bdev.backend().create_channel(reactor)?;
        Ok(Self {
            reactor: reactor.clone(),
            poller: OnceCell::new(),
            keepalive: Cell::new(None),
            pinned: Cell::new(false),
            name: format!("bdev:{}", info.name()),
            num_blocks: info.num_blocks(),
            block_size: u64::from(info.block_size()),
            buf_block_size: u64::from(info.buf_block_size()),
            md_sep_size: if info.md_interleave() {
                0
            } else {
                u64::from(info.md_size())
            },
            pi: PiFormat::of(info),
            supported: bdev.supported_mask(),
            state: RefCell::new(ChannelState {
                backend,
                q: ReadyQueue::with_depth(depth),
                spare: Vec::with_capacity(depth),
                stats: ChannelStats::default(),
            }),
            slots: (0..depth).map(|_| RefCell::new(IoSlot::empty())).collect(),
            free: FreeStack::new(depth),
        })
    }

    /// Register this channel's poller (once, on the first handle).
    fn start_poller(self: &Rc<Self>) {
        self.poller.get_or_init(|| {
            let weak: Weak<ChannelCore> = Rc::downgrade(self);
            PollerGuard::active(&self.reactor, self.name.clone(), move || {
                match weak.upgrade() {
                    Some(c) => c.poll(),
                    None => PollStatus::Idle,
                }
            })
        });
    }

    /// Everything [`check_io`](Self::check_io) checks, for an I/O in a slot.
    #[inline(always)]
    fn check(&self, io: &BdevIo, writable: bool) -> IoStatus {
        let md_empty = io.md_bufs.is_empty();
        self.check_io(
            (io.io_type, io.offset_blocks, io.num_blocks),
            &io.bufs,
            md_empty,
            writable,
        )?;
        if !md_empty || io.pi.is_some() {
            return self.check_md(io);
        }
        Ok(())
    }

    /// The checks of an I/O's type, range and data buffers against this
    /// channel (the metadata and PI checks are [`check_md`](Self::check_md)'s).
    /// Taken from the submitter's arguments, before they move into a slot.
    #[inline(always)]
    fn check_io(
        &self,
        (io_type, offset_blocks, num_blocks): (IoType, u64, u64),
        bufs: &SgList,
        md_empty: bool,
        writable: bool,
    ) -> IoStatus {
        if self.supported & type_bit(io_type) == 0 {
            return Err(IoError::Unsupported(io_type));
        }
        if io_type.modifies() && !writable {
            return Err(IoError::ReadOnly(io_type));
        }
        // A flush of zero blocks is allowed (it flushes nothing in particular,
        // i.e. everything written before it); other types need blocks.
        if num_blocks == 0 && io_type != IoType::Flush {
            return Err(IoError::ZeroLength(io_type));
        }
        match offset_blocks.checked_add(num_blocks) {
            Some(end) if end <= self.num_blocks => {}
            _ => {
                return Err(IoError::OutOfRange {
                    lba: offset_blocks,
                    blocks: num_blocks,
                    num_blocks: self.num_blocks,
                })
            }
        }
        if io_type.has_data() {
            // In range, so this cannot overflow (checked when the info was built).
            let expected = num_blocks * self.buf_block_size;
            // One buffer is the common case: its length without a call.
            let actual = match bufs.len() {
                1 => bufs.iter().next().map_or(0, |b| b.len()),
                _ => bufs.total_len(),
            } as u64;
            if actual != expected {
                return Err(IoError::BadLength { expected, actual });
            }
        } else if !bufs.is_empty() || !md_empty {
            return Err(IoError::UnexpectedBuffers(io_type));
        }
        Ok(())
    }

    /// The metadata and PI part of [`check`](Self::check) (data I/Os only
    /// reach it with a PI action; others with metadata buffers were refused).
    #[cold]
    fn check_md(&self, io: &BdevIo) -> IoStatus {
        if !io.md_bufs.is_empty() && self.md_sep_size == 0 {
            return Err(IoError::UnexpectedMetadata);
        }
        let acts = io.io_type.has_data()
            && io
                .pi
                .is_some_and(|a| a.acts_on(io.io_type == IoType::Write));
        if acts && self.pi.is_none() {
            return Err(IoError::NoPi);
        }
        // Checked against the range above: no overflow.
        let expected = io.num_blocks * self.md_sep_size;
        let actual = io.md_bufs.total_len() as u64;
        if actual != expected && (actual != 0 || acts) {
            return Err(IoError::BadMdLength { expected, actual });
        }
        Ok(())
    }

    /// A write's PI action, before the backend sees it: generate or verify.
    #[inline]
    fn pi_write(&self, io: &mut BdevIo) -> IoStatus {
        let (Some(fmt), Some(a)) = (self.pi.as_ref(), io.pi.as_ref()) else {
            return Ok(());
        };
        if a.generate {
            fmt.generate(io.offset_blocks, a, &mut io.bufs, &mut io.md_bufs)
        } else if a.checks != crate::pi::PiChecks::NONE {
            fmt.verify(io.offset_blocks, a, &io.bufs, &io.md_bufs)
        } else {
            Ok(())
        }
    }

    /// A read's PI action, once the backend completed it: verify.
    #[inline]
    fn pi_read(&self, io: &BdevIo) -> IoStatus {
        match (self.pi.as_ref(), io.pi.as_ref()) {
            (Some(fmt), Some(a)) if a.checks != crate::pi::PiChecks::NONE => {
                fmt.verify(io.offset_blocks, a, &io.bufs, &io.md_bufs)
            }
            _ => Ok(()),
        }
    }

    /// Check slot `tag` (filled in) and start it.
    #[inline(always)]
    fn start(&self, st: &mut ChannelState, tag: u32, slot: &mut IoSlot) {
        let check = self.check(&slot.req.io, slot.req.writable);
        if check.is_ok() && slot.req.io.pi.is_none() {
            self.start_backend(st, tag, slot);
        } else {
            self.start_slow(st, tag, slot, check);
        }
    }

    /// Hand slot `tag` (filled in and checked) to the backend; queue its
    /// status for the next poll when the backend finished it at once.
    #[inline(always)]
    fn start_backend(&self, st: &mut ChannelState, tag: u32, slot: &mut IoSlot) {
        let r = &mut slot.req;
        match st.backend.submit(IoTag(tag), &mut r.io) {
            Submitted::Queued => {
                slot.req.state = SlotState::InFlight;
                return;
            }
            // Set when the slot was filled in.
            Submitted::Done(Ok(())) => {}
            Submitted::Done(status) => r.status = status,
        }
        slot.req.state = SlotState::Completed;
        st.q.ready.push(IoTag(tag));
    }

    /// [`start_backend`](Self::start_backend) for an I/O that failed its
    /// checks (`check`; its status is queued for the next poll) or has a PI
    /// action (a write generates or verifies first).
    #[cold]
    #[inline(never)]
    fn start_slow(&self, st: &mut ChannelState, tag: u32, slot: &mut IoSlot, mut check: IoStatus) {
        if check.is_ok() && slot.req.io.pi.is_some() && slot.req.io.io_type == IoType::Write {
            check = self.pi_write(&mut slot.req.io);
        }
        match check {
            Ok(()) => self.start_backend(st, tag, slot),
            Err(e) => {
                slot.req.status = Err(e);
                slot.req.state = SlotState::Completed;
                st.q.ready.push(IoTag(tag));
            }
        }
    }

    // One private entry point shared by the typed wrappers of `IoChannel`.
    // Inlined into each, so that the constant arguments (no metadata, the
    // path) fold away.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn submit(
        self: &Rc<Self>,
        io_type: IoType,
        offset_blocks: u64,
        num_blocks: u64,
        bufs: SgList,
        ext: Option<(SgList, Option<PiAction>)>,
        cb: &Rc<dyn IoCompletion>,
        ctx: u64,
        writable: bool,
        in_place: bool,
    ) -> Result<(), Rejected> {
        let mut guard = self.state.borrow_mut();
        let st = &mut *guard;
        let cell = match self.free.pop() {
            Some(tag) => self.slots.get(tag as usize).map(|c| (tag, c)),
            None => None,
        };
        // A free slot is never borrowed (only delivery borrows, an in-use slot).
        let Some((tag, Ok(mut slot))) = cell.map(|(t, c)| (t, c.try_borrow_mut())) else {
            st.stats.rejected += 1;
            return Err(Rejected {
                error: IoError::ChannelFull,
                bufs,
                md_bufs: ext.map(|e| e.0).unwrap_or_default(),
            });
        };
        // Checked from the arguments, which are in registers here (the
        // metadata half, rare, once they are in the slot).
        let md_empty = ext.as_ref().map_or(true, |e| e.0.is_empty());
        let check = self.check_io(
            (io_type, offset_blocks, num_blocks),
            &bufs,
            md_empty,
            writable,
        );
        let fast = check.is_ok()
            && ext
                .as_ref()
                .map_or(true, |e| e.0.is_empty() && e.1.is_none());
        let slot = &mut *slot;
        slot.req.io.io_type = io_type;
        slot.req.io.offset_blocks = offset_blocks;
        slot.req.io.num_blocks = num_blocks;
        // A free slot's lists are empty (every way of freeing one empties
        // them), so the old list holds nothing to drop: forgetting it lets
        // the compiler skip reading it.
        debug_assert!(slot.req.io.bufs.is_empty() && slot.req.io.bufs.is_inline());
        std::mem::forget(std::mem::replace(&mut slot.req.io.bufs, bufs));
        // A free slot's metadata list is empty (delivery empties it).
        match ext {
            Some((md, pi)) => {
                slot.req.io.md_bufs = md;
                slot.req.io.pi = pi;
            }
            None => slot.req.io.pi = None,
        }
        slot.req.ctx = ctx;
        slot.req.status = Ok(());
        slot.req.writable = writable;
        slot.req.again = false;
        slot.in_place = in_place;
        // A free slot holds no callback (delivery takes it): nothing to drop.
        debug_assert!(slot.cb.is_none());
        std::mem::forget(slot.cb.replace(Rc::clone(cb)));
        if fast {
            self.start_backend(st, tag, slot);
        } else {
            let check = check.and_then(|()| self.check_md(&slot.req.io));
            self.start_slow(st, tag, slot, check);
        }
        // In flight: the channel outlives its handles until it completes
        // (here, not in the handle, so the result is returned in place).
        if !self.pinned.get() {
            self.pin();
        }
        Ok(())
    }

    /// The first I/O in flight: keep the channel alive past its handles and
    /// the reactor awake until the last one completes.
    #[cold]
    fn pin(self: &Rc<Self>) {
        self.pinned.set(true);
        self.keepalive
            .set(Some((Rc::clone(self), self.reactor.hold_awake())));
    }

    /// Drive the backend, then deliver the completions that were ready when
    /// the poll started (callbacks may submit more; those wait for the next poll).
    fn poll(&self) -> PollStatus {
        let (backend_status, batch) = {
            let mut guard = self.state.borrow_mut();
            let st = &mut *guard;
            let in_flight = self.slots.len() - self.free.len();
            let mut done = Completions {
                slots: &self.slots,
                q: &mut st.q,
                in_flight,
            };
            let s = st.backend.poll(&mut done);
            st.stats.stale_completions = st.q.stale;
            let spare = std::mem::take(&mut st.spare);
            (s, std::mem::replace(&mut st.q.ready, spare))
        };
        let mut stats = ChannelStats::default();
        for &tag in &batch {
            self.deliver(tag.0, &mut stats);
        }
        let delivered = batch.len();
        {
            let mut st = self.state.borrow_mut();
            st.stats.add(&stats);
            let mut batch = batch;
            batch.clear();
            st.spare = batch;
        }
        if self.pinned.get() && self.in_flight() == 0 {
            self.pinned.set(false);
            // The poller holds a strong reference while it runs us, so this
            // never drops `self` under our feet.
            drop(self.keepalive.take());
        }
        backend_status.or(PollStatus::from_work(delivered > 0))
    }

    /// Deliver the completed slot `tag` (no borrow of `state` is held).
    #[inline]
    fn deliver(&self, tag: u32, stats: &mut ChannelStats) {
        // Only `Completions::complete` and `start` queue tags, both for live
        // slots, each once: the slot is there and not borrowed.
        let Some(Ok(mut slot)) = self.slots.get(tag as usize).map(RefCell::try_borrow_mut) else {
            return;
        };
        if slot.req.io.pi.is_some()
            && slot.req.io.io_type == IoType::Read
            && slot.req.status.is_ok()
        {
            slot.req.status = self.pi_read(&slot.req.io);
        }
        stats.record(&slot.req.io, &slot.req.status, self.block_size);
        if slot.in_place {
            let IoSlot { req, cb, .. } = &mut *slot;
            req.again = false;
            if let Some(cb) = cb.as_deref() {
                cb.complete_in_place(InPlaceIo { req });
            }
            if slot.req.again {
                slot.req.again = false;
                slot.req.status = Ok(());
                let mut st = self.state.borrow_mut();
                self.start(&mut st, tag, &mut slot);
            } else {
                let cb = slot.cb.take();
                // Mostly empty here (taken by the callback): skip the
                // out-of-line clear then.
                if !slot.req.io.bufs.is_empty() {
                    slot.req.io.bufs.clear();
                }
                if !slot.req.io.md_bufs.is_empty() {
                    slot.req.io.md_bufs.clear();
                }
                self.release(&mut slot.req, tag);
                drop(slot);
                drop(cb);
            }
        } else {
            // The I/O is lent to the callback where it lies; the slot goes
            // back to the free list when the completion is dropped (or its
            // buffers are taken with `into_bufs`), so the callback may reuse it.
            match slot.cb.take() {
                Some(cb) => {
                    cb.complete(CompletedIo::held(slot, self, tag));
                    drop(cb);
                }
                None => drop(CompletedIo::held(slot, self, tag)),
            }
        }
    }

    /// Put slot `tag` (`slot`, its contents already dropped) back on the free
    /// list: called by a generic completion when it is dropped.
    #[inline(always)]
    pub(crate) fn release(&self, req: &mut SlotReq, tag: u32) {
        req.state = SlotState::Free;
        self.free.push(tag);
    }

    fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Counters of this core's channel (what [`IoChannel::stats`] gives;
    /// reachable from the reactor's io_device channel, e.g. by a
    /// management request that collects every core's counters).
    pub fn stats(&self) -> ChannelStats {
        self.state.borrow().stats
    }
}

impl Drop for ChannelCore {
    fn drop(&mut self) {
        // The poller goes with its guard.
        let in_flight = self.slots.len() - self.free.len();
        if in_flight > 0 {
            log::warn!(
                "{}: channel dropped with {in_flight} I/Os in flight; their completions are lost",
                self.name
            );
        }
    }
}

/// A submitter's handle to a bdev's channel on this core: cheap to clone,
/// `!Send`. All handles of a core share one request table and one poller.
///
/// Every submit method either queues the I/O and returns `Ok(())` (the
/// completion follows from the channel's poller, on this core, never inside
/// the call) or, when the channel already has `queue_depth` I/Os in flight,
/// returns [`Rejected`] with the buffers (back-pressure: retry after a
/// completion). Checks (range, length, type, write permission) fail through
/// the completion. Dropping every handle while I/Os are in flight is safe:
/// the channel stays alive until they have completed, then goes away.
///
/// ```compile_fail
/// fn assert_send<T: Send>() {}
/// assert_send::<pollux_bdev::IoChannel>();
/// ```
#[derive(Clone)]
pub struct IoChannel {
    core: Rc<ChannelCore>,
    writable: bool,
}

impl std::fmt::Debug for IoChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoChannel")
            .field("bdev", &self.core.name)
            .field("writable", &self.writable)
            .finish()
    }
}

impl IoChannel {
    pub(crate) fn new(core: Rc<ChannelCore>, writable: bool) -> Self {
        core.start_poller();
        Self { core, writable }
    }

    /// Submit an I/O of any type; `bufs` must be empty unless it is a read or write.
    ///
    /// # Errors
    ///
    /// [`Rejected`] ([`IoError::ChannelFull`]) when the channel is full.
    #[inline]
    pub fn submit(
        &self,
        io_type: IoType,
        offset_blocks: u64,
        num_blocks: u64,
        bufs: SgList,
        cb: &Rc<dyn IoCompletion>,
        ctx: u64,
    ) -> Result<(), Rejected> {
        self.core.submit(
            io_type,
            offset_blocks,
            num_blocks,
            bufs,
            None,
            cb,
            ctx,
            self.writable,
            false,
        )
    }

    /// Like [`submit`](Self::submit), but the completion is delivered in
    /// place, through [`IoCompletion::complete_in_place`]: the buffers stay in
    /// the channel's request slot, and the callback may resubmit the slot
    /// with them ([`InPlaceIo::resubmit`]) without moving them or cloning
    /// the callback. The fastest way to keep a queue full.
    ///
    /// # Errors
    ///
    /// [`Rejected`] ([`IoError::ChannelFull`]) when the channel is full.
    #[inline]
    pub fn submit_in_place(
        &self,
        io_type: IoType,
        offset_blocks: u64,
        num_blocks: u64,
        bufs: SgList,
        cb: &Rc<dyn IoCompletion>,
        ctx: u64,
    ) -> Result<(), Rejected> {
        self.core.submit(
            io_type,
            offset_blocks,
            num_blocks,
            bufs,
            None,
            cb,
            ctx,
            self.writable,
            true,
        )
    }

    /// [`submit`](Self::submit) with separate metadata buffers (`md_bufs`:
    /// `md_size` bytes per block, on a bdev whose metadata is not
    /// interleaved; empty otherwise) and a PI action (see [`crate::pi`]):
    /// a write generates or verifies before the backend sees it, a read
    /// verifies once it completes; a failure completes the I/O with
    /// [`IoError::Pi`]. Both come back in the completion.
    ///
    /// # Errors
    ///
    /// [`Rejected`] ([`IoError::ChannelFull`]) when the channel is full,
    /// with both buffer lists.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub fn submit_with_pi(
        &self,
        io_type: IoType,
        offset_blocks: u64,
        num_blocks: u64,
        bufs: SgList,
        md_bufs: SgList,
        pi: Option<PiAction>,
        cb: &Rc<dyn IoCompletion>,
        ctx: u64,
    ) -> Result<(), Rejected> {
        self.core.submit(
            io_type,
            offset_blocks,
            num_blocks,
            bufs,
            Some((md_bufs, pi)),
            cb,
            ctx,
            self.writable,
            false,
        )
    }

    /// [`submit_with_pi`](Self::submit_with_pi) delivered in place (see
    /// [`submit_in_place`](Self::submit_in_place)); a
    /// [`resubmit`](InPlaceIo::resubmit) keeps the metadata buffers and the
    /// PI action, so each resubmitted write generates (or verifies) again
    /// and each read verifies again.
    ///
    /// # Errors
    ///
    /// [`Rejected`] ([`IoError::ChannelFull`]) when the channel is full.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub fn submit_in_place_with_pi(
        &self,
        io_type: IoType,
        offset_blocks: u64,
        num_blocks: u64,
        bufs: SgList,
        md_bufs: SgList,
        pi: Option<PiAction>,
        cb: &Rc<dyn IoCompletion>,
        ctx: u64,
    ) -> Result<(), Rejected> {
        self.core.submit(
            io_type,
            offset_blocks,
            num_blocks,
            bufs,
            Some((md_bufs, pi)),
            cb,
            ctx,
            self.writable,
            true,
        )
    }

    /// Read with separate metadata (`md_bufs`, may be empty on an
    /// interleaved bdev) and read-verify per `pi` (see
    /// [`submit_with_pi`](Self::submit_with_pi)).
    ///
    /// # Errors
    ///
    /// [`Rejected`] when the channel is full.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub fn read_pi(
        &self,
        offset_blocks: u64,
        num_blocks: u64,
        bufs: SgList,
        md_bufs: SgList,
        pi: PiAction,
        cb: &Rc<dyn IoCompletion>,
        ctx: u64,
    ) -> Result<(), Rejected> {
        self.submit_with_pi(
            IoType::Read,
            offset_blocks,
            num_blocks,
            bufs,
            md_bufs,
            Some(pi),
            cb,
            ctx,
        )
    }

    /// Write with separate metadata and write-generate or write-verify per
    /// `pi` (see [`submit_with_pi`](Self::submit_with_pi)). Generation
    /// writes the tuples into the caller's buffers.
    ///
    /// # Errors
    ///
    /// [`Rejected`] when the channel is full.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub fn write_pi(
        &self,
        offset_blocks: u64,
        num_blocks: u64,
        bufs: SgList,
        md_bufs: SgList,
        pi: PiAction,
        cb: &Rc<dyn IoCompletion>,
        ctx: u64,
    ) -> Result<(), Rejected> {
        self.submit_with_pi(
            IoType::Write,
            offset_blocks,
            num_blocks,
            bufs,
            md_bufs,
            Some(pi),
            cb,
            ctx,
        )
    }

    /// The bdev's PI layout, if it has PI.
    pub fn pi_format(&self) -> Option<PiFormat> {
        self.core.pi
    }

    /// Read `num_blocks` blocks from `offset_blocks` into `bufs`, whose
    /// lengths must add up to `num_blocks` × the bdev's buffer block size.
    ///
    /// # Errors
    ///
    /// [`Rejected`] when the channel is full.
    #[inline]
    pub fn read(
        &self,
        offset_blocks: u64,
        num_blocks: u64,
        bufs: SgList,
        cb: &Rc<dyn IoCompletion>,
        ctx: u64,
    ) -> Result<(), Rejected> {
        self.submit(IoType::Read, offset_blocks, num_blocks, bufs, cb, ctx)
    }

    /// Write `bufs` to `num_blocks` blocks from `offset_blocks`.
    ///
    /// # Errors
    ///
    /// [`Rejected`] when the channel is full.
    #[inline]
    pub fn write(
        &self,
        offset_blocks: u64,
        num_blocks: u64,
        bufs: SgList,
        cb: &Rc<dyn IoCompletion>,
        ctx: u64,
    ) -> Result<(), Rejected> {
        self.submit(IoType::Write, offset_blocks, num_blocks, bufs, cb, ctx)
    }

    /// Make completed writes durable (the range is checked; backends flush everything).
    ///
    /// # Errors
    ///
    /// [`Rejected`] when the channel is full.
    pub fn flush(
        &self,
        offset_blocks: u64,
        num_blocks: u64,
        cb: &Rc<dyn IoCompletion>,
        ctx: u64,
    ) -> Result<(), Rejected> {
        let none = SgList::new();
        self.submit(IoType::Flush, offset_blocks, num_blocks, none, cb, ctx)
    }

    /// Write zeroes to a block range.
    ///
    /// # Errors
    ///
    /// [`Rejected`] when the channel is full.
    pub fn write_zeroes(
        &self,
        offset_blocks: u64,
        num_blocks: u64,
        cb: &Rc<dyn IoCompletion>,
        ctx: u64,
    ) -> Result<(), Rejected> {
        let none = SgList::new();
        self.submit(
            IoType::WriteZeroes,
            offset_blocks,
            num_blocks,
            none,
            cb,
            ctx,
        )
    }

    /// Discard a block range.
    ///
    /// # Errors
    ///
    /// [`Rejected`] when the channel is full.
    pub fn unmap(
        &self,
        offset_blocks: u64,
        num_blocks: u64,
        cb: &Rc<dyn IoCompletion>,
        ctx: u64,
    ) -> Result<(), Rejected> {
        let none = SgList::new();
        self.submit(IoType::Unmap, offset_blocks, num_blocks, none, cb, ctx)
    }

    /// I/Os in flight on this core's channel (all handles together).
    pub fn in_flight(&self) -> usize {
        self.core.in_flight()
    }

    /// The most I/Os this core's channel keeps in flight.
    pub fn queue_depth(&self) -> usize {
        self.core.slots.len()
    }

    /// Counters of this core's channel (all handles together).
    pub fn stats(&self) -> ChannelStats {
        self.core.state.borrow().stats
    }

    /// Whether write-type I/O is allowed through this handle.
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// The bdev's block count.
    pub fn num_blocks(&self) -> u64 {
        self.core.num_blocks
    }

    /// Bytes per block in the data buffers (block size plus interleaved metadata).
    pub fn buf_block_size(&self) -> u64 {
        self.core.buf_block_size
    }

    /// Bytes per block in separate metadata buffers (`md_bufs`): the bdev's
    /// metadata size when it is not interleaved, else 0 (it takes none).
    pub fn md_buf_block_size(&self) -> u64 {
        self.core.md_sep_size
    }

    /// The reactor this channel lives on.
    pub fn reactor(&self) -> &Reactor {
        &self.core.reactor
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use pollux_reactor::TestCluster;

    use super::*;
    use crate::backend::BdevBackend;
    use crate::info::BdevInfo;
    use crate::io::CompletedIo;
    use crate::null::{NullBackend, NullOptions};
    use crate::testutil::{sg, Recorder};

    fn null_bdev(block: u32, blocks: u64, depth: usize) -> Arc<Bdev> {
        let info = BdevInfo::new("n", NullBackend::PRODUCT, block, blocks).unwrap();
        Bdev::new(Arc::new(NullBackend::new(
            info,
            NullOptions {
                queue_depth: Some(depth),
                ..Default::default()
            },
        )))
    }

    /// A null bdev that supports reads only.
    struct ReadOnlyNull(NullBackend);

    impl BdevBackend for ReadOnlyNull {
        fn info(&self) -> &BdevInfo {
            self.0.info()
        }
        fn supports(&self, t: IoType) -> bool {
            t == IoType::Read
        }
        fn create_channel(&self, r: &Reactor) -> Result<Box<dyn BackendChannel>, BdevError> {
            self.0.create_channel(r)
        }
    }

    #[test]
    fn completion_never_runs_inside_submit() {
        let bdev = null_bdev(512, 64, 16);
        let desc = bdev.open(true).unwrap();
        let cluster = TestCluster::new(1);
        let (rec, cb) = Recorder::new();
        cluster.on(0, |r| {
            let ch = desc.channel(r).unwrap();
            ch.read(0, 2, sg(&[1024], 0), &cb, 1).unwrap();
            // An error found at submit time is deferred too.
            ch.read(64, 1, sg(&[512], 0), &cb, 2).unwrap();
            assert_eq!(rec.len(), 0, "a completion ran inside submit");
            assert_eq!(ch.in_flight(), 2);
        });
        cluster.poll_until_idle().unwrap();
        let mut done = rec.take();
        done.sort_by_key(|d| d.1.ctx);
        assert_eq!(done.len(), 2);
        assert_eq!(done[0].1.ctx, 1);
        assert_eq!(done[0].1.status, Ok(()));
        assert_eq!(done[0].1.bufs.total_len(), 1024, "buffers come back");
        assert!(done[1].1.status.is_err());
    }

    /// Finishes even-numbered first blocks at submit (odd ones with an
    /// error), queues odd ones and completes them on its next poll.
    struct HalfDone {
        info: BdevInfo,
    }

    struct HalfDoneChannel {
        queued: Vec<IoTag>,
    }

    impl BdevBackend for HalfDone {
        fn info(&self) -> &BdevInfo {
            &self.info
        }
        fn supports(&self, _t: IoType) -> bool {
            true
        }
        fn create_channel(&self, _r: &Reactor) -> Result<Box<dyn BackendChannel>, BdevError> {
            Ok(Box::new(HalfDoneChannel {
                queued: Vec::with_capacity(self.queue_depth()),
            }))
        }
    }

    impl BackendChannel for HalfDoneChannel {
        fn submit(&mut self, tag: IoTag, io: &mut BdevIo) -> Submitted {
            match io.offset_blocks() % 4 {
                0 => Submitted::Done(Ok(())),
                2 => Submitted::Done(Err(IoError::Device(5))),
                _ => {
                    self.queued.push(tag);
                    Submitted::Queued
                }
            }
        }
        fn poll(&mut self, done: &mut Completions<'_>) -> PollStatus {
            let work = !self.queued.is_empty();
            for tag in self.queued.drain(..) {
                done.complete(tag, Ok(()));
            }
            PollStatus::from_work(work)
        }
    }

    #[test]
    fn an_io_the_backend_finishes_at_submit_is_delivered_on_the_next_poll() {
        let info = BdevInfo::new("half", "t", 512, 64).unwrap();
        let bdev = Bdev::new(Arc::new(HalfDone { info }));
        let desc = bdev.open(true).unwrap();
        let cluster = TestCluster::new(1);
        let (rec, cb) = Recorder::new();
        cluster.on(0, |r| {
            let ch = desc.channel(r).unwrap();
            for lba in 0..8u64 {
                ch.read(lba, 1, sg(&[512], 0), &cb, lba).unwrap();
            }
            assert_eq!(rec.len(), 0, "a completion ran inside submit");
            assert_eq!(ch.in_flight(), 8);
        });
        cluster.poll_until_idle().unwrap();
        let mut done = rec.take();
        done.sort_by_key(|d| d.1.ctx);
        let st: Vec<IoStatus> = done.iter().map(|d| d.1.status).collect();
        let want: Vec<IoStatus> = (0..8)
            .map(|lba| match lba % 4 {
                2 => Err(IoError::Device(5)),
                _ => Ok(()),
            })
            .collect();
        assert_eq!(st, want);
        assert!(
            done.iter().all(|d| d.1.bufs.total_len() == 512),
            "buffers come back"
        );
    }

    #[test]
    fn checks_fail_through_the_completion_with_the_right_error() {
        let info = BdevInfo::new("ro", "t", 4096, 100).unwrap();
        let ro = Bdev::new(Arc::new(ReadOnlyNull(NullBackend::new(
            info,
            NullOptions::default(),
        ))));
        let bdev = null_bdev(4096, 100, 64);
        let desc = bdev.open(true).unwrap();
        let rdesc = bdev.open(false).unwrap();
        let ro_desc = ro.open(true).unwrap();
        let cluster = TestCluster::new(1);
        let (rec, cb) = Recorder::new();
        cluster.on(0, |r| {
            let ch = desc.channel(r).unwrap();
            let rch = rdesc.channel(r).unwrap();
            let roch = ro_desc.channel(r).unwrap();
            ch.read(99, 2, sg(&[8192], 0), &cb, 0).unwrap();
            ch.write(u64::MAX, 2, sg(&[8192], 0), &cb, 1).unwrap();
            ch.read(5, 0, sg(&[], 0), &cb, 2).unwrap();
            ch.read(5, 2, sg(&[4096, 4000], 0), &cb, 3).unwrap();
            ch.unmap(0, 0, &cb, 4).unwrap();
            ch.submit(IoType::Flush, 0, 1, sg(&[4096], 0), &cb, 5)
                .unwrap();
            roch.write(0, 1, sg(&[4096], 0), &cb, 6).unwrap();
            rch.write_zeroes(0, 1, &cb, 7).unwrap();
            ch.flush(0, 0, &cb, 8).unwrap();
            roch.read(0, 1, sg(&[4096], 0), &cb, 9).unwrap();
        });
        cluster.poll_until_idle().unwrap();
        let mut done = rec.take();
        done.sort_by_key(|d| d.1.ctx);
        let st: Vec<IoStatus> = done.iter().map(|d| d.1.status).collect();
        assert_eq!(
            st,
            vec![
                Err(IoError::OutOfRange {
                    lba: 99,
                    blocks: 2,
                    num_blocks: 100
                }),
                Err(IoError::OutOfRange {
                    lba: u64::MAX,
                    blocks: 2,
                    num_blocks: 100
                }),
                Err(IoError::ZeroLength(IoType::Read)),
                Err(IoError::BadLength {
                    expected: 8192,
                    actual: 8096
                }),
                Err(IoError::ZeroLength(IoType::Unmap)),
                Err(IoError::UnexpectedBuffers(IoType::Flush)),
                Err(IoError::Unsupported(IoType::Write)),
                Err(IoError::ReadOnly(IoType::WriteZeroes)),
                Ok(()),
                Ok(()),
            ]
        );
        // Failed I/Os hand their buffers back too.
        assert_eq!(done[3].1.bufs.total_len(), 8096);
    }

    #[test]
    fn a_full_channel_pushes_back_and_recovers() {
        let bdev = null_bdev(512, 64, 4);
        let desc = bdev.open(true).unwrap();
        let cluster = TestCluster::new(1);
        let (rec, cb) = Recorder::new();
        let ch = cluster.on(0, |r| desc.channel(r).unwrap());
        cluster.on(0, |_| {
            for i in 0..4 {
                ch.write(i, 1, sg(&[512], 0), &cb, i).unwrap();
            }
            let rej = ch.write(9, 1, sg(&[512], 0), &cb, 9).unwrap_err();
            assert_eq!(rej.error, IoError::ChannelFull);
            assert_eq!(rej.bufs.total_len(), 512, "buffers handed back");
            // Even an invalid I/O is refused first: it would need a slot.
            let rej = ch.read(1000, 1, sg(&[512], 0), &cb, 10).unwrap_err();
            assert_eq!(rej.error, IoError::ChannelFull);
        });
        cluster.poll_until_idle().unwrap();
        assert_eq!(rec.len(), 4);
        cluster.on(0, |_| ch.write(9, 1, sg(&[512], 0), &cb, 9).unwrap());
        cluster.poll_until_idle().unwrap();
        assert_eq!(rec.len(), 5);
        let s = ch.stats();
        assert_eq!((s.write_ops, s.bytes_written, s.rejected), (5, 5 * 512, 2));
        assert_eq!(ch.in_flight(), 0);
    }

    #[test]
    fn completions_run_on_the_submitting_reactor() {
        let bdev = null_bdev(512, 64, 8);
        let desc = bdev.open(true).unwrap();
        let cluster = TestCluster::new(2);
        let (rec, cb) = Recorder::new();
        let chans: Vec<IoChannel> = (0..2)
            .map(|c| cluster.on(c, |r| desc.channel(r).unwrap()))
            .collect();
        for (c, ch) in chans.iter().enumerate() {
            cluster.on(c as u32, |_| {
                for i in 0..3 {
                    ch.read(i, 1, sg(&[512], 0), &cb, c as u64).unwrap();
                }
            });
        }
        cluster.poll_until_idle().unwrap();
        let done = rec.take();
        assert_eq!(done.len(), 6);
        for (core, io) in done {
            assert_eq!(core, Some(io.ctx as u32), "completion ran on another core");
        }
        // One channel per core: each saw its own three reads.
        assert!(chans.iter().all(|c| c.stats().read_ops == 3));
    }

    #[test]
    fn a_callback_may_resubmit_and_the_poller_goes_idle() {
        struct Again {
            ch: RefCell<Option<IoChannel>>,
            me: RefCell<Option<Rc<dyn IoCompletion>>>,
            left: Cell<u32>,
        }
        impl IoCompletion for Again {
            fn complete(&self, io: CompletedIo<'_>) {
                assert_eq!(io.status(), Ok(()));
                if self.left.get() > 0 {
                    self.left.set(self.left.get() - 1);
                    let ch = self.ch.borrow().clone().unwrap();
                    let me = self.me.borrow().clone().unwrap();
                    // Every slot of the channel (depth 2) is in flight or
                    // lent here: `into_bufs` frees this one for the next I/O.
                    let lba = io.offset_blocks();
                    ch.read(lba, 1, io.into_bufs(), &me, 0).unwrap();
                }
            }
        }
        let bdev = null_bdev(512, 64, 2);
        let desc = bdev.open(false).unwrap();
        let cluster = TestCluster::new(1);
        let again = Rc::new(Again {
            ch: RefCell::new(None),
            me: RefCell::new(None),
            left: Cell::new(10),
        });
        cluster.on(0, |r| {
            let ch = desc.channel(r).unwrap();
            let cb: Rc<dyn IoCompletion> = again.clone();
            ch.read(3, 1, sg(&[512], 0), &cb, 0).unwrap();
            ch.read(4, 1, sg(&[512], 0), &cb, 0).unwrap();
            *again.ch.borrow_mut() = Some(ch);
            *again.me.borrow_mut() = Some(cb);
        });
        cluster.poll_until_idle().unwrap();
        assert_eq!(again.left.get(), 0);
        let ch = again.ch.borrow_mut().take().unwrap();
        assert_eq!(ch.stats().read_ops, 12);
        assert_eq!(ch.stats().rejected, 0);
        // Idle once nothing is in flight.
        cluster.on(0, |r| assert_eq!(r.poll_once(), PollStatus::Idle));
        again.me.borrow_mut().take();
    }

    #[test]
    fn dropping_the_last_handle_removes_the_poller() {
        let bdev = null_bdev(512, 8, 2);
        let desc = bdev.open(false).unwrap();
        let cluster = TestCluster::new(1);
        cluster.on(0, |r| {
            let before = r.poller_count();
            let a = desc.channel(r).unwrap();
            let b = desc.channel(r).unwrap();
            assert_eq!(r.poller_count(), before + 1, "one poller per core channel");
            drop(a);
            assert_eq!(r.poller_count(), before + 1);
            drop(b);
            assert_eq!(r.poller_count(), before);
        });
    }

    #[test]
    fn stale_completions_are_counted_not_delivered() {
        let slots: Vec<RefCell<IoSlot>> = (0..2).map(|_| RefCell::new(IoSlot::empty())).collect();
        slots[0].borrow_mut().req.state = SlotState::InFlight;
        let mut q = ReadyQueue::with_depth(2);
        let mut c = Completions {
            slots: &slots,
            q: &mut q,
            in_flight: 1,
        };
        let tag = IoTag(0);
        assert!(c.io_mut(tag).is_some());
        c.complete(tag, Ok(()));
        c.complete(tag, Ok(()));
        c.complete(IoTag(1), Ok(()));
        c.complete(IoTag(7), Ok(()));
        assert!(
            c.io_mut(tag).is_none(),
            "a completed I/O is no longer the backend's"
        );
        assert_eq!(q.ready.len(), 1);
        assert_eq!(q.stale, 3);
    }

    #[test]
    fn in_place_completions_resubmit_without_freeing_the_slot() {
        struct Loop {
            left: Cell<u32>,
            seen: Cell<u32>,
        }
        impl IoCompletion for Loop {
            fn complete(&self, _io: CompletedIo) {
                unreachable!("in-place I/Os are delivered in place");
            }
            fn complete_in_place(&self, mut io: InPlaceIo<'_>) {
                assert_eq!(io.status(), Ok(()));
                assert_eq!(io.bufs().total_len(), 512);
                self.seen.set(self.seen.get() + 1);
                if self.left.get() > 0 {
                    self.left.set(self.left.get() - 1);
                    io.resubmit(IoType::Read, io.offset_blocks() + 1, 1, io.ctx() + 1);
                }
            }
        }
        // Depth 1: a resubmit keeps its slot, so it is never refused.
        let bdev = null_bdev(512, 64, 1);
        let desc = bdev.open(false).unwrap();
        let cluster = TestCluster::new(1);
        let lp = Rc::new(Loop {
            left: Cell::new(5),
            seen: Cell::new(0),
        });
        let cb: Rc<dyn IoCompletion> = lp.clone();
        let ch = cluster.on(0, |r| desc.channel(r).unwrap());
        cluster.on(0, |_| {
            ch.submit_in_place(IoType::Read, 0, 1, sg(&[512], 0), &cb, 0)
                .unwrap();
            let rej = ch.read(0, 1, sg(&[512], 0), &cb, 9).unwrap_err();
            assert_eq!(rej.error, IoError::ChannelFull);
        });
        cluster.poll_until_idle().unwrap();
        assert_eq!(lp.seen.get(), 6);
        assert_eq!(ch.in_flight(), 0);
        assert_eq!(ch.stats().read_ops, 6);
        // A failed check on resubmit is delivered on a later poll, in place.
        struct Bad(Cell<Vec<IoStatus>>);
        impl IoCompletion for Bad {
            fn complete(&self, _io: CompletedIo) {}
            fn complete_in_place(&self, mut io: InPlaceIo<'_>) {
                let mut v = self.0.take();
                v.push(io.status());
                if v.len() == 1 {
                    io.resubmit(IoType::Read, 64, 1, 0);
                } else {
                    assert_eq!(io.take_bufs().total_len(), 512);
                }
                self.0.set(v);
            }
        }
        let bad = Rc::new(Bad(Cell::new(Vec::new())));
        let cb: Rc<dyn IoCompletion> = bad.clone();
        cluster.on(0, |_| {
            ch.submit_in_place(IoType::Read, 0, 1, sg(&[512], 0), &cb, 0)
                .unwrap()
        });
        cluster.poll_until_idle().unwrap();
        let v = bad.0.take();
        assert_eq!(v.len(), 2);
        assert!(matches!(v[1], Err(IoError::OutOfRange { .. })));
        assert_eq!(ch.in_flight(), 0);
    }

    #[test]
    fn the_default_in_place_completion_moves_the_io_out() {
        let bdev = null_bdev(512, 64, 2);
        let desc = bdev.open(false).unwrap();
        let cluster = TestCluster::new(1);
        let (rec, cb) = Recorder::new();
        cluster.on(0, |r| {
            let ch = desc.channel(r).unwrap();
            ch.submit_in_place(IoType::Read, 3, 1, sg(&[512], 7), &cb, 5)
                .unwrap();
        });
        cluster.poll_until_idle().unwrap();
        let io = rec.one();
        assert_eq!((io.ctx, io.offset_blocks, io.status), (5, 3, Ok(())));
        assert_eq!(io.bufs.total_len(), 512);
    }
}
