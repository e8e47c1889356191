//! `pollux-tgt`'s configuration file: schema ([`TgtFile`]) and the checked
//! plan built from it ([`TgtPlan`]).
//!
//! ```toml
//! cores = "0"                  # list ("0,1", "0-3") or mask ("0x3"); --cores wins
//! provider = "soft"            # or "ibverbs" (a build with the `ibverbs` feature)
//!
//! [transport]                  # every key optional; defaults in brackets
//! max_queue_depth = 128        # entries per queue [128]
//! max_io_size = "128k"         # bytes, power of two >= 4 KiB [128k]
//! io_unit_size = "32k"         # data buffer size [32k]
//! in_capsule_data_size = 4096  # bytes, 0 or 256..=65536, multiple of 16 [4096]
//! num_shared_buffers = 1024    # data buffers [1024]
//! buf_cache_size = 32          # per-core data buffer cache [32]
//! max_srq_depth = 4096         # receive buffers per poll group [4096]
//! no_srq = false               # per-queue receive queues [false]
//! num_cqe = 32768              # CQ entries per poll group [32768]
//! send_with_invalidate = true  # [true]
//! max_read_depth = 16          # RDMA READs in flight per queue [16]
//! acceptor_backlog = 100       # [100]
//! max_qpairs = 1024            # queue pairs served at once, all cores [1024]
//! max_qpairs_per_core = 1024   # queue pairs one core serves at once [1024]
//! num_slot_buffers = 2048      # 4 KiB per-request buffers shared by all queues [2048]
//! pin_queues_to_listener_core = false  # no spreading over cores (debug) [false]
//! device = "mlx5_0"            # verbs device [the provider's first]
//! hugepages = "auto"           # auto | require | never [auto]
//! connect_timeout_ms = 30000   # a queue with no Fabrics Connect by then is dropped; 0: never [30000]
//!
//! [transport.tcp]              # NVMe/TCP (SPDK names); present or a tcp listener: TCP on
//! in_capsule_data_size = 4096  # I/O queues, <= the target's [4096]
//! max_queue_depth = 128        # entries per queue, <= the target's [128]
//! max_io_qpairs_per_ctrlr = 127  # I/O queues per controller over TCP [127]
//! c2h_success = true           # reads end with C2HData SUCCESS, no response [true]
//! sock_priority = 0            # SO_PRIORITY 0..=6 of accepted sockets [0]
//! keepalive = true             # TCP keep-alive on accepted sockets (a silent host is let go) [true]
//! keepalive_idle_s = 60        # idle seconds before the first probe, 1..=32767 [60]
//! keepalive_interval_s = 10    # seconds between probes, 1..=32767 [10]
//! keepalive_probes = 6         # unanswered probes before the connection is dropped, 1..=127 [6]
//! digest = "allow"             # allow | disable | require header+data digests [allow]
//! max_qpairs = 1024            # TCP connections (queues) at once, all cores [1024]
//! max_qpairs_per_core = 1024   # TCP connections one core serves at once [1024]
//!
//! [[bdev]]                     # as pollux-bdevperf: a spec string or a table
//! spec = "null:name=Null0,size=1G,block=4096"
//!
//! [[subsystem]]
//! nqn = "nqn.2016-06.io.pollux:null0"
//! serial = "POLLUX0001"        # <= 20 ASCII characters [derived from the NQN]
//! model = "Pollux Null"        # <= 40 ASCII characters
//! allow_any_host = true        # or hosts = ["nqn.2014-08.org.nvmexpress:uuid:..."]
//! max_namespaces = 1024        # [1024]
//! max_io_queues = 127          # [127]
//! namespaces = [{ bdev = "Null0", nsid = 1 }]   # nsid optional: lowest free
//! listeners = [{ trtype = "tcp", traddr = "127.0.0.1", trsvcid = "4421" }]
//!                              # this subsystem's own listeners, beside the
//!                              # top-level ones (same keys as [[listener]]) [none]
//!
//! [[listener]]                 # every subsystem of the file listens here;
//! traddr = "@pollux-tgt"       # soft: @name or /path,
//! trsvcid = ""                 # ibverbs: traddr = "10.99.0.1", trsvcid = "4420"
//!
//! [[listener]]                 # NVMe/TCP, beside RDMA
//! trtype = "tcp"               # rdma (default) or tcp
//! traddr = "127.0.0.1"         # an IP address
//! trsvcid = "4420"             # port [4420]
//! ```
//!
//! Listeners belong to subsystems, as in SPDK (the core's
//! [`Target::add_subsystem_listener`]): a host connects to a subsystem only
//! through an address that subsystem listens on. A top-level
//! `[[listener]]` is shorthand for "every subsystem in the file listens
//! here" (one `nvmf_subsystem_add_listener` per subsystem); a subsystem's
//! `listeners` adds addresses only it listens on. Discovery is served on
//! every address. Each subsystem needs at least one listener.
//!
//! Syntax errors, unknown keys and values of the wrong type come from
//! `toml` (line, column, key); semantic errors (unknown bdev, bad NQN,
//! duplicate NSID, options that cannot work together) read
//! `line L, column C: FIELD: what is wrong`, with FIELD a path such as
//! `subsystem[0].namespaces[1].nsid`.
//!
//! [`Target::add_subsystem_listener`]: pollux_nvmf::target::Target::add_subsystem_listener

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::ops::Range;
use std::path::Path;
use std::time::Duration;

