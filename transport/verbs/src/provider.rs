//! The provider traits. Transports are generic over [`Provider`]
//! (monomorphised, zero-cost); the `soft` and `ibverbs` providers implement
//! them.
//!
//! Objects are handles that keep their parents alive (`Rc`/`Arc` inside), so
//! drop order is right by construction. They are `!Send` and belong to the
//! reactor that made them, with one exception by design: a received, not
//! yet answered connect request can be detached ([`CmId::detach`]) into a
//! `Send` [`PendingConn`], passed to another core by message and attached
//! there ([`PendingConn::attach`]), which then answers and drives it with
//! its own device, PD, CQs and QP. Data-path methods (`post_send`,
//! `post_recv`, `poll`) take `&self`, allocate nothing and post whole
//! caller-owned slices (one doorbell per call).

use std::os::fd::BorrowedFd;
use std::sync::Arc;

use pollux_reactor::mem::DmaArena;

use crate::cm::{CmAddr, CmEvent, ConnParam, ConnRequestInfo, DetachError};
use crate::error::{CqError, PostError, VerbsError};
use crate::sig::SigError;
use crate::types::{Access, AsyncEvent, DeviceCaps, QpAttr, QpCaps, QpState, Wc};
use crate::wr::{RecvWr, SendWr};

/// One RDMA provider: the family of object types that work together.
pub trait Provider: Sized + 'static {
    /// Short name (`"soft"`, `"ibverbs"`).
    const NAME: &'static str;
    /// An open device (context).
    type Device: Device<Self>;
    /// A protection domain.
    type Pd: ProtectionDomain<Self>;
    /// A memory region (regular, fast-reg or integrity).
    type Mr: MemoryRegion;
    /// A completion queue.
    type Cq: CompletionQueue;
    /// A shared receive queue.
    type Srq: SharedRecvQueue;
    /// An RC queue pair.
    type Qp: QueuePair;
    /// A listening connection-manager endpoint.
    type CmListener: CmListener<Self>;
    /// One connection (active, or passive from a connect request).
    type CmId: CmId<Self>;
    /// A received, unanswered connect request detached from the core that
    /// received it ([`CmId::detach`]): `Send`, so a reactor can hand it to
    /// another core by message, which re-attaches it ([`PendingConn::attach`]).
    type PendingConn: PendingConn<Self>;

    /// The devices this provider can open.
    ///
    /// # Errors
    /// Provider-specific enumeration failures ([`VerbsError::Sys`]).
    fn list_devices() -> Result<Vec<DeviceInfo>, VerbsError>;

    /// Open a device by name (from [`Provider::list_devices`]).
    ///
    /// # Errors
    /// [`VerbsError::NoDevice`] for an unknown name, [`VerbsError::Sys`].
    fn open_device(name: &str) -> Result<Self::Device, VerbsError>;
}

/// A device as listed by [`Provider::list_devices`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Name to pass to [`Provider::open_device`].
    pub name: String,
    /// The provider's [`Provider::NAME`].
    pub provider: &'static str,
}

/// An open device.
pub trait Device<P: Provider> {
    /// The device name.
    fn name(&self) -> &str;

    /// Capabilities, checked once at creation by users.
    fn caps(&self) -> &DeviceCaps;

    /// Allocate a protection domain.
    ///
    /// # Errors
    /// [`VerbsError::Limit`], [`VerbsError::Sys`].
    fn alloc_pd(&self) -> Result<P::Pd, VerbsError>;

    /// Create a completion queue with at least `depth` entries.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] (0 or above `max_cqe`), [`VerbsError::Sys`].
    fn create_cq(&self, depth: u32) -> Result<P::Cq, VerbsError>;

    /// Listen for connections on `addr` (non-blocking).
    ///
    /// # Errors
    /// [`VerbsError::Sys`] (address in use, bad path), [`VerbsError::InvalidArgument`].
    fn listen(&self, addr: &CmAddr, backlog: u32) -> Result<P::CmListener, VerbsError>;

    /// Start connecting `qp` to `addr` with `param` (non-blocking): the
    /// outcome arrives as a [`CmEvent`] on the returned id. The QP must be in
    /// RESET or INIT; it is RTS when `Established` is delivered.
    ///
    /// # Errors
    /// [`VerbsError::PrivateDataTooLong`] (over 56 bytes),
    /// [`VerbsError::CmState`] (QP in a wrong state or already connected),
    /// [`VerbsError::Sys`].
    fn connect(
        &self,
        addr: &CmAddr,
        qp: &P::Qp,
        param: &ConnParam<'_>,
    ) -> Result<P::CmId, VerbsError>;

    /// The next affiliated asynchronous event, if any (non-blocking).
    fn poll_async_event(&self) -> Option<AsyncEvent>;
}

