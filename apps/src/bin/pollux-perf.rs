//! `pollux-perf`: NVMe-oF host benchmark on Pollux reactors, in the manner
//! of `spdk_nvme_perf`.
//!
//! ```text
//! pollux-perf -r 'trtype:soft traddr:@pollux-tgt subnqn:nqn.2024-01.io.pollux:null0' \
//!             -q 128 -o 4096 -w randread -t 5 --cores 1 --json
//! pollux-perf -r 'trtype:rdma adrfam:ipv4 traddr:10.0.0.1 trsvcid:4420 subnqn:…' --mem pool …
//! pollux-perf -r 'trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:4420 subnqn:…' --hdr-digest --data-digest …
//! pollux-perf -r … --sweep [--sweep-modes pool,register-always+inline,register-always+inline+local-inv]
//! ```

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use pollux_apps::cli::{parse_io_size, ReactorArgs};
use pollux_apps::perf::iser;
use pollux_apps::perf::spawn::{busy_pct, SpawnedTarget};
use pollux_apps::perf::stats_watch::{busy_pct_inside, stats_file_load, StatsWatch};
use pollux_apps::perf::sweep::{self, SweepMode, SWEEP_SIZES};
use pollux_apps::perf::{run, PerfParams, TransportFactory};
use pollux_apps::report::Report;
use pollux_apps::workload::Workload;
use pollux_apps::AppError;
use pollux_nvmf::host::pi::HostPi;
use pollux_nvmf::host::rdma::{MemMode, RdmaHost, RdmaHostOptions};
use pollux_nvmf::host::tcp::{TcpHost, TcpHostOptions};
use pollux_nvmf::host::{HostError, HostTrType, HostTrid};
use pollux_reactor::{Cores, IdleMode};
use pollux_verbs::{CmAddr, Provider};

