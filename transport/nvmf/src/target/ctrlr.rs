//! Controllers (dynamic model): created by an admin Connect, one per host
//! association, with the CC/CSTS state machine, negotiated queue count,
//! keep-alive timeout, asynchronous event configuration, pending events,
//! the changed-namespace list and the error log.
//!
//! A `Controller` is shared (`Arc`) by its admin queue and its I/O queues,
//! which may live on other cores. Its mutable state sits behind a `Mutex`
//! taken only by admin and fabrics commands and control-path events; the I/O
//! path reads two atomics (`ready`, `dead`).

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use pollux_reactor::sync::{Mutex, MutexGuard};

use pollux_reactor::CoreId;

use super::health::{DEFAULT_OVER_TEMP_K, DEFAULT_UNDER_TEMP_K};
use super::subsystem::Subsystem;
use crate::spec::features::{AsyncEvent, AEN_NS_ATTR};
use crate::spec::log_page::{ErrorLogEntry, CHANGED_NS_MAX};
use crate::spec::property::{Cc, Csts, SHST_COMPLETE};
use crate::spec::transport_id::TrType;

/// Error log entries kept per controller (Identify ELPE + 1).
pub const ERROR_LOG_ENTRIES: usize = 64;
/// Pending asynchronous events kept per controller.
const MAX_PENDING_EVENTS: usize = 8;

/// The mutable state of a controller.
#[derive(Debug)]
pub(crate) struct CtrlrState {
    pub(crate) cc: Cc,
    pub(crate) csts: Csts,
    /// Keep-alive timeout in ms (0 = none).
    pub(crate) kato_ms: u32,
    /// Asynchronous Event Configuration.
    pub(crate) aec: u32,
    /// Number of I/O queues granted (1-based).
    pub(crate) io_queues: u16,
    /// Whether Set Features Number of Queues ran.
    pub(crate) io_queues_set: bool,
    /// Connected I/O queue ids.
    pub(crate) io_qids: BTreeSet<u16>,
    pub(crate) events: VecDeque<AsyncEvent>,
    /// A namespace notice went out and the host has not read log 0x04 yet.
    pub(crate) ns_notice_masked: bool,
    /// A discovery notice went out and the host has not read log 0x70 yet.
    pub(crate) disc_notice_masked: bool,
    pub(crate) changed_ns: Vec<u32>,
    pub(crate) changed_ns_overflow: bool,
    pub(crate) error_log: VecDeque<ErrorLogEntry>,
    pub(crate) error_count: u64,
    /// CSTS.RDY went to 1 and no shutdown notification followed yet: the
    /// controller going away now is an unsafe shutdown.
    pub(crate) unsafe_if_lost: bool,
    /// Temperature Threshold feature, composite sensor: over and under (K).
    pub(crate) over_temp_k: u16,
    pub(crate) under_temp_k: u16,
    /// Arbitration feature (CDW11 as set, reserved bits clear): kept for
    /// Get Features; one queue per fabrics connection arbitrates nothing.
    pub(crate) arbitration: u32,
}

/// A controller.
#[derive(Debug)]
pub struct Controller {
    cntlid: u16,
    subsys: Arc<Subsystem>,
    hostnqn: String,
    hostid: [u8; 16],
    trtype: TrType,
    admin_core: CoreId,
    ready: AtomicBool,
    dead: AtomicBool,
    events_pending: AtomicBool,
    state: Mutex<CtrlrState>,
}

