//! The software RDMA provider: RDMA verbs over shared memory between
//! processes (or two endpoints in one process) on one machine.
//!
//! # Design
//! - **Memory**: MRs are registered over `pollux_reactor::mem::DmaArena`s
//!   (fd-backed memfds). Arenas holding memory registered for remote access
//!   (all registered arenas once a fast-reg MR exists) are *exposed*: their
//!   fds are passed to connected peers over the CM socket (`SCM_RIGHTS`),
//!   at connection setup and whenever a new one is exposed, and the peer
//!   maps them. RDMA WRITE/READ is then one copy between the two mappings.
//!   When the last MR over an exposed arena is deregistered, the peers are
//!   told to unmap it (`ARENA_GONE`) and close their descriptor: a peer
//!   keeps no mapping of memory no key reaches any more.
//! - **Keys**: each PD has an MR table in a sealed memfd that peers map
//!   read-only ([`mr`] documents the layout and the seqlock-style update);
//!   the requester checks rkey, PD, bounds and rights before it copies.
//!   A failed check completes the WR with `REM_ACCESS_ERR`, moves the QP
//!   to ERR and tells the responder through the link's state word (the
//!   responder's QP goes to ERR with `QpAccessErr`).
//! - **SEND/RECV**: a per-direction SPSC ring in a link memfd ([`ring`]);
//!   `post_send` writes a SEND straight into its ring slot, the receiver
//!   finds it by the slot's stamp (no tail fetch), its CQ poll consumes
//!   records into posted receives (QP RQ or SRQ) and advances the ring
//!   head, which is the acknowledgement. Responder
//!   errors (short buffer, bad receive lkey, bad SEND_WITH_INV key, RNR
//!   exhaustion) come back as a NAK word naming the record.
//! - **Liveness**: the CM Unix socket. A hang-up moves the QP to ERR and
//!   flushes its WRs. Every index and length read from shared memory is
//!   validated, so a crashed or broken peer can make the survivor fail
//!   a connection but never read out of bounds or spin.
//! - **Integrity MRs** (`REG_MR_INTEGRITY`): the MR table entry also holds
//!   the signature domains; whoever copies through the key (requester of a
//!   READ/WRITE, sender or receiver of a SEND) applies T10-PI with
//!   `pollux-pi` interval by interval (insert, strip, pass with checks;
//!   DIX or interleaved memory). A mismatch never fails the WR: the first
//!   error is reported by `check_sig_status` on the owner's MR (a peer that
//!   found it posts it in the link's control block). Transfers must cover
//!   whole wire intervals (≤ 4096-byte intervals, CRC guard only), and an
//!   integrity SGE must be the only SGE of its WR.
//! - **Events**: a CQ's eventfd is written when it is armed and a completion
//!   arrives (locally, or by the peer through the link's armed words).
//!
//! # Reactor-owned objects are `!Send`
//! CQs, QPs and SRQs (like the device, PDs and MRs) hold `Rc`/`RefCell`
//! state and belong to the reactor that created them; the compiler refuses
//! to move them to another thread:
//!
//! ```compile_fail
//! fn send<T: Send>(_: T) {}
//! fn cq(c: pollux_verbs::soft::SoftCq) { send(c) }
//! ```
//! ```compile_fail
//! fn send<T: Send>(_: T) {}
//! fn qp(q: pollux_verbs::soft::SoftQp) { send(q) }
//! ```
//! ```compile_fail
//! fn send<T: Send>(_: T) {}
//! fn srq(s: pollux_verbs::soft::SoftSrq) { send(s) }
//! ```
//! ```compile_fail
//! fn sync<T: Sync>() {}
//! fn cq() { sync::<pollux_verbs::soft::SoftCq>() }
//! ```
//!
//! # Trust model
//! For cooperating processes on one machine (tests, benchmarks, local
//! appliances). A peer maps only exposed arenas, and keys and bounds are
//! checked before every copy, but a peer can read and write all of an
//! exposed arena through its own mapping. Do not connect untrusted peers.

#[cfg(test)]
mod arena_release_tests;
mod arena_slots;
mod cm;
mod cq;
mod device;
#[cfg(test)]
mod fast_path_tests;
pub mod fault;
mod integrity;
mod link;
pub mod mr;
mod pd;
mod pending;
mod qp;
pub mod ring;
mod rkey_cache;
mod shm;
mod srq;
pub mod state_table;
mod wire;

pub use cm::{SoftCmId, SoftListener};
pub use cq::SoftCq;
pub use device::{SoftDevice, SOFT_DEVICE_NAME, SOFT_MAX_MSG};
pub use mr::SoftMr;
pub use pd::SoftPd;
pub use pending::SoftPendingConn;
pub use qp::SoftQp;
pub use srq::SoftSrq;

use crate::error::VerbsError;
use crate::provider::{DeviceInfo, Provider};

/// The software provider.
#[derive(Debug, Clone, Copy, Default)]
pub struct Soft;

impl Provider for Soft {
    const NAME: &'static str = "soft";
    type Device = SoftDevice;
    type Pd = SoftPd;
    type Mr = SoftMr;
    type Cq = SoftCq;
    type Srq = SoftSrq;
    type Qp = SoftQp;
    type CmListener = SoftListener;
    type CmId = SoftCmId;
    type PendingConn = SoftPendingConn;

    fn list_devices() -> Result<Vec<DeviceInfo>, VerbsError> {
        Ok(vec![DeviceInfo {
            name: SOFT_DEVICE_NAME.to_owned(),
            provider: Self::NAME,
        }])
    }

    fn open_device(name: &str) -> Result<SoftDevice, VerbsError> {
        if name != SOFT_DEVICE_NAME {
            return Err(VerbsError::NoDevice(name.to_owned()));
        }
        Ok(SoftDevice::open())
    }
}
