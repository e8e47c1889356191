//! Every method of the framework and the bdev subsystem, its results in
//! SPDK's shape and its errors, through the dispatcher (no socket): what a
//! request does, a configuration file does the same way.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use pollux_bdev::{BdevRegistry, CompletedIo, IoChannel, IoCompletion, SgList};
use pollux_reactor::mem::DmaBuf;
use pollux_reactor::{launch, Cores, LaunchConfig, ReactorSet};
use pollux_rpc::bdev::BdevSubsystem;
use pollux_rpc::error::{
    INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, INVALID_STATE, METHOD_NOT_FOUND,
};
use pollux_rpc::{
    ConfigEntry, CoreBus, JsonConfig, Method, RpcError, RpcService, RpcState, StateMask, Subsystem,
};
use serde_json::{json, Value};

fn service_with(registry: &Arc<BdevRegistry>, cores: CoreBus) -> RpcService {
    let mut svc = RpcService::new(cores);
    svc.register(BdevSubsystem::new(Arc::clone(registry)))
        .unwrap();
    svc
}

fn service() -> (RpcService, Arc<BdevRegistry>) {
    let reg = Arc::new(BdevRegistry::new());
    (service_with(&reg, CoreBus::none()), reg)
}

fn err(svc: &RpcService, method: &str, params: Value) -> RpcError {
    svc.call(method, Some(params))
        .expect_err(&format!("{method} should fail"))
}

fn names(reg: &BdevRegistry) -> Vec<String> {
    reg.list().iter().map(|b| b.name().to_owned()).collect()
}

/// The bdevs as `bdev_get_bdevs` lists them.
fn bdevs(svc: &RpcService) -> Vec<Value> {
    match svc.call("bdev_get_bdevs", None).unwrap() {
        Value::Array(a) => a,
        other => panic!("not an array: {other}"),
    }
}

#[test]
fn spdk_get_version_and_rpc_get_methods() {
    let (svc, _) = service();
    let v = svc.call("spdk_get_version", None).unwrap();
    assert!(v["version"].as_str().unwrap().starts_with("Pollux v"));
    assert!(v["fields"]["major"].is_u64());
    assert_eq!(
        err(&svc, "spdk_get_version", json!({"x": 1})).code,
        INVALID_PARAMS
    );

    let all = svc.call("rpc_get_methods", None).unwrap();
    let all: Vec<String> = serde_json::from_value(all).unwrap();
    for m in [
        "spdk_get_version",
        "rpc_get_methods",
        "framework_wait_init",
        "framework_get_reactors",
        "framework_get_subsystems",
        "framework_get_config",
        "save_config",
        "load_config",
        "bdev_malloc_create",
        "bdev_malloc_delete",
        "bdev_null_create",
        "bdev_null_delete",
        "bdev_aio_create",
        "bdev_aio_delete",
        "bdev_get_bdevs",
        "bdev_get_iostat",
        "framework_start_init",
    ] {
        assert!(all.iter().any(|n| n == m), "{m} missing from {all:?}");
    }
    // `current`: framework_start_init may only run before initialisation.
    let now = svc.call(
        "rpc_get_methods",
        Some(json!({"current": true, "include_aliases": false})),
    );
    let now: Vec<String> = serde_json::from_value(now.unwrap()).unwrap();
    assert!(!now.iter().any(|n| n == "framework_start_init"));
    assert_eq!(now.len() + 1, all.len());
    assert_eq!(
        err(&svc, "rpc_get_methods", json!({"current": "yes"})).code,
        INVALID_PARAMS
    );
    assert_eq!(
        err(&svc, "rpc_get_methods", json!({"bogus": 1})).code,
        INVALID_PARAMS
    );
    assert_eq!(
        err(&svc, "rpc_get_methods", json!([true])).code,
        INVALID_PARAMS
    );
    let e = err(&svc, "no_such_method", json!({}));
    assert_eq!(e.code, METHOD_NOT_FOUND);
    assert_eq!(e.message, "Method not found");
}

