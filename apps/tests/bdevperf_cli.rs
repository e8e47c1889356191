//! The `pollux-bdevperf` binary as our checks use it: the JSON shape, the
//! human table, several `--bdev`s, a config file, and clear errors.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

use std::process::Command;

fn bdevperf(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pollux-bdevperf"))
        .args(args)
        .output()
        .expect("run pollux-bdevperf")
}

#[test]
fn json_has_totals_and_per_core_figures() {
    for (extra, path) in [(None, "generic"), (Some("--in-place"), "in-place")] {
        let mut args = vec![
            "--bdev",
            "null:size=64M,block=4096",
            "-q",
            "16",
            "-o",
            "4096",
            "-w",
            "randread",
            "-t",
            "0.3",
            "--cores",
            "0",
            "--json",
        ];
        args.extend(extra);
        json_run(&args, path);
    }
}

/// One `--json` run: the figures are there, with the path and clock used.
fn json_run(args: &[&str], path: &str) {
    let out = bdevperf(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["path"], path);
    let clock = v["clock"].as_str().unwrap();
    assert!(clock == "tsc" || clock == "monotonic", "{clock}");
    for k in ["iops", "mibps", "lat_avg_us", "lat_p99_us"] {
        assert!(v[k].as_f64().unwrap() > 0.0, "{k} = {}", v[k]);
    }
    let cores = v["cores"].as_array().unwrap();
    assert_eq!(cores.len(), 1);
    assert_eq!(cores[0]["core"], 0);
    let busy = cores[0]["busy_pct"].as_f64().unwrap();
    assert!((0.0..=100.0).contains(&busy));
    assert!(cores[0]["iops"].as_f64().unwrap() > 0.0);
}

#[test]
fn table_with_two_bdevs_and_a_config_file() {
    let dir = std::env::temp_dir().join(format!("pollux-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("perf.toml");
    std::fs::write(
        &cfg,
        "[[bdev]]\ntype = \"malloc\"\nsize = \"8M\"\nblock = 512\n",
    )
    .unwrap();
    let out = bdevperf(&[
        "-c",
        cfg.to_str().unwrap(),
        "--bdev",
        "null:size=8M,block=512",
        "-q",
        "4",
        "-o",
        "4k",
        "-w",
        "verify",
        "-t",
        "0.2",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    // null stores nothing, so verify reports it and exits 1; malloc is clean.
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("2 bdev(s)"), "{text}");
    assert!(text.lines().any(|l| l.starts_with("total")), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_input_gets_a_clear_error() {
    let cases: [(&[&str], &str); 4] = [
        (&["--bdev", "null:size=1G,block=1000"], "block"),
        (&["--bdev", "null:size=1G", "-w", "sideways"], "workload"),
        (&["--bdev", "null:size=1G", "--cores", "0-999"], "core"),
        (&["--bdev", "nosuch:size=1G"], "nosuch"),
    ];
    for (args, word) in cases {
        let out = bdevperf(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.to_lowercase().contains(word), "{args:?}: {err}");
    }
}
