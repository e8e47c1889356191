//! [`QuietSet`]: a poll group's epoll set of its connections' sockets, so
//! that a connection with nothing to read costs no `recv` per poll.
//!
//! A poll group reads every connection's socket on every poll while it
//! carries traffic: a read that finds bytes is the cheapest way to learn of
//! them. A read that finds none is a system call for nothing (~340 ns on
//! this project's test machine), and a core that serves many hosts, most of
//! them idle at any moment (admin queues, I/O queues of another CPU's
//! threads), would spend its loops on them. So a connection whose socket
//! was empty on [`QUIET_AFTER`] polls in a row (with nothing buffered)
//! turns quiet and is read only once the set reports it readable; a read
//! that finds bytes makes it busy again. Every connection's socket is in
//! the set (level-triggered, readable) from its first poll to its last, so
//! turning quiet or busy costs no system call. A socket's entry carries
//! its connection's index in the group, so a look finds each ready
//! connection without a search; when a connection goes and another moves
//! into its place, the moved one's entry is re-tagged (one `epoll_ctl`, on
//! the control path). The group looks
//! at the set (`epoll_wait` with a zero timeout) on every poll of an idle
//! reactor and on every [`LOOK_EVERY`]th poll of a busy one, so a quiet
//! connection's next command waits at most that many polls. SPDK's posix
//! socket groups wait on an epoll set of every socket on every poll; here
//! the busy connections keep their direct reads and nobody looks at the
//! set (no system call) while every connection carries traffic.

use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};

use rustix::event::epoll;

/// Polls in a row that found a connection's socket empty (and nothing
/// buffered) before it is read only when the set reports it.
pub(super) const QUIET_AFTER: u32 = 16;

/// On a busy reactor, polls of the group between two looks at the set (an
/// idle reactor looks on every poll).
pub(super) const LOOK_EVERY: u32 = 4;

/// A quiet connection with no command in flight and nothing to send has
/// its queue pair polled (controller events, the Connect deadline) on every
/// this many polls of its group only.
pub(super) const CORE_EVERY_QUIET: u32 = 8;

/// Readiness events taken per look; more wait for the next look (the set is
/// level-triggered, and the kernel reports ready entries round-robin).
const EVENTS_PER_LOOK: usize = 32;

/// The epoll set of one poll group's connections and the count of its
/// quiet ones (`!Send`, like the group).
pub(super) struct QuietSet {
    /// `None` when the kernel refused an epoll instance: connections then
    /// never turn quiet (read on every poll).
    epoll: Option<OwnedFd>,
    /// Connections that are quiet now.
    quiet: usize,
    /// Polls until the next look while the reactor is busy.
    look_in: u32,
}

impl QuietSet {
    /// An empty set (logs once and works without one if the kernel refuses).
    pub(super) fn new() -> Self {
        let epoll = match epoll::create(epoll::CreateFlags::CLOEXEC) {
            Ok(fd) => Some(fd),
            Err(e) => {
                log::warn!("nvmf tcp: no epoll set for quiet connections ({e}): every connection is read on every poll");
                None
            }
        };
        Self {
            epoll,
            quiet: 0,
            look_in: LOOK_EVERY,
        }
    }

    /// Connections that are quiet now.
    pub(super) fn quiet(&self) -> usize {
        self.quiet
    }

    /// Watch a new connection's socket, tagged with the connection's
    /// index in the group (`index`); `false` (it never turns quiet, read on
    /// every poll) when it cannot be watched.
    pub(super) fn watch(&mut self, sock: &impl AsFd, index: usize) -> bool {
        self.tag(sock, index, false)
    }

    /// A watched connection moved to `index` in the group (another one
    /// left its place): tag its entry with the new index. `false` when the
    /// kernel refused (the connection must then be read on every poll).
    pub(super) fn retag(&mut self, sock: &impl AsFd, index: usize) -> bool {
        self.tag(sock, index, true)
    }

    /// Add `sock`'s entry, or change its tag (`again`), to `index`.
    fn tag(&self, sock: &impl AsFd, index: usize, again: bool) -> bool {
        let Some(ep) = &self.epoll else { return false };
        let data = epoll::EventData::new_u64(index as u64);
        let flags = epoll::EventFlags::IN;
        let r = if again {
            epoll::modify(ep, sock, data, flags)
        } else {
            epoll::add(ep, sock, data, flags)
        };
        if let Err(e) = r {
            log::debug!("nvmf tcp: cannot tag a connection's socket in the quiet set: {e}");
        }
        r.is_ok()
    }

    /// Stop watching a socket [`watch`](Self::watch) took (its connection
    /// goes; before its socket closes, so that its number, reused, never
    /// meets a stale entry).
    pub(super) fn unwatch(&mut self, sock: &impl AsFd) {
        if let Some(ep) = &self.epoll {
            // Fails only if it was not there: nothing to undo then.
            let _ = epoll::delete(ep, sock);
        }
    }

    /// A watched connection turned quiet.
    pub(super) fn enter(&mut self) {
        self.quiet += 1;
    }

    /// A quiet connection turned busy, or went.
    pub(super) fn leave(&mut self) {
        self.quiet = self.quiet.saturating_sub(1);
    }

    /// Whether this poll looks at the set: never when it is empty, on every
    /// poll when the reactor's last loop was idle, else every
    /// [`LOOK_EVERY`]th.
    pub(super) fn look_due(&mut self, reactor_busy: bool) -> bool {
        if self.quiet == 0 {
            return false;
        }
        if !reactor_busy {
            self.look_in = LOOK_EVERY;
            return true;
        }
        self.look_in = self.look_in.saturating_sub(1);
        if self.look_in == 0 {
            self.look_in = LOOK_EVERY;
            return true;
        }
        false
    }

    /// Ask the kernel which watched sockets have bytes (or a hang-up or an
    /// error: a read finds out which), without waiting; `ready` gets the
    /// index in the group of each one's connection.
    pub(super) fn look(&self, mut ready: impl FnMut(usize)) {
        let Some(ep) = &self.epoll else { return };
        let mut events = [const { MaybeUninit::<epoll::Event>::uninit() }; EVENTS_PER_LOOK];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        match epoll::wait(ep, &mut events, Some(&zero)) {
            Ok((got, _)) => {
                for e in got.iter() {
                    if let Ok(i) = usize::try_from(e.data.u64()) {
                        ready(i);
                    }
                }
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => log::debug!("nvmf tcp: epoll_wait on quiet connections: {e}"),
        }
    }
}

impl std::fmt::Debug for QuietSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuietSet")
            .field("quiet", &self.quiet)
            .field("watching", &self.epoll.is_some())
            .finish()
    }
}
