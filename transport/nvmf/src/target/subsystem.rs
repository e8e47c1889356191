//! Subsystems: NQN, serial, model, namespaces (each a bdev), host access and
//! the subsystem's controllers.
//!
//! Control plane: a `Subsystem` is shared (`Arc`) and its mutable state sits
//! behind a `Mutex` taken only on the control path (configuration, Connect,
//! admin commands, keep-alive expiry). I/O queues read the namespace
//! generation (an atomic) and rebuild their own namespace view when it
//! changes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use pollux_reactor::sync::{Mutex, MutexGuard};

use pollux_bdev::{Bdev, BdevDesc, IoType, PiType};

use super::ctrlr::Controller;
use super::ctrlr_stats::CtrlCounters;
use super::error::TargetError;
use super::health::HealthCounters;
use crate::spec::connect::is_valid_nqn;
use crate::spec::features::{AsyncEvent, AEN_DISCOVERY_CHANGE};
use crate::spec::transport_id::TransportId;

/// The well-known discovery subsystem NQN.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// Largest NSID a subsystem hands out by default (Identify NN).
pub const DEFAULT_MAX_NAMESPACES: u32 = 1024;
/// Default controller id range (0xFFF0..=0xFFFF are reserved).
pub const DEFAULT_CNTLID_RANGE: (u16, u16) = (1, 0xFFEF);

/// How to create a subsystem.
#[derive(Debug, Clone)]
pub struct SubsystemConfig {
    /// NQN (`nqn.yyyy-mm.reverse.domain:name`).
    pub nqn: String,
    /// Serial number (20 ASCII characters at most).
    pub serial: String,
    /// Model number (40 ASCII characters at most).
    pub model: String,
    /// Any host may connect (otherwise only `hosts`).
    pub allow_any_host: bool,
    /// Host NQNs allowed to connect.
    pub hosts: Vec<String>,
    /// Largest NSID (Identify NN), at most 1024 here.
    pub max_namespaces: u32,
    /// Controller ids handed out, inclusive.
    pub cntlid_range: (u16, u16),
    /// Most I/O queues per controller (Number of Queues grant, largest QID).
    pub max_io_queues: u16,
}

impl SubsystemConfig {
    /// A subsystem open to any host, serial and model derived from the NQN.
    pub fn new(nqn: impl Into<String>) -> Self {
        let nqn = nqn.into();
        let serial = format!("PLX{:017X}", fnv1a(nqn.as_bytes(), 0));
        SubsystemConfig {
            serial: serial.chars().take(20).collect(),
            model: "Pollux NVMe-oF target".into(),
            nqn,
            allow_any_host: true,
            hosts: Vec::new(),
            max_namespaces: DEFAULT_MAX_NAMESPACES,
            cntlid_range: DEFAULT_CNTLID_RANGE,
            max_io_queues: 127,
        }
    }

    /// Only the listed hosts may connect.
    pub fn allow_hosts<I, S>(mut self, hosts: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.allow_any_host = false;
        self.hosts = hosts.into_iter().map(Into::into).collect();
        self
    }
}

/// How to add a namespace. Identifiers not given are derived from the
/// subsystem NQN and the NSID (a stable hash), so they survive restarts.
#[derive(Debug, Clone)]
pub struct NamespaceConfig {
    /// The backing bdev (opened writable).
    pub bdev: Arc<Bdev>,
    /// NSID; `None` takes the lowest free one.
    pub nsid: Option<u32>,
    /// NGUID override.
    pub nguid: Option<[u8; 16]>,
    /// EUI-64 override.
    pub eui64: Option<[u8; 8]>,
    /// UUID override.
    pub uuid: Option<[u8; 16]>,
}

impl NamespaceConfig {
    /// A namespace on `bdev` with the lowest free NSID.
    pub fn new(bdev: Arc<Bdev>) -> Self {
        NamespaceConfig {
            bdev,
            nsid: None,
            nguid: None,
            eui64: None,
            uuid: None,
        }
    }

    /// With a fixed NSID.
    pub fn with_nsid(mut self, nsid: u32) -> Self {
        self.nsid = Some(nsid);
        self
    }
}

/// A namespace: an NSID backed by a bdev.
#[derive(Debug)]
pub struct Namespace {
    nsid: u32,
    desc: BdevDesc,
    nguid: [u8; 16],
    eui64: [u8; 8],
    uuid: [u8; 16],
}

impl Namespace {
    /// NSID.
    pub fn nsid(&self) -> u32 {
        self.nsid
    }

