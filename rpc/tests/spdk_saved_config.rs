//! A configuration that SPDK v25.09's `nvmf_tgt` wrote with `save_config`
//! (`apps/tests/data/spdk-v25.09-nvmf_tgt-save_config.json`: malloc and
//! null bdevs, a TCP transport, two subsystems, a listener, a host, and
//! the framework-option methods SPDK always writes) loads through the
//! dispatcher: the bdevs and subsystems SPDK made are there, a saved
//! configuration loads back to the same, a changed option is refused
//! naming the method and the parameter (nothing is left), an unknown
//! method is refused by name (nothing is called). The listener is the
//! one subsystem's, as SPDK saved it: the other subsystem's host is
//! refused through it after the round trip.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

mod common;

use std::sync::Arc;

use pollux_bdev::BdevRegistry;
use pollux_nvmf::host::tcp::{TcpHost, TcpHostOptions};
use pollux_nvmf::host::{Controller, CtrlOptions, HostError, HostIdentity};
use pollux_nvmf::spec::cpl::NvmeStatus;
use pollux_nvmf::target::{Target, TargetOptions};
use pollux_reactor::{launch, Cores, LaunchConfig, ReactorSet};
use pollux_rpc::bdev::BdevSubsystem;
use pollux_rpc::nvmf::{LocalGroups, NvmfSubsystem};
use pollux_rpc::{ConfigError, CoreBus, JsonConfig, RpcService};
use serde_json::{json, Value};

const SAVED: &str = include_str!("../../apps/tests/data/spdk-v25.09-nvmf_tgt-save_config.json");

struct Rig {
    svc: Option<RpcService>,
    set: Option<ReactorSet>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        // Delete the subsystems: their listeners close, so the next rig
        // can listen on the same port.
        if let Some(svc) = &self.svc {
            if let Ok(Value::Array(subs)) = svc.call("nvmf_get_subsystems", None) {
                for s in subs.iter().filter(|s| s["subtype"] != "Discovery") {
                    let _ = svc.call("nvmf_delete_subsystem", Some(json!({"nqn": s["nqn"]})));
                }
            }
        }
        drop(self.svc.take());
        if let Some(set) = self.set.take() {
            set.stop_all();
            let _ = set.join();
        }
    }
}

impl Rig {
    fn new() -> Rig {
        let set = launch(LaunchConfig::new(Cores::first(1)), |_| {}).unwrap();
        let reg = Arc::new(BdevRegistry::new());
        // The pool sizes the file's nvmf_create_transport asks for
        // (`pollux-tgt --json` sizes its target from the file).
        let target = Target::new(TargetOptions {
            io_unit_size: 16384,
            in_capsule_data_size: 8192,
            num_data_buffers: 511,
            ..TargetOptions::for_tests()
        })
        .unwrap();
        let mut svc = RpcService::new(CoreBus::new(set.messenger().clone()));
        svc.register(BdevSubsystem::new(Arc::clone(&reg))).unwrap();
        svc.register(NvmfSubsystem::new(target, reg, Arc::new(LocalGroups)))
            .unwrap();
        Rig {
            svc: Some(svc),
            set: Some(set),
        }
    }

    fn svc(&self) -> &RpcService {
        self.svc.as_ref().unwrap()
    }

    fn get(&self, method: &str) -> Value {
        common::ok(self.svc(), method, json!({}))
    }
}

/// The fixture with its listener on `port`.
fn saved(port: u16) -> JsonConfig {
    let text = SAVED.replace("\"4421\"", &format!("\"{port}\""));
    JsonConfig::parse(&text).unwrap()
}

