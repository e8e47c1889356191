//! SPDK's own client, unmodified, drives `pollux-tgt`: `spdk-rpc` from the
//! PyPI package `spdk` at the version `scripts/spdk-rpc-venv.sh` pins,
//! installed in `target/spdk-venv` (CI runs that script; `POLLUX_SPDK_RPC`
//! may name another `spdk-rpc`). Without it the test says so and skips,
//! except under CI (`CI=true`), where it fails. `spdk-rpc load_config`
//! loads a configuration SPDK v25.09's `nvmf_tgt` saved, option methods
//! included, and a host does I/O to what it made.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

mod common;

use common::tcp_host::{free_port, host_io};
use common::{tmp, Tgt};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, AtomicU64};

use rustix::process::Signal;
use serde_json::Value;

fn spdk_rpc() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("POLLUX_SPDK_RPC") {
        return Some(PathBuf::from(p));
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/spdk-venv/bin/spdk-rpc");
    p.exists().then_some(p)
}

struct Spdk {
    bin: PathBuf,
    sock: PathBuf,
}

impl Spdk {
    fn run(&self, args: &[&str]) -> Output {
        Command::new(&self.bin)
            .arg("-s")
            .arg(&self.sock)
            .args(args)
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "spdk-rpc {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn json(&self, args: &[&str]) -> Value {
        serde_json::from_str(&self.ok(args)).unwrap()
    }
}

fn target(name: &str, sock: &Path) -> Tgt {
    let cfg = tmp(&format!("{name}.toml"));
    std::fs::write(
        &cfg,
        "cores = \"0\"\n[transport]\nmax_queue_depth = 32\nnum_shared_buffers = 32\nbuf_cache_size = 4\nmax_srq_depth = 64\nnum_cqe = 1024\nhugepages = \"never\"\n",
    )
    .unwrap();
    let mut t = Tgt::start(&cfg, &["-r", sock.to_str().unwrap()]);
    t.wait_line("pollux-tgt: ready");
    t
}

/// The client, or `None` after saying why the test skips.
fn spdk_rpc_or_skip() -> Option<PathBuf> {
    let bin = spdk_rpc();
    if bin.is_none() {
        // CI installs it (.ci/run): there, a missing client is a failure.
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "spdk-rpc missing in CI: .ci/run should have run scripts/spdk-rpc-venv.sh"
        );
        println!(
            "SKIPPED: spdk-rpc not installed (run scripts/spdk-rpc-venv.sh, or set POLLUX_SPDK_RPC)"
        );
    }
    bin
}

#[test]
fn spdk_rpc_manages_pollux_tgt() {
    let Some(bin) = spdk_rpc_or_skip() else {
        return;
    };
    let sock = tmp("spdk-a.sock");
    let mut t = target("spdk-a", &sock);
    let rpc = Spdk {
        bin: bin.clone(),
        sock,
    };

    assert_eq!(
        rpc.ok(&["bdev_malloc_create", "-b", "Malloc0", "64", "512"])
            .trim(),
        "Malloc0"
    );
    assert_eq!(
        rpc.ok(&["bdev_null_create", "Null0", "16", "4096"]).trim(),
        "Null0"
    );
    let b = rpc.json(&["bdev_get_bdevs", "-b", "Malloc0"]);
    assert_eq!(b[0]["num_blocks"], 64 * 2048);
    assert_eq!(b[0]["product_name"], "Malloc disk");
    assert_eq!(rpc.json(&["bdev_get_bdevs"]).as_array().unwrap().len(), 2);
    let stat = rpc.json(&["bdev_get_iostat", "-b", "Null0"]);
    assert_eq!(stat["bdevs"][0]["name"], "Null0");
    let methods = rpc.json(&["rpc_get_methods"]);
    assert!(methods
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m == "bdev_aio_create"));
    assert!(rpc.json(&["framework_get_reactors"])["reactors"][0]["lcore"] == 0);
    assert!(rpc.json(&["spdk_get_version"])["version"].is_string());
    rpc.ok(&["framework_wait_init"]);

    // spdk-rpc's save_config assembles the file from framework_get_subsystems
    // and framework_get_config; its load_config replays it call by call.
    let saved = rpc.ok(&["save_config"]);
    let file = tmp("spdk-saved.json");
    std::fs::write(&file, &saved).unwrap();
    let before = rpc.json(&["bdev_get_bdevs"]);

    // Errors: spdk-rpc exits 1 and prints the error object.
    let out = rpc.run(&["bdev_malloc_delete", "Nope"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("No such device")
            || String::from_utf8_lossy(&out.stderr).contains("No such device")
    );
    rpc.ok(&["bdev_malloc_delete", "Malloc0"]);
    assert_eq!(
        rpc.run(&["bdev_get_bdevs", "-b", "Malloc0"]).status.code(),
        Some(1)
    );

    t.signal(Signal::TERM);
    assert!(t.wait_exit().success());

    let sock = tmp("spdk-b.sock");
    let mut t = target("spdk-b", &sock);
    let fresh = Spdk { bin, sock };
    fresh.ok(&["load_config", "-j", file.to_str().unwrap()]);
    assert_eq!(fresh.json(&["bdev_get_bdevs"]), before);
    t.signal(Signal::TERM);
    assert!(t.wait_exit().success());
}

