//! The iscsi methods through the dispatcher over a real iSCSI target:
//! SPDK's result shapes, errors, all or nothing when a portal cannot open,
//! and a saved configuration that rebuilds the same target nodes.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

mod common;

use std::sync::Arc;

use pollux_reactor::sync::Mutex;

use pollux_bdev::BdevRegistry;
use pollux_iser::target::{IscsiTarget, TargetOptions};
use pollux_rpc::bdev::BdevSubsystem;
use pollux_rpc::error::INVALID_PARAMS;
use pollux_rpc::iscsi::{IscsiSubsystem, PortalError, PortalListener};
use pollux_rpc::{CoreBus, JsonConfig, RpcError, RpcService};
use serde_json::{json, Value};

/// Records what is open; refuses addresses containing `busy`.
#[derive(Default)]
struct Portals(Mutex<Vec<String>>);

impl PortalListener for Portals {
    fn listen(&self, addr: &str, _tag: u16) -> Result<(), PortalError> {
        if addr.contains("busy") {
            return Err(PortalError::Other("address in use".into()));
        }
        self.0.lock().unwrap().push(addr.to_owned());
        Ok(())
    }

    fn stop_listen(&self, addr: &str) -> Result<(), PortalError> {
        self.0.lock().unwrap().retain(|a| a != addr);
        Ok(())
    }
}

struct Fixture {
    svc: RpcService,
    target: Arc<IscsiTarget>,
    portals: Arc<Portals>,
}

fn fixture() -> Fixture {
    let reg = Arc::new(BdevRegistry::new());
    let target = IscsiTarget::new(TargetOptions::default()).unwrap();
    let portals = Arc::new(Portals::default());
    let mut svc = RpcService::new(CoreBus::none());
    svc.register(BdevSubsystem::new(Arc::clone(&reg))).unwrap();
    let p: Arc<dyn PortalListener> = portals.clone();
    svc.register(IscsiSubsystem::new(Arc::clone(&target), reg, p))
        .unwrap();
    Fixture {
        svc,
        target,
        portals,
    }
}

fn call(f: &Fixture, method: &str, params: Value) -> Value {
    common::ok(&f.svc, method, params)
}

fn err(f: &Fixture, method: &str, params: Value) -> RpcError {
    common::refused(&f.svc, method, params)
}

fn populated(f: &Fixture) {
    call(
        f,
        "bdev_malloc_create",
        json!({"name": "Malloc0", "num_blocks": 128, "block_size": 512}),
    );
    call(
        f,
        "iscsi_create_portal_group",
        json!({"tag": 1, "portals": [{"host": "@pollux-iser-rpc"}]}),
    );
    call(
        f,
        "iscsi_create_initiator_group",
        json!({"tag": 2, "initiators": ["iqn.2016-06.io.spdk:init"], "netmasks": ["ANY"]}),
    );
    call(
        f,
        "iscsi_create_target_node",
        json!({"name": "disk1", "alias_name": "Data", "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 2}],
               "luns": [{"bdev_name": "Malloc0", "lun_id": 0}], "queue_depth": 64}),
    );
}

#[test]
fn a_target_node_built_by_calls_has_spdks_shapes() {
    let f = fixture();
    populated(&f);
    assert_eq!(*f.portals.0.lock().unwrap(), ["@pollux-iser-rpc"]);
    let nodes = call(&f, "iscsi_get_target_nodes", json!({}));
    assert_eq!(
        nodes,
        json!([{
            "name": "iqn.2016-06.io.spdk:disk1",
            "alias_name": "Data",
            "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 2}],
            "luns": [{"bdev_name": "Malloc0", "lun_id": 0}],
            "queue_depth": 64,
            "disable_chap": false, "require_chap": false, "mutual_chap": false,
            "chap_group": 0, "header_digest": false, "data_digest": false,
        }])
    );
    let node = f.target.node("iqn.2016-06.io.spdk:disk1").unwrap();
    assert_eq!(node.allowed_initiators, ["iqn.2016-06.io.spdk:init"]);
    assert_eq!(node.portal_groups, [1]);
    assert_eq!(
        call(&f, "iscsi_get_portal_groups", json!({})),
        json!([{"tag": 1, "portals": [{"host": "@pollux-iser-rpc", "port": ""}], "private": false}])
    );
    assert_eq!(
        call(&f, "iscsi_get_initiator_groups", json!({})),
        json!([{"tag": 2, "initiators": ["iqn.2016-06.io.spdk:init"], "netmasks": ["ANY"]}])
    );
    assert_eq!(call(&f, "iscsi_get_connections", json!({})), json!([]));
    call(
        &f,
        "iscsi_delete_target_node",
        json!({"name": "iqn.2016-06.io.spdk:disk1"}),
    );
    assert!(f.target.nodes().is_empty());
    call(&f, "bdev_malloc_delete", json!({"name": "Malloc0"}));
}

