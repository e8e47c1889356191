//! [`Seats`]: the RDMA transport's table of poll groups (their cores and
//! how many queues each serves), and the choice of the group that serves a
//! new queue ([`QueuePlacement`]).
//!
//! Control path only: a group takes its seat at creation and leaves it at
//! shutdown; a connect request takes a seat when it is placed and gives it
//! back when its queue is destroyed or the request is refused, on the core
//! that ended up with it. A `Mutex` guards the table (never touched by I/O).

use std::sync::{Mutex, MutexGuard};

use pollux_reactor::CoreId;

use super::options::QueuePlacement;

/// One poll group's seat.
#[derive(Debug, Clone, Copy)]
struct Seat {
    core: CoreId,
    /// Queues placed on this group and not yet destroyed or refused.
    load: usize,
    /// The group takes new queues (not shut down or dropped).
    open: bool,
}

#[derive(Debug, Default)]
struct Table {
    /// By poll-group index.
    seats: Vec<Option<Seat>>,
    /// Where the next tie-break scan starts (round robin).
    cursor: usize,
}

/// The poll groups of one transport and their queue counts.
#[derive(Debug, Default)]
pub(crate) struct Seats(Mutex<Table>);

impl Seats {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Poll group `index` on `core` takes new queues.
    pub(crate) fn join(&self, index: usize, core: CoreId) {
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

    /// Poll group `index` takes no more queues.
    pub(crate) fn leave(&self, index: usize) {
        if let Some(Some(s)) = self.lock().seats.get_mut(index) {
            s.open = false;
        }
    }

    /// Place a new queue whose request arrived at group `home`: returns the
    /// group's index and core and counts the queue there. `None` when no
    /// group is open (the caller keeps it, and refuses it).
    pub(crate) fn place(&self, home: usize, how: QueuePlacement) -> Option<(usize, CoreId)> {
        let mut t = self.lock();
        let n = t.seats.len();
        let pick = match how {
            QueuePlacement::ListenerCore => Some(home).filter(|&h| h < n),
            QueuePlacement::LeastConnections => {
                let mut best: Option<(usize, usize)> = None;
                for k in 0..n {
                    let i = (t.cursor + k) % n;
                    let Some(s) = t.seats[i].filter(|s| s.open) else {
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

    /// A queue placed on group `index` was destroyed or refused.
    pub(crate) fn release(&self, index: usize) {
        if let Some(Some(s)) = self.lock().seats.get_mut(index) {
            s.load = s.load.saturating_sub(1);
        }
    }

    /// Queues placed per group (by index; 0 for a group that left).
    pub(crate) fn loads(&self) -> Vec<usize> {
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
    fn least_connections_with_round_robin_ties_and_release() {
        let s = Seats::default();
        s.join(0, 0);
        s.join(1, 1);
        s.join(2, 2);
        let got: Vec<usize> = (0..6)
            .map(|_| {
                s.place(0, QueuePlacement::LeastConnections)
                    .expect("open")
                    .0
            })
            .collect();
        assert_eq!(got, [0, 1, 2, 0, 1, 2]);
        s.release(1);
        s.release(1);
        assert_eq!(s.loads(), [2, 0, 2]);
        assert_eq!(s.place(2, QueuePlacement::LeastConnections), Some((1, 1)));
        s.leave(1);
        let next = s.place(2, QueuePlacement::LeastConnections).expect("open");
        assert_ne!(next.0, 1, "a group that left takes no queue");
    }

    #[test]
    fn listener_core_keeps_the_home_group() {
        let s = Seats::default();
        s.join(0, 4);
        s.join(1, 5);
        for _ in 0..3 {
            assert_eq!(s.place(1, QueuePlacement::ListenerCore), Some((1, 5)));
        }
        assert_eq!(s.loads(), [0, 3]);
        assert_eq!(
            Seats::default().place(0, QueuePlacement::ListenerCore),
            None
        );
    }
}
