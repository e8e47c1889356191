//! A connected QP's view of its peer: the shared link memfd (rings and
//! control words), the peer's MR table (read-only) and arenas, and the
//! peer's CQ eventfds.

use super::arena_slots::SlotArena;
use super::cm::Conn;
use super::ring::{
    ctl_off, publish, CTL_CONSUMER_ARMED, CTL_FATAL, CTL_PRODUCER_ARMED, CTL_SIGERR,
};
use super::rkey_cache::RemoteKeyCache;
use super::shm::Shm;
use crate::sig::{SigErrKind, SigError};
use std::cell::{Cell, RefCell};
use std::os::fd::OwnedFd;
use std::rc::{Rc, Weak};
use std::sync::atomic::Ordering;

/// Peer-state words (`CTL_FATAL` of the direction a side produces).
pub(crate) const FATAL_ACCESS: u32 = 1;
/// The side's QP is in ERR.
pub(crate) const FATAL_ERR: u32 = 2;

/// The peer's arenas by slot, filled as `ARENA` messages arrive.
pub(crate) type PeerArenas = Rc<RefCell<Vec<Option<SlotArena>>>>;

pub(crate) struct Link {
    pub(crate) shm: Shm,
    /// Direction we produce into.
    pub(crate) out_d: usize,
    /// Direction we consume from.
    pub(crate) in_d: usize,
    /// Local (unpublished) producer tail.
    pub(crate) out_tail: Cell<u64>,
    /// Last published tail.
    pub(crate) published: Cell<u64>,
    /// Last consumer head seen by the producer (refreshed when full).
    pub(crate) head_cache: Cell<u64>,
    /// Local consumer head.
    pub(crate) in_head: Cell<u64>,
    /// Whether a NAK from the peer was handled.
    pub(crate) nak_done: Cell<bool>,
    pub(crate) peer_table: Shm,
    pub(crate) peer_tag: u8,
    pub(crate) peer_arenas: PeerArenas,
    /// The peer's regular MR keys resolved last (RDMA WRITE/READ targets).
    pub(crate) rkeys: RemoteKeyCache,
    pub(crate) peer_recv_efd: OwnedFd,
    pub(crate) peer_send_efd: OwnedFd,
    /// The peer's receive-CQ arm count we last woke it for.
    pub(crate) recv_armed_seen: Cell<u32>,
    /// The peer's send-CQ arm count we last woke it for.
    pub(crate) send_armed_seen: Cell<u32>,
    pub(crate) conn: Weak<Conn>,
}

