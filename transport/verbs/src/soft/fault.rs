//! Fault injection for tests (soft provider only): kill a connection, delay
//! a QP, corrupt nothing. Dropping a peer process mid-transfer needs no hook:
//! kill the process; the survivor's CM socket hangs up.

use super::cm::SoftCmId;
use super::qp::SoftQp;

/// A fault to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Break the connection as if the peer had crashed.
    KillConnection,
    /// Skip the QP's next `n` progress steps (CQ polls touching it): its
    /// sends, acknowledgements and receives are delayed.
    Delay(u32),
}

/// Inject `fault` into a connection and its QP.
pub fn inject(id: &SoftCmId, qp: &SoftQp, fault: Fault) {
    match fault {
        Fault::KillConnection => id.kill(),
        Fault::Delay(n) => qp.0.stall.set(n),
    }
}
