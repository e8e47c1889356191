//! One host queue pair: request slots (one per queue entry, preallocated),
//! command ids, SQ flow control (the SQ head the target reports in every
//! CQE), I/O timeouts, and the I/O commands (read, write, flush, write
//! zeroes, deallocate).
//!
//! Per I/O nothing is allocated and no lock is taken: a free slot is popped
//! from a preallocated stack, the caller's buffers move into it and come
//! back in the [`Completion`]; while the command is in flight they stay in
//! the slot, lent to the transport by slot in every flush and poll
//! ([`SlotBufs`](super::SlotBufs): the NVMe/TCP queue moves data straight
//! to and from them). Running out of slots or SQ entries is back-pressure
//! ([`SubmitErrorKind::Busy`], the buffers are handed back), never
//! failure. When the queue dies (the target disconnected, a
//! transport error, a timeout) every outstanding command completes with
//! [`IoError::Aborted`] (or [`IoError::TimedOut`]) at the next poll.
//!
//! A queue created or used on a reactor holds it awake
//! ([`Reactor::hold_awake`]) while it has commands outstanding: nothing the
//! transports wait for (a shared-memory ring, a CQ, a socket) wakes a
//! reactor that sleeps in an adaptive or hybrid idle mode. The hold is
//! taken when the first command goes out and dropped by the poll that
//! delivers the last completion.

// A refused submission hands the caller's buffers back by value: boxing
// them would allocate on every back-pressure event.
#![allow(clippy::result_large_err)]

use std::time::{Duration, Instant};

use pollux_reactor::mem::SgList;
use pollux_reactor::{AwakeHold, Reactor};

use super::transport::{DataDir, HostQueue, Queued, SlotBufs};
use super::{HostError, IoError};
use crate::spec::cmd::{IoOpcode, NvmeCmd};
use crate::spec::cpl::{NvmeCompletion, SQHD_DISABLED};
use crate::spec::nvm::{RwCmd, RwPi};

/// Slots per queue at most (CIDs carry a 10-bit slot and a 6-bit generation).
pub const MAX_QUEUE_ENTRIES: u16 = 1024;

/// A finished command.
#[derive(Debug)]
pub struct Completion {
    /// The caller's context, as given at submission.
    pub ctx: u64,
    /// The CQE, or why there is none. A CQE with an error status is
    /// reported as `Err(IoError::Nvme(..))`.
    pub result: Result<NvmeCompletion, IoError>,
    /// The caller's buffers, back.
    pub data: SgList,
}

/// Why a submission was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmitErrorKind {
    /// No free slot or SQ entry, or the transport is out of resources:
    /// poll, then try again.
    Busy,
    /// The queue is dead.
    Dead,
    /// The command cannot be carried (a bad size or buffer layout).
    Invalid(HostError),
}

/// A refused submission: why, and the caller's buffers back.
#[derive(Debug)]
pub struct SubmitError {
    /// Why.
    pub kind: SubmitErrorKind,
    /// The buffers of the refused command.
    pub data: SgList,
}

#[derive(Debug)]
struct Slot {
    busy: bool,
    gen: u8,
    ctx: u64,
    data: SgList,
    started: Instant,
}

/// The slots' buffers, lent to the transport in flush and poll (only the
/// slots that hold a command).
struct Lent<'a>(&'a mut [Slot]);

impl SlotBufs for Lent<'_> {
    fn bufs(&self, slot: u16) -> Option<&SgList> {
        self.0
            .get(usize::from(slot))
            .filter(|s| s.busy)
            .map(|s| &s.data)
    }

    fn bufs_mut(&mut self, slot: u16) -> Option<&mut SgList> {
        self.0
            .get_mut(usize::from(slot))
            .filter(|s| s.busy)
            .map(|s| &mut s.data)
    }
}

/// One queue pair over a host transport queue `Q` (`!Send`).
pub struct Qpair<Q: HostQueue> {
    q: Q,
    qid: u16,
    entries: u16,
    slots: Vec<Slot>,
    free: Vec<u16>,
    /// Commands sent, and commands the target said it consumed (SQHD),
    /// as unwrapped counters.
    submitted: u64,
    consumed: u64,
    /// `consumed % entries` (the SQ head slot).
    sq_head: u16,
    sq_flow: bool,
    ready: Vec<(u16, NvmeCompletion)>,
    dead: Option<HostError>,
    timed_out: bool,
    io_timeout: Duration,
    now: Instant,
    polls: u32,
    staged: bool,
    /// DW0 of the last completion with an error status (Connect Invalid
    /// Parameters carries IPO/IATTR there).
    last_error_dw0: u32,
    /// Held while commands are outstanding, on the reactor the queue is
    /// used on (none off a reactor).
    awake: Option<AwakeHold>,
}

