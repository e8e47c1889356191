//! The shared (`Send + Sync`) target configuration: target nodes (IQN +
//! LUNs + initiator ACL), portal groups, TSIH allocation, the table of live
//! sessions (reinstatement) and the buffer pool that task buffers come
//! from. Control path: it locks; nothing here is touched per I/O (task
//! buffers come from each core's cache, [`CoreCtx`](super::CoreCtx)).

use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::Arc;

use pollux_reactor::sync::{Mutex, MutexGuard};

use pollux_bdev::Bdev;
use pollux_reactor::mem::{BufPool, BufPoolOptions, DmaArena};
use pollux_reactor::Reactor;
use thiserror::Error;

use super::sessions::{Nexus, SessionInfo, SessionTable};

use crate::scsi::reservation::LunShared;
use crate::session::{LoginEnv, LoginStatus, LoginTargetInfo, TargetLimits};

/// A control-path error.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// Bad or duplicate name, LUN or tag.
    #[error("invalid configuration: {0}")]
    Invalid(String),
    /// Memory for task buffers.
    #[error("cannot allocate task buffers: {0}")]
    Memory(String),
}

/// One target node.
#[derive(Debug, Clone)]
pub struct TargetNode {
    /// The IQN.
    pub name: String,
    /// TargetAlias.
    pub alias: Option<String>,
    /// LUN number → bdev.
    pub luns: Vec<(u16, Arc<Bdev>)>,
    /// Initiator IQNs allowed (empty = any).
    pub allowed_initiators: Vec<String>,
    /// Portal group tags this node is reachable through.
    pub portal_groups: Vec<u16>,
}

/// A portal group: a tag and the listen addresses (transport-specific
/// strings, e.g. `@name` for the soft verbs provider or `ip:port`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortalGroup {
    /// TargetPortalGroupTag.
    pub tag: u16,
    /// Listen addresses.
    pub addrs: Vec<String>,
}

/// Options of [`IscsiTarget::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetOptions {
    /// Negotiation limits (queue depth, bursts, receive sizes).
    pub limits: TargetLimits,
    /// Largest data transfer of one command in bytes (VPD B0).
    pub max_io_bytes: u32,
    /// Task buffers in the pool (connections × queue depth).
    pub task_buffers: usize,
}

impl Default for TargetOptions {
    fn default() -> Self {
        TargetOptions {
            limits: TargetLimits {
                queue_depth: 32,
                ..TargetLimits::default()
            },
            max_io_bytes: 128 * 1024,
            task_buffers: 256,
        }
    }
}

/// The iSCSI target: nodes, portal groups and shared resources.
#[derive(Debug)]
pub struct IscsiTarget {
    opts: TargetOptions,
    nodes: Mutex<Vec<Arc<TargetNode>>>,
    groups: Mutex<Vec<PortalGroup>>,
    tsih: AtomicU16,
    /// Live sessions: login and teardown only, never per I/O.
    sessions: Mutex<SessionTable>,
    reinstated: AtomicU64,
    /// Connections dropped for an unanswered NOP-In ping.
    nop_timeouts: AtomicU64,
    pool: BufPool,
    /// What the sessions of each (node, LUN) share (reservations, the
    /// COMPARE AND WRITE gate): looked up at login, never per I/O.
    lun_shared: Mutex<Vec<(String, u16, Arc<LunShared>)>>,
}

