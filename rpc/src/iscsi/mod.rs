//! The `iscsi` subsystem: SPDK's iSCSI target methods that fit Pollux's
//! iSCSI-over-iSER target — `iscsi_create_portal_group`,
//! `iscsi_delete_portal_group`, `iscsi_get_portal_groups`,
//! `iscsi_create_initiator_group`, `iscsi_delete_initiator_group`,
//! `iscsi_get_initiator_groups`, `iscsi_create_target_node`,
//! `iscsi_get_target_nodes`, `iscsi_delete_target_node`,
//! `iscsi_get_connections` — over one [`IscsiTarget`].
//!
//! The target and its iSER transport come from the application (a
//! `pollux-tgt` file with an `[iscsi]` section); these methods add portal
//! groups (listening through [`PortalListener`]), initiator groups and
//! target nodes to it while it runs. Initiator groups are this provider's
//! own: a node's allowed initiators are the union of the initiators of
//! the groups its `pg_ig_maps` name (`ANY` among them: any initiator).
//! Netmasks other than `ANY` are refused with -95 (iSER connections have
//! no IP address to match here).
//!
//! Every change is all or nothing: each request is checked whole (bdevs
//! of every LUN, portal and initiator groups, name, tags) before anything
//! changes, and a portal that cannot open closes the ones opened before
//! it; `iscsi_delete_portal_group` and `iscsi_delete_initiator_group` undo
//! the creations in a configuration that does not load. Deleting a target
//! node closes the sessions logged in to it, and no others: the node goes
//! first (new logins to it fail), then each session's core gets a reactor
//! message that retires it, and the answer waits until they are gone (5 s
//! at most). A bdev one of its LUNs uses is not deleted (-16: the provider
//! holds a descriptor on it while the node exists), nor a portal or
//! initiator group a node maps; a portal group no node maps closes its
//! portals and the (discovery) sessions that came in on it.
//!
//! A portal address is `host:port`, or the soft RDMA provider's `@name` /
//! `/path` with an empty or absent port.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pollux_bdev::{BdevDesc, BdevRegistry};
use pollux_iser::target::iser::IserTransportError;
use pollux_iser::target::{IscsiTarget, PortalGroup, SessionInfo, TargetNode};
use pollux_reactor::sync::{Mutex, MutexGuard};
use pollux_reactor::CoreId;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::config::ConfigEntry;
use crate::error::{Errno, RpcError};
use crate::service::{decode, Method, RpcService, Subsystem};

/// SPDK's node base: a target name without `iqn.`/`eui.`/`naa.` gets it
/// as prefix (`NODEBASE:name`).
pub const NODEBASE: &str = "iqn.2016-06.io.spdk";

/// How portal groups' addresses are opened and closed (the iSER
/// transport of the application).
pub trait PortalListener: Send + Sync + 'static {
    /// Listen on `addr` for portal group `tag`.
    ///
    /// # Errors
    /// [`PortalError`] saying why not.
    fn listen(&self, addr: &str, tag: u16) -> Result<(), PortalError>;
    /// Stop listening on `addr`.
    ///
    /// # Errors
    /// [`PortalError`] saying why not.
    fn stop_listen(&self, addr: &str) -> Result<(), PortalError>;
}

/// Why a portal could not be opened or closed ([`PortalListener`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortalError {
    /// The iSER transport refused.
    #[error(transparent)]
    Transport(#[from] IserTransportError),
    /// Any other reason, in words.
    #[error("{0}")]
    Other(String),
}

/// One portal of `iscsi_create_portal_group`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Portal {
    /// Host (IP address, or the soft provider's `@name` / `/path`).
    pub host: String,
    /// Port (none for the soft provider).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<String>,
}

/// `iscsi_create_portal_group`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreatePortalGroup {
    /// Tag, 1..=65535.
    pub tag: u32,
    /// Portals.
    pub portals: Vec<Portal>,
    /// Only false (SPDK's private groups are for redirection).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private: Option<bool>,
    /// Accepted: Pollux listens at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<bool>,
}

/// `iscsi_create_initiator_group`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateInitiatorGroup {
    /// Tag, 1..=65535.
    pub tag: u32,
    /// Initiator names, or `ANY`.
    pub initiators: Vec<String>,
    /// Netmasks (only `ANY`).
    pub netmasks: Vec<String>,
}

