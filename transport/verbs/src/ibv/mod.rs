//! The `ibverbs` provider: the provider traits over libibverbs and librdmacm
//! (crate `rdma-sys`). Feature `ibverbs`; needs rdma-core's headers and
//! libraries on the build host (`libibverbs-dev`, `librdmacm-dev`, `libclang`
//! for bindgen) and an RDMA device at run time (`tests/vm/lab` provides two
//! soft-RoCE devices in a VM).
//!
//! # Design
//!
//! - **Ownership.** Every object holds an `Rc` to its parent: an MR and a QP
//!   hold their PD, a QP holds its CQs and SRQ, a PD and a CQ hold the device
//!   context. Freeing therefore happens child first (QP before CQ before PD
//!   before the context) whatever order the caller drops handles in. All
//!   objects are `!Send` (raw pointers, `Rc`): they belong to one reactor.
//! - **Data path.** `post_send`/`post_recv` translate the caller's WR slice
//!   into `ibv_send_wr`/`ibv_recv_wr` and `ibv_sge` arrays preallocated at QP
//!   creation (sized by the QP's depth and SGE count), chain them and ring one
//!   doorbell per call. CQ polling fills a preallocated `ibv_wc` array. No
//!   allocation, no lock of ours, no system call beyond the provider's own
//!   doorbell.
//! - **Connection manager.** Each listener and each connection has its own
//!   non-blocking `rdma_event_channel`, so [`CmListener::get_request`] and
//!   [`CmId::get_event`] never block and are meant to be called from a reactor
//!   poller. A connect request is moved (`rdma_migrate_id`) to a fresh channel
//!   of its own. QPs are created by [`ProtectionDomain::create_qp`] and handed
//!   to librdmacm at connect/accept, which moves them RESET/INIT → RTR → RTS.
//!   The active side binds its source address to the device's own IPv4 GID,
//!   so the connection leaves through the device it was opened on.
//!   [`Device::connect`] waits for address and route resolution (local
//!   neighbour and route lookups, bounded by 2 × 2.5 s), so the request is on
//!   the wire when it returns; the outcome arrives as an event. On a peer's
//!   `Disconnected` the id answers the DREQ itself (`rdma_disconnect`), so
//!   the peer's own `Disconnected` comes at once rather than after a timeout.
//! - **Errors the device reports.** Completion statuses are the device's
//!   own: soft-RoCE completes a bad-lkey SEND with `LocQpOpErr` and a too
//!   small receive with `LocQpOpErr`, and reports CQ overflow only as
//!   [`AsyncEvent::CqErr`] from [`Device::poll_async_event`], never from
//!   [`CompletionQueue::poll`].
//! - **Capabilities.** User-space verbs offer no signature (T10-PI
//!   integrity) offload, so [`DeviceCaps`] reports `integrity: false` and
//!   `RegMrIntegrity` WRs are refused with
//!   [`PostErrorKind::InvalidOpcode`](crate::PostErrorKind::InvalidOpcode);
//!   upper layers pick their software PI path. (The one user-space
//!   signature API is mlx5's direct-verbs extension, `mlx5dv_wr_set_mkey_sig_block`
//!   and friends in libmlx5; `rdma-sys` does not bind it and no device here
//!   has it, so it is not wired: a device that has it would report
//!   `integrity: true` and take the same offload path the software provider
//!   exercises.)
//! - **Fast registration by type-2 memory window.** User space has no
//!   REG_MR work request either; its analogue is the type-2 memory window,
//!   which the provider uses behind the same API. On a device that
//!   allocates type-2 windows (probed once at open; soft-RoCE does),
//!   [`DeviceCaps`] reports `mem_mgt_extensions: true` and
//!   `fast_reg: FastRegMode::MemoryWindow { max_windows, .. }` (with
//!   `binds_replayed_on_retry` on rxe, which carries a bind out again when
//!   it retransmits the WRs before it).
//!   [`ProtectionDomain::alloc_fast_reg_mr`] allocates a window
//!   (`ibv_alloc_mw`, `IBV_MW_TYPE_2`); its `lkey`/`rkey` is the key of its
//!   last bind. A `RegMr { key, iova, access }` WR becomes `IBV_WR_BIND_MW`
//!   with the new key `key` (same index, new consumer byte, as
//!   `ibv_inc_rkey`) when its scatter list lies in one MR of the QP's PD
//!   and is virtually contiguous, `iova` is its first address and `access`
//!   is not zero-based; the window gets the remote rights of `access`.
//!   Anything else is refused at post time with
//!   [`PostErrorKind::Refused`](crate::PostErrorKind::Refused), saying why.
//!   Every MR registered on such a device (except zero-based ones) gets
//!   `IBV_ACCESS_MW_BIND`, so memory registered for local access only (the
//!   NVMe-oF host's `register-always` pool, the iSER initiator's buffers)
//!   can be exposed per I/O; the right lets only windows of the same PD,
//!   bound by its owner's WRs, reach the memory. A window is freed by
//!   `LocalInv` or by the peer's SEND_WITH_INV (the receive completion
//!   carries `WITH_INV` and the key, and the provider notes the window
//!   free when it polls it); a bound window is not bound again, and a
//!   `LocalInv` of a window that is not bound under that key never reaches
//!   the device (rxe mishandles both; see the `mw` module). The bind
//!   completes as [`WcOpcode::RegMr`](crate::WcOpcode::RegMr). Type-2B
//!   windows (rxe) are reached only through the QP that bound them. rxe
//!   checks a window access against the MR under it, not the window's own
//!   range.
//! - **QP states.** Without the CM, a QP can go to INIT, SQD, ERR and RESET
//!   by [`QueuePair::modify`]; RTR needs a path (GIDs), which only the CM
//!   provides here, so `modify` to RTR is [`VerbsError::Unsupported`].
//!
//! [`CmListener::get_request`]: crate::CmListener::get_request
//! [`CmId::get_event`]: crate::CmId::get_event
//! [`ProtectionDomain::create_qp`]: crate::ProtectionDomain::create_qp
//! [`ProtectionDomain::alloc_fast_reg_mr`]: crate::ProtectionDomain::alloc_fast_reg_mr
//! [`QueuePair::modify`]: crate::QueuePair::modify
//! [`DeviceCaps`]: crate::DeviceCaps
//! [`VerbsError::Unsupported`]: crate::VerbsError::Unsupported
//! [`Device::connect`]: crate::Device::connect
//! [`Device::poll_async_event`]: crate::Device::poll_async_event
//! [`CompletionQueue::poll`]: crate::CompletionQueue::poll
//! [`AsyncEvent::CqErr`]: crate::AsyncEvent::CqErr