impl IscsiTarget {
    /// A target with `opts`; allocates the task buffer pool (control path).
    ///
    /// # Errors
    /// [`ConfigError::Memory`], [`ConfigError::Invalid`] for a zero queue
    /// depth or I/O size.
    pub fn new(opts: TargetOptions) -> Result<Arc<IscsiTarget>, ConfigError> {
        if opts.limits.queue_depth == 0 || opts.max_io_bytes < 4096 {
            return Err(ConfigError::Invalid(
                "queue depth 0 or max I/O below 4 KiB".into(),
            ));
        }
        // Room for 8 PI bytes per 512-byte block.
        let size = (opts.max_io_bytes as usize / 512) * 520;
        let mut po = BufPoolOptions::new("iscsi-task", size, opts.task_buffers);
        // Each core's cache keeps at most a quarter of the pool (2..=32),
        // so idle cores cannot park every buffer.
        po.cache_size = (opts.task_buffers / 4).clamp(2, 32);
        let pool = BufPool::new(po).map_err(|e| ConfigError::Memory(e.to_string()))?;
        Ok(Arc::new(IscsiTarget {
            opts,
            nodes: Mutex::new(Vec::new()),
            groups: Mutex::new(Vec::new()),
            tsih: AtomicU16::new(0),
            sessions: Mutex::new(SessionTable::default()),
            reinstated: AtomicU64::new(0),
            nop_timeouts: AtomicU64::new(0),
            pool,
            lun_shared: Mutex::new(Vec::new()),
        }))
    }

    fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
        m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The options.
    pub fn options(&self) -> &TargetOptions {
        &self.opts
    }

    /// The task buffer pool (transports register its arenas).
    pub fn pool(&self) -> &BufPool {
        &self.pool
    }

    /// Live sessions (those in full feature phase).
    pub fn live_sessions(&self) -> usize {
        Self::lock(&self.sessions).len()
    }

    /// Sessions closed by a reinstating login so far.
    pub fn reinstatements(&self) -> u64 {
        self.reinstated.load(Ordering::Relaxed)
    }

    /// Connections dropped so far because their initiator left a NOP-In
    /// ping unanswered for `nop_timeout` (the iSCSI counterpart of the
    /// NVMe-oF keep-alive timeouts).
    pub fn nop_timeouts(&self) -> u64 {
        self.nop_timeouts.load(Ordering::Relaxed)
    }

    /// Count a connection dropped for an unanswered ping (control path:
    /// once per dropped connection).
    pub(crate) fn nop_timed_out(&self) {
        self.nop_timeouts.fetch_add(1, Ordering::Relaxed);
    }

    /// Record session `tsih` of `nexus`, living on `reactor`'s core (control
    /// path, at full feature phase). A live session of the same nexus is
    /// reinstated: its core gets a message and closes it there.
    pub(crate) fn start_session(self: &Arc<Self>, nexus: Nexus, tsih: u16, reactor: &Reactor) {
        let old = Self::lock(&self.sessions).register(nexus, tsih, reactor.core());
        let Some((old_tsih, core)) = old else {
            return;
        };
        self.reinstated.fetch_add(1, Ordering::Relaxed);
        log::info!("iscsi: session {tsih:#x} reinstates session {old_tsih:#x} (core {core})");
        let t = Arc::clone(self);
        let sent = reactor.send(core, move |r| match r.channel(&t) {
            Ok(ctx) => ctx.doom(old_tsih),
            Err(never) => match never {},
        });
        if let Err(e) = sent {
            log::warn!("iscsi: cannot reach core {core} to close session {old_tsih:#x}: {e}");
        }
    }

    /// Forget session `tsih` (its connection is gone; control path).
    pub(crate) fn end_session(&self, tsih: u16) {
        Self::lock(&self.sessions).remove(tsih);
    }

    /// The arenas task buffers live in.
    pub fn arenas(&self) -> Vec<Arc<DmaArena>> {
        self.pool.arenas().to_vec()
    }

    /// Add a portal group.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] for a duplicate or zero tag.
    pub fn add_portal_group(&self, pg: PortalGroup) -> Result<(), ConfigError> {
        let mut g = Self::lock(&self.groups);
        if pg.tag == 0 || g.iter().any(|x| x.tag == pg.tag) {
            return Err(ConfigError::Invalid(format!("portal group tag {}", pg.tag)));
        }
        g.push(pg);
        Ok(())
    }

    /// Portal groups.
    pub fn portal_groups(&self) -> Vec<PortalGroup> {
        Self::lock(&self.groups).clone()
    }

