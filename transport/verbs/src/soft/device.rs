//! The soft device: capabilities, arena slots, async events.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::{Rc, Weak};
use std::sync::Arc;

use pollux_reactor::mem::DmaArena;

use super::arena_slots::{slot_id, slot_index, SlotArena};
use super::cm::{Conn, SoftCmId, SoftListener};
use super::cq::SoftCq;
use super::pd::SoftPd;
use super::qp::SoftQp;
use super::Soft;
use crate::cm::{CmAddr, ConnParam};
use crate::error::VerbsError;
use crate::provider::Device;
use crate::types::{AsyncEvent, DeviceCaps};

/// Name of the one soft device.
pub const SOFT_DEVICE_NAME: &str = "soft0";

/// Largest SEND message (bytes); the rings hold at least two.
pub const SOFT_MAX_MSG: u32 = 1 << 20;

/// Async events kept before the oldest is dropped.
const ASYNC_QUEUE: usize = 1024;

/// Book-keeping of one slot index.
#[derive(Clone, Default)]
struct SlotState {
    /// Regular MRs registered over the slot's arena.
    mrs: u32,
    /// Generation of the slot's current id.
    generation: u32,
    /// Whether the arena was shipped to peers.
    exposed: bool,
    /// No MR left over an arena never shipped to peers, which may still
    /// live (its owner may register it again: the slot comes back under
    /// the same id). Swept once the arena is gone.
    parked: Option<std::sync::Weak<DmaArena>>,
}

/// An open soft device (`!Send`: belongs to one reactor).
#[derive(Clone)]
pub struct SoftDevice(pub(crate) Rc<DeviceInner>);

pub(crate) struct DeviceInner {
    pub(crate) caps: DeviceCaps,
    next_num: Cell<u32>,
    next_tag: Cell<u8>,
    events: RefCell<VecDeque<AsyncEvent>>,
    /// Arena slots: every arena that holds registered memory, by slot
    /// index (see [`super::arena_slots`]).
    pub(crate) slots: RefCell<Vec<Option<SlotArena>>>,
    /// Per slot index: regular MRs over its arena, the generation of its
    /// id, whether peers may map it (trust model).
    slot_state: RefCell<Vec<SlotState>>,
    /// Slot indexes free for reuse.
    free_slots: RefCell<Vec<usize>>,
    /// Expose every registered arena (a fast-reg MR exists: any local MR
    /// may become remotely reachable through REG_MR).
    expose_all: Cell<bool>,
    /// Live connections (to ship newly exposed arenas).
    pub(crate) conns: RefCell<Vec<Weak<Conn>>>,
}

impl SoftDevice {
    pub(crate) fn open() -> SoftDevice {
        SoftDevice(Rc::new(DeviceInner {
            caps: DeviceCaps {
                max_qp: 4096,
                max_qp_wr: 16384,
                max_sge: 16,
                max_cqe: 1 << 20,
                max_srq_wr: 16384,
                max_srq_sge: 16,
                max_inline_data: 1024,
                max_mr_size: 1 << 40,
                max_msg_size: SOFT_MAX_MSG,
                max_qp_rd_atom: 128,
                max_qp_init_rd_atom: 128,
                max_fast_reg_pages: super::mr::MR_MAX_SEGS as u32,
                mem_mgt_extensions: true,
                fast_reg: crate::types::FastRegMode::PageList,
                integrity: true,
            },
            next_num: Cell::new(1),
            next_tag: Cell::new(1),
            events: RefCell::new(VecDeque::with_capacity(ASYNC_QUEUE)),
            slots: RefCell::new(Vec::new()),
            slot_state: RefCell::new(Vec::new()),
            free_slots: RefCell::new(Vec::new()),
            expose_all: Cell::new(false),
            conns: RefCell::new(Vec::new()),
        }))
    }
}

impl SoftDevice {
    /// Arenas the device holds because memory in them is registered: one
    /// per arena with at least one live regular MR (leak checks: the
    /// count goes back down as MRs are deregistered).
    pub fn registered_arenas(&self) -> usize {
        self.0.slots.borrow().iter().flatten().count()
    }
}

impl DeviceInner {
    /// A fresh object number (QP, CQ, SRQ).
    pub(crate) fn next_num(&self) -> u32 {
        let n = self.next_num.get();
        self.next_num.set(n.wrapping_add(1).max(1));
        n
    }

