//! [`ConnTable`]: a poll group's connections by slot, with the slot's
//! generation (so a stale work-request token names nothing) and a map from
//! QP number (for completions of a shared receive queue, which carry no
//! connection in their token).

use std::collections::HashMap;

/// Most connections one table holds: slots are `u16` and the last value
/// names no connection in receive tokens.
pub const MAX_CONNS: usize = u16::MAX as usize - 1;

/// A generation no token carries (tokens have 14 bits): an empty slot's.
const NO_GEN: u16 = u16::MAX;
/// A QP number no QP has (they have 24 bits): an empty slot's.
const NO_QPN: u32 = u32::MAX;

/// What a lookup reads of a slot: one small entry, so that a token or a
/// QP number is checked with one load and compare.
#[derive(Debug, Clone, Copy)]
struct SlotKey {
    /// The live connection's generation, or [`NO_GEN`].
    gen: u16,
    /// The generation of the slot's next connection.
    next_gen: u16,
    /// The live connection's QP number, or [`NO_QPN`].
    qpn: u32,
}

/// Connections by slot. Control path (`reserve`, `insert`, `remove`)
/// allocates; lookups do not.
#[derive(Debug)]
pub struct ConnTable<C> {
    conns: Vec<Option<C>>,
    keys: Vec<SlotKey>,
    free: Vec<u16>,
    by_qpn: HashMap<u32, u16>,
    /// The slot of the last QP-number lookup: completions come in runs
    /// from one connection, so most lookups skip the hash map.
    hot: usize,
    /// Live connections.
    live: usize,
}

impl<C> Default for ConnTable<C> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C> ConnTable<C> {
    /// An empty table.
    pub fn new() -> Self {
        ConnTable {
            conns: Vec::new(),
            keys: Vec::new(),
            free: Vec::new(),
            by_qpn: HashMap::new(),
            hot: 0,
            live: 0,
        }
    }

    /// Slots in use or free (iterate `0..slots()` to visit connections by
    /// index while the table may change).
    #[inline]
    pub fn slots(&self) -> usize {
        self.conns.len()
    }

    /// Live connections.
    #[inline]
    pub fn count(&self) -> usize {
        self.live
    }

    /// The connection in slot `i`.
    #[inline]
    pub fn get(&self, i: usize) -> Option<&C> {
        self.conns.get(i)?.as_ref()
    }

    /// The connection in slot `i`, mutably.
    #[inline]
    pub fn get_mut(&mut self, i: usize) -> Option<&mut C> {
        self.conns.get_mut(i)?.as_mut()
    }

    /// Every connection.
    pub fn iter(&self) -> impl Iterator<Item = &C> {
        self.conns.iter().flatten()
    }

