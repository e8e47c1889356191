//! `pollux-tgt`'s iSCSI (iSER) side: the `[iscsi]` configuration section,
//! the target it builds (`pollux_iser`'s [`IscsiTarget`] and
//! [`IserTransport`]), one iSER poll group per reactor next to the
//! NVMe-oF ones, the banner lines, and the clean shutdown.
//!
//! ```toml
//! [[iscsi.portal_group]]
//! tag = 1                          # 1..=65535, unique
//! listen = ["@pollux-iser"]        # soft: @name or /path; ibverbs: "10.99.0.1:3260" (port default 3260)
//!
//! [[iscsi.target]]
//! name = "iqn.2016-06.io.pollux:disk0"   # iqn. / eui. / naa.
//! alias = "disk0"                  # TargetAlias [none]
//! luns = [{ lun = 0, bdev = "Malloc0" }] # lun 0..=16383, unique; bdev from [[bdev]]
//! allowed_initiators = []          # initiator IQNs; empty: any initiator [empty]
//! portal_groups = [1]              # tags of [[iscsi.portal_group]] [every group]
//!
//! [iscsi.options]                  # every key optional; defaults in brackets
//! queue_depth = 128                # commands per session (CmdSN window) [128]
//! max_io_bytes = "128k"            # largest transfer of one command, >= 4 KiB [128k]
//! first_burst = "64k"              # FirstBurstLength [64k]
//! max_burst = "1M"                 # MaxBurstLength [1M]
//! recv_dsl = 8192                  # TargetRecvDataSegmentLength, 512..=8192 [8192]
//! immediate_data = true            # ImmediateData [true]
//! initial_r2t = true               # InitialR2T [true]; see README "InitialR2T"
//! task_buffers = 512               # task buffers shared by all sessions [4 x queue_depth]
//! max_srq_depth = 1024             # receive buffers per iSER poll group [1024]
//! num_cqe = 16384                  # CQ entries per iSER poll group [16384]
//! send_with_invalidate = true      # [true]
//! max_read_depth = 16              # RDMA READs in flight per connection [16]
//! hugepages = "auto"               # auto | require | never [auto]
//! pin_connections_to_listener_core = false # no spreading of connections over the cores [false]
//! max_connections = 1024           # connections served at once, all cores; more are rejected [1024]
//! max_connections_per_core = 1024  # connections one core serves at once [1024]
//! nop_in_interval = 30             # s of silence before a NOP-In ping, 0..=60; 0: never ping [30]
//! nop_timeout = 60                 # s to wait for any PDU after a ping before dropping, 1..=3600 [60]
//! logout_grace_ms = 2000           # ms to wait for the initiator to disconnect after a Logout Response, 0..=60000 [2000]
//! ```
//!
//! Errors read `line L, column C: iscsi.target[0].luns[1].bdev: ...` like
//! the rest of the file. A section with neither portal groups nor targets
//! (only `[iscsi.options]`) starts an empty iSCSI target that the
//! `iscsi_*` JSON-RPC methods build up. A file with an `[iscsi]` section may leave out
//! `[[subsystem]]` and `[[listener]]` (an iSCSI-only target).

use std::cell::RefCell;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::rc::Rc;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use pollux_bdev::BdevRegistry;
use pollux_iser::session::TargetLimits;
use pollux_iser::target::iser::{
    IserOptions, IserPollGroup, IserTransport, PlacementPolicy, RECV_DATA_LEN,
};
use pollux_iser::target::{IscsiTarget, PortalGroup, TargetNode, TargetOptions};
use pollux_reactor::{Reactor, ReactorSet};
use pollux_verbs::Provider;
use serde::Deserialize;
use toml::Spanned;

use super::config::{Hugepages, Origin, ProviderKind, Size};
use crate::config::line_col;
use crate::AppError;

/// How long a reactor may take to answer, and the listeners to open.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the shutdown waits for the initiators' connections to close.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// The iSCSI port an ibverbs portal listens on when none is given.
pub const DEFAULT_PORT: u16 = 3260;

/// `[iscsi]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IscsiSection {
    /// Portal groups.
    #[serde(default)]
    pub portal_group: Vec<Spanned<PortalGroupSection>>,
    /// Target nodes.
    #[serde(default)]
    pub target: Vec<Spanned<NodeSection>>,
    /// Session and transport options.
    pub options: Option<Spanned<OptionsSection>>,
}

/// One `[[iscsi.portal_group]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortalGroupSection {
    /// TargetPortalGroupTag.
    pub tag: Spanned<u16>,
    /// Listen addresses.
    pub listen: Vec<Spanned<String>>,
}

/// One `[[iscsi.target]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSection {
    /// The IQN.
    pub name: Spanned<String>,
    /// TargetAlias.
    pub alias: Option<Spanned<String>>,
    /// LUNs.
    #[serde(default)]
    pub luns: Vec<Spanned<LunSection>>,
    /// Initiator IQNs allowed (empty: any).
    #[serde(default)]
    pub allowed_initiators: Vec<Spanned<String>>,
    /// Portal group tags (absent: every group).
    pub portal_groups: Option<Spanned<Vec<Spanned<u16>>>>,
}

