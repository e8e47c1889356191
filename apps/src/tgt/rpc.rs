//! `pollux-tgt`'s management plane: the JSON-RPC server (`-r PATH`) and
//! SPDK JSON configuration files (`--json FILE`), over the target's own
//! bdev registry (see the `pollux_rpc` crate).
//!
//! Once the reactors run, [`start`] builds the method registry (the
//! framework's methods and one provider per subsystem: `bdev` over the
//! target's bdev registry, `nvmf` over the target core, whose transports
//! made by `nvmf_create_transport` keep their per-core poll groups with
//! the ones started at launch),
//! applies the `--json` file through it (the same calls a client makes;
//! unknown methods are reported by name and the target does not start),
//! then opens the socket. The socket closes before the reactors stop.
//! Without `-r`, the target listens on `/var/tmp/pollux.sock`; if that
//! default path cannot be used (another live process holds it, or it is
//! not ours to replace), it says so and runs without the server; an
//! explicit `-r PATH` that cannot be used is an error.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use pollux_bdev::BdevRegistry;
use pollux_iser::target::IscsiTarget;
use pollux_nvmf::target::{Target, TargetOptions};
use pollux_reactor::ReactorSet;
use pollux_rpc::bdev::BdevSubsystem;
use pollux_rpc::iscsi::{IscsiSubsystem, PortalError, PortalListener};
use pollux_rpc::nvmf::{CoreGroups, LocalGroups, NvmfSubsystem};
use pollux_rpc::{CoreBus, JsonConfig, RpcServer, RpcService, ServerConfig};

use crate::AppError;

/// The management options of `pollux-tgt`.
#[derive(Debug, Clone, Default)]
pub struct RpcOptions {
    /// The socket (`-r`); `None`: [`pollux_rpc::DEFAULT_SOCKET`], given up
    /// with a message when it cannot be used.
    pub socket: Option<PathBuf>,
    /// An SPDK JSON configuration to apply at start (`--json`).
    pub json: Option<PathBuf>,
}

/// The iSCSI target the `iscsi_*` methods manage, and how its portals open.
pub type IscsiParts = (Arc<IscsiTarget>, Arc<dyn PortalListener>);

/// The method registry of `target`, whose bdevs live in `registry`;
/// transports made by calls keep their poll groups in `groups`; the
/// `iscsi_*` methods exist when the target serves iSCSI (`iscsi`).
///
/// # Errors
///
/// [`AppError::Setup`] if the providers do not register (a bug).
pub fn service(
    registry: &Arc<BdevRegistry>,
    target: &Arc<Target>,
    groups: Arc<dyn CoreGroups>,
    iscsi: Option<IscsiParts>,
    cores: CoreBus,
) -> Result<RpcService, AppError> {
    let mut svc = RpcService::new(cores);
    let setup = |e: pollux_rpc::service::RegistryError| AppError::Setup(e.to_string());
    svc.register(BdevSubsystem::new(Arc::clone(registry)))
        .map_err(setup)?;
    svc.register(NvmfSubsystem::new(
        Arc::clone(target),
        Arc::clone(registry),
        groups,
    ))
    .map_err(setup)?;
    if let Some((t, portals)) = iscsi {
        svc.register(IscsiSubsystem::new(t, Arc::clone(registry), portals))
            .map_err(setup)?;
    }
    Ok(svc)
}

/// Portals of a registry that only checks method names: never opened.
struct NoPortals;

impl PortalListener for NoPortals {
    fn listen(&self, addr: &str, _tag: u16) -> Result<(), PortalError> {
        Err(PortalError::Other(format!("{addr}: checking only")))
    }

    fn stop_listen(&self, addr: &str) -> Result<(), PortalError> {
        Err(PortalError::Other(format!("{addr}: checking only")))
    }
}

/// Checks a `--json` file without applying it: it parses and every
/// method exists (the `iscsi_*` ones only when `with_iscsi`: the TOML file
/// has an `[iscsi]` section). Returns its number of calls.
///
/// # Errors
///
/// [`AppError::Config`] naming the file and the unknown methods.
pub fn check_json(path: &std::path::Path, with_iscsi: bool) -> Result<usize, AppError> {
    let cfg = JsonConfig::load(path).map_err(|e| AppError::Config(e.to_string()))?;
    let target =
        Target::new(TargetOptions::for_tests()).map_err(|e| AppError::Setup(e.to_string()))?;
    let svc = service(
        &Arc::new(BdevRegistry::new()),
        &target,
        Arc::new(LocalGroups),
        if with_iscsi {
            let t = IscsiTarget::new(pollux_iser::target::TargetOptions::default())
                .map_err(|e| AppError::Setup(e.to_string()))?;
            let none: Arc<dyn PortalListener> = Arc::new(NoPortals);
            Some((t, none))
        } else {
            None
        },
        CoreBus::none(),
    )?;
    let unknown = cfg.unknown_methods(&svc);
    if !unknown.is_empty() {
        return Err(AppError::Config(format!(
            "{}: unknown method(s) in the configuration: {}",
            path.display(),
            unknown.join(", ")
        )));
    }
    Ok(cfg.entries().count())
}

/// Builds the method registry (also without `-r`: a configuration
/// reload goes through it), applies the `--json` file and starts the
/// server (see the module docs).
///
/// # Errors
///
/// [`AppError::Config`] for a JSON file that does not load (nothing of it
/// is left), [`AppError::Setup`] when the socket cannot be opened.
pub fn start(
    opts: Option<&RpcOptions>,
    registry: &Arc<BdevRegistry>,
    target: &Arc<Target>,
    groups: Arc<dyn CoreGroups>,
    iscsi: Option<IscsiParts>,
    set: &ReactorSet,
    out: &mut dyn Write,
) -> Result<(Arc<RpcService>, Option<RpcServer>), AppError> {
    let svc = Arc::new(service(
        registry,
        target,
        groups,
        iscsi,
        CoreBus::new(set.messenger().clone()),
    )?);
    let Some(opts) = opts else {
        return Ok((svc, None));
    };
    if let Some(path) = &opts.json {
        let cfg = JsonConfig::load(path).map_err(|e| AppError::Config(e.to_string()))?;
        let n = cfg
            .apply(&svc)
            .map_err(|e| AppError::Config(format!("{}: {e}", path.display())))?;
        let _ = writeln!(out, "pollux-tgt: applied {} ({n} call(s))", path.display());
    }
    let path = opts
        .socket
        .clone()
        .unwrap_or_else(|| PathBuf::from(pollux_rpc::DEFAULT_SOCKET));
    match RpcServer::start(ServerConfig::new(&path), Arc::clone(&svc)) {
        Ok(server) => {
            let _ = writeln!(out, "pollux-tgt: JSON-RPC on {}", path.display());
            Ok((svc, Some(server)))
        }
        Err(e) if opts.socket.is_none() => {
            eprintln!("pollux-tgt: {e}; running without JSON-RPC (choose a socket with -r SOCK)");
            Ok((svc, None))
        }
        Err(e) => Err(AppError::Setup(e.to_string())),
    }
}
