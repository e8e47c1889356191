//! [`Handoff`]: a validated connect request on its way to the poll group
//! that serves it, and [`Inbox`]: the requests waiting for a group.

use std::cell::RefCell;
use std::collections::VecDeque;

use crate::Provider;

/// A detached connect request and what its transport needs to serve it
/// (`T`: NVMe-oF's listener transport id, iSER's portal group tag).
pub struct Handoff<P: Provider, T> {
    /// The detached request: attach it to the serving group's device.
    pub req: P::PendingConn,
    /// The transport's context of the request.
    pub context: T,
}

impl<P: Provider, T: std::fmt::Debug> std::fmt::Debug for Handoff<P, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handoff")
            .field("req", &self.req)
            .field("context", &self.context)
            .finish()
    }
}

/// Requests handed to one core's poll group, oldest first: the channel of
/// a [`Placer`](super::Placer) on that core, which the group holds for as
/// long as it takes requests. `!Send`: it lives on its core.
pub struct Inbox<P: Provider, T>(RefCell<VecDeque<Handoff<P, T>>>);

impl<P: Provider, T> Inbox<P, T> {
    pub(super) fn new() -> Self {
        Inbox(RefCell::new(VecDeque::new()))
    }

    /// Whether nothing waits (one borrow; cheap enough to poll every round).
    pub fn is_empty(&self) -> bool {
        self.0.borrow().is_empty()
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.0.borrow().len()
    }

    /// The oldest request.
    pub fn pop(&self) -> Option<Handoff<P, T>> {
        self.0.borrow_mut().pop_front()
    }

    pub(super) fn push(&self, h: Handoff<P, T>) {
        self.0.borrow_mut().push_back(h);
    }
}

impl<P: Provider, T> std::fmt::Debug for Inbox<P, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox")
            .field("waiting", &self.len())
            .finish()
    }
}

// The whole point: a detached request travels between cores.
const _: fn() = || {
    fn is_send<X: Send>() {}
    is_send::<Handoff<crate::soft::Soft, u16>>();
};