#[test]
fn startup_state_gates_methods_as_spdk_does() {
    let (svc, reg) = service();
    assert_eq!(svc.call("framework_wait_init", None).unwrap(), json!(true));
    assert_eq!(
        err(&svc, "framework_start_init", json!({})).code,
        INVALID_STATE
    );
    svc.set_state(RpcState::Startup);
    let now: Vec<String> = serde_json::from_value(
        svc.call("rpc_get_methods", Some(json!({"current": true})))
            .unwrap(),
    )
    .unwrap();
    assert!(now.iter().any(|n| n == "framework_start_init"));
    assert!(!now.iter().any(|n| n == "bdev_malloc_create"));
    let e = err(
        &svc,
        "bdev_malloc_create",
        json!({"block_size": 512, "num_blocks": 8}),
    );
    assert_eq!(e.code, INVALID_STATE);
    assert!(reg.list().is_empty());
    assert_eq!(
        err(&svc, "framework_wait_init", json!({})).code,
        INVALID_STATE
    );
    assert_eq!(svc.call("framework_start_init", None).unwrap(), json!(true));
    assert_eq!(svc.state(), RpcState::Runtime);
    assert_eq!(svc.call("framework_wait_init", None).unwrap(), json!(true));
}

#[test]
fn framework_get_subsystems_and_config() {
    let (svc, _) = service();
    assert_eq!(
        svc.call("framework_get_subsystems", None).unwrap(),
        json!([{"subsystem": "bdev", "depends_on": []}])
    );
    assert_eq!(
        svc.call("framework_get_config", Some(json!({"name": "bdev"})))
            .unwrap(),
        json!([])
    );
    svc.call(
        "bdev_null_create",
        Some(json!({"name": "N", "num_blocks": 8, "block_size": 512})),
    )
    .unwrap();
    let cfg = svc
        .call("framework_get_config", Some(json!({"name": "bdev"})))
        .unwrap();
    assert_eq!(cfg[0]["method"], "bdev_null_create");
    assert_eq!(cfg[0]["params"]["name"], "N");
    let e = err(&svc, "framework_get_config", json!({"name": "nvmf"}));
    assert_eq!(e.code, INVALID_PARAMS);
    assert!(e.data.unwrap().contains("Subsystem 'nvmf' not found"));
    assert_eq!(
        err(&svc, "framework_get_config", json!({})).code,
        INVALID_PARAMS
    );
}