    /// Add a target node.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] for a name that is not `iqn.`/`eui.`/`naa.`,
    /// a duplicate name, duplicate LUNs or LUNs above 16383.
    pub fn add_node(&self, node: TargetNode) -> Result<(), ConfigError> {
        let n = &node.name;
        if !(n.starts_with("iqn.") || n.starts_with("eui.") || n.starts_with("naa."))
            || n.len() > 223
        {
            return Err(ConfigError::Invalid(format!("target name {n}")));
        }
        let mut seen = Vec::new();
        for (l, _) in &node.luns {
            if *l > 16383 || seen.contains(l) {
                return Err(ConfigError::Invalid(format!("LUN {l}")));
            }
            seen.push(*l);
        }
        let mut nodes = Self::lock(&self.nodes);
        if nodes.iter().any(|x| x.name == node.name) {
            return Err(ConfigError::Invalid(format!("duplicate target {n}")));
        }
        nodes.push(Arc::new(node));
        Ok(())
    }

    /// What the sessions of LUN `lun` of node `node` share (made at the
    /// first login that sees it; control path).
    pub fn lun_shared(&self, node: &str, lun: u16) -> Arc<LunShared> {
        let mut all = Self::lock(&self.lun_shared);
        if let Some((_, _, s)) = all.iter().find(|(n, l, _)| n == node && *l == lun) {
            return Arc::clone(s);
        }
        let s = Arc::new(LunShared::default());
        all.push((node.to_string(), lun, Arc::clone(&s)));
        s
    }

    /// Every node, in the order added.
    pub fn nodes(&self) -> Vec<Arc<TargetNode>> {
        Self::lock(&self.nodes).clone()
    }

    /// The live sessions (control path).
    pub fn sessions(&self) -> Vec<SessionInfo> {
        Self::lock(&self.sessions).list()
    }

    /// Remove the node named `name` while no session is logged in to it
    /// (control path); new logins to it fail from then on.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] when there is no such node or a session
    /// uses it.
    pub fn remove_node(&self, name: &str) -> Result<Arc<TargetNode>, ConfigError> {
        let sessions = Self::lock(&self.sessions);
        let used = sessions
            .list()
            .iter()
            .filter(|s| s.target.as_deref() == Some(name))
            .count();
        if used > 0 {
            return Err(ConfigError::Invalid(format!(
                "target {name} has {used} live session(s)"
            )));
        }
        let mut nodes = Self::lock(&self.nodes);
        let i = nodes
            .iter()
            .position(|n| n.name == name)
            .ok_or_else(|| ConfigError::Invalid(format!("no target {name}")))?;
        Ok(nodes.remove(i))
    }

    /// Remove the node named `name` whatever its sessions (control path):
    /// new logins to it fail from then on. Returns it and the sessions
    /// logged in to it, for the caller to close on their cores with
    /// [`close_session`](Self::close_session).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] when there is no such node.
    pub fn retire_node(
        &self,
        name: &str,
    ) -> Result<(Arc<TargetNode>, Vec<SessionInfo>), ConfigError> {
        let sessions = Self::lock(&self.sessions);
        let mut nodes = Self::lock(&self.nodes);
        let i = nodes
            .iter()
            .position(|n| n.name == name)
            .ok_or_else(|| ConfigError::Invalid(format!("no target {name}")))?;
        let live = sessions
            .list()
            .into_iter()
            .filter(|s| s.target.as_deref() == Some(name))
            .collect();
        Ok((nodes.remove(i), live))
    }

    /// Close session `tsih` if it lives on `reactor`'s core (run on that
    /// core, from a reactor message): its connection closes at its next
    /// poll, as a reinstated session's does, and gives back what it holds
    /// as it goes.
    pub fn close_session(self: &Arc<Self>, reactor: &Reactor, tsih: u16) {
        match reactor.channel(self) {
            Ok(ctx) => ctx.doom(tsih),
            Err(never) => match never {},
        }
    }