use pollux_bdev::BdevSpec;
use pollux_nvmf::spec::connect::is_valid_nqn;
use pollux_nvmf::spec::transport_id::{AdrFam, TrType, TransportId};
use pollux_nvmf::target::rdma::{QueuePlacement, RdmaOptions};
use pollux_nvmf::target::tcp::{DigestPolicy, TcpKeepalive, TcpOptions};
use pollux_nvmf::target::{
    SubsystemConfig, Target, TargetOptions, DEFAULT_MAX_NAMESPACES, DISCOVERY_NQN,
};
use pollux_reactor::mem::HugepageMode;
use pollux_reactor::Cores;
use serde::{Deserialize, Deserializer};
use toml::Spanned;

use crate::config::{at, line_col, BdevEntry};
use crate::AppError;

/// The file as written (every value with its place in the text).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TgtFile {
    /// Cores to run reactors on (`--cores`/`-m` win).
    pub cores: Option<Spanned<String>>,
    /// The verbs provider.
    pub provider: Option<Spanned<ProviderKind>>,
    /// Target and RDMA transport options.
    pub transport: Option<Spanned<TransportSection>>,
    /// Bdevs to create, in order.
    #[serde(default)]
    pub bdev: Vec<Spanned<BdevEntry>>,
    /// Subsystems.
    #[serde(default)]
    pub subsystem: Vec<Spanned<SubsystemSection>>,
    /// Listen addresses.
    #[serde(default)]
    pub listener: Vec<Spanned<ListenerSection>>,
    /// The iSCSI (iSER) target: see [`super::iscsi`].
    pub iscsi: Option<super::iscsi::IscsiSection>,
}

/// Which verbs provider carries the RDMA transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// Software RDMA over shared memory (one machine).
    #[default]
    Soft,
    /// libibverbs / librdmacm (feature `ibverbs`).
    Ibverbs,
}

impl ProviderKind {
    /// The name used in the file.
    pub fn name(self) -> &'static str {
        match self {
            ProviderKind::Soft => "soft",
            ProviderKind::Ibverbs => "ibverbs",
        }
    }
}

/// Hugepage policy of the target's pools (`auto`, `require`, `never`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Hugepages {
    /// Hugepages when reserved, else ordinary pages.
    Auto,
    /// Fail without hugepages.
    Require,
    /// Ordinary pages.
    Never,
}

impl From<Hugepages> for HugepageMode {
    fn from(h: Hugepages) -> Self {
        match h {
            Hugepages::Auto => HugepageMode::Auto,
            Hugepages::Require => HugepageMode::Require,
            Hugepages::Never => HugepageMode::Never,
        }
    }
}

