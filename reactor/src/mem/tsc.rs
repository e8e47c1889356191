//! The time-stamp counter read (x86-64), the one `unsafe` of the I/O clock
//! ([`IoClock`](crate::IoClock)): it lives here with the crate's other
//! `unsafe` code. Elsewhere it reads 0 and the clock uses `CLOCK_MONOTONIC`.

/// The CPU's time-stamp counter.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn read() -> u64 {
    // SAFETY: RDTSC reads a counter into registers: no memory access, no
    // side effect, and every x86-64 CPU has it (the clock checks that the
    // counter is invariant before it relies on it).
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// No time-stamp counter on this architecture.
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub(crate) fn read() -> u64 {
    0
}