    /// The backing bdev.
    pub fn bdev(&self) -> &Arc<Bdev> {
        self.desc.bdev()
    }

    /// The open descriptor (writable).
    pub fn desc(&self) -> &BdevDesc {
        &self.desc
    }

    /// NGUID.
    pub fn nguid(&self) -> [u8; 16] {
        self.nguid
    }

    /// EUI-64.
    pub fn eui64(&self) -> [u8; 8] {
        self.eui64
    }

    /// UUID.
    pub fn uuid(&self) -> [u8; 16] {
        self.uuid
    }

    /// Block size in bytes.
    pub fn block_size(&self) -> u32 {
        self.bdev().info().block_size()
    }

    /// Size in blocks.
    pub fn num_blocks(&self) -> u64 {
        self.bdev().info().num_blocks()
    }

    /// Metadata bytes per block (0: none), interleaved after each block's
    /// data on the wire (extended LBA) as in the bdev's buffers.
    pub fn md_size(&self) -> u32 {
        self.bdev().info().md_size()
    }

    /// The PI type (0: none, 1-3), in the last 8 bytes of the metadata.
    pub fn pi_type(&self) -> u8 {
        pi_type_code(self.bdev().info().pi_type())
    }
}

/// The NVMe PI type number of a bdev's PI type (0: none, 1-3).
pub(crate) fn pi_type_code(t: PiType) -> u8 {
    match t {
        PiType::None => 0,
        PiType::Type1 => 1,
        PiType::Type2 => 2,
        PiType::Type3 => 3,
    }
}

/// Which kind of subsystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubsystemKind {
    /// An NVM subsystem with namespaces and I/O queues.
    Nvm,
    /// The discovery subsystem: admin queue only, serves the discovery log.
    Discovery,
}

/// What the target shares with its subsystems: the discovery log generation
/// counter and the discovery subsystem to notify when it changes.
#[derive(Debug, Default)]
pub(crate) struct DiscoveryGen {
    genctr: AtomicU64,
    discovery: OnceLock<Weak<Subsystem>>,
}

impl DiscoveryGen {
    pub(crate) fn set_discovery(&self, d: &Arc<Subsystem>) {
        let _ = self.discovery.set(Arc::downgrade(d));
    }

    pub(crate) fn get(&self) -> u64 {
        self.genctr.load(Ordering::Acquire)
    }

    /// The discovery log changed: bump the counter and raise the
    /// discovery-change event on every discovery controller that asked.
    pub(crate) fn bump(&self) {
        self.genctr.fetch_add(1, Ordering::AcqRel);
        if let Some(d) = self.discovery.get().and_then(Weak::upgrade) {
            for c in d.controllers() {
                c.raise_event(AsyncEvent::DISCOVERY_CHANGED, AEN_DISCOVERY_CHANGE);
            }
        }
    }
}

#[derive(Debug)]
struct SubsysState {
    namespaces: BTreeMap<u32, Arc<Namespace>>,
    allow_any_host: bool,
    hosts: BTreeSet<String>,
    ctrlrs: BTreeMap<u16, Arc<Controller>>,
    next_cntlid: u16,
    /// The addresses hosts may connect to this subsystem through, in the
    /// order added (the [`Target`](super::Target) keeps them, with the
    /// transports' listening, under its own lock).
    listeners: Vec<TransportId>,
}

/// An NVM (or the discovery) subsystem.
#[derive(Debug)]
pub struct Subsystem {
    nqn: String,
    serial: String,
    model: String,
    kind: SubsystemKind,
    max_namespaces: u32,
    cntlid_range: (u16, u16),
    max_io_queues: u16,
    ns_gen: AtomicU64,
    state: Mutex<SubsysState>,
    disc: Arc<DiscoveryGen>,
    counters: CtrlCounters,
    health: HealthCounters,
}

