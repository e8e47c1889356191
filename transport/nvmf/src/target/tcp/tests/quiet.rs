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