impl<Q: HostQueue> std::fmt::Debug for Qpair<Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qpair")
            .field("qid", &self.qid)
            .field("entries", &self.entries)
            .field("outstanding", &self.outstanding())
            .field("dead", &self.dead)
            .finish()
    }
}

impl<Q: HostQueue> Qpair<Q> {
    /// Wrap a transport queue of `entries` entries (control path: allocates
    /// the slots). The Fabrics Connect is the caller's next command.
    pub fn new(q: Q, qid: u16, entries: u16, io_timeout: Duration) -> Self {
        let entries = entries.clamp(1, MAX_QUEUE_ENTRIES);
        let now = Instant::now();
        let slots = (0..entries)
            .map(|_| Slot {
                busy: false,
                gen: 0,
                ctx: 0,
                data: SgList::new(),
                started: now,
            })
            .collect();
        Qpair {
            q,
            qid,
            entries,
            slots,
            free: (0..entries).rev().collect(),
            submitted: 0,
            consumed: 0,
            sq_head: 0,
            sq_flow: true,
            ready: Vec::with_capacity(usize::from(entries) + 1),
            dead: None,
            timed_out: false,
            io_timeout,
            now,
            polls: 0,
            staged: false,
            last_error_dw0: 0,
            awake: None,
        }
    }

    /// DW0 of the last completion that carried an error status (control
    /// path: a refused Connect's IPO/IATTR).
    pub fn last_error_dw0(&self) -> u32 {
        self.last_error_dw0
    }

    /// The queue id.
    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// Queue entries (the most commands in flight).
    pub fn entries(&self) -> u16 {
        self.entries
    }

    /// Commands in flight.
    pub fn outstanding(&self) -> usize {
        usize::from(self.entries) - self.free.len()
    }

    /// Whether a command could be submitted now (a free slot and SQ room).
    pub fn can_submit(&self) -> bool {
        self.dead.is_none() && !self.free.is_empty() && self.sq_room()
    }

    /// Why the queue died, if it did.
    pub fn dead_reason(&self) -> Option<&HostError> {
        self.dead.as_ref()
    }

    /// Whether the queue is alive.
    pub fn is_alive(&self) -> bool {
        self.dead.is_none()
    }

    /// The transport queue.
    pub fn transport(&self) -> &Q {
        &self.q
    }

    /// The largest write that travels in the capsule.
    pub fn max_inline(&self) -> u32 {
        self.q.max_inline()
    }

    fn sq_room(&self) -> bool {
        !self.sq_flow || self.submitted - self.consumed < u64::from(self.entries)
    }

    /// Submit `cmd` (its CID is assigned here) with `data` in direction
    /// `dir`; `ctx` comes back in the [`Completion`]. The command goes out
    /// at the next [`Qpair::flush`] or [`Qpair::poll`].
    ///
    /// # Errors
    /// [`SubmitError`] with the buffers: `Busy` (back-pressure), `Dead`,
    /// `Invalid`.
    pub fn submit(
        &mut self,
        cmd: NvmeCmd,
        dir: DataDir,
        data: SgList,
        ctx: u64,
    ) -> Result<(), SubmitError> {
        self.submit_with(cmd, dir, data, ctx, None)
    }

    /// Ready the transport to move PI through its signature offload
    /// ([`Qpair::rw_pi_offload`]); `Ok(false)` when it cannot (control
    /// path).
    ///
    /// # Errors
    /// [`HostError`] when the transport cannot allocate what it needs.
    pub fn enable_pi_offload(&mut self) -> Result<bool, HostError> {
        self.q.enable_pi_offload()
    }

