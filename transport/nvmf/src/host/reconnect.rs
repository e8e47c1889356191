//! Controller loss and reconnect, in the manner of Linux's
//! `--reconnect-delay` / `--ctrl-loss-tmo`.
//!
//! ```text
//!            admin queue dies, keep-alive times out,
//!            or an I/O queue reports a failure
//!   Live ─────────────────────────────────────────> Reconnecting
//!    ^                                                 │ every reconnect_delay:
//!    └──── Connect, enable, Identify succeeded ────────┤ Connect/enable/Identify again
//!          (generation + 1; I/O queues reconnect)      │
//!                                                      └─ ctrl_loss_tmo passed ─> Failed
//! ```
//!
//! The admin side ([`Controller::poll_recover`](super::Controller::poll_recover))
//! drives the state machine on its reactor. The I/O side (any reactor)
//! shares a [`CtrlLink`]: when one of its queue pairs dies it calls
//! [`CtrlLink::report_failure`], then [`CtrlLink::reconnect_io`] (control
//! path: only while a queue is dead) until the controller is back (a new
//! queue pair) or [`Failed`](CtrlState::Failed) (a typed error: new I/O
//! fails fast). Outstanding I/O of a dead queue completes with
//! [`IoError::Aborted`](super::IoError::Aborted) or
//! [`IoError::TimedOut`](super::IoError::TimedOut) as before.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use pollux_reactor::sync::{Mutex, MutexGuard};

use super::ctrlr::{connect_io_qpair, CtrlInfo};
use super::qpair::Qpair;
use super::transport::HostTransport;
use super::HostError;

/// Where a controller stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CtrlState {
    /// Connected and enabled.
    Live,
    /// Lost; a reconnect is tried every `reconnect_delay`.
    Reconnecting,
    /// Lost for good (`ctrl_loss_tmo` passed, or reconnects are off): new
    /// I/O fails with [`HostError::CtrlLost`].
    Failed,
}

impl CtrlState {
    fn code(self) -> u8 {
        match self {
            CtrlState::Live => 0,
            CtrlState::Reconnecting => 1,
            CtrlState::Failed => 2,
        }
    }

    fn from_code(c: u8) -> Self {
        match c {
            0 => CtrlState::Live,
            1 => CtrlState::Reconnecting,
            _ => CtrlState::Failed,
        }
    }
}

struct LinkInner {
    state: AtomicU8,
    /// Bumps at every successful (re)connect of the admin queue.
    generation: AtomicU64,
    reconnects: AtomicU64,
    reset_asked: AtomicBool,
    info: Mutex<CtrlInfo>,
    lost_because: Mutex<Option<HostError>>,
}

/// The controller's state as every reactor sees it (`Send + Sync`, cheap
/// to clone). Control path only: a mutex guards the controller's
/// [`CtrlInfo`], read when a queue pair (re)connects.
#[derive(Clone)]
pub struct CtrlLink(Arc<LinkInner>);

impl std::fmt::Debug for CtrlLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CtrlLink")
            .field("state", &self.state())
            .field("generation", &self.generation())
            .field("reconnects", &self.reconnects())
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl CtrlLink {
    /// A link for a freshly connected controller (generation 0, live).
    pub(crate) fn new(info: CtrlInfo) -> Self {
        CtrlLink(Arc::new(LinkInner {
            state: AtomicU8::new(CtrlState::Live.code()),
            generation: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            reset_asked: AtomicBool::new(false),
            info: Mutex::new(info),
            lost_because: Mutex::new(None),
        }))
    }

    /// The controller's state.
    pub fn state(&self) -> CtrlState {
        CtrlState::from_code(self.0.state.load(Ordering::Acquire))
    }

    /// How many times the controller was connected again (0 at first).
    pub fn generation(&self) -> u64 {
        self.0.generation.load(Ordering::Acquire)
    }

    /// Successful reconnects so far.
    pub fn reconnects(&self) -> u64 {
        self.0.reconnects.load(Ordering::Relaxed)
    }

    /// What the host knows about the controller now (after a reconnect:
    /// the new controller id and namespaces).
    pub fn info(&self) -> CtrlInfo {
        lock(&self.0.info).clone()
    }

    /// Why the controller was lost last (`None` while it never was).
    pub fn lost_because(&self) -> Option<HostError> {
        lock(&self.0.lost_because).clone()
    }

    /// An I/O queue of this controller died (transport error, I/O
    /// timeout): ask the admin side to recover the whole controller.
    pub fn report_failure(&self) {
        if self.state() == CtrlState::Live {
            self.0.reset_asked.store(true, Ordering::Release);
        }
    }

    /// Whether an I/O queue asked for recovery (and forget the request).
    pub(crate) fn take_reset_request(&self) -> bool {
        self.0.reset_asked.swap(false, Ordering::AcqRel)
    }

    pub(crate) fn set_reconnecting(&self, why: HostError) {
        *lock(&self.0.lost_because) = Some(why);
        self.0
            .state
            .store(CtrlState::Reconnecting.code(), Ordering::Release);
    }

    pub(crate) fn set_failed(&self, why: HostError) {
        *lock(&self.0.lost_because) = Some(why);
        self.0
            .state
            .store(CtrlState::Failed.code(), Ordering::Release);
    }

    /// The admin side connected again: publish the new controller.
    pub(crate) fn set_live(&self, info: CtrlInfo) {
        *lock(&self.0.info) = info;
        self.0.reconnects.fetch_add(1, Ordering::Relaxed);
        self.0.reset_asked.store(false, Ordering::Release);
        self.0.generation.fetch_add(1, Ordering::AcqRel);
        self.0
            .state
            .store(CtrlState::Live.code(), Ordering::Release);
    }

    /// The error new I/O gets once the controller failed.
    pub fn lost_error(&self) -> HostError {
        let why = self
            .lost_because()
            .map_or_else(|| "controller failed".to_string(), |e| e.to_string());
        HostError::CtrlLost(why)
    }

    /// Reconnect a dead I/O queue pair once the controller is back.
    ///
    /// `seen` is the [generation](Self::generation) the caller's queue was
    /// connected under; it is updated on success. Returns `Ok(None)` while
    /// the controller is still reconnecting (or was reconnected but this
    /// attempt failed: the controller is then reset again), `Ok(Some(qp))`
    /// with the new queue pair.
    ///
    /// # Errors
    /// [`HostError::CtrlLost`] once the controller [failed](CtrlState::Failed).
    pub fn reconnect_io<U: HostTransport>(
        &self,
        t: &U,
        seen: &mut u64,
        qid: u16,
        entries: u16,
        inline_cap: Option<u32>,
    ) -> Result<Option<Qpair<U::Queue>>, HostError> {
        match self.state() {
            CtrlState::Failed => return Err(self.lost_error()),
            CtrlState::Reconnecting => return Ok(None),
            CtrlState::Live => {}
        }
        let generation = self.generation();
        if generation <= *seen {
            // The controller has not noticed the loss yet.
            self.report_failure();
            return Ok(None);
        }
        let info = self.info();
        match connect_io_qpair(t, &info, qid, entries, inline_cap) {
            Ok(qp) => {
                *seen = generation;
                Ok(Some(qp))
            }
            Err(e) => {
                log::warn!("nvmf host: reconnecting I/O queue {qid}: {e}");
                // Lost again right away: let the admin side start over.
                *seen = generation;
                self.report_failure();
                Ok(None)
            }
        }
    }
}
