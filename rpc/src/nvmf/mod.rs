//! The `nvmf` subsystem: SPDK's NVMe-oF target methods over one
//! [`Target`] — `nvmf_create_transport`, `nvmf_get_transports`,
//! `nvmf_create_subsystem`, `nvmf_delete_subsystem`,
//! `nvmf_get_subsystems`, `nvmf_subsystem_add_ns|remove_ns`,
//! `nvmf_subsystem_add_listener|remove_listener`,
//! `nvmf_subsystem_add_host|remove_host`, `nvmf_subsystem_allow_any_host`,
//! `nvmf_subsystem_get_controllers|get_qpairs|get_listeners` and
//! `nvmf_get_stats`; SPDK's option methods `nvmf_set_config`,
//! `nvmf_set_max_subsystems` and `nvmf_set_crdt` are in [`options`].
//!
//! # How a change reaches the cores
//!
//! The target core's configuration is control-path state (subsystems,
//! namespaces and hosts behind their `Mutex`; the I/O queues see a
//! namespace change through the subsystem's namespace generation and
//! rebuild their view on their own core). A method changes that state,
//! then sends every core a reactor message and answers once each has run
//! it: every core has gone round its loop since the change, so the reply
//! never precedes a core still using the old view. A new transport's poll
//! group is started on every core by such a message ([`CoreGroups`] keeps
//! it there).
//!
//! # All or nothing
//!
//! Every argument is checked before anything changes; a step that can
//! still fail afterwards (a listener that cannot bind, a transport that
//! cannot start on some core) undoes what the method did before answering
//! with the error. Removing a namespace raises a Namespace Attribute
//! Changed event on the subsystem's controllers (the target core does it)
//! and touches nothing else; a bdev used by a namespace is not deleted
//! (`bdev_*_delete` answers -16).
//!
//! # Listeners
//!
//! A listener belongs to a subsystem, as in SPDK (the target core keeps
//! them: [`Target::add_subsystem_listener`]): a host connects to a
//! subsystem only through an address that subsystem listens on (a Connect
//! through another is refused, Connect Invalid Host), and the discovery
//! log lists each subsystem at its own listeners. The transport listens
//! on an address while any subsystem uses it: `nvmf_subsystem_add_listener`
//! opens it when no subsystem had it (every core's poll groups open what
//! they own before the reply: [`TransportPollGroup::apply_listeners`]);
//! `nvmf_subsystem_remove_listener` disconnects, on every core and before
//! the reply, the queues of that subsystem that came in through the
//! address and no other (each transport's poll group knows the listener
//! and subsystem of each of its queues:
//! [`TransportPollGroup::disconnect_listener`]; the queues drain and give
//! their resources back as after a host that hung up), and closes the
//! address when no subsystem uses it any more (then every queue still on
//! it goes). `nvmf_delete_subsystem` lets go of the subsystem's listeners
//! the same way. The discovery subsystem
//! (`nqn.2014-08.org.nvmexpress.discovery`) takes listeners too: an
//! address only it listens on serves discovery and nothing else (discovery
//! is served on every address the target listens on, as SPDK still
//! allows). SIGHUP reloads add and remove listeners through these same
//! methods.
//!
//! # Differences from SPDK, by design
//!
//! - `nvmf_delete_subsystem` refuses (-16) a subsystem that has connected
//!   controllers (SPDK disconnects them first).
//! - Only one target exists: `tgt_name`, when given, must be `nvmf_tgt`.
//! - `nvmf_create_transport -t RDMA` adopts the RDMA transport the
//!   application made at start (options that differ from its own are
//!   refused with -95); `-t TCP` makes the NVMe/TCP transport.

pub mod options;
pub mod params;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

use pollux_bdev::BdevRegistry;
use pollux_nvmf::spec::connect::is_valid_nqn;
use pollux_nvmf::spec::transport_id::{AdrFam, TrType, TransportId};
use pollux_nvmf::target::tcp::{TcpOptions, TcpTransport};
use pollux_nvmf::target::{
    NamespaceConfig, Subsystem as NvmfSubsys, SubsystemConfig, Target, TargetError,
    TargetTransport, TransportError, TransportPollGroup,
};
use pollux_reactor::sync::{Mutex, MutexGuard};
use pollux_reactor::Reactor;
use serde_json::{json, Map, Value};

use self::params::{
    AddNs, AllowAnyHost, CreateSubsystem, CreateTransport, GetFilter, GetStats, HostParams,
    ListenAddress, ListenerParams, RemoveNs, SubsystemRef,
};
use crate::config::ConfigEntry;
use crate::error::{Errno, RpcError};
use crate::service::{decode, Method, RpcService, Subsystem};
use crate::uuid::Uuid;

/// The one target's name (`tgt_name`).
pub const TARGET_NAME: &str = "nvmf_tgt";
/// SPDK's default serial number.
pub const DEFAULT_SERIAL: &str = "00000000000000000000";
/// SPDK's default largest NSID of a subsystem made by a call.
pub const DEFAULT_MAX_NAMESPACES: u32 = 32;
/// SPDK's default model number.
pub const DEFAULT_MODEL: &str = "SPDK bdev Controller";

/// Where each core keeps the poll groups of transports made at run time
/// (the application's per-core list, so its shutdown and statistics see
/// them too). Every call runs on the core's own reactor.
pub trait CoreGroups: Send + Sync + 'static {
    /// Keep `group` on this core.
    fn keep(&self, r: &Reactor, group: Rc<dyn TransportPollGroup>);
    /// Drop this core's group of the transport named `transport`.
    fn release(&self, r: &Reactor, transport: &'static str);
    /// This core's live queues per transport name.
    fn connections(&self, r: &Reactor) -> Vec<(&'static str, usize)>;
    /// Disconnect this core's queues that came in through the listener
    /// `trid` and are connected to subsystem `subnqn` (`None`: every
    /// queue of `trid`, which closed); returns how many.
    fn disconnect_listener(&self, r: &Reactor, trid: &TransportId, subnqn: Option<&str>) -> usize;
    /// Have this core's groups open and close their listeners now
    /// ([`TransportPollGroup::apply_listeners`]).
    ///
    /// # Errors
    ///
    /// The first group's error.
    fn apply_listeners(&self, r: &Reactor) -> Result<(), ListenerError>;
}

/// Why a core's poll groups could not open or close their listeners
/// ([`CoreGroups::apply_listeners`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListenerError {
    /// A transport's poll group failed.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// Any other reason, in words (for [`CoreGroups`] implementations
    /// with groups of their own).
    #[error("{0}")]
    Other(String),
}