impl Subsystem {
    pub(crate) fn new(
        cfg: SubsystemConfig,
        kind: SubsystemKind,
        disc: Arc<DiscoveryGen>,
    ) -> Result<Arc<Subsystem>, TargetError> {
        if !is_valid_nqn(&cfg.nqn) {
            return Err(TargetError::InvalidNqn(cfg.nqn));
        }
        if cfg.max_namespaces == 0 || cfg.max_namespaces > DEFAULT_MAX_NAMESPACES {
            return Err(TargetError::InvalidOption(
                "max_namespaces must be 1..=1024",
            ));
        }
        let (lo, hi) = cfg.cntlid_range;
        if lo == 0 || lo > hi || hi > DEFAULT_CNTLID_RANGE.1 {
            return Err(TargetError::InvalidOption(
                "cntlid range must lie in 1..=0xFFEF",
            ));
        }
        if cfg.max_io_queues == 0 {
            return Err(TargetError::InvalidOption(
                "max_io_queues must be at least 1",
            ));
        }
        let printable = |s: &str| s.bytes().all(|c| (0x20..0x7f).contains(&c));
        if cfg.serial.len() > 20
            || cfg.model.len() > 40
            || !printable(&cfg.serial)
            || !printable(&cfg.model)
        {
            return Err(TargetError::InvalidOption(
                "serial ≤ 20 and model ≤ 40 printable ASCII",
            ));
        }
        Ok(Arc::new(Subsystem {
            nqn: cfg.nqn,
            serial: cfg.serial,
            model: cfg.model,
            kind,
            max_namespaces: cfg.max_namespaces,
            cntlid_range: cfg.cntlid_range,
            max_io_queues: cfg.max_io_queues,
            ns_gen: AtomicU64::new(0),
            state: Mutex::new(SubsysState {
                namespaces: BTreeMap::new(),
                allow_any_host: cfg.allow_any_host,
                hosts: cfg.hosts.into_iter().collect(),
                ctrlrs: BTreeMap::new(),
                next_cntlid: lo,
                listeners: Vec::new(),
            }),
            disc,
            counters: CtrlCounters::default(),
            health: HealthCounters::default(),
        }))
    }

    /// Its controllers' Keep Alive, keep-alive timeout and event counters.
    pub fn counters(&self) -> &CtrlCounters {
        &self.counters
    }

    /// Its SMART / Health counters.
    pub fn health(&self) -> &HealthCounters {
        &self.health
    }

    fn lock(&self) -> MutexGuard<'_, SubsysState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// NQN.
    pub fn nqn(&self) -> &str {
        &self.nqn
    }

    /// Serial number.
    pub fn serial(&self) -> &str {
        &self.serial
    }

    /// Model number.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Kind.
    pub fn kind(&self) -> SubsystemKind {
        self.kind
    }

    /// Whether this is the discovery subsystem.
    pub fn is_discovery(&self) -> bool {
        self.kind == SubsystemKind::Discovery
    }

    /// Largest NSID (Identify NN).
    pub fn max_namespaces(&self) -> u32 {
        self.max_namespaces
    }

    /// Most I/O queues per controller.
    pub fn max_io_queues(&self) -> u16 {
        self.max_io_queues
    }

    /// Add a namespace (control path). Every controller of the subsystem
    /// gets a namespace-changed event.
    ///
    /// # Errors
    ///
    /// [`TargetError::DiscoverySubsystem`], [`TargetError::InvalidNsid`],
    /// [`TargetError::NamespaceExists`], [`TargetError::NamespaceLimit`],
    /// [`TargetError::UnsupportedBdev`] (separate metadata, which a fabric
    /// cannot carry; a bdev that cannot read and write), or the bdev's
    /// open error.
    pub fn add_namespace(&self, cfg: NamespaceConfig) -> Result<u32, TargetError> {
        if self.is_discovery() {
            return Err(TargetError::DiscoverySubsystem);
        }
        let info = cfg.bdev.info();
        // Fabrics carry metadata only interleaved with the data (extended
        // LBAs); there is no separate metadata pointer.
        if info.md_size() != 0 && !info.md_interleave() {
            return Err(TargetError::UnsupportedBdev {
                name: info.name().to_owned(),
                why: "separate metadata cannot cross a fabric (format it interleaved: md_interleave=true)",
            });
        }
        if !cfg.bdev.supports(IoType::Read) || !cfg.bdev.supports(IoType::Write) {
            return Err(TargetError::UnsupportedBdev {
                name: info.name().to_owned(),
                why: "it cannot read and write",
            });
        }
        let mut st = self.lock();
        let nsid = match cfg.nsid {
            Some(id) => {
                if id == 0 || id > self.max_namespaces {
                    return Err(TargetError::InvalidNsid(id));
                }
                if st.namespaces.contains_key(&id) {
                    return Err(TargetError::NamespaceExists(id));
                }
                id
            }
            None => (1..=self.max_namespaces)
                .find(|id| !st.namespaces.contains_key(id))
                .ok_or(TargetError::NamespaceLimit)?,
        };
        let desc = cfg.bdev.open(true)?;
        let ns = Namespace {
            nsid,
            desc,
            nguid: cfg
                .nguid
                .unwrap_or_else(|| derive_id(&self.nqn, nsid, b"nguid")),
            eui64: cfg.eui64.unwrap_or_else(|| {
                let id = derive_id(&self.nqn, nsid, b"eui64");
                let mut e = [0u8; 8];
                e.copy_from_slice(&id[..8]);
                e
            }),
            uuid: cfg.uuid.unwrap_or_else(|| {
                // An RFC 9562 version 8 (custom) UUID.
                let mut u = derive_id(&self.nqn, nsid, b"uuid");
                u[6] = (u[6] & 0x0F) | 0x80;
                u[8] = (u[8] & 0x3F) | 0x80;
                u
            }),
        };
        st.namespaces.insert(nsid, Arc::new(ns));
        self.ns_gen.fetch_add(1, Ordering::AcqRel);
        let ctrlrs: Vec<_> = st.ctrlrs.values().cloned().collect();
        drop(st);
        for c in ctrlrs {
            c.ns_changed(nsid);
        }
        Ok(nsid)
    }

