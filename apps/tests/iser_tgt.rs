//! `pollux-tgt`'s `[iscsi]` section and `pollux-perf`'s iSER path: the
//! configuration errors name the line and the field; the binary serves a
//! PI LUN and a plain one over iSER (soft provider) to our initiator
//! (login, READ CAPACITY(16), write + read back + compare, with and
//! without PI), to `pollux-perf --verify --pi both`, and exits 0 on
//! SIGTERM after disconnecting the initiators.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

mod common;

use common::iser::{connect, drive, logout, one, read_capacity, ISCSI_OPTIONS};
use common::{tmp, Tgt, WAIT};

use std::process::Command;
use std::time::{Duration, Instant};

use pollux_apps::tgt::TgtPlan;
use pollux_iser::initiator::scsi::read_capacity16_cdb;
use pollux_iser::initiator::{DataDir, InitiatorOptions, IserInitiator, PiPolicy};
use pollux_reactor::mem::{DmaBuf, SgList};
use pollux_verbs::soft::Soft;
use rustix::process::Signal;

const IQN: &str = "iqn.2016-06.io.pollux:iser-tgt-test";
const INI: &str = "iqn.2016-06.io.pollux:iser-tgt-host";
fn config(addr: &str) -> String {
    format!(
        r#"cores = "0"
provider = "soft"

[[bdev]]
spec = "malloc:name=Pi0,size=2M,block=512,md=8,md_interleave=true,pi=1"

[[bdev]]
spec = "malloc:name=Plain0,size=2M,block=512"

[[iscsi.portal_group]]
tag = 1
listen = ["{addr}"]

[[iscsi.target]]
name = "{IQN}"
luns = [{{ lun = 0, bdev = "Pi0" }}, {{ lun = 1, bdev = "Plain0" }}]
allowed_initiators = []
portal_groups = [1]

{ISCSI_OPTIONS}"#
    )
}

/// `text` with `from` replaced by `to` must fail naming `want` (every
/// fragment).
fn bad(from: &str, to: &str, want: &[&str]) {
    let base = config("@x");
    assert!(base.contains(from), "{from}");
    let text = base.replacen(from, to, 1);
    let e = TgtPlan::parse(&text).unwrap_err().to_string();
    for w in want {
        assert!(e.contains(w), "{e:?} lacks {w:?}");
    }
}

