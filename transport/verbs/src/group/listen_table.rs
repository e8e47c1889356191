//! [`ListenTable`]: a target transport's listen addresses, shared by its
//! poll groups. Each address belongs to one group (round robin over the
//! groups that exist when it is added; the first group to look when none
//! did), which opens the CM listener on its core at its next CM round.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::PoisonError;

use pollux_reactor::sync::{Mutex, MutexGuard};

use crate::CmAddr;

struct Entry<K> {
    addr: CmAddr,
    key: K,
    owner: Option<usize>,
}

/// Listen addresses, each with the key a transport names it by (NVMe-oF:
/// its transport id; iSER: its portal group tag). Control path: a `Mutex`,
/// taken when the list changes and by a group whose
/// [`generation`](Self::generation) check saw it change.
pub struct ListenTable<K> {
    entries: Mutex<Vec<Entry<K>>>,
    gen: AtomicU64,
    groups: AtomicUsize,
}

impl<K> std::fmt::Debug for ListenTable<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let l = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let addrs: Vec<&str> = l.iter().map(|e| e.addr.0.as_str()).collect();
        f.debug_struct("ListenTable")
            .field("addrs", &addrs)
            .finish()
    }
}

impl<K> Default for ListenTable<K> {
    fn default() -> Self {
        ListenTable {
            entries: Mutex::new(Vec::new()),
            gen: AtomicU64::new(1),
            groups: AtomicUsize::new(0),
        }
    }
}

impl<K: Clone + PartialEq> ListenTable<K> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Entry<K>>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The index of a new poll group (0, 1, …, in creation order).
    pub fn next_group(&self) -> usize {
        self.groups.fetch_add(1, Ordering::Relaxed)
    }

    /// Poll groups created so far.
    pub fn groups(&self) -> usize {
        self.groups.load(Ordering::Relaxed)
    }

    /// Listen on `addr` as `key` (several addresses may share a key);
    /// `false` when `addr` is listened on already (nothing changes).
    pub fn add(&self, addr: CmAddr, key: K) -> bool {
        let mut l = self.lock();
        if l.iter().any(|e| e.addr == addr) {
            return false;
        }
        let groups = self.groups();
        let owner = (groups > 0).then(|| l.len() % groups);
        l.push(Entry { addr, key, owner });
        self.gen.fetch_add(1, Ordering::Release);
        true
    }

    /// Stop listening on the entries `pick` selects; `false` when none did.
    pub fn remove(&self, mut pick: impl FnMut(&CmAddr, &K) -> bool) -> bool {
        let mut l = self.lock();
        let before = l.len();
        l.retain(|e| !pick(&e.addr, &e.key));
        let removed = l.len() != before;
        if removed {
            self.gen.fetch_add(1, Ordering::Release);
        }
        removed
    }

    /// Changes so far (a group compares it once per CM round).
    #[inline]
    pub fn generation(&self) -> u64 {
        self.gen.load(Ordering::Acquire)
    }

    /// The entries group `index` owns, claiming those nobody owns yet.
    pub fn claim(&self, index: usize) -> Vec<(CmAddr, K)> {
        let mut l = self.lock();
        let mut mine = Vec::new();
        for e in l.iter_mut() {
            if *e.owner.get_or_insert(index) == index {
                mine.push((e.addr.clone(), e.key.clone()));
            }
        }
        mine
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_go_round_robin_to_the_groups_and_unowned_ones_to_the_first_to_claim() {
        let t: ListenTable<u16> = ListenTable::new();
        assert!(t.add(CmAddr::new("@early"), 9), "before any group");
        assert_eq!((t.next_group(), t.next_group()), (0, 1));
        let g0 = t.generation();
        assert!(t.add(CmAddr::new("@a"), 1));
        assert!(t.add(CmAddr::new("@b"), 2));
        assert!(t.generation() > g0);
        assert!(!t.add(CmAddr::new("@a"), 3), "an address once");
        assert!(t.add(CmAddr::new("@c"), 2), "a key on several addresses");
        let one: Vec<u16> = t.claim(1).into_iter().map(|e| e.1).collect();
        let zero: Vec<u16> = t.claim(0).into_iter().map(|e| e.1).collect();
        assert_eq!(
            one,
            [9, 1, 2],
            "group 1 looked first and took the unowned one"
        );
        assert_eq!(zero, [2]);
        let g1 = t.generation();
        assert!(t.remove(|a, _| a.0 == "@a"));
        assert!(!t.remove(|a, _| a.0 == "@a"));
        assert!(t.generation() > g1);
        let keys: Vec<u16> = t.claim(1).into_iter().map(|e| e.1).collect();
        assert_eq!(keys, [9, 2], "key 1 is gone, the others stay");
        assert!(t.add(CmAddr::new("@a"), 4), "a removed address again");
    }
}
