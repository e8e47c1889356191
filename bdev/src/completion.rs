//! A finished I/O as its submitter's callback sees it: [`CompletedIo`],
//! lent in the channel's request slot, and [`OwnedIo`], the same moved out.
//!
//! Like SPDK's `spdk_bdev_io` handed to a completion callback: the callback
//! reads the status and the buffers where they lie (nothing is copied to
//! build the completion), keeps the buffers it wants
//! ([`CompletedIo::take_bufs`], [`CompletedIo::into_bufs`]) and the request
//! slot goes back to the channel when the completion is dropped (SPDK's
//! `spdk_bdev_free_io`), or at once with [`CompletedIo::into_bufs`] so that
//! a submission from the callback can take it again.

use std::cell::RefMut;
use std::fmt;

use crate::backend::{IoSlot, SlotReq};
use crate::channel::ChannelCore;
use crate::io::{BdevIo, IoStatus, IoType, SgList};

/// How a [`CompletedIo`] holds its slot.
enum Held<'a> {
    /// Delivered by the generic path: the slot's borrow and where it goes
    /// back when the completion is dropped.
    Slot {
        req: RefMut<'a, SlotReq>,
        core: &'a ChannelCore,
        tag: u32,
    },
    /// Lent by an in-place completion ([`InPlaceIo::as_completed`]
    /// (crate::InPlaceIo::as_completed)): the channel frees the slot when
    /// that callback returns.
    Lent(&'a mut SlotReq),
}

/// A finished I/O, lent to [`IoCompletion::complete`](crate::IoCompletion::complete)
/// in the channel's request slot: the status, the block range, the
/// submitter's context and its buffers (read data in them).
///
/// Take the buffers to keep them ([`take_bufs`](Self::take_bufs),
/// [`into_bufs`](Self::into_bufs)); buffers left in the slot are dropped
/// (back to their pool) when the completion is. Dropping the completion
/// frees the request slot; [`into_bufs`](Self::into_bufs) frees it at once,
/// so a callback that submits the next I/O with the same buffers reuses the
/// slot even when every other one is in flight.
/// [`into_owned`](Self::into_owned) moves everything out (to keep a
/// completion past the callback).
pub struct CompletedIo<'a> {
    held: Held<'a>,
}

impl<'a> CompletedIo<'a> {
    /// The completion of slot `tag` of `core`, borrowed in `slot` (freed on drop).
    #[inline(always)]
    pub(crate) fn held(slot: RefMut<'a, IoSlot>, core: &'a ChannelCore, tag: u32) -> Self {
        // Borrowing the request part only puts the request at the same
        // place in both variants: accessors then need no branch.
        Self {
            held: Held::Slot {
                req: RefMut::map(slot, |s| &mut s.req),
                core,
                tag,
            },
        }
    }

    /// The completion of a slot lent by an in-place completion.
    #[inline(always)]
    pub(crate) fn lent(req: &'a mut SlotReq) -> Self {
        Self {
            held: Held::Lent(req),
        }
    }

    #[inline(always)]
    fn req(&self) -> &SlotReq {
        match &self.held {
            Held::Slot { req, .. } => req,
            Held::Lent(req) => req,
        }
    }

    #[inline(always)]
    fn req_mut(&mut self) -> &mut SlotReq {
        match &mut self.held {
            Held::Slot { req, .. } => req,
            Held::Lent(req) => req,
        }
    }

    /// The submitter's context value, as given at submit time.
    #[inline]
    pub fn ctx(&self) -> u64 {
        self.req().ctx
    }

    /// The I/O type.
    #[inline]
    pub fn io_type(&self) -> IoType {
        self.req().io.io_type
    }

    /// The first block.
    #[inline]
    pub fn offset_blocks(&self) -> u64 {
        self.req().io.offset_blocks
    }

    /// The number of blocks.
    #[inline]
    pub fn num_blocks(&self) -> u64 {
        self.req().io.num_blocks
    }

    /// Success, or why the I/O failed.
    #[inline]
    pub fn status(&self) -> IoStatus {
        self.req().status
    }

    /// The buffers given at submit time (read data is in them), empty for
    /// flush, write zeroes and unmap.
    #[inline]
    pub fn bufs(&self) -> &SgList {
        &self.req().io.bufs
    }

    /// The buffers, mutably.
    #[inline]
    pub fn bufs_mut(&mut self) -> &mut SgList {
        &mut self.req_mut().io.bufs
    }

    /// Takes the buffers out of the slot (leaving it empty).
    #[inline]
    pub fn take_bufs(&mut self) -> SgList {
        std::mem::take(&mut self.req_mut().io.bufs)
    }

    /// The separate metadata buffers given at submit time (empty if none).
    #[inline]
    pub fn md_bufs(&self) -> &SgList {
        &self.req().io.md_bufs
    }

    /// Takes the metadata buffers out of the slot.
    #[inline]
    pub fn take_md_bufs(&mut self) -> SgList {
        std::mem::take(&mut self.req_mut().io.md_bufs)
    }

    /// Takes the buffers and frees the request slot now (the metadata
    /// buffers, if any were left in it, are dropped).
    #[inline]
    pub fn into_bufs(mut self) -> SgList {
        self.take_bufs()
    }

    /// Moves everything out and frees the request slot.
    pub fn into_owned(mut self) -> OwnedIo {
        OwnedIo {
            ctx: self.ctx(),
            io_type: self.io_type(),
            offset_blocks: self.offset_blocks(),
            num_blocks: self.num_blocks(),
            status: self.status(),
            bufs: self.take_bufs(),
            md_bufs: self.take_md_bufs(),
        }
    }
}

impl Drop for CompletedIo<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        if let Held::Slot { req, core, tag } = &mut self.held {
            let io = &mut req.io;
            // Mostly empty here (taken by the callback): the clearing stays
            // out of line.
            if !io.bufs.is_empty() || !io.md_bufs.is_empty() {
                clear_lists(io);
            }
            core.release(req, *tag);
        }
    }
}

/// Drop the buffers a completion left in its slot (back to their pools).
#[cold]
#[inline(never)]
fn clear_lists(io: &mut BdevIo) {
    io.bufs.clear();
    io.md_bufs.clear();
}

impl fmt::Debug for CompletedIo<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self.req();
        f.debug_struct("CompletedIo")
            .field("ctx", &r.ctx)
            .field("io", &r.io)
            .field("status", &r.status)
            .finish()
    }
}

/// A finished I/O moved out of its slot ([`CompletedIo::into_owned`]).
#[derive(Debug)]
pub struct OwnedIo {
    /// The submitter's context value, as given at submit time.
    pub ctx: u64,
    /// The I/O type.
    pub io_type: IoType,
    /// The first block.
    pub offset_blocks: u64,
    /// The number of blocks.
    pub num_blocks: u64,
    /// Success, or why the I/O failed.
    pub status: IoStatus,
    /// The buffers given at submit time (read data is in them).
    pub bufs: SgList,
    /// The separate metadata buffers given at submit time (empty if none).
    pub md_bufs: SgList,
}
