//! [`WakeReg`]: a socket registered as a wake source of its reactor, so
//! that a reactor in adaptive idle mode (`IdleMode::Adaptive`) sleeps in
//! `epoll_wait` only until one of its connections or listeners has bytes
//! (or a connection) to take. Dropping it unregisters the fd (the reactor
//! keeps a duplicate until then, which would hold the socket open).

use std::os::fd::AsFd;

use pollux_reactor::{Reactor, WakeFdId};

/// One registered wake fd (busy-poll reactors register nothing).
pub(super) struct WakeReg {
    reactor: Reactor,
    id: WakeFdId,
}

impl WakeReg {
    /// Register `fd` with `reactor`; `None` (logged) when the reactor
    /// cannot watch it: the connection still works, the reactor only
    /// wakes for it on its other events.
    pub(super) fn new(reactor: &Reactor, fd: impl AsFd) -> Option<Self> {
        match reactor.register_wake_fd(fd) {
            Ok(id) => Some(Self {
                reactor: reactor.clone(),
                id,
            }),
            Err(e) => {
                log::warn!("nvmf tcp: cannot watch a socket for wake-ups: {e}");
                None
            }
        }
    }
}

impl Drop for WakeReg {
    fn drop(&mut self) {
        self.reactor.unregister_wake_fd(self.id);
    }
}

impl std::fmt::Debug for WakeReg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WakeReg").field("id", &self.id).finish()
    }
}
