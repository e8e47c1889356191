//! [`AcceptPacer`]: what a listener does when `accept(2)` fails.

use std::time::{Duration, Instant};

/// Paces a listener whose `accept` fails. A failure for want of resources
/// (`EMFILE`, `ENFILE`: out of descriptors; `ENOBUFS`, `ENOMEM`) leaves
/// the connection in the backlog, so the listener stays readable and the
/// next `accept` fails the same way: without a pause, a polling loop would
/// spin on it and log every failure. After such a failure accepting pauses
/// for [`PAUSE`](Self::PAUSE) (the connections wait in the backlog, and
/// are taken once descriptors are free again); other failures (a
/// connection aborted before it was taken, say) do not pause. Failures are
/// logged at most once per [`LOG_EVERY`](Self::LOG_EVERY), with how many
/// there were. Time is the caller's clock (a reactor's, or the monotonic
/// one).
#[derive(Debug, Clone, Default)]
pub struct AcceptPacer {
    resume_at: Option<Instant>,
    unlogged: u64,
    logged_at: Option<Instant>,
}

impl AcceptPacer {
    /// How long accepting pauses after a failure for want of resources.
    pub const PAUSE: Duration = Duration::from_millis(100);
    /// The shortest time between two logged failures.
    pub const LOG_EVERY: Duration = Duration::from_secs(10);

    /// A pacer that has seen no failure.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether `accept` may be tried at `now` (not during a pause).
    pub fn ready(&self, now: Instant) -> bool {
        self.resume_at.map_or(true, |t| now >= t)
    }

    /// `accept` failed at `now` with `e` (not `WouldBlock` or `Interrupted`,
    /// which are no failures). Pauses accepting when `e` is for want of
    /// resources. Returns the number of failures to report in a log line
    /// now (this one and those not logged since the last line), or `None`
    /// when the last line is under [`LOG_EVERY`](Self::LOG_EVERY) old.
    pub fn failed(&mut self, e: &std::io::Error, now: Instant) -> Option<u64> {
        self.unlogged += 1;
        if Self::for_want_of_resources(e) {
            self.resume_at = Some(now + Self::PAUSE);
        }
        match self.logged_at {
            Some(t) if now.saturating_duration_since(t) < Self::LOG_EVERY => None,
            _ => {
                self.logged_at = Some(now);
                Some(std::mem::take(&mut self.unlogged))
            }
        }
    }

    /// Whether `e` says the system or the process is out of something an
    /// accepted connection needs (descriptors, memory): retrying at once
    /// fails the same way.
    pub fn for_want_of_resources(e: &std::io::Error) -> bool {
        use rustix::io::Errno;
        e.raw_os_error().is_some_and(|code| {
            [Errno::MFILE, Errno::NFILE, Errno::NOBUFS, Errno::NOMEM]
                .iter()
                .any(|x| x.raw_os_error() == code)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(e: rustix::io::Errno) -> std::io::Error {
        std::io::Error::from_raw_os_error(e.raw_os_error())
    }

    #[test]
    fn out_of_descriptors_pauses_and_logs_once_per_period() {
        let t0 = Instant::now();
        let mut p = AcceptPacer::new();
        assert!(p.ready(t0));
        let emfile = os(rustix::io::Errno::MFILE);
        assert_eq!(
            p.failed(&emfile, t0),
            Some(1),
            "the first failure is logged"
        );
        assert!(!p.ready(t0));
        assert!(!p.ready(t0 + AcceptPacer::PAUSE - Duration::from_millis(1)));
        assert!(p.ready(t0 + AcceptPacer::PAUSE));
        // Failures inside the log period are counted, not logged.
        for k in 1..=5u64 {
            let t = t0 + AcceptPacer::PAUSE * (k as u32);
            assert_eq!(p.failed(&emfile, t), None);
        }
        let later = t0 + AcceptPacer::LOG_EVERY;
        assert_eq!(p.failed(&os(rustix::io::Errno::NFILE), later), Some(6));
        assert!(!p.ready(later));
    }

    #[test]
    fn other_failures_do_not_pause() {
        let t0 = Instant::now();
        let mut p = AcceptPacer::new();
        let aborted = os(rustix::io::Errno::CONNABORTED);
        assert!(!AcceptPacer::for_want_of_resources(&aborted));
        assert_eq!(p.failed(&aborted, t0), Some(1));
        assert!(p.ready(t0));
        for e in [
            rustix::io::Errno::MFILE,
            rustix::io::Errno::NFILE,
            rustix::io::Errno::NOBUFS,
            rustix::io::Errno::NOMEM,
        ] {
            assert!(AcceptPacer::for_want_of_resources(&os(e)), "{e:?}");
        }
    }
}
