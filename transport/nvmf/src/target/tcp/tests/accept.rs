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

/// Not a test on its own: the body of
/// [`out_of_descriptors_pauses_accepting_and_loses_no_connection`], run in
/// a child process of its own (the descriptor limit is the process's).
#[test]
#[ignore = "child process entry point, spawned by out_of_descriptors_pauses_accepting_and_loses_no_connection"]
fn child_out_of_descriptors() {
    let f = fixture(TcpOptions::default());
    // A host connects, and the process's next descriptor is past its limit:
    // the connection waits in the listener's backlog, and `accept` fails
    // with EMFILE.
    let mut host = Raw::connect(&f);
    let cap = pollux_reactor::test_env::cap_descriptors();
    let before = f.transport.stats();
    for _ in 0..10_000 {
        f.cl.poll_once_all();
    }
    let during = f.transport.stats();
    // One failure, then a pause on the (manual, unmoved) reactor clock:
    // not one failure (and log line) per poll.
    assert_eq!(during.accept_errors - before.accept_errors, 1);
    assert_eq!(during.accepted, before.accepted);
    f.cl.advance(pollux_reactor::AcceptPacer::PAUSE);
    for _ in 0..100 {
        f.cl.poll_once_all();
    }
    assert_eq!(
        f.transport.stats().accept_errors - before.accept_errors,
        2,
        "one more try after the pause"
    );
    // Descriptors again: after the pause the connection is taken and
    // served from the start.
    drop(cap);
    f.cl.advance(pollux_reactor::AcceptPacer::PAUSE);
    host.send(
        &crate::spec::tcp::IcReq {
            pfv: 0,
            hpda: 0,
            digests: Digests::default(),
            maxr2t: 0,
        }
        .encode(),
    );
    let rsp = host.recv(&f, 128);
    assert!(crate::spec::tcp::IcResp::parse(&rsp).is_ok(), "{rsp:?}");
    assert_eq!(f.transport.stats().accepted, before.accepted + 1);
    until_connections(&f, 1);
    println!("POLLUX-FD-LIMIT-OK");
}

/// A process out of descriptors cannot accept: the poll group pauses
/// `accept` for `AcceptPacer::PAUSE` after a failure (one failure and one
/// log line per pause, where it spun on the failing call before), the
/// connection waits in the backlog and is served once descriptors are
/// free again.
#[test]
fn out_of_descriptors_pauses_accepting_and_loses_no_connection() {
    pollux_reactor::test_env::run_child_test(
        "target::tcp::tests::accept::child_out_of_descriptors",
        "POLLUX-FD-LIMIT-OK",
    );
}