#[test]
fn bdev_malloc_create_and_delete() {
    let (svc, reg) = service();
    let p = json!({"block_size": 512, "num_blocks": 128});
    assert_eq!(
        svc.call("bdev_malloc_create", Some(p.clone())).unwrap(),
        json!("Malloc0")
    );
    assert_eq!(
        svc.call("bdev_malloc_create", Some(p)).unwrap(),
        json!("Malloc1")
    );
    let uuid = "913fc008-79a7-447f-b2c4-c73543638c31";
    let made = svc.call(
        "bdev_malloc_create",
        Some(
            json!({"name": "M", "block_size": 4096, "num_blocks": 16, "uuid": uuid,
                     "md_size": 8, "md_interleave": true, "dif_type": 1,
                     "dif_is_head_of_md": false, "physical_block_size": 4096, "numa_id": -1,
                     "optimal_io_boundary": 0, "dif_pi_format": 0}),
        ),
    );
    assert_eq!(made.unwrap(), json!("M"));
    let list = bdevs(&svc);
    let m = list.iter().find(|b| b["name"] == "M").unwrap();
    assert_eq!(m["uuid"], uuid);
    assert_eq!(m["product_name"], "Malloc disk");
    assert_eq!(m["num_blocks"], 16);
    assert_eq!(
        m["block_size"],
        4096 + 8,
        "interleaved metadata is part of the block, as SPDK shows it"
    );
    assert_eq!(
        (
            m["md_size"].clone(),
            m["md_interleave"].clone(),
            m["dif_type"].clone()
        ),
        (json!(8), json!(true), json!(1))
    );
    assert_eq!(m["claimed"], false);
    assert_eq!(m["supported_io_types"]["read"], true);
    assert_eq!(m["supported_io_types"]["nvme_admin"], false);
    for k in [
        "aliases",
        "assigned_rate_limits",
        "zoned",
        "driver_specific",
    ] {
        assert!(m.get(k).is_some(), "{k} missing");
    }

    // Errors, each leaving nothing behind.
    let before = names(&reg);
    let cases = [
        (
            json!({"name": "M", "block_size": 512, "num_blocks": 8}),
            -17,
            "File exists",
        ),
        (
            json!({"name": "X", "block_size": 1000, "num_blocks": 8}),
            -22,
            "block_size",
        ),
        (
            json!({"name": "X", "block_size": 512, "num_blocks": 0}),
            -22,
            "num_blocks",
        ),
        (
            json!({"name": "X", "block_size": 512, "num_blocks": 8, "md_size": 7}),
            -22,
            "md_size",
        ),
        (
            json!({"name": "X", "block_size": 512, "num_blocks": 8, "dif_type": 9}),
            -22,
            "dif_type",
        ),
        (
            json!({"name": "X", "block_size": 512, "num_blocks": 8, "uuid": "nope"}),
            -22,
            "uuid",
        ),
        (
            json!({"name": "X", "block_size": 512, "num_blocks": 8, "optimal_io_boundary": 8}),
            -95,
            "optimal_io_boundary",
        ),
        (
            json!({"name": "X", "block_size": 512, "num_blocks": 8, "numa_id": 1}),
            -95,
            "numa_id",
        ),
        (
            json!({"name": "a b", "block_size": 512, "num_blocks": 8}),
            -22,
            "name",
        ),
        (
            json!({"name": "X", "block_size": 512}),
            INVALID_PARAMS,
            "num_blocks",
        ),
        (
            json!({"name": "X", "block_size": "512", "num_blocks": 8}),
            INVALID_PARAMS,
            "invalid type",
        ),
        (
            json!({"name": "X", "block_size": 512, "num_blocks": -8}),
            INVALID_PARAMS,
            "invalid",
        ),
        (
            json!({"name": "X", "block_size": 512, "num_blocks": 8, "colour": 1}),
            INVALID_PARAMS,
            "colour",
        ),
        (
            json!({"name": "X", "block_size": 512, "num_blocks": u64::MAX}),
            -22,
            "overflows",
        ),
    ];
    for (p, code, word) in cases {
        let e = err(&svc, "bdev_malloc_create", p.clone());
        assert_eq!(e.code, code, "{p}: {e}");
        assert!(e.to_string().contains(word), "{p}: {e} lacks {word}");
    }
    assert_eq!(names(&reg), before, "a refused create leaves nothing");

    assert_eq!(
        svc.call("bdev_malloc_delete", Some(json!({"name": "Malloc0"})))
            .unwrap(),
        json!(true)
    );
    assert!(reg.get("Malloc0").is_none());
    let e = err(&svc, "bdev_malloc_delete", json!({"name": "Malloc0"}));
    assert_eq!((e.code, e.message.as_str()), (-19, "No such device"));
    assert_eq!(
        err(&svc, "bdev_malloc_delete", json!({})).code,
        INVALID_PARAMS
    );
}

