//! Cross-core messages: one bounded `crossbeam-channel` inbox per reactor and
//! the [`Messenger`] that reaches every inbox of a reactor set.
//!
//! A message is a boxed `FnOnce(&Reactor) + Send` (control path: the box is
//! the message itself, nothing else is allocated).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender, TrySendError};

use crate::cores::CoreId;
use crate::error::SendError;
use crate::wake::WakeSignal;
use crate::Reactor;

/// A message: runs once on the destination reactor.
pub(crate) type Message = Box<dyn FnOnce(&Reactor) + Send + 'static>;

/// What a sender needs to reach one core.
pub(crate) struct CoreSlot {
    pub(crate) tx: Sender<Message>,
    pub(crate) wake: Arc<WakeSignal>,
    /// Set by the reactor when it stops; sends then fail with `Stopped`.
    pub(crate) stopped: AtomicBool,
}

/// The inboxes of one reactor set, indexed by core number.
pub(crate) struct Mailboxes {
    /// `slots[core]`; `None` for a core outside the set.
    slots: Vec<Option<CoreSlot>>,
    cores: Vec<CoreId>,
}

/// The reactor-side half of one inbox, created with [`Mailboxes::build`].
pub(crate) struct Inbox {
    pub(crate) rx: Receiver<Message>,
    pub(crate) wake: Arc<WakeSignal>,
}

impl Mailboxes {
    /// Builds one inbox per `(core, wake signal)`, each `depth` deep.
    pub(crate) fn build(
        cores: impl IntoIterator<Item = (CoreId, Arc<WakeSignal>)>,
        depth: usize,
    ) -> (Arc<Self>, Vec<(CoreId, Inbox)>) {
        let mut slots: Vec<Option<CoreSlot>> = Vec::new();
        let mut inboxes = Vec::new();
        let mut list = Vec::new();
        for (core, wake) in cores {
            let (tx, rx) = crossbeam_channel::bounded(depth.max(1));
            let idx = core as usize;
            if slots.len() <= idx {
                slots.resize_with(idx + 1, || None);
            }
            slots[idx] = Some(CoreSlot {
                tx,
                wake: wake.clone(),
                stopped: AtomicBool::new(false),
            });
            list.push(core);
            inboxes.push((core, Inbox { rx, wake }));
        }
        list.sort_unstable();
        (Arc::new(Self { slots, cores: list }), inboxes)
    }

    pub(crate) fn slot(&self, core: CoreId) -> Option<&CoreSlot> {
        self.slots.get(core as usize).and_then(Option::as_ref)
    }
}

/// A `Send + Clone` handle that queues messages on any reactor of a set.
///
/// Get one from [`Reactor::messenger`] or
/// [`ReactorSet::messenger`](crate::ReactorSet::messenger).
#[derive(Clone)]
pub struct Messenger {
    boxes: Arc<Mailboxes>,
}

impl std::fmt::Debug for Messenger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Messenger")
            .field("cores", &self.boxes.cores)
            .finish()
    }
}

impl Messenger {
    pub(crate) fn new(boxes: Arc<Mailboxes>) -> Self {
        Self { boxes }
    }

    /// Queues `f` to run on `core`'s reactor, after the messages queued
    /// before it by this thread. Never blocks; wakes a sleeping reactor.
    ///
    /// # Errors
    ///
    /// [`SendError::UnknownCore`] for a core outside the set,
    /// [`SendError::Stopped`] once that reactor has stopped,
    /// [`SendError::Full`] when its inbox is full.
    pub fn send(
        &self,
        core: CoreId,
        f: impl FnOnce(&Reactor) + Send + 'static,
    ) -> Result<(), SendError> {
        self.send_boxed(core, Box::new(f))
    }

    pub(crate) fn send_boxed(&self, core: CoreId, msg: Message) -> Result<(), SendError> {
        let slot = self.boxes.slot(core).ok_or(SendError::UnknownCore(core))?;
        if slot.stopped.load(Ordering::Acquire) {
            return Err(SendError::Stopped(core));
        }
        match slot.tx.try_send(msg) {
            Ok(()) => {
                slot.wake.notify();
                Ok(())
            }
            Err(TrySendError::Full(_)) => Err(SendError::Full(core)),
            Err(TrySendError::Disconnected(_)) => Err(SendError::Stopped(core)),
        }
    }

    /// Like [`send`](Self::send), but waits for room when the inbox is full
    /// (control path, for threads that are not reactors: a reactor that
    /// blocks here could deadlock with the one it waits for).
    ///
    /// # Errors
    ///
    /// [`SendError::UnknownCore`] or [`SendError::Stopped`].
    pub fn send_blocking(
        &self,
        core: CoreId,
        f: impl FnOnce(&Reactor) + Send + 'static,
    ) -> Result<(), SendError> {
        let slot = self.boxes.slot(core).ok_or(SendError::UnknownCore(core))?;
        if slot.stopped.load(Ordering::Acquire) {
            return Err(SendError::Stopped(core));
        }
        let msg: Message = Box::new(f);
        slot.tx.send(msg).map_err(|_| SendError::Stopped(core))?;
        slot.wake.notify();
        Ok(())
    }

    /// The cores of the set, ascending.
    pub fn cores(&self) -> &[CoreId] {
        &self.boxes.cores
    }

    /// Whether the reactor of `core` has stopped (`true` for an unknown core).
    pub fn is_stopped(&self, core: CoreId) -> bool {
        self.boxes
            .slot(core)
            .map_or(true, |s| s.stopped.load(Ordering::Acquire))
    }

    pub(crate) fn mark_stopped(&self, core: CoreId) {
        if let Some(s) = self.boxes.slot(core) {
            s.stopped.store(true, Ordering::Release);
        }
    }

    /// Messages waiting in `core`'s inbox (0 for an unknown core).
    pub fn pending(&self, core: CoreId) -> usize {
        self.boxes.slot(core).map_or(0, |s| s.tx.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wake::IdleMode;

    fn boxes(cores: &[CoreId], depth: usize) -> (Messenger, Vec<(CoreId, Inbox)>) {
        let (b, inboxes) = Mailboxes::build(
            cores
                .iter()
                .map(|&c| (c, Arc::new(WakeSignal::new(IdleMode::BusyPoll).unwrap()))),
            depth,
        );
        (Messenger::new(b), inboxes)
    }

    #[test]
    fn typed_errors_for_unknown_full_and_stopped() {
        let (m, inboxes) = boxes(&[0, 2], 1);
        assert_eq!(m.cores(), &[0, 2]);
        assert_eq!(m.send(1, |_| {}), Err(SendError::UnknownCore(1)));
        assert_eq!(m.send(7, |_| {}), Err(SendError::UnknownCore(7)));
        assert_eq!(m.send(2, |_| {}), Ok(()));
        assert_eq!(m.pending(2), 1);
        assert_eq!(m.send(2, |_| {}), Err(SendError::Full(2)));
        m.mark_stopped(0);
        assert!(m.is_stopped(0));
        assert_eq!(m.send(0, |_| {}), Err(SendError::Stopped(0)));
        drop(inboxes);
        // The receiver is gone: stopped, even without the flag.
        assert!(matches!(
            m.send_blocking(2, |_| {}),
            Err(SendError::Stopped(2))
        ));
    }

    #[test]
    fn messenger_is_send_and_clone() {
        fn assert_send_clone<T: Send + Sync + Clone>() {}
        assert_send_clone::<Messenger>();
    }
}
