//! `pollux-bdevperf`: block-device benchmark on Pollux reactors, in the
//! manner of SPDK's bdevperf.
//!
//! ```text
//! pollux-bdevperf --bdev null:size=1G,block=4096 -q 128 -o 4096 -w randread -t 5 --cores 0 --json
//! ```
//!
//! By default it measures like SPDK's bdevperf (the generic submit path, a
//! fresh request per I/O, TSC timestamps at submit and completion);
//! `--in-place` selects the in-place path.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use pollux_apps::bdevperf::{run_with_pi, PerfParams, PiMode};
use pollux_apps::cli::{parse_io_size, ReactorArgs};
use pollux_apps::config::Config;
use pollux_apps::workload::Workload;
use pollux_apps::AppError;
use pollux_bdev::{BdevRegistry, BdevSpec};

/// Block-device benchmark: keeps `-q` I/Os of `-o` bytes in flight on every
/// bdev from every selected core for `-t` seconds and prints IOPS, MiB/s,
/// latency percentiles and reactor busy time.
#[derive(Parser, Debug)]
#[command(name = "pollux-bdevperf", version)]
struct Args {
    /// A bdev to create, as a spec: `null:size=1G,block=4096`,
    /// `malloc:size=1G,block=4096`, `aio:path=FILE,block=4096`. Repeatable.
    #[arg(long = "bdev", value_name = "SPEC")]
    bdevs: Vec<String>,
    /// A TOML file with `[[bdev]]` entries (and optionally `cores`).
    #[arg(short = 'c', long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// I/Os in flight per bdev per core.
    #[arg(short = 'q', long = "queue-depth", default_value_t = 128)]
    queue_depth: usize,
    /// I/O size in bytes (suffixes k, M accepted).
    #[arg(short = 'o', long = "io-size", default_value = "4096")]
    io_size: String,
    /// Workload: read, write, randread, randwrite, rw, randrw, verify.
    #[arg(short = 'w', long, default_value = "randread")]
    workload: String,
    /// Read percentage for rw and randrw.
    #[arg(short = 'M', long = "rwmixread", default_value_t = 50)]
    read_pct: u8,
    /// Run time in seconds.
    #[arg(short = 't', long = "time", default_value_t = 5.0)]
    seconds: f64,
    #[command(flatten)]
    reactors: ReactorArgs,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Protection information in the bdev layer on every I/O: off,
    /// write-generate, read-verify or both (the bdevs need PI:
    /// `md=8,pi=1`, and `md_interleave=true` for DIF; -o counts the
    /// interleaved metadata, e.g. 4160 for 8 blocks of 520).
    #[arg(long, default_value = "off", value_name = "MODE")]
    pi: String,
    /// Submit through the in-place path (each completion resubmits its own
    /// request slot) instead of the generic one (a fresh request and a
    /// callback per I/O, as SPDK's bdevperf). The JSON's `path` says which.
    #[arg(long)]
    in_place: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match real_main(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("pollux-bdevperf: {e}");
            ExitCode::from(2)
        }
    }
}

fn real_main(args: &Args) -> Result<ExitCode, AppError> {
    let config = match &args.config {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    let mut specs = Vec::new();
    for entry in &config.bdev {
        specs.push(entry.to_spec()?);
    }
    specs.extend(args.bdevs.iter().cloned());
    let registry = BdevRegistry::new();
    let mut bdevs = Vec::with_capacity(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        let mut parsed =
            BdevSpec::parse(spec).map_err(|e| AppError::Bdev(format!("'{spec}': {e}")))?;
        if parsed.name.is_none() {
            parsed.name = Some(format!("{}{i}", parsed.backend.type_name()));
        }
        let b = registry
            .create_from(&parsed)
            .map_err(|e| AppError::Bdev(format!("'{spec}': {e}")))?;
        bdevs.push(Arc::clone(&b));
    }
    let mut reactors = args.reactors.clone();
    if reactors.cores.is_none() && reactors.mask.is_none() {
        reactors.cores = config.cores.clone();
    }
    let workload: Workload = args
        .workload
        .parse()
        .map_err(|e: pollux_apps::workload::UnknownWorkload| AppError::Usage(e.to_string()))?;
    if !(args.seconds > 0.0 && args.seconds.is_finite()) {
        return Err(AppError::Usage(
            "-t must be a positive number of seconds".into(),
        ));
    }
    if args.read_pct > 100 {
        return Err(AppError::Usage("-M must be between 0 and 100".into()));
    }
    let params = PerfParams {
        queue_depth: args.queue_depth,
        io_size: parse_io_size(&args.io_size)?,
        workload,
        read_pct: args.read_pct,
        duration: Duration::from_secs_f64(args.seconds),
        in_place: args.in_place,
    };
    let tty = std::io::stderr().is_terminal() && !args.json;
    let mut second = 0u32;
    let mut show = |iops: f64| {
        second += 1;
        eprint!("\r  {second:>4} s  {:>14.0} IOPS", iops);
        let _ = std::io::stderr().flush();
    };
    let progress: Option<&mut dyn FnMut(f64)> = if tty { Some(&mut show) } else { None };
    let pi: PiMode = args.pi.parse()?;
    let report = run_with_pi(
        &bdevs,
        reactors.cores()?,
        reactors.idle_mode()?,
        &params,
        pi,
        progress,
    )?;
    if tty {
        eprintln!();
    }
    if args.json {
        println!("{}", report.to_json());
    } else {
        println!(
            "pollux-bdevperf: {} bdev(s), -q {} -o {} -w {} -t {} --pi {}, {} path, {} clock",
            bdevs.len(),
            params.queue_depth,
            params.io_size,
            workload,
            args.seconds,
            args.pi,
            params.path_name(),
            report.clock.as_deref().unwrap_or("-")
        );
        print!("{}", report.to_table());
    }
    let bad = report.total.errors + report.total.miscompares;
    Ok(if bad > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
