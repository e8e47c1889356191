//! Session reinstatement (RFC 7143 §6.3.5): a leading login of the same
//! I_T nexus closes the live session, whose in-flight I/O ends with the
//! connection; logins naming a TSIH get 2/0A (no such session) or 2/06
//! (MaxConnections=1).

use super::*;

const ISID_A: [u8; 6] = [0x80, 0, 0, 0, 0, 1];
const ISID_C: [u8; 6] = [0x80, 0, 0, 0, 0, 2];

fn new_conn(fx: &Fx) -> Connection {
    fx.cl.on(0, |r| {
        Connection::new(
            &fx.target,
            r,
            ConnParams {
                portal_tag: 1,
                send_with_inv: true,
                nop: NopPing::default(),
            },
        )
    })
}

fn login_conn(
    c: &mut Connection,
    ops: &mut Fake,
    isid: [u8; 6],
    tsih: u16,
) -> crate::pdu::LoginResponse {
    let b = login_req_as(&login_text(INI, "Normal"), isid, tsih);
    c.on_pdu(&IserHeader::PLAIN, &b, ops);
    let last = ops.sent.last().expect("a login response");
    match Pdu::parse(&last.0).expect("valid").bhs {
        Bhs::LoginRsp(r) => r,
        other => panic!("not a login response: {other:?}"),
    }
}

#[test]
fn a_second_login_of_the_same_nexus_closes_the_first_session() {
    let mut fx = fixture(true);
    let pool = fx.target.pool().clone();
    let a = fx.login(INI, "Normal").expect("login A");
    assert_eq!(a.status_class, 0);
    assert_eq!(fx.conn.tsih(), Some(a.tsih));
    assert_eq!(fx.target.live_sessions(), 1);
    // Session A has a read in flight (its Data-In WRITE not completed).
    fx.ops.defer_writes = true;
    fx.itt += 1;
    let (hdr, v) = inquiry(fx.itt, fx.cmd_sn, false);
    assert!(fx.pdu(hdr, &v));
    assert_eq!(fx.conn.tasks_in_flight(), 1);

    // Another ISID of the same initiator is another session: both live.
    let mut c = new_conn(&fx);
    let mut ops_c = Fake::default();
    let rc = login_conn(&mut c, &mut ops_c, ISID_C, 0);
    assert_eq!(rc.status_class, 0);
    assert_eq!(fx.target.live_sessions(), 2);
    assert_eq!(fx.target.reinstatements(), 0);

    // Same InitiatorName + ISID, TSIH 0: reinstatement.
    let mut b = new_conn(&fx);
    let mut ops_b = Fake::default();
    let rb = login_conn(&mut b, &mut ops_b, ISID_A, 0);
    assert_eq!((rb.status_class, rb.status_detail), (0, 0));
    assert!(b.is_full_feature());
    assert_ne!(rb.tsih, a.tsih);
    assert_eq!(fx.target.reinstatements(), 1);
    assert_eq!(fx.target.live_sessions(), 2, "B replaced A, C stays");
    // A learns it by message on its core and closes at its next poll.
    for _ in 0..10 {
        fx.cl.poll_once_all();
        fx.conn.poll(&mut fx.ops);
        c.poll(&mut ops_c);
    }
    assert!(fx.ops.closed && fx.conn.is_closed(), "A closed");
    assert!(!ops_c.closed && !c.is_closed(), "C untouched");
    // A's in-flight task cannot answer any more (its transport is gone).
    let before = fx.ops.sent.len();
    let t = fx.ops.deferred[0];
    fx.conn.data_done(t, true, &mut fx.ops);
    assert_eq!(
        fx.ops.sent.len(),
        before,
        "nothing sent on a closed session"
    );

    // A login naming a TSIH: the live one (MaxConnections=1) or none.
    let mut d = new_conn(&fx);
    let mut ops_d = Fake::default();
    let rd = login_conn(&mut d, &mut ops_d, ISID_A, rb.tsih);
    assert_eq!((rd.status_class, rd.status_detail), (2, 6));
    let mut e = new_conn(&fx);
    let mut ops_e = Fake::default();
    let re = login_conn(&mut e, &mut ops_e, ISID_A, a.tsih);
    assert_eq!(
        (re.status_class, re.status_detail),
        (2, 0x0A),
        "the reinstated session no longer exists"
    );
    assert!(ops_d.closed || !d.is_full_feature());

    // B serves I/O: it takes A's place in the fixture.
    std::mem::swap(&mut fx.conn, &mut b);
    fx.ops = ops_b;
    drop(b); // session A's connection goes (its task buffer with it)
    assert_eq!(fx.target.live_sessions(), 2);
    let data = pattern(7, 4096);
    let (rsp, _, _) = fx.cmd(&rw10(0x2A, 0, 100, 8), 4096, Some(&data), 4096);
    assert_eq!(rsp.status, 0);
    assert_eq!(fx.cmd(&rw10(0x28, 0, 100, 8), 4096, None, 0).2, data);

    drop((c, d, e));
    assert_eq!(fx.target.live_sessions(), 1);
    drop(fx.conn);
    assert_eq!(fx.target.live_sessions(), 0);
    assert_eq!(pool.available(), pool.count(), "every task buffer back");
}
