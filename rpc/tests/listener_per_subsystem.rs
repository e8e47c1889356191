//! Listeners belong to subsystems (SPDK's model), over a real target, for
//! RDMA (soft provider) and TCP (127.0.0.1): subsystems A and B share an
//! address, a second address is A's only, a third is the discovery
//! subsystem's only.
//!
//! - A Connect to B through A's address is refused with SPDK's status
//!   (SCT 1, SC 0x84 Connect Invalid Host), as is one to A through the
//!   discovery-only address, which serves discovery.
//! - The discovery log lists each subsystem at its own listeners only.
//! - Removing A's listener on the shared address disconnects A's queues
//!   there and neither B's nor A's on its own address; the address still
//!   takes B (and refuses A).
//! - Removing B's, the last user, closes the address: a new connection is
//!   refused (TCP: the socket is closed).
//! - `save_config`, then loading it into a fresh target (`--json`), gives
//!   the same listeners per subsystem, enforced the same way.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

mod common;
#[path = "common/rig.rs"]
mod rig;

use std::time::Instant;

use pollux_nvmf::host::{discover, CtrlOptions, HostError, HostTransport, DEFAULT_HOSTNQN};
use pollux_nvmf::spec::cpl::{NvmeStatus, StatusCodeType};
use pollux_rpc::JsonConfig;
use rig::{address, connect, host_addr, rdma_host, tcp_host, Rig, SETTLE};
use serde_json::{json, Value};

const A: &str = "nqn.2016-06.io.spdk:lsn-a";
const B: &str = "nqn.2016-06.io.spdk:lsn-b";
const DISCOVERY: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// The three addresses of a run.
struct Addrs {
    shared: Value,
    a_only: Value,
    disc_only: Value,
}

fn add_listener(rig: &Rig, nqn: &str, a: &Value) {
    rig.call(
        "nvmf_subsystem_add_listener",
        json!({"nqn": nqn, "listen_address": a}),
    );
}

fn remove_listener(rig: &Rig, nqn: &str, a: &Value) {
    rig.call(
        "nvmf_subsystem_remove_listener",
        json!({"nqn": nqn, "listen_address": a}),
    );
}

/// `traddr:trsvcid` of each listener of `nqn`, from `nvmf_subsystem_get_listeners`.
fn listeners(rig: &Rig, nqn: &str) -> Vec<String> {
    rig.call("nvmf_subsystem_get_listeners", json!({"nqn": nqn}))
        .as_array()
        .unwrap()
        .iter()
        .map(|l| host_addr(&l["address"]))
        .collect()
}

/// `listen_addresses` per NQN, from `nvmf_get_subsystems`.
fn listen_addresses(rig: &Rig) -> Vec<(String, Value)> {
    rig.call("nvmf_get_subsystems", json!({}))
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["nqn"].as_str().unwrap().to_owned(),
                s["listen_addresses"].clone(),
            )
        })
        .collect()
}

/// A Connect to `nqn` through `t` must be refused with Connect Invalid Host.
fn refused<T: HostTransport>(t: &T, nqn: &str, id: u8) {
    match connect(t, nqn, id) {
        Err(HostError::ConnectRefused { qid: 0, status, .. }) => {
            assert_eq!(status, NvmeStatus::CONNECT_INVALID_HOST);
            assert_eq!(status.sct(), StatusCodeType::CommandSpecific);
            assert_eq!(status.sc(), 0x84);
        }
        Err(e) => panic!("{nqn}: refused for another reason: {e}"),
        Ok(_) => panic!("{nqn}: connected through an address it does not listen on"),
    }
}

/// `traddr:trsvcid` of each discovery log entry of `nqn`, as seen through `t`.
fn discovered<T: HostTransport>(t: &T, nqn: &str) -> Vec<String> {
    discover(t, DEFAULT_HOSTNQN, CtrlOptions::default())
        .unwrap()
        .into_iter()
        .filter(|e| e.subnqn == nqn)
        .map(|e| format!("{}:{}", e.traddr, e.trsvcid))
        .collect()
}

/// Sets A, B and the discovery listeners up; returns what `save_config`
/// said then, and the listeners per subsystem.
fn setup(rig: &Rig, at: &Addrs) -> (Value, Vec<(String, Value)>) {
    rig.subsystem(A, "Malloc0", &at.shared);
    rig.subsystem(B, "Malloc1", &at.shared);
    add_listener(rig, A, &at.a_only);
    add_listener(rig, DISCOVERY, &at.disc_only);
    assert_eq!(
        listeners(rig, A),
        vec![host_addr(&at.shared), host_addr(&at.a_only)]
    );
    assert_eq!(listeners(rig, B), vec![host_addr(&at.shared)]);
    assert_eq!(listeners(rig, DISCOVERY), vec![host_addr(&at.disc_only)]);
    (rig.call("save_config", json!({})), listen_addresses(rig))
}

