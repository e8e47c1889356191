//! The thread-local "reactor of this thread" behind [`Reactor::current`].

use std::cell::Cell;

use crate::Reactor;

thread_local! {
    static CURRENT: Cell<Option<Reactor>> = const { Cell::new(None) };
}

/// The reactor running on this thread, if any.
pub(crate) fn get() -> Option<Reactor> {
    CURRENT.with(|c| {
        let r = c.take();
        let out = r.clone();
        c.set(r);
        out
    })
}

/// Makes a reactor current until dropped, then restores the previous one
/// (so a [`TestCluster`](crate::TestCluster) can switch reactors on one thread).
pub(crate) struct CurrentGuard {
    prev: Option<Reactor>,
}

impl CurrentGuard {
    pub(crate) fn enter(r: &Reactor) -> Self {
        let prev = CURRENT.with(|c| c.replace(Some(r.clone())));
        Self { prev }
    }
}

impl Drop for CurrentGuard {
    fn drop(&mut self) {
        let prev = self.prev.take();
        let old = CURRENT.with(|c| c.replace(prev));
        drop(old);
    }
}