thread_local! {
    static LOCAL_GROUPS: RefCell<Vec<Rc<dyn TransportPollGroup>>> =
        const { RefCell::new(Vec::new()) };
}

/// A [`CoreGroups`] that keeps the groups in a per-thread list of its own
/// (for services whose application keeps no list; the tests).
#[derive(Debug, Default, Clone, Copy)]
pub struct LocalGroups;

/// Takes the groups of `transport` out of a core's list and shuts them
/// down (for [`CoreGroups::release`] implementations).
pub fn release_groups(list: &RefCell<Vec<Rc<dyn TransportPollGroup>>>, transport: &'static str) {
    let gone: Vec<_> = {
        let mut g = list.borrow_mut();
        let (out, keep) = g.drain(..).partition(|x| x.transport_name() == transport);
        *g = keep;
        out
    };
    gone.iter().for_each(|g| g.shutdown());
}

/// Disconnects a core's queues of the listener `trid` (of subsystem
/// `subnqn` only, when given; for [`CoreGroups::disconnect_listener`]
/// implementations).
pub fn disconnect_from(
    list: &RefCell<Vec<Rc<dyn TransportPollGroup>>>,
    trid: &TransportId,
    subnqn: Option<&str>,
) -> usize {
    list.borrow()
        .iter()
        .map(|g| g.disconnect_listener(trid, subnqn))
        .sum()
}

/// Has a core's groups open and close their listeners now (for
/// [`CoreGroups::apply_listeners`] implementations).
///
/// # Errors
///
/// The first group's error ([`ListenerError::Transport`]).
pub fn apply_listeners_in(
    list: &RefCell<Vec<Rc<dyn TransportPollGroup>>>,
) -> Result<(), ListenerError> {
    list.borrow()
        .iter()
        .try_for_each(|g| g.apply_listeners().map_err(ListenerError::from))
}

/// A core's live queues per transport name (for
/// [`CoreGroups::connections`] implementations).
pub fn group_connections(
    list: &RefCell<Vec<Rc<dyn TransportPollGroup>>>,
) -> Vec<(&'static str, usize)> {
    list.borrow()
        .iter()
        .map(|x| (x.transport_name(), x.connections()))
        .collect()
}

impl CoreGroups for LocalGroups {
    fn keep(&self, _r: &Reactor, group: Rc<dyn TransportPollGroup>) {
        LOCAL_GROUPS.with(|g| g.borrow_mut().push(group));
    }

    fn release(&self, _r: &Reactor, transport: &'static str) {
        LOCAL_GROUPS.with(|g| release_groups(g, transport));
    }

    fn connections(&self, _r: &Reactor) -> Vec<(&'static str, usize)> {
        LOCAL_GROUPS.with(group_connections)
    }

    fn disconnect_listener(&self, _r: &Reactor, trid: &TransportId, subnqn: Option<&str>) -> usize {
        LOCAL_GROUPS.with(|g| disconnect_from(g, trid, subnqn))
    }

    fn apply_listeners(&self, _r: &Reactor) -> Result<(), ListenerError> {
        LOCAL_GROUPS.with(apply_listeners_in)
    }
}

#[derive(Default)]
struct NvmfState {
    /// `nvmf_get_transports` entries by SPDK trtype name (`RDMA`, `TCP`).
    transports: BTreeMap<&'static str, Value>,
    /// `nvmf_set_max_subsystems`.
    max_subsystems: options::MaxSubsystems,
    /// `sock_impl_set_options` of `posix`: the next TCP transport's
    /// socket buffer sizes.
    sock: options::SockBuffers,
}

/// The `nvmf` subsystem over one target and the bdevs of its namespaces.
pub struct NvmfSubsystem {
    target: Arc<Target>,
    registry: Arc<BdevRegistry>,
    groups: Arc<dyn CoreGroups>,
    /// Held for a whole method: changes are one at a time.
    state: Mutex<NvmfState>,
}

impl std::fmt::Debug for NvmfSubsystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmfSubsystem").finish_non_exhaustive()
    }
}

fn invalid(detail: impl Into<String>) -> RpcError {
    RpcError::invalid_params(detail)
}

fn target_error(e: TargetError) -> RpcError {
    match e {
        TargetError::SubsystemInUse { nqn, controllers } => RpcError::errno(
            Errno::Busy,
            format!("subsystem {nqn} has {controllers} connected controller(s); disconnect the hosts first"),
        ),
        TargetError::Bdev(b) => RpcError::from(b),
        other => invalid(other.to_string()),
    }
}

/// SPDK's name of a transport type.
pub fn trtype_name(t: TrType) -> &'static str {
    match t {
        TrType::Rdma => "RDMA",
        TrType::Tcp => "TCP",
        TrType::Fc => "FC",
        TrType::Loop => "LOOP",
        _ => "CUSTOM",
    }
}

fn parse_trtype(s: &str) -> Result<TrType, RpcError> {
    match s.to_ascii_uppercase().as_str() {
        "RDMA" => Ok(TrType::Rdma),
        "TCP" => Ok(TrType::Tcp),
        _ => Err(invalid(format!("trtype `{s}`: Pollux serves RDMA and TCP"))),
    }
}

fn adrfam_name(a: AdrFam) -> &'static str {
    match a {
        AdrFam::Ipv4 => "IPv4",
        AdrFam::Ipv6 => "IPv6",
        AdrFam::Ib => "IB",
        AdrFam::Fc => "FC",
        AdrFam::IntraHost => "INTRA_HOST",
        _ => "UNKNOWN",
    }
}