/// One LUN of a target node.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LunSection {
    /// LUN number.
    pub lun: Spanned<u16>,
    /// Bdev name.
    pub bdev: Spanned<String>,
}

/// `[iscsi.options]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptionsSection {
    /// Commands per session.
    pub queue_depth: Option<Spanned<u32>>,
    /// Largest transfer of one command.
    pub max_io_bytes: Option<Spanned<Size>>,
    /// FirstBurstLength.
    pub first_burst: Option<Spanned<Size>>,
    /// MaxBurstLength.
    pub max_burst: Option<Spanned<Size>>,
    /// TargetRecvDataSegmentLength.
    pub recv_dsl: Option<Spanned<Size>>,
    /// ImmediateData.
    pub immediate_data: Option<Spanned<bool>>,
    /// InitialR2T.
    pub initial_r2t: Option<Spanned<bool>>,
    /// Task buffers.
    pub task_buffers: Option<Spanned<usize>>,
    /// Connections served at once (all cores).
    pub max_connections: Option<Spanned<usize>>,
    /// Connections one core serves at once.
    pub max_connections_per_core: Option<Spanned<usize>>,
    /// Receive buffers per poll group.
    pub max_srq_depth: Option<Spanned<u32>>,
    /// CQ entries per poll group.
    pub num_cqe: Option<Spanned<u32>>,
    /// SEND_WITH_INVALIDATE.
    pub send_with_invalidate: Option<Spanned<bool>>,
    /// RDMA READs in flight per connection.
    pub max_read_depth: Option<Spanned<u8>>,
    /// Hugepage policy.
    pub hugepages: Option<Spanned<Hugepages>>,
    /// Keep every connection on its listener's core (no placement over cores).
    pub pin_connections_to_listener_core: Option<Spanned<bool>>,
    /// Seconds of silence before a NOP-In ping (SPDK `nop_in_interval`).
    pub nop_in_interval: Option<Spanned<u64>>,
    /// Seconds to wait for an answer to a ping (SPDK `nop_timeout`).
    pub nop_timeout: Option<Spanned<u64>>,
    /// Milliseconds to wait for the initiator's disconnect after a Logout
    /// Response before disconnecting (`IserOptions::logout_grace`).
    pub logout_grace_ms: Option<Spanned<u64>>,
}

/// A checked portal group.
#[derive(Debug, Clone)]
pub struct PortalGroupPlan {
    /// Tag and CM addresses.
    pub group: PortalGroup,
    /// The entry.
    pub origin: Origin,
}

/// A checked LUN.
#[derive(Debug, Clone)]
pub struct LunPlan {
    /// LUN number.
    pub lun: u16,
    /// Bdev name.
    pub bdev: String,
    /// The entry.
    pub origin: Origin,
}

/// A checked target node.
#[derive(Debug, Clone)]
pub struct NodePlan {
    /// The IQN.
    pub name: String,
    /// TargetAlias.
    pub alias: Option<String>,
    /// LUNs in file order.
    pub luns: Vec<LunPlan>,
    /// Initiators allowed (empty: any).
    pub allowed_initiators: Vec<String>,
    /// Portal group tags.
    pub portal_groups: Vec<u16>,
    /// The entry.
    pub origin: Origin,
}

/// The checked `[iscsi]` section.
#[derive(Debug, Clone)]
pub struct IscsiPlan {
    /// Target core options (limits, max I/O, task buffers).
    pub target: TargetOptions,
    /// iSER transport options.
    pub iser: IserOptions,
    /// Portal groups.
    pub portal_groups: Vec<PortalGroupPlan>,
    /// Target nodes.
    pub nodes: Vec<NodePlan>,
    /// The `[iscsi]` section (for errors found when building).
    pub origin: Origin,
}

impl IscsiPlan {
    /// Listen addresses in all portal groups.
    pub fn portals(&self) -> usize {
        self.portal_groups.iter().map(|g| g.group.addrs.len()).sum()
    }

    /// The parts of `[iscsi]` in which this plan differs from `running`
    /// (where in the file an entry sits does not count): `options` (the
    /// target's limits, maximum I/O and task buffers), `iser`,
    /// `portal_group`, `target_node`.
    pub fn changed_parts(&self, running: &IscsiPlan) -> Vec<&'static str> {
        let groups = |p: &IscsiPlan| {
            p.portal_groups
                .iter()
                .map(|g| g.group.clone())
                .collect::<Vec<_>>()
        };
        /// A node as it serves: name, alias, (LUN, bdev)s, initiators, groups.
        type NodeKey<'a> = (
            &'a str,
            Option<&'a str>,
            Vec<(u16, &'a str)>,
            &'a [String],
            &'a [u16],
        );
        fn nodes(p: &IscsiPlan) -> Vec<NodeKey<'_>> {
            p.nodes
                .iter()
                .map(|n| {
                    let luns = n.luns.iter().map(|l| (l.lun, l.bdev.as_str())).collect();
                    (
                        n.name.as_str(),
                        n.alias.as_deref(),
                        luns,
                        n.allowed_initiators.as_slice(),
                        n.portal_groups.as_slice(),
                    )
                })
                .collect()
        }
        [
            ("options", self.target != running.target),
            ("iser", self.iser != running.iser),
            ("portal_group", groups(self) != groups(running)),
            ("target_node", nodes(self) != nodes(running)),
        ]
        .into_iter()
        .filter_map(|(part, changed)| changed.then_some(part))
        .collect()
    }
}