/// A byte count: an integer or a string with a suffix (`"128k"`, `"1M"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub u64);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Size;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a byte count: an integer or a string such as \"128k\"")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Size, E> {
                u64::try_from(v)
                    .map(Size)
                    .map_err(|_| E::custom(format!("{v} is negative")))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Size, E> {
                Ok(Size(v))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Size, E> {
                pollux_bdev::parse_size("size", v)
                    .map(Size)
                    .map_err(|e| E::custom(e.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// `[transport]`: the target's and the RDMA transport's options (SPDK
/// `nvmf_create_transport` names).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransportSection {
    /// Entries per queue.
    pub max_queue_depth: Option<Spanned<u16>>,
    /// Largest transfer of one command.
    pub max_io_size: Option<Spanned<Size>>,
    /// Size of each shared data buffer.
    pub io_unit_size: Option<Spanned<Size>>,
    /// In-capsule data on I/O queues.
    pub in_capsule_data_size: Option<Spanned<Size>>,
    /// Buffers of the shared data pool.
    pub num_shared_buffers: Option<Spanned<usize>>,
    /// Data buffers each core caches.
    pub buf_cache_size: Option<Spanned<usize>>,
    /// Receive buffers per poll group.
    pub max_srq_depth: Option<Spanned<u32>>,
    /// Per-queue receive queues instead of one SRQ per poll group.
    pub no_srq: Option<Spanned<bool>>,
    /// CQ entries per poll group.
    pub num_cqe: Option<Spanned<u32>>,
    /// Answer invalidation requests with SEND_WITH_INVALIDATE.
    pub send_with_invalidate: Option<Spanned<bool>>,
    /// RDMA READs in flight per queue.
    pub max_read_depth: Option<Spanned<u8>>,
    /// Listen backlog.
    pub acceptor_backlog: Option<Spanned<u32>>,
    /// Keep every queue on its listener's core (no placement over cores).
    pub pin_queues_to_listener_core: Option<Spanned<bool>>,
    /// Queue pairs served at once (all cores); more are rejected.
    pub max_qpairs: Option<Spanned<usize>>,
    /// Queue pairs one core serves at once.
    pub max_qpairs_per_core: Option<Spanned<usize>>,
    /// Small per-request buffers shared by every queue.
    pub num_slot_buffers: Option<Spanned<usize>>,
    /// Verbs device name.
    pub device: Option<Spanned<String>>,
    /// Hugepage policy.
    pub hugepages: Option<Spanned<Hugepages>>,
    /// Milliseconds a new queue may take to complete its Fabrics Connect.
    pub connect_timeout_ms: Option<Spanned<u32>>,
    /// `[transport.tcp]`: the NVMe/TCP transport.
    pub tcp: Option<Spanned<TcpSection>>,
}

/// `[transport.tcp]`: NVMe/TCP options (SPDK `nvmf_create_transport -t TCP`
/// names).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TcpSection {
    /// In-capsule data on I/O queues.
    pub in_capsule_data_size: Option<Spanned<Size>>,
    /// Entries per queue.
    pub max_queue_depth: Option<Spanned<u16>>,
    /// I/O queues per controller over TCP.
    pub max_io_qpairs_per_ctrlr: Option<Spanned<u16>>,
    /// C2HData SUCCESS instead of a response capsule after a read.
    pub c2h_success: Option<Spanned<bool>>,
    /// `SO_PRIORITY` of accepted sockets.
    pub sock_priority: Option<Spanned<u8>>,
    /// TCP keep-alive on accepted sockets (not an SPDK option).
    pub keepalive: Option<Spanned<bool>>,
    /// Idle seconds before the first keep-alive probe.
    pub keepalive_idle_s: Option<Spanned<u64>>,
    /// Seconds between keep-alive probes.
    pub keepalive_interval_s: Option<Spanned<u64>>,
    /// Unanswered probes before the connection is dropped.
    pub keepalive_probes: Option<Spanned<u32>>,
    /// Digest policy: `allow`, `disable` or `require`.
    pub digest: Option<Spanned<String>>,
    /// Connections (queues) served at once (all cores); more are refused
    /// (Connect Controller Busy).
    pub max_qpairs: Option<Spanned<usize>>,
    /// Connections one core serves at once.
    pub max_qpairs_per_core: Option<Spanned<usize>>,
}

/// Fills the keep-alive of `o` from `[transport.tcp]`; `seen(name, key,
/// span)` for each key given, `name` as [`TcpOptions::validate`]'s errors
/// name it.
fn tcp_keepalive(
    o: &mut TcpOptions,
    sec: &TcpSection,
    mut seen: impl FnMut(&'static str, &'static str, Range<usize>),
) {
    if let Some(v) = &sec.keepalive {
        o.keepalive = v.get_ref().then(TcpKeepalive::default);
    }
    let Some(k) = o.keepalive.as_mut() else {
        return;
    };
    if let Some(v) = &sec.keepalive_idle_s {
        k.idle = Duration::from_secs(*v.get_ref());
        seen("keepalive idle", "keepalive_idle_s", v.span());
    }
    if let Some(v) = &sec.keepalive_interval_s {
        k.interval = Duration::from_secs(*v.get_ref());
        seen("keepalive interval", "keepalive_interval_s", v.span());
    }
    if let Some(v) = &sec.keepalive_probes {
        k.probes = *v.get_ref();
        seen("keepalive probes", "keepalive_probes", v.span());
    }
}

/// One `[[subsystem]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubsystemSection {
    /// Subsystem NQN.
    pub nqn: Spanned<String>,
    /// Serial number.
    pub serial: Option<Spanned<String>>,
    /// Model number.
    pub model: Option<Spanned<String>>,
    /// Any host may connect.
    pub allow_any_host: Option<Spanned<bool>>,
    /// Host NQNs allowed to connect.
    #[serde(default)]
    pub hosts: Vec<Spanned<String>>,
    /// Largest NSID.
    pub max_namespaces: Option<Spanned<u32>>,
    /// I/O queues per controller.
    pub max_io_queues: Option<Spanned<u16>>,
    /// Namespaces.
    #[serde(default)]
    pub namespaces: Vec<Spanned<NamespaceSection>>,
    /// This subsystem's own listeners (beside the top-level ones).
    #[serde(default)]
    pub listeners: Vec<Spanned<ListenerSection>>,
}

/// One namespace of a subsystem.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceSection {
    /// The bdev's name.
    pub bdev: Spanned<String>,
    /// NSID (lowest free when absent).
    pub nsid: Option<Spanned<u32>>,
}

/// One `[[listener]]`, or one of a subsystem's `listeners`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerSection {
    /// `rdma` (default) or `tcp`.
    pub trtype: Option<Spanned<String>>,
    /// RDMA over the soft provider: `@name` or a socket path; ibverbs and
    /// TCP: an IP address.
    pub traddr: Spanned<String>,
    /// Port (ibverbs and TCP; default 4420); empty for the soft provider.
    pub trsvcid: Option<Spanned<String>>,
}

/// Where a value came from: for errors found after parsing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub col: usize,
    /// The field path (`subsystem[0].nqn`).
    pub field: String,
}

impl Origin {
    fn new(text: &str, span: Range<usize>, field: String) -> Self {
        let (line, col) = line_col(text, span.start);
        Origin { line, col, field }
    }

    /// An [`AppError::Config`] at this place.
    pub fn err(&self, msg: impl std::fmt::Display) -> AppError {
        AppError::Config(format!(
            "line {}, column {}: {}: {msg}",
            self.line, self.col, self.field
        ))
    }
}

/// A bdev to create.
#[derive(Debug, Clone)]
pub struct BdevPlan {
    /// The parsed spec, its name filled in.
    pub spec: BdevSpec,
    /// The bdev's name.
    pub name: String,
    /// The `[[bdev]]` entry.
    pub origin: Origin,
}

/// A namespace to add.
#[derive(Debug, Clone)]
pub struct NamespacePlan {
    /// Bdev name.
    pub bdev: String,
    /// NSID (assigned when the file gave none).
    pub nsid: u32,
    /// The namespace entry.
    pub origin: Origin,
}