    /// A PD tag (the high byte of its keys); never 0.
    pub(crate) fn next_tag(&self) -> u8 {
        let t = self.next_tag.get();
        self.next_tag.set(t.wrapping_add(1).max(1));
        t
    }

    /// Queue an async event (drops the oldest when full; no allocation
    /// after creation).
    pub(crate) fn push_event(&self, ev: AsyncEvent) {
        let mut q = self.events.borrow_mut();
        if q.len() == ASYNC_QUEUE {
            q.pop_front();
        }
        q.push_back(ev);
    }

    /// The slot id of `arena` for one more regular MR over it, adding it
    /// (control path). Exposes it to peers if `remote` (or if every arena is
    /// exposed) and ships it to live connections that have not seen it.
    /// Every call is paired with one [`release_slot`](Self::release_slot).
    pub(crate) fn slot_for(&self, arena: &Arc<DmaArena>, remote: bool) -> u64 {
        self.sweep_slots();
        let mut slots = self.slots.borrow_mut();
        let mut st = self.slot_state.borrow_mut();
        let pos = slots
            .iter()
            .position(|s| s.as_ref().is_some_and(|a| Arc::ptr_eq(&a.arena, arena)));
        let parked = || {
            st.iter().position(|s| {
                s.parked.as_ref().is_some_and(|w| {
                    w.strong_count() > 0 && std::ptr::eq(w.as_ptr(), Arc::as_ptr(arena))
                })
            })
        };
        let idx = match pos.or_else(parked) {
            Some(p) => {
                if st[p].parked.take().is_some() {
                    slots[p] = Some(SlotArena {
                        id: slot_id(p, st[p].generation),
                        arena: arena.clone(),
                    });
                }
                p
            }
            None => {
                let idx = match self.free_slots.borrow_mut().pop() {
                    Some(i) => i,
                    None => {
                        slots.push(None);
                        st.push(SlotState::default());
                        slots.len() - 1
                    }
                };
                slots[idx] = Some(SlotArena {
                    id: slot_id(idx, st[idx].generation),
                    arena: arena.clone(),
                });
                idx
            }
        };
        st[idx].mrs += 1;
        let id = slot_id(idx, st[idx].generation);
        let expose = remote || self.expose_all.get();
        let newly = expose && !st[idx].exposed;
        if expose {
            st[idx].exposed = true;
        }
        drop(st);
        drop(slots);
        if newly {
            self.ship_slot(idx);
        }
        id
    }

    /// One regular MR over slot `id` is gone. When it was the last, the
    /// device lets go of the arena (its fd and mapping close once nothing
    /// else holds it). An exposed slot is freed at once: the peers are told
    /// to unmap their copies (a peer reaches memory no longer than an MR
    /// over it lives, as a remote key does) and the index is reused under
    /// the next generation. A slot never exposed is parked instead, so its
    /// arena comes back under the same id if it is registered again; it is
    /// swept once the arena is gone ([`sweep_slots`](Self::sweep_slots)).
    pub(crate) fn release_slot(&self, id: u64) {
        let idx = slot_index(id);
        let gone = {
            let mut slots = self.slots.borrow_mut();
            let mut st = self.slot_state.borrow_mut();
            let live = slots
                .get(idx)
                .and_then(|s| s.as_ref())
                .is_some_and(|s| s.id == id);
            let Some(s) = st.get_mut(idx).filter(|_| live) else {
                return;
            };
            s.mrs = s.mrs.saturating_sub(1);
            if s.mrs > 0 {
                return;
            }
            let arena = slots[idx].take();
            if std::mem::replace(&mut s.exposed, false) {
                s.generation = s.generation.wrapping_add(1);
                self.free_slots.borrow_mut().push(idx);
                true
            } else {
                s.parked = arena.map(|a| Arc::downgrade(&a.arena));
                false
            }
        };
        if gone {
            for c in self.live_conns() {
                c.send_arena_gone(id);
            }
        }
        self.sweep_slots();
    }