/// One `pg_ig_maps` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PgIgMap {
    /// Portal group tag.
    pub pg_tag: u32,
    /// Initiator group tag.
    pub ig_tag: u32,
}

/// One LUN of a target node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lun {
    /// Bdev.
    pub bdev_name: String,
    /// LUN, 0..=16383.
    pub lun_id: u32,
}

/// `iscsi_create_target_node`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTargetNode {
    /// Name (prefixed with [`NODEBASE`] when not an iSCSI name).
    pub name: String,
    /// TargetAlias.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias_name: Option<String>,
    /// Portal group -> initiator group maps.
    pub pg_ig_maps: Vec<PgIgMap>,
    /// LUNs.
    pub luns: Vec<Lun>,
    /// Queue depth (Pollux: the target's, from `[iscsi.options]`; accepted).
    pub queue_depth: u32,
    /// Accepted when absent or false (no CHAP in Pollux).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_chap: Option<bool>,
    /// Only false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_chap: Option<bool>,
    /// Only false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mutual_chap: Option<bool>,
    /// Only 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chap_group: Option<u32>,
    /// Only false (iSER carries no digests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header_digest: Option<bool>,
    /// Only false (iSER carries no digests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_digest: Option<bool>,
}

/// `iscsi_delete_target_node`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteTargetNode {
    /// Full name.
    pub name: String,
}

/// `iscsi_delete_portal_group` and `iscsi_delete_initiator_group`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteGroup {
    /// The group's tag.
    pub tag: u32,
}

/// How long `iscsi_delete_target_node` waits for the sessions it closed
/// to be gone before it answers.
const SESSION_CLOSE_WAIT: Duration = Duration::from_secs(5);

/// Methods that take no parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NoParams {}

#[derive(Default)]
struct IscsiState {
    /// Initiator groups: tag -> (initiators, netmasks).
    igs: BTreeMap<u16, (Vec<String>, Vec<String>)>,
    /// Node name -> its maps and queue depth as created.
    maps: BTreeMap<String, (Vec<PgIgMap>, u32)>,
    /// Node name -> a descriptor on each LUN's bdev, so a bdev a LUN uses
    /// is not deleted (`bdev_*_delete` answers -16) while the node exists.
    claims: BTreeMap<String, Vec<BdevDesc>>,
}

/// The `iscsi` subsystem over one iSCSI target.
pub struct IscsiSubsystem {
    target: Arc<IscsiTarget>,
    registry: Arc<BdevRegistry>,
    portals: Arc<dyn PortalListener>,
    state: Mutex<IscsiState>,
}

impl std::fmt::Debug for IscsiSubsystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IscsiSubsystem").finish_non_exhaustive()
    }
}

fn invalid(detail: impl Into<String>) -> RpcError {
    RpcError::invalid_params(detail)
}

fn tag16(what: &str, t: u32) -> Result<u16, RpcError> {
    u16::try_from(t)
        .ok()
        .filter(|&t| t != 0)
        .ok_or_else(|| invalid(format!("{what} {t}: 1..=65535")))
}

fn unsupported(key: &str, on: bool, why: &str) -> Result<(), RpcError> {
    if on {
        Err(RpcError::errno(
            Errno::NotSupported,
            format!("{key}: {why}"),
        ))
    } else {
        Ok(())
    }
}

fn portal_addr(p: &Portal) -> Result<String, RpcError> {
    if p.host.is_empty() {
        return Err(invalid("portal host is empty"));
    }
    match p.port.as_deref().filter(|s| !s.is_empty()) {
        None if p.host.starts_with('@') || p.host.starts_with('/') => Ok(p.host.clone()),
        None => Err(invalid(format!("portal {}: a port is required", p.host))),
        Some(port) => Ok(format!("{}:{port}", p.host)),
    }
}

fn split_addr(a: &str) -> Value {
    match a.rsplit_once(':') {
        Some((h, p)) if !a.starts_with('@') && !a.starts_with('/') => {
            json!({"host": h, "port": p})
        }
        _ => json!({"host": a, "port": ""}),
    }
}

