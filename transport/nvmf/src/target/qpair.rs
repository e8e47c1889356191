//! [`QueuePair`]: the core side of one NVMe queue (admin or I/O) on one
//! reactor. It owns the preallocated requests and drives their state
//! machine ([`req`](super::req)); the transport feeds it capsules and moves
//! data through [`QpairOps`].

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pollux_bdev::{CompletedIo, InPlaceIo, IoChannel, IoCompletion, IoStatus, SgList};
use pollux_reactor::mem::{BufPool, DmaBuf};
use pollux_reactor::{PollStatus, PollerGuard, Reactor};

use super::core_ctx::CoreCtx;
use super::ctrlr::Controller;
use super::error::{CapsuleError, TargetError};
use super::health::IoCounters;
use super::req::{Dir, ParkQ, ReqState, Request};
use super::subsystem::Namespace;
use super::target::Target;
use super::transport::{
    QpairOps, QpairParams, ReqTag, Response, ResponseData, Transfer, TransportError,
};
use crate::spec::cmd::SQE_SIZE;
use crate::spec::cpl::{NvmeCompletion, NvmeStatus, SQHD_DISABLED};
use crate::spec::log_page::ErrorLogEntry;
use crate::spec::rdma_cm::ADMIN_QUEUE_MAX_DEPTH;
use crate::spec::sgl::{SglDescriptor, SglError};
use crate::spec::transport_id::{TrType, TransportId};

/// Most AERs outstanding per controller (Identify AERL + 1).
pub(crate) const AER_LIMIT: usize = 4;

/// Bdev completions, queued by the bdev channel's poller and drained by
/// [`QueuePair::poll`] (never processed inside the callback). The data
/// buffers of a finished I/O wait in `bufs`, by request slot: swapped in
/// from the bdev's slot and out into the request, so no buffer list moves
/// through the queue.
#[derive(Debug)]
struct IoInbox {
    q: RefCell<VecDeque<(u64, IoStatus)>>,
    bufs: RefCell<Box<[SgList]>>,
}

impl IoInbox {
    /// Keep `bufs` (left empty, or holding a stale list the caller drops)
    /// for the request named by `ctx`, then queue the completion.
    #[inline(always)]
    fn put(&self, ctx: u64, status: IoStatus, bufs: &mut SgList) {
        if !bufs.is_empty() {
            if let Some(home) = self.bufs.borrow_mut().get_mut(ReqTag::from_u64(ctx).slot()) {
                // Moved, not swapped: the place is empty (a stale list
                // there is dropped).
                drop_empty(std::mem::replace(home, std::mem::take(bufs)));
            }
        }
        self.q.borrow_mut().push_back((ctx, status));
    }
}

/// Drop a buffer list that is normally empty: an empty inline one holds
/// nothing, so it is forgotten without a call into the list's drop glue
/// (per I/O); anything else is dropped.
#[inline(always)]
fn drop_empty(l: SgList) {
    if l.is_empty() && l.is_inline() {
        std::mem::forget(l);
    }
}

impl IoCompletion for IoInbox {
    fn complete(&self, mut io: CompletedIo<'_>) {
        let (ctx, status) = (io.ctx(), io.status());
        self.put(ctx, status, io.bufs_mut());
    }

    /// The I/O path submits in place: the data buffers are swapped out of
    /// the bdev's slot (no [`CompletedIo`] is built).
    #[inline]
    fn complete_in_place(&self, mut io: InPlaceIo<'_>) {
        let (ctx, status) = (io.ctx(), io.status());
        self.put(ctx, status, io.bufs_mut());
    }
}

/// A namespace as one I/O queue sees it: with this core's bdev channel.
#[derive(Debug)]
pub(crate) struct NsEntry {
    pub(crate) nsid: u32,
    pub(crate) ns: Arc<Namespace>,
    pub(crate) ch: IoChannel,
}

/// Counters of one queue pair.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpairStats {
    /// Capsules accepted.
    pub commands: u64,
    /// Completions with an error status.
    pub errors: u64,
    /// Times a request parked (no buffer, transport busy, bdev full).
    pub parked: u64,
    /// In-capsule data used in place: the transport's receive buffer was
    /// lent to the request ([`QueuePair::submit_capsule_lent`]).
    pub icd_lent: u64,
    /// In-capsule data copied into a request buffer (a transport without
    /// lending, or an SGL offset that cannot be lent).
    pub icd_copies: u64,
}

/// Where a capsule's in-capsule data is.
enum Icd<'a> {
    /// Bytes to copy (the caller reuses its buffer at once).
    Bytes(&'a [u8]),
    /// `len` bytes at the start of a buffer the request may take.
    Lend(&'a mut Option<DmaBuf>, usize),
}

impl Icd<'_> {
    fn len(&self) -> usize {
        match self {
            Icd::Bytes(b) => b.len(),
            Icd::Lend(b, len) => b.as_ref().map_or(0, |b| b.len().min(*len)),
        }
    }
}