    /// Remove a namespace (control path). In-flight I/O finishes; new I/O
    /// to the NSID gets Invalid Namespace. Controllers get an event.
    ///
    /// # Errors
    ///
    /// [`TargetError::NoSuchNamespace`].
    pub fn remove_namespace(&self, nsid: u32) -> Result<(), TargetError> {
        let mut st = self.lock();
        if st.namespaces.remove(&nsid).is_none() {
            return Err(TargetError::NoSuchNamespace(nsid));
        }
        self.ns_gen.fetch_add(1, Ordering::AcqRel);
        let ctrlrs: Vec<_> = st.ctrlrs.values().cloned().collect();
        drop(st);
        for c in ctrlrs {
            c.ns_changed(nsid);
        }
        Ok(())
    }

    /// The namespace `nsid`.
    pub fn namespace(&self, nsid: u32) -> Option<Arc<Namespace>> {
        self.lock().namespaces.get(&nsid).cloned()
    }

    /// Every namespace, by NSID.
    pub fn namespaces(&self) -> Vec<Arc<Namespace>> {
        self.lock().namespaces.values().cloned().collect()
    }

    /// Allow `hostnqn` (control path; changes the discovery log).
    pub fn allow_host(&self, hostnqn: impl Into<String>) {
        self.lock().hosts.insert(hostnqn.into());
        self.disc.bump();
    }

    /// Stop allowing `hostnqn` (existing controllers stay).
    pub fn disallow_host(&self, hostnqn: &str) {
        self.lock().hosts.remove(hostnqn);
        self.disc.bump();
    }

    /// Allow any host, or only the listed ones.
    pub fn set_allow_any_host(&self, any: bool) {
        self.lock().allow_any_host = any;
        self.disc.bump();
    }

    /// Whether any host may connect.
    pub fn allows_any_host(&self) -> bool {
        self.lock().allow_any_host
    }

    /// The host NQNs allowed to connect, sorted.
    pub fn hosts(&self) -> Vec<String> {
        self.lock().hosts.iter().cloned().collect()
    }

    /// The controller ids it hands out, inclusive.
    pub fn cntlid_range(&self) -> (u16, u16) {
        self.cntlid_range
    }

    /// Whether `hostnqn` may connect (and see the subsystem in discovery).
    pub fn host_allowed(&self, hostnqn: &str) -> bool {
        if self.is_discovery() {
            return true;
        }
        let st = self.lock();
        st.allow_any_host || st.hosts.contains(hostnqn)
    }

    /// The addresses this subsystem listens on, in the order added
    /// ([`Target::add_subsystem_listener`](super::Target::add_subsystem_listener));
    /// the target's own listeners
    /// ([`Target::add_listener`](super::Target::add_listener)) are not
    /// among them.
    pub fn listeners(&self) -> Vec<TransportId> {
        self.lock().listeners.clone()
    }

    /// Whether this subsystem listens on `trid` (its own listeners only).
    pub fn listens_on(&self, trid: &TransportId) -> bool {
        self.lock().listeners.contains(trid)
    }

    /// Record `trid` as a listener (the target checked it is new and
    /// listens there).
    pub(crate) fn insert_listener(&self, trid: TransportId) {
        self.lock().listeners.push(trid);
    }

    /// Forget the listener `trid`; `false` when it was none.
    pub(crate) fn take_listener(&self, trid: &TransportId) -> bool {
        let mut st = self.lock();
        let before = st.listeners.len();
        st.listeners.retain(|t| t != trid);
        st.listeners.len() != before
    }

    /// Forget every listener; returns them.
    pub(crate) fn take_listeners(&self) -> Vec<TransportId> {
        std::mem::take(&mut self.lock().listeners)
    }

