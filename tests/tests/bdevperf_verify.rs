//! bdevperf's engine on every backend: `verify` writes a pattern per block
//! and reads it back; any mismatch or I/O error fails the test.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pollux_apps::bdevperf::{run, PerfParams};
use pollux_apps::workload::Workload;
use pollux_bdev::BdevRegistry;
use pollux_reactor::{Cores, IdleMode};

fn params(workload: Workload, qd: usize, io_size: usize) -> PerfParams {
    PerfParams {
        queue_depth: qd,
        io_size,
        workload,
        read_pct: 50,
        duration: Duration::from_millis(300),
        in_place: false,
    }
}

/// `verify` through the generic path, then through the in-place path.
fn verify_on(spec: &str, cores: &str, io_size: usize) {
    verify_idle(spec, cores, io_size, IdleMode::BusyPoll);
}

/// [`verify_on`] on reactors in idle mode `idle`.
fn verify_idle(spec: &str, cores: &str, io_size: usize, idle: IdleMode) {
    let reg = BdevRegistry::new();
    let b = reg.create(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
    for in_place in [false, true] {
        let p = PerfParams {
            in_place,
            ..params(Workload::Verify, 16, io_size)
        };
        let rep = run(
            &[Arc::clone(&b)],
            Cores::parse(cores).unwrap(),
            idle,
            &p,
            None,
        )
        .unwrap();
        let what = format!("{spec} {} {idle:?}", p.path_name());
        assert_eq!(rep.path.as_deref(), Some(p.path_name()));
        // Any I/O at all: a count depends on the machine's speed.
        assert!(rep.total.ios > 0, "{what}: no I/O");
        assert_eq!(rep.total.errors, 0, "{what}: I/O errors");
        assert_eq!(rep.total.miscompares, 0, "{what}: data miscompares");
        assert_eq!(rep.cores.len(), Cores::parse(cores).unwrap().len());
        // A reactor that slept with I/O in flight would have seen it only
        // at its next timer (bdevperf's progress tick, a second away).
        assert!(
            rep.total.lat_max_us < 500_000.0,
            "{what}: an I/O waited {} us",
            rep.total.lat_max_us
        );
    }
}

#[test]
fn verify_malloc_on_two_cores() {
    verify_on("malloc:size=16M,block=512", "0-1", 4096);
    verify_on("malloc:size=16M,block=4096", "0", 8192);
}

/// Directories removed (with their files) on drop.
struct RemoveDirs(Vec<PathBuf>);

impl Drop for RemoveDirs {
    fn drop(&mut self) {
        for d in &self.0 {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

#[test]
fn verify_aio_with_both_engines() {
    // `$TMPDIR` or, where that refuses O_DIRECT (tmpfs), Cargo's scratch
    // directory for this test target (under `target/`).
    let name = format!("pollux-bdevperf-{}", std::process::id());
    let dirs = [
        std::env::temp_dir(),
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")),
    ]
    .map(|d| d.join(&name));
    let _cleanup = RemoveDirs(dirs.to_vec());
    for engine in ["uring", "aio"] {
        let mut tried = Vec::new();
        let spec = dirs.iter().find_map(|dir| {
            std::fs::create_dir_all(dir).unwrap();
            let spec = format!(
                "aio:path={}/disk-{engine},block=4096,size=16M,engine={engine}",
                dir.display()
            );
            match BdevRegistry::new().create(&spec) {
                Ok(_) => Some(spec),
                Err(e) => {
                    tried.push(format!("{}: {e}", dir.display()));
                    None
                }
            }
        });
        let Some(spec) = spec else {
            pollux_reactor::test_env::skip(
                &format!("an aio bdev with engine={engine} ({})", tried.join("; ")),
                "point TMPDIR at a disk file system such as ext4 or xfs, not tmpfs",
            );
            continue;
        };
        verify_on(&spec, "0", 4096);
        // The reactor sleeps when idle: the channel keeps it awake while
        // its I/Os are in flight (Linux AIO wakes nothing).
        let adaptive = IdleMode::Adaptive {
            sleep_after: Duration::ZERO,
        };
        let hybrid = IdleMode::Hybrid {
            sleep_after: Duration::from_millis(1),
        };
        verify_idle(&spec, "0", 4096, adaptive);
        verify_idle(&spec, "0", 4096, hybrid);
    }
}

#[test]
fn null_randread_counts_io_and_verify_catches_a_lying_disk() {
    let reg = BdevRegistry::new();
    let b = reg.create("null:size=64M,block=4096").unwrap();
    let rep = run(
        std::slice::from_ref(&b),
        Cores::parse("0").unwrap(),
        IdleMode::BusyPoll,
        &params(Workload::RandRead, 32, 4096),
        None,
    )
    .unwrap();
    assert!(rep.total.ios > 0, "no I/O");
    assert_eq!(rep.total.errors, 0);
    assert!(
        (rep.total.mibps - rep.total.iops * 4096.0 / 1048576.0).abs()
            < 1e-6 * rep.total.mibps.max(1.0)
    );
    // A null disk stores nothing, so verify must report miscompares on
    // either path: this is the proof that verify can fail.
    for in_place in [false, true] {
        let p = PerfParams {
            in_place,
            ..params(Workload::Verify, 8, 4096)
        };
        let rep = run(
            std::slice::from_ref(&b),
            Cores::parse("0").unwrap(),
            IdleMode::BusyPoll,
            &p,
            None,
        )
        .unwrap();
        assert!(
            rep.total.miscompares > 0,
            "verify ({}) did not notice a disk that stores nothing",
            p.path_name()
        );
    }
}

#[test]
fn bad_parameters_are_errors_not_panics() {
    let reg = BdevRegistry::new();
    let b = reg.create("null:size=1M,block=4096").unwrap();
    let c = || Cores::parse("0").unwrap();
    for p in [
        params(Workload::Read, 0, 4096),
        params(Workload::Read, 4, 1000),
        params(Workload::Read, 4, 2 << 20),
    ] {
        assert!(run(std::slice::from_ref(&b), c(), IdleMode::BusyPoll, &p, None).is_err());
    }
    assert!(run(
        &[],
        c(),
        IdleMode::BusyPoll,
        &params(Workload::Read, 4, 4096),
        None
    )
    .is_err());
}
