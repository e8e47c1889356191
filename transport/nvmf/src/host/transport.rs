//! The contract between the host core ([`Qpair`](super::Qpair),
//! [`Controller`](super::Controller)) and a host transport (RDMA over any
//! verbs provider, loopback).
//!
//! The core owns requests: their slots (one per queue entry), command ids,
//! SQ flow control, timeouts and the caller's buffers. A transport only
//! carries capsules: it describes the data of each command (keyed SGL,
//! in-capsule data), sends the capsule, and reports each command's
//! completion once it is safe to hand the buffers back (RDMA: the send
//! completion and the response arrived, and the memory key is invalidated).
//!
//! The caller's buffers stay in the core's slots while their command is in
//! flight; the core lends them to the transport by slot ([`SlotBufs`]) in
//! [`HostQueue::flush`] and [`HostQueue::poll`], so a stream transport
//! (NVMe/TCP) sends write data from them and receives read data into them
//! without a staging copy. Transports that move data otherwise (RDMA by
//! memory keys, loopback) ignore the lender.

use pollux_reactor::mem::SgList;

use super::HostError;
use crate::spec::cmd::NvmeCmd;
use crate::spec::cpl::NvmeCompletion;

/// Direction of a command's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataDir {
    /// No data.
    None,
    /// Host to controller (write, Connect data, DSM ranges).
    ToCtrl,
    /// Controller to host (read, Identify, logs).
    FromCtrl,
}

/// What a transport needs to open one queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueParams {
    /// Queue id (0 = admin).
    pub qid: u16,
    /// Queue entries (the SQ size, 1-based): the most commands in flight.
    pub entries: u16,
    /// The controller id (I/O queues; 0xFFFF on the admin queue).
    pub cntlid: u16,
    /// Largest in-capsule write the host may send on this queue (0 on the
    /// admin queue); the transport may lower it (see
    /// [`HostQueue::max_inline`]).
    pub inline_limit: u32,
}

/// How [`HostQueue::queue_cmd`] answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queued {
    /// The command will go out at the next [`HostQueue::flush`].
    Yes,
    /// No transport resources right now (send queue, registration keys):
    /// try again after a poll. Never a failure.
    Busy,
}

pub use super::pi::PiIo;

/// The caller's buffers of the commands in flight, by slot: what the core
/// lends a transport during [`HostQueue::flush`] and [`HostQueue::poll`].
/// A slot's buffers are lent from the moment
/// [`queue_cmd`](HostQueue::queue_cmd) answered [`Queued::Yes`] until
/// [`poll`](HostQueue::poll) reports the slot (or the queue died).
pub trait SlotBufs {
    /// The buffers of slot `slot`'s command; `None` when the slot holds no
    /// command.
    fn bufs(&self, slot: u16) -> Option<&SgList>;

    /// The same, writable (read data lands there).
    fn bufs_mut(&mut self, slot: u16) -> Option<&mut SgList>;
}

/// A lender with nothing to lend (no command in flight).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoSlotBufs;

impl SlotBufs for NoSlotBufs {
    fn bufs(&self, _slot: u16) -> Option<&SgList> {
        None
    }

    fn bufs_mut(&mut self, _slot: u16) -> Option<&mut SgList> {
        None
    }
}

/// One connected queue of a host transport (`!Send`: lives on one reactor).
/// Data-path methods allocate nothing and take no lock.
pub trait HostQueue {
    /// The largest write that travels in the capsule (0: none).
    fn max_inline(&self) -> u32;

    /// Prepare `cmd` (its CID set by the core) for slot `slot`: set its SGL
    /// for `data` in direction `dir` and stage the work. `data` stays owned
    /// by the core and untouched by it until [`HostQueue::poll`] reports the
    /// slot; once this answers [`Queued::Yes`] the core keeps it in the slot
    /// and lends it back by [`SlotBufs`] in every flush and poll, so the
    /// transport may refer to it by slot instead of copying it.
    ///
    /// # Errors
    /// [`HostError::Unsupported`] when the data cannot be described (too
    /// many segments, not registrable), [`HostError::Disconnected`].
    fn queue_cmd(
        &mut self,
        slot: u16,
        cmd: &mut NvmeCmd,
        dir: DataDir,
        data: &SgList,
    ) -> Result<Queued, HostError>;

