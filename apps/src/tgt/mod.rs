//! `pollux-tgt`: the NVMe-oF target (RDMA and TCP) as an application.
//!
//! [`config`] parses and checks the TOML file into a [`TgtPlan`];
//! [`build`] creates the bdevs, the [`Target`] with its subsystems,
//! namespaces and listeners, and its transports (RDMA, and NVMe/TCP when
//! a listener or `[transport.tcp]` asks for it); [`serve`] launches one
//! reactor per core and starts every transport's poll group there through
//! the target core ([`Target::start_poll_groups`]: the serve path names no
//! transport), prints what it serves, writes the stats file every second
//! if asked, and
//! on the stop flag (SIGINT/SIGTERM in the binary) shuts the poll groups
//! down (hosts see a clean disconnect), stops and joins the reactors.
//! Once the reactors run, [`rpc`] builds the JSON-RPC method registry,
//! applies the `--json` file and serves JSON-RPC on `-r SOCK` until the
//! stop. On the reload flag (SIGHUP in the binary) it re-reads the
//! configuration file and applies its subsystems, hosts, listeners and
//! namespaces through that registry's methods, creating new bdevs;
//! connected hosts get a Namespace Attribute Changed event and keep their
//! connections ([`reload`] says what a reload applies and what needs a
//! restart).
//!
//! # The stats file (reactor busy %)
//!
//! With `--stats-file PATH` the target replaces `PATH` (write + rename,
//! so a reader never sees half a file) once when it is ready and then
//! every second with one JSON object:
//!
//! ```json
//! { "uptime_s": 12.0, "cores": [0], "busy_pct": [97.1], "busy_pct_total": [88.0],
//!   "busy_ns": [..], "idle_ns": [..], "loops": [..], "busy_loops": [..],
//!   "sleeps": [..], "idle_stretch_ns": [..],
//!   "connections": 2, "connections_per_core": [2],
//!   "accepted": 2, "rejected": 0, "destroyed": 0, "recv_memory_bytes": 16908288,
//!   "controllers": 1, "controllers_created": 1, "keep_alives": 4,
//!   "keep_alive_timeouts": 0, "connect_timeouts": 0, "async_events": 1 }
//! ```
//!
//! `connections_per_core` is each core's poll group's live queues (new
//! queues go to the group with the fewest), in the order of `cores`.
//! `busy_pct` is per core over the last period, `busy_pct_total` since
//! start; `busy_ns`/`idle_ns` are the reactors' cumulative counters, so a
//! reader can take two samples and compute busy % over its own window;
//! `loops`/`busy_loops` count each reactor's loops and those that did work
//! (over a window, loops per I/O: how many I/Os one loop carries);
//! `sleeps` counts the times each reactor slept (`--idle adaptive` or
//! `hybrid`) and `idle_stretch_ns` is the hybrid mode's moving average of
//! the time from one busy loop to the next (0 otherwise).
//! `controllers` is the live NVMe controllers (discovery included);
//! `controllers_created`, `keep_alives` (Keep Alive commands answered),
//! `keep_alive_timeouts` (controllers torn down because no Keep Alive came
//! within KATO) and `async_events` (AERs completed with an event) count
//! since start, summed over the subsystems; `connect_timeouts` counts the
//! queues dropped because no Fabrics Connect completed on them within
//! `connect_timeout_ms`. With an `[iscsi]` section,
//! `iscsi_connections_per_core` is each core's iSER poll group's live
//! connections, like `connections_per_core`, and `iscsi_nop_timeouts`
//! counts the connections dropped because their initiator left a NOP-In
//! ping unanswered for `nop_timeout`.

#![forbid(unsafe_code)]

pub mod config;
pub mod fd_limit;
pub mod iscsi;
pub mod json_sizing;
pub mod reload;
pub mod rpc;

use std::cell::RefCell;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use pollux_bdev::BdevRegistry;
use pollux_nvmf::target::rdma::{cm_addr, RdmaTransport};
use pollux_nvmf::target::tcp::TcpTransport;
use pollux_nvmf::target::{
    CtrlCounterSnapshot, NamespaceConfig, Target, TransportPollGroup, DISCOVERY_NQN,
};
use pollux_reactor::{launch, CoreId, Cores, IdleMode, LaunchConfig, ReactorSet, ReactorStats};
use pollux_verbs::Provider;

