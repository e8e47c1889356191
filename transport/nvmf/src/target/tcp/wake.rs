//! Sockets registered as wake sources of their reactor
//! ([`pollux_reactor::WakeWatch`]), so that a reactor in an adaptive or
//! hybrid idle mode sleeps in `epoll_wait` only until one of its
//! connections or listeners has bytes (or a connection) to take.

use std::os::fd::AsFd;

use pollux_reactor::{Reactor, WakeWatch};

/// Watch `fd` for `reactor`; `None` (logged) when the reactor cannot: the
/// connection still works, the reactor only wakes for it on its other
/// events.
pub(super) fn watch(reactor: &Reactor, fd: impl AsFd) -> Option<WakeWatch> {
    match WakeWatch::new(reactor, fd) {
        Ok(w) => Some(w),
        Err(e) => {
            log::warn!("nvmf tcp: cannot watch a socket for wake-ups: {e}");
            None
        }
    }
}
