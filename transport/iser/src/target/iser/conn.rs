//! One iSER connection: its QP and CM id, the core's
//! [`Connection`](crate::target::Connection), and [`ConnIo`], the work
//! request machinery behind [`ConnOps`]: PDUs go out as SENDs (or
//! SEND_WITH_INV) from registered send slots, Data-In as unsignaled RDMA
//! WRITEs queued before the response SEND, solicited Data-Out as signaled
//! RDMA READs. WRs are queued during a poll and posted once at its end.

use pollux_reactor::mem::DmaBuf;
use pollux_verbs::group::{post_sends, GroupConn, Link, MrTable};
use pollux_verbs::{
    Access, MemoryRegion, ProtectionDomain, Provider, RemoteAddr, SendOp, SendWr, Sge,
};

use super::options::{IserOptions, LARGE_SLOT, LARGE_SLOTS, SMALL_SLOT};
use super::wrid::{Token, WrKind};
use crate::pdu::{IserHeader, Stag, BHS_LEN, ISER_HDR_LEN};
use crate::target::{ConnOps, Connection, Transfer};

#[derive(Debug, Clone, Copy)]
enum PendOp {
    Send,
    SendInv(u32),
    Read(RemoteAddr),
    Write(RemoteAddr),
}

#[derive(Debug, Clone, Copy)]
struct PendWr {
    token: Token,
    op: PendOp,
    sge: Sge,
    signaled: bool,
}

/// The transport side of one connection.
pub(crate) struct ConnIo<P: Provider> {
    pub(crate) slot: u16,
    pub(crate) gen: u16,
    pend: Vec<PendWr>,
    /// Send slots: `small` of [`SMALL_SLOT`] bytes, then [`LARGE_SLOTS`]
    /// of [`LARGE_SLOT`] bytes.
    send_buf: DmaBuf,
    send_lkey: u32,
    small: usize,
    free_small: Vec<u16>,
    free_large: Vec<u16>,
    /// Sequence number of each slot's SEND / each task's READ or WRITE
    /// (a task has at most one of them in flight).
    slot_seq: Vec<u64>,
    read_seq: Vec<u64>,
    /// WRs queued or posted, and the sequence of the last one known done.
    posted: u64,
    completed: u64,
    sq_size: u32,
    rd_avail: u32,
    rd_depth: u32,
    /// Signaled WRs posted and not completed (flushes included).
    pub(crate) signaled_inflight: u32,
    pub(crate) closing: bool,
    pub(crate) disconnect_requested: bool,
    /// Tear down without waiting for the queued SENDs ([`ConnOps::abort`]).
    pub(crate) abort_requested: bool,
    /// An orderly logout ([`ConnOps::close_after_logout`]): once the
    /// Logout Response is out, wait for the initiator to disconnect.
    pub(crate) logged_out: bool,
    /// When the wait for the initiator's disconnect after the Logout
    /// Response ends (reactor nanoseconds, [`Reactor::now_ns`]); set when
    /// the response's SEND has completed.
    ///
    /// [`Reactor::now_ns`]: pollux_reactor::Reactor::now_ns
    pub(crate) logout_deadline: Option<u64>,
    own_mrs: MrTable<P>,
    pub(crate) doorbells: u64,
    pub(crate) busy: u64,
}

impl<P: Provider> ConnIo<P> {
    /// Control path: allocates and registers the send slots.
    pub(crate) fn new(
        pd: &P::Pd,
        slot: u16,
        gen: u16,
        depth: u32,
        sq_size: u32,
        rd_depth: u32,
    ) -> Result<(Self, P::Mr), String> {
        let small = IserOptions::small_slots(depth);
        let len = small * SMALL_SLOT + LARGE_SLOTS * LARGE_SLOT;
        let send_buf = DmaBuf::alloc(len).map_err(|e| e.to_string())?;
        let arena = send_buf.arena().clone();
        let mr = pd
            .reg_mr(&arena, 0, arena.len(), Access::LOCAL_WRITE)
            .map_err(|e| e.to_string())?;
        let io = ConnIo {
            slot,
            gen,
            pend: Vec::with_capacity(sq_size as usize),
            send_lkey: mr.lkey(),
            send_buf,
            small,
            free_small: (0..small as u16).rev().collect(),
            free_large: (small as u16..(small + LARGE_SLOTS) as u16).rev().collect(),
            slot_seq: vec![0; small + LARGE_SLOTS],
            read_seq: vec![0; depth as usize],
            posted: 0,
            completed: 0,
            sq_size,
            rd_avail: rd_depth,
            rd_depth,
            signaled_inflight: 0,
            closing: false,
            disconnect_requested: false,
            abort_requested: false,
            logged_out: false,
            logout_deadline: None,
            own_mrs: MrTable::new(),
            doorbells: 0,
            busy: 0,
        };
        Ok((io, mr))
    }

    fn sq_free(&self) -> u64 {
        u64::from(self.sq_size).saturating_sub(self.posted - self.completed)
    }

