//! `CountingAlloc`: a global allocator for tests that counts heap
//! allocations (feature `test-util`).
//!
//! A data-path rule test installs it in its own test binary (a global
//! allocator is per binary) with
//! `#[global_allocator] static A: CountingAlloc = CountingAlloc;`, runs a
//! path warm, takes a [`DataPathCounts::now`], runs N more I/Os and asserts
//! that [`DataPathCounts::since`] is zero: no allocation, no reallocation and
//! (with the `count-locks` feature) no lock acquisition in between.
//!
//! Allocations are counted per thread: [`DataPathCounts`] holds those of
//! the calling thread, the one a [`crate::TestCluster`] polls its reactors
//! on. The test harness's own threads (libtest records a running test in a
//! map from its main thread, at a moment of its choosing) then cannot show
//! up in a measured window; the process-wide total is still there
//! ([`CountingAlloc::allocations`]).
//!
//! It also keeps the bytes live on the heap ([`CountingAlloc::live_bytes`]):
//! a soak or storm test compares them before and after, which tells a leak
//! from memory the system allocator keeps for reuse (RSS cannot).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

static ALLOCS: AtomicU64 = AtomicU64::new(0);
/// Bytes allocated and not yet freed.
static LIVE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Allocations and reallocations made by this thread.
    static THREAD_ALLOCS: Cell<u64> = const { Cell::new(0) };
    /// Backtraces still to print for this thread (see [`CountingAlloc::trace`]).
    static TRACE: Cell<u32> = const { Cell::new(0) };
    /// Set while this thread prints a trace (printing allocates).
    static TRACING: Cell<bool> = const { Cell::new(false) };
}

/// Count one allocation (not the tracing's own); while tracing, print
/// where it came from.
#[inline]
fn count(layout: Layout) {
    // `try_with`: a thread's last allocations may come after its
    // thread-locals are gone; those count in the process total only.
    if TRACING.try_with(Cell::get).unwrap_or(false) {
        // The trace's own printing: not the code under test.
        return;
    }
    ALLOCS.fetch_add(1, Ordering::Relaxed);
    let _ = THREAD_ALLOCS.try_with(|c| c.set(c.get() + 1));
    let left = TRACE.try_with(Cell::get).unwrap_or(0);
    if left > 0 {
        TRACE.with(|t| t.set(left - 1));
        TRACING.with(|t| t.set(true));
        let bt = std::backtrace::Backtrace::force_capture();
        eprintln!("counting allocator: {layout:?} allocated at\n{bt}");
        TRACING.with(|t| t.set(false));
    }
}

/// The system allocator, counting allocations and reallocations
/// (frees are not counted: giving memory back is not a per-I/O cost the rule
/// forbids, and it always follows an allocation that was counted).
#[derive(Debug, Clone, Copy, Default)]
pub struct CountingAlloc;

impl CountingAlloc {
    /// Allocations and reallocations made through it so far (all threads).
    pub fn allocations() -> u64 {
        ALLOCS.load(Ordering::Relaxed)
    }

    /// Allocations and reallocations the calling thread made through it so
    /// far.
    pub fn thread_allocations() -> u64 {
        THREAD_ALLOCS.with(Cell::get)
    }

    /// Bytes allocated through it and not yet freed (all threads): 0 in a
    /// process that does not install it.
    pub fn live_bytes() -> usize {
        LIVE.load(Ordering::Relaxed)
    }

    /// Print a backtrace of each of the calling thread's next `first`
    /// counted allocations to stderr (0: stop), so that a failing rule test
    /// shows where its allocations come from (shown with the test's output).
    pub fn trace(first: u32) {
        TRACE.with(|t| t.set(first));
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees are ours; the counters are relaxed
// atomic adds and const-initialised thread-locals without destructors,
// none of which allocates (tracing, a test's debugging aid, allocates
// through this allocator with a re-entry guard).
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout);
        // SAFETY: forwarded with the caller's guarantees (non-zero size).
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout);
        // SAFETY: as in `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(layout);
        // SAFETY: `ptr` came from this allocator (i.e. `System`) with
        // `layout`, as the caller guarantees.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(new_size, Ordering::Relaxed);
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator (i.e. `System`) with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

/// Heap allocations and lock acquisitions at one moment (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataPathCounts {
    /// Allocations and reallocations by the calling thread
    /// ([`CountingAlloc::thread_allocations`]).
    pub allocations: u64,
    /// Lock acquisitions ([`crate::sync::lock_acquisitions`]).
    pub locks: u64,
}

impl DataPathCounts {
    /// The counts now.
    pub fn now() -> Self {
        Self {
            allocations: CountingAlloc::thread_allocations(),
            locks: crate::sync::lock_acquisitions(),
        }
    }

    /// What happened since `self` was taken.
    pub fn since(&self) -> Self {
        let n = Self::now();
        Self {
            allocations: n.allocations - self.allocations,
            locks: n.locks - self.locks,
        }
    }

    /// Zero of both.
    pub fn is_zero(&self) -> bool {
        self.allocations == 0 && self.locks == 0
    }
}
