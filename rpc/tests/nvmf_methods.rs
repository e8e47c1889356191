//! The nvmf methods through the dispatcher over a real target core: SPDK's
//! result shapes, every method's errors, all-or-nothing (a refused request
//! or a failing configuration leaves nothing), and a saved configuration
//! that rebuilds the same `nvmf_get_subsystems` and `bdev_get_bdevs`.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

mod common;

use std::net::TcpListener;
use std::sync::Arc;

use pollux_bdev::BdevRegistry;
use pollux_nvmf::target::{Target, TargetOptions};
use pollux_reactor::{launch, Cores, LaunchConfig};
use pollux_rpc::bdev::BdevSubsystem;
use pollux_rpc::error::{INTERNAL_ERROR, INVALID_PARAMS};
use pollux_rpc::nvmf::{LocalGroups, NvmfSubsystem};
use pollux_rpc::{CoreBus, JsonConfig, RpcError, RpcService};
use serde_json::{json, Value};

const NQN: &str = "nqn.2016-06.io.spdk:cnode1";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0c1f9a36-1111-2222-3333-444455556666";

struct Fixture {
    svc: RpcService,
    reg: Arc<BdevRegistry>,
    target: Arc<Target>,
}

fn fixture_on(cores: CoreBus) -> Fixture {
    let reg = Arc::new(BdevRegistry::new());
    let target = Target::new(TargetOptions::for_tests()).unwrap();
    let mut svc = RpcService::new(cores);
    svc.register(BdevSubsystem::new(Arc::clone(&reg))).unwrap();
    svc.register(NvmfSubsystem::new(
        Arc::clone(&target),
        Arc::clone(&reg),
        Arc::new(LocalGroups),
    ))
    .unwrap();
    Fixture { svc, reg, target }
}

fn fixture() -> Fixture {
    fixture_on(CoreBus::none())
}

fn call(f: &Fixture, method: &str, params: Value) -> Value {
    common::ok(&f.svc, method, params)
}

fn err(f: &Fixture, method: &str, params: Value) -> RpcError {
    common::refused(&f.svc, method, params)
}

fn listen_address(port: u16) -> Value {
    json!({"trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": port.to_string()})
}

/// Malloc0, the TCP transport and one subsystem with it as namespace 1.
fn populated(f: &Fixture, port: u16) {
    call(
        f,
        "bdev_malloc_create",
        json!({"name": "Malloc0", "num_blocks": 128, "block_size": 512}),
    );
    call(f, "nvmf_create_transport", json!({"trtype": "TCP"}));
    call(
        f,
        "nvmf_create_subsystem",
        json!({"nqn": NQN, "allow_any_host": true, "serial_number": "SPDK001"}),
    );
    assert_eq!(
        call(
            f,
            "nvmf_subsystem_add_ns",
            json!({"nqn": NQN, "namespace": {"bdev_name": "Malloc0"}})
        ),
        json!(1)
    );
    call(
        f,
        "nvmf_subsystem_add_listener",
        json!({"nqn": NQN, "listen_address": listen_address(port)}),
    );
}

fn subsystems(f: &Fixture) -> Vec<Value> {
    match call(f, "nvmf_get_subsystems", json!({})) {
        Value::Array(a) => a,
        other => panic!("not an array: {other}"),
    }
}