/// The core side of one NVMe queue. See the [`transport`](super::transport)
/// module docs for how a transport drives it.
///
/// `!Send`: it lives on the reactor that owns its connection.
pub struct QueuePair {
    pub(crate) target: Arc<Target>,
    pub(crate) core: Rc<CoreCtx>,
    pub(crate) reactor: Reactor,
    pub(crate) params: QpairParams,
    pub(crate) depth: u16,
    pub(crate) icd_size: u32,
    /// Set by Connect.
    pub(crate) qid: Option<u16>,
    pub(crate) sq_entries: u16,
    pub(crate) sqhd: u16,
    pub(crate) sqflow_disabled: bool,
    pub(crate) ctrlr: Option<Arc<Controller>>,
    pub(crate) reqs: Vec<Request>,
    free: Vec<u16>,
    park_buf: VecDeque<u16>,
    park_xfer: VecDeque<u16>,
    park_exec: VecDeque<u16>,
    park_rsp: VecDeque<u16>,
    inbox: Rc<IoInbox>,
    /// The other half of the inbox's double buffer (empty between polls).
    inbox_spare: VecDeque<(u64, IoStatus)>,
    pub(crate) io_cb: Rc<dyn IoCompletion>,
    pub(crate) ns_view: Vec<NsEntry>,
    pub(crate) ns_gen: u64,
    /// Outstanding AERs (request slots), admin queue only.
    pub(crate) aers: Vec<u16>,
    /// The keep-alive timer (admin queue) and when the last Keep Alive came.
    pub(crate) keep_alive: Option<(PollerGuard, Rc<Cell<Instant>>)>,
    disconnect_sent: bool,
    in_flight: usize,
    pub(crate) stats: QpairStats,
    /// SMART counters of this I/O queue (it is their only writer).
    pub(crate) io_counters: Arc<IoCounters>,
    /// `reactor.now_ns()` when this I/O queue last went from idle to busy.
    busy_since: Option<u64>,
    /// When the queue is disconnected unless a Connect has completed:
    /// [`TargetOptions::connect_timeout_ms`](super::TargetOptions) after it
    /// was made (`None` when that is 0).
    connect_deadline: Option<Instant>,
}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair")
            .field("qid", &self.qid)
            .field("cntlid", &self.cntlid())
            .field("depth", &self.depth)
            .field("outstanding", &self.outstanding())
            .finish()
    }
}

impl QueuePair {
    /// A new, unconnected queue on `reactor` (control path: preallocates
    /// `depth` requests, each with its own small buffer). Only a Fabrics
    /// Connect is accepted until one succeeds.
    ///
    /// # Errors
    ///
    /// [`TargetError::Memory`] when the per-queue buffers cannot be made.
    pub fn new(
        target: &Arc<Target>,
        reactor: &Reactor,
        params: QpairParams,
    ) -> Result<QueuePair, TargetError> {
        Self::with_requests(target, reactor, params, 0)
    }

    /// [`new`](Self::new) with `requests` requests (at least the depth):
    /// a transport whose responses hold their request after the host can
    /// already see them (until a send completion) gives the queue spare
    /// requests, so the host's next command for a slot never waits for
    /// that completion. The queue still refuses more than `requests`
    /// commands at once ([`CapsuleError::QueueFull`]).
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub fn with_requests(
        target: &Arc<Target>,
        reactor: &Reactor,
        params: QpairParams,
        requests: u16,
    ) -> Result<QueuePair, TargetError> {
        let opts = target.options();
        // The admin queue is as deep as its host asks, up to 32 (the
        // NVMe/RDMA CM request was checked against that), whatever the I/O
        // queue limit: Linux always asks for 32 (`NVME_AQ_DEPTH`), and the
        // Linux target (`NVME_AQ_DEPTH`) and SPDK (`max_aq_depth`) size it
        // apart from the I/O queues. Clamped to a shallower
        // `max_queue_depth`, its Connect (SQSIZE 31) was refused.
        // A queue whose QID its transport does not know yet (NVMe/TCP: the
        // Connect says) may be the admin queue: the same.
        let limit = if params.qid.map_or(true, |q| q == 0) {
            opts.max_queue_depth.max(ADMIN_QUEUE_MAX_DEPTH)
        } else {
            opts.max_queue_depth
        };
        let depth = params.depth.clamp(1, limit);
        let nreq = requests.max(depth);
        let icd_size = params.in_capsule_data_size.min(opts.in_capsule_data_size);
        // In-capsule data does not need the slot: the RDMA transport lends
        // its receive buffer, and a copy larger than a slot takes pool
        // buffers. Slot buffers come from the target's shared pool and go
        // back to it with the queue (no memory of the queue's own).
        let slot_pool = target.slot_pool();
        let mut reqs = Vec::with_capacity(usize::from(nreq));
        for _ in 0..nreq {
            reqs.push(Request::new(slot_pool.and_then(BufPool::get)));
        }
        let inbox = Rc::new(IoInbox {
            q: RefCell::new(VecDeque::with_capacity(usize::from(nreq) + 16)),
            bufs: RefCell::new((0..nreq).map(|_| SgList::new()).collect()),
        });
        let io_cb: Rc<dyn IoCompletion> = inbox.clone();
        let cap = usize::from(nreq);
        Ok(QueuePair {
            target: Arc::clone(target),
            core: target.core_ctx(reactor),
            reactor: reactor.clone(),
            params,
            depth,
            icd_size,
            qid: None,
            sq_entries: depth,
            sqhd: 0,
            sqflow_disabled: false,
            ctrlr: None,
            reqs,
            free: (0..nreq).rev().collect(),
            park_buf: VecDeque::with_capacity(cap),
            park_xfer: VecDeque::with_capacity(cap),
            park_exec: VecDeque::with_capacity(cap),
            park_rsp: VecDeque::with_capacity(cap),
            inbox,
            inbox_spare: VecDeque::with_capacity(usize::from(nreq) + 16),
            io_cb,
            ns_view: Vec::new(),
            ns_gen: u64::MAX,
            aers: Vec::with_capacity(AER_LIMIT),
            keep_alive: None,
            disconnect_sent: false,
            in_flight: 0,
            stats: QpairStats::default(),
            io_counters: Arc::new(IoCounters::default()),
            busy_since: None,
            connect_deadline: match opts.connect_timeout_ms {
                0 => None,
                // From a fresh read: the loop's cached time may predate
                // the accept by a preemption, which would cut the timeout short.
                ms => Some(reactor.read_clock() + Duration::from_millis(u64::from(ms))),
            },
        })
    }