    /// Live controllers.
    pub fn controllers(&self) -> Vec<Arc<Controller>> {
        self.lock().ctrlrs.values().cloned().collect()
    }

    /// Number of live controllers.
    pub fn controller_count(&self) -> usize {
        self.lock().ctrlrs.len()
    }

    /// The controller `cntlid`.
    pub fn controller(&self, cntlid: u16) -> Option<Arc<Controller>> {
        self.lock().ctrlrs.get(&cntlid).cloned()
    }

    pub(crate) fn ns_generation(&self) -> u64 {
        self.ns_gen.load(Ordering::Acquire)
    }

    /// Register a new controller under a free cntlid (round robin in the
    /// range, so a just-freed id is not reused at once). `None`: all taken.
    pub(crate) fn register_controller(
        &self,
        make: impl FnOnce(u16) -> Arc<Controller>,
    ) -> Option<Arc<Controller>> {
        let mut st = self.lock();
        let (lo, hi) = self.cntlid_range;
        let span = u32::from(hi - lo) + 1;
        let mut id = st.next_cntlid.clamp(lo, hi);
        let mut free = None;
        for _ in 0..span {
            if !st.ctrlrs.contains_key(&id) {
                free = Some(id);
                break;
            }
            id = if id == hi { lo } else { id + 1 };
        }
        let id = free?;
        let c = make(id);
        st.ctrlrs.insert(id, Arc::clone(&c));
        self.counters.controller_created();
        st.next_cntlid = if id == hi { lo } else { id + 1 };
        Some(c)
    }

    /// Forget controller `cntlid` (its id becomes free).
    pub(crate) fn unregister_controller(&self, cntlid: u16) {
        self.lock().ctrlrs.remove(&cntlid);
    }
}

/// FNV-1a over `data`, seeded: a stable hash (the std hasher may change
/// between Rust releases; these identifiers must not).
fn fnv1a(data: &[u8], seed: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed;
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    h
}

/// A 16-byte identifier derived from the subsystem NQN, the NSID and a salt.
pub(crate) fn derive_id(nqn: &str, nsid: u32, salt: &[u8]) -> [u8; 16] {
    let mut data = Vec::with_capacity(nqn.len() + 4 + salt.len());
    data.extend_from_slice(salt);
    data.extend_from_slice(nqn.as_bytes());
    data.extend_from_slice(&nsid.to_le_bytes());
    let hi = fnv1a(&data, 0x5eed_0001);
    let lo = fnv1a(&data, 0x5eed_0002);
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&hi.to_be_bytes());
    out[8..].copy_from_slice(&lo.to_be_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_ids_are_stable_and_distinct() {
        let a = derive_id("nqn.2024-01.io.pollux:a", 1, b"nguid");
        // Fixed value: a change here breaks every host's view of its disks.
        assert_eq!(a, derive_id("nqn.2024-01.io.pollux:a", 1, b"nguid"));
        assert_ne!(a, derive_id("nqn.2024-01.io.pollux:a", 2, b"nguid"));
        assert_ne!(a, derive_id("nqn.2024-01.io.pollux:b", 1, b"nguid"));
        assert_ne!(a, derive_id("nqn.2024-01.io.pollux:a", 1, b"uuid"));
        assert_eq!(fnv1a(b"", 0), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a", 0), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn config_validation() {
        let disc = Arc::new(DiscoveryGen::default());
        assert!(Subsystem::new(
            SubsystemConfig::new("bad"),
            SubsystemKind::Nvm,
            disc.clone()
        )
        .is_err());
        let mut c = SubsystemConfig::new("nqn.2024-01.io.pollux:a");
        c.cntlid_range = (5, 4);
        assert!(Subsystem::new(c, SubsystemKind::Nvm, disc.clone()).is_err());
        let s = Subsystem::new(
            SubsystemConfig::new("nqn.2024-01.io.pollux:a").allow_hosts(["nqn.2024-01.io.host:h1"]),
            SubsystemKind::Nvm,
            disc.clone(),
        )
        .unwrap();
        assert!(s.host_allowed("nqn.2024-01.io.host:h1"));
        assert!(!s.host_allowed("nqn.2024-01.io.host:h2"));
        let g = disc.get();
        s.allow_host("nqn.2024-01.io.host:h2");
        assert!(s.host_allowed("nqn.2024-01.io.host:h2"));
        assert_eq!(
            disc.get(),
            g + 1,
            "host changes bump the discovery generation"
        );
        assert!(s.serial().len() <= 20);
    }
}
