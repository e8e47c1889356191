//! `pollux-tgt` serving iSCSI over iSER, built up by `iscsi_*` calls: a
//! file with only `[iscsi.options]` and a bdev, then a portal group, an
//! initiator group and a target node by calls; our initiator logs in and
//! reads the LUN, `iscsi_get_connections` lists its session, the LUN's
//! bdev is not deleted while the node exists; deleting a node with a live
//! session closes that session and no other, and gives back what it held;
//! deleting a portal group no node maps closes the discovery session on it.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

mod common;

use common::iser::{connect, drive, logout, one, read_capacity, ISCSI_OPTIONS};
use common::{tmp, Tgt, WAIT};

use std::time::{Duration, Instant};

use pollux_iser::initiator::scsi::rw16_cdb;
use pollux_iser::initiator::{DataDir, IserInitiator, PiPolicy, SessionState};
use pollux_reactor::mem::{DmaBuf, SgList};
use pollux_rpc::RpcClient;
use pollux_verbs::soft::Soft;
use rustix::process::Signal;
use serde_json::{json, Value};

const INI: &str = "iqn.2016-06.io.pollux:rpc-iscsi-host";
const IQN: &str = "iqn.2016-06.io.spdk:disk0";

fn call(c: &mut RpcClient, method: &str, params: Value) -> Value {
    c.call(method, Some(params))
        .unwrap_or_else(|e| panic!("{method}: {e}"))
}

/// A soft-provider target with an empty iSCSI target and a 2 MiB malloc
/// bdev of each name, and a client on its socket.
fn start(name: &str, bdevs: &[&str]) -> (Tgt, RpcClient) {
    let cfg = tmp(&format!("{name}.toml"));
    let mut text = String::from("cores = \"0\"\nprovider = \"soft\"\n");
    for b in bdevs {
        text.push_str(&format!(
            "\n[[bdev]]\nspec = \"malloc:name={b},size=2M,block=512\"\n"
        ));
    }
    text.push_str(&format!("\n{ISCSI_OPTIONS}"));
    std::fs::write(&cfg, text).unwrap();
    let sock = tmp(&format!("{name}.sock"));
    let mut tgt = Tgt::start(&cfg, &["-r", sock.to_str().unwrap()]);
    tgt.wait_line("pollux-tgt: ready");
    let c = RpcClient::connect(&sock, WAIT).unwrap();
    (tgt, c)
}

