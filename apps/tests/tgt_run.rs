//! The `pollux-tgt` binary end to end over the software RDMA provider: it
//! prints what it serves, writes its stats file, serves a host (Connect,
//! Identify, a write and a read back), refuses a second target on the same
//! address, and on SIGTERM disconnects the host cleanly and exits 0.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

mod common;

use common::{tmp, Tgt, WAIT};

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use pollux_nvmf::host::rdma::{RdmaHost, RdmaHostOptions};
use pollux_nvmf::host::{Controller, CtrlOptions, HostError, HostIdentity, DEFAULT_HOSTNQN};
use pollux_reactor::mem::{BufPool, BufPoolOptions, SgList};
use pollux_verbs::soft::Soft;
use pollux_verbs::CmAddr;
use rustix::process::Signal;

const NQN: &str = "nqn.2016-06.io.pollux:tgt-run-test";
fn config(addr: &str) -> String {
    format!(
        r#"cores = "0"
provider = "soft"
[transport]
max_queue_depth = 64
num_shared_buffers = 64
buf_cache_size = 8
max_srq_depth = 256
num_cqe = 4096
hugepages = "never"

[[bdev]]
spec = "malloc:name=Malloc0,size=4M,block=512"

[[subsystem]]
nqn = "{NQN}"
serial = "POLLUXTEST01"
model = "Pollux Test"
allow_any_host = true
namespaces = [{{ bdev = "Malloc0", nsid = 1 }}]

[[listener]]
traddr = "{addr}"
"#
    )
}

fn read_stats(path: &PathBuf) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn pattern(seed: u8, b: &mut [u8]) {
    for (i, x) in b.iter_mut().enumerate() {
        *x = (i as u8).wrapping_mul(31).wrapping_add(seed);
    }
}

