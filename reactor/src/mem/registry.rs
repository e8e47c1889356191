//! `ArenaRegistry`: the process-wide list of local DMA arenas, with
//! notification hooks (the role of SPDK's `spdk_mem_map` notifications).
//!
//! Control path: the registry takes a `Mutex` on every add, remove, lookup
//! and subscribe. The data path should not call [`ArenaRegistry::lookup`] per
//! I/O; a buffer already knows its arena ([`DmaBuf::arena_id`](super::DmaBuf::arena_id)).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, OnceLock, Weak};

use crate::sync::{Mutex, MutexGuard};

use super::arena::{ArenaId, DmaArena};

/// What happened to an arena, as told to a subscriber hook.
#[derive(Clone)]
#[non_exhaustive]
pub enum ArenaEvent {
    /// A local arena exists (replayed for existing arenas on subscribe).
    Added(Arc<DmaArena>),
    /// A local arena is being dropped; it is still mapped during the call and
    /// is unmapped right after the hooks return.
    Removed(ArenaId),
}

impl fmt::Debug for ArenaEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArenaEvent::Added(a) => write!(f, "Added({})", a.id()),
            ArenaEvent::Removed(id) => write!(f, "Removed({id})"),
        }
    }
}

/// A subscriber hook. It runs on whichever thread creates or drops an arena.
pub type ArenaHook = Arc<dyn Fn(ArenaEvent) + Send + Sync>;

struct Entry {
    id: ArenaId,
    len: usize,
    arena: Weak<DmaArena>,
}

#[derive(Default)]
struct Inner {
    /// Keyed by base address.
    arenas: BTreeMap<usize, Entry>,
    hooks: Vec<(u64, ArenaHook)>,
    next_sub: u64,
}

/// The global registry of local [`DmaArena`]s: every arena made by
/// [`DmaArena::new`] registers itself on creation and unregisters on drop.
///
/// Hooks are always called **without** the registry lock held, so a hook may
/// create or drop arenas, look them up, or subscribe; the price is that a hook
/// may see events from several threads concurrently and, after its
/// [`Subscription`] is dropped, may still be finishing a call that started
/// before. A hook may also see `Removed` for an arena whose `Added` it never
/// saw (an arena dropped while the hook was being subscribed): ignore unknown
/// ids. The registry holds arenas weakly; a hook that stores the
/// `Arc<DmaArena>` from `Added` keeps that arena alive, so keep its id, a
/// `Weak`, or a dup of its fd instead.
pub struct ArenaRegistry {
    inner: Mutex<Inner>,
}

/// Keeps a hook subscribed; dropping it unsubscribes.
#[must_use = "dropping the Subscription unsubscribes the hook"]
pub struct Subscription {
    id: u64,
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("id", &self.id)
            .finish()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        ArenaRegistry::global()
            .lock()
            .hooks
            .retain(|(id, _)| *id != self.id);
    }
}

