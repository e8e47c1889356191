//! The `pollux-rpc` binary against a server: spdk-rpc's verbs and
//! arguments, its output, and its exit status on errors.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::Arc;

use pollux_bdev::BdevRegistry;
use pollux_nvmf::target::{Target, TargetOptions};
use pollux_rpc::bdev::BdevSubsystem;
use pollux_rpc::nvmf::{LocalGroups, NvmfSubsystem};
use pollux_rpc::{CoreBus, RpcServer, RpcService, ServerConfig};
use serde_json::Value;

fn server(name: &str) -> (RpcServer, Arc<BdevRegistry>) {
    let reg = Arc::new(BdevRegistry::new());
    let mut svc = RpcService::new(CoreBus::none());
    svc.register(BdevSubsystem::new(Arc::clone(&reg))).unwrap();
    let target = Target::new(TargetOptions::for_tests()).unwrap();
    svc.register(NvmfSubsystem::new(
        target,
        Arc::clone(&reg),
        Arc::new(LocalGroups),
    ))
    .unwrap();
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("cli-{name}-{}.sock", std::process::id()));
    (
        RpcServer::start(ServerConfig::new(path), Arc::new(svc)).unwrap(),
        reg,
    )
}

fn rpc(s: &RpcServer, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pollux-rpc"))
        .arg("-s")
        .arg(s.path())
        .args(args)
        .output()
        .unwrap()
}