    /// Free the parked slots whose arena is gone: tell the peers to unmap
    /// their copies and reuse the index (control path: registration,
    /// deregistration and new connections sweep).
    pub(crate) fn sweep_slots(&self) {
        let mut gone = Vec::new();
        {
            let mut st = self.slot_state.borrow_mut();
            for (idx, s) in st.iter_mut().enumerate() {
                if s.parked.as_ref().is_some_and(|w| w.strong_count() == 0) {
                    s.parked = None;
                    if std::mem::replace(&mut s.exposed, false) {
                        gone.push(slot_id(idx, s.generation));
                    }
                    s.generation = s.generation.wrapping_add(1);
                    self.free_slots.borrow_mut().push(idx);
                }
            }
        }
        if gone.is_empty() {
            return;
        }
        for c in self.live_conns() {
            for &id in &gone {
                c.send_arena_gone(id);
            }
        }
    }

    /// Expose every registered arena from now on.
    pub(crate) fn expose_all(&self) {
        if self.expose_all.replace(true) {
            return;
        }
        let n = self.slots.borrow().len();
        for idx in 0..n {
            let newly = {
                let slots = self.slots.borrow();
                let mut st = self.slot_state.borrow_mut();
                let s = &mut st[idx];
                (slots[idx].is_some() || s.parked.is_some())
                    && !std::mem::replace(&mut s.exposed, true)
            };
            if newly {
                self.ship_slot(idx);
            }
        }
    }

    /// Live connections (dropping the ones that are gone).
    pub(crate) fn live_conns(&self) -> Vec<Rc<Conn>> {
        self.conns.borrow_mut().retain(|c| c.strong_count() > 0);
        self.conns
            .borrow()
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// Remember a connection to ship newly exposed arenas to (dropping the
    /// ones that are gone, so the list holds live connections only).
    pub(crate) fn add_conn(&self, c: &Rc<Conn>) {
        self.sweep_slots();
        let mut conns = self.conns.borrow_mut();
        conns.retain(|c| c.strong_count() > 0);
        conns.push(Rc::downgrade(c));
    }

    /// The arena of slot index `idx`, registered or parked (and alive).
    fn any_slot(&self, idx: usize) -> Option<SlotArena> {
        if let Some(a) = self.slots.borrow().get(idx).cloned().flatten() {
            return Some(a);
        }
        let st = self.slot_state.borrow();
        let s = st.get(idx)?;
        let arena = s.parked.as_ref()?.upgrade()?;
        Some(SlotArena {
            id: slot_id(idx, s.generation),
            arena,
        })
    }

    fn ship_slot(&self, idx: usize) {
        let Some(slot) = self.any_slot(idx) else {
            return;
        };
        for c in self.live_conns() {
            c.send_arena(slot.id, &slot.arena);
        }
    }

    /// Exposed slots and their arenas (control path, at connection setup).
    /// Parked slots whose arena is alive are included: registered again,
    /// they come back under the same id without shipping anything.
    pub(crate) fn exposed_slots(&self) -> Vec<(u64, Arc<DmaArena>)> {
        let exposed: Vec<usize> = self
            .slot_state
            .borrow()
            .iter()
            .enumerate()
            .filter(|(_, s)| s.exposed)
            .map(|(i, _)| i)
            .collect();
        exposed
            .into_iter()
            .filter_map(|i| self.any_slot(i).map(|a| (a.id, a.arena)))
            .collect()
    }
}

impl Device<Soft> for SoftDevice {
    fn name(&self) -> &str {
        SOFT_DEVICE_NAME
    }

    fn caps(&self) -> &DeviceCaps {
        &self.0.caps
    }

    fn alloc_pd(&self) -> Result<SoftPd, VerbsError> {
        SoftPd::new(self)
    }

    fn create_cq(&self, depth: u32) -> Result<SoftCq, VerbsError> {
        SoftCq::new(self, depth)
    }

    fn listen(&self, addr: &CmAddr, backlog: u32) -> Result<SoftListener, VerbsError> {
        SoftListener::bind(self, addr, backlog)
    }

    fn connect(
        &self,
        addr: &CmAddr,
        qp: &SoftQp,
        param: &ConnParam<'_>,
    ) -> Result<SoftCmId, VerbsError> {
        SoftCmId::connect(self, addr, qp, param)
    }

    fn poll_async_event(&self) -> Option<AsyncEvent> {
        self.0.events.borrow_mut().pop_front()
    }
}