    /// The queue id, once connected.
    pub fn qid(&self) -> Option<u16> {
        self.qid
    }

    /// The controller id, once connected.
    pub fn cntlid(&self) -> Option<u16> {
        self.ctrlr.as_ref().map(|c| c.cntlid())
    }

    /// The controller, once connected.
    pub fn controller(&self) -> Option<&Arc<Controller>> {
        self.ctrlr.as_ref()
    }

    /// The listener the connection arrived on (what its transport said
    /// in [`QpairParams::listener`]): a transport closes the queues of a
    /// listener that goes away by it.
    pub fn listener(&self) -> &TransportId {
        &self.params.listener
    }

    /// Whether this queue came in through the listener `trid` and, when
    /// `subnqn` is given, is connected to that subsystem (a queue not
    /// connected yet belongs to none): which queues a listener's removal
    /// disconnects ([`TransportPollGroup::disconnect_listener`](super::TransportPollGroup::disconnect_listener)).
    pub fn came_through(&self, trid: &TransportId, subnqn: Option<&str>) -> bool {
        if &self.params.listener != trid {
            return false;
        }
        match subnqn {
            None => true,
            Some(nqn) => self
                .ctrlr
                .as_ref()
                .is_some_and(|c| c.subsystem().nqn() == nqn),
        }
    }

    /// Whether a Connect succeeded on this queue.
    pub fn is_connected(&self) -> bool {
        self.ctrlr.is_some()
    }

    /// Requests preallocated (the queue depth).
    pub fn depth(&self) -> u16 {
        self.depth
    }

    /// Requests preallocated (the depth, or more: see
    /// [`with_requests`](Self::with_requests)).
    pub fn requests(&self) -> usize {
        self.reqs.len()
    }

    /// Requests in use.
    pub fn outstanding(&self) -> usize {
        self.reqs.len() - self.free.len()
    }

    /// Requests in use other than the Asynchronous Event Requests the
    /// queue holds (they wait for an event, which a poll of the queue
    /// delivers, not for any I/O): 0 when the queue is quiet.
    pub fn working(&self) -> usize {
        self.outstanding().saturating_sub(self.aers.len())
    }

    /// Transfers and responses the transport has `Pending`: drop the queue
    /// only when this is 0.
    pub fn transfers_in_flight(&self) -> usize {
        self.in_flight
    }

    /// Whether the host already has as many commands outstanding as its
    /// Connect's SQSIZE allows (before Connect: the queue's depth), counted
    /// as the requests whose response the transport has not yet handed
    /// out. One more command overruns the host's queue; a transport that
    /// cannot hold a host back by credits (NVMe/TCP) refuses it.
    pub fn host_sq_full(&self) -> bool {
        self.reqs.len() - self.free.len() >= usize::from(self.sq_entries)
    }

    /// Whether the host disabled SQ flow control in its Connect (completions
    /// then carry no SQ head; NVMe/TCP may answer a read with C2H SUCCESS).
    pub fn sq_flow_disabled(&self) -> bool {
        self.sqflow_disabled
    }

    /// The command id (CID) of the live request `tag` (NVMe/TCP names the
    /// command in its R2Ts).
    pub fn command_id(&self, tag: ReqTag) -> Option<u16> {
        self.reqs
            .get(tag.slot())
            .filter(|r| r.gen == tag.gen() && r.state != ReqState::Free)
            .map(|r| r.cmd.cid)
    }

    /// Whether the core asked the transport to disconnect.
    pub fn is_disconnecting(&self) -> bool {
        self.disconnect_sent
    }

    /// Counters.
    pub fn stats(&self) -> QpairStats {
        self.stats
    }

    /// The state of the request `tag` (tests, debugging).
    pub fn request_state(&self, tag: ReqTag) -> Option<ReqState> {
        self.reqs
            .get(tag.slot())
            .filter(|r| r.gen == tag.gen() && r.state != ReqState::Free)
            .map(|r| r.state)
    }

    fn tag(&self, slot: u16) -> ReqTag {
        ReqTag::new(slot, self.reqs[usize::from(slot)].gen)
    }

    /// The slot of a live request with `tag` in `state`.
    fn slot_of(&self, tag: ReqTag, state: ReqState) -> Option<u16> {
        let slot = tag.slot();
        let r = self.reqs.get(slot)?;
        (r.gen == tag.gen() && r.state == state).then_some(slot as u16)
    }

    /// A received command capsule: the 64-byte SQE, then in-capsule data.
    /// The bytes are copied; the caller may reuse the buffer at once.
    ///
    /// # Errors
    ///
    /// [`CapsuleError::Malformed`] under 64 bytes, [`CapsuleError::QueueFull`]
    /// when the host exceeds the queue depth, [`CapsuleError::Disconnecting`]
    /// after the core asked to disconnect. The transport should tear the
    /// queue down in every case (there is no request to answer with).
    pub fn submit_capsule(
        &mut self,
        capsule: &[u8],
        ops: &mut dyn QpairOps,
    ) -> Result<(), CapsuleError> {
        let icd = capsule.get(SQE_SIZE..).unwrap_or(&[]);
        self.submit_parts(capsule, Icd::Bytes(icd), ops)
    }

