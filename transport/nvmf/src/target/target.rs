//! The [`Target`]: options, transports, listeners, subsystems (the
//! discovery subsystem included) and the shared data buffer pool.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pollux_reactor::sync::{Mutex, MutexGuard};

use pollux_reactor::mem::{BufPool, BufPoolOptions, HugepageMode};
use pollux_reactor::{IoDevice, Reactor};

use super::core_ctx::CoreCtx;
use super::error::TargetError;
use super::subsystem::{DiscoveryGen, Subsystem, SubsystemConfig, SubsystemKind, DISCOVERY_NQN};
use super::transport::{TargetTransport, TransportError};
use crate::spec::transport_id::{TrType, TransportId};

/// Target-wide options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetOptions {
    /// Most entries per I/O queue (CAP.MQES + 1, Identify MAXCMD).
    pub max_queue_depth: u16,
    /// Largest data transfer of one command, bytes (Identify MDTS): a power
    /// of two multiple of 4 KiB.
    pub max_io_size: u32,
    /// Size of each data buffer of the shared pool. A transfer uses
    /// `ceil(len / io_unit_size)` of them; keep `max_io_size / io_unit_size`
    /// at most 4 so a request's buffer list never allocates.
    pub io_unit_size: u32,
    /// In-capsule data accepted on I/O queues (Identify IOCCSZ), bytes.
    pub in_capsule_data_size: u32,
    /// Buffers in the shared data pool.
    pub num_data_buffers: usize,
    /// Buffers each core's cache keeps.
    pub buffer_cache_size: usize,
    /// Small (4 KiB) per-request buffers shared by every queue pair of the
    /// target: a queue takes one per request from this pool when it is
    /// created and gives them back when it is destroyed. A queue created
    /// when the pool is short runs its small transfers from the shared
    /// data pool instead. One pool for the target, so connecting and
    /// disconnecting queues opens no descriptor and maps nothing.
    pub num_slot_buffers: usize,
    /// Hugepage policy of the pools.
    pub hugepages: HugepageMode,
    /// KATO used for discovery controllers that connect with KATO 0 (Linux: 120 s).
    pub discovery_kato_ms: u32,
    /// A queue whose transport connection is up but that has not completed
    /// a Fabrics Connect within this many milliseconds is disconnected: a
    /// host that stalls or dies between the two would otherwise hold the
    /// queue (its requests and buffers) forever, since keep-alive starts
    /// only with a controller. 0 waits forever.
    pub connect_timeout_ms: u32,
}

impl Default for TargetOptions {
    fn default() -> Self {
        TargetOptions {
            max_queue_depth: 128,
            max_io_size: 128 * 1024,
            io_unit_size: 32 * 1024,
            in_capsule_data_size: 4096,
            num_data_buffers: 1024,
            buffer_cache_size: 32,
            num_slot_buffers: 2048,
            hugepages: HugepageMode::Auto,
            discovery_kato_ms: 120_000,
            connect_timeout_ms: 30_000,
        }
    }
}

impl TargetOptions {
    /// Small pools and ordinary pages: for tests and the loopback transport.
    pub fn for_tests() -> Self {
        TargetOptions {
            num_data_buffers: 64,
            buffer_cache_size: 8,
            num_slot_buffers: 512,
            hugepages: HugepageMode::Never,
            ..TargetOptions::default()
        }
    }

    fn validate(&self) -> Result<(), TargetError> {
        if self.max_queue_depth < 2 {
            return Err(TargetError::InvalidOption(
                "max_queue_depth must be at least 2",
            ));
        }
        if self.max_io_size < 4096 || !self.max_io_size.is_power_of_two() {
            return Err(TargetError::InvalidOption(
                "max_io_size must be a power of two ≥ 4096",
            ));
        }
        if self.io_unit_size < 4096 || self.io_unit_size > self.max_io_size {
            return Err(TargetError::InvalidOption(
                "io_unit_size must lie in 4096..=max_io_size",
            ));
        }
        if self.in_capsule_data_size % 16 != 0 || self.in_capsule_data_size > 64 * 1024 {
            return Err(TargetError::InvalidOption(
                "in_capsule_data_size must be a multiple of 16, at most 64 KiB",
            ));
        }
        if self.num_data_buffers == 0 {
            return Err(TargetError::InvalidOption(
                "num_data_buffers must be positive",
            ));
        }
        Ok(())
    }

    /// Identify MDTS (2^MDTS × 4 KiB).
    pub fn mdts(&self) -> u8 {
        (self.max_io_size / 4096).trailing_zeros() as u8
    }
}