#[test]
fn refused_requests_change_nothing() {
    let f = fixture();
    populated(&f);
    let before = call(&f, "iscsi_get_target_nodes", json!({}));
    let pgs = call(&f, "iscsi_get_portal_groups", json!({}));
    let igs = call(&f, "iscsi_get_initiator_groups", json!({}));
    let node = |extra: Value| {
        let mut v = json!({"name": "disk2", "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 2}],
            "luns": [{"bdev_name": "Malloc0", "lun_id": 0}], "queue_depth": 64});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    };
    for (method, params, code) in [
        (
            "iscsi_create_portal_group",
            json!({"tag": 1, "portals": [{"host": "@x"}]}),
            INVALID_PARAMS,
        ),
        (
            "iscsi_create_portal_group",
            json!({"tag": 0, "portals": [{"host": "@x"}]}),
            INVALID_PARAMS,
        ),
        (
            "iscsi_create_portal_group",
            json!({"tag": 3, "portals": []}),
            INVALID_PARAMS,
        ),
        (
            "iscsi_create_portal_group",
            json!({"tag": 3, "portals": [{"host": "10.0.0.1"}]}),
            INVALID_PARAMS,
        ),
        (
            "iscsi_create_portal_group",
            json!({"tag": 3, "portals": [{"host": "@x"}], "private": true}),
            -95,
        ),
        (
            "iscsi_create_initiator_group",
            json!({"tag": 2, "initiators": ["ANY"], "netmasks": ["ANY"]}),
            INVALID_PARAMS,
        ),
        (
            "iscsi_create_initiator_group",
            json!({"tag": 4, "initiators": ["ANY"], "netmasks": ["10.0.0.0/8"]}),
            -95,
        ),
        (
            "iscsi_create_target_node",
            node(json!({"name": "disk1"})),
            INVALID_PARAMS,
        ),
        (
            "iscsi_create_target_node",
            node(json!({"pg_ig_maps": [{"pg_tag": 9, "ig_tag": 2}]})),
            INVALID_PARAMS,
        ),
        (
            "iscsi_create_target_node",
            node(json!({"pg_ig_maps": [{"pg_tag": 1, "ig_tag": 9}]})),
            INVALID_PARAMS,
        ),
        (
            "iscsi_create_target_node",
            node(json!({"luns": [{"bdev_name": "Nope", "lun_id": 0}]})),
            INVALID_PARAMS,
        ),
        (
            "iscsi_create_target_node",
            node(json!({"luns": [{"bdev_name": "Malloc0", "lun_id": 20000}]})),
            INVALID_PARAMS,
        ),
        (
            "iscsi_create_target_node",
            node(json!({"require_chap": true})),
            -95,
        ),
        (
            "iscsi_create_target_node",
            node(json!({"header_digest": true})),
            -95,
        ),
        (
            "iscsi_create_target_node",
            node(json!({"bogus": 1})),
            INVALID_PARAMS,
        ),
        (
            "iscsi_delete_target_node",
            json!({"name": "iqn.2016-06.io.spdk:nope"}),
            INVALID_PARAMS,
        ),
        ("iscsi_get_target_nodes", json!({"x": 1}), INVALID_PARAMS),
        // Groups a node maps stay; unknown ones are named.
        ("iscsi_delete_portal_group", json!({"tag": 1}), -16),
        ("iscsi_delete_initiator_group", json!({"tag": 2}), -16),
        (
            "iscsi_delete_portal_group",
            json!({"tag": 9}),
            INVALID_PARAMS,
        ),
        (
            "iscsi_delete_initiator_group",
            json!({"tag": 9}),
            INVALID_PARAMS,
        ),
        // A LUN's bdev is not deleted while its node exists.
        ("bdev_malloc_delete", json!({"name": "Malloc0"}), -16),
    ] {
        let e = err(&f, method, params.clone());
        assert_eq!(e.code, code, "{method} {params}: {e}");
        assert_eq!(call(&f, "iscsi_get_target_nodes", json!({})), before);
        assert_eq!(call(&f, "iscsi_get_portal_groups", json!({})), pgs);
        assert_eq!(call(&f, "iscsi_get_initiator_groups", json!({})), igs);
    }
    assert_eq!(f.target.portal_groups().len(), 1);
}