pub use self::config::{ProviderKind, TgtPlan};
use crate::AppError;

/// How long a reactor may take to answer a control message.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the shutdown waits for the hosts' queues to close.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// The target's objects, before the reactors start.
pub struct Built<P: Provider> {
    /// The bdevs (shared with the JSON-RPC methods).
    pub registry: Arc<BdevRegistry>,
    /// The target core.
    pub target: Arc<Target>,
    /// The RDMA transport (added to the target).
    pub transport: Arc<RdmaTransport<P>>,
    /// The NVMe/TCP transport (added to the target), when configured.
    pub tcp: Option<Arc<TcpTransport>>,
    /// The iSCSI target and its iSER transport (`[iscsi]`).
    pub iscsi: Option<iscsi::IscsiBuilt<P>>,
    /// What the file said, when the target was built, of what only a
    /// restart changes (a reload names a difference and leaves it).
    pub started_with: StartedWith,
}

/// The parts of a configuration that only a restart changes, as the
/// running target was built from them.
#[derive(Debug, Clone)]
pub struct StartedWith {
    /// `cores` of the file.
    pub cores: Option<Cores>,
    /// `provider`.
    pub provider: config::ProviderKind,
    /// The `[iscsi]` section.
    pub iscsi: Option<iscsi::IscsiPlan>,
}

impl<P: Provider> std::fmt::Debug for Built<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Built")
            .field("target", &self.target)
            .finish()
    }
}

/// Creates the bdevs, the target, its transport, subsystems, namespaces
/// and listeners (control path; no reactor runs yet).
///
/// # Errors
///
/// [`AppError::Config`] naming the line and field of what failed (a bdev
/// that cannot be created, a namespace the core refuses, an option
/// combination); [`AppError::Setup`] for anything else.
pub fn build<P: Provider>(plan: &TgtPlan) -> Result<Built<P>, AppError> {
    let registry = Arc::new(BdevRegistry::new());
    for b in &plan.bdevs {
        registry.create_from(&b.spec).map_err(|e| {
            b.origin
                .err(format!("cannot create bdev '{}': {e}", b.name))
        })?;
    }
    let target = Target::new(plan.target.clone()).map_err(|e| plan.option_error(e))?;
    let transport =
        RdmaTransport::<P>::new(&target, plan.rdma.clone()).map_err(|e| plan.option_error(e))?;
    target
        .add_transport(transport.clone())
        .map_err(|e| AppError::Setup(e.to_string()))?;
    let tcp = match &plan.tcp {
        Some(o) => {
            let t = TcpTransport::new(&target, o.clone()).map_err(|e| plan.option_error(e))?;
            target
                .add_transport(t.clone())
                .map_err(|e| AppError::Setup(e.to_string()))?;
            Some(t)
        }
        None => None,
    };
    for s in &plan.subsystems {
        let sub = target
            .add_subsystem(s.config.clone())
            .map_err(|e| s.origin.err(e))?;
        for n in &s.namespaces {
            let bdev = registry
                .get(&n.bdev)
                .ok_or_else(|| n.origin.err(format!("no bdev named '{}'", n.bdev)))?;
            sub.add_namespace(NamespaceConfig::new(bdev).with_nsid(n.nsid))
                .map_err(|e| n.origin.err(e))?;
        }
    }
    // The discovery subsystem listens on the top-level listeners (so
    // they open with no subsystem too), each subsystem on its own and them.
    for l in &plan.listeners {
        target
            .add_subsystem_listener(DISCOVERY_NQN, l.trid.clone())
            .map_err(|e| l.origin.err(e))?;
    }
    for s in &plan.subsystems {
        for l in plan.listeners_of(s) {
            target
                .add_subsystem_listener(&s.config.nqn, l.trid.clone())
                .map_err(|e| l.origin.err(e))?;
        }
    }
    let iscsi = match &plan.iscsi {
        Some(p) => Some(iscsi::build::<P>(p, &registry)?),
        None => None,
    };
    Ok(Built {
        registry,
        target,
        transport,
        tcp,
        iscsi,
        started_with: StartedWith {
            cores: plan.cores.clone(),
            provider: plan.provider,
            iscsi: plan.iscsi.clone(),
        },
    })
}

