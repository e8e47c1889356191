//! The loopback transport (nvmet's `loop`): host and target in one process,
//! on one reactor. A "wire" is two queues (capsules in, CQEs out) and a
//! table of host memory regions addressed by key, so keyed SGLs, remote
//! invalidation and in-capsule data all take the same core paths as RDMA.
//!
//! It is a thin mover: the poll group's poller hands each capsule to the
//! core ([`QueuePair::submit_capsule`]), copies data between host memory and
//! the core's buffers when asked ([`QpairOps`]), and queues the CQEs.
//! Transfers finish at once ([`Transfer::Done`]).
//!
//! The host end ([`LoopbackEndpoint`]) is for tests and in-process hosts:
//! it allocates a `Vec` per capsule. [`crate::loopback_host`] builds a small
//! host driver on it.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::Arc;

use pollux_reactor::sync::{Mutex, MutexGuard};

use pollux_reactor::mem::SgList;
use pollux_reactor::{IoDevice, PollStatus, PollerGuard, Reactor};

use super::qpair::QueuePair;
use super::target::Target;
use super::transport::{
    QpairOps, QpairParams, RemoteBuf, ReqTag, Response, TargetTransport, Transfer, TransportError,
};
use crate::spec::cpl::{NvmeCompletion, CQE_SIZE};
use crate::spec::transport_id::{TrType, TransportId};

/// One host memory region.
#[derive(Debug)]
struct Region {
    bytes: Vec<u8>,
    valid: bool,
}

/// What host and target share for one queue.
#[derive(Debug, Default)]
struct Wire {
    sq: RefCell<VecDeque<Vec<u8>>>,
    cq: RefCell<VecDeque<[u8; CQE_SIZE]>>,
    mem: RefCell<HashMap<u32, Region>>,
    next_key: Cell<u32>,
    /// Either side closed the queue.
    closed: Cell<bool>,
    /// The target asked to disconnect.
    target_closed: Cell<bool>,
}

/// The host end of a loopback queue (`!Send`; same reactor as the target end).
/// It keeps its core's poll group alive; dropping it closes the queue.
pub struct LoopbackEndpoint {
    wire: Rc<Wire>,
    _group: Rc<LoopbackPollGroup>,
}

impl Drop for LoopbackEndpoint {
    /// Dropping the host end closes the queue.
    fn drop(&mut self) {
        self.wire.closed.set(true);
    }
}

impl std::fmt::Debug for LoopbackEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopbackEndpoint")
            .field("connected", &self.is_connected())
            .finish()
    }
}

impl LoopbackEndpoint {
    /// Send a command capsule (SQE + in-capsule data).
    ///
    /// # Errors
    ///
    /// [`TransportError::Disconnected`] after either side closed the queue.
    pub fn send_capsule(&self, capsule: Vec<u8>) -> Result<(), TransportError> {
        if self.wire.closed.get() {
            return Err(TransportError::Disconnected);
        }
        self.wire.sq.borrow_mut().push_back(capsule);
        Ok(())
    }

    /// The next completion, if one arrived.
    pub fn recv_completion(&self) -> Option<NvmeCompletion> {
        let raw = self.wire.cq.borrow_mut().pop_front()?;
        NvmeCompletion::parse(&raw).ok()
    }

    /// Register host memory (REG_MR): returns its key. Keyed SGLs address
    /// it with address = offset into `bytes`.
    pub fn register(&self, bytes: Vec<u8>) -> u32 {
        let key = self.wire.next_key.get().wrapping_add(1).max(1);
        self.wire.next_key.set(key);
        self.wire
            .mem
            .borrow_mut()
            .insert(key, Region { bytes, valid: true });
        key
    }

    /// Deregister `key` and take its bytes back.
    pub fn deregister(&self, key: u32) -> Option<Vec<u8>> {
        self.wire.mem.borrow_mut().remove(&key).map(|r| r.bytes)
    }

    /// Whether `key` is registered and not invalidated.
    pub fn is_key_valid(&self, key: u32) -> bool {
        self.wire.mem.borrow().get(&key).is_some_and(|r| r.valid)
    }

    /// Whether the queue is still up.
    pub fn is_connected(&self) -> bool {
        !self.wire.closed.get()
    }

    /// Whether the target tore the queue down.
    pub fn closed_by_target(&self) -> bool {
        self.wire.target_closed.get()
    }

    /// Close the queue from the host side; the target drops its end at its
    /// next poll.
    pub fn disconnect(&self) {
        self.wire.closed.set(true);
    }
}

