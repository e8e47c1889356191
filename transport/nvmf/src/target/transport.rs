//! The contract between the target core and a target transport (RDMA, TCP,
//! loopback): nvmet's division of labour.
//!
//! # Adding a transport
//!
//! Implement [`TargetTransport`] (listeners, and [`TargetTransport::start_poll_group`]
//! returning one [`TransportPollGroup`] per core), and [`QpairOps`] for its
//! queues as below; register it with
//! [`Target::add_transport`](super::Target::add_transport). Applications
//! start every registered transport on every core with
//! [`Target::start_poll_groups`](super::Target::start_poll_groups).
//!
//! The **core** ([`QueuePair`](super::QueuePair)) parses every capsule,
//! validates the SGL, owns the request state machine and its data buffers,
//! executes the command and builds the CQE. The **transport** only moves
//! bytes: it hands capsules in, pulls host data into buffers the core gives
//! it, and pushes response data plus the 16-byte CQE back to the host.
//!
//! # How a transport drives a queue pair
//!
//! 1. Accept a connection (RDMA: CM REQ, check it with
//!    [`CmRequest::validate`](crate::spec::rdma_cm::CmRequest::validate)) and
//!    create the core's queue on the reactor that owns the connection:
//!    [`QueuePair::new(&target, &reactor, QpairParams { .. })`](super::QueuePair::new).
//!    `depth` is how many commands the transport can hold (RDMA: the
//!    receive buffers it posted, HSQSIZE+1 capped by
//!    [`TargetOptions::max_queue_depth`](super::TargetOptions)).
//! 2. For every received capsule (64-byte SQE + in-capsule data):
//!    [`QueuePair::submit_capsule(bytes, &mut ops)`](super::QueuePair::submit_capsule).
//!    The core copies what it needs, so the receive buffer can be reposted
//!    as soon as the call returns.
//! 3. The core calls back into the transport's [`QpairOps`]:
//!    - [`QpairOps::data_from_host`]: "pull `remote.len` bytes from host
//!      memory `remote` into `bufs`" (RDMA READ). Return
//!      [`Transfer::Done`] if the bytes are already there (loopback),
//!      [`Transfer::Pending`] if they will be (post the READs; call
//!      [`QueuePair::transfer_done`](super::QueuePair::transfer_done) when
//!      the last one completes), or [`Transfer::Busy`] when out of send
//!      queue slots or read credits: the core parks the request and asks
//!      again at its next [`poll`](super::QueuePair::poll) (back-pressure,
//!      never failure).
//!    - [`QpairOps::send_response`]: "write `data` (if any) to host memory,
//!      then send the CQE" (RDMA: WRITEs chained before the SEND, or
//!      SEND_WITH_INV when [`Response::invalidate_key`] is set). Same three
//!      answers; for `Pending` call
//!      [`QueuePair::response_sent`](super::QueuePair::response_sent) when
//!      the SEND completes, which frees the request and its buffers.
//!    - [`QpairOps::disconnect`]: the core wants the queue torn down (its
//!      controller died: keep-alive expiry, admin queue gone, fatal status).
//! 4. Call [`QueuePair::poll(&mut ops)`](super::QueuePair::poll) once per
//!    reactor loop for every queue pair. It collects bdev completions,
//!    retries parked requests and delivers asynchronous events. It returns
//!    [`PollStatus::Busy`](pollux_reactor::PollStatus) only when it did work.
//! 5. To tear a queue down, stop submitting, let every `Pending` transfer
//!    finish (flush errors included: pass `Err(..)` to `transfer_done` and
//!    call `response_sent`), check
//!    [`QueuePair::transfers_in_flight`](super::QueuePair::transfers_in_flight)
//!    is 0, then drop the `QueuePair`. Bdev I/Os still in flight are safe:
//!    they own their buffers and finish on their own.
//!
//! Buffers: the core owns every data buffer ([`SgList`] of
//! [`DmaBuf`](pollux_reactor::mem::DmaBuf)s from the target's per-core
//! [`BufCache`](pollux_reactor::mem::BufCache), or a per-request buffer
//! preallocated with the queue). They live in registered arenas (the verbs
//! providers register every arena through the
//! [`ArenaRegistry`](pollux_reactor::mem::ArenaRegistry)), and they stay put
//! while a transfer is `Pending`: a transport may post their addresses.
//!
//! Threading: a queue pair, its requests and its `QpairOps` live on one
//! reactor (`!Send`). Control-plane state shared between cores (the
//! controller table, cntlid allocation, subsystems, listeners) sits in
//! `Arc` objects behind a `Mutex` that only the control path takes
//! (Connect, admin commands, keep-alive expiry, configuration). The I/O
//! path takes no lock: it reads two atomics (controller ready, namespace
//! generation) and uses per-queue bdev channels.

