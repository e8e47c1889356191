//! The soft device: capabilities, arena slots, async events.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::{Rc, Weak};
use std::sync::Arc;

use pollux_reactor::mem::DmaArena;

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

/// An open soft device (`!Send`: belongs to one reactor).
#[derive(Clone)]
pub struct SoftDevice(pub(crate) Rc<DeviceInner>);

pub(crate) struct DeviceInner {
    pub(crate) caps: DeviceCaps,
    next_num: Cell<u32>,
    next_tag: Cell<u8>,
    events: RefCell<VecDeque<AsyncEvent>>,
    /// Arena slots: every arena that holds registered memory, by slot.
    pub(crate) slots: RefCell<Vec<Option<Arc<DmaArena>>>>,
    /// Whether a slot's arena may be mapped by peers (trust model).
    exposed: RefCell<Vec<bool>>,
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
            exposed: RefCell::new(Vec::new()),
            expose_all: Cell::new(false),
            conns: RefCell::new(Vec::new()),
        }))
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

    /// The slot of `arena`, adding it (control path). Exposes it to peers if
    /// `remote` (or if every arena is exposed) and ships it to live
    /// connections that have not seen it.
    pub(crate) fn slot_for(&self, arena: &Arc<DmaArena>, remote: bool) -> u64 {
        let mut slots = self.slots.borrow_mut();
        let mut exposed = self.exposed.borrow_mut();
        let pos = slots
            .iter()
            .position(|s| s.as_ref().is_some_and(|a| Arc::ptr_eq(a, arena)));
        let slot = match pos {
            Some(p) => p,
            None => {
                slots.push(Some(arena.clone()));
                exposed.push(false);
                slots.len() - 1
            }
        };
        let expose = remote || self.expose_all.get();
        let newly = expose && !exposed[slot];
        if expose {
            exposed[slot] = true;
        }
        drop(exposed);
        drop(slots);
        if newly {
            self.ship_slot(slot);
        }
        slot as u64
    }

    /// Expose every registered arena from now on.
    pub(crate) fn expose_all(&self) {
        if self.expose_all.replace(true) {
            return;
        }
        let n = self.slots.borrow().len();
        for slot in 0..n {
            let newly = {
                let mut ex = self.exposed.borrow_mut();
                !std::mem::replace(&mut ex[slot], true)
            };
            if newly {
                self.ship_slot(slot);
            }
        }
    }

    fn ship_slot(&self, slot: usize) {
        let arena = self.slots.borrow().get(slot).cloned().flatten();
        let Some(arena) = arena else { return };
        self.conns.borrow_mut().retain(|c| c.strong_count() > 0);
        let conns: Vec<Rc<Conn>> = self
            .conns
            .borrow()
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for c in conns {
            c.send_arena(slot as u64, &arena);
        }
    }

    /// Exposed slots and their arenas (control path, at connection setup).
    pub(crate) fn exposed_slots(&self) -> Vec<(u64, Arc<DmaArena>)> {
        let slots = self.slots.borrow();
        let ex = self.exposed.borrow();
        slots
            .iter()
            .enumerate()
            .filter(|(i, _)| ex[*i])
            .filter_map(|(i, a)| a.clone().map(|a| (i as u64, a)))
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