/// A protection domain: scopes MRs, SRQs and QPs.
pub trait ProtectionDomain<P: Provider> {
    /// Register `len` bytes at `offset` of `arena` with `access`.
    /// The MR's address ([`MemoryRegion::addr`]) is
    /// `arena.base_addr() + offset` (0 with [`Access::ZERO_BASED`]).
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] (range outside the arena, length 0,
    /// REMOTE_WRITE without LOCAL_WRITE), [`VerbsError::Limit`].
    fn reg_mr(
        &self,
        arena: &Arc<DmaArena>,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<P::Mr, VerbsError>;

    /// Allocate a fast-registration MR (free until a `RegMr` WR binds it)
    /// of at most `max_segments` scatter entries.
    ///
    /// # Errors
    /// [`VerbsError::Unsupported`], [`VerbsError::InvalidArgument`], [`VerbsError::Limit`].
    fn alloc_fast_reg_mr(&self, max_segments: u32) -> Result<P::Mr, VerbsError>;

    /// Allocate an integrity MR (bound by `RegMrIntegrity` WRs).
    ///
    /// # Errors
    /// [`VerbsError::Unsupported`] without signature offload, as for
    /// [`ProtectionDomain::alloc_fast_reg_mr`] otherwise.
    fn alloc_integrity_mr(&self, max_segments: u32) -> Result<P::Mr, VerbsError>;

    /// Create an SRQ of `max_wr` receives with `max_sge` entries each.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] above device limits.
    fn create_srq(&self, max_wr: u32, max_sge: u32) -> Result<P::Srq, VerbsError>;

    /// Create an RC QP (in RESET).
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] (caps above device limits, objects of
    /// another device or PD), [`VerbsError::Limit`].
    fn create_qp(&self, init: &QpInit<'_, P>) -> Result<P::Qp, VerbsError>;
}

/// What [`ProtectionDomain::create_qp`] needs.
pub struct QpInit<'a, P: Provider> {
    /// CQ for send completions.
    pub send_cq: &'a P::Cq,
    /// CQ for receive completions.
    pub recv_cq: &'a P::Cq,
    /// SRQ instead of a receive queue.
    pub srq: Option<&'a P::Srq>,
    /// Requested capacities.
    pub caps: QpCaps,
    /// Every send WR produces a completion.
    pub sq_sig_all: bool,
}

/// A registered memory region. Deregistered on drop.
pub trait MemoryRegion {
    /// The current local key.
    fn lkey(&self) -> u32;
    /// The current remote key (equal to the lkey in both providers).
    fn rkey(&self) -> u32;
    /// The first address of the region (its iova).
    fn addr(&self) -> u64;
    /// Length in bytes (0 for an unbound fast-reg MR).
    fn len(&self) -> u64;
    /// Whether the length is 0.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Access rights.
    fn access(&self) -> Access;
    /// Check and clear the signature status of an integrity MR after a
    /// transfer (`ib_check_mr_status`).
    ///
    /// # Errors
    /// [`VerbsError::Unsupported`] for MRs that are not integrity MRs.
    fn check_sig_status(&self) -> Result<Option<SigError>, VerbsError>;
}

/// A completion queue.
pub trait CompletionQueue {
    /// CQ number.
    fn cq_num(&self) -> u32;
    /// Capacity in entries.
    fn depth(&self) -> u32;
    /// Remove up to `out.len()` completions into `out`; returns how many.
    /// No allocation.
    ///
    /// # Errors
    /// [`CqError::Overflow`]: the CQ is dead and its QPs are in ERR.
    fn poll(&self, out: &mut [Wc]) -> Result<usize, CqError>;
    /// Arm the CQ: the next completion (or the next solicited one) signals
    /// [`CompletionQueue::event_fd`].
    ///
    /// # Errors
    /// [`VerbsError::Sys`].
    fn req_notify(&self, solicited_only: bool) -> Result<(), VerbsError>;
    /// A file descriptor that becomes readable when an armed CQ gets a
    /// completion (for the reactor's adaptive idle mode).
    fn event_fd(&self) -> BorrowedFd<'_>;
    /// Consume pending notifications; returns whether one was pending
    /// (non-blocking).
    fn ack_events(&self) -> bool;
}

/// A shared receive queue.
pub trait SharedRecvQueue {
    /// SRQ number.
    fn srq_num(&self) -> u32;
    /// Post receives (same rules as [`QueuePair::post_recv`]).
    ///
    /// # Errors
    /// [`PostError`] with the index of the first refused WR.
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError>;
    /// Arm the one-shot limit event (0 disarms).
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] above the SRQ size.
    fn set_limit(&self, limit: u32) -> Result<(), VerbsError>;
}