#[test]
fn a_portal_that_cannot_open_leaves_no_group() {
    let f = fixture();
    let e = err(
        &f,
        "iscsi_create_portal_group",
        json!({"tag": 5, "portals": [{"host": "@fine"}, {"host": "@busy"}]}),
    );
    assert_eq!(e.code, INVALID_PARAMS);
    assert!(f.target.portal_groups().is_empty());
    assert!(f.portals.0.lock().unwrap().is_empty(), "@fine closed again");
}

#[test]
fn save_config_then_load_gives_the_same_nodes() {
    let f = fixture();
    populated(&f);
    let saved = call(&f, "save_config", json!({}));
    let nodes = call(&f, "iscsi_get_target_nodes", json!({}));
    let groups = call(&f, "iscsi_get_portal_groups", json!({}));
    let g = fixture();
    JsonConfig::parse(&saved.to_string())
        .unwrap()
        .apply(&g.svc)
        .unwrap();
    assert_eq!(call(&g, "iscsi_get_target_nodes", json!({})), nodes);
    assert_eq!(call(&g, "iscsi_get_portal_groups", json!({})), groups);
}

#[test]
fn a_node_whose_second_lun_is_refused_leaves_no_node_and_no_claim() {
    let f = fixture();
    populated(&f);
    call(
        &f,
        "bdev_malloc_create",
        json!({"name": "Malloc1", "num_blocks": 128, "block_size": 512}),
    );
    let before = call(&f, "iscsi_get_target_nodes", json!({}));
    for luns in [
        json!([{"bdev_name": "Malloc1", "lun_id": 0}, {"bdev_name": "Missing", "lun_id": 1}]),
        json!([{"bdev_name": "Malloc1", "lun_id": 0}, {"bdev_name": "Malloc1", "lun_id": 0}]),
        json!([{"bdev_name": "Malloc1", "lun_id": 0}, {"bdev_name": "Malloc0", "lun_id": 16384}]),
    ] {
        let e = err(
            &f,
            "iscsi_create_target_node",
            json!({"name": "disk2", "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 2}],
                   "luns": luns, "queue_depth": 64}),
        );
        assert_eq!(e.code, INVALID_PARAMS, "{luns}: {e}");
        assert_eq!(call(&f, "iscsi_get_target_nodes", json!({})), before);
    }
    // No descriptor of the refused nodes is left on the first LUN's bdev.
    call(&f, "bdev_malloc_delete", json!({"name": "Malloc1"}));
}

#[test]
fn a_configuration_that_fails_half_way_leaves_no_group_and_no_node() {
    let f = fixture();
    populated(&f);
    let nodes = call(&f, "iscsi_get_target_nodes", json!({}));
    let pgs = call(&f, "iscsi_get_portal_groups", json!({}));
    let igs = call(&f, "iscsi_get_initiator_groups", json!({}));
    let bad = json!({"subsystems": [{"subsystem": "iscsi", "config": [
        {"method": "iscsi_create_portal_group", "params": {"tag": 7, "portals": [{"host": "@half"}]}},
        {"method": "iscsi_create_initiator_group", "params": {"tag": 8, "initiators": ["ANY"], "netmasks": ["ANY"]}},
        {"method": "iscsi_create_target_node", "params": {"name": "disk7",
            "pg_ig_maps": [{"pg_tag": 7, "ig_tag": 8}], "queue_depth": 16,
            "luns": [{"bdev_name": "Malloc0", "lun_id": 0}, {"bdev_name": "Missing", "lun_id": 1}]}},
    ]}]});
    let e = JsonConfig::parse(&bad.to_string())
        .unwrap()
        .apply(&f.svc)
        .unwrap_err();
    assert!(e.to_string().contains("Missing"), "{e}");
    assert_eq!(call(&f, "iscsi_get_target_nodes", json!({})), nodes);
    assert_eq!(call(&f, "iscsi_get_portal_groups", json!({})), pgs);
    assert_eq!(call(&f, "iscsi_get_initiator_groups", json!({})), igs);
    assert_eq!(
        *f.portals.0.lock().unwrap(),
        ["@pollux-iser-rpc"],
        "@half closed"
    );
}

#[test]
fn groups_go_once_no_node_maps_them() {
    let f = fixture();
    populated(&f);
    call(
        &f,
        "iscsi_delete_target_node",
        json!({"name": "iqn.2016-06.io.spdk:disk1"}),
    );
    call(&f, "iscsi_delete_initiator_group", json!({"tag": 2}));
    call(&f, "iscsi_delete_portal_group", json!({"tag": 1}));
    assert_eq!(call(&f, "iscsi_get_portal_groups", json!({})), json!([]));
    assert_eq!(call(&f, "iscsi_get_initiator_groups", json!({})), json!([]));
    assert!(f.portals.0.lock().unwrap().is_empty(), "its portal closed");
}