    /// A received command whose SQE (`sqe`, 64 bytes) and in-capsule data
    /// (the first `icd_len` bytes of `icd`) arrived in separate buffers.
    /// When the command's data is in the capsule at offset 0 the request
    /// takes `icd` (it is left `None`) and the bdev uses it in place; it is
    /// dropped (back to its pool) when the request's response is handed to
    /// the transport, so the transport can post a receive with it before
    /// the host sees the response. Otherwise `icd` stays with the caller,
    /// which may reuse it at once.
    ///
    /// # Errors
    ///
    /// As [`submit_capsule`](Self::submit_capsule).
    pub fn submit_capsule_lent(
        &mut self,
        sqe: &[u8],
        icd: &mut Option<DmaBuf>,
        icd_len: usize,
        ops: &mut dyn QpairOps,
    ) -> Result<(), CapsuleError> {
        self.submit_parts(sqe, Icd::Lend(icd, icd_len), ops)
    }

    /// A received command capsule the transport refuses without running
    /// it (NVMe/TCP: its in-capsule data digest did not match): it takes
    /// its submission queue entry like any command, so its completion,
    /// with `status`, carries the SQ head past it, and goes to
    /// [`QpairOps::send_response`].
    ///
    /// # Errors
    ///
    /// As [`submit_capsule`](Self::submit_capsule).
    pub fn refuse_capsule(
        &mut self,
        sqe: &[u8],
        status: NvmeStatus,
        ops: &mut dyn QpairOps,
    ) -> Result<(), CapsuleError> {
        let slot = self.start_request(sqe)?;
        self.finish(slot, status);
        self.process(slot, ops);
        Ok(())
    }

    /// Take a request for the command `sqe`: its slot, parsed in place,
    /// counted.
    #[inline(always)]
    fn start_request(&mut self, sqe: &[u8]) -> Result<u16, CapsuleError> {
        if self.disconnect_sent {
            return Err(CapsuleError::Disconnecting);
        }
        let Some(sqe) = sqe.first_chunk::<SQE_SIZE>() else {
            return Err(CapsuleError::Malformed(sqe.len()));
        };
        if self.free.len() == self.reqs.len() && self.qid.is_some_and(|q| q != 0) {
            // Idle to busy: the controller busy time starts.
            self.busy_since = Some(self.reactor.now_ns());
        }
        let slot = self.free.pop().ok_or(CapsuleError::QueueFull)?;
        self.stats.commands += 1;
        // Parsed straight into the request: no copy of the command.
        self.reqs[usize::from(slot)].start(sqe);
        Ok(slot)
    }

    fn submit_parts(
        &mut self,
        sqe: &[u8],
        icd: Icd<'_>,
        ops: &mut dyn QpairOps,
    ) -> Result<(), CapsuleError> {
        let slot = self.start_request(sqe).map_err(|e| match e {
            // The whole capsule's length, in-capsule data included.
            CapsuleError::Malformed(n) => CapsuleError::Malformed(n + icd.len()),
            e => e,
        })?;
        match self.prepare(slot, icd) {
            Ok(()) => {}
            Err(st) => self.finish(slot, st),
        }
        self.process(slot, ops);
        Ok(())
    }