/// NVMe-oF host benchmark: keeps `-q` I/Os of `-o` bytes in flight to the
/// first namespace of the subsystem from every selected core for `-t`
/// seconds and prints IOPS, MiB/s, latency percentiles and busy time.
#[derive(Parser, Debug)]
#[command(name = "pollux-perf", version)]
struct Args {
    /// Transport ID: `trtype:soft traddr:NAME subnqn:NQN` (software RDMA),
    /// `trtype:rdma adrfam:ipv4 traddr:IP trsvcid:4420 subnqn:NQN` or
    /// `trtype:tcp adrfam:ipv4 traddr:IP trsvcid:4420 subnqn:NQN` (NVMe/TCP).
    #[arg(
        short = 'r',
        long = "transport-id",
        value_name = "TRID",
        required_unless_present = "spawn_target"
    )]
    trid: Option<String>,
    /// Run our target in this process on `--target-cores`, serving this
    /// bdev (e.g. `null:size=1G,block=4096`) over the software RDMA
    /// provider, and benchmark it (`-r` is then not needed).
    #[arg(long = "spawn-target", value_name = "BDEV_SPEC")]
    spawn_target: Option<String>,
    /// A `pollux-tgt --stats-file` to read the target's reactor busy time
    /// from (every version written during each run is read; the busy %
    /// is taken between versions written while I/O flowed).
    #[arg(long = "target-stats", value_name = "PATH")]
    target_stats: Option<std::path::PathBuf>,
    /// Cores of the spawned target.
    #[arg(long = "target-cores", default_value = "0")]
    target_cores: String,
    /// I/Os in flight per namespace per core.
    #[arg(short = 'q', long = "queue-depth", default_value_t = 128)]
    queue_depth: usize,
    /// I/O size in bytes (suffixes k, M accepted).
    #[arg(short = 'o', long = "io-size", default_value = "4096")]
    io_size: String,
    /// Workload: read, write, randread, randwrite, rw, randrw.
    #[arg(short = 'w', long, default_value = "randread")]
    workload: String,
    /// Read percentage for rw and randrw.
    #[arg(short = 'M', long = "rwmixread", default_value_t = 50)]
    read_pct: u8,
    /// Run time in seconds.
    #[arg(short = 't', long = "time", default_value_t = 5.0)]
    seconds: f64,
    /// Warm-up seconds before measuring.
    #[arg(short = 'a', long = "warmup", default_value_t = 0.0)]
    warmup: f64,
    /// I/O queue pairs per namespace per core (the queue depth is spread
    /// over them).
    #[arg(short = 'P', long = "qpairs", default_value_t = 1)]
    qpairs: u16,
    /// Memory registration: `register-always` (default: fast registration
    /// per I/O, key invalidated after) or `pool` (pre-registered buffers).
    #[arg(long = "mem", default_value = "register-always")]
    mem: String,
    /// Remote invalidation (register-always): `on` (the target answers with
    /// SEND_WITH_INVALIDATE) or `off` (the host posts LOCAL_INV).
    #[arg(long = "remote-invalidation", default_value = "on")]
    remote_invalidation: String,
    /// Cap of in-capsule writes in bytes (0 disables; default: the
    /// target's IOCCSZ).
    #[arg(long = "inline-size")]
    inline_size: Option<u32>,
    /// Write a pattern, read it back and compare (exit 1 on a miscompare).
    #[arg(long)]
    verify: bool,
    /// Keep-alive timeout in seconds (0: none).
    #[arg(long = "kato", default_value_t = 10.0)]
    kato: f64,
    /// I/O timeout in seconds (the queue is torn down after it).
    #[arg(long = "io-timeout", default_value_t = 30.0)]
    io_timeout: f64,
    /// After losing the controller (target gone, keep-alive or I/O
    /// timeout), try to reconnect every SEC seconds; I/O pauses meanwhile.
    #[arg(long = "reconnect-delay", value_name = "SEC", default_value_t = 2.0)]
    reconnect_delay: f64,
    /// Give up after the controller stayed lost SEC seconds (the run fails);
    /// 0 (default): no reconnect, the first lost queue fails the run.
    #[arg(long = "ctrl-loss-tmo", value_name = "SEC", default_value_t = 0.0)]
    ctrl_loss_tmo: f64,
    /// RDMA device (ibverbs; default: the first).
    #[arg(long)]
    device: Option<String>,
    /// NVMe/TCP: ask for a header digest (CRC32C) on every PDU.
    #[arg(long = "hdr-digest")]
    hdr_digest: bool,
    /// NVMe/TCP: ask for a data digest (CRC32C) on every PDU with data.
    #[arg(long = "data-digest")]
    data_digest: bool,
    /// Run block sizes 512 B … 64 KiB against `--sweep-modes` and print a
    /// table of `IOPS/CPU%` cells.
    #[arg(long)]
    sweep: bool,
    /// Modes of a sweep: `MODE[+inline][+local-inv]`, comma separated.
    #[arg(long = "sweep-modes", default_value = sweep::DEFAULT_MODES)]
    sweep_modes: String,
    /// T10 PI on a LU or namespace formatted with it: off (none on the
    /// wire; NVMe-oF: PRACT, the controller generates, checks and strips),
    /// insert (PI on the wire only: the host generates and checks it), dix
    /// (PI in host memory too: generated before writes, verified after
    /// reads), or for iSER one direction of insert: write-generate,
    /// read-verify (`both` = insert).
    #[arg(long = "pi", default_value = "off")]
    pi: String,
    /// Where `--pi insert|dix` does its work: auto (the transport's
    /// signature offload where it has one, else software) or software.
    #[arg(long = "pi-engine", default_value = "auto")]
    pi_engine: String,
    /// The PI columns of an iSER `--sweep`, comma separated.
    #[arg(long = "sweep-pi", default_value = iser::DEFAULT_SWEEP_PI)]
    sweep_pi: String,
    #[command(flatten)]
    reactors: ReactorArgs,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    pollux_apps::logging::init("pollux-perf");
    let args = Args::parse();
    match real_main(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("pollux-perf: {e}");
            ExitCode::from(2)
        }
    }
}

fn secs(what: &str, s: f64) -> Result<Duration, AppError> {
    Duration::try_from_secs_f64(s)
        .map_err(|_| AppError::Usage(format!("{what} '{s}' is not a duration")))
}

fn factory<P: Provider>(
    addr: String,
    device: Option<String>,
    opts: RdmaHostOptions,
) -> TransportFactory<RdmaHost<P>> {
    Arc::new(move || {
        RdmaHost::<P>::open(device.as_deref(), CmAddr::new(addr.clone()), opts.clone())
    })
}

fn run_once(
    args: &Args,
    trid: &HostTrid,
    cores: &Cores,
    idle: IdleMode,
    p: &PerfParams,
    opts: RdmaHostOptions,
    tgt: Option<&SpawnedTarget>,
) -> Result<Report, AppError> {
    let sample = || match (&args.target_stats, tgt) {
        (Some(path), _) => stats_file_load(path),
        (None, Some(t)) => t.load(),
        (None, None) => None,
    };
    let before = sample();
    // The file's versions written during the run (see `StatsWatch`).
    let watch = args.target_stats.clone().map(StatsWatch::start);
    let res = run_transport(args, trid, cores, idle, p, opts);
    let inside = watch.and_then(|w| busy_pct_inside(&w.finish()));
    let mut r = res?;
    if let Some(pct) = inside {
        r.target_busy_pct = r.target_busy_pct.or(Some(pct));
        return Ok(r);
    }
    if args.target_stats.is_some() {
        // A short run: the stats file is rewritten every second, let it
        // catch up (the window then includes setup and teardown).
        std::thread::sleep(Duration::from_millis(1100));
    }
    if let (Some(a), Some(b)) = (before, sample()) {
        r.target_busy_pct = r.target_busy_pct.or(busy_pct(a, b));
    }
    Ok(r)
}