    /// Remove portal group `tag` (control path; its addresses are the
    /// transport's to close).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] when there is no such group or a node uses it.
    pub fn remove_portal_group(&self, tag: u16) -> Result<PortalGroup, ConfigError> {
        if let Some(n) = Self::lock(&self.nodes)
            .iter()
            .find(|n| n.portal_groups.contains(&tag))
        {
            return Err(ConfigError::Invalid(format!(
                "portal group {tag} is used by target {}",
                n.name
            )));
        }
        let mut g = Self::lock(&self.groups);
        let i = g
            .iter()
            .position(|x| x.tag == tag)
            .ok_or_else(|| ConfigError::Invalid(format!("no portal group {tag}")))?;
        Ok(g.remove(i))
    }

    /// The node named `name`.
    pub fn node(&self, name: &str) -> Option<Arc<TargetNode>> {
        Self::lock(&self.nodes)
            .iter()
            .find(|n| n.name == name)
            .cloned()
    }

    /// The SendTargets answer for `initiator` on portal group `tag`:
    /// `TargetName=` / `TargetAddress=addr,tag` pairs for every node it may
    /// see.
    pub fn send_targets(&self, initiator: &str, out: &mut Vec<u8>) {
        self.send_targets_of(initiator, None, out);
    }

    /// The SendTargets answer for `SendTargets=<name>`: the pairs of node
    /// `name` if `initiator` may see it, else nothing.
    pub fn send_target(&self, initiator: &str, name: &str, out: &mut Vec<u8>) {
        self.send_targets_of(initiator, Some(name), out);
    }

    fn send_targets_of(&self, initiator: &str, only: Option<&str>, out: &mut Vec<u8>) {
        let groups = self.portal_groups();
        for n in Self::lock(&self.nodes).iter() {
            if only.is_some_and(|o| o != n.name) {
                continue;
            }
            if !n.allowed_initiators.is_empty()
                && !n.allowed_initiators.iter().any(|i| i == initiator)
            {
                continue;
            }
            crate::pdu::text::push_pair(out, "TargetName", &n.name);
            for g in groups.iter().filter(|g| n.portal_groups.contains(&g.tag)) {
                for a in &g.addrs {
                    crate::pdu::text::push_pair(out, "TargetAddress", &format!("{a},{}", g.tag));
                }
            }
        }
    }

    /// The login environment of a connection that came in on portal group `tag`.
    pub fn login_env(self: &Arc<Self>, tag: u16) -> PortalLogin {
        PortalLogin {
            target: Arc::clone(self),
            tag,
        }
    }
}

/// [`LoginEnv`] of one portal group.
#[derive(Debug, Clone)]
pub struct PortalLogin {
    target: Arc<IscsiTarget>,
    tag: u16,
}

impl LoginEnv for PortalLogin {
    fn authorize(
        &self,
        initiator: &str,
        target: Option<&str>,
    ) -> Result<LoginTargetInfo, LoginStatus> {
        let limits = self.target.opts.limits.clone();
        let Some(name) = target else {
            return Ok(LoginTargetInfo {
                tpgt: self.tag,
                alias: None,
                limits,
            });
        };
        let node = self.target.node(name).ok_or(LoginStatus::NOT_FOUND)?;
        if !node.portal_groups.contains(&self.tag) {
            return Err(LoginStatus::NOT_FOUND);
        }
        if !node.allowed_initiators.is_empty()
            && !node.allowed_initiators.iter().any(|i| i == initiator)
        {
            return Err(LoginStatus::FORBIDDEN);
        }
        Ok(LoginTargetInfo {
            tpgt: self.tag,
            alias: node.alias.clone(),
            limits,
        })
    }

    fn new_tsih(&self) -> u16 {
        // Control path (login). Skips 0 and TSIHs of live sessions.
        let live = IscsiTarget::lock(&self.target.sessions);
        for _ in 0..=u16::MAX {
            let t = self
                .target
                .tsih
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_add(1);
            if t != 0 && !live.tsih_in_use(t) {
                return t;
            }
        }
        // 65535 live sessions: not reachable with MaxConnections=1 and
        // our connection limits; any non-zero value keeps the login valid.
        1
    }

    fn session_exists(&self, isid: [u8; 6], tsih: u16) -> bool {
        IscsiTarget::lock(&self.target.sessions).exists(isid, tsih)
    }
}
