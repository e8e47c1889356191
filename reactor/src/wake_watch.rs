//! [`WakeWatch`]: a file descriptor registered as a wake source of its
//! reactor for as long as the watch lives, so that a reactor in an
//! adaptive or hybrid idle mode sleeps in `epoll_wait` only until that fd
//! is readable. Dropping it unregisters the fd (the reactor keeps a
//! duplicate until then, which would hold the file open).

use std::os::fd::AsFd;

use crate::{Reactor, ReactorError, WakeFdId};

/// One registered wake fd ([`Reactor::register_wake_fd`]), unregistered on
/// drop. `!Send`, like the reactor. Busy-polling reactors register nothing.
pub struct WakeWatch {
    reactor: Reactor,
    id: WakeFdId,
}

impl WakeWatch {
    /// Register `fd` with `reactor` (level-triggered: the poller that owns
    /// the fd drains it, or the reactor does not sleep).
    ///
    /// # Errors
    /// As [`Reactor::register_wake_fd`].
    pub fn new(reactor: &Reactor, fd: impl AsFd) -> Result<Self, ReactorError> {
        let id = reactor.register_wake_fd(fd)?;
        Ok(Self {
            reactor: reactor.clone(),
            id,
        })
    }
}

impl Drop for WakeWatch {
    fn drop(&mut self) {
        self.reactor.unregister_wake_fd(self.id);
    }
}

impl std::fmt::Debug for WakeWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WakeWatch")
            .field("core", &self.reactor.core())
            .field("id", &self.id)
            .finish()
    }
}