fn run_transport(
    args: &Args,
    trid: &HostTrid,
    cores: &Cores,
    idle: IdleMode,
    p: &PerfParams,
    opts: RdmaHostOptions,
) -> Result<Report, AppError> {
    let addr = trid.cm_addr();
    match trid.trtype {
        HostTrType::Soft => run(
            factory::<pollux_verbs::soft::Soft>(addr, None, opts),
            cores.clone(),
            idle,
            p,
        ),
        #[cfg(feature = "ibverbs")]
        HostTrType::Rdma => run(
            factory::<pollux_verbs::ibv::Ibverbs>(addr, args.device.clone(), opts),
            cores.clone(),
            idle,
            p,
        ),
        #[cfg(not(feature = "ibverbs"))]
        HostTrType::Rdma => {
            let _ = &args.device;
            Err(AppError::Usage(
                "trtype:rdma needs the ibverbs feature (cargo build --features ibverbs); use trtype:soft".into(),
            ))
        }
        HostTrType::Tcp => {
            let ip: std::net::IpAddr = trid.traddr.parse().map_err(|_| {
                AppError::Usage(format!("traddr '{}' is not an IP address", trid.traddr))
            })?;
            let port: u16 = trid.trsvcid.parse().map_err(|_| {
                AppError::Usage(format!("trsvcid '{}' is not a port", trid.trsvcid))
            })?;
            let topts = TcpHostOptions {
                header_digest: args.hdr_digest,
                data_digest: args.data_digest,
                connect_timeout: opts.connect_timeout,
            };
            let addr = std::net::SocketAddr::new(ip, port);
            let f: TransportFactory<TcpHost> =
                Arc::new(move || Ok(TcpHost::new(addr, topts.clone())));
            run(f, cores.clone(), idle, p)
        }
        HostTrType::Loop => Err(AppError::Usage(
            "trtype:loop works only in-process (tests)".into(),
        )),
    }
}

/// The iSER path (`-r 'trtype:iser …'`): `pollux_apps::perf::iser`.
fn iser_main(args: &Args, trid: &str) -> Result<ExitCode, AppError> {
    if args.spawn_target.is_some() {
        return Err(AppError::Usage(
            "--spawn-target serves NVMe-oF only; start pollux-tgt with an [iscsi] section".into(),
        ));
    }
    iser::main(&iser::IserCli {
        trid: trid.to_string(),
        pi: args.pi.clone(),
        pi_software: pi_software(&args.pi_engine)?,
        queue_depth: args.queue_depth,
        io_size: parse_io_size(&args.io_size)?,
        workload: args.workload.clone(),
        read_pct: args.read_pct,
        duration: secs("-t", args.seconds)?,
        warmup: secs("-a", args.warmup)?,
        verify: args.verify,
        device: args.device.clone(),
        target_stats: args.target_stats.clone(),
        sweep: args.sweep,
        sweep_pi: args.sweep_pi.clone(),
        json: args.json,
        cores: args.reactors.cores()?,
        idle: args.reactors.idle_mode()?,
    })
}

fn real_main(args: &Args) -> Result<ExitCode, AppError> {
    if let Some(t) = args.trid.as_deref().filter(|t| iser::is_iser(t)) {
        return iser_main(args, t);
    }
    let mut tgt = match &args.spawn_target {
        Some(spec) => {
            let cores = Cores::parse(&args.target_cores)
                .map_err(|e| AppError::Usage(format!("--target-cores: {e}")))?;
            Some(SpawnedTarget::start(spec, cores)?)
        }
        None => None,
    };
    let text = match (&args.trid, &tgt) {
        (Some(t), _) => t.clone(),
        (None, Some(t)) => t.trid(),
        (None, None) => {
            return Err(AppError::Usage(
                "-r TRID or --spawn-target BDEV is required".into(),
            ))
        }
    };
    let res = real_run(args, &text, tgt.as_ref());
    if let Some(t) = tgt.as_mut() {
        t.stop();
    }
    res
}