/// Arm the armed word at `off` of `shm` (ours to write: one more arm), then
/// fence, before the caller looks for work that is already there (see
/// [`Link::wake_if_armed`]).
pub(crate) fn arm(shm: &Shm, off: usize) {
    let w = shm.u32_at(off);
    w.store(w.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
    std::sync::atomic::fence(Ordering::SeqCst);
}

impl Link {
    pub(crate) fn out_ctl(&self, field: usize) -> usize {
        ctl_off(self.out_d) + field
    }

    pub(crate) fn in_ctl(&self, field: usize) -> usize {
        ctl_off(self.in_d) + field
    }

    /// Tell the peer our QP state (FATAL_*), once.
    pub(crate) fn set_fatal(&self, code: u32) {
        let w = self.shm.u32_at(self.out_ctl(CTL_FATAL));
        if w.load(Ordering::Relaxed) == 0 {
            w.store(code, Ordering::Release);
        }
        self.wake_peer_recv();
        self.wake_peer_send();
    }

    /// The peer's state word.
    pub(crate) fn peer_fatal(&self) -> u32 {
        self.shm
            .u32_at(self.in_ctl(CTL_FATAL))
            .load(Ordering::Acquire)
    }

    /// Publish the local producer tail if it moved (one shared-index store
    /// for everything produced since the last call) and wake the peer's
    /// receive CQ if it is armed.
    pub(crate) fn publish_out(&self) {
        let t = self.out_tail.get();
        if t != self.published.get() {
            self.published.set(t);
            publish(&self.shm, self.out_d, t);
            self.wake_peer_recv();
        }
    }

    /// After publishing records: wake the peer's receive CQ if it is armed.
    pub(crate) fn wake_peer_recv(&self) {
        self.wake_if_armed(
            self.out_ctl(CTL_CONSUMER_ARMED),
            &self.recv_armed_seen,
            &self.peer_recv_efd,
        );
    }

    /// After consuming records or NAKing: wake the peer's send CQ if armed.
    pub(crate) fn wake_peer_send(&self) {
        self.wake_if_armed(
            self.in_ctl(CTL_PRODUCER_ARMED),
            &self.send_armed_seen,
            &self.peer_send_efd,
        );
    }

    /// Wake the peer through `efd` if it armed the word at `off` since we
    /// last did (`seen`: the arm count we last answered).
    ///
    /// The armed words are single-writer: the peer counts its arms
    /// ([`arm`]), we only read, so a batch costs a load of a line the peer
    /// rarely writes, not an atomic read-modify-write of it. The fence pairs
    /// with the one in [`arm`] (store, fence, load on both sides): either
    /// the peer, after arming, sees what we published before this call, or
    /// we see its arm here and wake it; both may happen (one spare wake-up,
    /// as a one-shot CQ event allows).
    #[inline]
    fn wake_if_armed(&self, off: usize, seen: &Cell<u32>, efd: &OwnedFd) {
        std::sync::atomic::fence(Ordering::SeqCst);
        let armed = self.shm.u32_at(off).load(Ordering::Relaxed);
        if armed != seen.get() {
            seen.set(armed);
            let _ = rustix::io::write(efd, &1u64.to_ne_bytes());
        }
    }

    /// Report a PI error found in the peer's integrity MR (first one wins
    /// until the peer takes it).
    pub(crate) fn post_sig_error(&self, e: &SigError) {
        let o = self.out_ctl(CTL_SIGERR);
        if self.shm.u32_at(o).load(Ordering::Acquire) != 0 {
            return;
        }
        let kind = match e.kind {
            SigErrKind::BadGuard => 1,
            SigErrKind::BadRefTag => 2,
            SigErrKind::BadAppTag => 3,
        };
        self.shm.u32_at(o + 4).store(e.key, Ordering::Relaxed);
        self.shm.u32_at(o + 8).store(kind, Ordering::Relaxed);
        self.shm.u64_at(o + 16).store(e.expected, Ordering::Relaxed);
        self.shm.u64_at(o + 24).store(e.actual, Ordering::Relaxed);
        self.shm.u64_at(o + 32).store(e.offset, Ordering::Relaxed);
        self.shm.u32_at(o).store(1, Ordering::Release);
    }

    /// Take a PI error the peer found in our MR with index bits `idx`.
    pub(crate) fn take_sig_error(&self, idx: u32) -> Option<SigError> {
        let o = self.in_ctl(CTL_SIGERR);
        if self.shm.u32_at(o).load(Ordering::Acquire) == 0 {
            return None;
        }
        let key = self.shm.u32_at(o + 4).load(Ordering::Relaxed);
        if super::mr::key_index(key) != idx {
            return None;
        }
        let kind = match self.shm.u32_at(o + 8).load(Ordering::Relaxed) {
            2 => SigErrKind::BadRefTag,
            3 => SigErrKind::BadAppTag,
            _ => SigErrKind::BadGuard,
        };
        let e = SigError {
            kind,
            expected: self.shm.u64_at(o + 16).load(Ordering::Relaxed),
            actual: self.shm.u64_at(o + 24).load(Ordering::Relaxed),
            offset: self.shm.u64_at(o + 32).load(Ordering::Relaxed),
            key,
        };
        self.shm.u32_at(o).store(0, Ordering::Release);
        Some(e)
    }

    /// Make sure arenas announced by the peer so far are mapped (rare: an
    /// rkey naming a slot we have not seen yet).
    pub(crate) fn refresh_arenas(&self) {
        if let Some(c) = self.conn.upgrade() {
            c.pump_arenas();
        }
    }
}
