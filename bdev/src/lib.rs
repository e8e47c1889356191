//! Pollux block-device layer: bdevs, per-core I/O channels, and the null,
//! malloc and aio backends.
//!
//! # Shape
//!
//! - A [`Bdev`] (`Arc`, shared by all cores) wraps one backend
//!   ([`BdevBackend`]). Bdevs are made from spec strings by a
//!   [`BdevRegistry`] (`null:size=1G,block=4096`, `malloc:size=64M`,
//!   `aio:path=/dev/nvme0n1`), or by hand with [`Bdev::new`].
//! - [`Bdev::open`] gives a [`BdevDesc`] (`Send`); [`BdevDesc::channel`] gives
//!   the calling core's [`IoChannel`] (`!Send`), the reactor's io_device
//!   channel for that bdev, shared by every submitter on the core.
//! - I/O goes through the channel: [`IoChannel::read`], [`write`](IoChannel::write),
//!   [`flush`](IoChannel::flush), [`write_zeroes`](IoChannel::write_zeroes),
//!   [`unmap`](IoChannel::unmap). Data travels in an [`SgList`] of owned
//!   [`DmaBuf`]s that the I/O carries and the completion hands back.
//! - A completion runs the submitter's [`IoCompletion`] (an `Rc`, registered
//!   once, plus a `u64` context per I/O) on the submitting core, from the
//!   channel's poller, **never inside the submit call**. Range, length,
//!   type and permission errors arrive that way too, as [`IoError`]s.
//! - The fast path for a submitter that keeps its queue full:
//!   [`IoChannel::submit_in_place`] keeps the buffers in the channel's
//!   request slot, and [`IoCompletion::complete_in_place`] lends the slot
//!   ([`InPlaceIo`]) so the callback can [`resubmit`](InPlaceIo::resubmit) it
//!   with the same buffers: nothing is moved or cloned per I/O.
//! - Per I/O nothing allocates and nothing locks: the request sits in a
//!   table preallocated to the queue depth; a full table returns
//!   [`Rejected`] with the buffers ([`IoError::ChannelFull`], back-pressure).
//!
//! - Protection information ([`pi`]): a bdev made with metadata and a PI
//!   type (`malloc:size=1M,md=8,md_interleave=true,pi=1`) keeps T10 DIF
//!   tuples, interleaved or in separate metadata buffers (DIX, `md_bufs`).
//!   [`IoChannel::write_pi`], [`read_pi`](IoChannel::read_pi) and
//!   [`submit_with_pi`](IoChannel::submit_with_pi) take a [`PiAction`]:
//!   write-generate, write-verify, read-verify; a failed check completes
//!   the I/O with [`IoError::Pi`] (guard, app tag or ref tag, and the LBA).
//!
//! # Quick start
//!
//! ```
//! use std::cell::Cell;
//! use std::rc::Rc;
//! use pollux_bdev::{BdevRegistry, CompletedIo, IoCompletion, SgList};
//! use pollux_reactor::{mem::DmaBuf, TestCluster};
//!
//! let registry = BdevRegistry::new();
//! let bdev = registry.create("malloc:size=1M,block=512,name=m0").unwrap();
//! let desc = bdev.open(true).unwrap();
//! let cluster = TestCluster::new(1);
//! let got = Rc::new(Cell::new(None));
//! cluster.on(0, |r| {
//!     let ch = desc.channel(r).unwrap();
//!     let got2 = got.clone();
//!     // The completion is lent in the channel's request slot; dropping it
//!     // frees the slot (and the buffers left in it).
//!     let cb: Rc<dyn IoCompletion> = Rc::new(move |io: CompletedIo<'_>| {
//!         got2.set(Some((io.ctx(), io.status(), io.bufs().total_len())));
//!     });
//!     let buf = DmaBuf::alloc(4096).unwrap();
//!     ch.read(0, 8, SgList::from_buf(buf), &cb, 7).unwrap();
//!     assert!(got.get().is_none()); // never inside submit
//! });
//! cluster.poll_until_idle().unwrap();
//! assert_eq!(got.get(), Some((7, Ok(()), 4096)));
//! ```
//!
//! # Writing a backend: copy `null`
//!
//! A backend is one module (see `null.rs`, under 150 lines) with two types:
//!
//! 1. The shared half, `Send + Sync`, implementing [`BdevBackend`]: it holds
//!    the [`BdevInfo`] (build it with [`BdevInfo::new`], which validates the
//!    geometry), says which [`IoType`]s it supports, optionally its
//!    [`queue_depth`](BdevBackend::queue_depth), and makes one channel per core
//!    in [`create_channel`](BdevBackend::create_channel) (control path: open
//!    rings, allocate queues sized to the queue depth here).
//! 2. The per-core half implementing [`BackendChannel`]: `submit(tag, io)`
//!    gets an I/O the generic layer has already checked (range, lengths,
//!    type, permissions), and must **not** complete it: it queues the
//!    [`IoTag`] (or hands the buffers to the kernel, with the tag as
//!    `user_data`). `poll(done)` reports finished I/Os with
//!    [`Completions::complete`] and returns `Busy` when it did anything.
//!
//! Then add a [`BackendSpec`] variant and its keys in `registry.rs`, and copy
//! null's tests (round trip, errors, never-inside-submit). Keep it small:
//! queueing, stats, back-pressure and delivery are the generic layer's.
//!
//! # Files
//!
//! `info.rs` ([`BdevInfo`], [`PiType`]), `io.rs` (I/O types, requests,
//! errors), `backend.rs` (the traits), `bdev.rs` ([`Bdev`], [`BdevDesc`]),
//! `channel.rs` ([`IoChannel`]), `registry.rs` ([`BdevRegistry`],
//! [`BdevSpec`]), `pi.rs` ([`PiAction`], [`PiFormat`]), and the backends `null.rs`, `malloc.rs`, `aio.rs`.

#![forbid(unsafe_code)]

mod aio;
mod aio_fallocate;
mod backend;
mod bdev;
mod channel;
mod completion;
mod info;
mod io;
mod malloc;
mod null;
pub mod pi;
mod registry;

pub use aio::{AioBackend, AioEngineKind, AioOptions, OptionValueError};
pub use backend::{
    BackendChannel, BdevBackend, Completions, Submitted, DEFAULT_QUEUE_DEPTH, MAX_QUEUE_DEPTH,
};
pub use bdev::{Bdev, BdevDesc};
pub use channel::{ChannelCore, ChannelStats, IoChannel};
pub use info::{BdevInfo, PiType, PI_TUPLE_SIZE, SUPPORTED_BLOCK_SIZES, SUPPORTED_MD_SIZES};
pub use io::{
    BdevError, BdevIo, CompletedIo, DmaBuf, InPlaceIo, IoCompletion, IoError, IoStatus, IoTag,
    IoType, OwnedIo, Rejected, SgList, SG_INLINE,
};
pub use malloc::MallocBackend;
pub use null::{NullBackend, NullOptions};
pub use pi::{PiAction, PiChecks, PiErrorKind, PiFormat};
pub use registry::{parse_size, BackendSpec, BdevRegistry, BdevSpec};

#[cfg(test)]
mod testutil;
