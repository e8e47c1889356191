//! When the poll group tries `accept`: once per [`ACCEPT_EVERY`]
//! connection reads (polls, without connections), on every poll after an
//! idle loop of the reactor while the group serves no connection, again on
//! the next poll after a round that took one (a failing `accept` costs a
//! socket allocation in the kernel); a connection that arrives meanwhile is
//! still taken within that many polls, a storm at once.

use std::net::TcpStream;

use pollux_reactor::PollStatus;

use super::raw::Raw;
use super::*;
use crate::spec::tcp::Digests;
use crate::target::tcp::poll_group::ACCEPT_EVERY;

/// Keep the fixture's reactor busy, as other work on its core would.
fn busy_core(f: &Fx) {
    f.cl.on(0, |r| {
        r.add_poller("other work", || PollStatus::Busy);
    });
}

#[test]
fn an_idle_group_with_no_connection_accepts_on_every_poll() {
    let f = fixture(TcpOptions::default());
    let before = f.transport.stats().accept_rounds;
    for _ in 0..100 {
        f.cl.poll_once_all();
    }
    assert_eq!(f.transport.stats().accept_rounds - before, 100);
}

/// Poll `4 * ACCEPT_EVERY` times: 4 or 5 `accept` rounds, not one per poll.
fn assert_rare_rounds(f: &Fx) {
    f.cl.poll_once_all();
    let before = f.transport.stats().accept_rounds;
    let polls = 4 * ACCEPT_EVERY as u64;
    for _ in 0..polls {
        f.cl.poll_once_all();
    }
    let rounds = f.transport.stats().accept_rounds - before;
    assert!(
        (4..=5).contains(&rounds),
        "{rounds} rounds in {polls} polls"
    );
}

/// A new connection is still taken within one round: the group's
/// `accepted` count reaches `n` within `ACCEPT_EVERY` polls.
fn assert_taken_within_a_round(f: &Fx, n: u64) -> TcpStream {
    let c = TcpStream::connect(f.addr).unwrap();
    let mut polls = 0;
    while f.transport.stats().accepted < n {
        f.cl.poll_once_all();
        polls += 1;
        assert!(
            polls <= ACCEPT_EVERY,
            "not accepted within {ACCEPT_EVERY} polls"
        );
    }
    c
}

#[test]
fn an_idle_group_serving_a_connection_keeps_its_rounds_rare() {
    let f = fixture(TcpOptions::default());
    let first = Raw::handshake(&f, Digests::default());
    f.cl.poll_until_idle().unwrap();
    // No `accept` in each idle poll: it would delay the connection's next I/O.
    assert_rare_rounds(&f);
    drop(first);
    f.settle();
}

#[test]
fn a_busy_core_with_no_connection_accepts_once_in_accept_every_polls() {
    let f = fixture(TcpOptions::default());
    busy_core(&f);
    assert_rare_rounds(&f);
    drop(assert_taken_within_a_round(&f, 1));
}

#[test]
fn a_busy_group_serving_connections_accepts_once_in_accept_every_polls() {
    let f = fixture(TcpOptions::default());
    let first = Raw::handshake(&f, Digests::default());
    assert_eq!(f.transport.stats().accepted, 1);
    busy_core(&f);
    assert_rare_rounds(&f);
    drop(assert_taken_within_a_round(&f, 2));
    drop(first);
}

#[test]
fn a_storm_of_connections_is_taken_round_after_round() {
    let f = fixture(TcpOptions::default());
    let first = Raw::handshake(&f, Digests::default());
    busy_core(&f);
    // Far from the next scheduled round.
    f.cl.poll_once_all();
    f.cl.poll_once_all();
    let storm: Vec<_> = (0..40)
        .map(|_| TcpStream::connect(f.addr).unwrap())
        .collect();
    let mut polls = 0;
    let mut first_round = None;
    while f.transport.stats().accepted < 41 {
        f.cl.poll_once_all();
        polls += 1;
        assert!(polls <= 2 * ACCEPT_EVERY, "{:?}", f.transport.stats());
        if first_round.is_none() && f.transport.stats().accepted > 1 {
            first_round = Some(polls);
        }
    }
    // 16 per round: the rest in the next two polls, not the next rounds
    // due (every 1024 / 17 polls).
    let rest = polls - first_round.unwrap_or(0);
    assert!(
        rest <= 2,
        "the storm took {rest} polls after its first round"
    );
    drop(storm);
    drop(first);
    f.settle();
}
