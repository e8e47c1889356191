//! [`GroupPoller`]: a poll group's state behind the reactor poller that
//! drives it, and the handle the application keeps.

use std::cell::RefCell;
use std::rc::Rc;

use pollux_reactor::{PollStatus, PollerGuard, Reactor};

/// Group state `S`, polled by one reactor poller until the handle is
/// dropped. The poller holds the state weakly; the handle's accessors
/// answer `None` while the poller is inside it (a call from a callback of
/// the group's own poll).
pub struct GroupPoller<S> {
    // Declared first, so dropped first: the poller goes before the state.
    poller: PollerGuard,
    state: Rc<RefCell<S>>,
}

impl<S> std::fmt::Debug for GroupPoller<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupPoller")
            .field("poller", &self.poller.id())
            .finish()
    }
}

impl<S: 'static> GroupPoller<S> {
    /// Add poller `name` on `reactor` calling `poll(&mut state)`.
    pub fn start(
        reactor: &Reactor,
        name: &'static str,
        state: S,
        poll: fn(&mut S) -> PollStatus,
    ) -> Self {
        let state = Rc::new(RefCell::new(state));
        let weak = Rc::downgrade(&state);
        let poller = PollerGuard::active(reactor, name, move || {
            let Some(s) = weak.upgrade() else {
                return PollStatus::Idle;
            };
            let Ok(mut s) = s.try_borrow_mut() else {
                return PollStatus::Idle;
            };
            poll(&mut s)
        });
        GroupPoller { poller, state }
    }

    /// `f` of the state, unless the poller is inside it.
    pub fn with<R>(&self, f: impl FnOnce(&S) -> R) -> Option<R> {
        self.state.try_borrow().ok().map(|s| f(&s))
    }

    /// `f` of the state, mutably, unless the poller is inside it.
    pub fn with_mut<R>(&self, f: impl FnOnce(&mut S) -> R) -> Option<R> {
        self.state.try_borrow_mut().ok().map(|mut s| f(&mut s))
    }
}