fn origin(text: &str, span: Range<usize>, field: String) -> Origin {
    let (line, col) = line_col(text, span.start);
    Origin { line, col, field }
}

fn at<T>(text: &str, v: &Spanned<T>, field: &str) -> Origin {
    origin(text, v.span(), field.to_string())
}

/// The CM address of a listen entry for `provider`.
fn portal_addr(provider: ProviderKind, s: &str) -> Result<String, String> {
    let s = s.trim();
    match provider {
        ProviderKind::Soft => {
            if s.len() > 1 && (s.starts_with('@') || s.starts_with('/')) {
                Ok(s.to_string())
            } else {
                Err(format!("'{s}': the soft provider listens on an abstract socket name (@pollux-iser) or a socket path"))
            }
        }
        ProviderKind::Ibverbs => {
            if let Ok(a) = s.parse::<SocketAddr>() {
                if a.port() == 0 {
                    return Err(format!("'{s}': port 0"));
                }
                return Ok(a.to_string());
            }
            s.parse::<IpAddr>()
                .map(|ip| SocketAddr::new(ip, DEFAULT_PORT).to_string())
                .map_err(|_| format!("'{s}' is not IP:PORT or an IP address (ibverbs)"))
        }
    }
}

/// Checks `[iscsi]` against the bdevs defined (`bdevs`: their names).
///
/// # Errors
///
/// [`AppError::Config`] naming the line and the field.
pub fn plan(
    text: &str,
    s: &IscsiSection,
    bdevs: &[String],
    provider: ProviderKind,
) -> Result<IscsiPlan, AppError> {
    // toml does not span a table made of dotted headers: place the
    // section at its first header.
    let start = text.find("[iscsi").unwrap_or(0);
    let sec_origin = origin(text, start..start, "iscsi".to_string());

    // Options.
    let mut limits = TargetLimits::default();
    let mut max_io_bytes = 128 * 1024u32;
    let mut task_buffers = None;
    let mut iser = IserOptions::default();
    if let Some(o) = &s.options {
        let o = o.get_ref();
        let f = |k: &str| format!("iscsi.options.{k}");
        let bytes = |k: &str, v: &Spanned<Size>, lo: u64, hi: u64| -> Result<u32, AppError> {
            let n = v.get_ref().0;
            if !(lo..=hi).contains(&n) {
                return Err(at(text, v, &f(k)).err(format!("{n} is not in {lo}..={hi}")));
            }
            Ok(n as u32)
        };
        if let Some(v) = &o.queue_depth {
            let q = *v.get_ref();
            if !(1..=4096).contains(&q) {
                return Err(at(text, v, &f("queue_depth")).err(format!("{q} is not in 1..=4096")));
            }
            limits.queue_depth = q;
        }
        if let Some(v) = &o.max_io_bytes {
            max_io_bytes = bytes("max_io_bytes", v, 4096, 16 << 20)?;
            if max_io_bytes % 512 != 0 {
                return Err(at(text, v, &f("max_io_bytes")).err("must be a multiple of 512"));
            }
        }
        if let Some(v) = &o.max_burst {
            limits.max_burst = bytes("max_burst", v, 512, (1 << 24) - 1)?;
        }
        if let Some(v) = &o.first_burst {
            limits.first_burst = bytes("first_burst", v, 512, (1 << 24) - 1)?;
            if limits.first_burst > limits.max_burst {
                return Err(at(text, v, &f("first_burst")).err(format!(
                    "{} is larger than max_burst ({})",
                    limits.first_burst, limits.max_burst
                )));
            }
        }
        if let Some(v) = &o.recv_dsl {
            limits.recv_dsl = bytes("recv_dsl", v, 512, RECV_DATA_LEN as u64)?;
        }
        if let Some(v) = &o.immediate_data {
            limits.immediate_data = *v.get_ref();
        }
        if let Some(v) = &o.initial_r2t {
            limits.initial_r2t = *v.get_ref();
        }
        if let Some(v) = &o.task_buffers {
            if *v.get_ref() == 0 {
                return Err(at(text, v, &f("task_buffers")).err("must be at least 1"));
            }
            task_buffers = Some(*v.get_ref());
        }
        if let Some(v) = &o.max_connections {
            if *v.get_ref() == 0 {
                return Err(at(text, v, &f("max_connections")).err("must be at least 1"));
            }
            iser.max_connections = *v.get_ref();
        }
        if let Some(v) = &o.max_connections_per_core {
            if *v.get_ref() == 0 {
                return Err(at(text, v, &f("max_connections_per_core")).err("must be at least 1"));
            }
            iser.max_connections_per_core = *v.get_ref();
        }
        if let Some(v) = &o.max_srq_depth {
            if *v.get_ref() < 16 {
                return Err(at(text, v, &f("max_srq_depth")).err("must be at least 16"));
            }
            iser.max_srq_depth = *v.get_ref();
        }
        if let Some(v) = &o.num_cqe {
            if *v.get_ref() < 64 {
                return Err(at(text, v, &f("num_cqe")).err("must be at least 64"));
            }
            iser.num_cqe = *v.get_ref();
        }
        if let Some(v) = &o.send_with_invalidate {
            iser.send_with_invalidate = *v.get_ref();
        }
        if let Some(v) = &o.max_read_depth {
            if *v.get_ref() == 0 {
                return Err(at(text, v, &f("max_read_depth")).err("must be at least 1"));
            }
            iser.max_read_depth = *v.get_ref();
        }
        if let Some(v) = &o.hugepages {
            iser.hugepages = (*v.get_ref()).into();
        }
        if let Some(v) = &o.nop_in_interval {
            let n = *v.get_ref();
            if n > 60 {
                return Err(at(text, v, &f("nop_in_interval")).err(format!("{n} is not in 0..=60")));
            }
            iser.nop_in_interval = Duration::from_secs(n);
        }
        if let Some(v) = &o.nop_timeout {
            let n = *v.get_ref();
            if !(1..=3600).contains(&n) {
                return Err(at(text, v, &f("nop_timeout")).err(format!("{n} is not in 1..=3600")));
            }
            iser.nop_timeout = Duration::from_secs(n);
        }
        if let Some(v) = &o.logout_grace_ms {
            let n = *v.get_ref();
            if n > 60_000 {
                return Err(
                    at(text, v, &f("logout_grace_ms")).err(format!("{n} is not in 0..=60000"))
                );
            }
            iser.logout_grace = Duration::from_millis(n);
        }
        if let Some(v) = &o.pin_connections_to_listener_core {
            iser.placement = if *v.get_ref() {
                PlacementPolicy::ListenerCore
            } else {
                PlacementPolicy::LeastConnections
            };
        }
    }
    let target = TargetOptions {
        task_buffers: task_buffers.unwrap_or(4 * limits.queue_depth as usize),
        limits,
        max_io_bytes,
    };

    // Portal groups. Neither groups nor targets: an empty iSCSI target,
    // built up by `iscsi_*` calls.
    let empty = s.portal_group.is_empty() && s.target.is_empty();
    if s.portal_group.is_empty() && !empty {
        return Err(sec_origin.err(
            "no [[iscsi.portal_group]]: no initiator could reach the target (tag = 1, listen = [\"@pollux-iser\"])",
        ));
    }
    let mut groups: Vec<PortalGroupPlan> = Vec::new();
    let mut seen_addrs: Vec<(String, usize)> = Vec::new();
    for (gi, g) in s.portal_group.iter().enumerate() {
        let o = at(text, g, &format!("iscsi.portal_group[{gi}]"));
        let g = g.get_ref();
        let f = |k: &str| format!("iscsi.portal_group[{gi}].{k}");
        let tag = *g.tag.get_ref();
        if tag == 0 {
            return Err(at(text, &g.tag, &f("tag")).err("tag 0 is reserved: use 1..=65535"));
        }
        if let Some(p) = groups.iter().find(|p| p.group.tag == tag) {
            return Err(at(text, &g.tag, &f("tag")).err(format!(
                "tag {tag} is already used at line {}",
                p.origin.line
            )));
        }
        if g.listen.is_empty() {
            return Err(o.err("listen = []: give at least one address"));
        }
        let mut addrs = Vec::new();
        for (ai, a) in g.listen.iter().enumerate() {
            let ao = at(text, a, &f(&format!("listen[{ai}]")));
            let addr = portal_addr(provider, a.get_ref()).map_err(|m| ao.err(m))?;
            if let Some((_, line)) = seen_addrs.iter().find(|(x, _)| *x == addr) {
                return Err(ao.err(format!("'{addr}' is already listed at line {line}")));
            }
            seen_addrs.push((addr.clone(), ao.line));
            addrs.push(addr);
        }
        groups.push(PortalGroupPlan {
            group: PortalGroup { tag, addrs },
            origin: o,
        });
    }

    // Target nodes.
    if s.target.is_empty() && !empty {
        return Err(sec_origin.err(
            "no [[iscsi.target]]: the target would serve nothing (name = \"iqn....\", luns = [{ lun = 0, bdev = \"NAME\" }])",
        ));
    }
    let mut nodes: Vec<NodePlan> = Vec::new();
    for (ti, t) in s.target.iter().enumerate() {
        let o = at(text, t, &format!("iscsi.target[{ti}]"));
        let t = t.get_ref();
        let f = |k: &str| format!("iscsi.target[{ti}].{k}");
        let name = t.name.get_ref().trim().to_string();
        if !valid_iscsi_name(&name) {
            return Err(at(text, &t.name, &f("name")).err(format!(
                "'{name}' is not an iSCSI name (iqn.yyyy-mm.reverse.domain:name, eui.<16 hex>, naa.<hex>; at most 223 bytes)"
            )));
        }
        if let Some(p) = nodes.iter().find(|p| p.name == name) {
            return Err(at(text, &t.name, &f("name")).err(format!(
                "target '{name}' is already defined at line {}",
                p.origin.line
            )));
        }
        if t.luns.is_empty() {
            return Err(o.err("no LUNs: add luns = [{ lun = 0, bdev = \"NAME\" }]"));
        }
        let mut luns: Vec<LunPlan> = Vec::new();
        for (li, l) in t.luns.iter().enumerate() {
            let lo = at(text, l, &f(&format!("luns[{li}]")));
            let l = l.get_ref();
            let n = *l.lun.get_ref();
            let lf = f(&format!("luns[{li}].lun"));
            if n > 16383 {
                return Err(at(text, &l.lun, &lf).err(format!("LUN {n} is not in 0..=16383")));
            }
            if let Some(p) = luns.iter().find(|p| p.lun == n) {
                return Err(at(text, &l.lun, &lf)
                    .err(format!("duplicate LUN {n} (also {})", p.origin.field)));
            }
            let b = l.bdev.get_ref();
            if !bdevs.iter().any(|x| x == b) {
                return Err(
                    at(text, &l.bdev, &f(&format!("luns[{li}].bdev"))).err(format!(
                        "no bdev named '{b}' (defined: {})",
                        if bdevs.is_empty() {
                            "none".to_string()
                        } else {
                            bdevs.join(", ")
                        }
                    )),
                );
            }
            luns.push(LunPlan {
                lun: n,
                bdev: b.clone(),
                origin: lo,
            });
        }
        let mut allowed = Vec::new();
        for (ii, i) in t.allowed_initiators.iter().enumerate() {
            let io = at(text, i, &f(&format!("allowed_initiators[{ii}]")));
            let v = i.get_ref().trim();
            if !valid_iscsi_name(v) {
                return Err(io.err(format!("'{v}' is not an iSCSI name")));
            }
            if allowed.iter().any(|x: &String| x == v) {
                return Err(io.err(format!("'{v}' is listed twice")));
            }
            allowed.push(v.to_string());
        }
        let portal_groups = match &t.portal_groups {
            None => groups.iter().map(|g| g.group.tag).collect(),
            Some(list) => {
                if list.get_ref().is_empty() {
                    return Err(at(text, list, &f("portal_groups"))
                        .err("portal_groups = []: the target would be unreachable"));
                }
                let mut v = Vec::new();
                for (pi, p) in list.get_ref().iter().enumerate() {
                    let po = at(text, p, &f(&format!("portal_groups[{pi}]")));
                    let tag = *p.get_ref();
                    if !groups.iter().any(|g| g.group.tag == tag) {
                        let known: Vec<String> =
                            groups.iter().map(|g| g.group.tag.to_string()).collect();
                        return Err(po.err(format!(
                            "no portal group with tag {tag} (defined: {})",
                            known.join(", ")
                        )));
                    }
                    if v.contains(&tag) {
                        return Err(po.err(format!("tag {tag} is listed twice")));
                    }
                    v.push(tag);
                }
                v
            }
        };
        nodes.push(NodePlan {
            name,
            alias: t.alias.as_ref().map(|a| a.get_ref().clone()),
            luns,
            allowed_initiators: allowed,
            portal_groups,
            origin: o,
        });
    }
    Ok(IscsiPlan {
        target,
        iser,
        portal_groups: groups,
        nodes,
        origin: sec_origin,
    })
}

