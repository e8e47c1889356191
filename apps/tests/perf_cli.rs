//! The `pollux-perf` binary: the JSON shape with a spawned target, the
//! sweep table, and clear errors for bad or unreachable transport IDs.
#![allow(clippy::unwrap_used)]

use std::process::Command;

fn perf() -> Command {
    Command::new(env!("CARGO_BIN_EXE_pollux-perf"))
}

fn cores() -> (&'static str, &'static str) {
    let two = std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2;
    if two {
        ("0", "1")
    } else {
        ("0", "0")
    }
}

#[test]
fn spawned_target_json_has_the_bdevperf_shape_and_target_load() {
    let (t, h) = cores();
    let out = perf()
        .args([
            "--spawn-target",
            "null:size=64M,block=512",
            "--target-cores",
            t,
            "--cores",
            h,
        ])
        .args([
            "-q", "32", "-o", "4096", "-w", "randread", "-t", "0.3", "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
    for k in ["iops", "mibps", "lat_avg_us", "lat_p99_us", "lat_p999_us"] {
        assert!(v[k].is_number(), "{k}: {v}");
    }
    assert!(v["iops"].as_f64().unwrap() > 0.0);
    assert!(v["cores"][0]["busy_pct"].is_number());
    let clock = v["clock"].as_str().unwrap();
    assert!(clock == "tsc" || clock == "monotonic", "{clock}");
    let tb = v["target_busy_pct"].as_f64().unwrap();
    assert!((0.0..=100.0).contains(&tb));
}

#[test]
fn verify_write_through_a_spawned_target() {
    let (t, h) = cores();
    let out = perf()
        .args([
            "--spawn-target",
            "malloc:size=16M,block=512",
            "--target-cores",
            t,
            "--cores",
            h,
        ])
        .args([
            "-q",
            "16",
            "-o",
            "8k",
            "-w",
            "write",
            "--verify",
            "-t",
            "0.3",
            "--mem",
            "register-always",
        ])
        .args(["--remote-invalidation", "off", "--inline-size", "0"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.lines().any(|l| l.starts_with("total")), "{s}");
}

#[test]
fn sweep_prints_a_row_per_block_size() {
    let (t, h) = cores();
    let out = perf()
        .args([
            "--spawn-target",
            "null:size=64M,block=512",
            "--target-cores",
            t,
            "--cores",
            h,
        ])
        .args([
            "--sweep",
            "--sweep-modes",
            "pool,register-always+inline",
            "-q",
            "8",
            "-t",
            "0.05",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<&str> = s
        .lines()
        .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    assert_eq!(rows.len(), 8, "{s}");
    assert!(
        rows[0].trim_start().starts_with("512") && rows[7].trim_start().starts_with("64K"),
        "{s}"
    );
}

#[test]
fn bad_and_unreachable_targets_are_clear_errors() {
    let out = perf()
        .args(["-r", "trtype:fc traddr:1.2.3.4", "-t", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown trtype"));
    // Digests are a TCP option.
    let out = perf()
        .args(["-r", "trtype:soft traddr:@x", "--hdr-digest", "-t", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("trtype:tcp only"));
    // Nobody listens on that TCP port.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = perf()
        .args([
            "-r",
            &format!("trtype:tcp traddr:127.0.0.1 trsvcid:{port} subnqn:nqn.2024-01.io.pollux:x"),
            "-t",
            "1",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    let out = perf()
        .args([
            "-r",
            "trtype:soft traddr:@pollux-perf-nobody subnqn:nqn.2024-01.io.pollux:x",
            "-t",
            "1",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("connecting to") && err.contains("pollux-perf-nobody"),
        "{err}"
    );
    let out = perf().args(["-t", "1"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}
