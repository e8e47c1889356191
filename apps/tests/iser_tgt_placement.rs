//! `pollux-tgt` serving iSCSI over iSER on two cores (soft provider): the
//! sessions of our initiator are spread over both cores' iSER poll groups
//! (the stats file's `iscsi_connections_per_core`), each moves verified
//! data, and after logout both groups are empty again. With
//! `pin_connections_to_listener_core = true` they all stay on the
//! listener's core.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::iser::{connect, logout, one, read_capacity, ISCSI_OPTIONS};
use common::{tmp, Tgt, WAIT};
use pollux_iser::initiator::{IserInitiator, PiPolicy};
use pollux_reactor::mem::{DmaBuf, SgList};
use pollux_verbs::soft::Soft;
use rustix::process::Signal;

const IQN: &str = "iqn.2016-06.io.pollux:iser-placement";
const INI: &str = "iqn.2016-06.io.pollux:iser-placement-host";

fn config(addr: &str, pin: bool) -> String {
    format!(
        r#"cores = "0-1"
provider = "soft"

[[bdev]]
spec = "malloc:name=Plain0,size=4M,block=512"

[[iscsi.portal_group]]
tag = 1
listen = ["{addr}"]

[[iscsi.target]]
name = "{IQN}"
luns = [{{ lun = 0, bdev = "Plain0" }}]

{ISCSI_OPTIONS}pin_connections_to_listener_core = {pin}
"#
    )
}

fn login(addr: &str, isid: u8) -> IserInitiator<Soft> {
    let mut ini = connect(addr, INI, IQN, PiPolicy::Off, isid);
    let g = read_capacity(&mut ini, 0);
    ini.set_geometry(0, g);
    ini
}

fn write_read_compare(ini: &mut IserInitiator<Soft>, lba: u64, len: usize, seed: u8) {
    let data: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(17) ^ seed)
        .collect();
    let mut b = DmaBuf::alloc(len).unwrap();
    b.as_mut_slice().copy_from_slice(&data);
    let blocks = (len / 512) as u32;
    ini.write(0, lba, blocks, SgList::from_buf(b), 1).unwrap();
    let w = one(ini);
    assert!(w.is_good(), "write: {:?}", w.sense);
    ini.read(
        0,
        lba,
        blocks,
        SgList::from_buf(DmaBuf::alloc(len).unwrap()),
        2,
    )
    .unwrap();
    let r = one(ini);
    assert!(r.is_good(), "read: {:?}", r.sense);
    assert!(r.bufs.unwrap().pop().unwrap().as_slice() == &data[..]);
}

/// Wait until the stats file's `iscsi_connections_per_core` is one of
/// `want`.
fn wait_per_core(path: &PathBuf, want: &[&[u64]]) {
    let deadline = Instant::now() + WAIT;
    let mut last = serde_json::Value::Null;
    while Instant::now() < deadline {
        if let Ok(text) = std::fs::read_to_string(path) {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
                let got = &v["iscsi_connections_per_core"];
                if want.iter().any(|w| *got == serde_json::json!(w)) {
                    assert_eq!(v["iscsi_nop_timeouts"], 0, "{v}");
                    return;
                }
                last = v;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("iscsi_connections_per_core never became {want:?}; last stats: {last}");
}

fn serve_two_sessions(pin: bool, want: &[&[u64]]) {
    let addr = format!("@pollux-iser-placement-{}-{pin}", std::process::id());
    let cfg = tmp(&format!("iser-placement-{pin}.toml"));
    std::fs::write(&cfg, config(&addr, pin)).unwrap();
    let stats = tmp(&format!("iser-placement-{pin}-stats.json"));
    let _ = std::fs::remove_file(&stats);
    let mut tgt = Tgt::start(&cfg, &["--stats-file", stats.to_str().unwrap()]);
    tgt.wait_line("pollux-tgt: ready");
    wait_per_core(&stats, &[&[0, 0]]);

    let mut a = login(&addr, 1);
    let mut b = login(&addr, 2);
    wait_per_core(&stats, want);
    write_read_compare(&mut a, 0, 65536, 1);
    write_read_compare(&mut b, 256, 4096, 2);
    write_read_compare(&mut a, 512, 512, 3);
    logout(a);
    logout(b);
    wait_per_core(&stats, &[&[0, 0]]);

    tgt.signal(Signal::TERM);
    assert!(tgt.wait_exit().success());
}

#[test]
fn tgt_spreads_iser_sessions_over_its_cores() {
    serve_two_sessions(false, &[&[1, 1]]);
}

#[test]
fn tgt_keeps_pinned_iser_sessions_on_the_listeners_core() {
    // The listener belongs to whichever core's group opened it first.
    serve_two_sessions(true, &[&[2, 0], &[0, 2]]);
}
