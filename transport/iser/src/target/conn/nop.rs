//! The target's keep-alive ping (SPDK's `nop_in_interval` / `nop_timeout`,
//! RFC 7143 §11.19): a connection in full feature phase that has received
//! no PDU for [`NopPing::interval`] gets a NOP-In with ITT 0xffffffff and
//! a Target Transfer Tag of its own, which asks the initiator for a NOP-Out
//! echoing that tag. When no PDU at all arrives within
//! [`NopPing::timeout`] of the ping, the initiator is taken for gone (an
//! alive socket or QP, but a silent peer): the connection closes, giving
//! back its task buffers, session and seat as any close does, and the
//! target counts it ([`IscsiTarget::nop_timeouts`](crate::target::IscsiTarget::nop_timeouts)).
//!
//! A connection still in login gets no ping: one that has received no PDU
//! for [`NopPing::timeout`] is dropped the same way (an initiator that
//! opened a connection and went silent before full feature phase would
//! otherwise hold its seat for ever); it is logged, not counted as a NOP
//! timeout.
//!
//! Any PDU counts as a sign of life (SPDK clears its outstanding ping only
//! on a NOP-Out and pings every interval whatever the traffic; here a busy
//! connection is never pinged). The check is one comparison of the
//! reactor's cached loop time per connection per poll: no timer, no lock,
//! no allocation.

use std::time::Duration;

use super::{Connection, Phase};
use crate::pdu::{Bhs, Lun, NopIn, RESERVED_TAG};
use crate::target::ops::ConnOps;

/// When the target pings a silent initiator and when it gives up on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NopPing {
    /// Silence (no PDU received) after which the target sends a NOP-In
    /// ping (SPDK `nop_in_interval`, 30 s); zero: never ping.
    pub interval: Duration,
    /// How long after its ping the target waits for any PDU before it
    /// drops the connection (SPDK `nop_timeout`, 60 s).
    pub timeout: Duration,
}

impl Default for NopPing {
    fn default() -> Self {
        NopPing {
            interval: Duration::from_secs(30),
            timeout: Duration::from_secs(60),
        }
    }
}

/// The ping state of one connection, in the reactor's nanoseconds.
#[derive(Debug, Clone, Copy)]
pub(super) struct NopState {
    interval_ns: u64,
    timeout_ns: u64,
    /// When the last PDU arrived (or the connection started).
    last_rx: u64,
    /// The TTT of the ping waiting for an answer (`RESERVED_TAG`: none).
    ttt: u32,
    /// When that ping went out.
    sent: u64,
    /// The TTT of the next ping.
    next_ttt: u32,
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl NopState {
    pub(super) fn new(p: NopPing, now: u64) -> NopState {
        NopState {
            interval_ns: ns(p.interval),
            timeout_ns: ns(p.timeout),
            last_rx: now,
            ttt: RESERVED_TAG,
            sent: 0,
            next_ttt: 1,
        }
    }

    /// A PDU arrived at `now`: the initiator lives; no ping is outstanding.
    #[inline]
    pub(super) fn touch(&mut self, now: u64) {
        self.last_rx = now;
        self.ttt = RESERVED_TAG;
    }

    /// The TTT of the ping waiting for an answer, if any.
    pub(super) fn outstanding(&self) -> Option<u32> {
        (self.ttt != RESERVED_TAG).then_some(self.ttt)
    }
}

/// What [`Connection::check_nop`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NopCheck {
    /// Nothing due.
    Quiet,
    /// A ping went out.
    Pinged,
    /// No answer within the timeout: the connection closed.
    TimedOut,
    /// Silent in login for the timeout: the connection closed.
    LoginTimedOut,
}

impl Connection {
    /// Ping a silent initiator, or drop one that left a ping unanswered
    /// (called from [`Connection::poll`]).
    pub(super) fn check_nop(&mut self, ops: &mut dyn ConnOps) -> NopCheck {
        let n = &self.nop;
        match self.phase {
            Phase::Full if n.interval_ns > 0 => {}
            Phase::Login(_) => {
                let now = self.reactor.now_ns();
                if now.saturating_sub(n.last_rx) < n.timeout_ns {
                    return NopCheck::Quiet;
                }
                log::warn!(
                    "iscsi: a connection in login sent nothing for {} ms (nop_timeout), dropping it",
                    n.timeout_ns / 1_000_000
                );
                self.abort(ops);
                return NopCheck::LoginTimedOut;
            }
            _ => return NopCheck::Quiet,
        }
        let now = self.reactor.now_ns();
        if let Some(ttt) = n.outstanding() {
            if now.saturating_sub(n.sent) < n.timeout_ns {
                return NopCheck::Quiet;
            }
            self.target.nop_timed_out();
            log::warn!(
                "iscsi: session {:#x} of {}: no answer to NOP-In ping {ttt:#x} within {} ms (nop_timeout), dropping the connection",
                self.tsih.unwrap_or(0),
                self.outcome
                    .as_ref()
                    .map_or("?", |o| o.initiator_name.as_str()),
                n.timeout_ns / 1_000_000
            );
            self.abort(ops);
            return NopCheck::TimedOut;
        }
        if now.saturating_sub(n.last_rx) < n.interval_ns {
            return NopCheck::Quiet;
        }
        let ttt = n.next_ttt;
        // A ping carries the next StatSN without taking it (RFC 7143
        // §11.19: only a NOP-In answering a NOP-Out advances StatSN).
        let ping = NopIn {
            lun: Lun::from_index(0),
            itt: RESERVED_TAG,
            ttt,
            stat_sn: self.stat_sn,
            exp_cmd_sn: self.window.exp_cmd_sn(),
            max_cmd_sn: self.window.max_cmd_sn(),
        };
        if !ops.send_pdu(&Bhs::NopIn(ping).encode(0, 0), &[], None) {
            // No send slot now: tried again at the next poll.
            return NopCheck::Quiet;
        }
        let n = &mut self.nop;
        n.ttt = ttt;
        n.sent = now;
        n.next_ttt = match ttt.wrapping_add(1) {
            RESERVED_TAG => 1,
            t => t,
        };
        self.stats.nop_pings += 1;
        NopCheck::Pinged
    }
}