#[test]
fn iscsi_config_errors_name_the_line_and_field() {
    let plan = TgtPlan::parse(&config("@x")).unwrap();
    let i = plan.iscsi.as_ref().unwrap();
    assert_eq!(i.portal_groups[0].group.addrs, vec!["@x".to_string()]);
    assert_eq!(i.nodes[0].luns.len(), 2);
    assert_eq!(i.target.limits.queue_depth, 16);
    assert_eq!(i.target.max_io_bytes, 65536);
    assert!(plan.subsystems.is_empty() && plan.listeners.is_empty());

    bad(
        "bdev = \"Plain0\"",
        "bdev = \"Plian0\"",
        &[
            "line 16",
            "iscsi.target[0].luns[1].bdev",
            "no bdev named 'Plian0'",
            "Pi0, Plain0",
        ],
    );
    bad(
        "{ lun = 1,",
        "{ lun = 0,",
        &["line 16", "iscsi.target[0].luns[1].lun", "duplicate LUN 0"],
    );
    bad("lun = 1,", "lun = 20000,", &["luns[1].lun", "0..=16383"]);
    bad(
        "portal_groups = [1]",
        "portal_groups = [2]",
        &[
            "line 18",
            "iscsi.target[0].portal_groups[0]",
            "no portal group with tag 2",
        ],
    );
    bad(
        &format!("name = \"{IQN}\""),
        "name = \"disk0\"",
        &["line 15", "iscsi.target[0].name", "not an iSCSI name"],
    );
    bad(
        "tag = 1",
        "tag = 0",
        &["line 11", "iscsi.portal_group[0].tag"],
    );
    bad(
        "listen = [\"@x\"]",
        "listen = [\"10.0.0.1:3260\"]",
        &[
            "line 12",
            "iscsi.portal_group[0].listen[0]",
            "soft provider",
        ],
    );
    bad(
        "queue_depth = 16",
        "queue_depth = 0",
        &["line 21", "iscsi.options.queue_depth"],
    );
    bad(
        "max_io_bytes = \"64k\"",
        "max_io_bytes = 1000",
        &["iscsi.options.max_io_bytes"],
    );
    bad(
        "queue_depth = 16",
        "recv_dsl = 65536",
        &["iscsi.options.recv_dsl", "512..=8192"],
    );
    bad(
        "queue_depth = 16",
        "first_burst = \"2M\"",
        &["iscsi.options.first_burst", "max_burst"],
    );
    bad("queue_depth = 16", "bogus = 1", &["bogus"]);
    bad(
        "queue_depth = 16",
        "nop_in_interval = 61",
        &["line 21", "iscsi.options.nop_in_interval", "0..=60"],
    );
    bad(
        "queue_depth = 16",
        "nop_timeout = 0",
        &["line 21", "iscsi.options.nop_timeout", "1..=3600"],
    );
    assert_eq!(i.iser.nop_in_interval, Duration::from_secs(30));
    assert_eq!(i.iser.nop_timeout, Duration::from_secs(60));
    assert_eq!(i.iser.logout_grace, Duration::from_secs(2));
    bad(
        "queue_depth = 16",
        "logout_grace_ms = 60001",
        &["line 21", "iscsi.options.logout_grace_ms", "0..=60000"],
    );
    let p = TgtPlan::parse(&config("@x").replace(
        "queue_depth = 16",
        "queue_depth = 16\nnop_in_interval = 5\nnop_timeout = 7\nlogout_grace_ms = 250",
    ))
    .unwrap();
    let o = &p.iscsi.as_ref().unwrap().iser;
    assert_eq!(
        (o.nop_in_interval, o.nop_timeout, o.logout_grace),
        (
            Duration::from_secs(5),
            Duration::from_secs(7),
            Duration::from_millis(250)
        )
    );
    bad(
        "allowed_initiators = []",
        "allowed_initiators = [\"bob\"]",
        &["allowed_initiators[0]"],
    );
    // The shipped example: a PI LU and a plain one, iSCSI only.
    let ex = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/tgt-iser.toml"))
        .unwrap();
    let p = TgtPlan::parse(&ex).unwrap();
    let i = p.iscsi.as_ref().unwrap();
    assert_eq!(
        i.portal_groups[0].group.addrs,
        vec!["@pollux-iser".to_string()]
    );
    assert_eq!(i.nodes[0].name, "iqn.2016-06.io.pollux:disk0");
    assert_eq!(i.nodes[0].luns.len(), 2);
    // The ibverbs example (the VM interop's shape): parses with the
    // feature, and without it names the provider line.
    let ib = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/tgt-iser-ibverbs.toml"
    ))
    .unwrap();
    let parsed = TgtPlan::parse(&ib);
    if cfg!(feature = "ibverbs") {
        let p = parsed.unwrap();
        let i = p.iscsi.as_ref().unwrap();
        assert_eq!(i.nodes[0].luns.len(), 2);
        assert_eq!(i.target.limits.queue_depth, 64);
    } else {
        let e = parsed.unwrap_err().to_string();
        assert!(e.contains("provider"), "{e}");
    }
    // Nothing to serve yet is fine: the target is built up over JSON-RPC.
    let p = TgtPlan::parse("cores = \"0\"\n").unwrap();
    assert!(p.subsystems.is_empty() && p.listeners.is_empty() && p.iscsi.is_none());
    // A section without targets.
    let e = TgtPlan::parse("[[iscsi.portal_group]]\ntag = 1\nlisten = [\"@y\"]\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 1") && e.contains("iscsi.target"), "{e}");
}

fn login(addr: &str, pi: PiPolicy, isid: u8) -> IserInitiator<Soft> {
    let mut ini = connect(addr, INI, IQN, pi, isid);
    for lun in [0u16, 1] {
        let g = read_capacity(&mut ini, lun);
        assert_eq!((g.block_size, g.blocks), (512, 4096));
        assert_eq!(g.prot_en, lun == 0);
        ini.set_geometry(lun, g);
    }
    ini
}