    /// Ring the doorbell: post everything staged since the last flush
    /// (`bufs`: the buffers of the commands in flight, for a transport that
    /// sends write data from them).
    ///
    /// # Errors
    /// [`HostError::Disconnected`] when the queue is dead.
    fn flush(&mut self, bufs: &dyn SlotBufs) -> Result<(), HostError>;

    /// Reap completions: push `(slot, completion)` for every command that is
    /// finished (response received, its data in `bufs` and every resource
    /// that refers to them released) into `done`. `bufs` lends the buffers
    /// of the commands in flight (read data may land there, write data may
    /// be sent from there). Returns whether it did any work.
    ///
    /// # Errors
    /// [`HostError::Disconnected`] (or another error) when the queue died:
    /// the core then fails every outstanding command.
    fn poll(
        &mut self,
        done: &mut Vec<(u16, NvmeCompletion)>,
        bufs: &mut dyn SlotBufs,
    ) -> Result<bool, HostError>;

    /// Whether this transport needs keyed SGLs (RDMA: the target reaches
    /// host memory by key, so a controller without them is refused).
    /// NVMe/TCP moves data in PDUs and needs none. Default: yes.
    fn needs_keyed_sgls(&self) -> bool {
        true
    }

    /// Whether the Connect on this queue asks the target to disable SQ flow
    /// control (NVMe/TCP hosts do, as Linux does: the target may then
    /// answer a read with C2H SUCCESS and no response capsule). Default: no.
    fn disable_sq_flow(&self) -> bool {
        false
    }

    /// Called by the core before it hands `data` of a finished slot back
    /// (the loopback transport copies read data here). Default: nothing.
    fn finish(&mut self, _slot: u16, _data: &mut SgList) {}

    /// Forget slot `slot` of a dead queue (its command will never complete).
    fn abandon(&mut self, _slot: u16) {}

    /// What the transport still waits for on slot `slot`, for the log of a
    /// timed-out command (control path). Default: nothing known.
    fn slot_state(&self, _slot: u16) -> Option<String> {
        None
    }

    /// Make ready to move T10 PI through the provider's signature offload
    /// ([`HostQueue::queue_cmd_pi`]): `Ok(true)` when this queue can
    /// (control path: allocates per-slot resources), `Ok(false)` when the
    /// transport or device cannot. Default: cannot.
    ///
    /// # Errors
    /// [`HostError::Transport`] when the resources cannot be allocated.
    fn enable_pi_offload(&mut self) -> Result<bool, HostError> {
        Ok(false)
    }

    /// [`queue_cmd`](HostQueue::queue_cmd) of a Read or Write whose PI the
    /// provider inserts, checks and strips ([`PiIo`]): `data` is the
    /// caller's memory (data, and with DIX the tuples after it), the wire
    /// carries the extended blocks. A failed check of the provider turns
    /// the command's completion into the end-to-end error status.
    ///
    /// # Errors
    /// As [`queue_cmd`](HostQueue::queue_cmd); [`HostError::Unsupported`]
    /// without [`enable_pi_offload`](HostQueue::enable_pi_offload).
    fn queue_cmd_pi(
        &mut self,
        _slot: u16,
        _cmd: &mut NvmeCmd,
        _dir: DataDir,
        _data: &SgList,
        _pi: &PiIo,
    ) -> Result<Queued, HostError> {
        Err(HostError::Unsupported(
            "this transport has no PI offload".into(),
        ))
    }

    /// Tear the queue down (idempotent).
    fn disconnect(&mut self);
}

/// A host transport on one reactor: opens queues to one target address.
pub trait HostTransport {
    /// Its queues.
    type Queue: HostQueue;

    /// Short name (`"rdma"`, `"soft"`, `"loop"`).
    fn name(&self) -> &'static str;

    /// Register a data arena up front (RDMA: one MR per arena), so no
    /// registration happens on the data path. Default: nothing to do.
    ///
    /// # Errors
    /// [`HostError::Transport`] when the memory cannot be registered.
    fn register_memory(
        &self,
        _arena: &std::sync::Arc<pollux_reactor::mem::DmaArena>,
    ) -> Result<(), HostError> {
        Ok(())
    }

    /// Open (transport-connect) one queue; the core sends the Fabrics
    /// Connect through it next.
    ///
    /// # Errors
    /// [`HostError::Unreachable`], [`HostError::Rejected`],
    /// [`HostError::Timeout`], [`HostError::Transport`].
    fn open_queue(&self, params: &QueueParams) -> Result<Self::Queue, HostError>;
}