#[test]
fn a_target_built_by_calls_has_spdks_shapes() {
    let f = fixture();
    assert_eq!(call(&f, "nvmf_get_transports", json!({})), json!([]));
    let s = subsystems(&f);
    assert_eq!(s.len(), 1, "only the discovery subsystem");
    assert_eq!(s[0]["subtype"], "Discovery");

    let port = common::free_port();
    populated(&f, port);
    let t = call(&f, "nvmf_get_transports", json!({}));
    assert_eq!(t[0]["trtype"], "TCP");
    assert_eq!(t[0]["max_queue_depth"], 128);
    assert_eq!(t[0]["c2h_success"], true);
    assert_eq!(call(&f, "nvmf_get_transports", json!({"trtype": "tcp"})), t);

    let s = subsystems(&f);
    assert_eq!(s.len(), 2);
    let sub = &s[1];
    assert_eq!(sub["nqn"], NQN);
    assert_eq!(sub["subtype"], "NVMe");
    assert_eq!(sub["serial_number"], "SPDK001");
    assert_eq!(sub["model_number"], "SPDK bdev Controller");
    assert_eq!(sub["allow_any_host"], true);
    assert_eq!(sub["hosts"], json!([]));
    assert_eq!(
        sub["listen_addresses"],
        json!([{"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": port.to_string()}])
    );
    let ns = &sub["namespaces"][0];
    assert_eq!(ns["nsid"], 1);
    assert_eq!(ns["bdev_name"], "Malloc0");
    assert_eq!(ns["name"], "Malloc0");
    assert_eq!(ns["nguid"].as_str().unwrap().len(), 32);
    assert_eq!(ns["uuid"].as_str().unwrap().len(), 36);
    // The address is really open, and on the target.
    assert_eq!(f.target.listeners().len(), 1);
    assert!(TcpListener::bind(("127.0.0.1", port)).is_err());
    assert_eq!(
        call(&f, "nvmf_get_subsystems", json!({"nqn": NQN})),
        json!([sub])
    );

    // Hosts.
    call(
        &f,
        "nvmf_subsystem_allow_any_host",
        json!({"nqn": NQN, "allow_any_host": false}),
    );
    let sub = f.target.subsystem(NQN).unwrap();
    assert!(!sub.host_allowed(HOST));
    call(
        &f,
        "nvmf_subsystem_add_host",
        json!({"nqn": NQN, "host": HOST}),
    );
    assert!(sub.host_allowed(HOST));
    assert_eq!(subsystems(&f)[1]["hosts"], json!([{"nqn": HOST}]));
    call(
        &f,
        "nvmf_subsystem_remove_host",
        json!({"nqn": NQN, "host": HOST}),
    );
    assert!(!sub.host_allowed(HOST));

    // Listeners, controllers, queues, stats.
    assert_eq!(
        call(&f, "nvmf_subsystem_get_listeners", json!({"nqn": NQN})),
        json!([{"address": {"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": port.to_string()}, "ana_state": "optimized"}])
    );
    assert_eq!(
        call(&f, "nvmf_subsystem_get_controllers", json!({"nqn": NQN})),
        json!([])
    );
    assert_eq!(
        call(&f, "nvmf_subsystem_get_qpairs", json!({"nqn": NQN})),
        json!([])
    );
    let st = call(&f, "nvmf_get_stats", json!({}));
    assert!(st["poll_groups"].is_array());

    // Taking it apart.
    call(
        &f,
        "nvmf_subsystem_remove_listener",
        json!({"nqn": NQN, "listen_address": listen_address(port)}),
    );
    assert!(f.target.listeners().is_empty());
    TcpListener::bind(("127.0.0.1", port)).expect("the port is free again");
    call(
        &f,
        "nvmf_subsystem_remove_ns",
        json!({"nqn": NQN, "nsid": 1}),
    );
    assert!(sub.namespaces().is_empty());
    drop(sub);
    call(&f, "nvmf_delete_subsystem", json!({"nqn": NQN}));
    assert_eq!(subsystems(&f).len(), 1);
    call(&f, "bdev_malloc_delete", json!({"name": "Malloc0"}));
}

