//! [`Seats`]: a target transport's table of poll groups (their cores and
//! how many connections each serves), and the choice of the group that
//! serves a new connection.
//!
//! Control path only: a group takes its seat at creation and leaves it at
//! shutdown; a connection takes a seat when it is placed and gives it back
//! when it is destroyed or refused, on the core that ended up with it. A
//! `Mutex` guards the table (never touched by I/O).

use pollux_reactor::sync::{Mutex, MutexGuard};

use pollux_reactor::CoreId;

use super::PlacementPolicy;

/// One poll group's seat.
#[derive(Debug, Clone, Copy)]
struct Seat {
    core: CoreId,
    /// Connections placed on this group and not yet destroyed or refused.
    load: usize,
    /// The group takes new connections (not shut down or dropped).
    open: bool,
}

#[derive(Debug)]
struct Table {
    /// By poll-group index.
    seats: Vec<Option<Seat>>,
    /// Where the next tie-break scan starts (round robin).
    cursor: usize,
    limits: SeatLimits,
}

impl Default for Table {
    fn default() -> Self {
        Table {
            seats: Vec::new(),
            cursor: 0,
            limits: SeatLimits::UNLIMITED,
        }
    }
}

/// The most connections a transport serves: per poll group (core) and in
/// all. A connection beyond either is refused by [`Seats::place`], so the
/// transport rejects it cleanly before it takes any resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeatLimits {
    /// Most connections one poll group serves.
    pub per_group: usize,
    /// Most connections all poll groups serve together.
    pub total: usize,
}

impl SeatLimits {
    /// No limit.
    pub const UNLIMITED: SeatLimits = SeatLimits {
        per_group: usize::MAX,
        total: usize::MAX,
    };
}

/// The poll groups of one transport and their connection counts.
#[derive(Debug, Default)]
pub struct Seats(Mutex<Table>);

impl Seats {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Set the connection limits (control path, normally once at start).
    pub fn set_limits(&self, limits: SeatLimits) {
        self.lock().limits = limits;
    }

    /// The connection limits.
    pub fn limits(&self) -> SeatLimits {
        self.lock().limits
    }

    /// Poll group `index` on `core` takes new connections (its load starts
    /// at 0).
    pub fn join(&self, index: usize, core: CoreId) {
        let mut t = self.lock();
        if t.seats.len() <= index {
            t.seats.resize(index + 1, None);
        }
        t.seats[index] = Some(Seat {
            core,
            load: 0,
            open: true,
        });
    }

    /// Poll group `index` takes no more connections (those it serves keep
    /// their seats until released).
    pub fn leave(&self, index: usize) {
        if let Some(Some(s)) = self.lock().seats.get_mut(index) {
            s.open = false;
        }
    }

    /// Place a new connection whose request arrived at group `home`:
    /// returns the chosen group's index and core and counts the connection
    /// there. `None` when no group can take it
    /// ([`PlacementPolicy::LeastConnections`]: none is open and below its
    /// [per-group limit](SeatLimits::per_group);
    /// [`PlacementPolicy::ListenerCore`]: `home` has no seat or is at its
    /// limit), or when the transport serves its [total](SeatLimits::total).
    pub fn place(&self, home: usize, policy: PlacementPolicy) -> Option<(usize, CoreId)> {
        let mut t = self.lock();
        let n = t.seats.len();
        let lim = t.limits;
        let served: usize = t.seats.iter().flatten().map(|s| s.load).sum();
        if served >= lim.total {
            return None;
        }
        let pick = match policy {
            PlacementPolicy::ListenerCore => {
                Some(home).filter(|&h| h < n && t.seats[h].is_some_and(|s| s.load < lim.per_group))
            }
            PlacementPolicy::LeastConnections => {
                let mut best: Option<(usize, usize)> = None;
                for k in 0..n {
                    let i = (t.cursor + k) % n;
                    let Some(s) = t.seats[i].filter(|s| s.open && s.load < lim.per_group) else {
                        continue;
                    };
                    if best.map_or(true, |(_, load)| s.load < load) {
                        best = Some((i, s.load));
                    }
                }
                best.map(|(i, _)| i)
            }
        }?;
        t.cursor = (pick + 1) % n;
        let seat = t.seats[pick].as_mut()?;
        seat.load += 1;
        Some((pick, seat.core))
    }