fn write_read_compare(ini: &mut IserInitiator<Soft>, lun: u16, lba: u64, len: usize, seed: u8) {
    let data: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(13) ^ seed)
        .collect();
    let mut b = DmaBuf::alloc(len).unwrap();
    b.as_mut_slice().copy_from_slice(&data);
    let blocks = (len / 512) as u32;
    ini.write(lun, lba, blocks, SgList::from_buf(b), 1).unwrap();
    let w = one(ini);
    assert!(
        w.is_good(),
        "write lun {lun}: {:?} {:?}",
        w.sense,
        w.pi_error
    );
    let mut b = DmaBuf::alloc(len).unwrap();
    b.as_mut_slice().fill(0xA5);
    ini.read(lun, lba, blocks, SgList::from_buf(b), 2).unwrap();
    let r = one(ini);
    assert!(
        r.is_good(),
        "read lun {lun}: {:?} {:?}",
        r.sense,
        r.pi_error
    );
    assert_eq!(
        r.bufs.unwrap().pop().unwrap().as_slice(),
        &data[..],
        "lun {lun} data"
    );
}

#[test]
fn tgt_serves_iser_to_our_initiator_and_perf_then_stops_on_sigterm() {
    let addr = format!("@pollux-iser-tgt-test-{}", std::process::id());
    let cfg = tmp("iser-tgt.toml");
    std::fs::write(&cfg, config(&addr)).unwrap();
    let mut tgt = Tgt::start(&cfg, &[]);
    tgt.wait_line(&format!("iscsi portal group 1: {addr}"));
    tgt.wait_line("lun 0: bdev Pi0");
    tgt.wait_line("initiator: -r 'trtype:iser");
    tgt.wait_line("pollux-tgt: ready");

    // Our initiator: plain and PI LUNs, PI off (the target generates and
    // strips) and both (the initiator generates and verifies).
    let mut ini = login(&addr, PiPolicy::Off, 1);
    write_read_compare(&mut ini, 1, 0, 4096, 1);
    write_read_compare(&mut ini, 0, 8, 65536, 2);
    logout(ini);
    let mut ini = login(&addr, PiPolicy::Both, 2);
    write_read_compare(&mut ini, 0, 512, 8192, 3);
    write_read_compare(&mut ini, 0, 8, 512, 4);

    // pollux-perf --verify with PI while a session is still open, on
    // another core than the target's when there is one.
    let two = std::thread::available_parallelism().map_or(1, |n| n.get()) > 1;
    let perf_core = if two { "1" } else { "0" };
    // PI inserted by the initiator, and PI in host memory (DIX: the job
    // generates the tuples before each write and verifies them after each
    // read).
    for pi in ["both", "dix"] {
        let v = perf_json(&[
            "-r",
            &format!("trtype:iser traddr:{addr} target:{IQN} lun:0"),
            "--pi",
            pi,
            "-q",
            "8",
            "-o",
            "4096",
            "-w",
            "write",
            "--verify",
            "-t",
            "0.5",
            "--cores",
            perf_core,
        ]);
        assert!(v["ios"].as_u64().unwrap() > 0, "{v}");
        assert_eq!(
            (v["errors"].as_u64(), v["miscompares"].as_u64()),
            (Some(0), Some(0))
        );
        assert!(v["cores"][0]["busy_pct"].is_number() && v["lat_p99_us"].is_number());
    }

    // SIGTERM with our session open: disconnected, clean exit.
    tgt.signal(Signal::TERM);
    tgt.wait_line("shutting down iSCSI: disconnecting 1 connection(s)");
    tgt.wait_line("iSCSI stopped");
    let deadline = Instant::now() + WAIT;
    while ini.is_ready() {
        assert!(
            Instant::now() < deadline,
            "the initiator did not see the disconnect"
        );
        ini.poll(&mut |_| {});
        std::thread::yield_now();
    }
    let status = tgt.wait_exit();
    assert!(status.success(), "exit status {status:?}");
    drop(ini);
    let _ = std::fs::remove_file(cfg);
}

/// `pollux-perf ARGS --json`, which must succeed: its JSON report.
fn perf_json(args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_pollux-perf"))
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "pollux-perf {args:?}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap()
}

