//! Pollux NVMe over Fabrics: the wire formats ([`spec`]), the
//! transport-independent target core and the loopback transport
//! ([`target`]), an in-process host driver for tests ([`loopback_host`]),
//! the NVMe-oF host ([`host`]) and the fuzz entry points (`fuzz`,
//! `fuzz_tcp`, `fuzz_tcp_host`, feature `fuzzing`).
//!
//! # Quick start: a loopback target and a host talking to it
//!
//! ```
//! use pollux_bdev::BdevRegistry;
//! use pollux_nvmf::loopback_host::{HostData, LoopbackHost};
//! use pollux_nvmf::spec::identify::{cns, IdentifyCmd, IdentifyController};
//! use pollux_nvmf::spec::transport_id::TransportId;
//! use pollux_nvmf::target::{LoopbackTransport, NamespaceConfig, SubsystemConfig, Target, TargetOptions};
//! use pollux_reactor::TestCluster;
//!
//! let cluster = TestCluster::new(1);
//! let target = Target::new(TargetOptions::for_tests())?;
//! let loopback = LoopbackTransport::new();
//! target.add_transport(loopback.clone())?;
//! let trid = TransportId::loopback("lo0");
//! target.add_listener(trid.clone())?;
//! let sub = target.add_subsystem(SubsystemConfig::new("nqn.2024-01.io.pollux:disk"))?;
//! let bdevs = BdevRegistry::new();
//! sub.add_namespace(NamespaceConfig::new(bdevs.create("malloc:size=1M,block=512,name=m0")?))?;
//!
//! // Connect an admin queue, enable the controller, identify it.
//! let host = LoopbackHost::new(&loopback, &target, "nqn.2024-01.io.pollux:host");
//! let drive = || { cluster.poll_until_idle().expect("settles"); };
//! let mut admin = host.connect_admin(&cluster.reactor(0), &trid, sub.nqn(), 0, &drive)?;
//! let c = admin.exec(IdentifyCmd::to_cmd(cns::CONTROLLER, 0, 0), HostData::Read(4096), &drive)?;
//! let id = IdentifyController::parse(&c.data.unwrap_or_default())?;
//! assert_eq!(id.subnqn, "nqn.2024-01.io.pollux:disk");
//! assert_eq!(Some(id.cntlid), admin.cntlid);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Design (target)
//!
//! - **Split** (Linux nvmet): the core parses capsules, checks SGLs,
//!   executes, builds CQEs; a transport only moves capsules and data
//!   through [`target::QpairOps`]. The contract, step by step, is in
//!   [`target::transport`]. The loopback transport (`target/loopback.rs`)
//!   is ~400 lines and is how the tests drive the core end to end.
//! - **Requests** are explicit state machines (`target/req.rs`: `NeedBuffer
//!   → NeedTransfer → TransferringIn → ReadyToExecute → Executing →
//!   Executed → Responding`) with one `process()`, preallocated per queue
//!   pair (depth × request, each with its own 4 KiB-or-in-capsule-size DMA
//!   buffer for Connect data, Identify pages, DSM ranges, in-capsule and
//!   small I/O). Larger transfers take `io_unit_size` buffers from the
//!   target's shared `BufPool` through a per-core `BufCache` (the target's
//!   io_device channel). Running out of buffers, transport credits or bdev
//!   channel slots parks the request in a per-state FIFO, retried from
//!   `QueuePair::poll`: back-pressure, never failure.
//! - **Threads and locks**: a queue pair runs on the reactor that owns its
//!   connection (`!Send`). Shared state — `Target` (subsystems, listeners,
//!   transports), `Subsystem` (namespaces, hosts, controller table and
//!   cntlid allocation) and `Controller` (CC/CSTS, features, events, error
//!   log) — is `Arc` + `Mutex`, taken only on the control path: Connect,
//!   admin and fabrics commands, keep-alive expiry, configuration. The I/O
//!   path takes no lock and allocates nothing: it loads two atomics
//!   (controller ready, namespace generation) and uses the queue's own
//!   namespace view with this core's bdev channels, rebuilt only when the
//!   generation changes.
//! - **Controllers**: dynamic model only (admin Connect with CNTLID 0xFFFF;
//!   cntlids round-robin in a per-subsystem range). CC.EN sets CSTS.RDY at
//!   once (CFS for unsupported CC values), SHN sets SHST complete. Number of
//!   Queues grants `min(asked, max_io_queues)` and bounds I/O QIDs. Keep
//!   alive: a reactor timed poller on the admin queue's core (period KATO/2,
//!   at least 100 ms; KAS = 1 s; TBKAS not advertised) calls
//!   `Controller::fatal` on expiry: CSTS.CFS, out of the subsystem table,
//!   every queue pair then asks its transport to disconnect. Discovery
//!   controllers connecting with KATO 0 get 120 s.
//! - **Namespaces**: NGUID, EUI-64 and UUID (RFC 9562 v8) derive from
//!   FNV-1a of the subsystem NQN and NSID, so they survive restarts.
//!   Adding/removing a namespace records it in every controller's changed
//!   list and raises a namespace-attribute notice (if enabled by AEC,
//!   masked until log 0x04 is read without RAE).
//! - **Discovery** (`nqn.2014-08.org.nvmexpress.discovery`): the log lists
//!   the current discovery subsystem at the host's listener first, then
//!   every subsystem the host may access × every listener; GENCTR bumps on
//!   any change, with a discovery-change notice.
//! - **Not yet**: static controllers, authentication, ANA, reservations,
//!   metadata/PI namespaces, fused commands, SGL segments (MSDBD = 1), the
//!   Disconnect command; Abort aborts outstanding AERs only (anything else
//!   is reported not aborted, like the Linux target); the error log holds
//!   admin-queue errors; SMART counters other than errors are zero.
#![forbid(unsafe_code)]

#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzz;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzz_tcp;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzz_tcp_host;
pub mod host;
pub mod loopback_host;
mod sg_at;
pub mod spec;
pub mod target;
mod tcp_bufs;
mod tcp_sock;
#[cfg(test)]
mod tcp_test_io;
mod tcp_tx;

/// An option value its parser does not know (the message names the
/// values it takes).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionValueError {
    /// Not a [`DigestPolicy`](target::tcp::DigestPolicy).
    #[error("digest policy '{0}': expected allow, disable or require")]
    DigestPolicy(String),
    /// Not a [`MemMode`](host::rdma::MemMode).
    #[error("memory mode '{0}': expected pool or register-always")]
    MemMode(String),
    /// Not a [`HostPi`](host::pi::HostPi).
    #[error("unknown PI mode {0:?} (off, insert, dix)")]
    HostPi(String),
}