/// How to run.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Reactor cores.
    pub cores: Cores,
    /// Idle policy.
    pub idle: IdleMode,
    /// Where to write the stats JSON (see the module docs).
    pub stats_file: Option<PathBuf>,
    /// How often to write it (and check the reactors are alive).
    pub stats_period: Duration,
    /// Reload the configuration file when asked (SIGHUP in the binary).
    pub reload: Option<ReloadOn>,
    /// JSON-RPC server and `--json` file ([`rpc`]); `None`: neither.
    pub rpc: Option<rpc::RpcOptions>,
}

/// When and what to reload (see [`reload`]): the serve loop re-reads
/// `path` each time `flag` turns true, and clears it.
#[derive(Debug, Clone)]
pub struct ReloadOn {
    /// The configuration file.
    pub path: PathBuf,
    /// Set (by a signal handler) to ask for a reload.
    pub flag: Arc<AtomicBool>,
}

/// What a finished run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServeSummary {
    /// Connections accepted.
    pub accepted: u64,
    /// Connections torn down.
    pub destroyed: u64,
    /// Queues still open when the drain gave up (0 on a clean shutdown).
    pub left_open: usize,
}

thread_local! {
    /// This reactor's poll groups, one per transport (set by `init`, taken
    /// before the stop).
    static GROUPS: RefCell<Vec<Rc<dyn TransportPollGroup>>> = const { RefCell::new(Vec::new()) };
}

/// The reactors' poll group lists, for transports made by JSON-RPC calls
/// (their groups are shut down and dropped with the others).
struct TgtGroups;

impl pollux_rpc::nvmf::CoreGroups for TgtGroups {
    fn keep(&self, _r: &pollux_reactor::Reactor, group: Rc<dyn TransportPollGroup>) {
        GROUPS.with(|g| g.borrow_mut().push(group));
    }

    fn release(&self, _r: &pollux_reactor::Reactor, transport: &'static str) {
        GROUPS.with(|g| pollux_rpc::nvmf::release_groups(g, transport));
    }

    fn connections(&self, _r: &pollux_reactor::Reactor) -> Vec<(&'static str, usize)> {
        GROUPS.with(pollux_rpc::nvmf::group_connections)
    }

    fn disconnect_listener(
        &self,
        _r: &pollux_reactor::Reactor,
        trid: &pollux_nvmf::spec::transport_id::TransportId,
        subnqn: Option<&str>,
    ) -> usize {
        GROUPS.with(|g| pollux_rpc::nvmf::disconnect_from(g, trid, subnqn))
    }

    fn apply_listeners(
        &self,
        _r: &pollux_reactor::Reactor,
    ) -> Result<(), pollux_rpc::nvmf::ListenerError> {
        GROUPS.with(pollux_rpc::nvmf::apply_listeners_in)
    }
}

/// Runs `f` with this core's poll groups on every reactor; answers in core order.
fn ask_all<T: Send + 'static>(
    set: &ReactorSet,
    f: fn(&[Rc<dyn TransportPollGroup>]) -> T,
) -> Result<Vec<T>, AppError> {
    let mut out = Vec::with_capacity(set.cores().len());
    for &core in set.cores() {
        let (tx, rx) = mpsc::sync_channel(1);
        set.messenger()
            .send_blocking(core, move |_| {
                let v = GROUPS.with(|g| f(&g.borrow()));
                let _ = tx.send(v);
            })
            .map_err(|e| AppError::Reactor(format!("core {core}: {e}")))?;
        out.push(
            rx.recv_timeout(ASK_TIMEOUT)
                .map_err(|_| AppError::Reactor(format!("core {core} did not answer")))?,
        );
    }
    Ok(out)
}