fn names(list: &Value, key: &str) -> Vec<String> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|b| b[key].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn spdks_saved_configuration_loads_and_saves_back_to_the_same() {
    let rig = Rig::new();
    let port = common::free_port();
    let n = saved(port).apply(rig.svc()).unwrap();
    assert_eq!(n, saved(port).entries().count(), "every call made");
    let bdevs = rig.get("bdev_get_bdevs");
    assert_eq!(names(&bdevs, "name"), ["Malloc0", "Null0"]);
    assert_eq!(bdevs[0]["num_blocks"], 131072);
    assert_eq!(bdevs[0]["uuid"], "08e06e8d-41fc-49b7-a85d-1135ffc257df");
    assert_eq!(bdevs[1]["block_size"], 4096);
    let subs = rig.get("nvmf_get_subsystems");
    assert_eq!(
        names(&subs, "nqn"),
        [
            "nqn.2014-08.org.nvmexpress.discovery",
            "nqn.2016-06.io.spdk:cnode1",
            "nqn.2016-06.io.spdk:cnode2"
        ]
    );
    let one = &subs[1];
    assert_eq!(one["serial_number"], "SPDK00000000000001");
    assert_eq!(one["model_number"], "SPDK_Controller1");
    assert_eq!(one["allow_any_host"], true);
    assert_eq!(one["listen_addresses"][0]["trsvcid"], port.to_string());
    assert_eq!(one["listen_addresses"].as_array().unwrap().len(), 1);
    assert_eq!(
        one["namespaces"][0]["nguid"],
        "08E06E8D41FC49B7A85D1135FFC257DF"
    );
    assert_eq!(one["namespaces"][1]["bdev_name"], "Null0");
    assert_eq!(one["namespaces"][1]["nsid"], 2);
    let two = &subs[2];
    assert_eq!(two["allow_any_host"], false);
    assert_eq!(two["hosts"][0]["nqn"], "nqn.2016-06.io.spdk:host1");
    assert_eq!(two["namespaces"], json!([]));
    assert_eq!(
        two["listen_addresses"],
        json!([]),
        "the listener is cnode1's"
    );
    let transports = rig.get("nvmf_get_transports");
    assert_eq!(transports[0]["trtype"], "TCP");
    assert_eq!(transports[0]["in_capsule_data_size"], 8192);

    // Pollux's own save loads into a fresh target to the same state.
    let mine = rig.get("save_config");
    let (subs_before, bdevs_before) = (subs.clone(), bdevs.clone());
    drop(rig);
    let again = Rig::new();
    let cfg: JsonConfig = serde_json::from_value(mine.clone()).unwrap();
    cfg.apply(again.svc()).unwrap();
    assert_eq!(again.get("nvmf_get_subsystems"), subs_before);
    assert_eq!(again.get("bdev_get_bdevs"), bdevs_before);
    assert_eq!(again.get("save_config"), mine);
    // The listener is cnode1's only: cnode2's own host is refused there.
    let t = TcpHost::new(
        format!("127.0.0.1:{port}").parse().unwrap(),
        TcpHostOptions::default(),
    );
    let who = HostIdentity {
        hostnqn: "nqn.2016-06.io.spdk:host1".into(),
        hostid: *b"pollux-spdk-cfg1",
        subnqn: "nqn.2016-06.io.spdk:cnode2".into(),
    };
    match Controller::connect(&t, who, CtrlOptions::default()) {
        Err(HostError::ConnectRefused { status, .. }) => {
            assert_eq!(status, NvmeStatus::CONNECT_INVALID_HOST);
        }
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("cnode2 took a host through cnode1's listener"),
    }
}

#[test]
fn the_option_methods_are_real_methods() {
    let rig = Rig::new();
    let methods = common::ok(rig.svc(), "rpc_get_methods", json!({}));
    for m in [
        "iobuf_set_options",
        "sock_set_default_impl",
        "sock_impl_set_options",
        "accel_set_options",
        "bdev_set_options",
        "bdev_raid_set_options",
        "bdev_nvme_set_options",
        "bdev_nvme_set_hotplug",
        "bdev_wait_for_examine",
        "framework_set_scheduler",
        "nvmf_set_config",
        "nvmf_set_max_subsystems",
        "nvmf_set_crdt",
    ] {
        assert!(
            methods.as_array().unwrap().contains(&json!(m)),
            "{m} not listed"
        );
    }
    assert_eq!(
        common::ok(rig.svc(), "bdev_wait_for_examine", json!({})),
        json!(true)
    );
    let e = common::refused(
        rig.svc(),
        "sock_set_default_impl",
        json!({"impl_name": "uring"}),
    );
    assert!(e.to_string().contains("impl_name"), "{e}");
    let e = common::refused(
        rig.svc(),
        "framework_set_scheduler",
        json!({"name": "dynamic"}),
    );
    assert!(e.to_string().contains("`name`"), "{e}");
}

