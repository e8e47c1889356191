//! [`AwakeHold`]: keeps a reactor from sleeping while a poller waits for
//! something that cannot wake it.
//!
//! A reactor in [`IdleMode::Adaptive`](crate::IdleMode::Adaptive) or
//! [`IdleMode::Hybrid`](crate::IdleMode::Hybrid) sleeps in `epoll_wait`,
//! and only a message, a timed poller's deadline or a registered file
//! descriptor ([`Reactor::register_wake_fd`](crate::Reactor::register_wake_fd))
//! wakes it. A poller that waits on memory another process writes (the
//! software RDMA provider's rings), on a completion queue without an event
//! channel, or on a Linux AIO context takes an [`AwakeHold`] for as long as
//! it waits: while any hold is alive the reactor polls as in busy mode.
//! Taking and dropping one touches a counter of the reactor's own (no
//! atomics); in busy mode it changes nothing.

use crate::Reactor;

/// While alive, its reactor does not sleep (see the module documentation).
/// Taken with [`Reactor::hold_awake`]; `!Send`, like the reactor.
#[must_use = "the reactor may sleep again as soon as the hold is dropped"]
pub struct AwakeHold {
    reactor: Reactor,
}

impl AwakeHold {
    pub(crate) fn new(reactor: &Reactor) -> Self {
        reactor.add_awake_hold(1);
        Self {
            reactor: reactor.clone(),
        }
    }
}

impl Drop for AwakeHold {
    fn drop(&mut self) {
        self.reactor.add_awake_hold(-1);
    }
}

impl std::fmt::Debug for AwakeHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwakeHold")
            .field("core", &self.reactor.core())
            .finish()
    }
}
