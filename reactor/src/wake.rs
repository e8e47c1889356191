//! The idle policy and the machinery of the adaptive mode: a reactor that has
//! been idle for a while sleeps in `epoll_wait` and wakes on a message, on the
//! next timed-poller deadline or on a file descriptor a poller registered.
//!
//! No lost wake-up: the reactor sets `sleeping`, then re-checks its inbox,
//! then sleeps; a sender pushes its message, then reads `sleeping` and writes
//! the eventfd only when it is set. With sequentially consistent ordering on
//! both sides, either the reactor sees the message or the sender sees the
//! flag.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::time::Duration;

use rustix::event::{epoll, eventfd, EventfdFlags};

use crate::error::ReactorError;

/// What an idle reactor does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IdleMode {
    /// Poll forever, one core at 100% (SPDK's default; lowest latency).
    #[default]
    BusyPoll,
    /// After `sleep_after` without a busy loop, sleep in `epoll_wait` until
    /// a message, the next timed-poller deadline or a registered wake fd.
    ///
    /// While it sleeps, active pollers do not run: a poller that waits for
    /// an event must register its fd with
    /// [`Reactor::register_wake_fd`](crate::Reactor::register_wake_fd), or
    /// hold the reactor awake ([`Reactor::hold_awake`](crate::Reactor::hold_awake))
    /// while it waits on something no fd signals. Pollux's bdev channels
    /// hold it while I/Os are in flight, its RDMA poll groups while their
    /// connections have work in flight (they register their listeners and
    /// their CQ's event descriptor), the NVMe/TCP target registers its
    /// sockets.
    Adaptive {
        /// How long the reactor stays idle before it sleeps.
        sleep_after: Duration,
    },
    /// Sleep through the predictable part of each idle stretch, as Linux's
    /// hybrid block polling does: right after its work the reactor sleeps
    /// for half the moving average of its recent stretches (from one busy
    /// loop to the next), then polls until work comes, so that work arriving
    /// at a steady pace finds it polling. Work that comes early wakes it as
    /// in `Adaptive` (a message, a timed poller's deadline, a registered
    /// file descriptor); after `sleep_after` without work it sleeps until
    /// such an event, as `Adaptive` does. The reactor's thread gets a timer
    /// slack of 1 ns, so that its sleeps end when they should.
    Hybrid {
        /// How long the reactor stays idle before it sleeps until an event.
        sleep_after: Duration,
    },
}

impl IdleMode {
    /// Whether a reactor in this mode sleeps (then a poller that waits for
    /// an event registers its fd with
    /// [`Reactor::register_wake_fd`](crate::Reactor::register_wake_fd) or
    /// holds the reactor awake while it waits).
    pub fn sleeps(self) -> bool {
        self.sleep_after().is_some()
    }

    /// How long a reactor in this mode stays idle before it sleeps until an
    /// event; `None` in busy mode (it never does).
    pub fn sleep_after(self) -> Option<Duration> {
        match self {
            IdleMode::BusyPoll => None,
            IdleMode::Adaptive { sleep_after } | IdleMode::Hybrid { sleep_after } => {
                Some(sleep_after)
            }
        }
    }
}

/// Names a file descriptor registered with
/// [`Reactor::register_wake_fd`](crate::Reactor::register_wake_fd).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WakeFdId(pub(crate) u64);

/// The epoll token of the reactor's own eventfd.
const EVENTFD_TOKEN: u64 = 0;

/// The part of a reactor's wake-up that senders on other threads share.
pub(crate) struct WakeSignal {
    sleeping: AtomicBool,
    /// Present in adaptive mode only.
    eventfd: Option<OwnedFd>,
}

impl WakeSignal {
    pub(crate) fn new(mode: IdleMode) -> Result<Self, ReactorError> {
        let eventfd = if mode.sleeps() {
            Some(
                eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
                    .map_err(|e| ReactorError::os("eventfd", e))?,
            )
        } else {
            None
        };
        Ok(Self {
            sleeping: AtomicBool::new(false),
            eventfd,
        })
    }

    /// Called by a sender after it queued a message.
    pub(crate) fn notify(&self) {
        let Some(fd) = &self.eventfd else { return };
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) {
            // EAGAIN means the counter is saturated: the reactor wakes anyway.
            let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
        }
    }

    fn drain(&self) {
        if let Some(fd) = &self.eventfd {
            let mut buf = [0u8; 8];
            let _ = rustix::io::read(fd, &mut buf);
        }
    }
}

/// The reactor-side epoll set (adaptive mode).
pub(crate) struct Sleeper {
    epoll: OwnedFd,
    /// Registered wake fds (our own duplicates), by token.
    fds: Vec<(u64, OwnedFd)>,
    next_token: u64,
}

