//! One initiator task's state and the result handed to the caller.

use pollux_reactor::mem::SgList;

use super::error::InitiatorError;
use super::pi::{PiLayout, PiShape};
use crate::scsi::sense::Sense;

/// Who undid a task's memory registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invalidation {
    /// The task registered no memory (no data, or all immediate).
    None,
    /// The target's SEND_WITH_INV (checked against the task's STag).
    Remote,
    /// The initiator's LOCAL_INV.
    Local,
}

/// Which PI check failed, and where (detected by the initiator).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PiFailure {
    /// Guard, application tag or reference tag.
    pub kind: pollux_verbs::SigErrKind,
    /// The failing logical block.
    pub lba: u64,
    /// Expected value.
    pub expected: u64,
    /// Value found.
    pub actual: u64,
}

/// A finished task.
#[derive(Debug)]
pub struct TaskResult {
    /// The caller's context.
    pub ctx: u64,
    /// SCSI status (`scsi::sense::GOOD`, `CHECK_CONDITION`, …). An
    /// initiator-detected PI error turns GOOD into CHECK CONDITION with
    /// ILLEGAL REQUEST 10/01-03 (as Linux ib_iser reports it).
    pub status: u8,
    /// Sense data (target's, or the initiator's for a PI error).
    pub sense: Option<Sense>,
    /// Residual count from the response (with its U/O flag).
    pub residual: u32,
    /// A PI error the initiator detected (signature status or software).
    pub pi_error: Option<PiFailure>,
    /// How the registration was undone.
    pub invalidation: Invalidation,
    /// The connection failed before the task finished: status and sense
    /// mean nothing.
    pub transport_error: bool,
    /// Why the session failed, with `transport_error` (e.g.
    /// [`InitiatorError::TargetUnresponsive`]); `None` otherwise.
    pub error: Option<InitiatorError>,
    /// The caller's buffers.
    pub bufs: Option<SgList>,
}

impl TaskResult {
    /// GOOD status, no PI error, no transport error.
    pub fn is_good(&self) -> bool {
        self.status == crate::scsi::sense::GOOD && !self.transport_error && self.pi_error.is_none()
    }

    /// (key, ASC, ASCQ) of the sense data.
    pub fn sense_code(&self) -> Option<(u8, u8, u8)> {
        self.sense.map(|s| s.code())
    }
}

/// Data direction of a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataDir {
    /// No data.
    None,
    /// Data-In (the target RDMA-WRITEs into the buffers).
    Read,
    /// Data-Out (immediate data and/or target RDMA READs).
    Write,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PiPath {
    /// No PI on the wire.
    None,
    /// Integrity MR (signature offload).
    Offload,
    /// Software, through the task's bounce slot.
    Software,
}

/// The shape of a task without PI.
pub(crate) const NO_PI: PiShape = PiShape {
    lba: 0,
    block: 512,
    blocks: 0,
    pi_type: 0,
    app_tag: 0,
    app_mask: 0,
    layout: PiLayout::Insert,
};

pub(crate) struct Task<Mr> {
    pub(crate) active: bool,
    pub(crate) gen: u16,
    pub(crate) itt: u32,
    pub(crate) ctx: u64,
    /// Fast-registration MR (plain transfers, software PI); `None` when
    /// the provider has no fast registration and the session advertises
    /// pre-registered arena memory instead.
    pub(crate) _mr: Option<Mr>,
    pub(crate) fr_key: u32,
    /// Integrity MR (signature offload), if the device has it.
    pub(crate) imr: Option<(Mr, u32)>,
    /// The key registered for the current task.
    pub(crate) key: u32,
    /// The MR is bound (needs invalidation).
    pub(crate) registered: bool,
    pub(crate) send_done: bool,
    pub(crate) rsp: bool,
    pub(crate) inv_pending: bool,
    pub(crate) dir: DataDir,
    pub(crate) pi: PiPath,
    pub(crate) shape: PiShape,
    pub(crate) status: u8,
    pub(crate) sense: Option<Sense>,
    pub(crate) residual: u32,
    pub(crate) pi_error: Option<PiFailure>,
    pub(crate) invalidation: Invalidation,
    pub(crate) bufs: Option<SgList>,
}

impl<Mr> Task<Mr> {
    pub(crate) fn new(mr: Option<Mr>, key: u32, imr: Option<(Mr, u32)>) -> Self {
        Task {
            active: false,
            gen: 0,
            itt: 0,
            ctx: 0,
            _mr: mr,
            fr_key: key,
            imr,
            key,
            registered: false,
            send_done: false,
            rsp: false,
            inv_pending: false,
            dir: DataDir::None,
            pi: PiPath::None,
            shape: NO_PI,
            status: 0,
            sense: None,
            residual: 0,
            pi_error: None,
            invalidation: Invalidation::None,
            bufs: None,
        }
    }

    /// Start the slot's next task (slot `idx`: its ITT is the new
    /// generation and the slot), everything from the last one cleared.
    /// A PI failure already found (software DIX write) is kept.
    pub(crate) fn start(
        &mut self,
        idx: u16,
        ctx: u64,
        dir: DataDir,
        pi: (PiPath, PiShape),
        pi_error: Option<PiFailure>,
    ) {
        self.gen = self.gen.wrapping_add(1) & 0x7FFF;
        self.itt = u32::from(self.gen) << 16 | u32::from(idx);
        self.active = true;
        self.ctx = ctx;
        self.send_done = false;
        self.rsp = false;
        self.inv_pending = false;
        self.dir = dir;
        (self.pi, self.shape) = pi;
        self.status = 0;
        self.sense = None;
        self.residual = 0;
        self.pi_error = pi_error;
        self.invalidation = Invalidation::None;
    }

    pub(crate) fn finished(&self) -> bool {
        self.active && self.send_done && self.rsp && !self.inv_pending
    }
}