/// The target end of one queue: the core's queue pair and the ops.
struct LoopConn {
    qp: QueuePair,
    ops: LoopOps,
}

/// [`QpairOps`] over a wire: copies.
struct LoopOps {
    wire: Rc<Wire>,
    disconnect: bool,
}

impl QpairOps for LoopOps {
    fn data_from_host(
        &mut self,
        _tag: ReqTag,
        remote: &RemoteBuf,
        bufs: &mut SgList,
    ) -> Result<Transfer, TransportError> {
        let mem = self.wire.mem.borrow();
        let src = region(&mem, remote)?;
        bufs.copy_from_slice(src);
        Ok(Transfer::Done)
    }

    fn send_response(
        &mut self,
        _tag: ReqTag,
        rsp: &Response<'_>,
    ) -> Result<Transfer, TransportError> {
        if self.wire.closed.get() {
            return Err(TransportError::Disconnected);
        }
        if let Some(d) = &rsp.data {
            let mut mem = self.wire.mem.borrow_mut();
            let remote = RemoteBuf {
                len: d.len.min(d.remote.len),
                ..d.remote
            };
            let dst = region_mut(&mut mem, &remote)?;
            d.bufs.copy_to_slice(dst);
        }
        if let Some(key) = rsp.invalidate_key {
            if let Some(r) = self.wire.mem.borrow_mut().get_mut(&key) {
                r.valid = false;
            }
        }
        self.wire.cq.borrow_mut().push_back(rsp.cqe);
        Ok(Transfer::Done)
    }

    fn disconnect(&mut self) {
        self.disconnect = true;
    }
}

fn bad(remote: &RemoteBuf) -> TransportError {
    TransportError::RemoteAccess {
        key: remote.key,
        addr: remote.addr,
        len: remote.len,
    }
}

fn span(remote: &RemoteBuf, have: usize) -> Option<std::ops::Range<usize>> {
    let start = usize::try_from(remote.addr).ok()?;
    let end = start.checked_add(remote.len as usize)?;
    (end <= have).then_some(start..end)
}

fn region<'a>(
    mem: &'a HashMap<u32, Region>,
    remote: &RemoteBuf,
) -> Result<&'a [u8], TransportError> {
    let r = mem
        .get(&remote.key)
        .filter(|r| r.valid)
        .ok_or_else(|| bad(remote))?;
    let s = span(remote, r.bytes.len()).ok_or_else(|| bad(remote))?;
    Ok(&r.bytes[s])
}

fn region_mut<'a>(
    mem: &'a mut HashMap<u32, Region>,
    remote: &RemoteBuf,
) -> Result<&'a mut [u8], TransportError> {
    let r = mem
        .get_mut(&remote.key)
        .filter(|r| r.valid)
        .ok_or_else(|| bad(remote))?;
    let s = span(remote, r.bytes.len()).ok_or_else(|| bad(remote))?;
    Ok(&mut r.bytes[s])
}

impl LoopConn {
    /// Feed capsules, poll the core; `true` when the connection is finished.
    fn poll(&mut self, busy: &mut bool) -> bool {
        loop {
            if self.ops.disconnect || self.wire_closed() {
                break;
            }
            let next = self.ops.wire.sq.borrow_mut().pop_front();
            let Some(capsule) = next else {
                break;
            };
            *busy = true;
            if let Err(e) = self.qp.submit_capsule(&capsule, &mut self.ops) {
                log::debug!("nvmf loopback: bad capsule, closing the queue: {e}");
                self.ops.disconnect = true;
            }
        }
        *busy |= self.qp.poll(&mut self.ops).is_busy();
        if self.ops.disconnect {
            self.ops.wire.target_closed.set(true);
            self.ops.wire.closed.set(true);
        }
        self.wire_closed() && self.qp.transfers_in_flight() == 0
    }

    fn wire_closed(&self) -> bool {
        self.ops.wire.closed.get()
    }
}

/// The loopback transport's per-core poll group: its connections and the
/// poller that drives them.
pub struct LoopbackPollGroup {
    _poller: PollerGuard,
    conns: Rc<RefCell<Vec<LoopConn>>>,
}

impl std::fmt::Debug for LoopbackPollGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopbackPollGroup")
            .field("connections", &self.connections())
            .finish()
    }
}

