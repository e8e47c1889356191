//! `nvmf_subsystem_remove_listener` over a real target, for RDMA (soft
//! provider) and TCP: two subsystems, each on its own listener, a host
//! connected through each. Removing one listener disconnects the queues
//! that came in through it and no other: its host sees its queue closed
//! and cannot connect through it again (refused, nothing left behind),
//! while the other host keeps doing verified I/O without an error; and
//! every resource the closed queues took comes back (live queues, the
//! transport's destroyed count, the target's slot buffers, descriptors).

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

mod common;
#[path = "common/rig.rs"]
mod rig;

use pollux_reactor::sync::Mutex;

use pollux_nvmf::host::HostTransport;
use rig::{address, connect, rdma_host, tcp_host, Rig};
use serde_json::{json, Value};

const KEEP: &str = "nqn.2016-06.io.spdk:keep";
const GONE: &str = "nqn.2016-06.io.spdk:gone";

/// The two tests count this process's descriptors: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Entries of `/proc/self/fd`.
fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// The flow both transports share; `host(address)` makes a host
/// transport to a listen address.
fn remove_one_listener<T: HostTransport>(
    rig: &Rig,
    keep_at: Value,
    gone_at: Value,
    host: impl Fn(&Value) -> T,
) {
    rig.subsystem(KEEP, "Malloc0", &keep_at);
    rig.subsystem(GONE, "Malloc1", &gone_at);
    let keep_t = host(&keep_at);
    let mut keep = connect(&keep_t, KEEP, 1).unwrap();
    keep.verified_io().unwrap();
    // What the target holds with only the host that stays.
    rig.wait_live(2);
    let (slots, fds_before, destroyed) = (rig.slots_free(), fds(), rig.destroyed());

    let gone_t = host(&gone_at);
    let mut gone = connect(&gone_t, GONE, 2).unwrap();
    gone.verified_io().unwrap();
    keep.verified_io().unwrap();
    rig.wait_live(4);
    assert!(rig.slots_free() < slots, "the new queues took slot buffers");

    rig.call(
        "nvmf_subsystem_remove_listener",
        json!({"nqn": GONE, "listen_address": gone_at}),
    );
    // The reply came after every core started closing them.
    let err = gone
        .verified_io()
        .expect_err("a queue of the removed listener still serves I/O");
    assert!(!gone.queue.is_alive(), "{err}: the queue is not closed");
    for _ in 0..20 {
        keep.verified_io().unwrap();
    }
    rig.wait_live(2);
    assert_eq!(
        rig.destroyed(),
        destroyed + 2,
        "admin and I/O queue destroyed"
    );
    assert_eq!(rig.slots_free(), slots, "every slot buffer came back");
    drop(gone);
    drop(gone_t);

    // No way back in through it: refused, and nothing taken for it.
    let again = host(&gone_at);
    assert!(
        connect(&again, GONE, 3).is_err(),
        "connected through a removed listener"
    );
    drop(again);
    rig.wait_live(2);
    assert_eq!(rig.slots_free(), slots);
    // The closed listener's descriptor is gone too.
    assert_eq!(fds(), fds_before - 1, "descriptors came back");
    let subs = rig.call("nvmf_get_subsystems", json!({}));
    let gone_sub = subs
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["nqn"] == GONE)
        .unwrap();
    assert_eq!(gone_sub["listen_addresses"], json!([]));

    // The other host never noticed.
    for _ in 0..20 {
        keep.verified_io().unwrap();
    }
    assert_eq!(rig.live(), 2);
}

#[test]
fn removing_an_rdma_listener_disconnects_its_queues_and_returns_their_resources() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let rig = Rig::new(true);
    rig.call("nvmf_create_transport", json!({"trtype": "RDMA"}));
    remove_one_listener(
        &rig,
        address("RDMA", "192.0.2.10", 4420),
        address("RDMA", "192.0.2.10", 4421),
        rdma_host,
    );
}

#[test]
fn removing_a_tcp_listener_disconnects_its_queues_and_returns_their_resources() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let rig = Rig::new(false);
    rig.call("nvmf_create_transport", json!({"trtype": "TCP"}));
    let (p1, p2) = (common::free_port(), common::free_port());
    remove_one_listener(
        &rig,
        address("TCP", "127.0.0.1", p1),
        address("TCP", "127.0.0.1", p2),
        tcp_host,
    );
}
