//! Fault injection for tests (soft provider only): kill a connection, delay
//! a QP, stall a CQ, starve an SRQ, tear the inbound ring (what a peer that
//! crashed mid-publication could leave). Dropping a peer process
//! mid-transfer needs no hook: kill the process; the survivor's CM socket
//! hangs up.

use std::sync::atomic::Ordering;

use super::cm::SoftCmId;
use super::cq::SoftCq;
use super::qp::SoftQp;
use super::ring::{ctl_off, CTL_TAIL, RING_SIZE};
use super::srq::SoftSrq;

/// A fault to inject into a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Break the connection as if the peer had crashed.
    KillConnection,
    /// Skip the QP's next `n` progress steps (CQ polls touching it): its
    /// sends, acknowledgements and receives are delayed.
    Delay(u32),
    /// Make the inbound ring's tail (written by the peer) impossible, as a
    /// peer dying in the middle of a broken write could: the survivor must
    /// fail the QP (`QpFatal`, flush), never read out of bounds or hang.
    TearInboundRing,
}

/// Inject `fault` into a connection and its QP.
pub fn inject(id: &SoftCmId, qp: &SoftQp, fault: Fault) {
    match fault {
        Fault::KillConnection => id.kill(),
        Fault::Delay(n) => qp.0.stall.set(n),
        Fault::TearInboundRing => {
            if let Some(l) = qp.0.link.borrow().as_ref() {
                let head = l.in_head.get();
                l.shm
                    .u64_at(ctl_off(l.in_d) + CTL_TAIL)
                    .store(head.wrapping_add(3 * RING_SIZE + 8), Ordering::Release);
            }
        }
    }
}

/// Stall a CQ: its next `polls` polls return no completion and drive no
/// progress (a consumer that stopped polling); work stays queued.
pub fn stall_cq(cq: &SoftCq, polls: u32) {
    cq.0.stall.set(polls);
}

/// Starve an SRQ: for its next `takes` attempts it hands out no receive, as
/// if empty (senders see RNR and wait or fail per their retry count).
pub fn starve_srq(srq: &SoftSrq, takes: u32) {
    srq.0.starve.set(takes);
}
