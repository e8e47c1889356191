//! Connections with nothing to read join the poll group's quiet set: an
//! idle poll then reads none of their sockets, yet a command that arrives
//! on a quiet admin or I/O queue is served, and traffic takes the queue out
//! of the set again.

use pollux_reactor::mem::{BufPool, BufPoolOptions};

use super::super::quiet::QUIET_AFTER;
use super::*;
use crate::host::test_io::write_read_verify;
use crate::host::{Controller, CtrlOptions};

#[test]
fn idle_connections_cost_no_read_and_still_serve() {
    let f = fixture(TcpOptions::default());
    let pg = Rc::clone(&f.pgs[0]);
    f.cl.on(0, |r| {
        let t = f.host(false, false);
        let mut c = Controller::connect(&t, who(), CtrlOptions::default()).unwrap();
        let mut qp = c.connect_io(&t, 1, 8, None).unwrap();

        // Nothing on either socket: both queues turn quiet, and from then on
        // an idle poll reads neither socket.
        for _ in 0..2 * QUIET_AFTER {
            f.cl.poll_once_all();
        }
        assert_eq!(pg.quiet_connections(), 2, "admin and I/O queue");
        let before = pg.socket_reads();
        for _ in 0..1000 {
            f.cl.poll_once_all();
        }
        assert_eq!(pg.socket_reads(), before, "reads over 1,000 idle polls");

        // I/O on the quiet queue is served and brings it back to direct reads.
        let pool = BufPool::new(BufPoolOptions::new("tcp-quiet-test", 4096, 8)).unwrap();
        assert_eq!(write_read_verify(r, &mut qp, &pool, 4096, 8), 0);
        assert_eq!(pg.quiet_connections(), 1, "the I/O queue is busy again");

        // So is an admin command on the quiet admin queue.
        let ns = c.identify_namespace(1).unwrap();
        assert!(ns.nsze > 0);

        // Quiet again once idle; a queue that leaves while quiet leaves the set.
        for _ in 0..2 * QUIET_AFTER {
            f.cl.poll_once_all();
        }
        assert_eq!(pg.quiet_connections(), 2);
        drop(qp);
        drop(c);
    });
    f.settle();
    assert_eq!(pg.quiet_connections(), 0, "every connection left the set");
    f.assert_pool_full();
}

/// A look finds a ready connection by its index in the group. When a
/// connection goes, the last one moves into its place: a quiet connection
/// moved that way (here twice: an I/O queue, then an admin queue) is still
/// found and served.
#[test]
fn quiet_connections_moved_by_a_departure_are_still_served() {
    let f = fixture(TcpOptions::default());
    let pg = Rc::clone(&f.pgs[0]);
    f.cl.on(0, |r| {
        let t = f.host(false, false);
        let quiesce = |n: usize| {
            for _ in 0..2 * QUIET_AFTER {
                f.cl.poll_once_all();
            }
            assert_eq!(pg.quiet_connections(), n);
        };
        let wait_for = |n: usize| {
            for _ in 0..100_000 {
                if pg.connections() == n {
                    return;
                }
                f.cl.poll_once_all();
            }
            panic!("{} connections, not {n}", pg.connections());
        };
        // The group's connections, in order: c1 admin, qp1, c2 admin, qp2.
        let mut c1 = Controller::connect(&t, who(), CtrlOptions::default()).unwrap();
        let qp1 = c1.connect_io(&t, 1, 8, None).unwrap();
        let mut c2 = Controller::connect(&t, who(), CtrlOptions::default()).unwrap();
        let mut qp2 = c2.connect_io(&t, 1, 8, None).unwrap();
        quiesce(4);

        // qp1 goes: qp2 moves into its place (index 3 -> 1).
        drop(qp1);
        wait_for(3);
        quiesce(3);
        let pool = BufPool::new(BufPoolOptions::new("tcp-quiet-moved", 4096, 8)).unwrap();
        assert_eq!(write_read_verify(r, &mut qp2, &pool, 7, 8), 0);
        assert!(c1.identify_namespace(1).unwrap().nsze > 0);

        // c1 goes: c2's admin queue moves into its place (index 2 -> 0).
        quiesce(3);
        drop(c1);
        wait_for(2);
        quiesce(2);
        assert!(c2.identify_namespace(1).unwrap().nsze > 0);
        assert_eq!(write_read_verify(r, &mut qp2, &pool, 9, 8), 0);
        drop(qp2);
        drop(c2);
    });
    f.settle();
    assert_eq!(pg.quiet_connections(), 0, "every connection left the set");
    f.assert_pool_full();
}