/// An RC queue pair.
pub trait QueuePair {
    /// QP number.
    fn qp_num(&self) -> u32;
    /// Current state.
    fn state(&self) -> QpState;
    /// The real capacities.
    fn caps(&self) -> QpCaps;
    /// Transition per the state table (all-or-nothing).
    ///
    /// # Errors
    /// [`VerbsError::InvalidTransition`].
    fn modify(&self, attr: &QpAttr) -> Result<(), VerbsError>;
    /// Post send WRs in order; stop at the first refused one.
    ///
    /// # Errors
    /// [`PostError`] (`bad_wr` index); earlier WRs stay posted.
    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostError>;
    /// Post receive WRs in order; stop at the first refused one.
    ///
    /// # Errors
    /// [`PostError`] (`bad_wr` index); earlier WRs stay posted.
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError>;
}

/// A listening CM endpoint.
pub trait CmListener<P: Provider> {
    /// The address listened on.
    fn addr(&self) -> &CmAddr;
    /// The next connect request as a new id (non-blocking); see
    /// [`CmId::request`].
    ///
    /// # Errors
    /// [`VerbsError::Sys`] on a broken listener.
    fn get_request(&self) -> Result<Option<P::CmId>, VerbsError>;
    /// A descriptor that is readable while a connect request may be
    /// waiting, for a reactor that sleeps (`Reactor::register_wake_fd`).
    fn wake_fd(&self) -> BorrowedFd<'_>;
    /// Whether a request has begun to arrive without
    /// [`wake_fd`](Self::wake_fd) saying so any more (the soft provider's
    /// accepted sockets whose request message is not in yet): call
    /// [`get_request`](Self::get_request) again without waiting for it.
    fn has_partial(&self) -> bool {
        false
    }
}

/// One connection.
pub trait CmId<P: Provider> {
    /// The connect request (passive side); `None` on the active side.
    fn request(&self) -> Option<&ConnRequestInfo>;
    /// Accept a request with `qp` (RESET or INIT; RTS on return).
    ///
    /// # Errors
    /// [`VerbsError::PrivateDataTooLong`] (over 196), [`VerbsError::CmState`],
    /// [`VerbsError::Sys`].
    fn accept(&self, qp: &P::Qp, param: &ConnParam<'_>) -> Result<(), VerbsError>;
    /// Reject a request with private data (consumer reject, reason 28).
    ///
    /// # Errors
    /// [`VerbsError::PrivateDataTooLong`] (over 148), [`VerbsError::CmState`].
    fn reject(&self, private_data: &[u8]) -> Result<(), VerbsError>;
    /// Disconnect: the QP goes to ERR (flush) and the peer gets `Disconnected`.
    ///
    /// # Errors
    /// [`VerbsError::CmState`] if not connected.
    fn disconnect(&self) -> Result<(), VerbsError>;
    /// The next event (non-blocking).
    ///
    /// # Errors
    /// [`VerbsError::Protocol`] on a malformed peer message, [`VerbsError::Sys`].
    fn get_event(&self) -> Result<Option<CmEvent>, VerbsError>;
    /// Detach a received, not yet accepted or rejected connect request
    /// from this core into a `Send` value, to be answered on another core
    /// (control path). Nothing of this core's objects goes with it: the
    /// core that [attaches](PendingConn::attach) it creates its QP with its
    /// own device, PD, CQs and SRQ, and drives the connection from then on.
    ///
    /// # Errors
    /// [`DetachError`] (the id comes back) if this is not a pending connect
    /// request, or (soft provider) if the id is still shared by clones.
    fn detach(self) -> Result<P::PendingConn, DetachError<Self>>
    where
        Self: Sized;
}

/// A connect request detached from the core that received it
/// ([`CmId::detach`]). It is `Send`: it owns the provider's handles of the
/// request (a socket and the request's data; an `rdma_cm_id` and its event
/// channel) and nothing else, and no thread touches them while it travels.
///
/// Dropping one that was never attached rejects the request (consumer
/// reject, no private data), so the peer always hears an answer and
/// nothing leaks.
pub trait PendingConn<P: Provider>: Send + Sized + std::fmt::Debug {
    /// The connect request (as [`CmId::request`] reported it).
    fn request(&self) -> &ConnRequestInfo;
    /// Re-attach the request on this core: the returned id is answered
    /// (accept with a QP of `dev`, or reject) and driven ([`CmId::get_event`],
    /// [`CmId::disconnect`]) here. `dev` must be the device (by name) the
    /// request arrived on.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] for another device; the request is
    /// rejected then (as on drop).
    fn attach(self, dev: &P::Device) -> Result<P::CmId, VerbsError>;
}