/// SPDK's NVMe/TCP getting-started flow with `spdk-rpc`, a host doing
/// verified I/O through what it built, `save_config` -> a restart with
/// `--json` -> the same subsystems, and `spdk-cli ls` showing the tree.
#[test]
fn spdk_rpc_builds_an_nvmf_tcp_target_that_a_host_uses_and_spdk_cli_shows() {
    let Some(bin) = spdk_rpc_or_skip() else {
        return;
    };
    const NQN: &str = "nqn.2016-06.io.spdk:cnode1";
    let sock = tmp("spdk-nvmf-a.sock");
    let mut t = target("spdk-nvmf-a", &sock);
    let rpc = Spdk {
        bin: bin.clone(),
        sock: sock.clone(),
    };
    let port = free_port().to_string();
    assert_eq!(
        rpc.ok(&["bdev_malloc_create", "-b", "Malloc0", "64", "512"])
            .trim(),
        "Malloc0"
    );
    rpc.ok(&["nvmf_create_transport", "-t", "TCP"]);
    rpc.ok(&[
        "nvmf_create_subsystem",
        NQN,
        "-a",
        "-s",
        "SPDK00000000000001",
    ]);
    rpc.ok(&["nvmf_subsystem_add_ns", NQN, "Malloc0"]);
    rpc.ok(&[
        "nvmf_subsystem_add_listener",
        NQN,
        "-t",
        "tcp",
        "-a",
        "127.0.0.1",
        "-s",
        &port,
    ]);
    // An error as SPDK's: the transport exists.
    let out = rpc.run(&["nvmf_create_transport", "-t", "TCP"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("already exists"));

    let done = AtomicU64::new(0);
    let run = host_io(port.parse().unwrap(), NQN, &AtomicBool::new(true), &done);
    assert!(run.completions >= 40);

    let subs = rpc.json(&["nvmf_get_subsystems"]);
    assert_eq!(subs[1]["nqn"], NQN);
    assert_eq!(subs[1]["serial_number"], "SPDK00000000000001");
    assert_eq!(subs[1]["namespaces"][0]["bdev_name"], "Malloc0");
    assert_eq!(subs[1]["listen_addresses"][0]["trsvcid"], port.as_str());
    assert_eq!(rpc.json(&["nvmf_get_transports"])[0]["trtype"], "TCP");

    let cli = bin.with_file_name("spdk-cli");
    let out = Command::new(&cli)
        .arg("-s")
        .arg(&sock)
        .arg("ls")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "spdk-cli ls: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    for want in [
        NQN,
        "Malloc0",
        &format!("127.0.0.1:{port}"),
        "Subsystems: 2",
        "Transports: 1",
    ] {
        assert!(tree.contains(want), "spdk-cli ls lacks {want}:\n{tree}");
    }

    let file = tmp("spdk-nvmf-saved.json");
    std::fs::write(&file, rpc.ok(&["save_config"])).unwrap();
    t.signal(Signal::TERM);
    assert!(t.wait_exit().success());

    let sock = tmp("spdk-nvmf-b.sock");
    let cfg = tmp("spdk-nvmf-b.toml");
    std::fs::write(&cfg, "cores = \"0\"\n[transport]\nmax_queue_depth = 32\nnum_shared_buffers = 32\nbuf_cache_size = 4\nmax_srq_depth = 64\nnum_cqe = 1024\nhugepages = \"never\"\n").unwrap();
    let mut t = Tgt::start(
        &cfg,
        &[
            "-r",
            sock.to_str().unwrap(),
            "--json",
            file.to_str().unwrap(),
        ],
    );
    t.wait_line("pollux-tgt: ready");
    let fresh = Spdk { bin, sock };
    assert_eq!(fresh.json(&["nvmf_get_subsystems"]), subs);
    t.signal(Signal::TERM);
    assert!(t.wait_exit().success());
}

#[test]
fn spdk_rpc_load_config_loads_what_spdks_nvmf_tgt_saved() {
    let Some(bin) = spdk_rpc_or_skip() else {
        return;
    };
    // The data buffers of the file's TCP transport (target-wide in Pollux).
    let cfg = tmp("spdk-load.toml");
    std::fs::write(
        &cfg,
        "cores = \"0\"\n[transport]\nio_unit_size = \"16k\"\nin_capsule_data_size = 8192\nnum_shared_buffers = 511\nhugepages = \"never\"\n",
    )
    .unwrap();
    let sock = tmp("spdk-load.sock");
    let mut t = Tgt::start(&cfg, &["-r", sock.to_str().unwrap()]);
    t.wait_line("pollux-tgt: ready");
    let rpc = Spdk { bin, sock };
    let port = free_port();
    let saved = include_str!("data/spdk-v25.09-nvmf_tgt-save_config.json")
        .replace("\"4421\"", &format!("\"{port}\""));
    let file = tmp("spdk-load.json");
    std::fs::write(&file, saved).unwrap();
    rpc.ok(&["load_config", "-j", file.to_str().unwrap()]);
    let subs = rpc.json(&["nvmf_get_subsystems"]);
    assert_eq!(subs[1]["nqn"], "nqn.2016-06.io.spdk:cnode1");
    assert_eq!(subs[1]["namespaces"].as_array().unwrap().len(), 2);
    assert_eq!(subs[2]["hosts"][0]["nqn"], "nqn.2016-06.io.spdk:host1");
    let stop = AtomicBool::new(true);
    let run = host_io(
        port,
        "nqn.2016-06.io.spdk:cnode1",
        &stop,
        &AtomicU64::new(0),
    );
    assert!(run.completions >= 40);
    // An option SPDK's defaults do not have is refused by name.
    let out = rpc.run(&["bdev_set_options", "-p", "4096"]);
    assert!(!out.status.success());
    let err = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(err.contains("bdev_io_pool_size"), "{err}");
    t.signal(Signal::TERM);
    assert!(t.wait_exit().success());
}