impl IscsiSubsystem {
    /// The subsystem over `target`, LUNs from `registry`, portals opened by
    /// `portals`. Nodes the target already has get one initiator group each
    /// for their allowed initiators (tags from 1000 on), so
    /// `iscsi_get_target_nodes` and `save_config` show them.
    pub fn new(
        target: Arc<IscsiTarget>,
        registry: Arc<BdevRegistry>,
        portals: Arc<dyn PortalListener>,
    ) -> Arc<Self> {
        let me = Self {
            target,
            registry,
            portals,
            state: Mutex::new(IscsiState::default()),
        };
        {
            let mut st = me.lock();
            let depth = me.target.options().limits.queue_depth;
            let mut next: u16 = 1000;
            for n in me.target.nodes() {
                let ig = if n.allowed_initiators.is_empty() {
                    None
                } else {
                    next = next.saturating_add(1);
                    st.igs
                        .insert(next, (n.allowed_initiators.clone(), vec!["ANY".into()]));
                    Some(next)
                };
                let maps = n
                    .portal_groups
                    .iter()
                    .map(|&pg| PgIgMap {
                        pg_tag: u32::from(pg),
                        ig_tag: u32::from(ig.unwrap_or(0)),
                    })
                    .collect();
                st.maps.insert(n.name.clone(), (maps, depth));
                let claims = n
                    .luns
                    .iter()
                    .filter_map(|(_, b)| b.open(true).ok())
                    .collect();
                st.claims.insert(n.name.clone(), claims);
            }
        }
        Arc::new(me)
    }

