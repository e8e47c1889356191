//! `pollux-tgt` serving iSCSI over iSER, built up by `iscsi_*` calls: a
//! file with only `[iscsi.options]` and a bdev, then a portal group, an
//! initiator group and a target node by calls; our initiator logs in and
//! reads the LUN, `iscsi_get_connections` lists its session, the node is
//! not deleted while the session lives, nor the LUN's bdev while the node
//! exists.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

mod common;

use common::iser::{connect, logout, read_capacity, ISCSI_OPTIONS};
use common::{tmp, Tgt, WAIT};

use std::time::{Duration, Instant};

use pollux_iser::initiator::PiPolicy;
use pollux_rpc::RpcClient;
use rustix::process::Signal;
use serde_json::{json, Value};

const INI: &str = "iqn.2016-06.io.pollux:rpc-iscsi-host";
const IQN: &str = "iqn.2016-06.io.spdk:disk0";

fn call(c: &mut RpcClient, method: &str, params: Value) -> Value {
    c.call(method, Some(params))
        .unwrap_or_else(|e| panic!("{method}: {e}"))
}

#[test]
fn iscsi_calls_build_a_target_an_initiator_uses() {
    let addr = format!("@pollux-rpc-iscsi-{}", std::process::id());
    let cfg = tmp("rpc-iscsi.toml");
    std::fs::write(
        &cfg,
        format!(
            "cores = \"0\"\nprovider = \"soft\"\n\n[[bdev]]\nspec = \"malloc:name=Plain0,size=2M,block=512\"\n\n{ISCSI_OPTIONS}"
        ),
    )
    .unwrap();
    let sock = tmp("rpc-iscsi.sock");
    let mut tgt = Tgt::start(&cfg, &["-r", sock.to_str().unwrap()]);
    tgt.wait_line("pollux-tgt: ready");
    let mut c = RpcClient::connect(&sock, WAIT).unwrap();
    call(
        &mut c,
        "iscsi_create_portal_group",
        json!({"tag": 1, "portals": [{"host": addr}]}),
    );
    call(
        &mut c,
        "iscsi_create_initiator_group",
        json!({"tag": 2, "initiators": [INI], "netmasks": ["ANY"]}),
    );
    call(
        &mut c,
        "iscsi_create_target_node",
        json!({"name": "disk0", "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 2}],
               "luns": [{"bdev_name": "Plain0", "lun_id": 0}], "queue_depth": 16}),
    );
    // The portal opens on its poll group shortly after the call.
    let deadline = Instant::now() + WAIT;
    let mut ini = loop {
        match std::panic::catch_unwind(|| connect(&addr, INI, IQN, PiPolicy::Off, 1)) {
            Ok(i) => break i,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => std::panic::resume_unwind(e),
        }
    };
    let g = read_capacity(&mut ini, 0);
    assert_eq!((g.block_size, g.blocks), (512, 4096));

    let conns = call(&mut c, "iscsi_get_connections", json!({}));
    assert_eq!(conns.as_array().unwrap().len(), 1, "{conns}");
    assert_eq!(conns[0]["initiator_name"], INI);
    assert_eq!(conns[0]["target_node_name"], IQN);
    let e = c
        .call("iscsi_delete_target_node", Some(json!({"name": IQN})))
        .unwrap_err();
    assert!(e.to_string().contains("-16"), "{e}");
    let e = c
        .call("bdev_malloc_delete", Some(json!({"name": "Plain0"})))
        .unwrap_err();
    assert!(e.to_string().contains("-16"), "{e}");
    logout(ini);
    let deadline = Instant::now() + WAIT;
    while !call(&mut c, "iscsi_get_connections", json!({}))
        .as_array()
        .unwrap()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "the session stayed listed");
        std::thread::sleep(Duration::from_millis(10));
    }
    call(&mut c, "iscsi_delete_target_node", json!({"name": IQN}));
    assert_eq!(call(&mut c, "iscsi_get_target_nodes", json!({})), json!([]));
    call(&mut c, "bdev_malloc_delete", json!({"name": "Plain0"}));
    drop(c);
    tgt.signal(Signal::TERM);
    assert!(tgt.wait_exit().success());
}
