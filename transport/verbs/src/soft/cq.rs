//! Completion queues. Polling a CQ also drives the soft provider: it
//! executes queued send work, retires acknowledged WRs and consumes inbound
//! messages of the QPs attached to it.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::rc::{Rc, Weak};

use rustix::event::EventfdFlags;

use super::device::SoftDevice;
use super::qp::QpInner;
use crate::error::{CqError, VerbsError};
use crate::provider::CompletionQueue;
use crate::types::{AsyncEvent, Wc};

/// A soft completion queue.
#[derive(Clone)]
pub struct SoftCq(pub(crate) Rc<CqInner>);

pub(crate) struct CqInner {
    dev: SoftDevice,
    pub(crate) num: u32,
    depth: u32,
    q: RefCell<VecDeque<Wc>>,
    overflow: Cell<bool>,
    pub(crate) efd: OwnedFd,
    armed: Cell<bool>,
    pub(crate) qps: RefCell<Vec<Weak<QpInner>>>,
    /// Fault injection: polls that return nothing.
    pub(crate) stall: Cell<u32>,
}

impl SoftCq {
    pub(crate) fn new(dev: &SoftDevice, depth: u32) -> Result<SoftCq, VerbsError> {
        if depth == 0 || depth > dev.0.caps.max_cqe {
            return Err(VerbsError::InvalidArgument("CQ depth out of range"));
        }
        let efd = rustix::event::eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)
            .map_err(|e| VerbsError::sys("eventfd", e))?;
        Ok(SoftCq(Rc::new(CqInner {
            dev: dev.clone(),
            num: dev.0.next_num(),
            depth,
            q: RefCell::new(VecDeque::with_capacity(depth as usize)),
            overflow: Cell::new(false),
            efd,
            armed: Cell::new(false),
            qps: RefCell::new(Vec::new()),
            stall: Cell::new(0),
        })))
    }

    fn qp_at(&self, i: usize) -> Option<Rc<QpInner>> {
        self.0.qps.borrow().get(i).and_then(Weak::upgrade)
    }
}

impl SoftCq {
    /// The CQ overflowed: every QP on it goes to ERR.
    #[cold]
    #[inline(never)]
    fn overflowed(&self) -> CqError {
        let n = self.0.qps.borrow().len();
        for i in 0..n {
            if let Some(qp) = self.qp_at(i) {
                qp.cq_died();
            }
        }
        CqError::Overflow
    }
}

impl CqInner {
    /// Move up to `out.len()` completions out (oldest first).
    #[inline(never)]
    fn drain(&self, out: &mut [Wc]) -> usize {
        let mut q = self.q.borrow_mut();
        let k = out.len().min(q.len());
        for (slot, wc) in out.iter_mut().zip(q.drain(..k)) {
            *slot = wc;
        }
        k
    }

    pub(crate) fn dev(&self) -> &SoftDevice {
        &self.dev
    }

    /// Queue a completion; false (and the CQ is dead) on overflow.
    pub(crate) fn push(&self, wc: Wc) -> bool {
        if self.overflow.get() {
            return false;
        }
        let mut q = self.q.borrow_mut();
        if q.len() >= self.depth as usize {
            self.overflow.set(true);
            drop(q);
            self.dev
                .0
                .push_event(AsyncEvent::CqErr { cq_num: self.num });
            return false;
        }
        q.push_back(wc);
        drop(q);
        self.signal();
        true
    }

    /// Write the eventfd if armed (one-shot).
    pub(crate) fn signal(&self) {
        if self.armed.replace(false) {
            let _ = rustix::io::write(&self.efd, &1u64.to_ne_bytes());
        }
    }
}

impl CompletionQueue for SoftCq {
    fn cq_num(&self) -> u32 {
        self.0.num
    }

    fn depth(&self) -> u32 {
        self.0.depth
    }

    fn poll(&self, out: &mut [Wc]) -> Result<usize, CqError> {
        let c = &*self.0;
        let stall = c.stall.get();
        if stall > 0 {
            c.stall.set(stall - 1);
            return Ok(0);
        }
        // The receive rings first: an idle QP costs a look at its next
        // stamp word and its send-queue counters (see `QpInner::progress`).
        {
            // The QPs' progress never adds or removes a CQ's QPs (only QP
            // creation does), so the list stays borrowed while they run.
            let qps = c.qps.borrow();
            for w in qps.iter() {
                if let Some(qp) = w.upgrade() {
                    qp.progress(c);
                }
            }
        }
        if c.overflow.get() {
            return Err(self.overflowed());
        }
        if c.q.borrow().is_empty() {
            return Ok(0);
        }
        Ok(c.drain(out))
    }

    fn req_notify(&self, _solicited_only: bool) -> Result<(), VerbsError> {
        self.0.armed.set(true);
        let n = self.0.qps.borrow().len();
        let mut pending = !self.0.q.borrow().is_empty();
        for i in 0..n {
            if let Some(qp) = self.qp_at(i) {
                pending |= qp.arm_links(&self.0);
            }
        }
        if pending {
            self.0.signal();
        }
        Ok(())
    }

    fn event_fd(&self) -> BorrowedFd<'_> {
        self.0.efd.as_fd()
    }

    fn ack_events(&self) -> bool {
        let mut b = [0u8; 8];
        matches!(rustix::io::read(&self.0.efd, &mut b), Ok(8))
    }
}
