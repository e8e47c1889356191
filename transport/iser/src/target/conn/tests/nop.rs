//! The keep-alive ping: a silent connection gets a NOP-In with a TTT of
//! its own after `nop_in_interval`; any PDU answers it; no PDU within
//! `nop_timeout` drops the connection and counts it.

use std::time::Duration;

use super::*;

const INTERVAL: Duration = Duration::from_secs(30);
const TIMEOUT: Duration = Duration::from_secs(60);
const MS: Duration = Duration::from_millis(1);

/// A logged-in connection with the default ping (30 s / 60 s).
fn logged_in() -> Fx {
    let mut fx = fixture(true);
    assert!(fx.login(INI, "Normal").is_some_and(|r| r.status_class == 0));
    fx
}

/// Move the clock by `d`, then poll the reactors and the connection.
fn tick(fx: &mut Fx, d: Duration) {
    fx.cl.advance(d);
    fx.cl.poll_once_all();
    fx.conn.poll(&mut fx.ops);
}

/// The NOP-In pings among the PDUs sent from index `from` on.
fn pings(fx: &Fx, from: usize) -> Vec<NopIn> {
    fx.ops.sent[from..]
        .iter()
        .filter_map(|(p, _)| match Pdu::parse(p).map(|p| p.bhs) {
            Ok(Bhs::NopIn(n)) if n.itt == RESERVED_TAG => Some(n),
            _ => None,
        })
        .collect()
}

/// The initiator's answer to `ping` (RFC 7143 §11.18: ITT reserved, the
/// TTT echoed, immediate).
fn answer(fx: &mut Fx, ping: &NopIn) -> bool {
    let o = NopOut {
        immediate: true,
        lun: ping.lun,
        itt: RESERVED_TAG,
        ttt: ping.ttt,
        cmd_sn: fx.cmd_sn,
        exp_stat_sn: ping.stat_sn,
    };
    fx.pdu(IserHeader::PLAIN, &Bhs::NopOut(o).encode(0, 0))
}

#[test]
fn a_silent_connection_is_pinged_after_the_interval_with_a_transfer_tag() {
    let mut fx = logged_in();
    let from = fx.ops.sent.len();
    tick(&mut fx, INTERVAL - MS);
    assert!(pings(&fx, from).is_empty(), "pinged before the interval");
    tick(&mut fx, MS);
    let p = pings(&fx, from);
    assert_eq!(p.len(), 1, "one ping at the interval");
    assert_ne!(p[0].ttt, RESERVED_TAG, "the ping asks for an answer");
    assert_eq!(fx.conn.stats().nop_pings, 1);
    // One ping at a time: none more while it waits for its answer.
    tick(&mut fx, INTERVAL);
    assert_eq!(pings(&fx, from).len(), 1);
    // The ping carried the next StatSN without taking it.
    let (r, _, _) = fx.cmd(&[0, 0, 0, 0, 0, 0], 0, None, 0);
    assert_eq!(r.stat_sn, p[0].stat_sn, "the ping took a StatSN");
    assert!(!fx.conn.is_closed());
}

#[test]
fn an_answer_resets_the_ping() {
    let mut fx = logged_in();
    let from = fx.ops.sent.len();
    tick(&mut fx, INTERVAL);
    let first = pings(&fx, from)[0];
    tick(&mut fx, TIMEOUT - MS);
    assert!(answer(&mut fx, &first));
    // Silence counts again from the answer: no drop at the ping's
    // timeout, the next ping one interval after the answer, with a new tag.
    tick(&mut fx, INTERVAL - MS);
    assert!(!fx.conn.is_closed(), "dropped though the ping was answered");
    assert_eq!(pings(&fx, from).len(), 1);
    tick(&mut fx, MS);
    let p = pings(&fx, from);
    assert_eq!(p.len(), 2, "pinged again after another interval");
    assert_ne!(p[1].ttt, first.ttt, "each ping has its own tag");
    assert!(answer(&mut fx, &p[1]));
    tick(&mut fx, TIMEOUT);
    assert!(!fx.conn.is_closed() && !fx.ops.closed);
    assert_eq!(fx.target.nop_timeouts(), 0);
}

#[test]
fn no_answer_drops_the_connection_and_counts_it() {
    let mut fx = logged_in();
    // A write waiting for its Data-Out holds a task and its buffer.
    let mut c = [0u8; 16];
    c[..10].copy_from_slice(&rw10(0x2A, 0, 0, 8));
    let cmd = ScsiCommand {
        immediate: false,
        final_: false,
        read: false,
        write: true,
        attr: TaskAttr::Simple,
        lun: Lun::from_index(0),
        itt: 500,
        edtl: 4096,
        cmd_sn: fx.cmd_sn,
        exp_stat_sn: 0,
        cdb: c,
    };
    fx.cmd_sn += 1;
    assert!(fx.pdu(IserHeader::PLAIN, &Bhs::ScsiCmd(cmd).encode(0, 0)));
    assert_eq!(fx.conn.tasks_in_flight(), 1);
    assert_eq!(fx.target.live_sessions(), 1);
    let from = fx.ops.sent.len();
    tick(&mut fx, INTERVAL);
    assert_eq!(pings(&fx, from).len(), 1);
    tick(&mut fx, TIMEOUT - MS);
    assert!(!fx.conn.is_closed(), "dropped before the timeout");
    tick(&mut fx, MS);
    assert!(
        fx.conn.is_closed() && fx.ops.closed,
        "not dropped at the timeout"
    );
    assert!(
        fx.ops.aborted,
        "the drop waits for sends that may never complete"
    );
    assert_eq!(fx.target.nop_timeouts(), 1);
    // Closed: it takes no more PDUs, and gives back what it held.
    let (h, inq) = inquiry(9, fx.cmd_sn, false);
    assert!(!fx.pdu(h, &inq));
    let pool = fx.target.pool().clone();
    let core = Rc::clone(&fx.conn.core);
    let Fx {
        cl, conn, target, ..
    } = fx;
    drop(conn);
    cl.poll_until_idle().expect("idle");
    assert_eq!(target.live_sessions(), 0, "the session slot is back");
    assert_eq!(
        pool.available() + core.cached_buffers(),
        pool.count(),
        "every task buffer is back"
    );
}