/// The flow both transports share; `host(address)` makes a host
/// transport to a listen address, `closed(address)` says whether nothing
/// listens there any more.
fn per_subsystem<T: HostTransport>(
    rig: &Rig,
    at: &Addrs,
    host: impl Fn(&Value) -> T,
    closed: impl Fn(&Value) -> bool,
) {
    // Only where each listens.
    refused(&host(&at.a_only), B, 9);
    refused(&host(&at.disc_only), A, 9);
    assert_eq!(
        discovered(&host(&at.disc_only), A),
        vec![host_addr(&at.shared), host_addr(&at.a_only)]
    );
    assert_eq!(
        discovered(&host(&at.shared), B),
        vec![host_addr(&at.shared)]
    );

    let (ta1, ta2, tb1) = (host(&at.shared), host(&at.a_only), host(&at.shared));
    let mut a1 = connect(&ta1, A, 1).unwrap();
    let mut a2 = connect(&ta2, A, 2).unwrap();
    let mut b1 = connect(&tb1, B, 3).unwrap();
    for h in [&mut a1, &mut a2] {
        h.verified_io().unwrap();
    }
    b1.verified_io().unwrap();
    rig.wait_live(6);

    // A lets go of the shared address: only A's queues there go.
    remove_listener(rig, A, &at.shared);
    let err = a1
        .verified_io()
        .expect_err("A's queue on the removed listener still serves I/O");
    assert!(!a1.queue.is_alive(), "{err}: the queue is not closed");
    for _ in 0..20 {
        b1.verified_io().unwrap();
        a2.verified_io().unwrap();
    }
    rig.wait_live(4);
    assert_eq!(listeners(rig, A), vec![host_addr(&at.a_only)]);
    assert_eq!(listeners(rig, B), vec![host_addr(&at.shared)]);
    assert!(!closed(&at.shared), "B still listens there");
    refused(&host(&at.shared), A, 4);
    let tb2 = host(&at.shared);
    let mut b2 = connect(&tb2, B, 5).unwrap();
    b2.verified_io().unwrap();
    drop(b2);
    drop(tb2);
    drop(a1);
    drop(ta1);
    rig.wait_live(4);

    // B, the last user, lets go: the address closes with its queues.
    remove_listener(rig, B, &at.shared);
    assert!(b1.verified_io().is_err(), "B's queue still serves I/O");
    rig.wait_live(2);
    let start = Instant::now();
    while !closed(&at.shared) {
        assert!(start.elapsed() < SETTLE, "the address still listens");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    for _ in 0..20 {
        a2.verified_io().unwrap();
    }
}

/// Loads `saved` into a fresh target: the same listeners per subsystem,
/// and B still refused on A's address.
fn reloaded<T: HostTransport>(
    rdma: bool,
    at: &Addrs,
    saved: &Value,
    want: &[(String, Value)],
    host: impl Fn(&Value) -> T,
) {
    let rig = Rig::bare(rdma);
    JsonConfig::parse(&saved.to_string())
        .unwrap()
        .apply(&rig.svc)
        .unwrap();
    assert_eq!(listen_addresses(&rig), want);
    refused(&host(&at.a_only), B, 6);
    let t = host(&at.shared);
    connect(&t, B, 7).unwrap().verified_io().unwrap();
}

/// Lets go of every listener left, so a fresh target can listen there.
fn release(rig: &Rig, at: &Addrs) {
    remove_listener(rig, A, &at.a_only);
    remove_listener(rig, DISCOVERY, &at.disc_only);
}

#[test]
fn rdma_listeners_belong_to_their_subsystem() {
    let port = 20_000 + (std::process::id() % 20_000) as u16;
    let at = Addrs {
        shared: address("RDMA", "192.0.2.30", port),
        a_only: address("RDMA", "192.0.2.30", port + 1),
        disc_only: address("RDMA", "192.0.2.30", port + 2),
    };
    let (saved, want) = {
        let rig = Rig::new(true);
        rig.call("nvmf_create_transport", json!({"trtype": "RDMA"}));
        let (saved, want) = setup(&rig, &at);
        // Closed: the connection itself fails (no NVMe-oF answer).
        let closed = |a: &Value| {
            !matches!(
                connect(&rdma_host(a), B, 8),
                Ok(_) | Err(HostError::ConnectRefused { .. })
            )
        };
        per_subsystem(&rig, &at, rdma_host, closed);
        release(&rig, &at);
        (saved, want)
    };
    reloaded(true, &at, &saved, &want, rdma_host);
}

#[test]
fn tcp_listeners_belong_to_their_subsystem() {
    let at = Addrs {
        shared: address("TCP", "127.0.0.1", common::free_port()),
        a_only: address("TCP", "127.0.0.1", common::free_port()),
        disc_only: address("TCP", "127.0.0.1", common::free_port()),
    };
    let (saved, want) = {
        let rig = Rig::new(false);
        rig.call("nvmf_create_transport", json!({"trtype": "TCP"}));
        let (saved, want) = setup(&rig, &at);
        // Closed: a plain TCP connect is refused.
        let closed = |a: &Value| {
            std::net::TcpStream::connect(host_addr(a))
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
        };
        per_subsystem(&rig, &at, tcp_host, closed);
        release(&rig, &at);
        (saved, want)
    };
    reloaded(false, &at, &saved, &want, tcp_host);
}
