//! `IoClock`: a cheap, calibrated clock for per-I/O timestamps.
//!
//! Where the CPU says its time-stamp counter is invariant (CPUID leaf
//! `0x8000_0007`, EDX bit 8: constant rate, running in every power state),
//! a timestamp is one `RDTSC` (SPDK's `spdk_get_ticks`), converted to
//! nanoseconds with a factor measured once per process against
//! `CLOCK_MONOTONIC`. Elsewhere (another architecture, a hypervisor that
//! hides the bit) it falls back to `CLOCK_MONOTONIC` itself, in
//! nanoseconds. Every component takes timestamps the same way through
//! [`IoClock::get`]; the reactor's per-loop clock ([`Reactor::now`]) stays
//! the cheaper choice where loop resolution is enough.
//!
//! [`Reactor::now`]: crate::Reactor::now

use std::fmt;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::mem::tsc;

/// Where an [`IoClock`] reads the time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockSource {
    /// The invariant time-stamp counter (`RDTSC`), calibrated.
    Tsc,
    /// `CLOCK_MONOTONIC` (a vDSO call), in nanoseconds.
    Monotonic,
}

impl ClockSource {
    /// `"tsc"` or `"monotonic"` (reports, JSON).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tsc => "tsc",
            Self::Monotonic => "monotonic",
        }
    }
}

impl fmt::Display for ClockSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A per-I/O clock: [`now`](Self::now) gives ticks,
/// [`ticks_to_ns`](Self::ticks_to_ns) turns a difference of two into
/// nanoseconds. `Copy`; reading it takes no lock and allocates nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoClock {
    source: ClockSource,
    /// Nanoseconds per tick, fixed point with 32 fractional bits.
    ns_per_tick: u64,
    /// Ticks per second (as calibrated).
    hz: u64,
}

/// How long the one-time calibration compares the two clocks.
const CALIBRATION: Duration = Duration::from_millis(20);

impl IoClock {
    /// The process's clock: the TSC if it is invariant, else
    /// `CLOCK_MONOTONIC`. The first call calibrates (about 20 ms, control
    /// path); later calls return the same value.
    pub fn get() -> IoClock {
        static CLOCK: OnceLock<IoClock> = OnceLock::new();
        *CLOCK.get_or_init(|| {
            if tsc_is_invariant() {
                Self::calibrate_tsc()
            } else {
                Self::monotonic()
            }
        })
    }

    /// `CLOCK_MONOTONIC` in nanoseconds (the fallback, and for tests).
    pub fn monotonic() -> IoClock {
        IoClock {
            source: ClockSource::Monotonic,
            ns_per_tick: 1 << 32,
            hz: 1_000_000_000,
        }
    }

    /// The TSC measured against `CLOCK_MONOTONIC` over `CALIBRATION`.
    fn calibrate_tsc() -> IoClock {
        let (t0, m0) = (tsc::read(), Instant::now());
        while m0.elapsed() < CALIBRATION {
            std::hint::spin_loop();
        }
        let (t1, elapsed) = (tsc::read(), m0.elapsed());
        let ticks = t1.wrapping_sub(t0);
        let ns = elapsed.as_nanos().max(1);
        if ticks == 0 {
            return Self::monotonic();
        }
        let hz = (u128::from(ticks) * 1_000_000_000 / ns) as u64;
        let ns_per_tick = ((ns << 32) / u128::from(ticks)) as u64;
        IoClock {
            source: ClockSource::Tsc,
            ns_per_tick: ns_per_tick.max(1),
            hz,
        }
    }

    /// Where it reads the time.
    pub fn source(&self) -> ClockSource {
        self.source
    }

    /// Ticks per second.
    pub fn hz(&self) -> u64 {
        self.hz
    }

    /// The time now, in ticks.
    #[inline(always)]
    pub fn now(&self) -> u64 {
        match self.source {
            ClockSource::Tsc => tsc::read(),
            ClockSource::Monotonic => monotonic_ns(),
        }
    }

    /// `ticks` (a difference of two [`now`](Self::now)s) in nanoseconds.
    #[inline(always)]
    pub fn ticks_to_ns(&self, ticks: u64) -> u64 {
        ((u128::from(ticks) * u128::from(self.ns_per_tick)) >> 32) as u64
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds.
#[inline]
fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(t.tv_nsec as u64)
}

/// Whether CPUID says the TSC is invariant.
#[cfg(target_arch = "x86_64")]
fn tsc_is_invariant() -> bool {
    use core::arch::x86_64::__cpuid;
    let max_ext = __cpuid(0x8000_0000).eax;
    max_ext >= 0x8000_0007 && __cpuid(0x8000_0007).edx & (1 << 8) != 0
}

#[cfg(not(target_arch = "x86_64"))]
fn tsc_is_invariant() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_moves_forward_and_a_second_of_ticks_is_a_second() {
        for c in [IoClock::get(), IoClock::monotonic()] {
            let a = c.now();
            std::thread::sleep(Duration::from_millis(2));
            assert!(c.now() > a, "{c:?}");
            let one_s = c.ticks_to_ns(c.hz());
            assert!(one_s.abs_diff(1_000_000_000) < 1_000_000, "{c:?}: {one_s}");
            assert_eq!(c.ticks_to_ns(0), 0);
        }
    }

    #[test]
    fn the_source_follows_cpuid_and_is_named() {
        let c = IoClock::get();
        let want = if tsc_is_invariant() {
            ClockSource::Tsc
        } else {
            ClockSource::Monotonic
        };
        assert_eq!(c.source(), want);
        assert_eq!(IoClock::monotonic().source().as_str(), "monotonic");
        assert_eq!(IoClock::monotonic().ticks_to_ns(1234), 1234);
        assert_eq!(c, IoClock::get(), "calibrated once");
    }
}