#[test]
fn deleting_a_bdev_in_use_is_refused() {
    let (svc, reg) = service();
    svc.call(
        "bdev_null_create",
        Some(json!({"name": "Busy", "num_blocks": 64, "block_size": 512})),
    )
    .unwrap();
    let desc = reg.get("Busy").unwrap().open(true).unwrap();
    let b = bdevs(&svc);
    assert_eq!(b[0]["claimed"], true);
    assert_eq!(b[0]["claim_type"], "read_many_write_shared");
    let e = err(&svc, "bdev_null_delete", json!({"name": "Busy"}));
    assert_eq!(
        (e.code, e.message.as_str()),
        (-16, "Device or resource busy")
    );
    assert!(e.data.unwrap().contains("Busy"), "names the bdev");
    assert!(reg.get("Busy").is_some(), "still there");
    // The wrong kind of delete is refused as SPDK does (no such malloc bdev).
    assert_eq!(
        err(&svc, "bdev_malloc_delete", json!({"name": "Busy"})).code,
        -19
    );
    drop(desc);
    assert_eq!(
        svc.call("bdev_null_delete", Some(json!({"name": "Busy"})))
            .unwrap(),
        json!(true)
    );
    assert!(reg.list().is_empty());
}

#[test]
fn bdev_null_create_and_delete() {
    let (svc, reg) = service();
    // What `spdk-rpc bdev_null_create N 1 512 -m 8 -t 1` sends.
    let p = json!({"name": "Null0", "num_blocks": 2048, "block_size": 512, "md_size": 8,
                   "dif_type": 1, "dif_is_head_of_md": false});
    assert_eq!(
        svc.call("bdev_null_create", Some(p)).unwrap(),
        json!("Null0")
    );
    let b = &bdevs(&svc)[0];
    assert_eq!(b["product_name"], "Null disk");
    assert_eq!(
        b["block_size"], 520,
        "SPDK's null bdev interleaves its metadata"
    );
    assert_eq!(b["md_interleave"], true);
    assert_eq!(b["enabled_dif_check_types"]["reftag"], true);
    let info = reg.get("Null0").unwrap().info().clone();
    assert_eq!((info.block_size(), info.md_size()), (512, 8));
    assert_eq!(
        err(
            &svc,
            "bdev_null_create",
            json!({"num_blocks": 8, "block_size": 512})
        )
        .code,
        INVALID_PARAMS
    );
    let e = err(
        &svc,
        "bdev_null_create",
        json!({"name": "N", "num_blocks": 8, "block_size": 512, "optimal_write_size": 4}),
    );
    assert_eq!(e.code, -95);
    assert_eq!(
        svc.call("bdev_null_delete", Some(json!({"name": "Null0"})))
            .unwrap(),
        json!(true)
    );
    assert_eq!(
        err(&svc, "bdev_null_delete", json!({"name": "Null0"})).code,
        -19
    );
    assert!(reg.list().is_empty());
}

#[test]
fn bdev_aio_create_and_delete() {
    let (svc, reg) = service();
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let file = dir.join(format!("rpc-aio-{}", std::process::id()));
    std::fs::write(&file, vec![0u8; 1 << 20]).unwrap();
    let f = file.to_str().unwrap();
    let made = svc.call(
        "bdev_aio_create",
        Some(json!({"name": "Aio0", "filename": f, "block_size": 512, "readonly": false, "fallocate": false})),
    );
    assert_eq!(made.unwrap(), json!("Aio0"));
    let b = &bdevs(&svc)[0];
    assert_eq!(b["num_blocks"], 2048);
    assert_eq!(b["driver_specific"]["aio"]["filename"], f);
    assert_eq!(b["driver_specific"]["aio"]["block_size_override"], true);
    let cfg = svc
        .call("framework_get_config", Some(json!({"name": "bdev"})))
        .unwrap();
    assert_eq!(cfg[0]["method"], "bdev_aio_create");
    assert_eq!(cfg[0]["params"]["filename"], f);
    let missing = dir.join("rpc-aio-no-such-file");
    let e = err(
        &svc,
        "bdev_aio_create",
        json!({"name": "A1", "filename": missing.to_str().unwrap()}),
    );
    assert_eq!(e.code, -2, "{e}");
    assert_eq!(
        err(
            &svc,
            "bdev_aio_create",
            json!({"name": "A1", "filename": f, "readonly": true})
        )
        .code,
        -95
    );
    assert_eq!(
        err(&svc, "bdev_aio_create", json!({"name": "A1"})).code,
        INVALID_PARAMS
    );
    assert_eq!(names(&reg), ["Aio0"]);
    assert_eq!(
        svc.call("bdev_aio_delete", Some(json!({"name": "Aio0"})))
            .unwrap(),
        json!(true)
    );
    assert_eq!(
        err(&svc, "bdev_aio_delete", json!({"name": "Aio0"})).code,
        -19
    );
    let _ = std::fs::remove_file(&file);
}