    /// A Read or Write whose PI the transport's signature offload makes
    /// and checks (`pi`): `data` holds the data (and, DIX, one tuple per
    /// block after it); PRCHK asks the target to check too. A check that
    /// fails in the offload completes the command with the end-to-end
    /// status.
    ///
    /// # Errors
    /// As [`Qpair::submit`]; `Invalid` without
    /// [`enable_pi_offload`](Qpair::enable_pi_offload).
    pub fn rw_pi_offload(
        &mut self,
        nsid: u32,
        pi: &super::pi::PiIo,
        data: SgList,
        ctx: u64,
    ) -> Result<(), SubmitError> {
        let (op, dir) = if pi.write {
            (IoOpcode::Write, DataDir::ToCtrl)
        } else {
            (IoOpcode::Read, DataDir::FromCtrl)
        };
        match RwCmd::to_cmd(op, 0, nsid, pi.slba, pi.nlb) {
            Ok(mut cmd) => {
                RwCmd::set_pi(&mut cmd, &pi.rw_pi());
                self.submit_with(cmd, dir, data, ctx, Some(pi))
            }
            Err(e) => Err(SubmitError {
                kind: SubmitErrorKind::Invalid(HostError::Unsupported(e.to_string())),
                data,
            }),
        }
    }

    fn submit_with(
        &mut self,
        mut cmd: NvmeCmd,
        dir: DataDir,
        data: SgList,
        ctx: u64,
        pi: Option<&super::pi::PiIo>,
    ) -> Result<(), SubmitError> {
        if self.dead.is_some() {
            return Err(SubmitError {
                kind: SubmitErrorKind::Dead,
                data,
            });
        }
        if !self.sq_room() {
            return Err(SubmitError {
                kind: SubmitErrorKind::Busy,
                data,
            });
        }
        let Some(&slot) = self.free.last() else {
            return Err(SubmitError {
                kind: SubmitErrorKind::Busy,
                data,
            });
        };
        let s = &mut self.slots[usize::from(slot)];
        cmd.cid = slot | (u16::from(s.gen & 0x3F) << 10);
        let queued = match pi {
            None => self.q.queue_cmd(slot, &mut cmd, dir, &data),
            Some(p) => self.q.queue_cmd_pi(slot, &mut cmd, dir, &data, p),
        };
        match queued {
            Ok(Queued::Yes) => {}
            Ok(Queued::Busy) => {
                return Err(SubmitError {
                    kind: SubmitErrorKind::Busy,
                    data,
                })
            }
            Err(e @ HostError::Disconnected(_)) => {
                self.die(e);
                return Err(SubmitError {
                    kind: SubmitErrorKind::Dead,
                    data,
                });
            }
            Err(e) => {
                return Err(SubmitError {
                    kind: SubmitErrorKind::Invalid(e),
                    data,
                })
            }
        }
        self.free.pop();
        s.busy = true;
        s.ctx = ctx;
        // The slot's list was taken by the previous completion: normally
        // empty, forgotten without a call into its drop glue.
        let old = std::mem::replace(&mut s.data, data);
        if old.is_empty() && old.is_inline() {
            std::mem::forget(old);
        }
        s.started = self.now;
        self.submitted += 1;
        self.staged = true;
        if self.awake.is_none() {
            self.hold_awake();
        }
        Ok(())
    }

    /// The first command outstanding: keep the current reactor polling
    /// until the last one completes (see the module documentation).
    #[cold]
    fn hold_awake(&mut self) {
        self.awake = Reactor::current().map(|r| r.hold_awake());
    }

    /// Let the reactor sleep again once nothing is outstanding.
    #[inline]
    fn release_awake(&mut self) {
        if self.awake.is_some() && self.outstanding() == 0 {
            self.awake = None;
        }
    }

    /// Read `nlb` blocks at `slba` of namespace `nsid` into `data`.
    ///
    /// # Errors
    /// As [`Qpair::submit`].
    pub fn read(
        &mut self,
        nsid: u32,
        slba: u64,
        nlb: u32,
        data: SgList,
        ctx: u64,
    ) -> Result<(), SubmitError> {
        self.rw(
            IoOpcode::Read,
            DataDir::FromCtrl,
            nsid,
            slba,
            nlb,
            data,
            ctx,
        )
    }