impl Sleeper {
    pub(crate) fn new(signal: &WakeSignal) -> Result<Self, ReactorError> {
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)
            .map_err(|e| ReactorError::os("epoll_create", e))?;
        if let Some(fd) = &signal.eventfd {
            epoll::add(
                &epoll,
                fd,
                epoll::EventData::new_u64(EVENTFD_TOKEN),
                epoll::EventFlags::IN,
            )
            .map_err(|e| ReactorError::os("epoll_ctl", e))?;
        }
        Ok(Self {
            epoll,
            fds: Vec::new(),
            next_token: EVENTFD_TOKEN + 1,
        })
    }

    /// Registers a duplicate of `fd` (level-triggered, readable).
    pub(crate) fn register(&mut self, fd: impl AsFd) -> Result<WakeFdId, ReactorError> {
        let dup = rustix::io::fcntl_dupfd_cloexec(fd, 0).map_err(|e| ReactorError::os("dup", e))?;
        let token = self.next_token;
        epoll::add(
            &self.epoll,
            &dup,
            epoll::EventData::new_u64(token),
            epoll::EventFlags::IN,
        )
        .map_err(|e| ReactorError::os("epoll_ctl", e))?;
        self.next_token += 1;
        self.fds.push((token, dup));
        Ok(WakeFdId(token))
    }

    /// Unregisters a wake fd; `false` if it was not registered.
    pub(crate) fn unregister(&mut self, id: WakeFdId) -> bool {
        let Some(pos) = self.fds.iter().position(|(t, _)| *t == id.0) else {
            return false;
        };
        let (_, fd) = self.fds.swap_remove(pos);
        let _ = epoll::delete(&self.epoll, &fd);
        true
    }

    /// Sleeps until a message, a registered fd or `timeout` (`None`: no
    /// deadline). `inbox_empty` is re-checked after the flag is raised.
    /// Returns how the sleep ended.
    pub(crate) fn sleep(
        &mut self,
        signal: &WakeSignal,
        timeout: Option<Duration>,
        inbox_empty: impl Fn() -> bool,
    ) -> io::Result<Slept> {
        signal.sleeping.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if !inbox_empty() {
            signal.sleeping.store(false, Ordering::SeqCst);
            return Ok(Slept::Not);
        }
        // Without epoll_pwait2 the kernel takes at most i32::MAX ms; an hour
        // is plenty, the loop simply sleeps again.
        let ts =
            timeout
                .map(|t| t.min(Duration::from_secs(3600)))
                .map(|t| rustix::event::Timespec {
                    tv_sec: t.as_secs() as _,
                    tv_nsec: t.subsec_nanos() as _,
                });
        let mut events = [const { MaybeUninit::<epoll::Event>::uninit() }; 8];
        let res = epoll::wait(&self.epoll, &mut events, ts.as_ref());
        signal.sleeping.store(false, Ordering::SeqCst);
        signal.drain();
        match res {
            Ok(([], _)) => Ok(Slept::TimedOut),
            Ok(_) | Err(rustix::io::Errno::INTR) => Ok(Slept::Woken),
            Err(e) => Err(e.into()),
        }
    }
}

/// How a [`Sleeper::sleep`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slept {
    /// A message was already waiting: no sleep.
    Not,
    /// Woken by an event (a message, a registered fd) or a signal.
    Woken,
    /// The timeout passed.
    TimedOut,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adaptive() -> IdleMode {
        IdleMode::Adaptive {
            sleep_after: Duration::ZERO,
        }
    }

    #[test]
    fn busy_poll_signal_has_no_eventfd_and_notify_is_a_no_op() {
        let s = WakeSignal::new(IdleMode::BusyPoll).unwrap();
        assert!(s.eventfd.is_none());
        s.notify();
    }

    #[test]
    fn sleep_times_out_and_skips_when_inbox_is_not_empty() {
        let s = WakeSignal::new(adaptive()).unwrap();
        let mut sl = Sleeper::new(&s).unwrap();
        assert_eq!(
            sl.sleep(&s, None, || false).unwrap(),
            Slept::Not,
            "inbox not empty"
        );
        assert_eq!(
            sl.sleep(&s, Some(Duration::ZERO), || true).unwrap(),
            Slept::TimedOut
        );
        assert!(!s.sleeping.load(Ordering::SeqCst));
    }

    #[test]
    fn notify_wakes_a_sleeper_only_when_it_sleeps() {
        let s = std::sync::Arc::new(WakeSignal::new(adaptive()).unwrap());
        // Not sleeping: no write, so the counter stays zero.
        s.notify();
        let mut buf = [0u8; 8];
        assert!(rustix::io::read(s.eventfd.as_ref().unwrap(), &mut buf).is_err());
        let mut sl = Sleeper::new(&s).unwrap();
        let s2 = s.clone();
        let t = std::thread::spawn(move || {
            // Keep notifying until the sleeper has gone to sleep and woken.
            while !s2.sleeping.load(Ordering::SeqCst) {
                std::thread::yield_now();
            }
            s2.notify();
        });
        // No timeout: only the eventfd can end this sleep.
        assert_eq!(sl.sleep(&s, None, || true).unwrap(), Slept::Woken);
        t.join().unwrap();
    }

    #[test]
    fn registered_fd_wakes_and_unregisters() {
        let s = WakeSignal::new(adaptive()).unwrap();
        let mut sl = Sleeper::new(&s).unwrap();
        let efd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).unwrap();
        let id = sl.register(&efd).unwrap();
        rustix::io::write(&efd, &1u64.to_ne_bytes()).unwrap();
        assert_eq!(
            sl.sleep(&s, Some(Duration::from_secs(5)), || true).unwrap(),
            Slept::Woken
        );
        assert!(sl.unregister(id));
        assert!(!sl.unregister(id));
    }
}
