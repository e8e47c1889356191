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

use pollux_bdev::PiAction;
use pollux_reactor::mem::{DmaBuf, SgList};

use super::transport::RemoteBuf;
use crate::spec::cmd::{AdminOpcode, NvmeCmd, SQE_SIZE};
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
    /// Buffer bytes it needs (more than `len` when the bdev's blocks carry
    /// metadata that the wire does not: PRACT with PI-only metadata).
    pub(crate) buf_len: u32,
    /// The data SGL may be longer than `len` (only `len` bytes move):
    /// commands whose data is a structure the command sizes itself
    /// (Dataset Management: NR+1 ranges in whatever buffer the host
    /// gives, which Linux makes 4096 bytes; Get/Set Features). Shorter
    /// is still Data SGL Length Invalid. The Linux target checks these
    /// with `nvmet_check_data_len_lte` and every other command exactly.
    pub(crate) sgl_may_exceed: bool,
}

impl Plan {
    pub(crate) const fn new(exec: Exec, dir: Dir, len: u32) -> Self {
        Plan {
            exec,
            dir,
            len,
            buf_len: len,
            sgl_may_exceed: false,
        }
    }

    pub(crate) const fn no_data(exec: Exec) -> Self {
        Plan {
            exec,
            dir: Dir::None,
            len: 0,
            buf_len: 0,
            sgl_may_exceed: false,
        }
    }

    /// This plan, with buffers of `buf_len` bytes (at least `len`).
    pub(crate) const fn with_buf_len(mut self, buf_len: u32) -> Self {
        if buf_len > self.len {
            self.buf_len = buf_len;
        }
        self
    }

    /// This plan, accepting a data SGL longer than `len`.
    pub(crate) const fn sgl_may_exceed(mut self) -> Self {
        self.sgl_may_exceed = true;
        self
    }

    /// Whether an SGL of `sgl_len` bytes fits this plan.
    pub(crate) const fn sgl_len_ok(&self, sgl_len: u32) -> bool {
        sgl_len == self.len || (self.sgl_may_exceed && sgl_len > self.len)
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

/// `buf.set_len(len)` as a bool, the error dropped in its own arm: the
/// success path (every I/O) makes no call into the error's drop glue.
#[inline(always)]
fn set_len(buf: &mut DmaBuf, len: usize) -> bool {
    match buf.set_len(len) {
        Ok(()) => true,
        Err(e) => {
            drop(e);
            false
        }
    }
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
    /// `bufs` holds the slot buffer, idle (its full capacity): left there
    /// by the last command's release, so the next command that needs it
    /// (a small keyed I/O) takes it without moving it. Anything else that
    /// fills `bufs` first [unparks](Self::unpark_slot_buf) it.
    pub(crate) slot_parked: bool,
    /// The slot buffer's capacity (its length while parked).
    slot_cap: usize,
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
    /// The bdev's PI action for this Read or Write (PRACT and PRCHK).
    pub(crate) pi: Option<PiAction>,
    /// PRACT with PI-only metadata: the wire carries `(block, md)` blocks'
    /// data only; the buffers are spread before a write reaches the bdev
    /// (then this is cleared) and stripped after a read.
    pub(crate) pi_spread: Option<(u32, u32)>,
    /// A Write or Write Zeroes with FUA: once it succeeds, a flush of the
    /// namespace runs before the command completes (then this is cleared).
    pub(crate) fua: bool,
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
            slot_cap: slot_buf.as_ref().map_or(0, DmaBuf::capacity),
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
            slot_parked: false,
            status: NvmeStatus::SUCCESS,
            dw0: 0,
            dw1: 0,
            out_len: 0,
            cpl: None,
            slba: 0,
            nlb: 0,
            pi: None,
            pi_spread: None,
            fua: false,
            subs: 0,
            dsm_next: 0,
            parked_in: None,
        }
    }

    /// Start a new command in this slot, parsing its SQE in place.
    pub(crate) fn start(&mut self, sqe: &[u8; SQE_SIZE]) {
        self.gen = self.gen.wrapping_add(1);
        // 64 bytes: the parse cannot fail (and is built in place).
        if let Ok(cmd) = NvmeCmd::parse(sqe) {
            self.cmd = cmd;
        }
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
        self.pi = None;
        self.pi_spread = None;
        self.fua = false;
        self.subs = 0;
        self.dsm_next = 0;
        self.parked_in = None;
    }