fn parse_trid(a: &ListenAddress) -> Result<TransportId, RpcError> {
    let trtype = parse_trtype(&a.trtype)?;
    let soft_name = a.traddr.starts_with('@') || a.traddr.starts_with('/');
    let adrfam = match a.adrfam.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None if soft_name => AdrFam::IntraHost,
        None | Some("ipv4") => AdrFam::Ipv4,
        Some("ipv6") => AdrFam::Ipv6,
        Some("intra_host") => AdrFam::IntraHost,
        Some(other) => {
            return Err(invalid(format!(
                "adrfam `{other}`: IPv4, IPv6 or INTRA_HOST (the soft provider)"
            )))
        }
    };
    let trsvcid = a.trsvcid.clone().unwrap_or_default();
    if trsvcid.is_empty() && adrfam != AdrFam::IntraHost {
        return Err(invalid("listen_address.trsvcid (the port) is required"));
    }
    if a.traddr.is_empty() {
        return Err(invalid("listen_address.traddr is empty"));
    }
    Ok(TransportId {
        trtype,
        adrfam,
        traddr: a.traddr.clone(),
        trsvcid,
    })
}

/// The queue pairs live on every core, from an `nvmf_get_stats` answer:
/// the sum of its poll groups' `current_io_qpairs`, `None` when the
/// answer has no `poll_groups` list or a group no such count.
pub fn current_qpairs(stats: &Value) -> Option<u64> {
    stats["poll_groups"]
        .as_array()?
        .iter()
        .map(|g| g["current_io_qpairs"].as_u64())
        .sum()
}

