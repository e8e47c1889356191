//! [`Link`]: the verbs half of one target connection (its QP, its CM id,
//! the CQ entries it reserved, whether it is live or closing), and
//! [`GroupConn`], what a poll group needs of a transport's connection.

use crate::provider::{CmId, Provider, QueuePair};
use crate::types::{QpAttr, QpState};
use crate::CmEvent;

/// A connection's QP and CM id, and its state: live, or closing (the CM
/// disconnect sent and the QP in ERR, its work requests flushing).
pub struct Link<P: Provider> {
    /// The queue pair (dropped before the CM id: no DMA after it).
    pub qp: P::Qp,
    /// The connection-manager id.
    pub cm: P::CmId,
    qp_num: u32,
    cqes: u32,
    live: bool,
}

impl<P: Provider> std::fmt::Debug for Link<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("qp_num", &self.qp_num)
            .field("cqes", &self.cqes)
            .field("live", &self.live)
            .finish()
    }
}

impl<P: Provider> Link<P> {
    /// A live link; `cqes` entries of the group's CQ are reserved for it.
    pub fn new(qp: P::Qp, cm: P::CmId, cqes: u32) -> Self {
        Link {
            qp_num: qp.qp_num(),
            qp,
            cm,
            cqes,
            live: true,
        }
    }

    /// The QP number.
    #[inline]
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// CQ entries reserved for this connection.
    pub fn cqes(&self) -> u32 {
        self.cqes
    }

    /// Whether the connection serves (closing has not begun).
    #[inline]
    pub fn is_live(&self) -> bool {
        self.live
    }

    /// Begin closing: CM disconnect (the peer sees a clean disconnect) and
    /// the QP to ERR, so its outstanding work requests complete flushed.
    /// `false` when closing had begun already.
    pub fn begin_close(&mut self) -> bool {
        if !self.live {
            return false;
        }
        self.live = false;
        let _ = self.cm.disconnect();
        if self.qp.state() != QpState::Err {
            let _ = self.qp.modify(&QpAttr::to(QpState::Err));
        }
        true
    }

    /// Read the CM events waiting on this connection (control path: a
    /// system call on the soft provider); `true` when the peer left
    /// (disconnected, or the connection failed).
    pub fn peer_left(&mut self) -> bool {
        let mut left = false;
        while let Ok(Some(ev)) = self.cm.get_event() {
            left |= matches!(ev, CmEvent::Disconnected | CmEvent::ConnectError);
        }
        left
    }
}

/// A transport's connection as a poll group ([`RdmaGroup`](super::RdmaGroup))
/// holds it.
pub trait GroupConn<P: Provider> {
    /// Its QP and CM id.
    fn link(&self) -> &Link<P>;
    /// Its QP and CM id, mutably.
    fn link_mut(&mut self) -> &mut Link<P>;
    /// Closing begins (called once, before the disconnect): post nothing
    /// more; what is posted completes flushed.
    fn closing(&mut self);
    /// Whether nothing of the connection moves unless the peer sends or a
    /// timer fires: no request in flight, no work request posted and not
    /// completed, nothing waiting to be posted. A group whose connections
    /// are all settled arms its CQ and lets a sleeping reactor sleep
    /// (`RdmaGroup::end_round`). The default, `false`, keeps it polling.
    fn settled(&self) -> bool {
        false
    }
}