#[test]
fn any_pdu_counts_as_activity() {
    let mut fx = logged_in();
    let from = fx.ops.sent.len();
    // A command before the interval restarts the silence.
    tick(&mut fx, INTERVAL / 2);
    fx.cmd(&[0, 0, 0, 0, 0, 0], 0, None, 0);
    tick(&mut fx, INTERVAL / 2);
    assert!(pings(&fx, from).is_empty(), "pinged a busy connection");
    tick(&mut fx, INTERVAL / 2);
    assert_eq!(pings(&fx, from).len(), 1);
    // A command instead of the NOP-Out answers the ping too.
    tick(&mut fx, TIMEOUT - MS);
    fx.cmd(&[0, 0, 0, 0, 0, 0], 0, None, 0);
    tick(&mut fx, MS);
    assert!(!fx.conn.is_closed(), "dropped though a PDU came");
    tick(&mut fx, INTERVAL - 2 * MS);
    assert!(!fx.conn.is_closed());
    assert_eq!(pings(&fx, from).len(), 1);
    assert_eq!(fx.target.nop_timeouts(), 0);
}

#[test]
fn sub_second_timers_and_a_zero_interval() {
    for (interval, pinged) in [(Duration::from_millis(200), true), (Duration::ZERO, false)] {
        let mut fx = fixture(true);
        fx.conn = fx.cl.on(0, |r| {
            Connection::new(
                &fx.target,
                r,
                ConnParams {
                    portal_tag: 1,
                    send_with_inv: true,
                    nop: NopPing {
                        interval,
                        timeout: Duration::from_millis(300),
                    },
                },
            )
        });
        // Not in full feature phase: never pinged (past the interval,
        // within the login's timeout).
        tick(&mut fx, Duration::from_millis(250));
        assert!(fx.ops.sent.is_empty());
        assert!(fx.login(INI, "Normal").is_some());
        let from = fx.ops.sent.len();
        tick(&mut fx, Duration::from_millis(200));
        assert_eq!(pings(&fx, from).len(), usize::from(pinged), "{interval:?}");
        tick(&mut fx, Duration::from_millis(300));
        assert_eq!(fx.conn.is_closed(), pinged, "{interval:?}");
        assert_eq!(fx.target.nop_timeouts(), u64::from(pinged));
    }
}

#[test]
fn a_connection_silent_in_login_is_dropped_after_the_timeout_uncounted() {
    let mut fx = fixture(true);
    let from = fx.ops.sent.len();
    tick(&mut fx, TIMEOUT - MS);
    assert!(!fx.conn.is_closed(), "dropped before the timeout");
    assert!(
        pings(&fx, from).is_empty(),
        "no ping before full feature phase"
    );
    tick(&mut fx, MS);
    assert!(
        fx.conn.is_closed(),
        "a connection silent in login is dropped"
    );
    assert_eq!(fx.target.nop_timeouts(), 0, "not a NOP timeout");
}

#[test]
fn a_login_in_progress_restarts_the_login_silence() {
    let mut fx = fixture(true);
    tick(&mut fx, TIMEOUT - MS);
    // The login arrives just in time, and the connection is then in full
    // feature phase, where the ping takes over.
    assert!(fx.login(INI, "Normal").is_some_and(|r| r.status_class == 0));
    tick(&mut fx, TIMEOUT - MS);
    assert!(!fx.conn.is_closed());
}

/// A NOP-Out ping's data comes back in the NOP-In (RFC 7143 §11.18.5:
/// "Ping data are reflected in the NOP-In Response"), cut to what the
/// initiator declared it can receive.
#[test]
fn ping_data_is_echoed_in_the_nop_in() {
    let mut fx = logged_in();
    let ping = |fx: &mut Fx, itt: u32, data: &[u8]| {
        let o = NopOut {
            immediate: true,
            lun: Lun::default(),
            itt,
            ttt: RESERVED_TAG,
            cmd_sn: fx.cmd_sn,
            exp_stat_sn: 0,
        };
        let mut v = Bhs::NopOut(o).encode(0, data.len() as u32).to_vec();
        v.extend_from_slice(data);
        assert!(fx.pdu(IserHeader::PLAIN, &v));
        let p = fx.last();
        let Bhs::NopIn(n) = p.bhs else {
            panic!("no NOP-In");
        };
        (n.itt, n.ttt, p.data.to_vec())
    };
    let data = pattern(7, 100);
    assert_eq!(ping(&mut fx, 5, &data), (5, RESERVED_TAG, data));
    assert_eq!(ping(&mut fx, 6, &[]), (6, RESERVED_TAG, Vec::new()));
    // 8192 bytes fit the initiator's InitiatorRecvDataSegmentLength
    // (262144 in the fixture's login).
    let big = pattern(9, 8192);
    assert_eq!(ping(&mut fx, 7, &big).2, big);
}