use std::rc::Rc;
use std::sync::Arc;

use pollux_reactor::mem::SgList;
use pollux_reactor::Reactor;

use crate::spec::cpl::{NvmeCompletion, CQE_SIZE};
use crate::spec::transport_id::{TrType, TransportId};

/// A target transport: what the [`Target`](super::Target) needs to list it
/// and its listeners. The per-connection work goes through
/// [`QueuePair`](super::QueuePair) and [`QpairOps`] (see the module docs).
///
/// A transport typically also keeps one poll group per reactor (an
/// [`IoDevice`](pollux_reactor::IoDevice) channel works well, see
/// [`LoopbackTransport`](super::LoopbackTransport)), whose poller receives
/// capsules and calls [`QueuePair::poll`](super::QueuePair::poll) for its
/// queue pairs.
pub trait TargetTransport: Send + Sync + 'static {
    /// Short name (`"rdma"`, `"loopback"`).
    fn name(&self) -> &'static str;

    /// The transport type of its listeners.
    fn trtype(&self) -> TrType;

    /// Start accepting connections at `trid` (control path).
    ///
    /// # Errors
    ///
    /// Whatever stops the transport from listening there.
    fn listen(&self, trid: &TransportId) -> Result<(), TransportError>;

    /// Stop accepting connections at `trid` (control path). Existing
    /// connections stay.
    ///
    /// # Errors
    ///
    /// [`TransportError::NotListening`] when it was not listening there.
    fn stop_listen(&self, trid: &TransportId) -> Result<(), TransportError>;

    /// The RDMA TSAS of discovery log entries for `trid` (only RDMA
    /// transports return one).
    fn rdma_tsas(&self, _trid: &TransportId) -> Option<crate::spec::log_page::RdmaTsas> {
        None
    }

    /// Start this transport's poll group on `reactor` (control path, run
    /// on that reactor): what [`Target::start_poll_groups`](super::Target::start_poll_groups)
    /// calls for every transport on every core, so an application starts
    /// them all without naming any. `None`: the transport has no per-core
    /// group to start (loopback: its groups come with its connections).
    ///
    /// # Errors
    ///
    /// Whatever keeps the group from starting (a listener that cannot
    /// bind names its address).
    fn start_poll_group(
        self: Arc<Self>,
        _reactor: &Reactor,
    ) -> Result<Option<Rc<dyn TransportPollGroup>>, TransportError> {
        Ok(None)
    }

    /// Connection counters (control path).
    fn stats(&self) -> TransportStats {
        TransportStats::default()
    }
}

/// One core's poll group of a transport, as the target core and the
/// applications drive it (`!Send`: used on its own core).
pub trait TransportPollGroup {
    /// The transport's name (`"rdma"`, `"tcp"`).
    fn transport_name(&self) -> &'static str;

    /// Live connections (queues) on this core.
    fn connections(&self) -> usize;

    /// Listeners this group accepts on.
    fn listeners(&self) -> usize;

    /// Stop accepting and disconnect every queue (hosts see the
    /// connection close); the group finishes tearing them down from its
    /// poller.
    fn shutdown(&self);