    /// Write `nlb` blocks at `slba` of namespace `nsid` from `data`.
    ///
    /// # Errors
    /// As [`Qpair::submit`].
    pub fn write(
        &mut self,
        nsid: u32,
        slba: u64,
        nlb: u32,
        data: SgList,
        ctx: u64,
    ) -> Result<(), SubmitError> {
        self.rw(IoOpcode::Write, DataDir::ToCtrl, nsid, slba, nlb, data, ctx)
    }

    /// A Read (`write == false`) or Write of `nlb` blocks at `slba` with
    /// the protection fields `pi`. `data` is what crosses the fabric: on a
    /// namespace with metadata, each block's data followed by its metadata
    /// (extended LBA), or the data alone with PRACT on a namespace whose
    /// metadata is exactly the PI tuple.
    ///
    /// # Errors
    /// As [`Qpair::submit`].
    #[allow(clippy::too_many_arguments)]
    pub fn rw_pi(
        &mut self,
        write: bool,
        nsid: u32,
        slba: u64,
        nlb: u32,
        data: SgList,
        pi: &RwPi,
        ctx: u64,
    ) -> Result<(), SubmitError> {
        let (op, dir) = if write {
            (IoOpcode::Write, DataDir::ToCtrl)
        } else {
            (IoOpcode::Read, DataDir::FromCtrl)
        };
        match RwCmd::to_cmd(op, 0, nsid, slba, nlb) {
            Ok(mut cmd) => {
                RwCmd::set_pi(&mut cmd, pi);
                self.submit(cmd, dir, data, ctx)
            }
            Err(e) => Err(SubmitError {
                kind: SubmitErrorKind::Invalid(HostError::Unsupported(e.to_string())),
                data,
            }),
        }
    }

    /// Write zeroes to `nlb` blocks at `slba`.
    ///
    /// # Errors
    /// As [`Qpair::submit`].
    pub fn write_zeroes(
        &mut self,
        nsid: u32,
        slba: u64,
        nlb: u32,
        ctx: u64,
    ) -> Result<(), SubmitError> {
        self.rw(
            IoOpcode::WriteZeroes,
            DataDir::None,
            nsid,
            slba,
            nlb,
            SgList::new(),
            ctx,
        )
    }

    /// Flush namespace `nsid`.
    ///
    /// # Errors
    /// As [`Qpair::submit`].
    pub fn flush_ns(&mut self, nsid: u32, ctx: u64) -> Result<(), SubmitError> {
        let mut cmd = NvmeCmd::new(IoOpcode::Flush.code(), 0);
        cmd.nsid = nsid;
        self.submit(cmd, DataDir::None, SgList::new(), ctx)
    }

    /// Deallocate (Dataset Management, AD) `nlb` blocks at `slba`; `range`
    /// is a buffer of at least 16 bytes for the range descriptor.
    ///
    /// # Errors
    /// As [`Qpair::submit`]; `Invalid` for a short buffer.
    pub fn deallocate(
        &mut self,
        nsid: u32,
        slba: u64,
        nlb: u32,
        mut range: SgList,
        ctx: u64,
    ) -> Result<(), SubmitError> {
        let desc = crate::spec::nvm::DsmRange {
            attributes: 0,
            nlb,
            slba,
        }
        .encode();
        let len: usize = range.total_len();
        let Some(first) = range
            .as_mut_slice()
            .first_mut()
            .filter(|b| b.len() >= desc.len() && len >= desc.len())
        else {
            return Err(SubmitError {
                kind: SubmitErrorKind::Invalid(HostError::Unsupported(
                    "deallocate needs a 16-byte buffer".into(),
                )),
                data: range,
            });
        };
        if first.set_len(desc.len()).is_err() {
            return Err(SubmitError {
                kind: SubmitErrorKind::Invalid(HostError::Unsupported("deallocate buffer".into())),
                data: range,
            });
        }
        first.as_mut_slice().copy_from_slice(&desc);
        let mut cmd = NvmeCmd::new(IoOpcode::DatasetManagement.code(), 0);
        cmd.nsid = nsid;
        cmd.cdw10 = 0; // one range (0-based)
        cmd.cdw11 = 1 << 2; // AD
        self.submit(cmd, DataDir::ToCtrl, range, ctx)
    }

