//! Receive queues: the fixed-capacity FIFO used by QP receive queues and by
//! shared receive queues.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use super::pd::SoftPd;
use crate::error::{PostError, PostErrorKind, VerbsError};
use crate::provider::SharedRecvQueue;
use crate::types::{AsyncEvent, Sge, WrId};
use crate::wr::RecvWr;

/// A fixed-capacity FIFO of receive WRs with their SGEs stored inline
/// (allocated once at creation).
pub(crate) struct RecvQueue {
    ids: Vec<WrId>,
    nsge: Vec<u32>,
    sges: Vec<Sge>,
    max_sge: usize,
    head: usize,
    len: usize,
}

impl RecvQueue {
    pub(crate) fn new(cap: usize, max_sge: usize) -> Self {
        RecvQueue {
            ids: vec![WrId(0); cap],
            nsge: vec![0; cap],
            sges: vec![Sge::default(); cap * max_sge],
            max_sge,
            head: 0,
            len: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn cap(&self) -> usize {
        self.ids.len()
    }

    pub(crate) fn check(&self, wr: &RecvWr<'_>) -> Result<(), PostErrorKind> {
        if wr.sg_list.len() > self.max_sge {
            return Err(PostErrorKind::TooManySge);
        }
        if self.len == self.cap() {
            return Err(PostErrorKind::QueueFull);
        }
        Ok(())
    }

    pub(crate) fn push(&mut self, wr: &RecvWr<'_>) -> Result<(), PostErrorKind> {
        self.check(wr)?;
        let mut i = self.head + self.len;
        if i >= self.cap() {
            i -= self.cap();
        }
        self.ids[i] = wr.wr_id;
        self.nsge[i] = wr.sg_list.len() as u32;
        let s0 = i * self.max_sge;
        // One or two SGEs (the common receives) without a `memcpy` call.
        match wr.sg_list {
            [] => {}
            [one] => self.sges[s0] = *one,
            [a, b] => {
                self.sges[s0] = *a;
                self.sges[s0 + 1] = *b;
            }
            l => self.sges[s0..s0 + l.len()].copy_from_slice(l),
        }
        self.len += 1;
        Ok(())
    }

    /// The oldest WR.
    pub(crate) fn front(&self) -> Option<(WrId, &[Sge])> {
        if self.len == 0 {
            return None;
        }
        let i = self.head;
        let s = i * self.max_sge;
        Some((self.ids[i], &self.sges[s..s + self.nsge[i] as usize]))
    }

    pub(crate) fn pop(&mut self) -> Option<WrId> {
        if self.len == 0 {
            return None;
        }
        let id = self.ids[self.head];
        self.head += 1;
        if self.head == self.cap() {
            self.head = 0;
        }
        self.len -= 1;
        Some(id)
    }

    pub(crate) fn clear(&mut self) {
        self.head = 0;
        self.len = 0;
    }
}

/// A soft shared receive queue.
#[derive(Clone)]
pub struct SoftSrq(pub(crate) Rc<SrqInner>);

pub(crate) struct SrqInner {
    pub(crate) pd: SoftPd,
    pub(crate) num: u32,
    pub(crate) q: RefCell<RecvQueue>,
    limit: Cell<u32>,
    /// Fault injection: takes that find the SRQ "empty".
    pub(crate) starve: Cell<u32>,
}

impl SoftSrq {
    pub(crate) fn new(pd: &SoftPd, max_wr: u32, max_sge: u32) -> Result<SoftSrq, VerbsError> {
        let caps = &pd.0.dev.0.caps;
        if max_wr == 0 || max_wr > caps.max_srq_wr || max_sge > caps.max_srq_sge {
            return Err(VerbsError::InvalidArgument("SRQ size out of range"));
        }
        Ok(SoftSrq(Rc::new(SrqInner {
            pd: pd.clone(),
            num: pd.0.dev.0.next_num(),
            q: RefCell::new(RecvQueue::new(max_wr as usize, max_sge.max(1) as usize)),
            limit: Cell::new(0),
            starve: Cell::new(0),
        })))
    }
}

impl SrqInner {
    /// After a WR was taken: fire the one-shot limit event if armed.
    pub(crate) fn after_take(&self) {
        let lim = self.limit.get();
        if lim != 0 && (self.q.borrow().len() as u32) < lim {
            self.limit.set(0);
            self.pd
                .0
                .dev
                .0
                .push_event(AsyncEvent::SrqLimitReached { srq_num: self.num });
        }
    }
}

impl SharedRecvQueue for SoftSrq {
    fn srq_num(&self) -> u32 {
        self.0.num
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        let mut q = self.0.q.borrow_mut();
        for (index, wr) in wrs.iter().enumerate() {
            q.push(wr).map_err(|kind| PostError { index, kind })?;
        }
        Ok(())
    }

    fn set_limit(&self, limit: u32) -> Result<(), VerbsError> {
        if limit as usize > self.0.q.borrow().cap() {
            return Err(VerbsError::InvalidArgument("SRQ limit above its size"));
        }
        self.0.limit.set(limit);
        Ok(())
    }
}