    /// Decide the plan and map the SGL; on success the request is in
    /// `NeedBuffer`, `ReadyToExecute` (no data or in-capsule data copied).
    fn prepare(&mut self, slot: u16, icd: Icd<'_>) -> Result<(), NvmeStatus> {
        let si = usize::from(slot);
        let cmd = &self.reqs[si].cmd;
        if cmd.fuse() != 0 || cmd.psdt() != 1 {
            return Err(NvmeStatus::INVALID_FIELD);
        }
        let plan = self.classify(slot)?;
        self.reqs[si].plan = plan;
        let sgl = self.reqs[si].cmd.sgl().map_err(|e| match e {
            SglError::UnsupportedType(_) => NvmeStatus::SGL_DESCRIPTOR_TYPE_INVALID,
            _ => NvmeStatus::INVALID_FIELD,
        })?;
        let req = &mut self.reqs[si];
        match sgl {
            SglDescriptor::Keyed {
                addr,
                len,
                key,
                invalidate,
            } => {
                // NVMe/TCP moves data in PDUs: a keyed descriptor (an RDMA
                // address and key) names nothing it can reach, and only
                // the transport and in-capsule data block descriptors are
                // valid there (SPDK answers SGL Descriptor Type Invalid
                // too). The all-zero "no data" one some hosts send on a
                // command without data is let by.
                if self.params.listener.trtype == TrType::Tcp && (len > 0 || plan.len > 0) {
                    return Err(NvmeStatus::SGL_DESCRIPTOR_TYPE_INVALID);
                }
                if !plan.sgl_len_ok(len) {
                    return Err(NvmeStatus::DATA_SGL_LENGTH_INVALID);
                }
                // Only what the command uses moves (a longer SGL's tail
                // is never touched). A descriptor of length 0 describes no
                // data, so its key names no registration to invalidate,
                // whatever its subtype: the Linux target
                // (`nvmet_rdma_map_sgl_keyed` returns before it records the
                // key) and SPDK (no transfer: the SGL is not parsed) answer
                // it with a plain SEND; a SEND_WITH_INV of it fails at the
                // host's NIC and ends the queue.
                req.remote = Some(super::transport::RemoteBuf {
                    addr,
                    len: plan.len,
                    key,
                    invalidate: invalidate && len > 0,
                });
            }
            SglDescriptor::Transport { len } => {
                // NVMe/TCP: the transport moves the data (R2T/H2CData,
                // C2HData); there is no host address or key. Any other
                // transport (RDMA, loopback: keyed SGLs) would move it with
                // key 0 and address 0, and an RDMA op on them ends the
                // queue: refuse it as a type it does not support.
                if self.params.listener.trtype != TrType::Tcp {
                    return Err(NvmeStatus::SGL_DESCRIPTOR_TYPE_INVALID);
                }
                if len != plan.len {
                    return Err(NvmeStatus::DATA_SGL_LENGTH_INVALID);
                }
                req.remote = Some(super::transport::RemoteBuf {
                    addr: 0,
                    len,
                    key: 0,
                    invalidate: false,
                });
            }
            SglDescriptor::InCapsule { offset, len } => {
                req.unpark_slot_buf();
                if plan.dir != Dir::ToCtrl || self.icd_size == 0 {
                    return Err(NvmeStatus::INVALID_FIELD);
                }
                let avail = icd.len().min(self.icd_size as usize);
                let end = offset.checked_add(u64::from(len));
                if end.map_or(true, |e| e > avail as u64) {
                    return Err(NvmeStatus::SGL_OFFSET_INVALID);
                }
                if !plan.sgl_len_ok(len) {
                    return Err(NvmeStatus::DATA_SGL_LENGTH_INVALID);
                }
                let start = offset as usize;
                let n = plan.len as usize;
                // Buffers for the bdev's blocks (more than the wire's
                // bytes when they are spread out for PI).
                let cap = plan.buf_len as usize;
                let lent = match icd {
                    Icd::Lend(buf, _) if start == 0 && n > 0 && cap == n => {
                        // In place: the receive buffer becomes the data.
                        let Some(mut b) = buf.take() else {
                            return Err(NvmeStatus::INTERNAL_ERROR);
                        };
                        if b.set_len(n).is_err() {
                            *buf = Some(b);
                            return Err(NvmeStatus::INTERNAL_ERROR);
                        }
                        req.bufs.push(b);
                        req.lent_icd = true;
                        true
                    }
                    Icd::Lend(buf, _) => {
                        let Some(b) = buf.as_ref() else {
                            return Err(NvmeStatus::INTERNAL_ERROR);
                        };
                        if !(req.take_slot_buf(cap) || self.core.get_buffers(cap, &mut req.bufs)) {
                            return Err(NvmeStatus::INTERNAL_ERROR);
                        }
                        req.bufs.copy_from_slice(&b.as_slice()[start..start + n]);
                        false
                    }
                    Icd::Bytes(bytes) => {
                        // The slot buffer, or pool buffers for data larger
                        // than a slot.
                        if !(req.take_slot_buf(cap) || self.core.get_buffers(cap, &mut req.bufs)) {
                            return Err(NvmeStatus::INTERNAL_ERROR);
                        }
                        req.bufs.copy_from_slice(&bytes[start..start + n]);
                        false
                    }
                };
                req.in_capsule = true;
                req.state = ReqState::ReadyToExecute;
                if lent {
                    self.stats.icd_lent += 1;
                } else {
                    self.stats.icd_copies += 1;
                }
                return Ok(());
            }
            _ => return Err(NvmeStatus::SGL_DESCRIPTOR_TYPE_INVALID),
        }
        req.state = if plan.len == 0 {
            // No data: nothing may find the parked slot buffer in `bufs`.
            req.unpark_slot_buf();
            ReqState::ReadyToExecute
        } else {
            ReqState::NeedBuffer
        };
        Ok(())
    }

    /// Which plan, by queue kind.
    fn classify(&mut self, slot: u16) -> Result<super::req::Plan, NvmeStatus> {
        let cmd = &self.reqs[usize::from(slot)].cmd;
        match (&self.ctrlr, self.qid) {
            (None, _) => self.classify_unconnected(cmd),
            (Some(_), Some(0)) => self.classify_admin(cmd),
            (Some(_), _) => self.classify_io(slot),
        }
    }

    /// Set the status and move to `Executed`.
    pub(crate) fn finish(&mut self, slot: u16, status: NvmeStatus) {
        let r = &mut self.reqs[usize::from(slot)];
        r.status = status;
        r.state = ReqState::Executed;
    }

    /// Park `slot` in queue `q` (once); the next poll retries it.
    pub(crate) fn park(&mut self, slot: u16, q: ParkQ) {
        let r = &mut self.reqs[usize::from(slot)];
        if r.parked_in == Some(q) {
            return;
        }
        r.parked_in = Some(q);
        self.stats.parked += 1;
        match q {
            ParkQ::Buffer => self.park_buf.push_back(slot),
            ParkQ::Transfer => self.park_xfer.push_back(slot),
            ParkQ::Exec => self.park_exec.push_back(slot),
            ParkQ::Response => self.park_rsp.push_back(slot),
        }
    }

