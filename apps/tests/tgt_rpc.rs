//! `pollux-tgt`'s management plane end to end: `-r SOCK` serves JSON-RPC
//! over the target's own bdevs (those of the TOML file included), `--json
//! FILE` starts it from an SPDK configuration, `save_config` -> restart
//! with `--json` gives the same `bdev_get_bdevs`, unknown methods stop the
//! start, and a bdev a namespace uses cannot be deleted.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

mod common;

use common::{tmp, Tgt, WAIT};

use std::path::{Path, PathBuf};
use std::process::Command;

use pollux_rpc::{ClientError, RpcClient};
use rustix::process::Signal;
use serde_json::{json, Value};

/// Small transport buffers, no hugepages: many targets may run at once.
const TRANSPORT: &str = r#"
[transport]
max_queue_depth = 32
num_shared_buffers = 32
buf_cache_size = 4
max_srq_depth = 64
num_cqe = 1024
hugepages = "never"
"#;

fn write(name: &str, text: &str) -> PathBuf {
    let p = tmp(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// A target with only `cores` in its TOML file, plus `extra` arguments.
fn start(name: &str, extra: &[&str]) -> Tgt {
    let cfg = write(
        &format!("{name}.toml"),
        &format!("cores = \"0\"\n{TRANSPORT}"),
    );
    let mut t = Tgt::start(&cfg, extra);
    t.wait_line("pollux-tgt: ready");
    t
}

fn client(sock: &Path) -> RpcClient {
    RpcClient::connect(sock, WAIT).unwrap()
}

fn stop(mut t: Tgt) {
    t.signal(Signal::TERM);
    assert!(t.wait_exit().success());
}

#[test]
fn save_config_then_restart_with_json_gives_the_same_bdevs() {
    let first = write(
        "rpc-first.json",
        &json!({"subsystems": [{"subsystem": "bdev", "config": [
            {"method": "bdev_null_create", "params": {"name": "Null0", "num_blocks": 4096, "block_size": 512}},
            {"method": "bdev_malloc_create", "params": {"name": "Malloc0", "num_blocks": 256, "block_size": 4096,
             "uuid": "913fc008-79a7-447f-b2c4-c73543638c31"}}]}]})
        .to_string(),
    );
    let sock = tmp("rpc-a.sock");
    let s = sock.to_str().unwrap();
    let t = start("rpc-a", &["-r", s, "--json", first.to_str().unwrap()]);
    assert!(
        t.seen
            .iter()
            .any(|l| l.contains("applied") && l.contains("2 call(s)")),
        "{:?}",
        t.seen
    );
    let mut c = client(&sock);
    c.call(
        "bdev_malloc_create",
        Some(json!({"block_size": 512, "num_blocks": 128, "md_size": 8})),
    )
    .unwrap();
    let before = c.call("bdev_get_bdevs", None).unwrap();
    assert_eq!(before.as_array().unwrap().len(), 3);
    let saved = c.call("save_config", None).unwrap();
    let file = write(
        "rpc-saved.json",
        &serde_json::to_string_pretty(&saved).unwrap(),
    );
    drop(c);
    stop(t);
    assert!(!sock.exists(), "the socket goes with the target");

    let sock2 = tmp("rpc-b.sock");
    let t = start(
        "rpc-b",
        &[
            "-r",
            sock2.to_str().unwrap(),
            "--json",
            file.to_str().unwrap(),
        ],
    );
    let mut c = client(&sock2);
    assert_eq!(c.call("bdev_get_bdevs", None).unwrap(), before);
    assert_eq!(c.call("save_config", None).unwrap(), saved);
    stop(t);
}

#[test]
fn unknown_methods_in_json_are_named_and_the_target_does_not_start() {
    let bad = write(
        "rpc-unknown.json",
        &json!({"subsystems": [
            {"subsystem": "bdev", "config": [
                {"method": "bdev_malloc_create", "params": {"name": "M", "num_blocks": 8, "block_size": 512}},
                {"method": "bdev_nvme_attach_controller", "params": {"name": "Nvme0"}}]},
            {"subsystem": "nvmf", "config": [{"method": "nvmf_subsystem_set_keys", "params": {"nqn": "nqn.2016-06.io.spdk:cnode1", "host": "h"}}]}]})
        .to_string(),
    );
    let err = common::json_refused(&bad, &tmp("rpc-unknown.sock"));
    assert!(
        err.contains("bdev_nvme_attach_controller") && err.contains("nvmf_subsystem_set_keys"),
        "{err}"
    );
    // --check says the same without starting anything.
    let out = Command::new(env!("CARGO_BIN_EXE_pollux-tgt"))
        .args(["--json", bad.to_str().unwrap(), "--check"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nvmf_subsystem_set_keys"));
    // A file that is not a configuration names what is wrong.
    let junk = write("rpc-junk.json", "{\"subsystems\": 3}");
    let out = Command::new(env!("CARGO_BIN_EXE_pollux-tgt"))
        .args(["--json", junk.to_str().unwrap(), "--check"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an SPDK JSON configuration"));
}

#[test]
fn a_bdev_behind_a_namespace_cannot_be_deleted() {
    let cfg = write(
        "rpc-ns.toml",
        &format!(
            r#"cores = "0"
provider = "soft"
{TRANSPORT}
[[bdev]]
spec = "null:name=Null0,size=8M,block=512"

[[subsystem]]
nqn = "nqn.2016-06.io.pollux:rpc-ns"
serial = "POLLUXRPC1"
model = "Pollux RPC"
allow_any_host = true
namespaces = [{{ bdev = "Null0", nsid = 1 }}]

[[listener]]
traddr = "@rpc-ns-{}"
"#,
            std::process::id()
        ),
    );
    let sock = tmp("rpc-ns.sock");
    let mut t = Tgt::start(&cfg, &["-r", sock.to_str().unwrap()]);
    t.wait_line("pollux-tgt: ready");
    let mut c = client(&sock);
    let b = c
        .call("bdev_get_bdevs", Some(json!({"name": "Null0"})))
        .unwrap();
    assert_eq!(b[0]["claimed"], true);
    let e = c
        .call("bdev_null_delete", Some(json!({"name": "Null0"})))
        .unwrap_err();
    let ClientError::Rpc(e) = e else {
        panic!("{e}")
    };
    assert_eq!(
        (e.code, e.message.as_str()),
        (-16, "Device or resource busy")
    );
    assert!(c
        .call("bdev_get_bdevs", Some(json!({"name": "Null0"})))
        .is_ok());
    // The TOML file's bdevs are part of the saved configuration.
    let saved = c.call("save_config", None).unwrap();
    let entry: &Value = &saved["subsystems"][0]["config"][0];
    assert_eq!(
        (entry["method"].clone(), entry["params"]["name"].clone()),
        (json!("bdev_null_create"), json!("Null0"))
    );
    let r = c.call("framework_get_reactors", None).unwrap();
    assert_eq!(r["reactors"][0]["lcore"], 0);
    stop(t);
}
