//! Handing a connect request to another poll group's core.
//!
//! Verbs CM ids are `!Send`, so the poll group whose listener received a
//! request detaches it ([`CmId::detach`](pollux_verbs::CmId::detach)) into
//! the provider's `Send` [`PendingConn`] and sends it by reactor message
//! ([`send`]). On the destination core the message drops it into that poll
//! group's [`Inbox`] (the transport's io_device channel on that core); the
//! group's poller attaches it to its own device and creates the QP on its
//! own CQ and SRQ. A request that cannot be delivered (the core stopped,
//! the group is gone) is dropped, which rejects it.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::marker::PhantomData;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use pollux_reactor::{CoreId, IoDevice, Reactor};
use pollux_verbs::Provider;

use super::transport::RdmaTransport;
use crate::spec::transport_id::TransportId;

/// A validated connect request on its way to the group that serves it.
pub(crate) struct Handoff<P: Provider> {
    /// The detached request.
    pub(crate) req: P::PendingConn,
    /// The listener it arrived on.
    pub(crate) trid: TransportId,
}

/// Requests handed to this core's poll group, taken by its poller.
pub(crate) struct Inbox<P: Provider>(RefCell<VecDeque<Handoff<P>>>);

impl<P: Provider> Inbox<P> {
    /// Whether nothing waits (one borrow; polled every round).
    pub(crate) fn is_empty(&self) -> bool {
        self.0.borrow().is_empty()
    }

    /// The oldest request.
    pub(crate) fn pop(&self) -> Option<Handoff<P>> {
        self.0.borrow_mut().pop_front()
    }

    fn push(&self, h: Handoff<P>) {
        self.0.borrow_mut().push_back(h);
    }
}

/// The io_device whose per-core channel is the inbox of that core's poll
/// group (created with the group, which holds it). One per transport.
pub(crate) struct Mailboxes<P: Provider>(PhantomData<fn() -> P>);

impl<P: Provider> Mailboxes<P> {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Mailboxes(PhantomData))
    }
}

impl<P: Provider> IoDevice for Mailboxes<P> {
    type Channel = Inbox<P>;
    type Error = Infallible;

    fn create_channel(&self, _r: &Reactor) -> Result<Inbox<P>, Infallible> {
        Ok(Inbox(RefCell::new(VecDeque::new())))
    }
}

/// Send `h` to poll group `group` on `core` (control path: boxes one
/// message). On failure the request is dropped (rejected) and its seat
/// given back.
pub(crate) fn send<P: Provider>(
    t: &Arc<RdmaTransport<P>>,
    from: &Reactor,
    group: usize,
    core: CoreId,
    h: Handoff<P>,
) {
    let tt = Arc::clone(t);
    let sent = from.send(core, move |r| match r.existing_channel(&tt.mailboxes) {
        Some(inbox) => inbox.push(h),
        None => {
            log::warn!(
                "nvmf rdma: no poll group on core {} for a connect request; rejecting it",
                r.core()
            );
            refused(&tt, group);
            drop(h);
        }
    });
    if let Err(e) = sent {
        log::warn!("nvmf rdma: cannot hand a connect request to core {core} ({e}); rejecting it");
        refused(t, group);
    }
}

/// A request placed on `group` was refused before it became a queue.
pub(crate) fn refused<P: Provider>(t: &RdmaTransport<P>, group: usize) {
    t.seats.release(group);
    t.stats.rejected.fetch_add(1, Ordering::Relaxed);
}

// The whole point: a detached request travels between cores.
const _: fn() = || {
    fn is_send<T: Send>() {}
    is_send::<Handoff<pollux_verbs::soft::Soft>>();
};
