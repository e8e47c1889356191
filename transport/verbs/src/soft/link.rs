//! A connected QP's view of its peer: the shared link memfd (rings and
//! control words), the peer's MR table (read-only) and arenas, and the
//! peer's CQ eventfds.

use std::cell::{Cell, RefCell};
use std::os::fd::OwnedFd;
use std::rc::{Rc, Weak};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use pollux_reactor::mem::DmaArena;

use super::cm::Conn;
use super::ring::{ctl_off, CTL_CONSUMER_ARMED, CTL_FATAL, CTL_PRODUCER_ARMED};
use super::shm::Shm;

/// Peer-state words (`CTL_FATAL` of the direction a side produces).
pub(crate) const FATAL_ACCESS: u32 = 1;
/// The side's QP is in ERR.
pub(crate) const FATAL_ERR: u32 = 2;

/// The peer's arenas by slot, filled as `ARENA` messages arrive.
pub(crate) type PeerArenas = Rc<RefCell<Vec<Option<Arc<DmaArena>>>>>;

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
    /// Local consumer head.
    pub(crate) in_head: Cell<u64>,
    /// Whether a NAK from the peer was handled.
    pub(crate) nak_done: Cell<bool>,
    pub(crate) peer_table: Shm,
    pub(crate) peer_tag: u8,
    pub(crate) peer_arenas: PeerArenas,
    pub(crate) peer_recv_efd: OwnedFd,
    pub(crate) peer_send_efd: OwnedFd,
    pub(crate) conn: Weak<Conn>,
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

    /// After publishing records: wake the peer's receive CQ if it is armed.
    pub(crate) fn wake_peer_recv(&self) {
        if self
            .shm
            .u32_at(self.out_ctl(CTL_CONSUMER_ARMED))
            .swap(0, Ordering::AcqRel)
            != 0
        {
            let _ = rustix::io::write(&self.peer_recv_efd, &1u64.to_ne_bytes());
        }
    }

    /// After consuming records or NAKing: wake the peer's send CQ if armed.
    pub(crate) fn wake_peer_send(&self) {
        if self
            .shm
            .u32_at(self.in_ctl(CTL_PRODUCER_ARMED))
            .swap(0, Ordering::AcqRel)
            != 0
        {
            let _ = rustix::io::write(&self.peer_send_efd, &1u64.to_ne_bytes());
        }
    }

    /// Make sure arenas announced by the peer so far are mapped (rare: an
    /// rkey naming a slot we have not seen yet).
    pub(crate) fn refresh_arenas(&self) {
        if let Some(c) = self.conn.upgrade() {
            c.pump_arenas();
        }
    }
}