/// A subsystem to create.
#[derive(Debug, Clone)]
pub struct SubsystemPlan {
    /// Its configuration.
    pub config: SubsystemConfig,
    /// Its namespaces, in file order.
    pub namespaces: Vec<NamespacePlan>,
    /// Its own listeners (its `listeners`), in file order; it listens on
    /// the top-level ones too ([`TgtPlan::listeners_of`]).
    pub listeners: Vec<ListenerPlan>,
    /// The `[[subsystem]]` entry.
    pub origin: Origin,
}

/// A listener to add.
#[derive(Debug, Clone)]
pub struct ListenerPlan {
    /// The address.
    pub trid: TransportId,
    /// The `[[listener]]` entry.
    pub origin: Origin,
}

/// A checked configuration: everything needed to build the target.
#[derive(Debug, Clone)]
pub struct TgtPlan {
    /// Cores from the file (`None`: not given).
    pub cores: Option<Cores>,
    /// The verbs provider.
    pub provider: ProviderKind,
    /// Target options.
    pub target: TargetOptions,
    /// RDMA transport options.
    pub rdma: RdmaOptions,
    /// NVMe/TCP transport options (`None`: no TCP listener and no
    /// `[transport.tcp]`, no TCP transport).
    pub tcp: Option<TcpOptions>,
    /// Bdevs, in order.
    pub bdevs: Vec<BdevPlan>,
    /// Subsystems, in order.
    pub subsystems: Vec<SubsystemPlan>,
    /// Top-level listeners (every subsystem listens there), in order.
    pub listeners: Vec<ListenerPlan>,
    /// Where each `[transport]` key was given, to place option errors.
    pub option_origins: Vec<(&'static str, Origin)>,
    /// Where each `[transport.tcp]` key was given.
    pub tcp_origins: Vec<(&'static str, Origin)>,
    /// The `[iscsi]` section, checked.
    pub iscsi: Option<super::iscsi::IscsiPlan>,
}

/// The listener's address as the soft provider, ibverbs or TCP sees it, as
/// a host transport ID (`pollux-perf -r`).
pub fn host_trid(provider: ProviderKind, trid: &TransportId, subnqn: &str) -> String {
    if trid.trtype == TrType::Tcp {
        let fam = if trid.adrfam == AdrFam::Ipv6 {
            "ipv6"
        } else {
            "ipv4"
        };
        return format!(
            "trtype:tcp adrfam:{fam} traddr:{} trsvcid:{} subnqn:{subnqn}",
            trid.traddr, trid.trsvcid
        );
    }
    match provider {
        ProviderKind::Soft => format!("trtype:soft traddr:{} subnqn:{subnqn}", trid.traddr),
        ProviderKind::Ibverbs => {
            let fam = if trid.adrfam == AdrFam::Ipv6 {
                "ipv6"
            } else {
                "ipv4"
            };
            format!(
                "trtype:rdma adrfam:{fam} traddr:{} trsvcid:{} subnqn:{subnqn}",
                trid.traddr, trid.trsvcid
            )
        }
    }
}

impl TgtPlan {
    /// Reads and checks a configuration file.
    ///
    /// # Errors
    ///
    /// [`AppError::Config`] naming the file, the line and the field.
    pub fn load(path: &Path) -> Result<TgtPlan, AppError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| AppError::Config(format!("{}: {e}", path.display())))?;
        TgtPlan::parse(&text).map_err(|e| match e {
            AppError::Config(m) => AppError::Config(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    /// Parses and checks configuration text (creates nothing).
    ///
    /// # Errors
    ///
    /// [`AppError::Config`] naming the line and the field.
    pub fn parse(text: &str) -> Result<TgtPlan, AppError> {
        let file: TgtFile = toml::from_str(text).map_err(|e| AppError::Config(e.to_string()))?;
        plan(text, file)
    }

    /// Where hosts may connect to `s`: the top-level listeners, then its
    /// own.
    pub fn listeners_of<'a>(&'a self, s: &'a SubsystemPlan) -> Vec<&'a ListenerPlan> {
        self.listeners.iter().chain(&s.listeners).collect()
    }

    /// Every address of the file: the top-level listeners, then each
    /// subsystem's own, each once.
    pub fn all_listeners(&self) -> Vec<&ListenerPlan> {
        let mut out: Vec<&ListenerPlan> = self.listeners.iter().collect();
        for l in self.subsystems.iter().flat_map(|s| &s.listeners) {
            if !out.iter().any(|x| x.trid == l.trid) {
                out.push(l);
            }
        }
        out
    }

    /// An option error from the target core or the transport, placed at
    /// the `[transport]` key it names (the messages name the options).
    pub fn option_error(&self, msg: impl std::fmt::Display) -> AppError {
        let msg = msg.to_string();
        // The option a message names first is the one it is about.
        let named = self
            .option_origins
            .iter()
            .filter_map(|(k, o)| msg.find(k).map(|pos| (pos, o)))
            .min_by_key(|(pos, _)| *pos)
            .map(|(_, o)| o);
        match named {
            Some(o) => o.err(msg),
            None => AppError::Config(format!("[transport]: {msg}")),
        }
    }
}

fn plan(text: &str, file: TgtFile) -> Result<TgtPlan, AppError> {
    let err = |span: Range<usize>, field: &str, msg: String| at(text, span, field, msg);
    let cores = match &file.cores {
        None => None,
        Some(c) => Some(
            Cores::parse(c.get_ref())
                .map_err(|e| err(c.span(), "cores", format!("'{}': {e}", c.get_ref())))?,
        ),
    };
    let provider = file
        .provider
        .as_ref()
        .map_or(ProviderKind::Soft, |p| *p.get_ref());
    if let Some(p) = &file.provider {
        if provider == ProviderKind::Ibverbs && !cfg!(feature = "ibverbs") {
            return Err(err(
                p.span(),
                "provider",
                "this pollux-tgt was built without the ibverbs feature (cargo build --features ibverbs)"
                    .into(),
            ));
        }
    }

    // [transport]
    let mut target = TargetOptions::default();
    let mut rdma = RdmaOptions::default();
    let mut tcp: Option<TcpOptions> = None;
    let mut tcp_origins: Vec<(&'static str, Origin)> = Vec::new();
    let mut option_origins = Vec::new();
    if let Some(t) = &file.transport {
        let t = t.get_ref();
        let mut seen = |key: &'static str, span: Range<usize>| {
            option_origins.push((key, Origin::new(text, span, format!("transport.{key}"))));
        };
        let size32 = |key: &str, v: &Spanned<Size>| -> Result<u32, AppError> {
            u32::try_from(v.get_ref().0).map_err(|_| {
                err(
                    v.span(),
                    &format!("transport.{key}"),
                    format!("{} bytes is too large", v.get_ref().0),
                )
            })
        };
        if let Some(v) = &t.max_queue_depth {
            target.max_queue_depth = *v.get_ref();
            seen("max_queue_depth", v.span());
        }
        if let Some(v) = &t.max_io_size {
            target.max_io_size = size32("max_io_size", v)?;
            seen("max_io_size", v.span());
        }
        if let Some(v) = &t.io_unit_size {
            target.io_unit_size = size32("io_unit_size", v)?;
            seen("io_unit_size", v.span());
        }
        if let Some(v) = &t.in_capsule_data_size {
            target.in_capsule_data_size = size32("in_capsule_data_size", v)?;
            seen("in_capsule_data_size", v.span());
        }
        if let Some(v) = &t.num_shared_buffers {
            target.num_data_buffers = *v.get_ref();
            seen("num_shared_buffers", v.span());
        }
        if let Some(v) = &t.buf_cache_size {
            target.buffer_cache_size = *v.get_ref();
            seen("buf_cache_size", v.span());
        }
        if let Some(v) = &t.max_srq_depth {
            rdma.max_srq_depth = *v.get_ref();
            seen("max_srq_depth", v.span());
        }
        if let Some(v) = &t.no_srq {
            rdma.no_srq = *v.get_ref();
            seen("no_srq", v.span());
        }
        if let Some(v) = &t.num_cqe {
            rdma.num_cqe = *v.get_ref();
            seen("num_cqe", v.span());
        }
        if let Some(v) = &t.send_with_invalidate {
            rdma.send_with_invalidate = *v.get_ref();
            seen("send_with_invalidate", v.span());
        }
        if let Some(v) = &t.max_read_depth {
            rdma.max_read_depth = *v.get_ref();
            seen("max_read_depth", v.span());
        }
        if let Some(v) = &t.acceptor_backlog {
            rdma.acceptor_backlog = *v.get_ref();
            seen("acceptor_backlog", v.span());
        }
        if let Some(v) = &t.pin_queues_to_listener_core {
            rdma.placement = if *v.get_ref() {
                QueuePlacement::ListenerCore
            } else {
                QueuePlacement::LeastConnections
            };
            seen("pin_queues_to_listener_core", v.span());
        }
        if let Some(v) = &t.max_qpairs {
            rdma.max_qpairs = *v.get_ref();
            seen("max_qpairs", v.span());
        }
        if let Some(v) = &t.max_qpairs_per_core {
            rdma.max_qpairs_per_core = *v.get_ref();
            seen("max_qpairs_per_core", v.span());
        }
        if let Some(v) = &t.num_slot_buffers {
            target.num_slot_buffers = *v.get_ref();
            seen("num_slot_buffers", v.span());
        }
        if let Some(v) = &t.connect_timeout_ms {
            target.connect_timeout_ms = *v.get_ref();
            seen("connect_timeout_ms", v.span());
        }
        if let Some(v) = &t.device {
            rdma.device = Some(v.get_ref().clone());
            seen("device", v.span());
        }
        if let Some(v) = &t.hugepages {
            target.hugepages = (*v.get_ref()).into();
            rdma.hugepages = target.hugepages;
            seen("hugepages", v.span());
        }
        if let Some(sec) = &t.tcp {
            let o = tcp.get_or_insert_with(|| TcpOptions::for_target(&target));
            let sec = sec.get_ref();
            let key = |k: &'static str| format!("transport.tcp.{k}");
            if let Some(v) = &sec.in_capsule_data_size {
                o.in_capsule_data_size = size32("tcp.in_capsule_data_size", v)?;
                tcp_origins.push((
                    "in_capsule_data_size",
                    Origin::new(text, v.span(), key("in_capsule_data_size")),
                ));
            }
            if let Some(v) = &sec.max_queue_depth {
                o.max_queue_depth = *v.get_ref();
                tcp_origins.push((
                    "max_queue_depth",
                    Origin::new(text, v.span(), key("max_queue_depth")),
                ));
            }
            if let Some(v) = &sec.max_io_qpairs_per_ctrlr {
                o.max_io_qpairs_per_ctrlr = *v.get_ref();
                tcp_origins.push((
                    "max_io_qpairs_per_ctrlr",
                    Origin::new(text, v.span(), key("max_io_qpairs_per_ctrlr")),
                ));
            }
            if let Some(v) = &sec.c2h_success {
                o.c2h_success = *v.get_ref();
            }
            if let Some(v) = &sec.sock_priority {
                o.sock_priority = *v.get_ref();
                tcp_origins.push((
                    "sock_priority",
                    Origin::new(text, v.span(), key("sock_priority")),
                ));
            }
            if let Some(v) = &sec.digest {
                o.digest = DigestPolicy::parse(v.get_ref())
                    .map_err(|e| err(v.span(), &key("digest"), e.to_string()))?;
            }
            tcp_keepalive(o, sec, |name, k, span| {
                tcp_origins.push((name, Origin::new(text, span, key(k))))
            });
            for (k, v, field) in [
                ("max_qpairs", &sec.max_qpairs, &mut o.max_qpairs),
                (
                    "max_qpairs_per_core",
                    &sec.max_qpairs_per_core,
                    &mut o.max_qpairs_per_core,
                ),
            ] {
                if let Some(v) = v {
                    *field = *v.get_ref();
                    tcp_origins.push((k, Origin::new(text, v.span(), key(k))));
                }
            }
        }
    }

    // Bdevs: parse every spec, fill in the names the registry would pick.
    let mut bdevs: Vec<BdevPlan> = Vec::with_capacity(file.bdev.len());
    for (i, b) in file.bdev.iter().enumerate() {
        let field = format!("bdev[{i}]");
        let origin = Origin::new(text, b.span(), field.clone());
        let spec_text = b.get_ref().to_spec().map_err(|e| origin.err(e))?;
        let mut spec = BdevSpec::parse(&spec_text).map_err(|e| origin.err(e))?;
        spec.validate().map_err(|e| origin.err(e))?;
        let name = match &spec.name {
            Some(n) => n.clone(),
            None => {
                let ty = spec.backend.type_name();
                (0u64..)
                    .map(|n| format!("{ty}{n}"))
                    .find(|n| bdevs.iter().all(|b| &b.name != n))
                    .unwrap_or_else(|| ty.to_owned())
            }
        };
        if let Some(prev) = bdevs.iter().find(|b| b.name == name) {
            return Err(origin.err(format!(
                "a bdev named '{name}' is already defined at line {}",
                prev.origin.line
            )));
        }
        spec.name = Some(name.clone());
        bdevs.push(BdevPlan { spec, name, origin });
    }

    let iscsi = match &file.iscsi {
        Some(sec) => {
            let names: Vec<String> = bdevs.iter().map(|b| b.name.clone()).collect();
            Some(super::iscsi::plan(text, sec, &names, provider)?)
        }
        None => None,
    };

    // Subsystems and namespaces (none is fine: a target may start empty
    // and be built up over JSON-RPC).
    let mut subsystems: Vec<SubsystemPlan> = Vec::with_capacity(file.subsystem.len());
    // bdev name -> where it backs a namespace already.
    let mut used: HashMap<String, Origin> = HashMap::new();
    for (si, s) in file.subsystem.iter().enumerate() {
        let origin = Origin::new(text, s.span(), format!("subsystem[{si}]"));
        let s = s.get_ref();
        let f = |k: &str| format!("subsystem[{si}].{k}");
        let nqn = s.nqn.get_ref();
        if !is_valid_nqn(nqn) {
            return Err(err(
                s.nqn.span(),
                &f("nqn"),
                format!("'{nqn}' is not a valid NQN (nqn.yyyy-mm.reverse.domain:name, at most 223 bytes)"),
            ));
        }
        if nqn == DISCOVERY_NQN {
            return Err(err(
                s.nqn.span(),
                &f("nqn"),
                "the discovery subsystem exists already; give an NVM subsystem's NQN".into(),
            ));
        }
        if let Some(prev) = subsystems.iter().find(|p| p.config.nqn == *nqn) {
            return Err(err(
                s.nqn.span(),
                &f("nqn"),
                format!(
                    "subsystem '{nqn}' is already defined at line {}",
                    prev.origin.line
                ),
            ));
        }
        let mut config = SubsystemConfig::new(nqn.clone());
        if let Some(v) = &s.serial {
            check_ascii(v.get_ref(), 20).map_err(|m| err(v.span(), &f("serial"), m))?;
            config.serial = v.get_ref().clone();
        }
        if let Some(v) = &s.model {
            check_ascii(v.get_ref(), 40).map_err(|m| err(v.span(), &f("model"), m))?;
            config.model = v.get_ref().clone();
        }
        let mut hosts = BTreeSet::new();
        for (hi, h) in s.hosts.iter().enumerate() {
            let field = f(&format!("hosts[{hi}]"));
            if !is_valid_nqn(h.get_ref()) {
                return Err(err(
                    h.span(),
                    &field,
                    format!("'{}' is not a valid host NQN", h.get_ref()),
                ));
            }
            if !hosts.insert(h.get_ref().clone()) {
                return Err(err(
                    h.span(),
                    &field,
                    format!("host '{}' is listed twice", h.get_ref()),
                ));
            }
        }
        config.hosts = hosts.into_iter().collect();
        config.allow_any_host = match &s.allow_any_host {
            Some(a) if *a.get_ref() && !config.hosts.is_empty() => {
                return Err(err(
                    a.span(),
                    &f("allow_any_host"),
                    "allow_any_host = true with a hosts list: the list would be ignored; keep one of them"
                        .into(),
                ))
            }
            Some(a) if !*a.get_ref() && config.hosts.is_empty() => {
                return Err(err(
                    a.span(),
                    &f("allow_any_host"),
                    "allow_any_host = false and no hosts: no host could connect".into(),
                ))
            }
            Some(a) => *a.get_ref(),
            None if config.hosts.is_empty() => {
                return Err(origin.err(
                    "no host may connect: set allow_any_host = true or list hosts = [\"nqn...\"]",
                ))
            }
            None => false,
        };
        if let Some(v) = &s.max_namespaces {
            if !(1..=DEFAULT_MAX_NAMESPACES).contains(v.get_ref()) {
                return Err(err(
                    v.span(),
                    &f("max_namespaces"),
                    format!("{} is not in 1..={DEFAULT_MAX_NAMESPACES}", v.get_ref()),
                ));
            }
            config.max_namespaces = *v.get_ref();
        }
        if let Some(v) = &s.max_io_queues {
            if *v.get_ref() == 0 {
                return Err(err(
                    v.span(),
                    &f("max_io_queues"),
                    "must be at least 1".into(),
                ));
            }
            config.max_io_queues = *v.get_ref();
        }
        if s.namespaces.is_empty() {
            return Err(origin.err("no namespaces: add namespaces = [{ bdev = \"NAME\" }]"));
        }
        // Fixed NSIDs first, then the lowest free ones for the rest.
        let mut taken: HashMap<u32, usize> = HashMap::new();
        for (ni, n) in s.namespaces.iter().enumerate() {
            if let Some(v) = &n.get_ref().nsid {
                let id = *v.get_ref();
                let field = f(&format!("namespaces[{ni}].nsid"));
                if id == 0 || id > config.max_namespaces {
                    return Err(err(
                        v.span(),
                        &field,
                        format!("NSID {id} is not in 1..={}", config.max_namespaces),
                    ));
                }
                if let Some(&other) = taken.get(&id) {
                    return Err(err(
                        v.span(),
                        &field,
                        format!("duplicate NSID {id} (also namespaces[{other}])"),
                    ));
                }
                taken.insert(id, ni);
            }
        }
        let mut namespaces = Vec::with_capacity(s.namespaces.len());
        let mut next_free = 1u32;
        for (ni, n) in s.namespaces.iter().enumerate() {
            let ns_origin = Origin::new(text, n.span(), f(&format!("namespaces[{ni}]")));
            let n = n.get_ref();
            let name = n.bdev.get_ref();
            let field = f(&format!("namespaces[{ni}].bdev"));
            if !bdevs.iter().any(|b| &b.name == name) {
                let known: Vec<&str> = bdevs.iter().map(|b| b.name.as_str()).collect();
                return Err(err(
                    n.bdev.span(),
                    &field,
                    format!(
                        "no bdev named '{name}' (defined: {})",
                        if known.is_empty() {
                            "none".to_string()
                        } else {
                            known.join(", ")
                        }
                    ),
                ));
            }
            if let Some(prev) = used.get(name) {
                return Err(err(
                    n.bdev.span(),
                    &field,
                    format!(
                        "bdev '{name}' already backs {} (line {})",
                        prev.field, prev.line
                    ),
                ));
            }
            used.insert(name.clone(), ns_origin.clone());
            let nsid = match &n.nsid {
                Some(v) => *v.get_ref(),
                None => {
                    while taken.contains_key(&next_free) {
                        next_free += 1;
                    }
                    if next_free > config.max_namespaces {
                        return Err(ns_origin.err(format!(
                            "no free NSID left (max_namespaces = {})",
                            config.max_namespaces
                        )));
                    }
                    taken.insert(next_free, ni);
                    next_free
                }
            };
            namespaces.push(NamespacePlan {
                bdev: name.clone(),
                nsid,
                origin: ns_origin,
            });
        }
        subsystems.push(SubsystemPlan {
            config,
            namespaces,
            listeners: Vec::new(),
            origin,
        });
    }

    // Listeners (a file without subsystems needs none).
    if file.listener.is_empty()
        && iscsi.is_none()
        && file
            .subsystem
            .iter()
            .any(|s| s.get_ref().listeners.is_empty())
    {
        return Err(AppError::Config(
            "listener: no [[listener]]: no host could reach the target (soft provider: traddr = \"@pollux-tgt\")"
                .into(),
        ));
    }
    let mut parse = |l: &Spanned<ListenerSection>, field: String| {
        listener_plan(text, l, &field, provider, &mut tcp, &target)
    };
    let mut listeners: Vec<ListenerPlan> = Vec::with_capacity(file.listener.len());
    for (li, l) in file.listener.iter().enumerate() {
        let p = parse(l, format!("listener[{li}]"))?;
        if let Some(prev) = listeners.iter().find(|x| x.trid == p.trid) {
            return Err(p.origin.err(format!(
                "the same address as listener at line {}",
                prev.origin.line
            )));
        }
        listeners.push(p);
    }
    for (si, s) in file.subsystem.iter().enumerate() {
        let mut own: Vec<ListenerPlan> = Vec::new();
        for (li, l) in s.get_ref().listeners.iter().enumerate() {
            let p = parse(l, format!("subsystem[{si}].listeners[{li}]"))?;
            if let Some(prev) = listeners.iter().find(|x| x.trid == p.trid) {
                return Err(p.origin.err(format!(
                    "every subsystem listens there already ([[listener]] at line {})",
                    prev.origin.line
                )));
            }
            if let Some(prev) = own.iter().find(|x| x.trid == p.trid) {
                return Err(p.origin.err(format!(
                    "the same address as {} (line {})",
                    prev.origin.field, prev.origin.line
                )));
            }
            own.push(p);
        }
        subsystems[si].listeners = own;
    }

    if let Some(t) = tcp.as_mut() {
        // One placement policy for every transport.
        t.placement = rdma.placement;
    }
    let plan = TgtPlan {
        cores,
        provider,
        target,
        rdma,
        tcp,
        bdevs,
        subsystems,
        listeners,
        option_origins,
        tcp_origins,
        iscsi,
    };
    plan.check_options()?;
    Ok(plan)
}

/// One listener entry (a `[[listener]]` or one of a subsystem's
/// `listeners`, at `field`), checked; a TCP one turns the TCP transport on.
fn listener_plan(
    text: &str,
    entry: &Spanned<ListenerSection>,
    field: &str,
    provider: ProviderKind,
    tcp: &mut Option<TcpOptions>,
    target: &TargetOptions,
) -> Result<ListenerPlan, AppError> {
    let err = |span: Range<usize>, field: &str, msg: String| at(text, span, field, msg);
    let origin = Origin::new(text, entry.span(), field.to_owned());
    let l = entry.get_ref();
    let f = |k: &str| format!("{field}.{k}");
    let is_tcp = match &l.trtype {
        None => false,
        Some(t) if t.get_ref().eq_ignore_ascii_case("rdma") => false,
        Some(t) if t.get_ref().eq_ignore_ascii_case("tcp") => true,
        Some(t) => {
            return Err(err(
                t.span(),
                &f("trtype"),
                format!("'{}': expected rdma or tcp", t.get_ref()),
            ))
        }
    };
    let traddr = l.traddr.get_ref().trim().to_string();
    let svc = l.trsvcid.as_ref();
    let ip_kind = if is_tcp {
        tcp.get_or_insert_with(|| TcpOptions::for_target(target));
        ProviderKind::Ibverbs
    } else {
        provider
    };
    let (adrfam, trsvcid) = match ip_kind {
        ProviderKind::Soft => {
            if !(traddr.len() > 1 && (traddr.starts_with('@') || traddr.starts_with('/'))) {
                return Err(err(
                    l.traddr.span(),
                    &f("traddr"),
                    format!("'{traddr}': the soft provider listens on an abstract socket name (@pollux-tgt) or a socket path (/run/pollux-tgt.sock)"),
                ));
            }
            if let Some(s) = svc.filter(|s| !s.get_ref().is_empty()) {
                return Err(err(
                    s.span(),
                    &f("trsvcid"),
                    "the soft provider has no ports: leave trsvcid empty".into(),
                ));
            }
            (AdrFam::IntraHost, String::new())
        }
        ProviderKind::Ibverbs => {
            let ip: IpAddr = traddr.parse().map_err(|_| {
                err(
                    l.traddr.span(),
                    &f("traddr"),
                    format!(
                        "'{traddr}' is not an IP address ({})",
                        if is_tcp { "tcp" } else { "ibverbs" }
                    ),
                )
            })?;
            let port = match svc {
                None => "4420".to_string(),
                Some(s) => {
                    s.get_ref()
                        .parse::<u16>()
                        .ok()
                        .filter(|p| *p != 0)
                        .ok_or_else(|| {
                            err(
                                s.span(),
                                &f("trsvcid"),
                                format!("'{}' is not a port number", s.get_ref()),
                            )
                        })?;
                    s.get_ref().clone()
                }
            };
            let fam = if ip.is_ipv4() {
                AdrFam::Ipv4
            } else {
                AdrFam::Ipv6
            };
            (fam, port)
        }
    };
    let trid = TransportId {
        trtype: if is_tcp { TrType::Tcp } else { TrType::Rdma },
        adrfam,
        traddr,
        trsvcid,
    };
    Ok(ListenerPlan { trid, origin })
}

impl TgtPlan {
    /// The target core's and the transport's own option checks, without
    /// allocating the data pool (a one-buffer probe target).
    fn check_options(&self) -> Result<(), AppError> {
        if self.target.num_data_buffers == 0 {
            return Err(self.option_error("num_shared_buffers must be positive"));
        }
        let probe = TargetOptions {
            num_data_buffers: 1,
            buffer_cache_size: 1,
            hugepages: HugepageMode::Never,
            num_slot_buffers: 0,
            ..self.target.clone()
        };
        Target::new(probe).map_err(|e| self.option_error(e))?;
        self.rdma
            .validate(&self.target)
            .map_err(|e| self.option_error(e))?;
        if let Some(t) = &self.tcp {
            t.validate(&self.target).map_err(|e| {
                let msg = e.to_string();
                match self.tcp_origins.iter().find(|(k, _)| msg.contains(k)) {
                    Some((_, o)) => o.err(msg),
                    None => AppError::Config(format!("[transport.tcp]: {msg}")),
                }
            })?;
        }
        Ok(())
    }
}

fn check_ascii(s: &str, max: usize) -> Result<(), String> {
    if s.is_empty() || s.len() > max || !s.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(format!(
            "'{s}' must be 1 to {max} printable ASCII characters"
        ));
    }
    Ok(())
}