#[test]
fn every_method_refuses_bad_requests_and_changes_nothing() {
    let f = fixture();
    let port = common::free_port();
    populated(&f, port);
    let before = subsystems(&f);
    let other = "nqn.2016-06.io.spdk:nope";
    for (method, params) in [
        ("nvmf_delete_subsystem", json!({"nqn": other})),
        (
            "nvmf_subsystem_add_ns",
            json!({"nqn": other, "namespace": {"bdev_name": "Malloc0"}}),
        ),
        ("nvmf_subsystem_remove_ns", json!({"nqn": other, "nsid": 1})),
        (
            "nvmf_subsystem_add_listener",
            json!({"nqn": other, "listen_address": listen_address(port)}),
        ),
        (
            "nvmf_subsystem_remove_listener",
            json!({"nqn": other, "listen_address": listen_address(port)}),
        ),
        (
            "nvmf_subsystem_add_host",
            json!({"nqn": other, "host": HOST}),
        ),
        (
            "nvmf_subsystem_remove_host",
            json!({"nqn": other, "host": HOST}),
        ),
        (
            "nvmf_subsystem_allow_any_host",
            json!({"nqn": other, "allow_any_host": true}),
        ),
        ("nvmf_subsystem_get_controllers", json!({"nqn": other})),
        ("nvmf_subsystem_get_qpairs", json!({"nqn": other})),
        ("nvmf_subsystem_get_listeners", json!({"nqn": other})),
        ("nvmf_get_subsystems", json!({"nqn": other})),
    ] {
        let e = err(&f, method, params);
        assert_eq!(e.code, INVALID_PARAMS, "{method}: {e}");
        assert!(e.data.unwrap().contains("not found"), "{method}");
    }
    let cases = [
        // Wrong types, missing and unknown members.
        ("nvmf_create_subsystem", json!({"nqn": 5}), INVALID_PARAMS),
        ("nvmf_create_subsystem", json!({}), INVALID_PARAMS),
        (
            "nvmf_create_subsystem",
            json!({"nqn": NQN, "bogus": 1}),
            INVALID_PARAMS,
        ),
        ("nvmf_create_transport", json!({}), INVALID_PARAMS),
        // Bad values.
        (
            "nvmf_create_transport",
            json!({"trtype": "FC"}),
            INVALID_PARAMS,
        ),
        (
            "nvmf_create_transport",
            json!({"trtype": "TCP"}),
            INTERNAL_ERROR,
        ),
        (
            "nvmf_create_transport",
            json!({"trtype": "TCP", "tgt_name": "other"}),
            INTERNAL_ERROR,
        ),
        ("nvmf_create_subsystem", json!({"nqn": NQN}), INTERNAL_ERROR),
        (
            "nvmf_create_subsystem",
            json!({"nqn": "not-an-nqn"}),
            INTERNAL_ERROR,
        ),
        (
            "nvmf_create_subsystem",
            json!({"nqn": "nqn.2016-06.io.spdk:x", "serial_number": "X".repeat(21)}),
            INVALID_PARAMS,
        ),
        (
            "nvmf_create_subsystem",
            json!({"nqn": "nqn.2016-06.io.spdk:x", "min_cntlid": 9, "max_cntlid": 3}),
            INVALID_PARAMS,
        ),
        (
            "nvmf_create_subsystem",
            json!({"nqn": "nqn.2016-06.io.spdk:x", "ana_reporting": true}),
            -95,
        ),
        (
            "nvmf_delete_subsystem",
            json!({"nqn": "nqn.2014-08.org.nvmexpress.discovery"}),
            INVALID_PARAMS,
        ),
        (
            "nvmf_subsystem_add_ns",
            json!({"nqn": NQN, "namespace": {"bdev_name": "Nope"}}),
            INVALID_PARAMS,
        ),
        (
            "nvmf_subsystem_add_ns",
            json!({"nqn": NQN, "namespace": {"bdev_name": "Malloc0", "nsid": 1}}),
            INVALID_PARAMS,
        ),
        (
            "nvmf_subsystem_add_ns",
            json!({"nqn": NQN, "namespace": {"bdev_name": "Malloc0", "nguid": "zz"}}),
            INVALID_PARAMS,
        ),
        (
            "nvmf_subsystem_add_ns",
            json!({"nqn": NQN, "namespace": {"bdev_name": "Malloc0", "ptpl_file": "/tmp/x"}}),
            -95,
        ),
        (
            "nvmf_subsystem_remove_ns",
            json!({"nqn": NQN, "nsid": 7}),
            INVALID_PARAMS,
        ),
        (
            "nvmf_subsystem_add_listener",
            json!({"nqn": NQN, "listen_address": listen_address(port)}),
            INVALID_PARAMS,
        ),
        (
            "nvmf_subsystem_add_listener",
            json!({"nqn": NQN, "listen_address": {"trtype": "rdma", "traddr": "127.0.0.1", "trsvcid": "4420"}}),
            INVALID_PARAMS,
        ),
        (
            "nvmf_subsystem_add_listener",
            json!({"nqn": NQN, "listen_address": {"trtype": "tcp", "traddr": "127.0.0.1"}}),
            INVALID_PARAMS,
        ),
        (
            "nvmf_subsystem_add_listener",
            json!({"nqn": NQN, "listen_address": {"trtype": "tcp", "adrfam": "fc", "traddr": "127.0.0.1", "trsvcid": "1"}}),
            INVALID_PARAMS,
        ),
        (
            "nvmf_subsystem_add_listener",
            json!({"nqn": NQN, "listen_address": listen_address(port), "secure_channel": true}),
            -95,
        ),
        (
            "nvmf_subsystem_remove_listener",
            json!({"nqn": NQN, "listen_address": listen_address(common::free_port())}),
            INVALID_PARAMS,
        ),
        (
            "nvmf_subsystem_add_host",
            json!({"nqn": NQN, "host": "nonsense"}),
            INVALID_PARAMS,
        ),
        (
            "nvmf_subsystem_add_host",
            json!({"nqn": NQN, "host": HOST, "psk": "k"}),
            -95,
        ),
        (
            "nvmf_subsystem_remove_host",
            json!({"nqn": NQN, "host": HOST}),
            INVALID_PARAMS,
        ),
        (
            "nvmf_subsystem_allow_any_host",
            json!({"nqn": NQN}),
            INVALID_PARAMS,
        ),
        (
            "nvmf_get_transports",
            json!({"trtype": "RDMA"}),
            INVALID_PARAMS,
        ),
        ("nvmf_get_stats", json!({"x": 1}), INVALID_PARAMS),
        // A bdev used by a namespace is not deleted.
        ("bdev_malloc_delete", json!({"name": "Malloc0"}), -16),
    ];
    for (method, params, code) in cases {
        let e = err(&f, method, params.clone());
        assert_eq!(e.code, code, "{method} {params}: {e}");
        assert_eq!(
            subsystems(&f),
            before,
            "{method} {params} changed something"
        );
    }
    assert_eq!(f.target.listeners().len(), 1);
    assert!(f.reg.get("Malloc0").is_some());
}