impl Controller {
    pub(crate) fn new(
        cntlid: u16,
        subsys: Arc<Subsystem>,
        hostnqn: String,
        hostid: [u8; 16],
        kato_ms: u32,
        trtype: TrType,
        admin_core: CoreId,
    ) -> Arc<Controller> {
        let io_queues = subsys.max_io_queues();
        Arc::new(Controller {
            cntlid,
            subsys,
            hostnqn,
            hostid,
            trtype,
            admin_core,
            ready: AtomicBool::new(false),
            dead: AtomicBool::new(false),
            events_pending: AtomicBool::new(false),
            state: Mutex::new(CtrlrState {
                cc: Cc::default(),
                csts: Csts::default(),
                kato_ms,
                aec: 0,
                io_queues,
                io_queues_set: false,
                io_qids: BTreeSet::new(),
                events: VecDeque::with_capacity(MAX_PENDING_EVENTS),
                ns_notice_masked: false,
                disc_notice_masked: false,
                changed_ns: Vec::new(),
                changed_ns_overflow: false,
                error_log: VecDeque::with_capacity(ERROR_LOG_ENTRIES),
                error_count: 0,
                unsafe_if_lost: false,
                over_temp_k: DEFAULT_OVER_TEMP_K,
                under_temp_k: DEFAULT_UNDER_TEMP_K,
                arbitration: 0,
            }),
        })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, CtrlrState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Controller id.
    pub fn cntlid(&self) -> u16 {
        self.cntlid
    }

    /// The subsystem.
    pub fn subsystem(&self) -> &Arc<Subsystem> {
        &self.subsys
    }

    /// The host NQN of its Connect.
    pub fn hostnqn(&self) -> &str {
        &self.hostnqn
    }

    /// The host identifier of its Connect.
    pub fn hostid(&self) -> [u8; 16] {
        self.hostid
    }

    /// Transport type of its admin queue.
    pub fn trtype(&self) -> TrType {
        self.trtype
    }

    /// The core of its admin queue.
    pub fn admin_core(&self) -> CoreId {
        self.admin_core
    }

    /// Whether CC.EN = 1 and CSTS.RDY = 1 (I/O may run). One atomic load.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Whether the controller was torn down (its queues must disconnect).
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Current CC.
    pub fn cc(&self) -> Cc {
        self.lock().cc
    }

    /// Current CSTS.
    pub fn csts(&self) -> Csts {
        self.lock().csts
    }

    /// Keep-alive timeout in ms (0 = none).
    pub fn kato_ms(&self) -> u32 {
        self.lock().kato_ms
    }

    /// I/O queues granted (1-based).
    pub fn io_queues(&self) -> u16 {
        self.lock().io_queues
    }

    /// Connected I/O queue ids.
    pub fn io_qids(&self) -> Vec<u16> {
        self.lock().io_qids.iter().copied().collect()
    }

    /// Write CC (Property Set): the enable / disable / shutdown state
    /// machine. Enabling with an unsupported configuration sets CSTS.CFS
    /// (as the Linux target does).
    pub(crate) fn set_cc(&self, new: Cc) {
        let mut st = self.lock();
        let old = st.cc;
        st.cc = new;
        // A torn-down controller (keep-alive expiry: CFS) never starts again.
        if new.en && !old.en && !self.is_dead() {
            let io_ok = self.subsys.is_discovery() || (new.iosqes == 6 && new.iocqes == 4);
            let css_ok = super::conformance::css_supported(new.css);
            if !io_ok || new.mps != 0 || new.ams != 0 || !css_ok {
                st.csts.cfs = true;
            } else {
                // A good start clears the CFS of an earlier refused one
                // (the Linux target's nvmet_start_ctrl sets CSTS to RDY):
                // RDY with CFS would be a controller that looks ready and
                // refuses every command.
                st.csts.cfs = false;
                st.csts.rdy = true;
                st.unsafe_if_lost = true;
            }
        }
        if !new.en && old.en {
            // Controller reset: not ready; CC cleared.
            st.csts.rdy = false;
            st.cc = Cc::default();
        }
        if new.shn != 0 && old.shn == 0 {
            st.csts.rdy = false;
            st.csts.shst = SHST_COMPLETE;
            st.cc.en = false;
            st.unsafe_if_lost = false;
        }
        if new.shn == 0 && old.shn != 0 {
            st.csts.shst = 0;
        }
        let ready = st.cc.en && st.csts.rdy && !st.csts.cfs;
        self.ready.store(ready, Ordering::Release);
    }

    /// Fatal error: CSTS.CFS, the controller is torn down (its queues see
    /// [`is_dead`](Self::is_dead) and disconnect) and its cntlid freed.
    pub(crate) fn fatal(&self) {
        {
            let mut st = self.lock();
            st.csts.cfs = true;
            st.csts.rdy = false;
        }
        self.destroy();
    }

    /// No Keep Alive came within KATO: count it, then [`fatal`](Self::fatal).
    pub(crate) fn keep_alive_expired(&self) {
        self.subsys.counters().keep_alive_timeout();
        self.fatal();
    }

    /// Tear down: mark dead, leave the subsystem's table. Idempotent.
    pub(crate) fn destroy(&self) {
        self.ready.store(false, Ordering::Release);
        if !self.dead.swap(true, Ordering::AcqRel) {
            if std::mem::take(&mut self.lock().unsafe_if_lost) {
                self.subsys.health().unsafe_shutdown();
            }
            self.subsys.unregister_controller(self.cntlid);
            log::debug!(
                "nvmf: controller {} of {} destroyed",
                self.cntlid,
                self.subsys.nqn()
            );
        }
    }

    /// Add a connected I/O queue; `false` if that QID is connected already.
    pub(crate) fn add_io_qid(&self, qid: u16) -> bool {
        self.lock().io_qids.insert(qid)
    }

    /// Remove a connected I/O queue.
    pub(crate) fn remove_io_qid(&self, qid: u16) {
        self.lock().io_qids.remove(&qid);
    }

    /// Namespace `nsid` was added or removed.
    pub(crate) fn ns_changed(&self, nsid: u32) {
        let mut st = self.lock();
        if !st.changed_ns_overflow && !st.changed_ns.contains(&nsid) {
            if st.changed_ns.len() >= CHANGED_NS_MAX {
                st.changed_ns_overflow = true;
                st.changed_ns.clear();
            } else {
                st.changed_ns.push(nsid);
                st.changed_ns.sort_unstable();
            }
        }
        if st.aec & AEN_NS_ATTR != 0 && !st.ns_notice_masked {
            st.ns_notice_masked = true;
            Self::push_event(&mut st, AsyncEvent::NS_CHANGED);
            self.events_pending.store(true, Ordering::Release);
        }
    }

    /// Raise `ev` if the host enabled `aec_bit` (discovery change notices).
    pub(crate) fn raise_event(&self, ev: AsyncEvent, aec_bit: u32) {
        let mut st = self.lock();
        if st.aec & aec_bit == 0 || st.disc_notice_masked {
            return;
        }
        st.disc_notice_masked = true;
        Self::push_event(&mut st, ev);
        self.events_pending.store(true, Ordering::Release);
    }

    fn push_event(st: &mut CtrlrState, ev: AsyncEvent) {
        if st.events.len() < MAX_PENDING_EVENTS && !st.events.contains(&ev) {
            st.events.push_back(ev);
        }
    }

    /// Whether events wait for an AER (one atomic load).
    pub(crate) fn has_events(&self) -> bool {
        self.events_pending.load(Ordering::Acquire)
    }

    /// Take the oldest pending event.
    pub(crate) fn take_event(&self) -> Option<AsyncEvent> {
        let mut st = self.lock();
        let ev = st.events.pop_front();
        if st.events.is_empty() {
            self.events_pending.store(false, Ordering::Release);
        }
        drop(st);
        if ev.is_some() {
            self.subsys.counters().event();
        }
        ev
    }

    /// Record a failed admin command in the error log.
    pub(crate) fn log_error(&self, mut e: ErrorLogEntry) {
        let mut st = self.lock();
        st.error_count += 1;
        e.error_count = st.error_count;
        e.trtype = self.trtype.code();
        if st.error_log.len() == ERROR_LOG_ENTRIES {
            st.error_log.pop_back();
        }
        st.error_log.push_front(e);
    }
}