/// Drops every core's poll group on its own core (best effort).
fn drop_groups(set: &ReactorSet) {
    for &core in set.cores() {
        let (tx, rx) = mpsc::sync_channel(1);
        let sent = set.messenger().send_blocking(core, move |_| {
            let g = GROUPS.with(|g| std::mem::take(&mut *g.borrow_mut()));
            drop(g);
            let _ = tx.send(());
        });
        if sent.is_ok() {
            let _ = rx.recv_timeout(ASK_TIMEOUT);
        }
    }
}

/// Builds the target of `plan`, serves it on `opts.cores` until `stop`
/// turns true, then shuts down cleanly. The banner and the shutdown lines
/// go to `out`.
///
/// # Errors
///
/// [`AppError::Config`] as [`build`]; [`AppError::Setup`] when a poll
/// group cannot be created (a listener that cannot bind names itself);
/// [`AppError::Reactor`] when reactors fail to start or stop answering.
pub fn serve<P: Provider>(
    plan: &TgtPlan,
    opts: &ServeOptions,
    stop: &AtomicBool,
    out: &mut dyn Write,
) -> Result<ServeSummary, AppError> {
    let built = build::<P>(plan)?;
    let (tx, rx) = mpsc::channel::<Result<CoreId, String>>();
    let target = Arc::clone(&built.target);
    let iser = built.iscsi.clone();
    let mut lc = LaunchConfig::new(opts.cores.clone());
    lc.idle = opts.idle;
    let set = launch(lc, move |r| {
        let res = match target.start_poll_groups(r) {
            Ok(groups) => {
                GROUPS.with(|g| *g.borrow_mut() = groups);
                Ok(r.core())
            }
            Err(e) => Err(format!("core {}: {e}", r.core())),
        };
        let res = match &iser {
            Some(i) => res.and_then(|c| iscsi::start_group(i, r).map(|()| c)),
            None => res,
        };
        let _ = tx.send(res);
    })
    .map_err(|e| AppError::Reactor(e.to_string()))?;
    let res = run(plan, opts, &built, &set, &rx, stop, out);
    // Whatever happened: drop the groups on their cores, then stop.
    drop_groups(&set);
    iscsi::drop_groups(&set);
    set.stop_all();
    let joined = set.join().map_err(|e| AppError::Reactor(e.to_string()));
    let summary = res?;
    joined?;
    let _ = writeln!(
        out,
        "pollux-tgt: stopped ({} connection(s) accepted, {} closed)",
        summary.accepted, summary.destroyed
    );
    let _ = out.flush();
    Ok(summary)
}