/// A listener: a transport address and its port id (discovery PORTID).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    /// The address.
    pub trid: TransportId,
    /// Port id.
    pub portid: u16,
}

/// An address a transport listens on, and how many users it has (each
/// subsystem listening there, and the target-wide listener there).
#[derive(Debug, Clone)]
struct Port {
    listener: Listener,
    users: usize,
}

#[derive(Default)]
struct TargetState {
    subsystems: Vec<Arc<Subsystem>>,
    /// The addresses the transports listen on (refcounted).
    ports: Vec<Port>,
    /// Target-wide listeners ([`Target::add_listener`]): every subsystem
    /// listens there.
    wide: Vec<TransportId>,
    transports: Vec<Arc<dyn TargetTransport>>,
    next_portid: u16,
}

impl TargetState {
    /// Take one more use of `trid`: the transport of its type starts
    /// listening there on the first. Returns the port id.
    fn open_port(&mut self, trid: &TransportId) -> Result<u16, TargetError> {
        if let Some(p) = self.ports.iter_mut().find(|p| &p.listener.trid == trid) {
            p.users += 1;
            return Ok(p.listener.portid);
        }
        let t = self
            .transports
            .iter()
            .find(|t| t.trtype() == trid.trtype)
            .ok_or(TargetError::NoTransport(trid.trtype))?;
        t.listen(trid)?;
        let portid = self.next_portid;
        self.next_portid = self.next_portid.wrapping_add(1).max(1);
        self.ports.push(Port {
            listener: Listener {
                trid: trid.clone(),
                portid,
            },
            users: 1,
        });
        Ok(portid)
    }

    /// Give back one use of `trid`: the transport stops listening there
    /// with the last. Returns whether it did.
    fn close_port(&mut self, trid: &TransportId) -> bool {
        let Some(i) = self.ports.iter().position(|p| &p.listener.trid == trid) else {
            return false;
        };
        self.ports[i].users -= 1;
        if self.ports[i].users > 0 {
            return false;
        }
        self.ports.remove(i);
        if let Some(t) = self.transports.iter().find(|t| t.trtype() == trid.trtype) {
            if let Err(e) = t.stop_listen(trid) {
                log::warn!("nvmf: closing listener {trid}: {e}");
            }
        }
        true
    }

    fn find(&self, nqn: &str, discovery: &Arc<Subsystem>) -> Option<Arc<Subsystem>> {
        if nqn == DISCOVERY_NQN {
            return Some(Arc::clone(discovery));
        }
        self.subsystems.iter().find(|s| s.nqn() == nqn).cloned()
    }

    fn portid(&self, trid: &TransportId) -> Option<u16> {
        self.ports
            .iter()
            .find(|p| &p.listener.trid == trid)
            .map(|p| p.listener.portid)
    }
}

/// Size of a per-request slot buffer ([`TargetOptions::num_slot_buffers`]).
pub const SLOT_BUF_SIZE: usize = 4096;

/// The NVMe-oF target: a control-plane object shared by every core.
///
/// Configuration (subsystems, namespaces, hosts, transports, listeners) and
/// the admin commands that need target-wide state take its `Mutex`; that is
/// control path only. Per-core state (the buffer cache) is the target's
/// [`IoDevice`] channel on each reactor.
pub struct Target {
    opts: TargetOptions,
    data_pool: BufPool,
    slot_pool: Option<BufPool>,
    disc: Arc<DiscoveryGen>,
    discovery: Arc<Subsystem>,
    state: Mutex<TargetState>,
    /// Queues disconnected for sending no Connect in time.
    connect_timeouts: AtomicU64,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("opts", &self.opts)
            .field("subsystems", &self.lock().subsystems.len())
            .finish()
    }
}

