//! The control path's lock, counted.
//!
//! Control-path state shared between cores (registries, a target's
//! subsystems, a placement table) sits behind [`Mutex`]: the standard mutex
//! with the same API, whose every acquisition is counted when the crate's
//! `count-locks` feature is on. The data-path rule tests run a data path
//! warm and assert that [`lock_acquisitions`] did not move, so a lock that
//! slips into a per-I/O path fails them. Without the feature the count stays
//! 0 and the wrapper costs nothing.

use std::fmt;
use std::sync::{LockResult, TryLockResult};

pub use std::sync::MutexGuard;

#[cfg(feature = "count-locks")]
static ACQUIRED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[inline]
fn counted() {
    #[cfg(feature = "count-locks")]
    ACQUIRED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Acquisitions of every [`Mutex`] of the process so far (all threads); 0
/// unless the `count-locks` feature is on.
pub fn lock_acquisitions() -> u64 {
    #[cfg(feature = "count-locks")]
    return ACQUIRED.load(std::sync::atomic::Ordering::Relaxed);
    #[cfg(not(feature = "count-locks"))]
    0
}

/// Whether [`lock_acquisitions`] counts (the `count-locks` feature is on).
pub const fn locks_counted() -> bool {
    cfg!(feature = "count-locks")
}

/// [`std::sync::Mutex`], counted (see the module docs). Control path only.
#[derive(Default)]
#[allow(clippy::disallowed_types)] // the one place the standard mutex is used
pub struct Mutex<T: ?Sized>(std::sync::Mutex<T>);

impl<T> Mutex<T> {
    /// A new unlocked mutex holding `v`.
    #[allow(clippy::disallowed_types)] // the wrapped standard mutex
    pub const fn new(v: T) -> Self {
        Self(std::sync::Mutex::new(v))
    }

    /// The value, consuming the mutex.
    ///
    /// # Errors
    /// As [`std::sync::Mutex::into_inner`] (poisoned).
    pub fn into_inner(self) -> LockResult<T> {
        self.0.into_inner()
    }
}

impl<T: ?Sized> Mutex<T> {
    /// Acquire it (counted), as [`std::sync::Mutex::lock`].
    ///
    /// # Errors
    /// As [`std::sync::Mutex::lock`]: a holder panicked (poisoned).
    #[inline]
    pub fn lock(&self) -> LockResult<MutexGuard<'_, T>> {
        counted();
        self.0.lock()
    }

    /// Acquire it if free (counted when it is), as
    /// [`std::sync::Mutex::try_lock`].
    ///
    /// # Errors
    /// As [`std::sync::Mutex::try_lock`].
    #[inline]
    pub fn try_lock(&self) -> TryLockResult<MutexGuard<'_, T>> {
        let r = self.0.try_lock();
        if r.is_ok() {
            counted();
        }
        r
    }

    /// The value through `&mut` (no locking, not counted).
    ///
    /// # Errors
    /// As [`std::sync::Mutex::get_mut`] (poisoned).
    pub fn get_mut(&mut self) -> LockResult<&mut T> {
        self.0.get_mut()
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_acquisition_is_counted_when_the_feature_is_on() {
        let m = Mutex::new(1u32);
        let before = lock_acquisitions();
        *m.lock().unwrap() += 1;
        drop(m.try_lock().unwrap());
        let held = m.lock().unwrap();
        assert!(m.try_lock().is_err(), "a held mutex is not acquired again");
        drop(held);
        // Other tests of this binary may lock too: at least ours counted.
        let counted = lock_acquisitions() - before;
        if locks_counted() {
            assert!(counted >= 3, "{counted}");
        } else {
            assert_eq!(counted, 0);
        }
        assert_eq!(m.into_inner().unwrap(), 2);
    }
}