#[test]
fn a_listener_that_cannot_bind_leaves_nothing() {
    let f = fixture();
    let port = common::free_port();
    populated(&f, port);
    // Someone else holds this port: the listen fails after every check passed.
    // Below the ephemeral range, so that no outgoing connection takes it
    // once it is free again.
    let busy = common::free_port();
    let taken = TcpListener::bind(("127.0.0.1", busy)).unwrap();
    let before = subsystems(&f);
    let e = err(
        &f,
        "nvmf_subsystem_add_listener",
        json!({"nqn": NQN, "listen_address": listen_address(busy)}),
    );
    assert_eq!(e.code, INVALID_PARAMS);
    assert_eq!(subsystems(&f), before);
    assert_eq!(f.target.listeners().len(), 1);
    drop(taken);
    call(
        &f,
        "nvmf_subsystem_add_listener",
        json!({"nqn": NQN, "listen_address": listen_address(busy)}),
    );
    assert_eq!(f.target.listeners().len(), 2);
}

#[test]
fn a_listener_shared_by_two_subsystems_stays_open_until_the_last_lets_it_go() {
    let f = fixture();
    let port = common::free_port();
    populated(&f, port);
    let nqn2 = "nqn.2016-06.io.spdk:cnode2";
    call(&f, "nvmf_create_subsystem", json!({"nqn": nqn2}));
    call(
        &f,
        "nvmf_subsystem_add_listener",
        json!({"nqn": nqn2, "listen_address": listen_address(port)}),
    );
    call(&f, "nvmf_delete_subsystem", json!({"nqn": nqn2}));
    assert_eq!(f.target.listeners().len(), 1, "cnode1 still listens there");
    call(
        &f,
        "nvmf_subsystem_remove_listener",
        json!({"nqn": NQN, "listen_address": listen_address(port)}),
    );
    assert!(f.target.listeners().is_empty());
}

#[test]
fn a_configuration_that_fails_half_way_leaves_nothing() {
    let f = fixture();
    let port = common::free_port();
    let text = json!({"subsystems": [
        {"subsystem": "bdev", "config": [
            {"method": "bdev_malloc_create", "params": {"name": "M1", "num_blocks": 64, "block_size": 512}}
        ]},
        {"subsystem": "nvmf", "config": [
            {"method": "nvmf_create_transport", "params": {"trtype": "TCP"}},
            {"method": "nvmf_create_subsystem", "params": {"nqn": NQN, "allow_any_host": true}},
            {"method": "nvmf_subsystem_add_listener", "params": {"nqn": NQN, "listen_address": listen_address(port)}},
            {"method": "nvmf_subsystem_add_host", "params": {"nqn": NQN, "host": HOST}},
            {"method": "nvmf_subsystem_add_ns", "params": {"nqn": NQN, "namespace": {"bdev_name": "M1"}}},
            // The injected failure: a namespace on a bdev that does not exist.
            {"method": "nvmf_subsystem_add_ns", "params": {"nqn": NQN, "namespace": {"bdev_name": "Missing"}}}
        ]}
    ]});
    let cfg = JsonConfig::parse(&text.to_string()).unwrap();
    let e = cfg.apply(&f.svc).unwrap_err();
    assert!(e.to_string().contains("Missing"), "{e}");
    assert_eq!(subsystems(&f).len(), 1, "only discovery is left");
    assert!(f.target.listeners().is_empty());
    assert!(f.reg.get("M1").is_none(), "the bdev is undone too");
    TcpListener::bind(("127.0.0.1", port)).expect("the port is free again");
}