impl Target {
    /// A target with `opts` (control path: creates the data buffer pool).
    ///
    /// # Errors
    ///
    /// [`TargetError::InvalidOption`], or [`TargetError::Memory`] when the
    /// pool cannot be created.
    pub fn new(opts: TargetOptions) -> Result<Arc<Target>, TargetError> {
        opts.validate()?;
        let mut po = BufPoolOptions::new(
            "nvmf-data",
            opts.io_unit_size as usize,
            opts.num_data_buffers,
        );
        po.cache_size = opts.buffer_cache_size.max(1);
        po.hugepages = opts.hugepages;
        let data_pool = BufPool::new(po)?;
        let slot_pool = if opts.num_slot_buffers == 0 {
            None
        } else {
            let mut po = BufPoolOptions::new("nvmf-qp-slots", SLOT_BUF_SIZE, opts.num_slot_buffers);
            po.hugepages = opts.hugepages;
            po.cache_size = 1;
            Some(BufPool::new(po)?)
        };
        let disc = Arc::new(DiscoveryGen::default());
        let mut dcfg = SubsystemConfig::new(DISCOVERY_NQN);
        dcfg.model = "Pollux discovery controller".into();
        let discovery = Subsystem::new(dcfg, SubsystemKind::Discovery, Arc::clone(&disc))?;
        disc.set_discovery(&discovery);
        Ok(Arc::new(Target {
            opts,
            data_pool,
            slot_pool,
            disc,
            discovery,
            state: Mutex::new(TargetState {
                next_portid: 1,
                ..TargetState::default()
            }),
            connect_timeouts: AtomicU64::new(0),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, TargetState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The options.
    pub fn options(&self) -> &TargetOptions {
        &self.opts
    }

    /// The shared data buffer pool.
    pub fn data_pool(&self) -> &BufPool {
        &self.data_pool
    }

    /// The shared pool of per-request slot buffers
    /// ([`TargetOptions::num_slot_buffers`]; `None` when 0): transports
    /// register its arenas with the data pool's.
    pub fn slot_pool(&self) -> Option<&BufPool> {
        self.slot_pool.as_ref()
    }

    /// Add a transport (one per transport type).
    ///
    /// # Errors
    ///
    /// [`TargetError::TransportExists`].
    pub fn add_transport(&self, t: Arc<dyn TargetTransport>) -> Result<(), TargetError> {
        let mut st = self.lock();
        if st.transports.iter().any(|x| x.trtype() == t.trtype()) {
            return Err(TargetError::TransportExists(t.trtype()));
        }
        st.transports.push(t);
        Ok(())
    }

    /// Remove the transport of `trtype` (control path), when no listener
    /// uses it: undoes an [`add_transport`](Self::add_transport) whose
    /// start failed. Its poll groups are the caller's to drop.
    ///
    /// # Errors
    ///
    /// [`TargetError::NoTransport`], or [`TargetError::ListenerExists`]
    /// naming a listener of that type.
    pub fn remove_transport(&self, trtype: TrType) -> Result<(), TargetError> {
        let mut st = self.lock();
        if let Some(p) = st.ports.iter().find(|p| p.listener.trid.trtype == trtype) {
            return Err(TargetError::ListenerExists(p.listener.trid.clone()));
        }
        let i = st
            .transports
            .iter()
            .position(|t| t.trtype() == trtype)
            .ok_or(TargetError::NoTransport(trtype))?;
        st.transports.remove(i);
        Ok(())
    }

    /// A target-wide listener: every subsystem (the discovery subsystem
    /// included, those added later too) listens at `trid`, as if each had
    /// [`add_subsystem_listener`](Self::add_subsystem_listener) there.
    /// The shorthand of an application or a test with one address; the
    /// management plane (SPDK's calls, `pollux-tgt`'s configuration) gives
    /// each subsystem its own. Returns the port id.
    ///
    /// # Errors
    ///
    /// [`TargetError::NoTransport`], [`TargetError::ListenerExists`], or the
    /// transport's error.
    pub fn add_listener(&self, trid: TransportId) -> Result<u16, TargetError> {
        let mut st = self.lock();
        if st.wide.contains(&trid) {
            return Err(TargetError::ListenerExists(trid));
        }
        let portid = st.open_port(&trid)?;
        st.wide.push(trid);
        drop(st);
        self.disc.bump();
        Ok(portid)
    }

    /// Remove the target-wide listener `trid`
    /// ([`add_listener`](Self::add_listener)); the transport stops
    /// listening there unless a subsystem still does.
    ///
    /// # Errors
    ///
    /// [`TargetError::NoSuchListener`].
    pub fn remove_listener(&self, trid: &TransportId) -> Result<(), TargetError> {
        let mut st = self.lock();
        let i = st
            .wide
            .iter()
            .position(|t| t == trid)
            .ok_or_else(|| TargetError::NoSuchListener(trid.clone()))?;
        st.wide.remove(i);
        st.close_port(trid);
        drop(st);
        self.disc.bump();
        Ok(())
    }

    /// Let hosts connect to subsystem `nqn` (the discovery subsystem's
    /// NQN included) through `trid` (SPDK's `nvmf_subsystem_add_listener`):
    /// the transport of its type starts listening there when no other
    /// subsystem did. All or nothing: on an error nothing changed.
    /// Returns the port id.
    ///
    /// # Errors
    ///
    /// [`TargetError::NoSuchSubsystem`], [`TargetError::ListenerExists`]
    /// (the subsystem listens there already, itself or target-wide),
    /// [`TargetError::NoTransport`], or the transport's error (an address
    /// it cannot listen on).
    pub fn add_subsystem_listener(&self, nqn: &str, trid: TransportId) -> Result<u16, TargetError> {
        let mut st = self.lock();
        let sub = st
            .find(nqn, &self.discovery)
            .ok_or_else(|| TargetError::NoSuchSubsystem(nqn.to_owned()))?;
        if sub.listens_on(&trid) || st.wide.contains(&trid) {
            return Err(TargetError::ListenerExists(trid));
        }
        let portid = st.open_port(&trid)?;
        sub.insert_listener(trid);
        drop(st);
        self.disc.bump();
        Ok(portid)
    }

    /// Stop letting hosts connect to subsystem `nqn` through `trid`; the
    /// transport stops listening there when no other subsystem (and no
    /// target-wide listener) uses it. Returns whether it stopped. Queues
    /// are the caller's: disconnect the subsystem's queues that came in
    /// through `trid` ([`TransportPollGroup::disconnect_listener`](super::TransportPollGroup::disconnect_listener)),
    /// every queue of `trid` when it stopped.
    ///
    /// # Errors
    ///
    /// [`TargetError::NoSuchSubsystem`] or [`TargetError::NoSuchListener`].
    pub fn remove_subsystem_listener(
        &self,
        nqn: &str,
        trid: &TransportId,
    ) -> Result<bool, TargetError> {
        let mut st = self.lock();
        let sub = st
            .find(nqn, &self.discovery)
            .ok_or_else(|| TargetError::NoSuchSubsystem(nqn.to_owned()))?;
        if !sub.take_listener(trid) {
            return Err(TargetError::NoSuchListener(trid.clone()));
        }
        let closed = st.close_port(trid);
        drop(st);
        self.disc.bump();
        Ok(closed)
    }

    /// The addresses the transports listen on (each used by a subsystem
    /// or target-wide), with their port ids.
    pub fn listeners(&self) -> Vec<Listener> {
        self.lock()
            .ports
            .iter()
            .map(|p| p.listener.clone())
            .collect()
    }

    /// Where hosts may connect to `sub`: its own listeners, then the
    /// target-wide ones, with their port ids (what its discovery log
    /// entries and `listen_addresses` show).
    pub fn listeners_of(&self, sub: &Subsystem) -> Vec<Listener> {
        let own = sub.listeners();
        let st = self.lock();
        own.iter()
            .chain(st.wide.iter().filter(|t| !own.contains(t)))
            .filter_map(|t| {
                st.portid(t).map(|portid| Listener {
                    trid: t.clone(),
                    portid,
                })
            })
            .collect()
    }

    /// Whether a host may connect to `sub` through `trid` (checked at
    /// every Connect): an NVM subsystem only through its own listeners and
    /// the target-wide ones; the discovery subsystem through any address
    /// the target listens on (as SPDK, which still allows it on listeners
    /// not added to it).
    pub fn listener_allowed(&self, sub: &Subsystem, trid: &TransportId) -> bool {
        if !sub.is_discovery() && sub.listens_on(trid) {
            return true;
        }
        let st = self.lock();
        if sub.is_discovery() {
            st.portid(trid).is_some()
        } else {
            st.wide.contains(trid)
        }
    }

    /// The transport of `trid`'s type.
    pub fn transport_for(&self, trid: &TransportId) -> Option<Arc<dyn TargetTransport>> {
        self.lock()
            .transports
            .iter()
            .find(|t| t.trtype() == trid.trtype)
            .cloned()
    }

    /// Add an NVM subsystem.
    ///
    /// # Errors
    ///
    /// [`TargetError::SubsystemExists`] or a configuration error.
    pub fn add_subsystem(&self, cfg: SubsystemConfig) -> Result<Arc<Subsystem>, TargetError> {
        if cfg.nqn == DISCOVERY_NQN {
            return Err(TargetError::SubsystemExists(cfg.nqn));
        }
        let mut st = self.lock();
        if st.subsystems.iter().any(|s| s.nqn() == cfg.nqn) {
            return Err(TargetError::SubsystemExists(cfg.nqn));
        }
        let s = Subsystem::new(cfg, SubsystemKind::Nvm, Arc::clone(&self.disc))?;
        st.subsystems.push(Arc::clone(&s));
        drop(st);
        self.disc.bump();
        Ok(s)
    }

    /// Remove a subsystem that has no controllers, with its listeners:
    /// returns the addresses the transports stopped listening on (no
    /// other subsystem used them), whose queues are the caller's to
    /// disconnect.
    ///
    /// # Errors
    ///
    /// [`TargetError::NoSuchSubsystem`] or [`TargetError::SubsystemInUse`].
    pub fn remove_subsystem(&self, nqn: &str) -> Result<Vec<TransportId>, TargetError> {
        let mut st = self.lock();
        let i = st
            .subsystems
            .iter()
            .position(|s| s.nqn() == nqn)
            .ok_or_else(|| TargetError::NoSuchSubsystem(nqn.to_owned()))?;
        let n = st.subsystems[i].controller_count();
        if n > 0 {
            return Err(TargetError::SubsystemInUse {
                nqn: nqn.to_owned(),
                controllers: n,
            });
        }
        let sub = st.subsystems.remove(i);
        let closed = sub
            .take_listeners()
            .into_iter()
            .filter(|t| st.close_port(t))
            .collect();
        drop(st);
        self.disc.bump();
        Ok(closed)
    }

    /// The subsystem `nqn` (the discovery subsystem included).
    pub fn subsystem(&self, nqn: &str) -> Option<Arc<Subsystem>> {
        self.lock().find(nqn, &self.discovery)
    }

    /// The NVM subsystems.
    pub fn subsystems(&self) -> Vec<Arc<Subsystem>> {
        self.lock().subsystems.clone()
    }

    /// The discovery subsystem.
    pub fn discovery_subsystem(&self) -> &Arc<Subsystem> {
        &self.discovery
    }

    /// The discovery log generation counter.
    pub fn discovery_genctr(&self) -> u64 {
        self.disc.get()
    }

    /// Live controllers in every subsystem (discovery included).
    pub fn controller_count(&self) -> usize {
        self.discovery.controller_count()
            + self
                .lock()
                .subsystems
                .iter()
                .map(|s| s.controller_count())
                .sum::<usize>()
    }

    /// The discovery log `hostnqn` sees (control path, allocates): the
    /// current discovery subsystem at `current` first (when given), then
    /// every subsystem the host may access × every listener.
    pub fn discovery_log(&self, hostnqn: &str, current: Option<&TransportId>) -> Vec<u8> {
        super::discovery::build_log(self, hostnqn, current)
    }

    /// The transports added so far (control path).
    pub fn transports(&self) -> Vec<Arc<dyn TargetTransport>> {
        self.lock().transports.clone()
    }

    /// Start every transport's poll group on `reactor` (control path, on
    /// that reactor; call it once per core): the one way an application
    /// starts the transports, whichever they are. Keep the groups; drop
    /// them on their core to stop.
    ///
    /// # Errors
    ///
    /// The first transport that cannot start, with its name.
    pub fn start_poll_groups(
        &self,
        reactor: &Reactor,
    ) -> Result<Vec<std::rc::Rc<dyn super::transport::TransportPollGroup>>, TransportError> {
        let mut groups = Vec::new();
        for t in self.transports() {
            let name = t.name();
            match t.start_poll_group(reactor) {
                Ok(Some(g)) => groups.push(g),
                Ok(None) => {}
                Err(e) => return Err(TransportError::Other(format!("{name} poll group: {e}"))),
            }
        }
        Ok(groups)
    }

    /// Queues disconnected so far because no Fabrics Connect completed on
    /// them within [`TargetOptions::connect_timeout_ms`].
    pub fn connect_timeouts(&self) -> u64 {
        self.connect_timeouts.load(Ordering::Relaxed)
    }

    /// Count a queue disconnected for a missing Connect (once per queue).
    pub(crate) fn connect_timed_out(&self) {
        self.connect_timeouts.fetch_add(1, Ordering::Relaxed);
    }

    /// Every transport's connection counters, summed (control path).
    pub fn transport_stats(&self) -> super::transport::TransportStats {
        let mut total = super::transport::TransportStats::default();
        for t in self.transports() {
            total.add(&t.stats());
        }
        total
    }

    /// This core's target context (created on first use).
    pub(crate) fn core_ctx(self: &Arc<Self>, r: &Reactor) -> std::rc::Rc<CoreCtx> {
        match r.channel(self) {
            Ok(c) => c,
            Err(never) => match never {},
        }
    }
}

/// The per-core state of a target is its io_device channel.
impl IoDevice for Target {
    type Channel = CoreCtx;
    type Error = std::convert::Infallible;

    fn create_channel(&self, r: &Reactor) -> Result<CoreCtx, Self::Error> {
        Ok(CoreCtx::new(
            r,
            &self.data_pool,
            self.opts.io_unit_size as usize,
        ))
    }
}