    /// Open and close, now, the listeners this group owns after the
    /// transport's list changed ([`TargetTransport::listen`] and
    /// [`TargetTransport::stop_listen`] only record the change; run on
    /// this group's core, by a reactor message). The target's management
    /// calls this on every core before they answer a listener change, so a
    /// host may connect as soon as the answer is out. Default: nothing to
    /// do (a transport whose `listen` opened the socket already).
    ///
    /// # Errors
    ///
    /// The address this group could not listen on.
    fn apply_listeners(&self) -> Result<(), TransportError> {
        Ok(())
    }

    /// Disconnect this core's queues that came in through the listener at
    /// `trid` and, when `subnqn` is given, are connected to that subsystem
    /// (it stopped listening there while others still do); `None`: every
    /// queue of the listener (it was closed: [`TargetTransport::stop_listen`]
    /// ran first, so no new queue arrives through it). No other queue is
    /// touched; returns how many. Each queue is torn down as by a host
    /// that hung up (its transfers drain, then its resources go back) from
    /// the group's poller; the host sees its connection close. Which
    /// queues match: [`QueuePair::came_through`](super::QueuePair::came_through).
    fn disconnect_listener(&self, trid: &TransportId, subnqn: Option<&str>) -> usize;
}

/// Connection counters every transport keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransportStats {
    /// Connections accepted.
    pub accepted: u64,
    /// Connection attempts refused (any reason).
    pub rejected: u64,
    /// Connections torn down.
    pub destroyed: u64,
}

impl TransportStats {
    /// Add `o` to these counters.
    pub fn add(&mut self, o: &TransportStats) {
        self.accepted += o.accepted;
        self.rejected += o.rejected;
        self.destroyed += o.destroyed;
    }
}

/// What a transport tells [`QueuePair::new`](super::QueuePair::new) about a
/// new connection.
#[derive(Debug, Clone)]
pub struct QpairParams {
    /// Most commands the transport holds at once for this queue (RDMA: the
    /// receive buffers posted for it). The core preallocates this many
    /// requests. Clamped to `1..=TargetOptions::max_queue_depth`.
    pub depth: u16,
    /// In-capsule data the transport accepts after the 64-byte SQE (0 on
    /// admin queues). Clamped to `TargetOptions::in_capsule_data_size`.
    pub in_capsule_data_size: u32,
    /// The listener the connection arrived on (discovery log's "current"
    /// entry, the transport type of error log entries).
    pub listener: TransportId,
    /// The queue id the transport already knows (RDMA: the CM REQ's QID);
    /// a Connect for another QID is refused. `None`: take the Connect's.
    pub qid: Option<u16>,
    /// The deepest I/O queue the transport accepts (NVMe/TCP: its
    /// `max_queue_depth`). What a controller whose admin queue this is
    /// reports as CAP.MQES + 1 and MAXCMD, so that a host sizes its I/O
    /// queues to what their Connect may ask. Clamped to
    /// `2..=TargetOptions::max_queue_depth`.
    pub io_queue_depth: u16,
}

/// A host memory region a keyed SGL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteBuf {
    /// Host address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Remote key.
    pub key: u32,
    /// The host asked for remote invalidation of `key` (SGL subtype 0xF).
    pub invalidate: bool,
}

/// The tag of a request, unique on its queue pair while the request lives:
/// a slot and a generation (a stale tag names no request). Fits a `wr_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReqTag(pub(crate) u32);

impl ReqTag {
    /// The tag as a `u64` (for work request ids and io contexts).
    pub fn to_u64(self) -> u64 {
        u64::from(self.0)
    }

    /// A tag from [`to_u64`](Self::to_u64); any value is accepted, a bogus
    /// one names no request.
    pub fn from_u64(v: u64) -> Self {
        ReqTag(v as u32)
    }

    /// The request slot (`< depth`).
    pub fn slot(self) -> usize {
        (self.0 & 0xFFFF) as usize
    }