#[test]
fn bdev_get_bdevs_by_name() {
    let (svc, _) = service();
    svc.call(
        "bdev_malloc_create",
        Some(json!({"name": "A", "block_size": 512, "num_blocks": 8})),
    )
    .unwrap();
    let one = svc
        .call("bdev_get_bdevs", Some(json!({"name": "A"})))
        .unwrap();
    assert_eq!(one.as_array().unwrap().len(), 1);
    assert_eq!(one[0]["name"], "A");
    let e = err(&svc, "bdev_get_bdevs", json!({"name": "B"}));
    assert_eq!((e.code, e.message.as_str()), (-19, "No such device"));
    let e = err(&svc, "bdev_get_bdevs", json!({"name": "B", "timeout": 20}));
    assert_eq!(e.code, -19, "still absent after the wait");
    assert_eq!(
        err(&svc, "bdev_get_bdevs", json!({"name": 3})).code,
        INVALID_PARAMS
    );
    // The UUID a bdev shows is stable from one call to the next.
    assert_eq!(bdevs(&svc)[0]["uuid"], one[0]["uuid"]);
}

/// One reactor on core 0, with a bdev I/O channel kept alive on it.
fn reactors() -> ReactorSet {
    launch(LaunchConfig::new(Cores::first(1)), |_| {}).unwrap()
}

thread_local! {
    static KEEP: RefCell<Vec<IoChannel>> = const { RefCell::new(Vec::new()) };
}

#[test]
fn bdev_get_iostat_and_framework_get_reactors_ask_the_cores() {
    let set = reactors();
    let reg = Arc::new(BdevRegistry::new());
    let svc = service_with(&reg, CoreBus::new(set.messenger().clone()));
    svc.call(
        "bdev_malloc_create",
        Some(json!({"name": "M", "block_size": 512, "num_blocks": 64})),
    )
    .unwrap();
    svc.call(
        "bdev_null_create",
        Some(json!({"name": "N", "block_size": 512, "num_blocks": 64})),
    )
    .unwrap();
    // One 4 KiB read on core 0.
    let desc = reg.get("M").unwrap().open(true).unwrap();
    let (tx, rx) = mpsc::channel();
    set.messenger()
        .send_blocking(0, move |r| {
            let ch = desc.channel(r).unwrap();
            let cb: Rc<dyn IoCompletion> = Rc::new(move |io: CompletedIo| {
                let _ = tx.send(io.status().is_ok());
            });
            ch.read(0, 8, SgList::from_buf(DmaBuf::alloc(4096).unwrap()), &cb, 0)
                .unwrap();
            KEEP.with(|k| k.borrow_mut().push(ch));
        })
        .unwrap();
    assert!(rx.recv_timeout(Duration::from_secs(10)).unwrap());

    let all = svc.call("bdev_get_iostat", None).unwrap();
    assert_eq!(all["tick_rate"], 1_000_000_000u64);
    let list = all["bdevs"].as_array().unwrap();
    let m = list.iter().find(|b| b["name"] == "M").unwrap();
    assert_eq!(
        (m["num_read_ops"].clone(), m["bytes_read"].clone()),
        (json!(1), json!(4096))
    );
    let n = list.iter().find(|b| b["name"] == "N").unwrap();
    assert_eq!(n["num_read_ops"], 0);
    let one = svc
        .call(
            "bdev_get_iostat",
            Some(json!({"name": "M", "per_channel": true})),
        )
        .unwrap();
    assert_eq!(one["name"], "M");
    assert_eq!(one["channels"][0]["thread_id"], 0);
    assert_eq!(one["channels"][0]["num_read_ops"], 1);
    let names = svc
        .call("bdev_get_iostat", Some(json!({"names": ["N"]})))
        .unwrap();
    assert_eq!(names["bdevs"].as_array().unwrap().len(), 1);
    assert_eq!(err(&svc, "bdev_get_iostat", json!({"name": "X"})).code, -19);
    assert_eq!(
        err(&svc, "bdev_get_iostat", json!({"per_channel": true})).code,
        -22
    );
    assert_eq!(
        err(&svc, "bdev_get_iostat", json!({"reset_mode": "all"})).code,
        -95
    );

    let r = svc.call("framework_get_reactors", None).unwrap();
    assert_eq!(r["pid"], std::process::id());
    let cores = r["reactors"].as_array().unwrap();
    assert_eq!(cores.len(), 1);
    assert_eq!(cores[0]["lcore"], 0);
    assert!(cores[0]["busy"].as_u64().unwrap() + cores[0]["idle"].as_u64().unwrap() > 0);
    assert_eq!(cores[0]["lw_threads"][0]["cpumask"], "1");
    assert_eq!(
        err(&svc, "framework_get_reactors", json!({"a": 1})).code,
        INVALID_PARAMS
    );

    set.messenger()
        .send_blocking(0, |_| KEEP.with(|k| k.borrow_mut().clear()))
        .unwrap();
    set.stop_all();
    set.join().unwrap();
}