    /// Put the slot buffer in `bufs`, `len` bytes long; `false` if it is
    /// too small (or already in use).
    #[inline(always)]
    pub(crate) fn take_slot_buf(&mut self, len: usize) -> bool {
        if self.slot_parked {
            let fits = match self.bufs.as_mut_slice() {
                [b] => set_len(b, len),
                _ => false,
            };
            if fits {
                self.slot_parked = false;
                self.uses_slot_buf = true;
                return true;
            }
            // Too small: out of the way of the pool buffers.
            self.unpark_slot_buf();
            return false;
        }
        let Some(mut b) = self.slot_buf.take() else {
            return false;
        };
        if !set_len(&mut b, len) {
            self.slot_buf = Some(b);
            return false;
        }
        self.bufs.push(b);
        self.uses_slot_buf = true;
        true
    }

    /// Move a parked slot buffer out of `bufs` (before anything else
    /// fills them).
    pub(crate) fn unpark_slot_buf(&mut self) {
        if self.slot_parked {
            self.slot_parked = false;
            self.slot_buf = self.bufs.pop();
        }
    }

    /// Drop the data buffers, keeping the slot buffer for the next command
    /// (parked in `bufs` when it is their only segment).
    #[inline]
    pub(crate) fn release_bufs(&mut self) {
        self.lent_icd = false;
        if self.slot_parked {
            return;
        }
        if self.uses_slot_buf {
            if let [b] = self.bufs.as_mut_slice() {
                // Its own capacity: cannot fail.
                set_len(b, self.slot_cap);
                self.uses_slot_buf = false;
                self.slot_parked = true;
                return;
            }
        }
        self.release_other_bufs();
    }

    /// [`release_bufs`](Self::release_bufs) when the slot buffer is not
    /// the only segment (pool or lent buffers).
    #[inline(never)]
    fn release_other_bufs(&mut self) {
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
        if !self.bufs.is_empty() {
            self.bufs.clear();
        }
    }

    /// Copy `data` into the buffers from the start (control path helper for
    /// admin data); `out_len` becomes the bytes copied.
    pub(crate) fn write_data(&mut self, data: &[u8]) {
        let n = self.bufs.copy_from_slice(data);
        self.out_len = n as u32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slot_buffer_parks_in_bufs_and_leaves_them_for_other_data() {
        let mut r = Request::new(Some(DmaBuf::alloc(4096).unwrap()));
        let cap = r.slot_buf.as_ref().unwrap().capacity();
        assert!(r.take_slot_buf(512));
        assert_eq!(r.bufs.total_len(), 512);
        r.release_bufs();
        assert!(r.slot_parked && r.slot_buf.is_none());
        assert_eq!(r.bufs.total_len(), cap, "parked at full capacity");
        // Released again (an error response of a command that never took
        // it): still parked, not dropped.
        r.release_bufs();
        assert!(r.slot_parked);
        assert_eq!(r.bufs.len(), 1);
        // The next small command takes it in place.
        assert!(r.take_slot_buf(1024));
        assert!(!r.slot_parked && r.uses_slot_buf);
        assert_eq!(r.bufs.total_len(), 1024);
        r.release_bufs();
        // Too large: it leaves `bufs` empty for pool buffers.
        assert!(!r.take_slot_buf(cap + 1));
        assert!(r.bufs.is_empty() && !r.slot_parked);
        assert_eq!(r.slot_buf.as_ref().map(DmaBuf::len), Some(cap));
        // Parked, then unparked for other data.
        assert!(r.take_slot_buf(16));
        r.release_bufs();
        r.unpark_slot_buf();
        assert!(r.bufs.is_empty() && !r.slot_parked);
        assert_eq!(r.slot_buf.as_ref().map(DmaBuf::len), Some(cap));
        // Data that is not the slot buffer is dropped on release.
        r.bufs.push(DmaBuf::alloc(512).unwrap());
        r.release_bufs();
        assert!(r.bufs.is_empty() && r.slot_buf.is_some());
    }
}