/// `pollux-tgt` and `pollux-perf` on reactors that sleep when idle
/// (`--idle adaptive:0`): the target's iSER poll group and the perf job
/// hold their reactors awake, since nothing the soft provider does wakes a
/// sleeping one (before they did, I/O moved only when a timer fired).
#[test]
fn iser_on_sleeping_reactors() {
    let addr = format!("@pollux-iser-tgt-adaptive-{}", std::process::id());
    let cfg = tmp("iser-tgt-adaptive.toml");
    std::fs::write(&cfg, config(&addr)).unwrap();
    let stats = tmp("iser-tgt-adaptive-stats.json");
    let _ = std::fs::remove_file(&stats);
    let mut tgt = Tgt::start(
        &cfg,
        &[
            "--idle",
            "adaptive:0",
            "--stats-file",
            stats.to_str().unwrap(),
        ],
    );
    tgt.wait_line("pollux-tgt: ready");
    let two = std::thread::available_parallelism().map_or(1, |n| n.get()) > 1;
    let v = perf_json(&[
        "-r",
        &format!("trtype:iser traddr:{addr} target:{IQN} lun:1"),
        "--idle",
        "adaptive:0",
        "-q",
        "8",
        "-o",
        "4096",
        "-w",
        "randrw",
        "--verify",
        "-t",
        "0.5",
        "--cores",
        if two { "1" } else { "0" },
    ]);
    assert_eq!(
        (v["errors"].as_u64(), v["miscompares"].as_u64()),
        (Some(0), Some(0)),
        "{v}"
    );
    // Tens of thousands when the reactors poll (about 2,000 with the
    // test's other processes busy on both cores); about ten when timers
    // drive the I/O (the 50 ms admin tick).
    assert!(v["ios"].as_u64().unwrap() >= 500, "{v}");

    // Our initiator on a reactor holds it awake while it waits for the
    // target (connect and login, a task), and only then.
    let cluster = pollux_reactor::TestCluster::new(1);
    cluster.on(0, |r| {
        let mut o = InitiatorOptions::new(&addr, INI, IQN);
        o.nop_interval = Duration::ZERO;
        let mut ini = IserInitiator::<Soft>::connect(o).unwrap();
        assert!(r.is_held_awake(), "connecting");
        drive(&mut ini, |i, _| i.is_ready());
        assert!(!r.is_held_awake(), "logged in, idle");
        let b = SgList::from_buf(DmaBuf::alloc(32).unwrap());
        ini.submit(1, &read_capacity16_cdb(), DataDir::Read, Some(b), 32, 9)
            .unwrap();
        assert!(r.is_held_awake(), "a task outstanding");
        assert!(one(&mut ini).is_good());
        assert!(!r.is_held_awake(), "the task delivered");

        // Connected and idle, the target's reactor sleeps (its poll group
        // armed the CQ), woken by its 100 ms tick: its sleep count (the
        // stats file is rewritten each second) keeps growing.
        let sleeps = || {
            let v: serde_json::Value = std::fs::read_to_string(&stats)
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or_default();
            v["sleeps"][0].as_u64().unwrap_or(0)
        };
        std::thread::sleep(Duration::from_millis(1200));
        let s1 = sleeps();
        std::thread::sleep(Duration::from_millis(1200));
        let s2 = sleeps();
        assert!(
            s2 >= s1 + 4,
            "sleeps {s1} -> {s2}: the connection keeps it polling"
        );
        // A task after an idle gap wakes it through the CQ, in well under a tick.
        let mut lat: Vec<Duration> = (0..5)
            .map(|i| {
                std::thread::sleep(Duration::from_millis(30));
                let start = Instant::now();
                let b = SgList::from_buf(DmaBuf::alloc(32).unwrap());
                ini.submit(1, &read_capacity16_cdb(), DataDir::Read, Some(b), 32, i)
                    .unwrap();
                assert!(one(&mut ini).is_good());
                start.elapsed()
            })
            .collect();
        lat.sort();
        assert!(
            lat[2] < Duration::from_millis(20),
            "median task after an idle gap {:?} ({lat:?}): woken by the tick, not the CQ",
            lat[2]
        );
        logout(ini);
        assert!(!r.is_held_awake(), "logged out");
    });
    tgt.signal(Signal::TERM);
    assert!(tgt.wait_exit().success());
    let _ = std::fs::remove_file(cfg);
    let _ = std::fs::remove_file(stats);
}

#[test]
fn perf_iser_usage_errors() {
    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_pollux-perf"))
            .args(extra)
            .output()
            .unwrap()
    };
    let o = run(&[
        "-r",
        "trtype:iser traddr:@nowhere target:iqn.2016-06.io.pollux:x",
        "--pi",
        "sometimes",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--pi"));
    let o = run(&["-r", "trtype:iser traddr:@nowhere"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("target"));
    let o = run(&[
        "-r",
        "trtype:iser traddr:@nowhere target:iqn.x",
        "--sweep",
        "--sweep-pi",
        "off,maybe",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--sweep-pi"));
}