    /// Whether WRs wait for the flush.
    pub(crate) fn has_pending(&self) -> bool {
        !self.pend.is_empty()
    }

    /// Send slots not yet free again.
    pub(crate) fn slots_in_use(&self) -> usize {
        self.small + LARGE_SLOTS - self.free_small.len() - self.free_large.len()
    }

    /// After an orderly logout whose Logout Response is out: whether the
    /// grace for the initiator's disconnect is over at `now_ns` (the first
    /// call starts it). Only a connection in this wait reads the time.
    pub(crate) fn logout_grace_over(&mut self, now_ns: u64, grace_ns: u64) -> bool {
        match self.logout_deadline {
            Some(deadline) => now_ns >= deadline,
            None => {
                self.logout_deadline = Some(now_ns.saturating_add(grace_ns));
                grace_ns == 0
            }
        }
    }

    /// The signaled SEND from `slot` completed (or flushed).
    pub(crate) fn send_done(&mut self, slot: u32) {
        let s = slot as usize;
        if let Some(&seq) = self.slot_seq.get(s) {
            self.completed = self.completed.max(seq);
            self.signaled_inflight = self.signaled_inflight.saturating_sub(1);
            if s < self.small {
                self.free_small.push(slot as u16);
            } else {
                self.free_large.push(slot as u16);
            }
        }
    }

    /// The Data-In WRITE of `task` completed (or flushed).
    pub(crate) fn write_done(&mut self, task: u32) {
        if let Some(&seq) = self.read_seq.get(task as usize) {
            self.completed = self.completed.max(seq);
            self.signaled_inflight = self.signaled_inflight.saturating_sub(1);
        }
    }

    /// The READ of `task` completed (or flushed).
    pub(crate) fn read_done(&mut self, task: u32) {
        if let Some(&seq) = self.read_seq.get(task as usize) {
            self.completed = self.completed.max(seq);
            self.signaled_inflight = self.signaled_inflight.saturating_sub(1);
            self.rd_avail = (self.rd_avail + 1).min(self.rd_depth);
        }
    }

    fn lkey(&mut self, shared: &MrTable<P>, pd: &P::Pd, buf: &DmaBuf) -> Option<u32> {
        let id = buf.arena_id();
        if let Some(k) = shared.lkey(id).or_else(|| self.own_mrs.lkey(id)) {
            return Some(k);
        }
        // An arena the poll group did not register: once, control path.
        self.own_mrs.register(pd, buf.arena()).ok()
    }

    /// Post every queued WR (one `post_send` per [`POST_CHUNK`](pollux_verbs::group::POST_CHUNK) WRs).
    ///
    /// # Errors
    /// The QP refused a WR: the connection must be torn down.
    pub(crate) fn flush(&mut self, qp: &P::Qp) -> Result<(), pollux_verbs::PostError> {
        let result = post_sends::<_, P>(qp, &self.pend, &mut self.doorbells, |p| {
            let op = match p.op {
                PendOp::Send => SendOp::Send,
                PendOp::SendInv(rkey) => SendOp::SendWithInv { rkey },
                PendOp::Read(remote) => SendOp::RdmaRead { remote },
                PendOp::Write(remote) => SendOp::RdmaWrite { remote },
            };
            let wr = SendWr::new(p.token.encode(), op, std::slice::from_ref(&p.sge));
            if p.signaled {
                wr.signaled()
            } else {
                wr
            }
        });
        if let Err(e) = &result {
            // WRs that never reached the QP never complete.
            let lost = self.pend[e.index..].iter().filter(|p| p.signaled).count() as u32;
            self.signaled_inflight = self.signaled_inflight.saturating_sub(lost);
        }
        self.pend.clear();
        result
    }
}

/// [`ConnOps`] of one connection, borrowing the poll group's MR table.
pub(crate) struct IserOps<'a, P: Provider> {
    pub(crate) io: &'a mut ConnIo<P>,
    pub(crate) shared: &'a MrTable<P>,
    pub(crate) pd: &'a P::Pd,
}

