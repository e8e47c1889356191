//! `ObjPool<T>`: a fixed-capacity, `!Send`, `slab`-backed pool of request and
//! context objects, with generation-checked keys.

use std::fmt;
use std::marker::PhantomData;
use std::rc::Rc;

use slab::Slab;

/// The key of an object in an [`ObjPool`]: a slot and the generation of its
/// occupant, so a stale key (its object removed, the slot reused) finds
/// nothing instead of another request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ObjKey {
    slot: u32,
    gen: u32,
}

impl ObjKey {
    /// The key packed in a `u64` (for `wr_id`s and io tokens).
    pub fn to_u64(self) -> u64 {
        (u64::from(self.gen) << 32) | u64::from(self.slot)
    }

    /// A key unpacked from [`to_u64`](Self::to_u64). Any value is accepted;
    /// a bogus one just finds nothing in the pool.
    pub fn from_u64(v: u64) -> ObjKey {
        ObjKey {
            slot: v as u32,
            gen: (v >> 32) as u32,
        }
    }

    /// The slot index (dense, `< capacity`).
    pub fn slot(self) -> usize {
        self.slot as usize
    }
}

/// A fixed-capacity pool of `T` (`!Send`: one per reactor).
///
/// All memory is allocated by [`ObjPool::with_capacity`]; `insert` on a full
/// pool gives the value back (back-pressure), so the pool never reallocates.
/// It stays on its reactor:
/// ```compile_fail
/// use pollux_reactor::mem::ObjPool;
/// fn send<T: Send>(_: T) {}
/// send(ObjPool::<u32>::with_capacity(4));
/// ```
pub struct ObjPool<T> {
    // INVARIANT: `slab.len() <= cap` and the slab was created with capacity
    // `cap`, so it never reallocates.
    slab: Slab<(u32, T)>,
    cap: usize,
    next_gen: u32,
    _not_send: PhantomData<Rc<()>>,
}

impl<T> fmt::Debug for ObjPool<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjPool")
            .field("len", &self.slab.len())
            .field("capacity", &self.cap)
            .finish()
    }
}

impl<T> ObjPool<T> {
    /// A pool of `capacity` objects (control path: allocates once). The
    /// capacity is clamped to `u32::MAX`.
    pub fn with_capacity(capacity: usize) -> ObjPool<T> {
        let cap = capacity.min(u32::MAX as usize);
        ObjPool {
            slab: Slab::with_capacity(cap),
            cap,
            next_gen: 0,
            _not_send: PhantomData,
        }
    }

    /// Store `value`; `Err(value)` when the pool is full.
    pub fn insert(&mut self, value: T) -> Result<ObjKey, T> {
        if self.slab.len() >= self.cap {
            return Err(value);
        }
        let gen = self.next_gen;
        self.next_gen = self.next_gen.wrapping_add(1);
        let slot = self.slab.insert((gen, value));
        // `slot < cap <= u32::MAX`.
        Ok(ObjKey {
            slot: slot as u32,
            gen,
        })
    }

    /// The object of `key`, if it is still there.
    pub fn get(&self, key: ObjKey) -> Option<&T> {
        match self.slab.get(key.slot()) {
            Some((g, v)) if *g == key.gen => Some(v),
            _ => None,
        }
    }

    /// The object of `key` mutably, if it is still there.
    pub fn get_mut(&mut self, key: ObjKey) -> Option<&mut T> {
        match self.slab.get_mut(key.slot()) {
            Some((g, v)) if *g == key.gen => Some(v),
            _ => None,
        }
    }

    /// Take the object of `key` out, if it is still there.
    pub fn remove(&mut self, key: ObjKey) -> Option<T> {
        match self.slab.get(key.slot()) {
            Some((g, _)) if *g == key.gen => self.slab.try_remove(key.slot()).map(|(_, v)| v),
            _ => None,
        }
    }

    /// Whether `key` names a live object.
    pub fn contains(&self, key: ObjKey) -> bool {
        self.get(key).is_some()
    }

    /// Number of live objects.
    pub fn len(&self) -> usize {
        self.slab.len()
    }

    /// Whether the pool holds no object.
    pub fn is_empty(&self) -> bool {
        self.slab.is_empty()
    }

    /// Whether the pool is full.
    pub fn is_full(&self) -> bool {
        self.slab.len() >= self.cap
    }

    /// Fixed capacity.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Live objects with their keys.
    pub fn iter(&self) -> impl Iterator<Item = (ObjKey, &T)> {
        self.slab.iter().map(|(slot, (gen, v))| {
            (
                ObjKey {
                    slot: slot as u32,
                    gen: *gen,
                },
                v,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_pool_gives_the_value_back_and_never_grows() {
        let mut p = ObjPool::with_capacity(3);
        let inner_cap = p.slab.capacity();
        let mut keys: Vec<ObjKey> = (0..3).map(|i| p.insert(i).unwrap()).collect();
        assert_eq!(p.insert(99), Err(99));
        assert!(p.is_full());
        for round in 0..100 {
            let k = keys[round % 3];
            assert!(p.remove(k).is_some());
            keys[round % 3] = p.insert(round).unwrap();
            assert_eq!(p.insert(1000), Err(1000));
        }
        assert_eq!(p.len(), 3);
        assert_eq!(p.slab.capacity(), inner_cap, "no reallocation");
    }

    #[test]
    fn stale_keys_find_nothing() {
        let mut p = ObjPool::with_capacity(1);
        let a = p.insert("a").unwrap();
        assert_eq!(p.get(a), Some(&"a"));
        *p.get_mut(a).unwrap() = "a2";
        assert_eq!(p.remove(a), Some("a2"));
        let b = p.insert("b").unwrap();
        assert_eq!(a.slot(), b.slot(), "slot reused");
        assert_eq!(p.get(a), None, "stale key");
        assert_eq!(p.remove(a), None);
        assert_eq!(p.get(ObjKey::from_u64(b.to_u64())), Some(&"b"));
        assert_eq!(p.get(ObjKey::from_u64(u64::MAX)), None);
        assert_eq!(p.iter().count(), 1);
    }
}