#[test]
fn iscsi_calls_build_a_target_an_initiator_uses() {
    let addr = format!("@pollux-rpc-iscsi-{}", std::process::id());
    let (mut tgt, mut c) = start("rpc-iscsi", &["Plain0"]);
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
    let mut ini = log_in(&addr, INI, IQN, 1);
    let g = read_capacity(&mut ini, 0);
    assert_eq!((g.block_size, g.blocks), (512, 4096));

    let conns = call(&mut c, "iscsi_get_connections", json!({}));
    assert_eq!(conns.as_array().unwrap().len(), 1, "{conns}");
    assert_eq!(conns[0]["initiator_name"], INI);
    assert_eq!(conns[0]["target_node_name"], IQN);
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

/// Writes a pattern to 8 blocks at `lba` of LUN 0 and reads it back;
/// `Err` when the session cannot do it.
fn verified_io(ini: &mut IserInitiator<Soft>, lba: u64, seed: u8) -> Result<(), String> {
    let mut w = DmaBuf::alloc(4096).unwrap();
    for (i, x) in w.as_mut_slice().iter_mut().enumerate() {
        *x = (i as u8).wrapping_mul(31).wrapping_add(seed);
    }
    let want = w.as_slice().to_vec();
    let cdb = rw16_cdb(true, lba, 8, 0);
    ini.submit(0, &cdb, DataDir::Write, Some(SgList::from_buf(w)), 4096, 1)
        .map_err(|e| format!("write: {e:?}"))?;
    let r = one(ini);
    if !r.is_good() {
        return Err(format!("write: {:?}", r.sense));
    }
    let cdb = rw16_cdb(false, lba, 8, 0);
    let b = SgList::from_buf(DmaBuf::alloc(4096).unwrap());
    ini.submit(0, &cdb, DataDir::Read, Some(b), 4096, 2)
        .map_err(|e| format!("read: {e:?}"))?;
    let r = one(ini);
    if !r.is_good() {
        return Err(format!("read: {:?}", r.sense));
    }
    let have = r.bufs.unwrap().pop().unwrap();
    if have.as_slice() != &want[..] {
        return Err("read back differs".into());
    }
    Ok(())
}

/// The target lists one session, to `node`.
fn only_session_left(c: &mut RpcClient, node: &str) {
    let conns = call(c, "iscsi_get_connections", json!({}));
    assert_eq!(conns.as_array().unwrap().len(), 1, "{conns}");
    assert_eq!(conns[0]["target_node_name"], node);
}

/// Poll `ini` until the target has closed its session (bounded).
fn wait_closed(ini: &mut IserInitiator<Soft>) {
    let deadline = Instant::now() + WAIT;
    while !matches!(ini.state(), SessionState::Failed(_) | SessionState::Closed) {
        assert!(Instant::now() < deadline, "the session stayed open");
        ini.poll(&mut |_| {});
    }
}

/// Descriptors of process `pid`.
fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// A session of `initiator` to `target`, retried while the portal opens
/// (on its poll group, shortly after the call).
fn log_in(addr: &str, initiator: &str, target: &str, isid: u8) -> IserInitiator<Soft> {
    let deadline = Instant::now() + WAIT;
    loop {
        match std::panic::catch_unwind(|| connect(addr, initiator, target, PiPolicy::Off, isid)) {
            Ok(i) => return i,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => std::panic::resume_unwind(e),
        }
    }
}

#[test]
fn deleting_a_node_closes_its_sessions_and_no_others() {
    const GONE: &str = "iqn.2016-06.io.spdk:gone";
    const KEEP: &str = "iqn.2016-06.io.spdk:keep";
    let addr = format!("@pollux-rpc-iscsi-del-{}", std::process::id());
    let (mut tgt, mut c) = start("rpc-iscsi-del", &["Gone0", "Keep0"]);
    let pid = tgt.child.id();
    call(
        &mut c,
        "iscsi_create_portal_group",
        json!({"tag": 1, "portals": [{"host": addr}]}),
    );
    call(
        &mut c,
        "iscsi_create_initiator_group",
        json!({"tag": 2, "initiators": ["ANY"], "netmasks": ["ANY"]}),
    );
    for (name, bdev) in [("gone", "Gone0"), ("keep", "Keep0")] {
        call(
            &mut c,
            "iscsi_create_target_node",
            json!({"name": name, "pg_ig_maps": [{"pg_tag": 1, "ig_tag": 2}],
                   "luns": [{"bdev_name": bdev, "lun_id": 0}], "queue_depth": 16}),
        );
    }
    let mut keep = log_in(&addr, INI, KEEP, 1);
    verified_io(&mut keep, 0, 1).unwrap();
    let fds_before = fds(pid);
    let mut gone = log_in(&addr, INI, GONE, 2);
    verified_io(&mut gone, 0, 2).unwrap();
    let conns = call(&mut c, "iscsi_get_connections", json!({}));
    assert_eq!(conns.as_array().unwrap().len(), 2, "{conns}");

    call(&mut c, "iscsi_delete_target_node", json!({"name": GONE}));
    // The answer came once its session was gone on the target.
    only_session_left(&mut c, KEEP);
    wait_closed(&mut gone);
    drop(gone);
    // No way back to the deleted node; nothing left of the session.
    let mut o = pollux_iser::initiator::InitiatorOptions::new(&addr, INI, GONE);
    o.isid[5] = 3;
    let mut again = IserInitiator::<Soft>::connect(o).unwrap();
    let deadline = Instant::now() + WAIT;
    while !matches!(
        again.state(),
        SessionState::Failed(_) | SessionState::Closed
    ) {
        assert!(!again.is_ready(), "logged in to a deleted node");
        assert!(
            Instant::now() < deadline,
            "the login was neither refused nor accepted"
        );
        again.poll(&mut |_| {});
    }
    drop(again);
    let deadline = Instant::now() + WAIT;
    while fds(pid) != fds_before {
        assert!(
            Instant::now() < deadline,
            "target descriptors {} (before the session: {fds_before})",
            fds(pid)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        call(&mut c, "iscsi_get_connections", json!({}))
            .as_array()
            .unwrap()
            .len(),
        1
    );
    // The other session never noticed.
    for round in 0..20 {
        verified_io(&mut keep, 8 * round, round as u8).unwrap();
    }
    // Its bdev is free; the other node's is not.
    call(&mut c, "bdev_malloc_delete", json!({"name": "Gone0"}));
    let e = c
        .call("bdev_malloc_delete", Some(json!({"name": "Keep0"})))
        .unwrap_err();
    assert!(e.to_string().contains("-16"), "{e}");
    verified_io(&mut keep, 0, 99).unwrap();

    // A portal group no node maps goes with the discovery session on it.
    let disc_addr = format!("{addr}-disc");
    call(
        &mut c,
        "iscsi_create_portal_group",
        json!({"tag": 5, "portals": [{"host": disc_addr}]}),
    );
    let deadline = Instant::now() + WAIT;
    let mut disc = loop {
        let o = pollux_iser::initiator::InitiatorOptions::discovery(&disc_addr, INI);
        let mut d = IserInitiator::<Soft>::connect(o).unwrap();
        while !d.is_ready() && !matches!(d.state(), SessionState::Failed(_)) {
            assert!(Instant::now() < deadline, "no discovery session");
            d.poll(&mut |_| {});
        }
        if d.is_ready() {
            break d;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(
        call(&mut c, "iscsi_get_connections", json!({}))
            .as_array()
            .unwrap()
            .len(),
        2
    );
    call(&mut c, "iscsi_delete_portal_group", json!({"tag": 5}));
    only_session_left(&mut c, KEEP);
    wait_closed(&mut disc);
    drop(disc);
    verified_io(&mut keep, 0, 100).unwrap();
    drive(&mut keep, |i, _| i.is_ready());
    logout(keep);
    drop(c);
    tgt.signal(Signal::TERM);
    assert!(tgt.wait_exit().success());
}