fn run<P: Provider>(
    plan: &TgtPlan,
    opts: &ServeOptions,
    built: &Built<P>,
    set: &ReactorSet,
    rx: &mpsc::Receiver<Result<CoreId, String>>,
    stop: &AtomicBool,
    out: &mut dyn Write,
) -> Result<ServeSummary, AppError> {
    for _ in set.cores() {
        match rx.recv_timeout(ASK_TIMEOUT) {
            Ok(Ok(_)) => {}
            Ok(Err(msg)) => {
                // A listener that cannot bind names its address: place it.
                let l = plan
                    .all_listeners()
                    .into_iter()
                    .find(|l| msg.contains(&cm_addr(&l.trid).to_string()));
                return Err(match l {
                    Some(l) => l.origin.err(msg),
                    None => AppError::Setup(msg),
                });
            }
            Err(_) => return Err(AppError::Reactor("a reactor did not start".into())),
        }
    }
    // Listeners open in the first poll group created; check they all did.
    let listening: usize = ask_all(set, |g| g.iter().map(|g| g.listeners()).sum::<usize>())?
        .into_iter()
        .sum();
    let want = plan.all_listeners().len();
    if listening != want {
        return Err(AppError::Setup(format!(
            "{listening} of {want} listener(s) open"
        )));
    }
    if let (Some(p), Some(i)) = (&plan.iscsi, &built.iscsi) {
        iscsi::listen(p, i, set)?;
    }
    // Stopped (socket closed) when `run` returns, before the reactors stop.
    let (svc, _rpc) = rpc::start(
        opts.rpc.as_ref(),
        &built.registry,
        &built.target,
        Arc::new(TgtGroups),
        built.iscsi.as_ref().map(|i| {
            let portals: Arc<dyn pollux_rpc::iscsi::PortalListener> =
                Arc::new(iscsi::IserPortals(Arc::clone(&i.transport)));
            (Arc::clone(&i.target), portals)
        }),
        set,
        out,
    )?;
    let first = set.stats().map_err(|e| AppError::Reactor(e.to_string()))?;
    let started = Instant::now();
    let mut prev = first.clone();
    // The stats file exists before the banner says `ready`.
    if let Some(p) = &opts.stats_file {
        write_stats(p, started, &first, &first, &first, set, built)?;
    }
    banner(plan, opts, built, out).map_err(|e| AppError::Setup(format!("stdout: {e}")))?;
    let iser_max = built
        .iscsi
        .as_ref()
        .map_or(0, |i| i.transport.options().max_connections);
    let tcp_max = built.tcp.as_ref().map_or(0, |t| t.options().max_qpairs);
    let what = match (tcp_max > 0, iser_max > 0) {
        (false, false) => "max_qpairs",
        (true, false) => "max_qpairs (RDMA and TCP)",
        (false, true) => "max_qpairs and the iSCSI max_connections",
        (true, true) => "max_qpairs (RDMA and TCP) and the iSCSI max_connections",
    };
    fd_limit::warn_if_short(
        out,
        what,
        &[
            (
                (built.transport.options().max_qpairs + iser_max) as u64,
                fd_limit::fds_per_connection(plan.provider == config::ProviderKind::Soft),
            ),
            (tcp_max as u64, fd_limit::FDS_PER_TCP_CONNECTION),
        ],
        fd_limit::current_limit(),
    );
    let mut next = Instant::now() + opts.stats_period;
    while !stop.load(Ordering::SeqCst) {
        if let Some(r) = &opts.reload {
            if r.flag.swap(false, Ordering::SeqCst) {
                let _ = match reload::reload(&r.path, built, &svc) {
                    Ok(rep) => writeln!(out, "pollux-tgt: reloaded {}: {rep}", r.path.display()),
                    Err(e) => writeln!(
                        out,
                        "pollux-tgt: reload of {} failed (the rest is unchanged): {e}",
                        r.path.display()
                    ),
                };
                let _ = out.flush();
            }
        }
        let now = Instant::now();
        if now >= next {
            let cur = set.stats().map_err(|e| AppError::Reactor(e.to_string()))?;
            if let Some(p) = &opts.stats_file {
                write_stats(p, started, &first, &prev, &cur, set, built)?;
            }
            prev = cur;
            next += opts.stats_period;
            continue;
        }
        std::thread::sleep((next - now).min(Duration::from_millis(20)));
    }
    let conns: usize = ask_all(set, connections)?.into_iter().sum();
    let _ = writeln!(
        out,
        "pollux-tgt: shutting down: disconnecting {conns} queue(s)"
    );
    let _ = out.flush();
    ask_all(set, |g| g.iter().for_each(|g| g.shutdown()))?;
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    let left_open = loop {
        let open: usize = ask_all(set, connections)?.into_iter().sum();
        if open == 0 || Instant::now() >= deadline {
            break open;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    if left_open > 0 {
        eprintln!(
            "pollux-tgt: {left_open} queue(s) did not close in {DRAIN_TIMEOUT:?}; stopping anyway"
        );
    }
    let left_open = match &built.iscsi {
        Some(i) => left_open + iscsi::shutdown(set, i, out)?,
        None => left_open,
    };
    let t = built.target.transport_stats();
    Ok(ServeSummary {
        accepted: t.accepted,
        destroyed: t.destroyed,
        left_open,
    })
}

/// Live connections of this core's poll groups (every transport).
fn connections(g: &[Rc<dyn TransportPollGroup>]) -> usize {
    g.iter().map(|g| g.connections()).sum()
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Prints what the target serves: cores, provider, transport options,
/// receive-buffer memory, subsystems with their namespaces, listeners.
fn banner<P: Provider>(
    plan: &TgtPlan,
    opts: &ServeOptions,
    built: &Built<P>,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let t = &plan.target;
    let r = built.transport.options();
    let st = built.transport.stats();
    let names: Vec<&str> = built.target.transports().iter().map(|t| t.name()).collect();
    writeln!(
        out,
        "pollux-tgt: NVMe-oF target ({}), provider {}, cores {}",
        names.join(", "),
        plan.provider.name(),
        opts.cores
    )?;
    writeln!(
        out,
        "  transport: max_queue_depth {} max_io_size {} io_unit_size {} in_capsule_data_size {} num_shared_buffers {} buf_cache_size {}",
        t.max_queue_depth, t.max_io_size, t.io_unit_size, t.in_capsule_data_size, t.num_data_buffers, t.buffer_cache_size
    )?;
    writeln!(
        out,
        "             {} max_srq_depth {} num_cqe {} send_with_invalidate {} max_read_depth {}{}",
        if r.no_srq { "no_srq" } else { "srq" },
        r.max_srq_depth,
        r.num_cqe,
        r.send_with_invalidate,
        r.max_read_depth,
        r.device
            .as_deref()
            .map(|d| format!(" device {d}"))
            .unwrap_or_default()
    )?;
    if let Some(tcp) = &built.tcp {
        let o = tcp.options();
        writeln!(
            out,
            "  tcp: in_capsule_data_size {} max_queue_depth {} max_io_qpairs_per_ctrlr {} c2h_success {} sock_priority {} digest {:?} maxh2cdata {}",
            o.in_capsule_data_size, o.max_queue_depth, o.max_io_qpairs_per_ctrlr, o.c2h_success, o.sock_priority, o.digest, o.maxh2cdata
        )?;
        writeln!(
            out,
            "  tcp limits: max_qpairs {} max_qpairs_per_core {} (more are refused: Connect Controller Busy)",
            o.max_qpairs, o.max_qpairs_per_core
        )?;
        match &o.keepalive {
            Some(k) => writeln!(
                out,
                "  tcp keepalive: idle {} s, a probe every {} s, {} probes",
                k.idle.as_secs(),
                k.interval.as_secs(),
                k.probes
            )?,
            None => writeln!(out, "  tcp keepalive: off")?,
        }
    }
    writeln!(
        out,
        "  limits: max_qpairs {} max_qpairs_per_core {} (more are rejected: no resources); num_slot_buffers {}",
        r.max_qpairs, r.max_qpairs_per_core, t.num_slot_buffers
    )?;
    writeln!(
        out,
        "  receive buffers: {:.1} MiB ({} bytes) in {} poll group(s); shared data buffers: {:.1} MiB",
        mib(st.recv_memory_bytes),
        st.recv_memory_bytes,
        opts.cores.len(),
        mib(t.num_data_buffers as u64 * u64::from(t.io_unit_size)),
    )?;
    for s in &plan.subsystems {
        let c = &s.config;
        let hosts = if c.allow_any_host {
            "any host".to_string()
        } else {
            format!("hosts {}", c.hosts.join(", "))
        };
        writeln!(
            out,
            "  subsystem {} (serial {}, model {}, {hosts})",
            c.nqn, c.serial, c.model
        )?;
        let Some(sub) = built.target.subsystem(&c.nqn) else {
            continue;
        };
        for ns in sub.namespaces() {
            let b = ns.bdev();
            writeln!(
                out,
                "    namespace {}: bdev {} ({}, {} blocks of {} bytes, {:.1} MiB)",
                ns.nsid(),
                b.name(),
                b.info().product(),
                ns.num_blocks(),
                ns.block_size(),
                mib(ns.num_blocks() * u64::from(ns.block_size()))
            )?;
        }
    }
    for l in built.target.listeners() {
        writeln!(
            out,
            "  listener {} (trtype {}, portid {}, adrfam {:?})",
            cm_addr(&l.trid),
            if l.trid.trtype == pollux_nvmf::spec::transport_id::TrType::Tcp {
                "tcp"
            } else {
                "rdma"
            },
            l.portid,
            l.trid.adrfam
        )?;
        for s in &plan.subsystems {
            if !plan.listeners_of(s).iter().any(|x| x.trid == l.trid) {
                continue;
            }
            writeln!(
                out,
                "    host: -r '{}'",
                config::host_trid(plan.provider, &l.trid, &s.config.nqn)
            )?;
        }
    }
    if let (Some(p), Some(i)) = (&plan.iscsi, &built.iscsi) {
        iscsi::banner(p, plan.provider, i, out)?;
    }
    if let Some(p) = &opts.stats_file {
        writeln!(
            out,
            "  stats file: {} (every {:?})",
            p.display(),
            opts.stats_period
        )?;
    }
    writeln!(
        out,
        "pollux-tgt: ready (pid {}; SIGINT or SIGTERM stops it)",
        std::process::id()
    )?;
    out.flush()
}

fn pct(busy: u64, idle: u64) -> f64 {
    let total = busy.saturating_add(idle);
    if total == 0 {
        0.0
    } else {
        (busy as f64 * 1000.0 / total as f64).round() / 10.0
    }
}

fn write_stats<P: Provider>(
    path: &Path,
    started: Instant,
    first: &[ReactorStats],
    prev: &[ReactorStats],
    cur: &[ReactorStats],
    set: &ReactorSet,
    built: &Built<P>,
) -> Result<(), AppError> {
    let interval: Vec<f64> = cur
        .iter()
        .zip(prev)
        .map(|(c, p)| {
            pct(
                c.busy_ns.saturating_sub(p.busy_ns),
                c.idle_ns.saturating_sub(p.idle_ns),
            )
        })
        .collect();
    let total: Vec<f64> = cur
        .iter()
        .zip(first)
        .map(|(c, f)| {
            pct(
                c.busy_ns.saturating_sub(f.busy_ns),
                c.idle_ns.saturating_sub(f.idle_ns),
            )
        })
        .collect();
    let per_core: Vec<usize> = ask_all(set, connections)?;
    let conns: usize = per_core.iter().sum();
    let t = built.target.transport_stats();
    let recv_memory = built.transport.stats().recv_memory_bytes;
    let mut ctl = CtrlCounterSnapshot::default();
    let mut live = 0usize;
    let disc = Arc::clone(built.target.discovery_subsystem());
    for sub in built.target.subsystems().into_iter().chain([disc]) {
        ctl.add(&sub.counters().snapshot());
        live += sub.controller_count();
    }
    let mut v = serde_json::json!({
        "uptime_s": (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
        "cores": cur.iter().map(|s| s.core).collect::<Vec<_>>(),
        "busy_pct": interval,
        "busy_pct_total": total,
        "busy_ns": cur.iter().map(|s| s.busy_ns).collect::<Vec<_>>(),
        "idle_ns": cur.iter().map(|s| s.idle_ns).collect::<Vec<_>>(),
        "loops": cur.iter().map(|s| s.loops).collect::<Vec<_>>(),
        "busy_loops": cur.iter().map(|s| s.busy_loops).collect::<Vec<_>>(),
        "sleeps": cur.iter().map(|s| s.sleeps).collect::<Vec<_>>(),
        "idle_stretch_ns": cur.iter().map(|s| s.idle_stretch_ns).collect::<Vec<_>>(),
        "connections": conns,
        "connections_per_core": per_core,
        "accepted": t.accepted,
        "rejected": t.rejected,
        "destroyed": t.destroyed,
        "recv_memory_bytes": recv_memory,
        "controllers": live,
        "controllers_created": ctl.controllers_created,
        "keep_alives": ctl.keep_alives,
        "keep_alive_timeouts": ctl.keep_alive_timeouts,
        "connect_timeouts": built.target.connect_timeouts(),
        "async_events": ctl.events,
    });
    if let Some(i) = &built.iscsi {
        v["iscsi_connections_per_core"] = serde_json::json!(iscsi::connections_per_core(set)?);
        v["iscsi_nop_timeouts"] = serde_json::json!(i.target.nop_timeouts());
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let io = |e: std::io::Error| AppError::Setup(format!("stats file {}: {e}", path.display()));
    std::fs::write(&tmp, format!("{v}\n")).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}