/// `iqn.` / `eui.` / `naa.` names of at most 223 bytes without spaces.
fn valid_iscsi_name(n: &str) -> bool {
    let ok_prefix = n.starts_with("iqn.") || n.starts_with("eui.") || n.starts_with("naa.");
    ok_prefix && n.len() > 4 && n.len() <= 223 && n.bytes().all(|b| b.is_ascii_graphic())
}

/// The iSCSI target's objects.
pub struct IscsiBuilt<P: Provider> {
    /// Nodes, portal groups, task buffers.
    pub target: Arc<IscsiTarget>,
    /// The iSER transport.
    pub transport: Arc<IserTransport<P>>,
}

impl<P: Provider> std::fmt::Debug for IscsiBuilt<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IscsiBuilt")
            .field("transport", &self.transport)
            .finish()
    }
}

/// Creates the iSCSI target (portal groups, nodes with their LUNs on the
/// bdevs of `registry`) and its iSER transport (control path).
///
/// # Errors
///
/// [`AppError::Config`] at the entry that failed.
pub fn build<P: Provider>(
    plan: &IscsiPlan,
    registry: &BdevRegistry,
) -> Result<IscsiBuilt<P>, AppError> {
    let target = IscsiTarget::new(plan.target.clone())
        .map_err(|e| plan.origin.err(format!("options: {e}")))?;
    for g in &plan.portal_groups {
        target
            .add_portal_group(g.group.clone())
            .map_err(|e| g.origin.err(e))?;
    }
    for n in &plan.nodes {
        let mut luns = Vec::with_capacity(n.luns.len());
        for l in &n.luns {
            let b = registry
                .get(&l.bdev)
                .ok_or_else(|| l.origin.err(format!("no bdev named '{}'", l.bdev)))?;
            luns.push((l.lun, b));
        }
        target
            .add_node(TargetNode {
                name: n.name.clone(),
                alias: n.alias.clone(),
                luns,
                allowed_initiators: n.allowed_initiators.clone(),
                portal_groups: n.portal_groups.clone(),
            })
            .map_err(|e| n.origin.err(e))?;
    }
    let transport = IserTransport::<P>::new(&target, plan.iser.clone());
    Ok(IscsiBuilt { target, transport })
}