impl<P: Provider> ConnOps for IserOps<'_, P> {
    fn send_pdu(&mut self, bhs: &[u8; BHS_LEN], data: &[u8], invalidate: Option<u32>) -> bool {
        let io = &mut *self.io;
        if io.closing || io.sq_free() == 0 {
            io.busy += 1;
            return false;
        }
        let len = ISER_HDR_LEN + BHS_LEN + data.len();
        let slot = if len <= SMALL_SLOT {
            io.free_small.pop().or_else(|| io.free_large.pop())
        } else if len <= LARGE_SLOT {
            io.free_large.pop()
        } else {
            None
        };
        let Some(slot) = slot else {
            io.busy += 1;
            return false;
        };
        let s = usize::from(slot);
        let off = if s < io.small {
            s * SMALL_SLOT
        } else {
            io.small * SMALL_SLOT + (s - io.small) * LARGE_SLOT
        };
        let b = &mut io.send_buf.as_mut_slice()[off..off + len];
        b[..ISER_HDR_LEN].copy_from_slice(&IserHeader::PLAIN.encode());
        b[ISER_HDR_LEN..ISER_HDR_LEN + BHS_LEN].copy_from_slice(bhs);
        b[ISER_HDR_LEN + BHS_LEN..].copy_from_slice(data);
        io.posted += 1;
        io.slot_seq[s] = io.posted;
        io.signaled_inflight += 1;
        io.pend.push(PendWr {
            token: Token::new(WrKind::Send, io.slot, io.gen, u32::from(slot)),
            op: match invalidate {
                Some(k) => PendOp::SendInv(k),
                None => PendOp::Send,
            },
            sge: Sge {
                addr: (io.send_buf.addr() + off) as u64,
                length: len as u32,
                lkey: io.send_lkey,
            },
            signaled: true,
        });
        true
    }

    fn read_data(
        &mut self,
        task: u16,
        from: Stag,
        buf: &DmaBuf,
        offset: usize,
        len: usize,
    ) -> Transfer {
        let io = &mut *self.io;
        if io.closing {
            return Transfer::Busy;
        }
        if io.rd_avail == 0 || io.sq_free() < 2 {
            io.busy += 1;
            return Transfer::Busy;
        }
        let Some(lkey) = io.lkey(self.shared, self.pd, buf) else {
            io.disconnect_requested = true;
            return Transfer::Busy;
        };
        io.posted += 1;
        if let Some(s) = io.read_seq.get_mut(usize::from(task)) {
            *s = io.posted;
        }
        io.rd_avail -= 1;
        io.signaled_inflight += 1;
        io.pend.push(PendWr {
            token: Token::new(WrKind::Read, io.slot, io.gen, u32::from(task)),
            op: PendOp::Read(RemoteAddr {
                addr: from.va,
                rkey: from.stag,
            }),
            sge: Sge {
                addr: (buf.addr() + offset) as u64,
                length: len as u32,
                lkey,
            },
            signaled: true,
        });
        Transfer::Pending
    }

    fn write_data(&mut self, task: u16, to: Stag, buf: &DmaBuf, len: usize) -> Transfer {
        let io = &mut *self.io;
        // Room for the WRITE and the response SEND behind it.
        if io.closing || io.sq_free() < 2 {
            io.busy += 1;
            return Transfer::Busy;
        }
        let Some(lkey) = io.lkey(self.shared, self.pd, buf) else {
            io.disconnect_requested = true;
            return Transfer::Busy;
        };
        io.posted += 1;
        // Signaled: the task buffer is the WRITE's source until the device
        // has read it, so the core holds the task (and its response) until
        // this completes. Unsignaled, the next command in the same slot
        // overwrote data not yet sent (seen with Linux's parallel LUN scan
        // on rxe: READ CAPACITY data of one LUN reached the other).
        if let Some(s) = io.read_seq.get_mut(usize::from(task)) {
            *s = io.posted;
        }
        io.signaled_inflight += 1;
        io.pend.push(PendWr {
            token: Token::new(WrKind::Data, io.slot, io.gen, u32::from(task)),
            op: PendOp::Write(RemoteAddr {
                addr: to.va,
                rkey: to.stag,
            }),
            sge: Sge {
                addr: buf.addr() as u64,
                length: len as u32,
                lkey,
            },
            signaled: true,
        });
        Transfer::Pending
    }

    fn close(&mut self) {
        self.io.disconnect_requested = true;
    }

    fn close_after_logout(&mut self) {
        self.io.disconnect_requested = true;
        self.io.logged_out = true;
    }

    fn abort(&mut self) {
        self.io.disconnect_requested = true;
        self.io.abort_requested = true;
    }
}

/// One connection of a poll group. Dropped in field order: the QP first
/// (no DMA into our buffers after it), then the core (its task buffers go
/// back to the target's pool; bdev I/O in flight owns its buffer and
/// returns it when it completes), then the send slots.
pub(crate) struct Conn<P: Provider> {
    pub(crate) link: Link<P>,
    pub(crate) core: Connection,
    pub(crate) io: ConnIo<P>,
    /// The registration of the send slots, kept while the connection lives.
    pub(crate) _send_mr: P::Mr,
}

impl<P: Provider> GroupConn<P> for Conn<P> {
    fn link(&self) -> &Link<P> {
        &self.link
    }

    fn link_mut(&mut self) -> &mut Link<P> {
        &mut self.link
    }

    fn closing(&mut self) {
        self.io.closing = true;
    }

    /// Live, no task in flight, nothing queued to post, no signaled work
    /// request and no RDMA READ outstanding.
    fn settled(&self) -> bool {
        self.link.is_live()
            && self.io.pend.is_empty()
            && self.io.signaled_inflight == 0
            && self.io.rd_avail == self.io.rd_depth
            && self.core.tasks_in_flight() == 0
    }
}