#[test]
fn save_config_then_load_config_rebuilds_the_same_bdevs() {
    let (svc, _) = service();
    svc.call(
        "bdev_malloc_create",
        Some(json!({"name": "M0", "block_size": 4096, "num_blocks": 32, "md_size": 16})),
    )
    .unwrap();
    svc.call("bdev_null_create", Some(json!({"name": "N0", "block_size": 512, "num_blocks": 1024, "latency_us": 5, "queue_depth": 64})))
        .unwrap();
    let saved = svc.call("save_config", None).unwrap();
    assert_eq!(saved["subsystems"][0]["subsystem"], "bdev");
    let before = bdevs(&svc);

    let (fresh, reg) = service();
    assert_eq!(
        fresh.call("load_config", Some(saved.clone())).unwrap(),
        json!(true)
    );
    assert_eq!(bdevs(&fresh), before, "same bdev_get_bdevs, UUIDs included");
    assert_eq!(fresh.call("save_config", None).unwrap(), saved);
    assert_eq!(names(&reg), ["M0", "N0"]);
}

#[test]
fn load_config_is_all_or_nothing() {
    let (svc, reg) = service();
    let unknown = json!({"subsystems": [{"subsystem": "bdev", "config": [
        {"method": "bdev_malloc_create", "params": {"name": "A", "block_size": 512, "num_blocks": 8}},
        {"method": "bdev_nvme_attach_controller", "params": {}},
        {"method": "nvmf_create_transport", "params": {"trtype": "TCP"}}]}]});
    let e = err(&svc, "load_config", unknown);
    assert_eq!(e.code, INVALID_PARAMS);
    let d = e.data.unwrap();
    assert!(
        d.contains("bdev_nvme_attach_controller") && d.contains("nvmf_create_transport"),
        "{d}"
    );
    assert!(reg.list().is_empty(), "nothing was called");

    let failing = json!({"subsystems": [{"subsystem": "bdev", "config": [
        {"method": "bdev_malloc_create", "params": {"name": "A", "block_size": 512, "num_blocks": 8}},
        {"method": "bdev_null_create", "params": {"name": "B", "block_size": 512, "num_blocks": 8}},
        {"method": "bdev_null_create", "params": {"name": "A", "block_size": 512, "num_blocks": 8}}]}]});
    let e = err(&svc, "load_config", failing);
    assert_eq!(e.code, -17);
    assert!(e.data.unwrap().contains("entry 2"));
    assert!(
        reg.list().is_empty(),
        "the calls before the failure were undone"
    );

    assert_eq!(
        err(&svc, "load_config", json!({"subsystems": 3})).code,
        INVALID_PARAMS
    );
    // A subsystem with `"config": null` (as SPDK saves some) is fine.
    let cfg =
        JsonConfig::parse(r#"{"subsystems": [{"subsystem": "accel", "config": null}]}"#).unwrap();
    assert_eq!(cfg.apply(&svc).unwrap(), 0);
}

#[test]
fn batches_and_notifications_as_spdk() {
    let (svc, reg) = service();
    let text = svc
        .handle(json!([
            {"jsonrpc": "2.0", "id": 1, "method": "bdev_malloc_create", "params": {"name": "A", "block_size": 512, "num_blocks": 8}},
            {"jsonrpc": "2.0", "method": "bdev_null_create", "params": {"name": "B", "block_size": 512, "num_blocks": 8}},
            {"jsonrpc": "2.0", "id": "x", "method": "nope"},
            5
        ]))
        .unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let a = v.as_array().unwrap();
    assert_eq!(a.len(), 3, "the notification's result is left out: {text}");
    assert_eq!(
        (a[0]["id"].clone(), a[0]["result"].clone()),
        (json!(1), json!("A"))
    );
    assert_eq!(
        (a[1]["id"].clone(), a[1]["error"]["code"].clone()),
        (json!("x"), json!(METHOD_NOT_FOUND))
    );
    assert_eq!(a[2]["error"]["code"], INVALID_REQUEST);
    assert_eq!(names(&reg), ["A", "B"], "the notification ran");
    let empty: Value = serde_json::from_str(&svc.handle(json!([])).unwrap()).unwrap();
    assert_eq!(empty["error"]["code"], INVALID_REQUEST);
    assert_eq!(svc.handle(json!([{"method": "spdk_get_version"}])), None);
    // A failed notification is answered (id null), as SPDK does.
    let e: Value = serde_json::from_str(&svc.handle(json!({"method": "nope"})).unwrap()).unwrap();
    assert_eq!(
        (e["id"].clone(), e["error"]["code"].clone()),
        (Value::Null, json!(METHOD_NOT_FOUND))
    );
    let e: Value = serde_json::from_str(&svc.handle(json!("text")).unwrap()).unwrap();
    assert_eq!(e["error"]["code"], INVALID_REQUEST);
}

/// A subsystem for the registry's own checks.
struct Probe;

impl Subsystem for Probe {
    fn name(&self) -> &'static str {
        "probe"
    }
    fn depends_on(&self) -> &'static [&'static str] {
        &["bdev"]
    }
    fn methods(self: Arc<Self>) -> Vec<Method> {
        vec![
            Method::new("probe_panic", StateMask::ANY, |_, _| panic!("probe")),
            Method::runtime("probe_ok", |_, _| Ok(json!("ok"))),
        ]
    }
    fn config(&self, _: &RpcService) -> Result<Vec<ConfigEntry>, RpcError> {
        Ok(vec![ConfigEntry::new("probe_ok", json!({}))])
    }
}