    pub(crate) fn new(slot: u16, gen: u16) -> Self {
        ReqTag(u32::from(slot) | (u32::from(gen) << 16))
    }

    pub(crate) fn gen(self) -> u16 {
        (self.0 >> 16) as u16
    }
}

/// How a transport answered a data or response request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transfer {
    /// Finished already (the core moves on at once).
    Done,
    /// Started; the transport reports the end with
    /// [`QueuePair::transfer_done`](super::QueuePair::transfer_done) or
    /// [`QueuePair::response_sent`](super::QueuePair::response_sent).
    Pending,
    /// Not started for lack of transport resources; the core parks the
    /// request and asks again from its next poll.
    Busy,
}

/// Response data: bytes to write to host memory before the CQE.
#[derive(Debug)]
pub struct ResponseData<'a> {
    /// Where in host memory.
    pub remote: RemoteBuf,
    /// The bytes (exactly `len` bytes in total).
    pub bufs: &'a SgList,
    /// Number of bytes to write (`<= remote.len`).
    pub len: u32,
}

/// A response the transport must deliver.
#[derive(Debug)]
pub struct Response<'a> {
    /// The completion.
    pub cpl: NvmeCompletion,
    /// The completion, encoded (what goes on the wire).
    pub cqe: [u8; CQE_SIZE],
    /// Controller-to-host data to write first, if any.
    pub data: Option<ResponseData<'a>>,
    /// Invalidate this key with the response (SEND_WITH_INV).
    pub invalidate_key: Option<u32>,
}

/// The transport side of one queue pair, called by the core
/// (nvmet's `nvmet_fabrics_ops`). Lives on the queue pair's reactor.
pub trait QpairOps {
    /// Pull `remote.len` bytes of host data into `bufs` (whose lengths add
    /// up to exactly that). `bufs` stays untouched by the core until the
    /// transfer is done.
    ///
    /// # Errors
    ///
    /// A [`TransportError`] when the transfer cannot happen; the command
    /// then completes with Data Transfer Error.
    fn data_from_host(
        &mut self,
        tag: ReqTag,
        remote: &RemoteBuf,
        bufs: &mut SgList,
    ) -> Result<Transfer, TransportError>;

    /// Write `rsp.data` (if any) to host memory, then send `rsp.cqe`.
    ///
    /// # Errors
    ///
    /// A [`TransportError`] when nothing can be sent (the queue is going
    /// away); the core frees the request.
    fn send_response(
        &mut self,
        tag: ReqTag,
        rsp: &Response<'_>,
    ) -> Result<Transfer, TransportError>;

    /// The core asks for the queue to be torn down (called once).
    fn disconnect(&mut self);
}

/// A transport failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The connection is gone.
    #[error("the connection is closed")]
    Disconnected,
    /// Nobody listens at that address.
    #[error("not listening at {0}")]
    NotListening(TransportId),
    /// Already listening at that address.
    #[error("already listening at {0}")]
    AlreadyListening(TransportId),
    /// The connection was refused.
    #[error("connection refused: {0}")]
    Refused(String),
    /// A remote key or range the host named is invalid.
    #[error("remote access to key {key:#x} at {addr:#x}+{len} is invalid")]
    RemoteAccess {
        /// The key.
        key: u32,
        /// The address.
        addr: u64,
        /// The length.
        len: u32,
    },
    /// Out of transport resources (control path: no queue could be created).
    #[error("out of transport resources: {0}")]
    NoResources(String),
    /// Host data arrived with a data digest that did not match (NVMe/TCP):
    /// its command fails with Transient Transport Error.
    #[error("data digest mismatch on host data")]
    DataDigest,
    /// Any other transport-specific error.
    #[error("{0}")]
    Other(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_pack_slot_and_generation() {
        let t = ReqTag::new(513, 7);
        assert_eq!(t.slot(), 513);
        assert_eq!(t.gen(), 7);
        assert_eq!(ReqTag::from_u64(t.to_u64()), t);
    }
}
