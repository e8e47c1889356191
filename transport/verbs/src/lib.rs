//! Pollux verbs layer: one RDMA API, two providers.
//!
//! Every transport (NVMe-oF RDMA, iSER) talks to RDMA through the traits in
//! [`provider`], generic over a [`Provider`]:
//!
//! - [`soft`] (default, always built): software RDMA over shared memory
//!   between processes on one machine. Memory comes from
//!   `pollux_reactor::mem` arenas whose fds are passed to the peer over the
//!   connection manager's Unix socket, so RDMA READ/WRITE is one `memcpy`
//!   between the two processes' registered memory.
//!   **Trust model:** the soft provider is meant for cooperating processes on
//!   one machine (tests, benchmarks, local appliances). A peer maps only the
//!   arenas that hold memory registered for remote access, and the provider
//!   checks every key and bound before it copies; a peer can still read or
//!   write whatever those arenas contain, so do not connect to untrusted
//!   processes.
//! - `ibv` (feature `ibverbs`): libibverbs/librdmacm.
//!
//! [`group`] is the plumbing of a target's per-core RDMA poll group and
//! [`placement`] spreads a target transport's connections over its per-core
//! poll groups (shared by the NVMe-oF RDMA and iSER targets).
//!
//! [`conformance`] holds the provider-generic test suite that every provider
//! must pass.
//!
//! Data-path calls (`post_send`, `post_recv`, `CompletionQueue::poll`)
//! allocate nothing, take no lock and make no system call (except writing an
//! armed peer CQ's eventfd). Objects are `!Send`: they belong to one reactor.

pub mod cm;
pub mod conformance;
pub mod error;
pub mod group;
#[cfg(feature = "ibverbs")]
pub mod ibv;
pub mod placement;
pub mod provider;
pub mod recv_repost;
pub mod sig;
pub mod soft;
pub mod token;
pub mod types;
pub mod wr;

pub use cm::{
    CmAddr, CmEvent, ConnParam, ConnRequestInfo, PrivateData, ACCEPT_PRIVATE_DATA_MAX,
    CONNECT_PRIVATE_DATA_MAX, REJECT_PRIVATE_DATA_MAX,
};
pub use error::{CqError, PostError, PostErrorKind, VerbsError};
pub use provider::{
    CmId, CmListener, CompletionQueue, Device, DeviceInfo, MemoryRegion, ProtectionDomain,
    Provider, QpInit, QueuePair, SharedRecvQueue,
};
pub use sig::{SigAttrs, SigDomain, SigErrKind, SigError, T10Dif};
pub use types::{
    Access, AsyncEvent, DeviceCaps, QpAttr, QpCaps, QpState, RemoteAddr, SendFlags, Sge, Wc,
    WcFlags, WcOpcode, WcStatus, WrId,
};
pub use wr::{RecvWr, SendOp, SendWr};