/// A listen address as SPDK shows it.
pub fn describe_trid(t: &TransportId) -> Value {
    json!({
        "trtype": trtype_name(t.trtype),
        "adrfam": adrfam_name(t.adrfam),
        "traddr": t.traddr,
        "trsvcid": t.trsvcid,
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02X}")).collect()
}

fn parse_hex<const N: usize>(what: &str, s: &str) -> Result<[u8; N], RpcError> {
    let digits: Vec<u8> = s.bytes().filter(|&c| c != b'-').collect();
    if digits.len() != 2 * N {
        return Err(invalid(format!("{what} `{s}`: {} hex digits", 2 * N)));
    }
    let mut out = [0u8; N];
    for (i, pair) in digits.chunks(2).enumerate() {
        let txt = std::str::from_utf8(pair).map_err(|_| invalid(format!("{what} `{s}`")))?;
        out[i] = u8::from_str_radix(txt, 16)
            .map_err(|_| invalid(format!("{what} `{s}`: not hexadecimal")))?;
    }
    Ok(out)
}

fn check_tgt(name: Option<&str>) -> Result<(), RpcError> {
    match name {
        None => Ok(()),
        Some(n) if n == TARGET_NAME => Ok(()),
        Some(n) => Err(RpcError::internal(format!("Unable to find target {n}"))),
    }
}

impl NvmfSubsystem {
    /// The subsystem over `target`, whose namespaces take their bdevs from
    /// `registry`; transports made at run time keep their per-core groups
    /// in `groups`. What the target already holds (subsystems and their
    /// listeners from a TOML file, transports the application added) is
    /// taken as made by calls: the transports that have a listener count
    /// as created.
    pub fn new(
        target: Arc<Target>,
        registry: Arc<BdevRegistry>,
        groups: Arc<dyn CoreGroups>,
    ) -> Arc<Self> {
        let me = Self {
            target,
            registry,
            groups,
            state: Mutex::new(NvmfState::default()),
        };
        {
            let mut st = me.lock();
            let listeners: Vec<TransportId> =
                me.target.listeners().into_iter().map(|l| l.trid).collect();
            for l in &listeners {
                let name = trtype_name(l.trtype);
                if !st.transports.contains_key(name) {
                    let d = me.describe_transport(l.trtype, None, &CreateTransport::default());
                    st.transports.insert(name, d);
                }
            }
        }
        Arc::new(me)
    }

    fn lock(&self) -> MutexGuard<'_, NvmfState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The target.
    pub fn target(&self) -> &Arc<Target> {
        &self.target
    }

    /// Waits until every core has run a message sent after the change (see
    /// the module docs).
    fn settle(&self, svc: &RpcService) -> Result<(), RpcError> {
        svc.cores().on_each_core(|_| ()).map(|_| ())
    }

    fn subsystem(&self, nqn: &str) -> Result<Arc<NvmfSubsys>, RpcError> {
        let s = self.listening_subsystem(nqn)?;
        if s.is_discovery() {
            return Err(invalid(format!(
                "Subsystem with NQN '{nqn}': the discovery subsystem is not changed by calls"
            )));
        }
        Ok(s)
    }

    /// The `nvmf_get_transports` entry of a transport: the target-wide
    /// values, the TCP options when `tcp` is given, the request's values.
    fn describe_transport(
        &self,
        trtype: TrType,
        tcp: Option<&TcpOptions>,
        req: &CreateTransport,
    ) -> Value {
        let o = self.target.options();
        let mut v = json!({
            "trtype": trtype_name(trtype),
            "max_queue_depth": req.max_queue_depth.unwrap_or(o.max_queue_depth),
            "max_io_qpairs_per_ctrlr": req.max_io_qpairs_per_ctrlr.unwrap_or(127),
            "in_capsule_data_size": req.in_capsule_data_size.unwrap_or(o.in_capsule_data_size),
            "max_io_size": o.max_io_size,
            "io_unit_size": o.io_unit_size,
            "num_shared_buffers": o.num_data_buffers,
            "buf_cache_size": o.buffer_cache_size,
        });
        if let Some(t) = tcp {
            v["max_queue_depth"] = json!(t.max_queue_depth);
            v["max_io_qpairs_per_ctrlr"] = json!(t.max_io_qpairs_per_ctrlr);
            v["in_capsule_data_size"] = json!(t.in_capsule_data_size);
            v["c2h_success"] = json!(t.c2h_success);
            v["sock_priority"] = json!(t.sock_priority);
        }
        v
    }

    fn create_transport(&self, svc: &RpcService, p: Option<Value>) -> Result<Value, RpcError> {
        let req: CreateTransport = decode(p)?;
        check_tgt(req.tgt_name.as_deref())?;
        let trtype = parse_trtype(&req.trtype)?;
        let name = trtype_name(trtype);
        let mut st = self.lock();
        if st.transports.contains_key(name) {
            return Err(RpcError::internal(format!(
                "Transport type '{name}' already exists"
            )));
        }
        let o = self.target.options();
        for (key, given, have) in [
            ("max_io_size", req.max_io_size, o.max_io_size),
            ("io_unit_size", req.io_unit_size, o.io_unit_size),
            (
                "num_shared_buffers",
                req.num_shared_buffers,
                u32::try_from(o.num_data_buffers).unwrap_or(u32::MAX),
            ),
            (
                "buf_cache_size",
                // SPDK's u32::MAX: "size it automatically", as the target did.
                req.buf_cache_size.filter(|&c| c != params::BUF_CACHE_AUTO),
                u32::try_from(o.buffer_cache_size).unwrap_or(u32::MAX),
            ),
        ] {
            if given.is_some_and(|g| g != have) {
                return Err(RpcError::errno(
                    Errno::NotSupported,
                    format!("{key}: target-wide in Pollux ({have}); set it in the target's configuration"),
                ));
            }
        }
        let desc = match (
            trtype,
            self.target.transport_for(&TransportId::tcp_ipv4("", "")),
        ) {
            (TrType::Tcp, Some(_)) | (TrType::Rdma, _) => self.adopt(trtype, &req)?,
            (TrType::Tcp, None) => self.make_tcp(svc, &req, st.sock)?,
            _ => return Err(invalid(format!("trtype `{}`", req.trtype))),
        };
        st.transports.insert(name, desc);
        Ok(Value::Bool(true))
    }

    /// A transport the application made: accepted when the request asks
    /// for what it has.
    fn adopt(&self, trtype: TrType, req: &CreateTransport) -> Result<Value, RpcError> {
        let probe = TransportId {
            trtype,
            adrfam: AdrFam::Ipv4,
            traddr: String::new(),
            trsvcid: String::new(),
        };
        let Some(_t) = self.target.transport_for(&probe) else {
            return Err(RpcError::internal(format!(
                "Transport type '{}' create failed: this application has no {} transport",
                trtype_name(trtype),
                trtype_name(trtype)
            )));
        };
        let have = self.describe_transport(trtype, None, &CreateTransport::default());
        for (key, given) in [
            ("max_queue_depth", req.max_queue_depth.map(u32::from)),
            (
                "max_io_qpairs_per_ctrlr",
                req.max_io_qpairs_per_ctrlr.map(u32::from),
            ),
            ("in_capsule_data_size", req.in_capsule_data_size),
        ] {
            if let Some(g) = given {
                if have[key] != json!(g) {
                    return Err(RpcError::errno(
                        Errno::NotSupported,
                        format!(
                            "{key} {g}: the {} transport runs with {} (set at start)",
                            trtype_name(trtype),
                            have[key]
                        ),
                    ));
                }
            }
        }
        Ok(have)
    }

    fn make_tcp(
        &self,
        svc: &RpcService,
        req: &CreateTransport,
        sock: options::SockBuffers,
    ) -> Result<Value, RpcError> {
        let mut o = TcpOptions::for_target(self.target.options());
        o.recv_buf_size = sock.recv;
        o.send_buf_size = sock.send;
        if let Some(v) = req.max_queue_depth {
            o.max_queue_depth = v;
        }
        if let Some(v) = req.max_io_qpairs_per_ctrlr {
            o.max_io_qpairs_per_ctrlr = v;
        }
        if let Some(v) = req.in_capsule_data_size {
            o.in_capsule_data_size = v;
        }
        if let Some(v) = req.c2h_success {
            o.c2h_success = v;
        }
        if let Some(v) = req.sock_priority {
            o.sock_priority = v;
        }
        let t = TcpTransport::new(&self.target, o.clone())
            .map_err(|e| invalid(format!("TCP transport: {e}")))?;
        let desc = self.describe_transport(TrType::Tcp, Some(&o), req);
        let dynt: Arc<dyn TargetTransport> = t;
        self.target
            .add_transport(Arc::clone(&dynt))
            .map_err(target_error)?;
        let groups = Arc::clone(&self.groups);
        let started = {
            let t = Arc::clone(&dynt);
            svc.cores()
                .on_each_core(move |r| match Arc::clone(&t).start_poll_group(r) {
                    Ok(Some(g)) => {
                        groups.keep(r, g);
                        Ok(())
                    }
                    Ok(None) => Ok(()),
                    Err(e) => Err(e.to_string()),
                })
        };
        let failed = match started {
            Ok(answers) => answers
                .into_iter()
                .find_map(|(c, r)| r.err().map(|e| format!("core {c}: {e}"))),
            Err(e) => Some(e.to_string()),
        };
        if let Some(why) = failed {
            let groups = Arc::clone(&self.groups);
            let name = dynt.name();
            let _ = svc.cores().on_each_core(move |r| groups.release(r, name));
            let _ = self.target.remove_transport(TrType::Tcp);
            return Err(RpcError::internal(format!(
                "Transport type 'TCP' create failed: {why}"
            )));
        }
        Ok(desc)
    }

    fn get_transports(&self, p: Option<Value>) -> Result<Value, RpcError> {
        let req: GetFilter = decode(p)?;
        check_tgt(req.tgt_name.as_deref())?;
        if req.nqn.is_some() {
            return Err(invalid("nvmf_get_transports takes no nqn"));
        }
        let want = req.trtype.as_deref().map(parse_trtype).transpose()?;
        let st = self.lock();
        if let Some(t) = want {
            let name = trtype_name(t);
            return match st.transports.get(name) {
                Some(d) => Ok(json!([d])),
                None => Err(invalid(format!("Transport type '{name}' not found"))),
            };
        }
        Ok(Value::Array(st.transports.values().cloned().collect()))
    }

    fn create_subsystem(&self, svc: &RpcService, p: Option<Value>) -> Result<Value, RpcError> {
        let req: CreateSubsystem = decode(p)?;
        check_tgt(req.tgt_name.as_deref())?;
        for (key, on, why) in [
            (
                "ana_reporting",
                req.ana_reporting,
                "ANA is not reported by Pollux",
            ),
            (
                "passthrough",
                req.passthrough,
                "Pollux has no NVMe passthrough",
            ),
            (
                "enable_nssr",
                req.enable_nssr,
                "Pollux has no NVM subsystem reset",
            ),
        ] {
            if on == Some(true) {
                return Err(RpcError::errno(
                    Errno::NotSupported,
                    format!("{key}: {why}"),
                ));
            }
        }
        let mut cfg = SubsystemConfig::new(req.nqn.clone());
        cfg.serial = req
            .serial_number
            .clone()
            .unwrap_or_else(|| DEFAULT_SERIAL.into());
        cfg.model = req
            .model_number
            .clone()
            .unwrap_or_else(|| DEFAULT_MODEL.into());
        cfg.allow_any_host = req.allow_any_host.unwrap_or(false);
        cfg.max_namespaces = req
            .max_namespaces
            .filter(|&n| n != 0)
            .unwrap_or(DEFAULT_MAX_NAMESPACES);
        let (lo, hi) = cfg.cntlid_range;
        cfg.cntlid_range = (req.min_cntlid.unwrap_or(lo), req.max_cntlid.unwrap_or(hi));
        let st = self.lock();
        if self.target.subsystem(&req.nqn).is_some() {
            return Err(RpcError::internal(format!(
                "Unable to create subsystem {}: it exists",
                req.nqn
            )));
        }
        let max = st.max_subsystems.now;
        if usize::try_from(max).is_ok_and(|m| self.made_subsystems() >= m) {
            return Err(RpcError::internal(format!(
                "Unable to create subsystem {}: the target holds max_subsystems ({max}; nvmf_set_max_subsystems)",
                req.nqn
            )));
        }
        self.target.add_subsystem(cfg).map_err(|e| match e {
            TargetError::InvalidOption(why) => invalid(why),
            other => RpcError::internal(format!("Unable to create subsystem {}: {other}", req.nqn)),
        })?;
        drop(st);
        self.settle(svc)?;
        Ok(Value::Bool(true))
    }

    fn delete_subsystem(&self, svc: &RpcService, p: Option<Value>) -> Result<Value, RpcError> {
        let req: SubsystemRef = decode(p)?;
        check_tgt(req.tgt_name.as_deref())?;
        let st = self.lock();
        self.subsystem(&req.nqn)?;
        let closed = self
            .target
            .remove_subsystem(&req.nqn)
            .map_err(target_error)?;
        for trid in closed {
            self.disconnect(svc, &trid, None);
        }
        drop(st);
        self.settle(svc)?;
        Ok(Value::Bool(true))
    }

    /// Disconnects, on every core, the queues that came in through `trid`
    /// and are connected to `subnqn` (`None`: every queue of `trid`, which
    /// closed: each core's groups first let go of its socket, so the
    /// address is free when this returns).
    fn disconnect(&self, svc: &RpcService, trid: &TransportId, subnqn: Option<&str>) {
        let groups = Arc::clone(&self.groups);
        let t = trid.clone();
        let nqn = subnqn.map(str::to_owned);
        match svc.cores().on_each_core(move |r| {
            if nqn.is_none() {
                if let Err(e) = groups.apply_listeners(r) {
                    log::warn!("nvmf: applying the listeners after closing {t}: {e}");
                }
            }
            groups.disconnect_listener(r, &t, nqn.as_deref())
        }) {
            Ok(n) => {
                let n: usize = n.iter().map(|(_, k)| k).sum();
                if n > 0 {
                    log::info!(
                        "nvmf: listener {trid} of {}: {n} queue(s) disconnected",
                        subnqn.unwrap_or("every subsystem")
                    );
                }
            }
            Err(e) => log::warn!("nvmf: disconnecting the queues of {trid}: {e}"),
        }
    }

    /// The subsystem `nqn` whose listeners a call changes or lists: an NVM
    /// subsystem or the discovery subsystem.
    fn listening_subsystem(&self, nqn: &str) -> Result<Arc<NvmfSubsys>, RpcError> {
        self.target
            .subsystem(nqn)
            .ok_or_else(|| invalid(format!("Subsystem with NQN '{nqn}' not found")))
    }

    /// `listen_addresses` of `s`, SPDK's shape.
    fn listen_addresses(&self, s: &NvmfSubsys) -> Value {
        Value::Array(
            self.target
                .listeners_of(s)
                .iter()
                .map(|l| describe_trid(&l.trid))
                .collect(),
        )
    }

    fn describe_subsystem(&self, s: &NvmfSubsys) -> Value {
        let mut v = Map::new();
        v.insert("nqn".into(), json!(s.nqn()));
        if s.is_discovery() {
            v.insert("subtype".into(), json!("Discovery"));
            v.insert("listen_addresses".into(), self.listen_addresses(s));
            v.insert("allow_any_host".into(), json!(true));
            v.insert("hosts".into(), json!([]));
            return Value::Object(v);
        }
        let (lo, hi) = s.cntlid_range();
        v.insert("subtype".into(), json!("NVMe"));
        v.insert("listen_addresses".into(), self.listen_addresses(s));
        v.insert("allow_any_host".into(), json!(s.allows_any_host()));
        v.insert(
            "hosts".into(),
            Value::Array(s.hosts().into_iter().map(|h| json!({"nqn": h})).collect()),
        );
        v.insert("serial_number".into(), json!(s.serial()));
        v.insert("model_number".into(), json!(s.model()));
        v.insert("max_namespaces".into(), json!(s.max_namespaces()));
        v.insert("min_cntlid".into(), json!(lo));
        v.insert("max_cntlid".into(), json!(hi));
        let ns: Vec<Value> = s
            .namespaces()
            .iter()
            .map(|n| {
                json!({
                    "nsid": n.nsid(),
                    "bdev_name": n.bdev().name(),
                    "name": n.bdev().name(),
                    "nguid": hex(&n.nguid()),
                    "eui64": hex(&n.eui64()),
                    "uuid": Uuid::from_bytes(n.uuid()).to_string(),
                })
            })
            .collect();
        v.insert("namespaces".into(), Value::Array(ns));
        Value::Object(v)
    }

    fn get_subsystems(&self, p: Option<Value>) -> Result<Value, RpcError> {
        let req: GetFilter = decode(p)?;
        check_tgt(req.tgt_name.as_deref())?;
        if req.trtype.is_some() {
            return Err(invalid("nvmf_get_subsystems takes no trtype"));
        }
        let _st = self.lock();
        if let Some(nqn) = &req.nqn {
            let s = self.listening_subsystem(nqn)?;
            return Ok(json!([self.describe_subsystem(&s)]));
        }
        let mut out = vec![self.describe_subsystem(self.target.discovery_subsystem())];
        for s in self.target.subsystems() {
            out.push(self.describe_subsystem(&s));
        }
        Ok(Value::Array(out))
    }

    fn add_ns(&self, svc: &RpcService, p: Option<Value>) -> Result<Value, RpcError> {
        let req: AddNs = decode(p)?;
        check_tgt(req.tgt_name.as_deref())?;
        let n = &req.namespace;
        if n.ptpl_file.as_deref().is_some_and(|f| !f.is_empty()) {
            return Err(RpcError::errno(
                Errno::NotSupported,
                "ptpl_file: reservations are not persisted by Pollux",
            ));
        }
        if n.anagrpid.is_some_and(|g| g > 1) {
            return Err(RpcError::errno(
                Errno::NotSupported,
                "anagrpid: ANA groups are not reported by Pollux",
            ));
        }
        if n.hide_metadata == Some(true) {
            return Err(RpcError::errno(
                Errno::NotSupported,
                "hide_metadata: a bdev's metadata is always exported (extended LBAs)",
            ));
        }
        if n.no_auto_visible == Some(true) {
            return Err(RpcError::errno(
                Errno::NotSupported,
                "no_auto_visible: every namespace is visible to every host",
            ));
        }
        let _st = self.lock();
        let sub = self.subsystem(&req.nqn)?;
        let bdev = self.registry.get(&n.bdev_name).ok_or_else(|| {
            invalid(format!(
                "Unable to add namespace: no bdev named `{}`",
                n.bdev_name
            ))
        })?;
        let mut cfg = NamespaceConfig::new(bdev);
        cfg.nsid = n.nsid.filter(|&id| id != 0);
        cfg.nguid = n
            .nguid
            .as_deref()
            .map(|s| parse_hex("nguid", s))
            .transpose()?;
        cfg.eui64 = n
            .eui64
            .as_deref()
            .map(|s| parse_hex("eui64", s))
            .transpose()?;
        cfg.uuid = n
            .uuid
            .as_deref()
            .map(|s| {
                Uuid::parse(s)
                    .map(|u| u.bytes())
                    .map_err(|e| invalid(e.to_string()))
            })
            .transpose()?;
        let nsid = sub.add_namespace(cfg).map_err(|e| match e {
            TargetError::Bdev(b) => RpcError::from(b),
            other => invalid(format!("Unable to add namespace: {other}")),
        })?;
        drop(_st);
        self.settle(svc)?;
        Ok(json!(nsid))
    }

    fn remove_ns(&self, svc: &RpcService, p: Option<Value>) -> Result<Value, RpcError> {
        let req: RemoveNs = decode(p)?;
        check_tgt(req.tgt_name.as_deref())?;
        let st = self.lock();
        let sub = self.subsystem(&req.nqn)?;
        sub.remove_namespace(req.nsid)
            .map_err(|e| invalid(e.to_string()))?;
        drop(st);
        self.settle(svc)?;
        Ok(Value::Bool(true))
    }

    fn add_listener(&self, svc: &RpcService, p: Option<Value>) -> Result<Value, RpcError> {
        let req: ListenerParams = decode(p)?;
        check_tgt(req.tgt_name.as_deref())?;
        if req.secure_channel == Some(true) {
            return Err(RpcError::errno(
                Errno::NotSupported,
                "secure_channel: no TLS in Pollux",
            ));
        }
        if req
            .ana_state
            .as_deref()
            .is_some_and(|a| !a.eq_ignore_ascii_case("optimized"))
        {
            return Err(RpcError::errno(
                Errno::NotSupported,
                "ana_state: only optimized",
            ));
        }
        let trid = parse_trid(&req.listen_address)?;
        if let Some(other) = req
            .sock_impl
            .as_deref()
            .filter(|s| *s != "posix" && trid.trtype == TrType::Tcp)
        {
            return Err(RpcError::errno(
                Errno::NotSupported,
                format!("sock_impl `{other}`: Pollux's TCP transport uses posix sockets only"),
            ));
        }
        let st = self.lock();
        let sub = self.listening_subsystem(&req.nqn)?;
        if self
            .target
            .listeners_of(&sub)
            .iter()
            .any(|l| l.trid == trid)
        {
            return Err(invalid(format!(
                "Listener {trid} already exists for {}",
                req.nqn
            )));
        }
        let open = self.target.listeners().iter().any(|l| l.trid == trid);
        if !open && !st.transports.contains_key(trtype_name(trid.trtype)) {
            return Err(invalid(format!(
                "Unable to find {} transport (nvmf_create_transport first)",
                trtype_name(trid.trtype)
            )));
        }
        self.target
            .add_subsystem_listener(&req.nqn, trid.clone())
            .map_err(|e| invalid(format!("Unable to listen on {trid}: {e}")))?;
        if !open {
            // Opened on its core before the answer (all or nothing).
            let groups = Arc::clone(&self.groups);
            let failed = match svc.cores().on_each_core(move |r| groups.apply_listeners(r)) {
                Ok(answers) => answers
                    .into_iter()
                    .find_map(|(c, r)| r.err().map(|e| format!("core {c}: {e}"))),
                Err(e) => Some(e.to_string()),
            };
            if let Some(why) = failed {
                if let Err(e) = self.target.remove_subsystem_listener(&req.nqn, &trid) {
                    log::warn!("nvmf: undoing listener {trid}: {e}");
                }
                return Err(invalid(format!("Unable to listen on {trid}: {why}")));
            }
        }
        drop(st);
        self.settle(svc)?;
        Ok(Value::Bool(true))
    }

    fn remove_listener(&self, svc: &RpcService, p: Option<Value>) -> Result<Value, RpcError> {
        let req: ListenerParams = decode(p)?;
        check_tgt(req.tgt_name.as_deref())?;
        let trid = parse_trid(&req.listen_address)?;
        let st = self.lock();
        let sub = self.listening_subsystem(&req.nqn)?;
        if !sub.listens_on(&trid) {
            let why = if self
                .target
                .listeners_of(&sub)
                .iter()
                .any(|l| l.trid == trid)
            {
                " (the application's target-wide listener)"
            } else {
                ""
            };
            return Err(invalid(format!(
                "Unable to find listener {trid} of {}{why}",
                req.nqn
            )));
        }
        let closed = self
            .target
            .remove_subsystem_listener(&req.nqn, &trid)
            .map_err(|e| invalid(e.to_string()))?;
        let only = if closed { None } else { Some(req.nqn.as_str()) };
        self.disconnect(svc, &trid, only);
        drop(st);
        self.settle(svc)?;
        Ok(Value::Bool(true))
    }

    fn add_host(&self, svc: &RpcService, p: Option<Value>) -> Result<Value, RpcError> {
        let req: HostParams = decode(p)?;
        check_tgt(req.tgt_name.as_deref())?;
        if req.psk.is_some() {
            return Err(RpcError::errno(
                Errno::NotSupported,
                "psk: no TLS in Pollux",
            ));
        }
        if !is_valid_nqn(&req.host) {
            return Err(invalid(format!("host `{}` is not a valid NQN", req.host)));
        }
        let st = self.lock();
        let sub = self.subsystem(&req.nqn)?;
        if sub.hosts().contains(&req.host) {
            return Err(invalid(format!(
                "host {} is already allowed on {}",
                req.host, req.nqn
            )));
        }
        sub.allow_host(req.host);
        drop(st);
        self.settle(svc)?;
        Ok(Value::Bool(true))
    }

    fn remove_host(&self, svc: &RpcService, p: Option<Value>) -> Result<Value, RpcError> {
        let req: HostParams = decode(p)?;
        check_tgt(req.tgt_name.as_deref())?;
        let st = self.lock();
        let sub = self.subsystem(&req.nqn)?;
        if !sub.hosts().contains(&req.host) {
            return Err(invalid(format!(
                "host {} is not allowed on {}",
                req.host, req.nqn
            )));
        }
        sub.disallow_host(&req.host);
        drop(st);
        self.settle(svc)?;
        Ok(Value::Bool(true))
    }

    fn allow_any_host(&self, svc: &RpcService, p: Option<Value>) -> Result<Value, RpcError> {
        let req: AllowAnyHost = decode(p)?;
        check_tgt(req.tgt_name.as_deref())?;
        let st = self.lock();
        self.subsystem(&req.nqn)?
            .set_allow_any_host(req.allow_any_host);
        drop(st);
        self.settle(svc)?;
        Ok(Value::Bool(true))
    }

    fn get_controllers(&self, p: Option<Value>) -> Result<Value, RpcError> {
        let req: SubsystemRef = decode(p)?;
        check_tgt(req.tgt_name.as_deref())?;
        let sub = self.subsystem(&req.nqn)?;
        Ok(Value::Array(
            sub.controllers()
                .iter()
                .map(|c| {
                    json!({
                        "cntlid": c.cntlid(),
                        "hostnqn": c.hostnqn(),
                        "hostid": Uuid::from_bytes(c.hostid()).to_string(),
                        "num_io_qpairs": c.io_qids().len(),
                    })
                })
                .collect(),
        ))
    }

    fn get_qpairs(&self, p: Option<Value>) -> Result<Value, RpcError> {
        let req: SubsystemRef = decode(p)?;
        check_tgt(req.tgt_name.as_deref())?;
        let sub = self.subsystem(&req.nqn)?;
        let mut out = Vec::new();
        for c in sub.controllers() {
            let state = if c.is_dead() { "deleting" } else { "active" };
            for qid in std::iter::once(0).chain(c.io_qids()) {
                out.push(json!({
                    "cntlid": c.cntlid(),
                    "qid": qid,
                    "state": state,
                    "trtype": trtype_name(c.trtype()),
                }));
            }
        }
        Ok(Value::Array(out))
    }

    fn get_listeners(&self, p: Option<Value>) -> Result<Value, RpcError> {
        let req: SubsystemRef = decode(p)?;
        check_tgt(req.tgt_name.as_deref())?;
        let _st = self.lock();
        let sub = self.listening_subsystem(&req.nqn)?;
        Ok(Value::Array(
            self.target
                .listeners_of(&sub)
                .iter()
                .map(|l| json!({"address": describe_trid(&l.trid), "ana_state": "optimized"}))
                .collect(),
        ))
    }

    fn get_stats(&self, svc: &RpcService, p: Option<Value>) -> Result<Value, RpcError> {
        let req: GetStats = decode(p)?;
        check_tgt(req.tgt_name.as_deref())?;
        let groups = Arc::clone(&self.groups);
        let per_core = svc.cores().on_each_core(move |r| groups.connections(r))?;
        let t = self.target.transport_stats();
        let poll_groups: Vec<Value> = per_core
            .into_iter()
            .map(|(core, conns)| {
                let total: usize = conns.iter().map(|(_, n)| n).sum();
                json!({
                    "name": format!("nvmf_tgt_poll_group_{core:03}"),
                    "current_io_qpairs": total,
                    "transports": conns
                        .iter()
                        .map(|(name, n)| json!({"trtype": name.to_ascii_uppercase(), "current_qpairs": n}))
                        .collect::<Vec<_>>(),
                })
            })
            .collect();
        Ok(json!({
            "tick_rate": 1_000_000_000u64,
            "accepted": t.accepted,
            "rejected": t.rejected,
            "destroyed": t.destroyed,
            "poll_groups": poll_groups,
        }))
    }

    fn config_entries(&self) -> Vec<ConfigEntry> {
        let sock = self.sock_options_entry();
        let limit = self.max_subsystems_entry();
        let st = self.lock();
        let mut out: Vec<ConfigEntry> = sock.into_iter().chain(limit).collect();
        out.extend(
            st.transports
                .values()
                .map(|d| ConfigEntry::new("nvmf_create_transport", d.clone())),
        );
        let add_listener = |nqn: &str, t: &TransportId| {
            ConfigEntry::new(
                "nvmf_subsystem_add_listener",
                json!({"nqn": nqn, "listen_address": describe_trid(t)}),
            )
        };
        let disc = self.target.discovery_subsystem();
        out.extend(disc.listeners().iter().map(|t| add_listener(disc.nqn(), t)));
        for s in self.target.subsystems() {
            let (lo, hi) = s.cntlid_range();
            out.push(ConfigEntry::new(
                "nvmf_create_subsystem",
                json!({
                    "nqn": s.nqn(),
                    "serial_number": s.serial(),
                    "model_number": s.model(),
                    "allow_any_host": s.allows_any_host(),
                    "max_namespaces": s.max_namespaces(),
                    "min_cntlid": lo,
                    "max_cntlid": hi,
                }),
            ));
            for l in self.target.listeners_of(&s) {
                out.push(add_listener(s.nqn(), &l.trid));
            }
            for h in s.hosts() {
                out.push(ConfigEntry::new(
                    "nvmf_subsystem_add_host",
                    json!({"nqn": s.nqn(), "host": h}),
                ));
            }
            for n in s.namespaces() {
                out.push(ConfigEntry::new(
                    "nvmf_subsystem_add_ns",
                    json!({"nqn": s.nqn(), "namespace": {
                        "bdev_name": n.bdev().name(),
                        "nsid": n.nsid(),
                        "nguid": hex(&n.nguid()),
                        "eui64": hex(&n.eui64()),
                        "uuid": Uuid::from_bytes(n.uuid()).to_string(),
                    }}),
                ));
            }
        }
        out
    }
}

type Body = fn(&NvmfSubsystem, &RpcService, Option<Value>) -> Result<Value, RpcError>;

impl Subsystem for NvmfSubsystem {
    fn name(&self) -> &'static str {
        "nvmf"
    }

    fn depends_on(&self) -> &'static [&'static str] {
        &["bdev"]
    }

    fn methods(self: Arc<Self>) -> Vec<Method> {
        let table: [(&'static str, Body); 16] = [
            ("nvmf_create_transport", |s, v, p| s.create_transport(v, p)),
            ("nvmf_get_transports", |s, _, p| s.get_transports(p)),
            ("nvmf_create_subsystem", |s, v, p| s.create_subsystem(v, p)),
            ("nvmf_delete_subsystem", |s, v, p| s.delete_subsystem(v, p)),
            ("nvmf_get_subsystems", |s, _, p| s.get_subsystems(p)),
            ("nvmf_subsystem_add_ns", |s, v, p| s.add_ns(v, p)),
            ("nvmf_subsystem_remove_ns", |s, v, p| s.remove_ns(v, p)),
            ("nvmf_subsystem_add_listener", |s, v, p| {
                s.add_listener(v, p)
            }),
            ("nvmf_subsystem_remove_listener", |s, v, p| {
                s.remove_listener(v, p)
            }),
            ("nvmf_subsystem_add_host", |s, v, p| s.add_host(v, p)),
            ("nvmf_subsystem_remove_host", |s, v, p| s.remove_host(v, p)),
            ("nvmf_subsystem_allow_any_host", |s, v, p| {
                s.allow_any_host(v, p)
            }),
            ("nvmf_subsystem_get_controllers", |s, _, p| {
                s.get_controllers(p)
            }),
            ("nvmf_subsystem_get_qpairs", |s, _, p| s.get_qpairs(p)),
            ("nvmf_subsystem_get_listeners", |s, _, p| s.get_listeners(p)),
            ("nvmf_get_stats", |s, v, p| s.get_stats(v, p)),
        ];
        let mut out: Vec<Method> = table
            .into_iter()
            .map(|(name, body)| {
                let me = Arc::clone(&self);
                Method::runtime(name, move |svc, p| body(&me, svc, p))
            })
            .collect();
        out.extend(options::methods(&self));
        out
    }

    fn config(&self, _svc: &RpcService) -> Result<Vec<ConfigEntry>, RpcError> {
        Ok(self.config_entries())
    }

    fn undo(&self, method: &str, params: Option<&Value>, result: &Value) -> Option<ConfigEntry> {
        if method == "nvmf_set_max_subsystems" {
            return Some(self.undo_max_subsystems());
        }
        if method == "sock_impl_set_options" {
            return Some(self.undo_sock_options());
        }
        let p = params?;
        let nqn = p.get("nqn")?.clone();
        match method {
            "nvmf_create_subsystem" => Some(ConfigEntry::new(
                "nvmf_delete_subsystem",
                json!({ "nqn": nqn }),
            )),
            "nvmf_subsystem_add_ns" => Some(ConfigEntry::new(
                "nvmf_subsystem_remove_ns",
                json!({ "nqn": nqn, "nsid": result.as_u64()? }),
            )),
            "nvmf_subsystem_add_listener" => Some(ConfigEntry::new(
                "nvmf_subsystem_remove_listener",
                json!({ "nqn": nqn, "listen_address": p.get("listen_address")?.clone() }),
            )),
            "nvmf_subsystem_add_host" => Some(ConfigEntry::new(
                "nvmf_subsystem_remove_host",
                json!({ "nqn": nqn, "host": p.get("host")?.clone() }),
            )),
            _ => None,
        }
    }
}