    /// Drive request `slot` as far as it goes (the one `process()`).
    pub(crate) fn process(&mut self, slot: u16, ops: &mut dyn QpairOps) {
        let si = usize::from(slot);
        loop {
            match self.reqs[si].state {
                ReqState::Free
                | ReqState::TransferringIn
                | ReqState::Executing
                | ReqState::Responding => return,
                ReqState::NeedBuffer => {
                    let len = self.reqs[si].plan.buf_len as usize;
                    let req = &mut self.reqs[si];
                    let got = req.take_slot_buf(len) || self.core.get_buffers(len, &mut req.bufs);
                    if !got {
                        self.park(slot, ParkQ::Buffer);
                        return;
                    }
                    let req = &mut self.reqs[si];
                    req.parked_in = None;
                    req.state = if req.plan.dir == Dir::ToCtrl && !req.in_capsule {
                        ReqState::NeedTransfer
                    } else {
                        ReqState::ReadyToExecute
                    };
                }
                ReqState::NeedTransfer => {
                    let tag = self.tag(slot);
                    let req = &mut self.reqs[si];
                    let Some(remote) = req.remote else {
                        self.finish(slot, NvmeStatus::INTERNAL_ERROR);
                        continue;
                    };
                    match ops.data_from_host(tag, &remote, &mut req.bufs) {
                        Ok(Transfer::Done) => {
                            req.parked_in = None;
                            req.state = ReqState::ReadyToExecute;
                        }
                        Ok(Transfer::Pending) => {
                            req.parked_in = None;
                            req.state = ReqState::TransferringIn;
                            self.in_flight += 1;
                            return;
                        }
                        Ok(Transfer::Busy) => {
                            self.park(slot, ParkQ::Transfer);
                            return;
                        }
                        Err(e) => {
                            log::debug!("nvmf: data transfer from host failed: {e}");
                            req.parked_in = None;
                            self.finish(slot, NvmeStatus::DATA_TRANSFER_ERROR);
                        }
                    }
                }
                ReqState::ReadyToExecute => match self.execute(slot) {
                    ExecOutcome::Done(st) => {
                        self.reqs[si].parked_in = None;
                        self.finish(slot, st);
                    }
                    ExecOutcome::Async => {
                        self.reqs[si].parked_in = None;
                        self.reqs[si].state = ReqState::Executing;
                        return;
                    }
                    ExecOutcome::Busy => {
                        self.park(slot, ParkQ::Exec);
                        return;
                    }
                },
                ReqState::Executed => {
                    self.respond(slot, ops);
                    return;
                }
            }
        }
    }

    /// Build the completion (once) and hand the response to the transport.
    #[inline(never)]
    fn respond(&mut self, slot: u16, ops: &mut dyn QpairOps) {
        let si = usize::from(slot);
        if self.reqs[si].lent_icd {
            // The data is on the bdev: give the transport its receive
            // buffer back before the host can see the response.
            self.reqs[si].release_bufs();
        }
        // The completion from the value just built, not read back from
        // the request: its byte-sized fields were stored one by one, and a
        // wider load of them right after waits for the stores to drain
        // (store forwarding fails), once per command.
        let cpl = match self.reqs[si].cpl {
            Some(cpl) => cpl,
            None => {
                let cpl = self.build_cpl(slot);
                self.reqs[si].cpl = Some(cpl);
                cpl
            }
        };
        let tag = self.tag(slot);
        let req = &self.reqs[si];
        let data = match (req.plan.dir, req.remote) {
            (Dir::ToHost, Some(remote)) if cpl.status.is_success() && req.out_len > 0 => {
                Some(ResponseData {
                    remote,
                    bufs: &req.bufs,
                    len: req.out_len,
                })
            }
            _ => None,
        };
        let rsp = Response {
            cpl,
            cqe: cpl.encode(),
            data,
            invalidate_key: req.remote.filter(|r| r.invalidate).map(|r| r.key),
        };
        match ops.send_response(tag, &rsp) {
            Ok(Transfer::Done) => self.free_req(slot),
            Ok(Transfer::Pending) => {
                let r = &mut self.reqs[si];
                r.parked_in = None;
                r.state = ReqState::Responding;
                self.in_flight += 1;
            }
            Ok(Transfer::Busy) => self.park(slot, ParkQ::Response),
            Err(e) => {
                log::debug!("nvmf: response to cid {} lost: {e}", cpl.cid);
                self.free_req(slot);
            }
        }
    }

    fn build_cpl(&mut self, slot: u16) -> NvmeCompletion {
        let si = usize::from(slot);
        // The next head, wrapped without a division (one per command).
        let next = self.sqhd.wrapping_add(1);
        self.sqhd = if next >= self.sq_entries { 0 } else { next };
        let sqhd = if self.sqflow_disabled {
            SQHD_DISABLED
        } else {
            self.sqhd
        };
        let req = &self.reqs[si];
        let sqid = self.qid.unwrap_or((req.cmd.cdw10 >> 16) as u16);
        let mut cpl = NvmeCompletion::new(sqid, req.cmd.cid, req.status);
        cpl.dw0 = req.dw0;
        cpl.dw1 = req.dw1;
        cpl.sqhd = sqhd;
        if !req.status.is_success() {
            self.stats.errors += 1;
            if let (Some(c), Some(0)) = (&self.ctrlr, self.qid) {
                c.log_error(ErrorLogEntry {
                    sqid,
                    cid: req.cmd.cid,
                    status: req.status.to_field(),
                    param_error_location: super::error_loc::param_error_location(
                        &req.cmd, req.status,
                    ),
                    nsid: req.cmd.nsid,
                    opcode: req.cmd.opcode,
                    ..ErrorLogEntry::default()
                });
            }
        }
        cpl
    }