mod cm;
mod cq;
mod device;
mod mr;
mod mw;
mod pending;
mod qp;

use std::io;
use std::os::fd::RawFd;

pub use cm::{IbvCmId, IbvListener};
pub use cq::IbvCq;
pub use device::{IbvDevice, IbvPd};
pub use mr::IbvMr;
pub use pending::IbvPendingConn;
pub use qp::{IbvQp, IbvSrq};

use crate::error::VerbsError;
use crate::provider::{DeviceInfo, Provider};

/// The libibverbs/librdmacm provider.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ibverbs;

impl Provider for Ibverbs {
    const NAME: &'static str = "ibverbs";
    type Device = IbvDevice;
    type Pd = IbvPd;
    type Mr = IbvMr;
    type Cq = IbvCq;
    type Srq = IbvSrq;
    type Qp = IbvQp;
    type CmListener = IbvListener;
    type CmId = IbvCmId;
    type PendingConn = IbvPendingConn;

    fn list_devices() -> Result<Vec<DeviceInfo>, VerbsError> {
        device::list_devices()
    }

    fn open_device(name: &str) -> Result<IbvDevice, VerbsError> {
        IbvDevice::open(name)
    }
}

/// The calling thread's last OS error.
fn last_err() -> io::Error {
    io::Error::last_os_error()
}

/// An error from a verbs call that returns an errno value (positive, or
/// negative in some providers) instead of setting `errno`.
fn rc_err(rc: i32) -> io::Error {
    io::Error::from_raw_os_error(rc.abs())
}

/// Make `fd` non-blocking.
fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own (or librdmacm/libibverbs own and
    // keep open for the object's life); F_GETFL/F_SETFL touch no memory.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(last_err());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(last_err());
    }
    Ok(())
}

/// A boxed slice of `n` all-zero `T`s.
///
/// # Safety
/// The all-zero bit pattern must be a valid `T` (plain C structs of integers,
/// raw pointers and unions of those).
unsafe fn zeroed_slice<T>(n: usize) -> Box<[T]> {
    (0..n)
        // SAFETY: the caller guarantees that all-zero is a valid `T`.
        .map(|_| unsafe { std::mem::zeroed::<T>() })
        .collect()
}