/// The iSER transport as the `iscsi_*` methods open portals through it.
#[derive(Debug)]
pub struct IserPortals<P: Provider>(pub Arc<IserTransport<P>>);

impl<P: Provider> pollux_rpc::iscsi::PortalListener for IserPortals<P> {
    fn listen(&self, addr: &str, tag: u16) -> Result<(), pollux_rpc::iscsi::PortalError> {
        Ok(self.0.listen(addr, tag)?)
    }

    fn stop_listen(&self, addr: &str) -> Result<(), pollux_rpc::iscsi::PortalError> {
        Ok(self.0.stop_listen(addr)?)
    }
}

/// The per-core iSER poll group, behind a provider-independent face.
trait IserCtl {
    fn shutdown(&self);
    fn connections(&self) -> usize;
    fn listeners(&self) -> usize;
}

impl<P: Provider> IserCtl for IserPollGroup<P> {
    fn shutdown(&self) {
        IserPollGroup::shutdown(self);
    }
    fn connections(&self) -> usize {
        IserPollGroup::connections(self)
    }
    fn listeners(&self) -> usize {
        IserPollGroup::listeners(self)
    }
}

thread_local! {
    /// This reactor's iSER poll group.
    static GROUP: RefCell<Option<Rc<dyn IserCtl>>> = const { RefCell::new(None) };
}

