//! `pollux-tgt --json FILE` started from a configuration that SPDK
//! v25.09's `nvmf_tgt` wrote with `save_config`
//! (`data/spdk-v25.09-nvmf_tgt-save_config.json`, its listener moved to a
//! free port), with no TOML file: the bdevs and subsystems SPDK made are
//! there, a host does verified I/O over TCP to them, and `save_config` ->
//! restart with `--json` gives the same state; a copy with an option
//! changed from SPDK's default, or with a method Pollux does not know, is
//! refused naming it, and the target does not start.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

mod common;

use common::tcp_host::{free_port, host_io};
use common::{json_refused, tmp, Tgt, WAIT};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};

use pollux_rpc::RpcClient;
use rustix::process::Signal;
use serde_json::{json, Value};

const SAVED: &str = include_str!("data/spdk-v25.09-nvmf_tgt-save_config.json");
const NQN: &str = "nqn.2016-06.io.spdk:cnode1";

fn write(name: &str, text: &str) -> PathBuf {
    let p = tmp(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// The fixture with its listener on `port`.
fn saved(port: u16) -> String {
    let text = SAVED.replace("\"4421\"", &format!("\"{port}\""));
    assert_ne!(
        text, SAVED,
        "the fixture's port is where the test expects it"
    );
    text
}

fn start(json: &Path, sock: &Path) -> Tgt {
    let mut t = Tgt::start_json(json, sock);
    t.wait_line("pollux-tgt: ready");
    t
}

fn stop(mut t: Tgt) {
    t.signal(Signal::TERM);
    assert!(t.wait_exit().success());
}

fn call(c: &mut RpcClient, method: &str) -> Value {
    c.call(method, Some(json!({})))
        .unwrap_or_else(|e| panic!("{method}: {e}"))
}

#[test]
fn a_configuration_spdks_nvmf_tgt_saved_starts_the_target() {
    let port = free_port();
    let file = write("spdk-saved.json", &saved(port));
    let sock = tmp("spdk-saved.sock");
    let tgt = start(&file, &sock);
    assert!(
        tgt.seen
            .iter()
            .any(|l| l.contains("target options from") && l.contains("io_unit_size")),
        "{:?}",
        tgt.seen
    );
    let mut c = RpcClient::connect(&sock, WAIT).unwrap();
    let bdevs = call(&mut c, "bdev_get_bdevs");
    assert_eq!(bdevs[0]["name"], "Malloc0");
    assert_eq!(bdevs[0]["uuid"], "08e06e8d-41fc-49b7-a85d-1135ffc257df");
    assert_eq!(bdevs[1]["name"], "Null0");
    let subs = call(&mut c, "nvmf_get_subsystems");
    assert_eq!(subs[1]["nqn"], NQN);
    assert_eq!(subs[1]["serial_number"], "SPDK00000000000001");
    assert_eq!(subs[1]["namespaces"][1]["bdev_name"], "Null0");
    assert_eq!(subs[1]["listen_addresses"][0]["trsvcid"], port.to_string());
    assert_eq!(subs[2]["hosts"][0]["nqn"], "nqn.2016-06.io.spdk:host1");

    // A host does verified I/O to namespace 1 (Malloc0) over TCP.
    let stop_now = AtomicBool::new(true);
    let count = AtomicU64::new(0);
    let run = host_io(port, NQN, &stop_now, &count);
    assert!(run.completions >= 40, "{} completions", run.completions);

    // Pollux's own save restarts to the same.
    let mine = call(&mut c, "save_config");
    let again = write("spdk-saved-again.json", &mine.to_string());
    drop(c);
    stop(tgt);
    let tgt = start(&again, &sock);
    let mut c = RpcClient::connect(&sock, WAIT).unwrap();
    assert_eq!(call(&mut c, "bdev_get_bdevs"), bdevs);
    assert_eq!(call(&mut c, "nvmf_get_subsystems"), subs);
    assert_eq!(call(&mut c, "save_config"), mine);
    drop(c);
    stop(tgt);
}

#[test]
fn a_changed_option_or_an_unknown_method_keeps_the_target_from_starting() {
    let port = free_port();
    let text = saved(port);
    let changed = text.replace("\"enable_recv_pipe\": true", "\"enable_recv_pipe\": false");
    assert_ne!(changed, text);
    let file = write("spdk-changed.json", &changed);
    let err = json_refused(&file, &tmp("spdk-changed.sock"));
    assert!(
        err.contains("sock_impl_set_options") && err.contains("enable_recv_pipe"),
        "{err}"
    );
    let unknown = text.replace("\"bdev_wait_for_examine\"", "\"bdev_examine_all\"");
    let file = write("spdk-unknown.json", &unknown);
    let err = json_refused(&file, &tmp("spdk-unknown.sock"));
    assert!(err.contains("bdev_examine_all"), "{err}");
}
