//! `pollux-tgt`: the Pollux NVMe-oF RDMA target.
//!
//! ```text
//! pollux-tgt -c apps/config/tgt-null.toml [--cores 0 | -m 0x1] [--idle busy|adaptive[:US]]
//!            [--stats-file PATH] [--check] [-r SOCK] [--json FILE]
//! ```
//!
//! `-r SOCK` is the JSON-RPC socket (default `/var/tmp/pollux.sock`),
//! `--json FILE` an SPDK JSON configuration applied at start (after the
//! TOML file, if one is given; either may be given alone).
//!
//! It prints what it serves (transport options, receive-buffer memory,
//! subsystems, namespaces, listeners) and `pollux-tgt: ready` once hosts
//! can connect; SIGINT or SIGTERM disconnects the hosts cleanly, stops the
//! reactors and exits 0 (a second signal exits at once with status 1).
//! SIGHUP re-reads the configuration file and applies its subsystems,
//! hosts, listeners and namespaces (new bdevs; subsystems created or
//! deleted; hosts allowed or not; listeners opened or closed; namespaces
//! added, removed or replaced) through the JSON-RPC methods, without
//! disconnecting hosts, which get a Namespace Attribute Changed event; it
//! prints `pollux-tgt: reloaded FILE: ...` (or why the file was refused).
//! Transport options, cores and iSCSI need a restart.
//! Exit status 2: a bad command line or configuration (the message names
//! the line and the field); 1: the target failed at run time.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use pollux_apps::cli::ReactorArgs;
use pollux_apps::tgt::rpc::RpcOptions;
use pollux_apps::tgt::{self, ProviderKind, ReloadOn, ServeOptions, TgtPlan};
use pollux_apps::AppError;
use pollux_reactor::Cores;
use pollux_rpc::JsonConfig;

/// NVMe-oF RDMA target: serves the bdevs of a TOML configuration as
/// namespaces of NVMe subsystems over the soft RDMA provider (or ibverbs).
///
/// Signals: SIGINT/SIGTERM stop it cleanly. SIGHUP reloads the
/// configuration file: new bdevs are created; subsystems, hosts,
/// listeners and namespaces follow the file without disconnecting hosts
/// (they get a Namespace Attribute Changed event); transport options,
/// cores and iSCSI need a restart.
#[derive(Parser, Debug)]
#[command(name = "pollux-tgt", version)]
struct Args {
    /// The configuration file (TOML; see apps/config/tgt-null.toml).
    #[arg(
        short = 'c',
        long,
        value_name = "FILE",
        required_unless_present = "json"
    )]
    config: Option<PathBuf>,
    /// The JSON-RPC socket (SPDK's -r) [default: /var/tmp/pollux.sock].
    #[arg(short = 'r', long = "rpc-socket", value_name = "SOCK")]
    rpc_socket: Option<PathBuf>,
    /// An SPDK JSON configuration (subsystems -> config -> method/params)
    /// applied through the JSON-RPC methods at start.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    #[command(flatten)]
    reactors: ReactorArgs,
    /// Write the reactors' busy % and connection counters as JSON to PATH
    /// once when ready and then every second.
    #[arg(long, value_name = "PATH")]
    stats_file: Option<PathBuf>,
    /// Check the configuration, print what it would serve, and exit.
    #[arg(long)]
    check: bool,
}

fn main() -> ExitCode {
    pollux_apps::logging::init("pollux-tgt");
    let args = Args::parse();
    match real_main(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ (AppError::Config(_) | AppError::Usage(_))) => {
            eprintln!("pollux-tgt: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("pollux-tgt: {e}");
            ExitCode::from(1)
        }
    }
}

fn real_main(args: &Args) -> Result<(), AppError> {
    // Before anything slow, so an early signal is not lost: the first
    // SIGINT/SIGTERM sets the flag, a second one exits with status 1.
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register_conditional_shutdown(sig, 1, Arc::clone(&stop))
            .and_then(|_| signal_hook::flag::register(sig, Arc::clone(&stop)))
            .map_err(|e| AppError::Setup(format!("signal handler: {e}")))?;
    }
    let reload = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGHUP, Arc::clone(&reload))
        .map_err(|e| AppError::Setup(format!("signal handler: {e}")))?;
    let mut plan = match &args.config {
        Some(c) => TgtPlan::load(c)?,
        None => TgtPlan::parse("")?,
    };
    if let Some(j) = &args.json {
        let cfg = JsonConfig::load(j).map_err(|e| AppError::Config(e.to_string()))?;
        let set = tgt::json_sizing::size_from_json(&mut plan, &cfg);
        if !set.is_empty() {
            println!(
                "pollux-tgt: target options from {}: {}",
                j.display(),
                set.join(", ")
            );
        }
    }
    let cores = if args.reactors.cores.is_some() || args.reactors.mask.is_some() {
        args.reactors.cores()?
    } else {
        plan.cores.clone().unwrap_or_else(|| Cores::first(1))
    };
    let opts = ServeOptions {
        cores,
        idle: args.reactors.idle_mode()?,
        stats_file: args.stats_file.clone(),
        stats_period: Duration::from_secs(1),
        reload: args
            .config
            .clone()
            .map(|path| ReloadOn { path, flag: reload }),
        rpc: Some(RpcOptions {
            socket: args.rpc_socket.clone(),
            json: args.json.clone(),
        }),
    };
    if args.check {
        print_plan(&plan, &opts);
        if let Some(j) = &args.json {
            let n = tgt::rpc::check_json(j, plan.iscsi.is_some())?;
            println!(
                "  json config {}: {n} call(s), every method known",
                j.display()
            );
        }
        return Ok(());
    }
    let mut out = std::io::stdout();
    match plan.provider {
        ProviderKind::Soft => {
            tgt::serve::<pollux_verbs::soft::Soft>(&plan, &opts, &stop, &mut out)?;
        }
        #[cfg(feature = "ibverbs")]
        ProviderKind::Ibverbs => {
            tgt::serve::<pollux_verbs::ibv::Ibverbs>(&plan, &opts, &stop, &mut out)?;
        }
        #[cfg(not(feature = "ibverbs"))]
        ProviderKind::Ibverbs => {
            return Err(AppError::Config(
                "provider: built without the ibverbs feature".into(),
            ))
        }
    }
    Ok(())
}

fn print_plan(plan: &TgtPlan, opts: &ServeOptions) {
    println!(
        "pollux-tgt: configuration OK: provider {}, cores {}, {} bdev(s), {} subsystem(s), {} listener(s)",
        plan.provider.name(),
        opts.cores,
        plan.bdevs.len(),
        plan.subsystems.len(),
        plan.all_listeners().len()
    );
    for s in &plan.subsystems {
        println!("  subsystem {}", s.config.nqn);
        for n in &s.namespaces {
            println!("    namespace {}: bdev {}", n.nsid, n.bdev);
        }
    }
    for l in plan.all_listeners() {
        println!("  listener {}", pollux_nvmf::target::rdma::cm_addr(&l.trid));
    }
    if let Some(i) = &plan.iscsi {
        pollux_apps::tgt::iscsi::print_plan(i);
    }
}