    fn free_req(&mut self, slot: u16) {
        let r = &mut self.reqs[usize::from(slot)];
        r.release_bufs();
        r.state = ReqState::Free;
        r.parked_in = None;
        self.free.push(slot);
        if self.free.len() == self.reqs.len() {
            if let Some(t0) = self.busy_since.take() {
                let ns = self.reactor.now_ns().saturating_sub(t0);
                self.io_counters.busy_for(ns);
            }
        }
    }

    /// The buffers of a request whose host data is on its way (a `Pending`
    /// [`QpairOps::data_from_host`]): a transport that receives the data
    /// itself (NVMe/TCP H2CData) writes it here, straight from the socket.
    /// `None` for an unknown or stale tag, or a request in another state.
    pub fn incoming_bufs(&mut self, tag: ReqTag) -> Option<&mut SgList> {
        let slot = self.slot_of(tag, ReqState::TransferringIn)?;
        Some(&mut self.reqs[usize::from(slot)].bufs)
    }

    /// The buffers of a request whose response is on its way (a `Pending`
    /// [`QpairOps::send_response`]): a transport that writes the data
    /// itself later (NVMe/TCP's scatter-gather send) reads it here. `None`
    /// for an unknown or stale tag, or a request in another state.
    pub fn response_bufs(&self, tag: ReqTag) -> Option<&SgList> {
        let slot = self.slot_of(tag, ReqState::Responding)?;
        Some(&self.reqs[usize::from(slot)].bufs)
    }

    /// The transport finished a `Pending` [`QpairOps::data_from_host`]; a
    /// failed transfer fails its command with Data Transfer Error
    /// ([`TransportError::DataDigest`]: Transient Transport Error).
    /// Returns `false` for an unknown or stale tag (ignored).
    pub fn transfer_done(
        &mut self,
        tag: ReqTag,
        result: Result<(), TransportError>,
        ops: &mut dyn QpairOps,
    ) -> bool {
        let Some(slot) = self.slot_of(tag, ReqState::TransferringIn) else {
            return false;
        };
        self.in_flight = self.in_flight.saturating_sub(1);
        match result {
            Ok(()) => self.reqs[usize::from(slot)].state = ReqState::ReadyToExecute,
            Err(e) => {
                log::debug!("nvmf: data transfer from host failed: {e}");
                let status = if e == TransportError::DataDigest {
                    NvmeStatus::TRANSIENT_TRANSPORT_ERROR
                } else {
                    NvmeStatus::DATA_TRANSFER_ERROR
                };
                self.finish(slot, status);
            }
        }
        self.process(slot, ops);
        true
    }

    /// The transport finished a `Pending` [`QpairOps::send_response`]; the
    /// request and its buffers are freed. Returns `false` for an unknown or
    /// stale tag (ignored).
    pub fn response_sent(&mut self, tag: ReqTag) -> bool {
        let Some(slot) = self.slot_of(tag, ReqState::Responding) else {
            return false;
        };
        self.in_flight = self.in_flight.saturating_sub(1);
        self.free_req(slot);
        true
    }

    /// Collect bdev completions, retry parked requests, deliver events and
    /// notice a dead controller. Call once per reactor loop.
    pub fn poll(&mut self, ops: &mut dyn QpairOps) -> PollStatus {
        let mut busy = false;
        // The whole batch at once (double-buffered: no borrow per entry);
        // completions of I/Os submitted meanwhile wait for the next poll.
        if !self.inbox.q.borrow().is_empty() {
            let mut batch = std::mem::take(&mut self.inbox_spare);
            std::mem::swap(&mut batch, &mut *self.inbox.q.borrow_mut());
            busy = true;
            for (ctx, status) in batch.drain(..) {
                self.io_done(ReqTag::from_u64(ctx), status, ops);
            }
            self.inbox_spare = batch;
        }
        let parked = !(self.park_buf.is_empty()
            && self.park_xfer.is_empty()
            && self.park_exec.is_empty()
            && self.park_rsp.is_empty());
        if parked {
            busy |= self.retry(ParkQ::Buffer, ops);
            busy |= self.retry(ParkQ::Transfer, ops);
            busy |= self.retry(ParkQ::Exec, ops);
            busy |= self.retry(ParkQ::Response, ops);
        }
        if let Some(c) = &self.ctrlr {
            if c.is_dead() {
                if !self.disconnect_sent {
                    self.disconnect_sent = true;
                    ops.disconnect();
                    busy = true;
                }
            } else if !self.aers.is_empty() && c.has_events() {
                busy |= self.deliver_events(ops);
            }
        } else if !self.disconnect_sent {
            busy |= self.connect_overdue(ops);
        }
        PollStatus::from_work(busy)
    }

    /// No Connect completed on this queue within the target's
    /// `connect_timeout_ms`: ask the transport to disconnect it (once) and
    /// count it. Returns whether it did.
    #[cold]
    fn connect_overdue(&mut self, ops: &mut dyn QpairOps) -> bool {
        if !self
            .connect_deadline
            .is_some_and(|d| self.reactor.now() >= d)
        {
            return false;
        }
        log::warn!(
            "nvmf: a queue on {} completed no Connect within {} ms: disconnecting it",
            self.listener(),
            self.target.options().connect_timeout_ms
        );
        self.target.connect_timed_out();
        self.disconnect_sent = true;
        ops.disconnect();
        true
    }