    fn lock(&self) -> MutexGuard<'_, IscsiState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn create_portal_group(&self, p: Option<Value>) -> Result<Value, RpcError> {
        let req: CreatePortalGroup = decode(p)?;
        let tag = tag16("tag", req.tag)?;
        unsupported(
            "private",
            req.private == Some(true),
            "no login redirection in Pollux",
        )?;
        if req.portals.is_empty() {
            return Err(invalid("portals is empty"));
        }
        let addrs = req
            .portals
            .iter()
            .map(portal_addr)
            .collect::<Result<Vec<_>, _>>()?;
        let _st = self.lock();
        self.target
            .add_portal_group(PortalGroup {
                tag,
                addrs: addrs.clone(),
            })
            .map_err(|e| invalid(e.to_string()))?;
        let mut opened: Vec<String> = Vec::new();
        for a in &addrs {
            if let Err(e) = self.portals.listen(a, tag) {
                for o in &opened {
                    let _ = self.portals.stop_listen(o);
                }
                let _ = self.target.remove_portal_group(tag);
                return Err(invalid(format!("portal {a}: {e}")));
            }
            opened.push(a.clone());
        }
        Ok(Value::Bool(true))
    }

    fn get_portal_groups(&self, p: Option<Value>) -> Result<Value, RpcError> {
        let NoParams {} = decode(p)?;
        Ok(Value::Array(
            self.target
                .portal_groups()
                .iter()
                .map(|g| {
                    json!({
                        "tag": g.tag,
                        "portals": g.addrs.iter().map(|a| split_addr(a)).collect::<Vec<_>>(),
                        "private": false,
                    })
                })
                .collect(),
        ))
    }

    fn create_initiator_group(&self, p: Option<Value>) -> Result<Value, RpcError> {
        let req: CreateInitiatorGroup = decode(p)?;
        let tag = tag16("tag", req.tag)?;
        if req.initiators.is_empty() {
            return Err(invalid("initiators is empty"));
        }
        if let Some(m) = req.netmasks.iter().find(|m| !m.eq_ignore_ascii_case("ANY")) {
            return Err(RpcError::errno(
                Errno::NotSupported,
                format!("netmask {m}: only ANY (iSER connections are not matched by address)"),
            ));
        }
        let mut st = self.lock();
        if st.igs.contains_key(&tag) {
            return Err(invalid(format!("initiator group {tag} exists")));
        }
        st.igs.insert(tag, (req.initiators, req.netmasks));
        Ok(Value::Bool(true))
    }

    fn get_initiator_groups(&self) -> Value {
        let st = self.lock();
        Value::Array(
            st.igs
                .iter()
                .map(|(tag, (i, m))| json!({"tag": tag, "initiators": i, "netmasks": m}))
                .collect(),
        )
    }

    fn create_target_node(&self, p: Option<Value>) -> Result<Value, RpcError> {
        let req: CreateTargetNode = decode(p)?;
        unsupported(
            "require_chap",
            req.require_chap == Some(true),
            "no CHAP in Pollux",
        )?;
        unsupported(
            "mutual_chap",
            req.mutual_chap == Some(true),
            "no CHAP in Pollux",
        )?;
        unsupported(
            "chap_group",
            req.chap_group.is_some_and(|g| g != 0),
            "no CHAP in Pollux",
        )?;
        unsupported(
            "header_digest",
            req.header_digest == Some(true),
            "iSER carries no digests",
        )?;
        unsupported(
            "data_digest",
            req.data_digest == Some(true),
            "iSER carries no digests",
        )?;
        let name = if ["iqn.", "eui.", "naa."]
            .iter()
            .any(|p| req.name.starts_with(p))
        {
            req.name.clone()
        } else {
            format!("{NODEBASE}:{}", req.name)
        };
        if req.pg_ig_maps.is_empty() {
            return Err(invalid("pg_ig_maps is empty"));
        }
        let mut st = self.lock();
        let groups = self.target.portal_groups();
        let mut pgs = Vec::new();
        let mut initiators: Vec<String> = Vec::new();
        let mut any = false;
        for m in &req.pg_ig_maps {
            let pg = tag16("pg_tag", m.pg_tag)?;
            let ig = tag16("ig_tag", m.ig_tag)?;
            if !groups.iter().any(|g| g.tag == pg) {
                return Err(invalid(format!("no portal group {pg}")));
            }
            let (list, _) = st
                .igs
                .get(&ig)
                .ok_or_else(|| invalid(format!("no initiator group {ig}")))?;
            for i in list {
                if i.eq_ignore_ascii_case("ANY") {
                    any = true;
                } else if !initiators.contains(i) {
                    initiators.push(i.clone());
                }
            }
            if !pgs.contains(&pg) {
                pgs.push(pg);
            }
        }
        let mut luns = Vec::new();
        let mut claims = Vec::new();
        for l in &req.luns {
            let id =
                u16::try_from(l.lun_id).map_err(|_| invalid(format!("lun_id {}", l.lun_id)))?;
            let b = self
                .registry
                .get(&l.bdev_name)
                .ok_or_else(|| invalid(format!("no bdev named `{}`", l.bdev_name)))?;
            claims.push(b.open(true)?);
            luns.push((id, b));
        }
        self.target
            .add_node(TargetNode {
                name: name.clone(),
                alias: req.alias_name.clone().filter(|a| !a.is_empty()),
                luns,
                allowed_initiators: if any { Vec::new() } else { initiators },
                portal_groups: pgs,
            })
            .map_err(|e| invalid(e.to_string()))?;
        st.maps
            .insert(name.clone(), (req.pg_ig_maps.clone(), req.queue_depth));
        st.claims.insert(name, claims);
        Ok(Value::Bool(true))
    }

    fn describe_node(&self, st: &IscsiState, n: &TargetNode) -> Value {
        let (maps, depth) = st.maps.get(&n.name).cloned().unwrap_or_default();
        json!({
            "name": n.name,
            "alias_name": n.alias.clone().unwrap_or_default(),
            "pg_ig_maps": maps,
            "luns": n.luns.iter().map(|(id, b)| json!({"bdev_name": b.name(), "lun_id": id})).collect::<Vec<_>>(),
            "queue_depth": depth,
            "disable_chap": false,
            "require_chap": false,
            "mutual_chap": false,
            "chap_group": 0,
            "header_digest": false,
            "data_digest": false,
        })
    }

    fn get_target_nodes(&self) -> Value {
        let st = self.lock();
        Value::Array(
            self.target
                .nodes()
                .iter()
                .map(|n| self.describe_node(&st, n))
                .collect(),
        )
    }

    /// Removes the node (new logins to it fail), closes the sessions
    /// logged in to it on their cores by reactor messages, waits (bounded)
    /// until they are gone, then lets go of its LUNs' bdevs.
    fn delete_target_node(&self, svc: &RpcService, p: Option<Value>) -> Result<Value, RpcError> {
        let req: DeleteTargetNode = decode(p)?;
        let mut st = self.lock();
        let (_, live) = self
            .target
            .retire_node(&req.name)
            .map_err(|_| invalid(format!("no target node {}", req.name)))?;
        st.maps.remove(&req.name);
        let claims = st.claims.remove(&req.name);
        drop(st);
        self.close_sessions(svc, &live, &format!("target {}", req.name))?;
        drop(claims);
        Ok(Value::Bool(true))
    }

    /// Closes `live` sessions on their cores by reactor messages and waits
    /// (bounded) until they are gone; `what` names why in the log.
    fn close_sessions(
        &self,
        svc: &RpcService,
        live: &[SessionInfo],
        what: &str,
    ) -> Result<(), RpcError> {
        if live.is_empty() {
            return Ok(());
        }
        let doomed: Vec<(u16, CoreId)> = live.iter().map(|s| (s.tsih, s.core)).collect();
        let t = Arc::clone(&self.target);
        let list = doomed.clone();
        svc.cores().on_each_core(move |r| {
            for &(tsih, core) in &list {
                if core == r.core() {
                    t.close_session(r, tsih);
                }
            }
        })?;
        let start = Instant::now();
        while self
            .target
            .sessions()
            .iter()
            .any(|s| doomed.iter().any(|&(t, _)| t == s.tsih))
        {
            if start.elapsed() > SESSION_CLOSE_WAIT {
                log::warn!("iscsi: sessions of {what} still closing after {SESSION_CLOSE_WAIT:?}");
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        log::info!("iscsi: {what} deleted: {} session(s) closed", doomed.len());
        Ok(())
    }

    /// `iscsi_delete_portal_group`: refused (-16) while a node maps it;
    /// its portals close, and the sessions that came in on it (discovery
    /// sessions: no node maps it) are closed.
    fn delete_portal_group(&self, svc: &RpcService, p: Option<Value>) -> Result<Value, RpcError> {
        let req: DeleteGroup = decode(p)?;
        let tag = tag16("tag", req.tag)?;
        let _st = self.lock();
        if let Some(n) = self
            .target
            .nodes()
            .iter()
            .find(|n| n.portal_groups.contains(&tag))
        {
            return Err(RpcError::errno(
                Errno::Busy,
                format!("portal group {tag} is used by target node {}", n.name),
            ));
        }
        let g = self
            .target
            .remove_portal_group(tag)
            .map_err(|_| invalid(format!("no portal group {tag}")))?;
        for a in &g.addrs {
            if let Err(e) = self.portals.stop_listen(a) {
                log::warn!("iscsi: closing portal {a}: {e}");
            }
        }
        let live: Vec<SessionInfo> = self
            .target
            .sessions()
            .into_iter()
            .filter(|s| s.tpgt == tag)
            .collect();
        self.close_sessions(svc, &live, &format!("portal group {tag}"))?;
        Ok(Value::Bool(true))
    }

    /// `iscsi_delete_initiator_group`: refused (-16) while a node maps it.
    fn delete_initiator_group(&self, p: Option<Value>) -> Result<Value, RpcError> {
        let req: DeleteGroup = decode(p)?;
        let tag = tag16("tag", req.tag)?;
        let mut st = self.lock();
        if let Some((name, _)) = st
            .maps
            .iter()
            .find(|(_, (maps, _))| maps.iter().any(|m| m.ig_tag == u32::from(tag)))
        {
            return Err(RpcError::errno(
                Errno::Busy,
                format!("initiator group {tag} is used by target node {name}"),
            ));
        }
        st.igs
            .remove(&tag)
            .ok_or_else(|| invalid(format!("no initiator group {tag}")))?;
        Ok(Value::Bool(true))
    }

    fn get_connections(&self) -> Value {
        let groups = self.target.portal_groups();
        Value::Array(
            self.target
                .sessions()
                .iter()
                .map(|s| {
                    let addr = groups
                        .iter()
                        .find(|g| g.tag == s.tpgt)
                        .and_then(|g| g.addrs.first().cloned())
                        .unwrap_or_default();
                    json!({
                        "cid": 0,
                        "tsih": s.tsih,
                        "lcore_id": s.core,
                        "initiator_name": s.initiator,
                        "target_node_name": s.target.clone().unwrap_or_default(),
                        "isid": s.isid.iter().map(|b| format!("{b:02x}")).collect::<String>(),
                        "target_portal_group_tag": s.tpgt,
                        "target_addr": addr,
                    })
                })
                .collect(),
        )
    }

    fn config_entries(&self) -> Vec<ConfigEntry> {
        let st = self.lock();
        let mut out = Vec::new();
        for g in self.target.portal_groups() {
            out.push(ConfigEntry::new(
                "iscsi_create_portal_group",
                json!({"tag": g.tag, "portals": g.addrs.iter().map(|a| split_addr(a)).collect::<Vec<_>>()}),
            ));
        }
        for (tag, (i, m)) in &st.igs {
            out.push(ConfigEntry::new(
                "iscsi_create_initiator_group",
                json!({"tag": tag, "initiators": i, "netmasks": m}),
            ));
        }
        for n in self.target.nodes() {
            let mut v = self.describe_node(&st, &n);
            if let Some(o) = v.as_object_mut() {
                for k in ["chap_group", "mutual_chap", "require_chap", "disable_chap"] {
                    o.remove(k);
                }
            }
            out.push(ConfigEntry::new("iscsi_create_target_node", v));
        }
        out
    }
}

impl Subsystem for IscsiSubsystem {
    fn name(&self) -> &'static str {
        "iscsi"
    }

    fn depends_on(&self) -> &'static [&'static str] {
        &["bdev"]
    }

    fn methods(self: Arc<Self>) -> Vec<Method> {
        type Body = fn(&IscsiSubsystem, &RpcService, Option<Value>) -> Result<Value, RpcError>;
        let table: [(&'static str, Body); 10] = [
            ("iscsi_create_portal_group", |s, _, p| {
                s.create_portal_group(p)
            }),
            ("iscsi_delete_portal_group", |s, v, p| {
                s.delete_portal_group(v, p)
            }),
            ("iscsi_get_portal_groups", |s, _, p| s.get_portal_groups(p)),
            ("iscsi_create_initiator_group", |s, _, p| {
                s.create_initiator_group(p)
            }),
            ("iscsi_delete_initiator_group", |s, _, p| {
                s.delete_initiator_group(p)
            }),
            ("iscsi_get_initiator_groups", |s, _, p| {
                let NoParams {} = decode(p)?;
                Ok(s.get_initiator_groups())
            }),
            ("iscsi_create_target_node", |s, _, p| {
                s.create_target_node(p)
            }),
            ("iscsi_get_target_nodes", |s, _, p| {
                let NoParams {} = decode(p)?;
                Ok(s.get_target_nodes())
            }),
            ("iscsi_delete_target_node", |s, v, p| {
                s.delete_target_node(v, p)
            }),
            ("iscsi_get_connections", |s, _, p| {
                let NoParams {} = decode(p)?;
                Ok(s.get_connections())
            }),
        ];
        table
            .into_iter()
            .map(|(name, body)| {
                let me = Arc::clone(&self);
                Method::runtime(name, move |svc: &RpcService, p| body(&me, svc, p))
            })
            .collect()
    }

    fn config(&self, _svc: &RpcService) -> Result<Vec<ConfigEntry>, RpcError> {
        Ok(self.config_entries())
    }

    fn undo(&self, method: &str, params: Option<&Value>, _result: &Value) -> Option<ConfigEntry> {
        let p = params?;
        match method {
            "iscsi_create_portal_group" => Some(ConfigEntry::new(
                "iscsi_delete_portal_group",
                json!({ "tag": p.get("tag")?.clone() }),
            )),
            "iscsi_create_initiator_group" => Some(ConfigEntry::new(
                "iscsi_delete_initiator_group",
                json!({ "tag": p.get("tag")?.clone() }),
            )),
            "iscsi_create_target_node" => {
                let n = p.get("name")?.as_str()?;
                let full = if ["iqn.", "eui.", "naa."].iter().any(|x| n.starts_with(x)) {
                    n.to_owned()
                } else {
                    format!("{NODEBASE}:{n}")
                };
                Some(ConfigEntry::new(
                    "iscsi_delete_target_node",
                    json!({ "name": full }),
                ))
            }
            _ => None,
        }
    }
}