fn ok(s: &RpcServer, args: &[&str]) -> String {
    let out = rpc(s, args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn json(s: &RpcServer, args: &[&str]) -> Value {
    serde_json::from_str(&ok(s, args)).unwrap()
}

#[test]
fn verbs_as_spdk_rpc() {
    let (s, reg) = server("verbs");
    assert_eq!(
        ok(&s, &["bdev_malloc_create", "-b", "Malloc0", "1", "512"]),
        "Malloc0\n"
    );
    assert_eq!(ok(&s, &["bdev_malloc_create", "2", "4096"]), "Malloc1\n");
    assert_eq!(
        ok(
            &s,
            &[
                "bdev_null_create",
                "Null0",
                "4",
                "512",
                "-m",
                "8",
                "-t",
                "1"
            ]
        ),
        "Null0\n"
    );
    let b = json(&s, &["bdev_get_bdevs", "-b", "Malloc1"]);
    assert_eq!(
        (b[0]["num_blocks"].clone(), b[0]["block_size"].clone()),
        (512.into(), 4096.into())
    );
    assert_eq!(json(&s, &["bdev_get_bdevs"]).as_array().unwrap().len(), 3);
    let methods = json(&s, &["rpc_get_methods", "--current"]);
    assert!(methods
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m == "bdev_get_iostat"));
    assert!(json(&s, &["spdk_get_version"])["version"].is_string());
    assert_eq!(
        json(&s, &["framework_get_subsystems"])[0]["subsystem"],
        "bdev"
    );
    assert!(json(&s, &["bdev_get_iostat", "-b", "Null0"])["bdevs"].is_array());
    assert_eq!(ok(&s, &["framework_wait_init"]), "");
    assert_eq!(ok(&s, &["bdev_malloc_delete", "Malloc0"]), "");
    assert_eq!(ok(&s, &["bdev_null_delete", "Null0"]), "");
    assert_eq!(reg.list().len(), 1);
    let v = json(&s, &["call", "bdev_get_bdevs", r#"{"name": "Malloc1"}"#]);
    assert_eq!(v[0]["name"], "Malloc1");
}

#[test]
fn save_and_load_config_round_trip() {
    let (s, _) = server("save");
    ok(&s, &["bdev_malloc_create", "-b", "M", "1", "512"]);
    let saved = ok(&s, &["save_config"]);
    let cfg: Value = serde_json::from_str(&saved).unwrap();
    assert_eq!(cfg["subsystems"][0]["config"][0]["params"]["name"], "M");
    assert_eq!(
        ok(&s, &["save_config", "-i", "-1"]).lines().count(),
        1,
        "compact"
    );
    let file =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("cli-{}.json", std::process::id()));
    std::fs::write(&file, &saved).unwrap();
    let (fresh, reg) = server("load");
    ok(&fresh, &["load_config", "-j", file.to_str().unwrap()]);
    assert_eq!(reg.list().len(), 1);
    assert_eq!(
        json(&fresh, &["bdev_get_bdevs"]),
        json(&s, &["bdev_get_bdevs"])
    );
    let _ = std::fs::remove_file(&file);
}

#[test]
fn errors_print_the_request_and_exit_1() {
    let (s, _) = server("errors");
    let out = rpc(&s, &["bdev_malloc_delete", "Nope"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Got JSON-RPC error response"), "{err}");
    assert!(
        err.contains("\"code\": -19") && err.contains("No such device"),
        "{err}"
    );
    let out = rpc(&s, &["call", "no_such_method"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("-32601"));
    let out = Command::new(env!("CARGO_BIN_EXE_pollux-rpc"))
        .args(["-s", "/nonexistent/pollux.sock", "spdk_get_version"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot connect"));
}

#[test]
fn nvmf_verbs_as_spdk_rpc() {
    let (s, _reg) = server("nvmf");
    const NQN: &str = "nqn.2016-06.io.spdk:cli1";
    let port = pollux_reactor::free_tcp_port("127.0.0.1").to_string();
    ok(&s, &["bdev_malloc_create", "-b", "Malloc0", "1", "512"]);
    ok(&s, &["nvmf_create_transport", "-t", "TCP"]);
    ok(&s, &["nvmf_create_subsystem", NQN, "-a", "-s", "SN1"]);
    assert_eq!(
        ok(&s, &["nvmf_subsystem_add_ns", NQN, "Malloc0"]).trim(),
        "1"
    );
    ok(
        &s,
        &[
            "nvmf_subsystem_add_listener",
            NQN,
            "-t",
            "tcp",
            "-a",
            "127.0.0.1",
            "-s",
            &port,
        ],
    );
    ok(
        &s,
        &[
            "nvmf_subsystem_add_host",
            NQN,
            "nqn.2014-08.org.nvmexpress:uuid:cli",
        ],
    );
    ok(&s, &["nvmf_subsystem_allow_any_host", NQN, "-d"]);
    let sub = &json(&s, &["nvmf_get_subsystems", NQN])[0];
    assert_eq!(sub["serial_number"], "SN1");
    assert_eq!(sub["allow_any_host"], false);
    assert_eq!(
        sub["hosts"][0]["nqn"],
        "nqn.2014-08.org.nvmexpress:uuid:cli"
    );
    assert_eq!(sub["listen_addresses"][0]["trsvcid"], port.as_str());
    assert_eq!(json(&s, &["nvmf_get_transports"])[0]["trtype"], "TCP");
    assert_eq!(
        json(&s, &["nvmf_subsystem_get_listeners", NQN])
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        json(&s, &["nvmf_subsystem_get_controllers", NQN]),
        serde_json::json!([])
    );
    assert_eq!(
        json(&s, &["nvmf_subsystem_get_qpairs", NQN]),
        serde_json::json!([])
    );
    assert!(json(&s, &["nvmf_get_stats"])["poll_groups"].is_array());
    // A refused call exits 1, a bad command line 2.
    assert_eq!(
        rpc(&s, &["nvmf_create_transport", "-t", "TCP"])
            .status
            .code(),
        Some(1)
    );
    assert_eq!(
        rpc(&s, &["nvmf_subsystem_allow_any_host", NQN])
            .status
            .code(),
        Some(2)
    );
    ok(
        &s,
        &[
            "nvmf_subsystem_remove_host",
            NQN,
            "nqn.2014-08.org.nvmexpress:uuid:cli",
        ],
    );
    ok(
        &s,
        &[
            "nvmf_subsystem_remove_listener",
            NQN,
            "-t",
            "tcp",
            "-a",
            "127.0.0.1",
            "-s",
            &port,
        ],
    );
    ok(&s, &["nvmf_subsystem_remove_ns", NQN, "1"]);
    ok(&s, &["nvmf_delete_subsystem", NQN]);
    assert_eq!(
        json(&s, &["nvmf_get_subsystems"]).as_array().unwrap().len(),
        1
    );
}