    #[allow(clippy::too_many_arguments)]
    fn rw(
        &mut self,
        op: IoOpcode,
        dir: DataDir,
        nsid: u32,
        slba: u64,
        nlb: u32,
        data: SgList,
        ctx: u64,
    ) -> Result<(), SubmitError> {
        match RwCmd::to_cmd(op, 0, nsid, slba, nlb) {
            Ok(cmd) => self.submit(cmd, dir, data, ctx),
            Err(e) => Err(SubmitError {
                kind: SubmitErrorKind::Invalid(HostError::Unsupported(e.to_string())),
                data,
            }),
        }
    }

    /// Post the staged commands (one doorbell).
    pub fn flush(&mut self) {
        if !self.staged || self.dead.is_some() {
            return;
        }
        self.staged = false;
        if let Err(e) = self.q.flush(&Lent(&mut self.slots)) {
            self.die(e);
        }
    }

    fn die(&mut self, e: HostError) {
        if self.dead.is_none() {
            log::debug!("nvmf host: queue {} died: {e}", self.qid);
            self.dead = Some(e);
            self.q.disconnect();
        }
    }

    /// Tear the queue down: outstanding commands complete with
    /// [`IoError::Aborted`] at the next poll.
    pub fn disconnect(&mut self) {
        self.die(HostError::Disconnected("disconnected by the host".into()));
    }

    /// Flush staged commands, reap completions and call `f` for each
    /// finished command. Returns how many completed. On a dead queue every
    /// outstanding command completes with an error.
    pub fn poll(&mut self, f: &mut dyn FnMut(Completion)) -> usize {
        self.flush();
        self.polls = self.polls.wrapping_add(1);
        if self.polls % 256 == 0 {
            self.now = Instant::now();
            self.check_timeouts();
        }
        if self.dead.is_some() {
            let n = self.fail_all(f);
            self.release_awake();
            return n;
        }
        self.ready.clear();
        if let Err(e) = self.q.poll(&mut self.ready, &mut Lent(&mut self.slots)) {
            self.die(e);
        }
        let mut n = 0;
        for i in 0..self.ready.len() {
            let (slot, cpl) = self.ready[i];
            let si = usize::from(slot);
            let known = self
                .slots
                .get(si)
                .is_some_and(|s| s.busy && cpl.cid == slot | (u16::from(s.gen & 0x3F) << 10));
            if !known {
                // A CID that names no command: the target is confused.
                self.die(HostError::Protocol(format!(
                    "completion for unknown cid {:#x}",
                    cpl.cid
                )));
                continue;
            }
            if cpl.sqhd != SQHD_DISABLED && cpl.sqhd < self.entries {
                // `sq_head` is `consumed` modulo the entries, kept along so
                // no division runs per completion.
                let adv = if cpl.sqhd >= self.sq_head {
                    cpl.sqhd - self.sq_head
                } else {
                    cpl.sqhd + (self.entries - self.sq_head)
                };
                let next = self.consumed + u64::from(adv);
                if next <= self.submitted {
                    self.consumed = next;
                    self.sq_head = cpl.sqhd;
                } else {
                    // A head past what was sent: trust only what was sent.
                    self.consumed = self.submitted;
                    self.sq_head = (self.submitted % u64::from(self.entries)) as u16;
                }
            } else if cpl.sqhd == SQHD_DISABLED {
                self.sq_flow = false;
            }
            let s = &mut self.slots[si];
            self.q.finish(slot, &mut s.data);
            s.busy = false;
            s.gen = s.gen.wrapping_add(1);
            self.free.push(slot);
            let result = if cpl.status.is_success() {
                Ok(cpl)
            } else {
                self.last_error_dw0 = cpl.dw0;
                Err(IoError::Nvme(cpl.status))
            };
            n += 1;
            f(Completion {
                ctx: s.ctx,
                result,
                data: std::mem::take(&mut s.data),
            });
        }
        if !self.sq_flow {
            // Without SQHD, a completion frees an SQ entry.
            self.consumed = self.submitted - self.outstanding() as u64;
            self.sq_head = (self.consumed % u64::from(self.entries)) as u16;
        }
        if self.dead.is_some() {
            n += self.fail_all(f);
        }
        self.release_awake();
        n
    }