#[test]
fn serves_a_host_and_shuts_down_cleanly_on_sigterm() {
    let addr = format!("@pollux-tgt-run-test-{}", std::process::id());
    let cfg = tmp("tgt-run.toml");
    std::fs::write(&cfg, config(&addr)).unwrap();
    let stats = tmp("tgt-run-stats.json");
    let _ = std::fs::remove_file(&stats);
    let mut tgt = Tgt::start(&cfg, &["--stats-file", stats.to_str().unwrap()]);
    tgt.wait_line("pollux-tgt: ready");
    let banner = tgt.seen.join("\n");
    assert!(banner.contains(&format!("subsystem {NQN}")), "{banner}");
    assert!(
        banner.contains("namespace 1: bdev Malloc0") && banner.contains("8192 blocks of 512 bytes"),
        "{banner}"
    );
    assert!(banner.contains(&format!("listener {addr}")), "{banner}");
    assert!(banner.contains("receive buffers:"), "{banner}");
    assert!(banner.contains("max_queue_depth 64"), "{banner}");

    // The stats file is there once the target is ready.
    let s = read_stats(&stats);
    assert_eq!(s["cores"], serde_json::json!([0]), "{s}");
    assert_eq!(s["busy_pct"].as_array().unwrap().len(), 1, "{s}");
    assert!(s["recv_memory_bytes"].as_u64().unwrap() > 0, "{s}");
    // The reactor loops (the file written at `ready` may predate its first
    // loop; it is rewritten every second); a busy loop is a loop.
    let start = std::time::Instant::now();
    let s = loop {
        let s = read_stats(&stats);
        if s["loops"][0].as_u64().unwrap() > 0 {
            break s;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "no reactor loop counted: {s}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let loops = s["loops"][0].as_u64().unwrap();
    let busy_loops = s["busy_loops"][0].as_u64().unwrap();
    assert!(busy_loops <= loops, "{s}");

    // A second target on the same address fails and names the listener.
    let mut dup = Tgt::start(&cfg, &[]);
    let st = dup.wait_exit();
    assert!(!st.success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut dup.child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("listener[0]") && err.contains(&addr), "{err}");

    // A host: Connect + Identify (Controller::connect), then an I/O queue,
    // a 4 KiB write and its read back.
    let t = RdmaHost::<Soft>::open(None, CmAddr::new(addr.clone()), RdmaHostOptions::default())
        .unwrap();
    let who = HostIdentity {
        hostnqn: DEFAULT_HOSTNQN.into(),
        hostid: *b"pollux-tgt-test1",
        subnqn: NQN.into(),
    };
    let mut c = Controller::connect(&t, who, CtrlOptions::default()).unwrap();
    assert_eq!(c.info().ident.subnqn, NQN);
    let ns = c.info().namespaces.clone();
    assert_eq!(ns.len(), 1);
    assert_eq!(
        (ns[0].nsid, ns[0].block_size, ns[0].num_blocks),
        (1, 512, 8192)
    );
    let mut qp = c.connect_io(&t, 1, 16, None).unwrap();
    let pool = BufPool::new(BufPoolOptions::new("tgt-run-test", 4096, 4)).unwrap();
    let mut w = pool.get().unwrap();
    pattern(7, w.as_mut_slice());
    let want = w.as_slice().to_vec();
    qp.write(1, 16, 8, SgList::from_buf(w), 1).unwrap();
    let mut rb = pool.get().unwrap();
    rb.as_mut_slice().fill(0xEE);
    let mut r = Some(rb);
    let mut got = None;
    let mut wrote = false;
    let deadline = Instant::now() + WAIT;
    while got.is_none() {
        assert!(Instant::now() < deadline, "I/O did not complete");
        qp.poll(&mut |cpl| {
            assert!(cpl.result.is_ok(), "I/O {}: {:?}", cpl.ctx, cpl.result);
            if cpl.ctx == 1 {
                wrote = true;
            } else {
                let mut have = vec![0u8; 4096];
                cpl.data.copy_to_slice(&mut have);
                got = Some(have);
            }
        });
        if wrote {
            if let Some(b) = r.take() {
                qp.read(1, 16, 8, SgList::from_buf(b), 2).unwrap();
            }
        }
        c.poll().unwrap();
    }
    assert!(
        got.unwrap() == want,
        "read back differs from what was written"
    );

    // The target counts both queues.
    let deadline = Instant::now() + WAIT;
    while read_stats(&stats)["connections"] != 2 {
        assert!(Instant::now() < deadline, "{}", read_stats(&stats));
        std::thread::sleep(Duration::from_millis(50));
    }

    // SIGTERM: the host sees a disconnect, the target exits 0 after
    // closing both queues itself.
    tgt.signal(Signal::TERM);
    let deadline = Instant::now() + WAIT;
    let e = loop {
        match c.poll() {
            Err(e) => break e,
            Ok(()) => {
                assert!(Instant::now() < deadline, "the host saw no disconnect");
                qp.poll(&mut |_| {});
                std::thread::yield_now();
            }
        }
    };
    assert!(matches!(e, HostError::Disconnected(_)), "{e}");
    let st = tgt.wait_exit();
    tgt.wait_line("pollux-tgt: stopped");
    let out = tgt.seen.join("\n");
    assert!(st.success(), "{st}; stdout:\n{out}");
    assert!(out.contains("disconnecting 2 queue(s)"), "{out}");
    assert!(
        out.contains("(2 connection(s) accepted, 2 closed)"),
        "{out}"
    );
    let _ = std::fs::remove_file(&cfg);
    let _ = std::fs::remove_file(&stats);
}

#[test]
fn sigint_without_hosts_exits_zero() {
    let addr = format!("@pollux-tgt-sigint-test-{}", std::process::id());
    let cfg = tmp("tgt-sigint.toml");
    std::fs::write(&cfg, config(&addr)).unwrap();
    let mut tgt = Tgt::start(&cfg, &[]);
    tgt.wait_line("pollux-tgt: ready");
    tgt.signal(Signal::INT);
    let st = tgt.wait_exit();
    tgt.wait_line("pollux-tgt: stopped");
    assert!(st.success(), "{st}");
    let _ = std::fs::remove_file(&cfg);
}

#[test]
fn warns_when_the_descriptor_limit_cannot_hold_the_connection_limit() {
    let run = |max_qpairs: Option<u32>| {
        let addr = format!(
            "@pollux-tgt-nofile-test-{}-{}",
            std::process::id(),
            max_qpairs.unwrap_or(0)
        );
        let cfg = tmp(&format!("tgt-nofile-{}.toml", max_qpairs.unwrap_or(0)));
        let mut text = config(&addr);
        if let Some(m) = max_qpairs {
            text = text.replace(
                "[transport]\n",
                &format!("[transport]\nmax_qpairs = {m}\nmax_qpairs_per_core = {m}\n"),
            );
        }
        std::fs::write(&cfg, text).unwrap();
        let mut tgt = Tgt::start_with_nofile(&cfg, 256);
        tgt.wait_line("pollux-tgt: ready");
        tgt.signal(Signal::INT);
        assert!(tgt.wait_exit().success());
        tgt.wait_line("pollux-tgt: stopped");
        let _ = std::fs::remove_file(&cfg);
        tgt.seen.clone()
    };
    // The default max_qpairs (1024) cannot fit in 256 descriptors.
    let seen = run(None);
    assert!(
        seen.iter()
            .any(|l| l.contains("RLIMIT_NOFILE 256") && l.contains("max_qpairs")),
        "{seen:#?}"
    );
    assert!(seen.iter().any(|l| l.contains("limits: max_qpairs 1024")));
    // Four queue pairs do.
    let seen = run(Some(4));
    assert!(
        !seen.iter().any(|l| l.contains("RLIMIT_NOFILE")),
        "{seen:#?}"
    );
    assert!(seen
        .iter()
        .any(|l| l.contains("limits: max_qpairs 4 max_qpairs_per_core 4")));
}

#[test]
fn config_errors_exit_2_naming_line_and_field() {
    let cfg = tmp("tgt-bad.toml");
    let text = config("@pollux-tgt-bad").replace("bdev = \"Malloc0\"", "bdev = \"Malloc9\"");
    std::fs::write(&cfg, &text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pollux-tgt"))
        .arg("-c")
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    let line = text.lines().position(|l| l.contains("Malloc9")).unwrap() + 1;
    assert!(
        err.contains(&format!("line {line}")) && err.contains("namespaces[0].bdev"),
        "{err}"
    );
    let _ = std::fs::remove_file(&cfg);
}