/// Creates this core's iSER poll group and keeps it (reactor init).
///
/// # Errors
///
/// The transport's message.
pub fn start_group<P: Provider>(built: &IscsiBuilt<P>, r: &Reactor) -> Result<(), String> {
    let pg = built
        .transport
        .create_poll_group(r)
        .map_err(|e| format!("core {}: iSER poll group: {e}", r.core()))?;
    let pg: Rc<dyn IserCtl> = pg;
    GROUP.with(|g| *g.borrow_mut() = Some(pg));
    Ok(())
}

fn ask_all<T: Send + 'static>(
    set: &ReactorSet,
    f: fn(Option<&dyn IserCtl>) -> T,
) -> Result<Vec<T>, AppError> {
    let mut out = Vec::with_capacity(set.cores().len());
    for &core in set.cores() {
        let (tx, rx) = mpsc::sync_channel(1);
        set.messenger()
            .send_blocking(core, move |_| {
                let v = GROUP.with(|g| f(g.borrow().as_deref()));
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

/// Listens on every portal (spread over the poll groups) and waits until
/// each is open.
///
/// # Errors
///
/// [`AppError::Config`] at the portal group whose address did not open.
pub fn listen<P: Provider>(
    plan: &IscsiPlan,
    built: &IscsiBuilt<P>,
    set: &ReactorSet,
) -> Result<(), AppError> {
    built
        .transport
        .listen_portal_groups()
        .map_err(|e| plan.origin.err(e))?;
    let want = plan.portals();
    let deadline = Instant::now() + ASK_TIMEOUT;
    loop {
        let open: usize = ask_all(set, |g| g.map_or(0, IserCtl::listeners))?
            .into_iter()
            .sum();
        if open >= want {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let g = &plan.portal_groups[0];
            return Err(g.origin.err(format!(
                "{open} of {want} iSCSI portal(s) open (address in use?)"
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Live iSER connections on all cores.
///
/// # Errors
///
/// [`AppError::Reactor`].
pub fn connections(set: &ReactorSet) -> Result<usize, AppError> {
    Ok(connections_per_core(set)?.into_iter().sum())
}

/// Live iSER connections of each core's poll group (new connections go to
/// the group with the fewest), in the reactor set's core order.
///
/// # Errors
///
/// [`AppError::Reactor`].
pub fn connections_per_core(set: &ReactorSet) -> Result<Vec<usize>, AppError> {
    ask_all(set, |g| g.map_or(0, IserCtl::connections))
}

/// Disconnects every initiator and waits (bounded) for the connections to
/// be destroyed; returns how many were left open.
///
/// # Errors
///
/// [`AppError::Reactor`].
pub fn shutdown<P: Provider>(
    set: &ReactorSet,
    built: &IscsiBuilt<P>,
    out: &mut dyn Write,
) -> Result<usize, AppError> {
    let conns = connections(set)?;
    let _ = writeln!(
        out,
        "pollux-tgt: shutting down iSCSI: disconnecting {conns} connection(s)"
    );
    let _ = out.flush();
    ask_all(set, |g| {
        if let Some(g) = g {
            g.shutdown();
        }
    })?;
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    loop {
        let open = connections(set)?;
        if open == 0 || Instant::now() >= deadline {
            if open > 0 {
                eprintln!(
                    "pollux-tgt: {open} iSCSI connection(s) did not close in {DRAIN_TIMEOUT:?}; stopping anyway"
                );
            }
            let st = built.transport.stats();
            let _ = writeln!(
                out,
                "pollux-tgt: iSCSI stopped ({} connection(s) accepted, {} closed)",
                st.accepted, st.destroyed
            );
            return Ok(open);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Drops every core's iSER poll group on its own core (best effort).
pub fn drop_groups(set: &ReactorSet) {
    for &core in set.cores() {
        let (tx, rx) = mpsc::sync_channel(1);
        let sent = set.messenger().send_blocking(core, move |_| {
            let g = GROUP.with(|g| g.borrow_mut().take());
            drop(g);
            let _ = tx.send(());
        });
        if sent.is_ok() {
            let _ = rx.recv_timeout(ASK_TIMEOUT);
        }
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// The banner lines of the iSCSI target: options, portal groups, nodes
/// with their LUNs and the `pollux-perf -r` line for each.
///
/// # Errors
///
/// Write errors.
pub fn banner<P: Provider>(
    plan: &IscsiPlan,
    provider: ProviderKind,
    built: &IscsiBuilt<P>,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let o = built.target.options();
    let l = &o.limits;
    let i = built.transport.options();
    writeln!(
        out,
        "  iSCSI over iSER: queue_depth {} max_io_bytes {} first_burst {} max_burst {} recv_dsl {} immediate_data {} initial_r2t {}",
        l.queue_depth, o.max_io_bytes, l.first_burst, l.max_burst, l.recv_dsl, l.immediate_data, l.initial_r2t
    )?;
    writeln!(
        out,
        "             task_buffers {} ({:.1} MiB) max_srq_depth {} num_cqe {} send_with_invalidate {} max_read_depth {}",
        o.task_buffers,
        mib(built.target.pool().count() as u64 * ((u64::from(o.max_io_bytes) / 512) * 520)),
        i.max_srq_depth,
        i.num_cqe,
        i.send_with_invalidate,
        i.max_read_depth
    )?;
    writeln!(
        out,
        "             max_connections {} max_connections_per_core {} (more are rejected) nop_in_interval {} s nop_timeout {} s logout_grace {} ms",
        i.max_connections,
        i.max_connections_per_core,
        i.nop_in_interval.as_secs(),
        i.nop_timeout.as_secs(),
        i.logout_grace.as_millis()
    )?;
    for g in &plan.portal_groups {
        writeln!(
            out,
            "  iscsi portal group {}: {}",
            g.group.tag,
            g.group.addrs.join(", ")
        )?;
    }
    for n in &plan.nodes {
        let who = if n.allowed_initiators.is_empty() {
            "any initiator".to_string()
        } else {
            format!("initiators {}", n.allowed_initiators.join(", "))
        };
        let pgs: Vec<String> = n.portal_groups.iter().map(u16::to_string).collect();
        writeln!(
            out,
            "  iscsi target {} (portal groups {}, {who})",
            n.name,
            pgs.join(", ")
        )?;
        let node = built.target.node(&n.name);
        for (lun, b) in node.iter().flat_map(|x| x.luns.iter()) {
            let info = b.info();
            let pi = if info.pi_type() == pollux_bdev::PiType::None {
                String::new()
            } else {
                format!(", md {} PI type {:?}", info.md_size(), info.pi_type())
            };
            writeln!(
                out,
                "    lun {lun}: bdev {} ({} blocks of {} bytes{pi}, {:.1} MiB)",
                b.name(),
                info.num_blocks(),
                info.block_size(),
                mib(info.num_blocks() * u64::from(info.block_size()))
            )?;
        }
        for g in plan
            .portal_groups
            .iter()
            .filter(|g| n.portal_groups.contains(&g.group.tag))
        {
            for a in &g.group.addrs {
                let (addr, svc) = perf_addr(provider, a);
                if let Some(lun) = n.luns.first() {
                    writeln!(
                        out,
                        "    initiator: -r 'trtype:iser traddr:{addr}{svc} target:{} lun:{}'",
                        n.name, lun.lun
                    )?;
                }
            }
        }
    }
    Ok(())
}

/// `traddr` and ` trsvcid:PORT` of a CM address for `pollux-perf -r`.
fn perf_addr(provider: ProviderKind, a: &str) -> (String, String) {
    match (provider, a.parse::<SocketAddr>()) {
        (ProviderKind::Ibverbs, Ok(s)) => (s.ip().to_string(), format!(" trsvcid:{}", s.port())),
        _ => (a.to_string(), String::new()),
    }
}

/// `--check` lines of the iSCSI section.
pub fn print_plan(plan: &IscsiPlan) {
    println!(
        "  iscsi: {} portal group(s), {} target(s), queue_depth {}, max_io_bytes {}",
        plan.portal_groups.len(),
        plan.nodes.len(),
        plan.target.limits.queue_depth,
        plan.target.max_io_bytes
    );
    for g in &plan.portal_groups {
        println!(
            "    portal group {}: {}",
            g.group.tag,
            g.group.addrs.join(", ")
        );
    }
    for n in &plan.nodes {
        println!("    target {}", n.name);
        for l in &n.luns {
            println!("      lun {}: bdev {}", l.lun, l.bdev);
        }
    }
}

impl<P: Provider> Clone for IscsiBuilt<P> {
    fn clone(&self) -> Self {
        IscsiBuilt {
            target: Arc::clone(&self.target),
            transport: Arc::clone(&self.transport),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn portal_addresses_per_provider() {
        let soft = ProviderKind::Soft;
        assert_eq!(portal_addr(soft, "@pollux-iser").unwrap(), "@pollux-iser");
        assert_eq!(portal_addr(soft, "/run/x.sock").unwrap(), "/run/x.sock");
        assert!(portal_addr(soft, "10.99.0.1:3260").is_err());
        let ib = ProviderKind::Ibverbs;
        assert_eq!(portal_addr(ib, "10.99.0.1:3260").unwrap(), "10.99.0.1:3260");
        assert_eq!(portal_addr(ib, "10.99.0.1").unwrap(), "10.99.0.1:3260");
        assert_eq!(portal_addr(ib, "fe80::1").unwrap(), "[fe80::1]:3260");
        assert!(portal_addr(ib, "10.99.0.1:0").is_err());
        assert!(portal_addr(ib, "@pollux-iser").is_err());
        assert_eq!(
            perf_addr(ib, "10.99.0.1:3260"),
            ("10.99.0.1".to_string(), " trsvcid:3260".to_string())
        );
        assert!(valid_iscsi_name("iqn.2016-06.io.pollux:disk0"));
        assert!(!valid_iscsi_name("iqn."));
        assert!(!valid_iscsi_name("disk0"));
        assert!(!valid_iscsi_name("iqn.2016-06.io.pollux:a b"));
    }

    #[test]
    fn connections_spread_over_the_cores_unless_pinned() {
        let text = |extra: &str| {
            format!(
                "[[bdev]]\nspec = \"malloc:name=M0,size=1M,block=512\"\n\
                 [[iscsi.portal_group]]\ntag = 1\nlisten = [\"@x\"]\n\
                 [[iscsi.target]]\nname = \"iqn.2016-06.io.pollux:d\"\n\
                 luns = [{{ lun = 0, bdev = \"M0\" }}]\n\
                 [iscsi.options]\n{extra}\n"
            )
        };
        let placement = |extra: &str| {
            let plan = crate::tgt::config::TgtPlan::parse(&text(extra)).expect("valid config");
            plan.iscsi.expect("[iscsi]").iser.placement
        };
        assert_eq!(placement(""), PlacementPolicy::LeastConnections);
        assert_eq!(
            placement("pin_connections_to_listener_core = true"),
            PlacementPolicy::ListenerCore
        );
        assert_eq!(
            placement("pin_connections_to_listener_core = false"),
            PlacementPolicy::LeastConnections
        );
    }

    #[test]
    fn changed_parts_name_what_differs_and_ignore_where_it_is_written() {
        let plan = |groups: &str, lun_bdev: &str, options: &str| {
            let text = format!(
                "[[bdev]]\nspec = \"malloc:name=M0,size=1M,block=512\"\n\
                 [[bdev]]\nspec = \"malloc:name=M1,size=1M,block=512\"\n\
                 {groups}\
                 [[iscsi.target]]\nname = \"iqn.2016-06.io.pollux:d\"\n\
                 luns = [{{ lun = 0, bdev = \"{lun_bdev}\" }}]\n\
                 [iscsi.options]\n{options}\n"
            );
            crate::tgt::config::TgtPlan::parse(&text)
                .expect("valid config")
                .iscsi
                .expect("[iscsi]")
        };
        let group = "[[iscsi.portal_group]]\ntag = 1\nlisten = [\"@x\"]\n";
        let base = plan(group, "M0", "");
        assert!(base.changed_parts(&base.clone()).is_empty());
        // The same section further down the file (other origins): no change.
        let moved = plan(&format!("\n\n\n{group}"), "M0", "");
        assert!(moved.changed_parts(&base).is_empty());
        assert_eq!(plan(group, "M1", "").changed_parts(&base), ["target_node"]);
        assert_eq!(
            plan(group, "M0", "queue_depth = 64").changed_parts(&base),
            ["options"]
        );
        assert_eq!(
            plan(group, "M0", "pin_connections_to_listener_core = true").changed_parts(&base),
            ["iser"]
        );
        let other_group = "[[iscsi.portal_group]]\ntag = 1\nlisten = [\"@y\"]\n";
        assert_eq!(
            plan(other_group, "M0", "").changed_parts(&base),
            ["portal_group"]
        );
    }
}