#[test]
fn providers_plug_in_and_a_panicking_method_leaves_the_service_up() {
    let mut bare = RpcService::new(CoreBus::none());
    let e = bare.register(Arc::new(Probe)).unwrap_err();
    assert!(e.to_string().contains("depends on `bdev`"), "{e}");
    assert!(
        bare.call("probe_ok", None).is_err(),
        "a refused provider adds nothing"
    );

    let (mut svc, _) = service();
    svc.register(Arc::new(Probe)).unwrap();
    assert!(svc.register(Arc::new(Probe)).is_err(), "twice");
    assert!(svc
        .add_method(Method::runtime("bdev_get_bdevs", |_, _| Ok(Value::Null)))
        .is_err());
    assert_eq!(
        svc.call("framework_get_subsystems", None).unwrap(),
        json!([{"subsystem": "bdev", "depends_on": []}, {"subsystem": "probe", "depends_on": ["bdev"]}])
    );
    let saved = svc.call("save_config", None).unwrap();
    assert_eq!(saved["subsystems"][1]["config"][0]["method"], "probe_ok");
    assert_eq!(err(&svc, "probe_panic", json!({})).code, INTERNAL_ERROR);
    assert_eq!(svc.call("probe_ok", None).unwrap(), json!("ok"));
}

#[test]
fn a_uuid_is_one_bdevs_and_the_null_uuid_means_none() {
    // SPDK registers a bdev's UUID as one of its names: a second bdev with
    // the same UUID is refused (-17) and nothing is made; a null UUID is
    // replaced by a random one.
    let (svc, reg) = service();
    let uuid = "11111111-2222-3333-4444-555555555555";
    let p = |name: &str, uuid: &str| {
        Some(json!({"name": name, "block_size": 512, "num_blocks": 8, "uuid": uuid}))
    };
    assert_eq!(
        svc.call("bdev_malloc_create", p("a", uuid)).unwrap(),
        json!("a")
    );
    let e = svc.call("bdev_null_create", p("b", uuid)).unwrap_err();
    assert_eq!(e.code, -17, "{e}");
    assert!(e.data.as_deref().unwrap_or("").contains(uuid), "{e}");
    let e = svc
        .call("bdev_malloc_create", p("c", &uuid.to_uppercase()))
        .unwrap_err();
    assert_eq!(e.code, -17, "{e}");
    assert_eq!(names(&reg), ["a"]);
    // Once `a` is gone its UUID is free again.
    svc.call("bdev_malloc_delete", Some(json!({"name": "a"})))
        .unwrap();
    assert_eq!(
        svc.call("bdev_null_create", p("b", uuid)).unwrap(),
        json!("b")
    );
    let null = "00000000-0000-0000-0000-000000000000";
    svc.call("bdev_malloc_create", p("z1", null)).unwrap();
    svc.call("bdev_malloc_create", p("z2", null)).unwrap();
    let list = bdevs(&svc);
    let z: Vec<&Value> = list
        .iter()
        .filter(|b| b["name"] == "z1" || b["name"] == "z2")
        .map(|b| &b["uuid"])
        .collect();
    assert_eq!(z.len(), 2);
    assert!(z.iter().all(|u| **u != null), "{z:?}");
    assert_ne!(z[0], z[1]);
}