    /// A connection placed on group `index` was destroyed or refused.
    pub fn release(&self, index: usize) {
        if let Some(Some(s)) = self.lock().seats.get_mut(index) {
            s.load = s.load.saturating_sub(1);
        }
    }

    /// Connections placed per group (by index; 0 for an index that never
    /// joined).
    pub fn loads(&self) -> Vec<usize> {
        self.lock()
            .seats
            .iter()
            .map(|s| s.map_or(0, |s| s.load))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_refuse_per_group_and_in_total_until_released() {
        let s = Seats::default();
        s.join(0, 0);
        s.join(1, 1);
        s.set_limits(SeatLimits {
            per_group: 2,
            total: 3,
        });
        let lc = PlacementPolicy::LeastConnections;
        assert!(s.place(0, lc).is_some());
        assert!(s.place(0, lc).is_some());
        assert!(s.place(0, lc).is_some());
        assert_eq!(s.place(0, lc), None, "total reached");
        s.release(0);
        assert_eq!(s.loads().iter().sum::<usize>(), 2);
        assert!(s.place(0, lc).is_some());
        s.set_limits(SeatLimits {
            per_group: 2,
            total: 10,
        });
        assert!(s.place(0, lc).is_some());
        assert_eq!(s.loads(), [2, 2]);
        assert_eq!(s.place(0, lc), None, "every group at its limit");
        assert_eq!(s.place(1, PlacementPolicy::ListenerCore), None);
        s.release(1);
        assert_eq!(s.place(1, PlacementPolicy::ListenerCore), Some((1, 1)));
    }

    #[test]
    fn least_connections_with_round_robin_ties_and_release() {
        let s = Seats::default();
        s.join(0, 0);
        s.join(1, 1);
        s.join(2, 2);
        let got: Vec<usize> = (0..6)
            .map(|_| {
                s.place(0, PlacementPolicy::LeastConnections)
                    .expect("open")
                    .0
            })
            .collect();
        assert_eq!(got, [0, 1, 2, 0, 1, 2]);
        s.release(1);
        s.release(1);
        assert_eq!(s.loads(), [2, 0, 2]);
        assert_eq!(s.place(2, PlacementPolicy::LeastConnections), Some((1, 1)));
        s.leave(1);
        let next = s.place(2, PlacementPolicy::LeastConnections).expect("open");
        assert_ne!(next.0, 1, "a group that left takes no connection");
    }

    #[test]
    fn the_least_loaded_group_wins_over_the_round_robin_turn() {
        let s = Seats::default();
        s.join(0, 7);
        s.join(1, 8);
        s.join(2, 9);
        // Load 2, 0, 1: group 1 whatever the cursor says.
        for g in [0, 0, 2] {
            assert!(s.place(g, PlacementPolicy::ListenerCore).is_some());
        }
        assert_eq!(s.place(0, PlacementPolicy::LeastConnections), Some((1, 8)));
        assert_eq!(s.loads(), [2, 1, 1]);
    }

    #[test]
    fn listener_core_keeps_the_home_group() {
        let s = Seats::default();
        s.join(0, 4);
        s.join(1, 5);
        for _ in 0..3 {
            assert_eq!(s.place(1, PlacementPolicy::ListenerCore), Some((1, 5)));
        }
        assert_eq!(s.loads(), [0, 3]);
        assert_eq!(
            Seats::default().place(0, PlacementPolicy::ListenerCore),
            None
        );
    }

    #[test]
    fn no_open_group_places_nothing_and_release_never_underflows() {
        let s = Seats::default();
        assert_eq!(s.place(0, PlacementPolicy::LeastConnections), None);
        s.join(0, 0);
        s.leave(0);
        assert_eq!(s.place(0, PlacementPolicy::LeastConnections), None);
        s.release(0);
        s.release(5);
        assert_eq!(s.loads(), [0]);
    }
}
