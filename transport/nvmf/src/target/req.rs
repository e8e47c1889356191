//! The request: one command's state machine, preallocated per queue pair.
//!
//! ```text
//!   submit_capsule ──► NeedBuffer ──► NeedTransfer ──► TransferringIn ──┐
//!        │  (errors)      │ (no data / in-capsule)          (Pending)   │
//!        │                ▼                                             ▼
//!        │           ReadyToExecute ◄───────────────────────────────────┘
//!        │                │ sync (admin, fabrics) │ async (bdev I/O, AER)
//!        ▼                ▼                       ▼
//!     Executed ◄──────────────────────────── Executing
//!        │ send_response: Done ─► Free;  Pending ─► Responding ─► Free
//! ```
//!
//! `NeedBuffer`, `NeedTransfer`, `ReadyToExecute` and `Executed` can park:
//! no buffer in the pool, transport busy, bdev channel full, transport busy.
//! A parked request waits in its queue pair's FIFO for that state and is
//! retried from [`QueuePair::poll`](super::QueuePair::poll), oldest first.

use pollux_reactor::mem::{DmaBuf, SgList};

use super::transport::RemoteBuf;
use crate::spec::cmd::{AdminOpcode, NvmeCmd};
use crate::spec::cpl::{NvmeCompletion, NvmeStatus};

/// Where a request is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReqState {
    /// Not in use.
    Free,
    /// Waiting for data buffers.
    NeedBuffer,
    /// Has buffers; host data must be pulled in.
    NeedTransfer,
    /// The transport is pulling host data in.
    TransferringIn,
    /// Ready to execute (or waiting for room in the bdev channel).
    ReadyToExecute,
    /// A bdev I/O or an AER is outstanding.
    Executing,
    /// The status is known; the response must be sent.
    Executed,
    /// The transport is sending the response.
    Responding,
}

/// Which way the data goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dir {
    /// No data.
    None,
    /// Host to controller (write, Connect data, DSM ranges).
    ToCtrl,
    /// Controller to host (read, Identify, logs).
    ToHost,
}

/// What to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exec {
    /// Fabrics Connect.
    Connect,
    /// Fabrics Property Get.
    PropertyGet,
    /// Fabrics Property Set.
    PropertySet,
    /// An admin command.
    Admin(AdminOpcode),
    /// NVM Read.
    Read,
    /// NVM Write.
    Write,
    /// NVM Flush.
    Flush,
    /// NVM Write Zeroes.
    WriteZeroes,
    /// NVM Dataset Management.
    Dsm,
}

/// The plan for a command, decided when its capsule arrives.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    pub(crate) exec: Exec,
    pub(crate) dir: Dir,
    /// Data bytes the command moves.
    pub(crate) len: u32,
}

impl Plan {
    pub(crate) const fn new(exec: Exec, dir: Dir, len: u32) -> Self {
        Plan { exec, dir, len }
    }

    pub(crate) const fn no_data(exec: Exec) -> Self {
        Plan {
            exec,
            dir: Dir::None,
            len: 0,
        }
    }
}

/// The four park queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ParkQ {
    Buffer,
    Transfer,
    Exec,
    Response,
}

/// One request slot.
#[derive(Debug)]
pub(crate) struct Request {
    pub(crate) state: ReqState,
    pub(crate) gen: u16,
    pub(crate) cmd: NvmeCmd,
    pub(crate) plan: Plan,
    /// Host memory of a keyed SGL.
    pub(crate) remote: Option<RemoteBuf>,
    /// The data came in the capsule (already in `bufs`).
    pub(crate) in_capsule: bool,
    /// `bufs` is the transport's receive buffer, lent (in-capsule data used
    /// in place); released when the response is sent.
    pub(crate) lent_icd: bool,
    /// The data buffers.
    pub(crate) bufs: SgList,
    /// This slot's own small buffer (in-capsule data, admin data, small
    /// I/O), out of `bufs` while not in use.
    pub(crate) slot_buf: Option<DmaBuf>,
    /// `bufs` holds `slot_buf`.
    pub(crate) uses_slot_buf: bool,
    pub(crate) status: NvmeStatus,
    pub(crate) dw0: u32,
    pub(crate) dw1: u32,
    /// Controller-to-host bytes to send (≤ plan.len).
    pub(crate) out_len: u32,
    /// The completion, built once when the response is first attempted.
    pub(crate) cpl: Option<NvmeCompletion>,
    /// I/O fields.
    pub(crate) slba: u64,
    pub(crate) nlb: u32,
    /// Bdev sub-I/Os outstanding (DSM issues one per range).
    pub(crate) subs: u16,
    /// Next DSM range to issue.
    pub(crate) dsm_next: u16,
    /// Parked in this queue.
    pub(crate) parked_in: Option<ParkQ>,
}

impl Request {
    pub(crate) fn new(slot_buf: Option<DmaBuf>) -> Self {
        Request {
            state: ReqState::Free,
            gen: 0,
            cmd: NvmeCmd::default(),
            plan: Plan::no_data(Exec::Flush),
            remote: None,
            in_capsule: false,
            lent_icd: false,
            bufs: SgList::new(),
            slot_buf,
            uses_slot_buf: false,
            status: NvmeStatus::SUCCESS,
            dw0: 0,
            dw1: 0,
            out_len: 0,
            cpl: None,
            slba: 0,
            nlb: 0,
            subs: 0,
            dsm_next: 0,
            parked_in: None,
        }
    }

    /// Start a new command in this slot.
    pub(crate) fn start(&mut self, cmd: NvmeCmd) {
        self.gen = self.gen.wrapping_add(1);
        self.cmd = cmd;
        self.plan = Plan::no_data(Exec::Flush);
        self.remote = None;
        self.in_capsule = false;
        self.lent_icd = false;
        self.status = NvmeStatus::SUCCESS;
        self.dw0 = 0;
        self.dw1 = 0;
        self.out_len = 0;
        self.cpl = None;
        self.slba = 0;
        self.nlb = 0;
        self.subs = 0;
        self.dsm_next = 0;
        self.parked_in = None;
    }

    /// Put the slot buffer in `bufs`, `len` bytes long; `false` if it is
    /// too small (or already in use).
    pub(crate) fn take_slot_buf(&mut self, len: usize) -> bool {
        let Some(mut b) = self.slot_buf.take() else {
            return false;
        };
        if b.set_len(len).is_err() {
            self.slot_buf = Some(b);
            return false;
        }
        self.bufs.push(b);
        self.uses_slot_buf = true;
        true
    }

    /// Drop the data buffers, keeping the slot buffer for the next command.
    pub(crate) fn release_bufs(&mut self) {
        if self.uses_slot_buf {
            // The slot buffer is the only segment when in use.
            if let Some(mut b) = self.bufs.pop() {
                let cap = b.capacity();
                let _ = b.set_len(cap);
                self.slot_buf = Some(b);
            }
            self.uses_slot_buf = false;
        }
        self.lent_icd = false;
        self.bufs.clear();
    }

    /// Copy `data` into the buffers from the start (control path helper for
    /// admin data); `out_len` becomes the bytes copied.
    pub(crate) fn write_data(&mut self, data: &[u8]) {
        let n = self.bufs.copy_from_slice(data);
        self.out_len = n as u32;
    }
}