#[test]
fn max_subsystems_is_honoured_and_undone_with_a_failed_configuration() {
    let rig = Rig::new();
    common::ok(
        rig.svc(),
        "nvmf_set_max_subsystems",
        json!({"max_subsystems": 1}),
    );
    common::ok(
        rig.svc(),
        "nvmf_create_subsystem",
        json!({"nqn": "nqn.2016-06.io.spdk:a"}),
    );
    let e = common::refused(
        rig.svc(),
        "nvmf_create_subsystem",
        json!({"nqn": "nqn.2016-06.io.spdk:b"}),
    );
    assert!(e.to_string().contains("max_subsystems"), "{e}");
    let e = common::refused(
        rig.svc(),
        "nvmf_set_max_subsystems",
        json!({"max_subsystems": 0}),
    );
    assert!(e.to_string().contains("max_subsystems"), "{e}");
    let saved = rig.get("save_config");
    assert!(
        saved.to_string().contains("\"max_subsystems\":1"),
        "{saved}"
    );

    // A file that raises the limit, then fails: the limit is back at 1.
    let bad = JsonConfig::parse(
        &json!({"subsystems": [{"subsystem": "nvmf", "config": [
            {"method": "nvmf_set_max_subsystems", "params": {"max_subsystems": 4}},
            {"method": "nvmf_create_subsystem", "params": {"nqn": "nqn.2016-06.io.spdk:b"}},
            {"method": "nvmf_subsystem_add_ns", "params": {"nqn": "nqn.2016-06.io.spdk:b", "namespace": {"bdev_name": "Missing"}}},
        ]}]})
        .to_string(),
    )
    .unwrap();
    assert!(bad.apply(rig.svc()).is_err());
    let e = common::refused(
        rig.svc(),
        "nvmf_create_subsystem",
        json!({"nqn": "nqn.2016-06.io.spdk:c"}),
    );
    assert!(e.to_string().contains("max_subsystems (1"), "{e}");
}

#[test]
fn a_changed_option_is_refused_by_method_and_parameter_and_leaves_nothing() {
    let rig = Rig::new();
    let text = SAVED
        .replace("\"4421\"", &format!("\"{}\"", common::free_port()))
        .replace(
            "\"bdev_io_pool_size\": 65535",
            "\"bdev_io_pool_size\": 4096",
        );
    assert!(text.contains("4096,\n            \"bdev_io_cache_size\""));
    let cfg = JsonConfig::parse(&text).unwrap();
    match cfg.apply(rig.svc()) {
        Err(ConfigError::Call { method, error, .. }) => {
            assert_eq!(method, "bdev_set_options");
            let all = error.to_string();
            assert!(all.contains("bdev_io_pool_size"), "{all}");
            assert!(all.contains("65535"), "{all}");
        }
        other => panic!("not refused by the option: {other:?}"),
    }
    assert_eq!(rig.get("bdev_get_bdevs"), json!([]));
    assert_eq!(rig.get("nvmf_get_subsystems").as_array().unwrap().len(), 1);
}

#[test]
fn an_unknown_method_is_refused_by_name_and_nothing_is_called() {
    let rig = Rig::new();
    let mut cfg = saved(common::free_port());
    let bdev = cfg
        .subsystems
        .iter_mut()
        .find(|s| s.subsystem == "bdev")
        .unwrap();
    bdev.config
        .get_or_insert_with(Vec::new)
        .push(pollux_rpc::ConfigEntry::new(
            "bdev_lvol_create_lvstore",
            json!({"bdev_name": "Malloc0", "lvs_name": "lvs"}),
        ));
    match cfg.apply(rig.svc()) {
        Err(ConfigError::UnknownMethods(m)) => assert_eq!(m, ["bdev_lvol_create_lvstore"]),
        other => panic!("not refused by name: {other:?}"),
    }
    assert_eq!(rig.get("bdev_get_bdevs"), json!([]));
}

#[test]
fn posix_socket_sizes_go_to_the_next_tcp_transport() {
    let rig = Rig::new();
    let posix =
        |size: u32| json!({"impl_name": "posix", "recv_buf_size": size, "send_buf_size": size});
    common::ok(rig.svc(), "sock_impl_set_options", posix(98304));
    let saved = rig.get("save_config").to_string();
    assert!(saved.contains("\"recv_buf_size\":98304"), "{saved}");
    // Other implementations take SPDK's defaults only.
    let e = common::refused(
        rig.svc(),
        "sock_impl_set_options",
        json!({"impl_name": "uring", "recv_buf_size": 98304}),
    );
    assert!(e.to_string().contains("recv_buf_size"), "{e}");
    common::ok(rig.svc(), "nvmf_create_transport", json!({"trtype": "TCP"}));
    // The transport runs with them: a change is refused, the same is not.
    let e = common::refused(rig.svc(), "sock_impl_set_options", posix(65536));
    assert_eq!(e.code, -16, "{e}");
    common::ok(rig.svc(), "sock_impl_set_options", posix(98304));

    // A file that changes them and then fails leaves them as they were.
    let fresh = Rig::new();
    let bad = JsonConfig::parse(
        &json!({"subsystems": [{"subsystem": "sock", "config": [
            {"method": "sock_impl_set_options", "params": posix(65536)},
            {"method": "bdev_set_options", "params": {"bdev_io_pool_size": 1}},
        ]}]})
        .to_string(),
    )
    .unwrap();
    assert!(bad.apply(fresh.svc()).is_err());
    let saved = fresh.get("save_config").to_string();
    assert!(!saved.contains("sock_impl_set_options"), "{saved}");
}
