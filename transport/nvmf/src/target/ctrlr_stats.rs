//! Counters of a subsystem's controllers' control traffic: Keep Alive
//! commands, keep-alive timeouts and asynchronous events delivered. The
//! `pollux-tgt` stats file sums them over the subsystems.
//!
//! Control path only (one relaxed atomic add per Keep Alive, timeout or
//! event; never per I/O).

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of [`CtrlCounters`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CtrlCounterSnapshot {
    /// Keep Alive commands answered.
    pub keep_alives: u64,
    /// Controllers torn down because no Keep Alive came within KATO.
    pub keep_alive_timeouts: u64,
    /// Asynchronous events delivered (AERs completed with an event).
    pub events: u64,
    /// Controllers created (admin Connects accepted).
    pub controllers_created: u64,
}

impl CtrlCounterSnapshot {
    /// Field-wise sum (for totals over subsystems).
    pub fn add(&mut self, o: &CtrlCounterSnapshot) {
        self.keep_alives += o.keep_alives;
        self.keep_alive_timeouts += o.keep_alive_timeouts;
        self.events += o.events;
        self.controllers_created += o.controllers_created;
    }
}

/// The live counters (one set per subsystem).
#[derive(Debug, Default)]
pub struct CtrlCounters {
    keep_alives: AtomicU64,
    keep_alive_timeouts: AtomicU64,
    events: AtomicU64,
    controllers_created: AtomicU64,
}

impl CtrlCounters {
    pub(crate) fn keep_alive(&self) {
        self.keep_alives.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn keep_alive_timeout(&self) {
        self.keep_alive_timeouts.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn event(&self) {
        self.events.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn controller_created(&self) {
        self.controllers_created.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn snapshot(&self) -> CtrlCounterSnapshot {
        CtrlCounterSnapshot {
            keep_alives: self.keep_alives.load(Ordering::Relaxed),
            keep_alive_timeouts: self.keep_alive_timeouts.load(Ordering::Relaxed),
            events: self.events.load(Ordering::Relaxed),
            controllers_created: self.controllers_created.load(Ordering::Relaxed),
        }
    }
}