fn real_run(args: &Args, text: &str, tgt: Option<&SpawnedTarget>) -> Result<ExitCode, AppError> {
    let trid = HostTrid::parse(text).map_err(|e: HostError| AppError::Usage(e.to_string()))?;
    if (args.hdr_digest || args.data_digest) && trid.trtype != HostTrType::Tcp {
        return Err(AppError::Usage(
            "--hdr-digest and --data-digest apply to trtype:tcp only".into(),
        ));
    }
    let workload: Workload = args
        .workload
        .parse()
        .map_err(|e| AppError::Usage(format!("{e}")))?;
    if workload == Workload::Verify {
        return Err(AppError::Usage(
            "use --verify with a write or rw workload".into(),
        ));
    }
    let mem = MemMode::parse(&args.mem).map_err(|e| AppError::Usage(e.to_string()))?;
    let remote_invalidate = match args.remote_invalidation.as_str() {
        "on" => true,
        "off" => false,
        o => {
            return Err(AppError::Usage(format!(
                "--remote-invalidation '{o}': on or off"
            )))
        }
    };
    let cores = args.reactors.cores()?;
    let idle = args.reactors.idle_mode()?;
    let mut p = PerfParams {
        trid: trid.clone(),
        queue_depth: args.queue_depth,
        io_size: parse_io_size(&args.io_size)?,
        workload,
        read_pct: args.read_pct,
        duration: secs("-t", args.seconds)?,
        warmup: secs("-a", args.warmup)?,
        qpairs_per_ns: args.qpairs.max(1),
        verify: args.verify,
        inline_cap: args.inline_size,
        kato: secs("--kato", args.kato)?,
        io_timeout: secs("--io-timeout", args.io_timeout)?,
        reconnect_delay: secs("--reconnect-delay", args.reconnect_delay)?,
        ctrl_loss_tmo: secs("--ctrl-loss-tmo", args.ctrl_loss_tmo)?,
        pi: args
            .pi
            .parse::<HostPi>()
            .map_err(|e| AppError::Usage(format!("--pi: {e}")))?,
        pi_software: pi_software(&args.pi_engine)?,
    };
    if args.sweep {
        let modes = SweepMode::parse_list(&args.sweep_modes)?;
        let mut rows = Vec::new();
        let mut failed = false;
        for bs in SWEEP_SIZES {
            let mut cells = Vec::new();
            for m in &modes {
                p.io_size = bs;
                p.inline_cap = if m.inline { args.inline_size } else { Some(0) };
                let opts = RdmaHostOptions {
                    mem_mode: m.mem,
                    remote_invalidate: m.remote_invalidate,
                    ..RdmaHostOptions::default()
                };
                match run_once(args, &trid, &cores, idle, &p, opts, tgt) {
                    Ok(r) => {
                        let (cell, bad) = sweep::cell_of(&r);
                        failed |= bad;
                        cells.push(cell);
                    }
                    Err(e) => {
                        eprintln!("pollux-perf: {bs} B, {}: {e}", m.name);
                        failed = true;
                        cells.push(None);
                    }
                }
            }
            rows.push((bs, cells));
        }
        if args.json {
            let cols: Vec<&str> = modes.iter().map(|m| m.name.as_str()).collect();
            println!("{}", sweep::to_json(&cols, &rows));
        } else {
            println!(
                "IOPS/host CPU% per block size and mode ({} to {}, -q {} -w {}, {} s each)",
                trid.trtype_name(),
                trid.subnqn,
                p.queue_depth,
                args.workload,
                args.seconds
            );
            print!("{}", sweep::table(&modes, &rows));
        }
        return Ok(if failed {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        });
    }
    let opts = RdmaHostOptions {
        mem_mode: mem,
        remote_invalidate,
        ..RdmaHostOptions::default()
    };
    let report = run_once(args, &trid, &cores, idle, &p, opts, tgt)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        let _ = writeln!(out, "{}", report.to_json());
    } else {
        let _ = writeln!(
            out,
            "{} {}: -q {} -o {} -w {} mem {} remote-invalidation {}",
            trid.trtype_name(),
            trid.subnqn,
            p.queue_depth,
            p.io_size,
            args.workload,
            mem,
            args.remote_invalidation
        );
        let _ = write!(out, "{}", report.to_table());
    }
    let bad = report.total.errors + report.total.miscompares;
    Ok(if bad > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// `--pi-engine`: whether PI must stay in software.
fn pi_software(engine: &str) -> Result<bool, AppError> {
    match engine {
        "auto" => Ok(false),
        "software" => Ok(true),
        o => Err(AppError::Usage(format!(
            "--pi-engine '{o}': auto or software"
        ))),
    }
}