#[test]
fn save_config_then_load_gives_the_same_subsystems_and_bdevs() {
    let f = fixture();
    let port = common::free_port();
    populated(&f, port);
    call(
        &f,
        "nvmf_subsystem_add_host",
        json!({"nqn": NQN, "host": HOST}),
    );
    call(
        &f,
        "bdev_null_create",
        json!({"name": "Null0", "num_blocks": 256, "block_size": 4096}),
    );
    call(
        &f,
        "nvmf_subsystem_add_ns",
        json!({"nqn": NQN, "namespace": {"bdev_name": "Null0", "nsid": 5,
            "nguid": "00112233445566778899AABBCCDDEEFF", "uuid": "6b2b8a4c-1c7e-4a8e-9d6f-0f5f7c9b2a11"}}),
    );
    let saved = call(&f, "save_config", json!({}));
    let subs = subsystems(&f);
    let bdevs = call(&f, "bdev_get_bdevs", json!({}));
    // Free the port: the new target listens there.
    call(
        &f,
        "nvmf_subsystem_remove_listener",
        json!({"nqn": NQN, "listen_address": listen_address(port)}),
    );
    drop(f);

    let g = fixture();
    let cfg = JsonConfig::parse(&saved.to_string()).unwrap();
    cfg.apply(&g.svc).unwrap();
    assert_eq!(subsystems(&g), subs);
    assert_eq!(call(&g, "bdev_get_bdevs", json!({})), bdevs);
    assert_eq!(
        subs[1]["namespaces"][1]["nguid"],
        "00112233445566778899AABBCCDDEEFF"
    );
}

#[test]
fn the_tcp_transport_starts_on_every_core_and_changes_wait_for_every_core() {
    let set = launch(LaunchConfig::new(Cores::first(2)), |_| {}).unwrap();
    let f = fixture_on(CoreBus::new(set.messenger().clone()));
    let port = common::free_port();
    populated(&f, port);
    let st = call(&f, "nvmf_get_stats", json!({}));
    let groups = st["poll_groups"].as_array().unwrap();
    assert_eq!(groups.len(), 2);
    for g in groups {
        assert_eq!(g["transports"][0]["trtype"], "TCP");
        assert_eq!(g["current_io_qpairs"], 0);
    }
    drop(f);
    set.stop_all();
    set.join().unwrap();
}

#[test]
fn a_listener_takes_spdks_sock_impl() {
    // `spdk-rpc nvmf_subsystem_add_listener -S posix` sends `sock_impl`:
    // the socket implementation Pollux's TCP transport is; another one is
    // refused (-95) and leaves no listener.
    let f = fixture();
    populated(&f, common::free_port());
    let port = common::free_port();
    let e = err(
        &f,
        "nvmf_subsystem_add_listener",
        json!({"nqn": NQN, "listen_address": listen_address(port), "sock_impl": "uring"}),
    );
    assert_eq!(e.code, -95, "{e}");
    assert!(e.data.as_deref().unwrap_or("").contains("sock_impl"), "{e}");
    assert_eq!(
        subsystems(&f)[1]["listen_addresses"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    call(
        &f,
        "nvmf_subsystem_add_listener",
        json!({"nqn": NQN, "listen_address": listen_address(port), "sock_impl": "posix"}),
    );
    assert_eq!(
        subsystems(&f)[1]["listen_addresses"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    call(
        &f,
        "nvmf_subsystem_remove_listener",
        json!({"nqn": NQN, "listen_address": listen_address(port), "sock_impl": "posix"}),
    );
    assert_eq!(
        subsystems(&f)[1]["listen_addresses"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}