    /// The slots of the connections `pick` selects.
    pub fn select(&self, mut pick: impl FnMut(&C) -> bool) -> Vec<usize> {
        self.conns
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.as_ref().filter(|c| pick(c)).map(|_| i))
            .collect()
    }

    /// A free slot and its generation for a new connection (put it there
    /// with [`insert`](Self::insert), or give the slot back with
    /// [`unreserve`](Self::unreserve)); `None` when [`MAX_CONNS`] are in
    /// use.
    pub fn reserve(&mut self) -> Option<(u16, u16)> {
        let slot = match self.free.pop() {
            Some(s) => s,
            None if self.conns.len() < MAX_CONNS => {
                self.conns.push(None);
                self.keys.push(SlotKey {
                    gen: NO_GEN,
                    next_gen: 0,
                    qpn: NO_QPN,
                });
                (self.conns.len() - 1) as u16
            }
            None => return None,
        };
        Some((slot, self.keys[usize::from(slot)].next_gen))
    }

    /// Give back a slot [`reserve`](Self::reserve)d for a connection that
    /// was not made.
    pub fn unreserve(&mut self, slot: u16) {
        if self.get(usize::from(slot)).is_none() {
            self.free.push(slot);
        }
    }

    /// Put `c`, whose QP is `qp_num`, in its reserved `slot`.
    pub fn insert(&mut self, slot: u16, qp_num: u32, c: C) {
        let i = usize::from(slot);
        if self.conns[i].replace(c).is_none() {
            self.live += 1;
        }
        let k = &mut self.keys[i];
        k.gen = k.next_gen;
        k.qpn = qp_num;
        self.by_qpn.insert(qp_num, slot);
    }

    /// Take the connection out of slot `i`: the slot's generation moves on
    /// (tokens of this connection no longer match) and the slot is free.
    pub fn remove(&mut self, i: usize) -> Option<C> {
        let c = self.conns.get_mut(i)?.take()?;
        self.live -= 1;
        let k = &mut self.keys[i];
        self.by_qpn.remove(&k.qpn);
        k.gen = NO_GEN;
        k.qpn = NO_QPN;
        k.next_gen = k.next_gen.wrapping_add(1) & 0x3FFF;
        self.free.push(i as u16);
        Some(c)
    }

    /// Take every connection out (the group is going away).
    pub fn drain(&mut self) -> Vec<C> {
        let out = (0..self.conns.len())
            .filter_map(|i| self.remove(i))
            .collect();
        self.by_qpn.clear();
        out
    }

    /// The slot a token's `(conn, gen)` names, if that connection is live
    /// (`gen` is taken to 14 bits, as a token carries it).
    #[inline]
    pub fn by_token(&self, conn: u16, gen: u16) -> Option<usize> {
        let i = usize::from(conn);
        (self.keys.get(i)?.gen == gen & 0x3FFF).then_some(i)
    }

    /// The slot of the connection whose QP is `qp_num`.
    #[inline]
    pub fn by_qpn(&mut self, qp_num: u32) -> Option<usize> {
        let hot = self.hot;
        if self.keys.get(hot).is_some_and(|k| k.qpn == qp_num) && qp_num != NO_QPN {
            return Some(hot);
        }
        let i = usize::from(*self.by_qpn.get(&qp_num)?);
        self.hot = i;
        Some(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_removed_connection_frees_its_slot_and_its_tokens_go_stale() {
        let mut t = ConnTable::new();
        let (s, g) = t.reserve().unwrap();
        t.insert(s, 7, "a");
        assert_eq!(t.by_token(s, g), Some(usize::from(s)));
        assert_eq!(t.by_qpn(7), Some(usize::from(s)));
        assert_eq!(t.remove(usize::from(s)), Some("a"));
        assert_eq!(t.by_token(s, g), None, "the connection is gone");
        assert_eq!(t.by_qpn(7), None, "the hot slot is empty");
        let (s2, g2) = t.reserve().unwrap();
        assert_eq!(s2, s, "the slot is used again");
        assert_ne!(g2, g, "with the next generation");
        t.insert(s2, 9, "b");
        assert_eq!(t.by_token(s, g), None, "an old token names nothing");
        assert_eq!(t.by_token(s2, g2), Some(usize::from(s)));
        assert_eq!(t.by_qpn(7), None, "the old QP number names nothing");
        assert_eq!(t.count(), 1);
    }

    #[test]
    fn qp_numbers_find_their_connection_past_the_hot_slot() {
        let mut t = ConnTable::new();
        for q in 0..4u32 {
            let (s, _) = t.reserve().unwrap();
            t.insert(s, 100 + q, q);
        }
        for q in [2u32, 2, 0, 3, 0] {
            let i = t.by_qpn(100 + q).unwrap();
            assert_eq!(t.get(i), Some(&q));
        }
        assert_eq!(t.by_qpn(5), None);
        assert_eq!(t.count(), 4);
        t.remove(0);
        assert_eq!(t.remove(0), None, "removed once");
        assert_eq!(t.count(), 3);
        assert_eq!(t.by_qpn(NO_QPN), None, "an empty slot has no QP number");
        assert_eq!(t.by_token(0, NO_GEN), None, "nor a generation");
        assert_eq!(t.drain().len(), 3);
        assert_eq!(t.count(), 0);
    }

    #[test]
    fn an_unused_reservation_goes_back_and_a_full_table_refuses() {
        let mut t: ConnTable<()> = ConnTable::new();
        let (s, _) = t.reserve().unwrap();
        t.unreserve(s);
        assert_eq!(t.reserve().map(|x| x.0), Some(s));
        for _ in 1..MAX_CONNS {
            assert!(t.reserve().is_some());
        }
        assert_eq!(t.reserve(), None, "{MAX_CONNS} slots at most");
    }

    #[test]
    fn generations_wrap_at_fourteen_bits() {
        let mut t = ConnTable::new();
        let mut last = 0;
        for _ in 0..0x4001 {
            let (s, g) = t.reserve().unwrap();
            assert!(g <= 0x3FFF);
            last = g;
            t.insert(s, 1, ());
            t.remove(usize::from(s));
        }
        assert_eq!(
            last, 0,
            "after 0x4000 uses of a slot its generation is 0 again"
        );
    }
}