    /// Retry the parked requests of `q`, oldest first, until one stays
    /// parked.
    fn retry(&mut self, q: ParkQ, ops: &mut dyn QpairOps) -> bool {
        let mut progressed = false;
        loop {
            let front = match q {
                ParkQ::Buffer => self.park_buf.front(),
                ParkQ::Transfer => self.park_xfer.front(),
                ParkQ::Exec => self.park_exec.front(),
                ParkQ::Response => self.park_rsp.front(),
            };
            let Some(&slot) = front else {
                return progressed;
            };
            if self.reqs[usize::from(slot)].parked_in == Some(q) {
                self.process(slot, ops);
                if self.reqs[usize::from(slot)].parked_in == Some(q) {
                    return progressed;
                }
                progressed = true;
            }
            match q {
                ParkQ::Buffer => self.park_buf.pop_front(),
                ParkQ::Transfer => self.park_xfer.pop_front(),
                ParkQ::Exec => self.park_exec.pop_front(),
                ParkQ::Response => self.park_rsp.pop_front(),
            };
        }
    }

    /// Rebuild the namespace view when the subsystem's namespaces changed
    /// (control-path event: allocates then, not per I/O).
    #[inline]
    pub(crate) fn refresh_ns_view(&mut self) {
        let Some(c) = &self.ctrlr else {
            return;
        };
        let gen = c.subsystem().ns_generation();
        if gen != self.ns_gen {
            self.rebuild_ns_view(gen);
        }
    }

    /// [`refresh_ns_view`](Self::refresh_ns_view) after a change: the view
    /// of generation `gen`.
    #[cold]
    #[inline(never)]
    fn rebuild_ns_view(&mut self, gen: u64) {
        let Some(c) = &self.ctrlr else {
            return;
        };
        let subsys = c.subsystem();
        let mut view = Vec::new();
        for ns in subsys.namespaces() {
            let nsid = ns.nsid();
            if let Some(old) = self.ns_view.iter().find(|e| Arc::ptr_eq(&e.ns, &ns)) {
                view.push(NsEntry {
                    nsid,
                    ns: Arc::clone(&old.ns),
                    ch: old.ch.clone(),
                });
                continue;
            }
            match ns.desc().channel(&self.reactor) {
                Ok(ch) => view.push(NsEntry { nsid, ns, ch }),
                Err(e) => log::warn!("nvmf: namespace {nsid}: no bdev channel: {e}"),
            }
        }
        self.ns_view = view;
        self.ns_gen = gen;
    }

    /// A bdev I/O of request `tag` finished.
    fn io_done(&mut self, tag: ReqTag, status: IoStatus, ops: &mut dyn QpairOps) {
        let Some(slot) = self.slot_of(tag, ReqState::Executing) else {
            // Stale: drop what it returned.
            if let Some(home) = self.inbox.bufs.borrow_mut().get_mut(tag.slot()) {
                if !home.is_empty() {
                    drop(std::mem::take(home));
                }
            }
            return;
        };
        let si = usize::from(slot);
        let req = &mut self.reqs[si];
        if let Some(home) = self.inbox.bufs.borrow_mut().get_mut(si) {
            // The I/O's buffers back into the request (whose list was
            // taken at submit); an I/O without buffers leaves the
            // request's own (DSM ranges) in place.
            if !home.is_empty() {
                drop_empty(std::mem::replace(&mut req.bufs, std::mem::take(home)));
            }
        }
        if let Err(e) = status {
            if req.status.is_success() {
                req.status = super::io_cmd::bdev_status(e, req.plan.exec);
            }
        }
        req.subs = req.subs.saturating_sub(1);
        if req.subs > 0 {
            return;
        }
        if req.plan.exec == super::req::Exec::Dsm && req.status.is_success() {
            // More ranges to issue: back to ReadyToExecute.
            req.state = ReqState::ReadyToExecute;
            self.process(slot, ops);
        } else if req.fua && req.status.is_success() {
            // FUA: the write is counted now and the command runs on as a
            // flush of its namespace, completing when that does.
            req.fua = false;
            let bytes = match req.plan.exec {
                super::req::Exec::Write => req.plan.len,
                _ => 0,
            };
            self.io_counters.write_done(u64::from(bytes));
            req.plan.exec = super::req::Exec::Flush;
            req.pi = None;
            req.state = ReqState::ReadyToExecute;
            self.process(slot, ops);
        } else {
            req.state = ReqState::Executed;
            let ok = req.status.is_success();
            match req.plan.exec {
                super::req::Exec::Read => {
                    req.out_len = req.plan.len;
                    if let (true, Some((bs, md))) = (ok, req.pi_spread) {
                        // PRACT: the bdev checked the tuples; the host gets
                        // the data only.
                        super::pi_layout::strip(
                            &mut req.bufs,
                            bs as usize,
                            md as usize,
                            req.nlb as usize,
                        );
                    }
                    if ok {
                        self.io_counters.read_done(u64::from(req.plan.len));
                    }
                }
                super::req::Exec::Write if ok => {
                    self.io_counters.write_done(u64::from(req.plan.len))
                }
                super::req::Exec::WriteZeroes if ok => self.io_counters.write_done(0),
                _ => {}
            }
            // What `process` does for `Executed`, without its frame.
            self.respond(slot, ops);
        }
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // The keep-alive timer first: it holds the controller.
        self.keep_alive = None;
        if let (Some(c), Some(qid)) = (&self.ctrlr, self.qid) {
            if qid == 0 {
                c.destroy();
            } else {
                c.remove_io_qid(qid);
                c.subsystem().health().retire(&self.io_counters);
            }
        }
    }
}

/// What executing a command did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExecOutcome {
    /// Finished with this status.
    Done(NvmeStatus),
    /// Will finish later (bdev I/O, AER).
    Async,
    /// No room (bdev channel full): park and retry.
    Busy,
}