    fn check_timeouts(&mut self) {
        if self.io_timeout.is_zero() || self.dead.is_some() {
            return;
        }
        let now = self.now;
        let late = self
            .slots
            .iter()
            .any(|s| s.busy && now.saturating_duration_since(s.started) > self.io_timeout);
        if late {
            for (i, s) in self.slots.iter().enumerate() {
                let age = now.saturating_duration_since(s.started);
                if s.busy && age > self.io_timeout {
                    let state = self.q.slot_state(i as u16).unwrap_or_default();
                    log::warn!(
                        "nvmf host: queue {} slot {i} timed out after {:.1} s ({} outstanding){}{state}",
                        self.qid,
                        age.as_secs_f64(),
                        self.outstanding(),
                        if state.is_empty() { "" } else { ": " },
                    );
                }
            }
            self.timed_out = true;
            self.die(HostError::Timeout {
                what: "an I/O command",
                after: self.io_timeout,
            });
        }
    }

    fn fail_all(&mut self, f: &mut dyn FnMut(Completion)) -> usize {
        let mut n = 0;
        let err = if self.timed_out {
            IoError::TimedOut
        } else {
            IoError::Aborted
        };
        for (i, s) in self.slots.iter_mut().enumerate() {
            if !s.busy {
                continue;
            }
            // `i < entries <= u16::MAX`.
            let slot = i as u16;
            self.q.abandon(slot);
            s.busy = false;
            s.gen = s.gen.wrapping_add(1);
            self.free.push(slot);
            n += 1;
            f(Completion {
                ctx: s.ctx,
                result: Err(err),
                data: std::mem::take(&mut s.data),
            });
        }
        n
    }

    /// Run one command to completion (control path: Connect, Property
    /// Get/Set, admin commands). Spins on this queue (and on the current
    /// reactor, when called outside its poll loop, so an in-process target
    /// makes progress) until the command completes or `timeout` passes.
    ///
    /// # Errors
    /// [`HostError::Nvme`] for an error status, [`HostError::Timeout`],
    /// [`HostError::Disconnected`], [`HostError::Unsupported`].
    pub fn exec(
        &mut self,
        what: &'static str,
        cmd: NvmeCmd,
        dir: DataDir,
        data: SgList,
        timeout: Duration,
    ) -> Result<(NvmeCompletion, SgList), HostError> {
        const SYNC_CTX: u64 = u64::MAX - 7;
        let start = Instant::now();
        let mut pending = Some((cmd, data));
        let mut out: Option<(Result<NvmeCompletion, IoError>, SgList)> = None;
        let reactor = Reactor::current();
        let mut spins = 0u32;
        loop {
            if let Some((cmd, data)) = pending.take() {
                match self.submit(cmd, dir, data, SYNC_CTX) {
                    Ok(()) => {}
                    Err(SubmitError {
                        kind: SubmitErrorKind::Busy,
                        data,
                    }) => pending = Some((cmd, data)),
                    Err(SubmitError {
                        kind: SubmitErrorKind::Dead,
                        ..
                    }) => {
                        return Err(self
                            .dead
                            .clone()
                            .unwrap_or_else(|| HostError::Disconnected(what.into())))
                    }
                    Err(SubmitError {
                        kind: SubmitErrorKind::Invalid(e),
                        ..
                    }) => return Err(e),
                }
            }
            self.poll(&mut |c| {
                if c.ctx == SYNC_CTX {
                    out = Some((c.result, c.data));
                }
            });
            if let Some((res, data)) = out.take() {
                return match res {
                    Ok(cpl) => Ok((cpl, data)),
                    Err(IoError::Nvme(status)) => Err(HostError::Nvme { what, status }),
                    Err(IoError::TimedOut) => Err(HostError::Timeout {
                        what,
                        after: timeout,
                    }),
                    Err(IoError::Aborted) => Err(self
                        .dead
                        .clone()
                        .unwrap_or_else(|| HostError::Disconnected(what.into()))),
                };
            }
            if let Some(r) = &reactor {
                r.poll_once();
            }
            spins = spins.wrapping_add(1);
            if spins % 64 == 0 {
                if start.elapsed() > timeout {
                    self.die(HostError::Timeout {
                        what,
                        after: timeout,
                    });
                    return Err(HostError::Timeout {
                        what,
                        after: timeout,
                    });
                }
                std::thread::yield_now();
            }
        }
    }
}

impl<Q: HostQueue> Drop for Qpair<Q> {
    fn drop(&mut self) {
        self.q.disconnect();
    }
}