#[test]
fn a_bdev_is_found_by_its_uuid_which_is_its_alias() {
    // SPDK registers a bdev's UUID as an alias: `bdev_get_bdevs` lists it
    // under `aliases` and finds the bdev by it.
    let (svc, _) = service();
    let uuid = "913fc008-79a7-447f-b2c4-c73543638c31";
    svc.call(
        "bdev_malloc_create",
        Some(json!({"name": "M", "block_size": 512, "num_blocks": 8, "uuid": uuid})),
    )
    .unwrap();
    svc.call(
        "bdev_null_create",
        Some(json!({"name": "N", "block_size": 512, "num_blocks": 8})),
    )
    .unwrap();
    for b in bdevs(&svc) {
        assert_eq!(b["aliases"], json!([b["uuid"]]), "{b}");
    }
    let got = svc
        .call("bdev_get_bdevs", Some(json!({"name": uuid.to_uppercase()})))
        .unwrap();
    assert_eq!(got[0]["name"], "M");
    let n_uuid = bdevs(&svc)[1]["uuid"].as_str().unwrap().to_owned();
    let got = svc
        .call("bdev_get_bdevs", Some(json!({"name": n_uuid})))
        .unwrap();
    assert_eq!(got[0]["name"], "N");
    let e = err(
        &svc,
        "bdev_get_bdevs",
        json!({"name": "00000000-0000-0000-0000-000000000001"}),
    );
    assert_eq!(e.code, -19);
}