impl LoopbackPollGroup {
    fn new(r: &Reactor) -> Self {
        let conns: Rc<RefCell<Vec<LoopConn>>> = Rc::new(RefCell::new(Vec::new()));
        let weak = Rc::downgrade(&conns);
        let poller = PollerGuard::active(r, "nvmf-loopback", move || {
            let Some(conns) = weak.upgrade() else {
                return PollStatus::Idle;
            };
            // Take the list out so no borrow spans the core's work.
            let mut list = std::mem::take(&mut *conns.borrow_mut());
            let mut busy = false;
            list.retain_mut(|c| !c.poll(&mut busy));
            let mut cur = conns.borrow_mut();
            list.append(&mut cur);
            *cur = list;
            PollStatus::from_work(busy)
        });
        LoopbackPollGroup {
            _poller: poller,
            conns,
        }
    }

    /// Live connections on this core.
    pub fn connections(&self) -> usize {
        self.conns.borrow().len()
    }
}

/// Options of one loopback queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopbackQueueOptions {
    /// Commands the queue holds (the core's request count).
    pub depth: u16,
    /// In-capsule data accepted (0 on admin queues).
    pub in_capsule_data_size: u32,
}

impl LoopbackQueueOptions {
    /// An admin queue: 32 entries, no in-capsule data.
    pub const fn admin() -> Self {
        LoopbackQueueOptions {
            depth: 32,
            in_capsule_data_size: 0,
        }
    }

    /// An I/O queue of `depth` entries with 4 KiB of in-capsule data.
    pub const fn io(depth: u16) -> Self {
        LoopbackQueueOptions {
            depth,
            in_capsule_data_size: 4096,
        }
    }
}

/// The loopback transport (shared; its poll groups are per core).
#[derive(Debug, Default)]
pub struct LoopbackTransport {
    listeners: Mutex<Vec<TransportId>>,
}

impl LoopbackTransport {
    /// A loopback transport (add it to a target with
    /// [`Target::add_transport`]).
    pub fn new() -> Arc<Self> {
        Arc::new(LoopbackTransport::default())
    }

    fn lock(&self) -> MutexGuard<'_, Vec<TransportId>> {
        self.listeners.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Open a queue to the listener `trid` on `reactor` (control path):
    /// the target end joins this core's poll group, the host end is
    /// returned. Send a Fabrics Connect first.
    ///
    /// # Errors
    ///
    /// [`TransportError::NotListening`] when nobody listens at `trid`,
    /// [`TransportError::NoResources`] when the queue cannot be created.
    pub fn connect(
        self: &Arc<Self>,
        target: &Arc<Target>,
        reactor: &Reactor,
        trid: &TransportId,
        opts: LoopbackQueueOptions,
    ) -> Result<LoopbackEndpoint, TransportError> {
        if !self.lock().contains(trid) {
            return Err(TransportError::NotListening(trid.clone()));
        }
        let params = QpairParams {
            depth: opts.depth,
            in_capsule_data_size: opts.in_capsule_data_size,
            listener: trid.clone(),
            qid: None,
            io_queue_depth: target.options().max_queue_depth,
        };
        let qp = QueuePair::new(target, reactor, params)
            .map_err(|e| TransportError::NoResources(e.to_string()))?;
        let wire = Rc::new(Wire::default());
        let group = match reactor.channel(self) {
            Ok(g) => g,
            Err(never) => match never {},
        };
        group.conns.borrow_mut().push(LoopConn {
            qp,
            ops: LoopOps {
                wire: Rc::clone(&wire),
                disconnect: false,
            },
        });
        // The host end keeps the poll group (and so its poller) alive.
        Ok(LoopbackEndpoint {
            wire,
            _group: group,
        })
    }
}

impl TargetTransport for LoopbackTransport {
    fn name(&self) -> &'static str {
        "loopback"
    }

    fn trtype(&self) -> TrType {
        TrType::Loop
    }

    fn listen(&self, trid: &TransportId) -> Result<(), TransportError> {
        let mut l = self.lock();
        if l.contains(trid) {
            return Err(TransportError::AlreadyListening(trid.clone()));
        }
        l.push(trid.clone());
        Ok(())
    }

    fn stop_listen(&self, trid: &TransportId) -> Result<(), TransportError> {
        let mut l = self.lock();
        let i = l
            .iter()
            .position(|t| t == trid)
            .ok_or_else(|| TransportError::NotListening(trid.clone()))?;
        l.remove(i);
        Ok(())
    }
}

/// Each core's loopback poll group is the transport's io_device channel.
impl IoDevice for LoopbackTransport {
    type Channel = LoopbackPollGroup;
    type Error = std::convert::Infallible;

    fn create_channel(&self, r: &Reactor) -> Result<LoopbackPollGroup, Self::Error> {
        Ok(LoopbackPollGroup::new(r))
    }
}