impl ArenaRegistry {
    /// The process-wide registry.
    pub fn global() -> &'static ArenaRegistry {
        static GLOBAL: OnceLock<ArenaRegistry> = OnceLock::new();
        GLOBAL.get_or_init(|| ArenaRegistry {
            inner: Mutex::new(Inner::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panicking hook never runs under the lock, so poisoning can only
        // come from a bug in this file; the map is still consistent then.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every live local arena, in address order.
    pub fn arenas(&self) -> Vec<Arc<DmaArena>> {
        self.lock()
            .arenas
            .values()
            .filter_map(|e| e.arena.upgrade())
            .collect()
    }

    /// The live local arena containing all of `addr..addr+len`, and the offset
    /// of `addr` in it.
    pub fn lookup(&self, addr: usize, len: usize) -> Option<(Arc<DmaArena>, usize)> {
        let inner = self.lock();
        let (&base, entry) = inner.arenas.range(..=addr).next_back()?;
        let end = addr.checked_add(len)?;
        if end > base + entry.len {
            return None;
        }
        let arena = entry.arena.upgrade()?;
        Some((arena, addr - base))
    }

    /// Call `hook` with `Added` for every existing arena now, then for every
    /// new arena, and `Removed` for every arena dropped, until the returned
    /// [`Subscription`] is dropped.
    pub fn subscribe(&self, hook: ArenaHook) -> Subscription {
        let (id, existing) = {
            let mut inner = self.lock();
            let id = inner.next_sub;
            inner.next_sub += 1;
            inner.hooks.push((id, Arc::clone(&hook)));
            let existing: Vec<Arc<DmaArena>> = inner
                .arenas
                .values()
                .filter_map(|e| e.arena.upgrade())
                .collect();
            (id, existing)
        };
        for a in existing {
            hook(ArenaEvent::Added(a));
        }
        Subscription { id }
    }

    /// Number of live subscriptions.
    pub fn subscribers(&self) -> usize {
        self.lock().hooks.len()
    }

    pub(super) fn add(&self, arena: &Arc<DmaArena>) {
        let hooks = {
            let mut inner = self.lock();
            inner.arenas.insert(
                arena.base_addr(),
                Entry {
                    id: arena.id(),
                    len: arena.len(),
                    arena: Arc::downgrade(arena),
                },
            );
            snapshot(&inner)
        };
        for h in hooks {
            h(ArenaEvent::Added(Arc::clone(arena)));
        }
    }

    pub(super) fn remove(&self, id: ArenaId) {
        let hooks = {
            let mut inner = self.lock();
            inner.arenas.retain(|_, e| e.id != id);
            snapshot(&inner)
        };
        for h in hooks {
            h(ArenaEvent::Removed(id));
        }
    }
}

fn snapshot(inner: &Inner) -> Vec<ArenaHook> {
    inner.hooks.iter().map(|(_, h)| Arc::clone(h)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::{ArenaOptions, HugepageMode};
    use std::collections::HashSet;

    fn arena(len: usize) -> Arc<DmaArena> {
        DmaArena::new(
            len,
            ArenaOptions::named("t-reg").hugepages(HugepageMode::Never),
        )
        .unwrap()
    }

    #[test]
    fn lookup_finds_ranges_inside_and_rejects_outside() {
        let a = arena(8192);
        let reg = ArenaRegistry::global();
        let (found, off) = reg.lookup(a.base_addr() + 100, 200).unwrap();
        assert_eq!(found.id(), a.id());
        assert_eq!(off, 100);
        assert!(reg.lookup(a.base_addr() + 8000, 193).is_none());
        assert!(reg.lookup(a.base_addr() + 8000, 192).is_some());
        assert!(reg.arenas().iter().any(|x| x.id() == a.id()));
        let (base, id) = (a.base_addr(), a.id());
        drop(found);
        drop(a);
        assert!(reg.lookup(base, 1).map(|(x, _)| x.id()) != Some(id));
        assert!(reg.arenas().iter().all(|x| x.id() != id));
    }

    #[test]
    fn subscribe_replays_then_follows_until_dropped() {
        // Other tests create arenas concurrently: only track our own ids.
        let a = arena(4096);
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let s2 = Arc::clone(&seen);
        let sub = ArenaRegistry::global().subscribe(Arc::new(move |ev| {
            s2.lock().unwrap().push(format!("{ev:?}"));
        }));
        let has = |s: &str| seen.lock().unwrap().iter().any(|x| x == s);
        assert!(
            has(&format!("Added({})", a.id())),
            "replay of an existing arena"
        );
        let b = arena(4096);
        assert!(has(&format!("Added({})", b.id())));
        let bid = b.id();
        drop(b);
        assert!(has(&format!("Removed({bid})")));
        drop(sub);
        let c = arena(4096);
        assert!(
            !has(&format!("Added({})", c.id())),
            "no events after unsubscribe"
        );
    }

    #[test]
    fn hook_may_create_an_arena_without_deadlock() {
        let made: Arc<Mutex<HashSet<ArenaId>>> = Arc::default();
        let m2 = Arc::clone(&made);
        let trigger = arena(4096);
        let tid = trigger.id();
        let sub = ArenaRegistry::global().subscribe(Arc::new(move |ev| {
            if let ArenaEvent::Removed(id) = ev {
                if id == tid {
                    // Creating (and dropping) an arena from inside a hook.
                    let inner = arena(4096);
                    m2.lock().unwrap().insert(inner.id());
                }
            }
        }));
        drop(trigger);
        assert_eq!(made.lock().unwrap().len(), 1);
        drop(sub);
    }
}
