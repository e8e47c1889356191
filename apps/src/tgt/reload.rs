//! Configuration reload (SIGHUP in `pollux-tgt`): re-read the TOML file
//! and apply its subsystems, hosts, listeners and namespaces to the
//! running target, without disconnecting any host, through the same
//! JSON-RPC methods a client calls (`nvmf_create_subsystem`,
//! `nvmf_subsystem_add_ns`, `nvmf_subsystem_add_listener`, ...), so a
//! reload and a client change the target the same way.
//!
//! What a reload applies: bdevs that are new in the file are created;
//! subsystems new in the file are created (with their hosts, namespaces
//! and every listener of the file, as at start), subsystems gone from it
//! are deleted (refused while hosts are connected to them); in running
//! subsystems, `allow_any_host` and the host list follow the file,
//! namespaces that are new are added, namespaces gone are removed and a
//! namespace whose bdev changed is replaced; each subsystem's listeners
//! (the top-level `[[listener]]`s and its own `listeners`; the discovery
//! subsystem's are the top-level ones) follow the file: a listener new for
//! a subsystem is added to it (the transport is created by
//! `nvmf_create_transport` when none of its type runs), a listener gone
//! from it is removed, which disconnects only that subsystem's queues
//! that came in through the address (the address closes when no
//! subsystem uses it any more). A namespace change raises a Namespace Attribute Changed event on
//! the subsystem's controllers (an outstanding AER completes; the
//! changed-namespace log page lists the NSIDs), so hosts see it without
//! reconnecting. What needs a restart is left alone and named in the
//! report ([`ReloadReport::ignored`]): a changed `[transport]` option, a
//! changed `[transport.tcp]` option of a TCP transport running since
//! start, a changed `cores` or `provider`, an `[iscsi]` section that came
//! or went, and a change inside `[iscsi]` (its options, iSER options,
//! portal groups or target nodes; those change live through the
//! `iscsi_*` JSON-RPC methods).
//!
//! A file that does not parse or check leaves the target as it was. When
//! a call fails, the additions made before it are undone; removals made
//! before it stay (a removed namespace is not put back).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use pollux_nvmf::spec::transport_id::{TrType, TransportId};
use pollux_nvmf::target::DISCOVERY_NQN;
use pollux_rpc::nvmf::{describe_trid, trtype_name};
use pollux_rpc::{ConfigEntry, RpcService};
use pollux_verbs::Provider;
use serde_json::{json, Value};

use super::config::{ListenerPlan, Origin};
use super::{Built, TgtPlan};
use crate::AppError;

/// What one reload did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReloadReport {
    /// `(subsystem NQN, NSID)` added.
    pub added: Vec<(String, u32)>,
    /// `(subsystem NQN, NSID)` removed.
    pub removed: Vec<(String, u32)>,
    /// Bdevs created.
    pub bdevs_created: Vec<String>,
    /// Subsystems created.
    pub subsystems_added: Vec<String>,
    /// Subsystems deleted.
    pub subsystems_removed: Vec<String>,
    /// Host changes (`+host on nqn`, `-host on nqn`, `any host on nqn`).
    pub hosts_changed: Vec<String>,
    /// Listeners opened.
    pub listeners_added: Vec<String>,
    /// Listeners closed.
    pub listeners_removed: Vec<String>,
    /// Differences a reload does not apply (restart needed).
    pub ignored: Vec<String>,
}

impl std::fmt::Display for ReloadReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |v: &[(String, u32)]| {
            v.iter()
                .map(|(n, id)| format!("{n} nsid {id}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        write!(
            f,
            "{} namespace(s) added, {} removed, {} bdev(s) created, {} subsystem(s) added, {} removed, {} host change(s), {} listener(s) added, {} removed",
            self.added.len(),
            self.removed.len(),
            self.bdevs_created.len(),
            self.subsystems_added.len(),
            self.subsystems_removed.len(),
            self.hosts_changed.len(),
            self.listeners_added.len(),
            self.listeners_removed.len(),
        )?;
        if !self.added.is_empty() {
            write!(f, "; added: {}", list(&self.added))?;
        }
        if !self.removed.is_empty() {
            write!(f, "; removed: {}", list(&self.removed))?;
        }
        for (what, v) in [
            ("subsystems added", &self.subsystems_added),
            ("subsystems removed", &self.subsystems_removed),
            ("hosts", &self.hosts_changed),
            ("listeners added", &self.listeners_added),
            ("listeners removed", &self.listeners_removed),
        ] {
            if !v.is_empty() {
                write!(f, "; {what}: {}", v.join(", "))?;
            }
        }
        for i in &self.ignored {
            write!(f, "; not applied (restart needed): {i}")?;
        }
        Ok(())
    }
}

/// Re-read `path` and apply it to `built` through `svc` (see the module
/// docs).
///
/// # Errors
/// [`AppError::Config`] (the file does not load, a new bdev cannot be
/// created, a call is refused) naming the line and field.
pub fn reload<P: Provider>(
    path: &Path,
    built: &Built<P>,
    svc: &RpcService,
) -> Result<ReloadReport, AppError> {
    let plan = TgtPlan::load(path)?;
    apply(&plan, built, svc)
}

/// What the file changes that a reload leaves alone (the options the
/// running transports and pools were made with, the `[iscsi]` section's
/// presence): `transport.KEY` per changed key, `transport.tcp` when any
/// NVMe/TCP option changed, `iscsi` when the section came or went.
fn restart_needed<P: Provider>(plan: &TgtPlan, built: &Built<P>) -> Vec<String> {
    let (t, now) = (&plan.target, built.target.options());
    let (r, rnow) = (&plan.rdma, built.transport.options());
    let mut out: Vec<String> = [
        ("max_queue_depth", t.max_queue_depth != now.max_queue_depth),
        ("max_io_size", t.max_io_size != now.max_io_size),
        ("io_unit_size", t.io_unit_size != now.io_unit_size),
        (
            "in_capsule_data_size",
            t.in_capsule_data_size != now.in_capsule_data_size,
        ),
        (
            "num_shared_buffers",
            t.num_data_buffers != now.num_data_buffers,
        ),
        (
            "buf_cache_size",
            t.buffer_cache_size != now.buffer_cache_size,
        ),
        (
            "num_slot_buffers",
            t.num_slot_buffers != now.num_slot_buffers,
        ),
        (
            "hugepages",
            t.hugepages != now.hugepages || r.hugepages != rnow.hugepages,
        ),
        (
            "connect_timeout_ms",
            t.connect_timeout_ms != now.connect_timeout_ms,
        ),
        ("max_srq_depth", r.max_srq_depth != rnow.max_srq_depth),
        ("no_srq", r.no_srq != rnow.no_srq),
        ("num_cqe", r.num_cqe != rnow.num_cqe),
        (
            "send_with_invalidate",
            r.send_with_invalidate != rnow.send_with_invalidate,
        ),
        ("max_read_depth", r.max_read_depth != rnow.max_read_depth),
        (
            "acceptor_backlog",
            r.acceptor_backlog != rnow.acceptor_backlog,
        ),
        ("pin_queues_to_listener_core", r.placement != rnow.placement),
        ("max_qpairs", r.max_qpairs != rnow.max_qpairs),
        (
            "max_qpairs_per_core",
            r.max_qpairs_per_core != rnow.max_qpairs_per_core,
        ),
        ("device", r.device != rnow.device),
    ]
    .into_iter()
    .filter(|&(_, changed)| changed)
    .map(|(key, _)| format!("transport.{key}"))
    .collect();
    // An option the list above does not name yet still shows.
    if out.is_empty() && (t != now || r != rnow) {
        out.push("transport".into());
    }
    if let (Some(o), Some(running)) = (&plan.tcp, &built.tcp) {
        if o != running.options() {
            out.push("transport.tcp".into());
        }
    }
    let was = &built.started_with;
    if plan.cores != was.cores {
        out.push("cores".into());
    }
    if plan.provider != was.provider {
        out.push("provider".into());
    }
    match (&plan.iscsi, &was.iscsi) {
        (Some(new), Some(old)) => out.extend(
            new.changed_parts(old)
                .into_iter()
                .map(|part| format!("iscsi.{part}")),
        ),
        (None, None) => {}
        _ => out.push("iscsi".into()),
    }
    out
}

/// One call of a reload, where in the file it comes from, and what the
/// report says once it succeeded.
struct Step {
    call: ConfigEntry,
    origin: Origin,
    note: Note,
}

enum Note {
    None,
    NsAdded(String, u32),
    NsRemoved(String, u32),
    SubsystemAdded(String),
    SubsystemRemoved(String),
    Host(String),
}

fn step(method: &str, params: Value, origin: &Origin, note: Note) -> Step {
    Step {
        call: ConfigEntry::new(method, params),
        origin: origin.clone(),
        note,
    }
}

fn address(t: &TransportId) -> String {
    if t.trsvcid.is_empty() {
        format!("{} {}", trtype_name(t.trtype), t.traddr)
    } else {
        format!("{} {}:{}", trtype_name(t.trtype), t.traddr, t.trsvcid)
    }
}

/// Apply `plan` to `built` through `svc`.
///
/// # Errors
/// As [`reload`].
pub fn apply<P: Provider>(
    plan: &TgtPlan,
    built: &Built<P>,
    svc: &RpcService,
) -> Result<ReloadReport, AppError> {
    let mut rep = ReloadReport {
        ignored: restart_needed(plan, built),
        ..ReloadReport::default()
    };
    let target = &built.target;
    let whole = Origin {
        line: 1,
        col: 1,
        field: "listener".into(),
    };
    let mut adds: Vec<Step> = Vec::new();
    let mut removes: Vec<Step> = Vec::new();

    // Transports for listeners of a type none runs yet.
    let have_types: BTreeSet<String> = svc
        .call("nvmf_get_transports", None)
        .map_err(|e| AppError::Setup(e.to_string()))?
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|t| t["trtype"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let mut want_types = BTreeSet::new();
    for l in plan.all_listeners() {
        let name = trtype_name(l.trid.trtype);
        if !have_types.contains(name) && want_types.insert(name) {
            let mut params = json!({ "trtype": name });
            if let (Some(o), TrType::Tcp) = (&plan.tcp, l.trid.trtype) {
                params["max_queue_depth"] = json!(o.max_queue_depth);
                params["max_io_qpairs_per_ctrlr"] = json!(o.max_io_qpairs_per_ctrlr);
                params["in_capsule_data_size"] = json!(o.in_capsule_data_size);
                params["c2h_success"] = json!(o.c2h_success);
                params["sock_priority"] = json!(o.sock_priority);
            }
            adds.push(step("nvmf_create_transport", params, &l.origin, Note::None));
        }
    }

    let running: Vec<String> = target
        .subsystems()
        .iter()
        .map(|s| s.nqn().to_owned())
        .collect();
    let open: Vec<TransportId> = target.listeners().into_iter().map(|l| l.trid).collect();
    let all = plan.all_listeners();
    rep.listeners_added = all
        .iter()
        .filter(|l| !open.contains(&l.trid))
        .map(|l| address(&l.trid))
        .collect();
    rep.listeners_removed = open
        .iter()
        .filter(|t| !all.iter().any(|l| &l.trid == *t))
        .map(address)
        .collect();
    // The discovery subsystem listens on the top-level listeners.
    let disc: Vec<&ListenerPlan> = plan.listeners.iter().collect();
    listener_steps(
        DISCOVERY_NQN,
        &disc,
        &target.discovery_subsystem().listeners(),
        &whole,
        &mut adds,
        &mut removes,
    );

    for s in &plan.subsystems {
        let c = &s.config;
        let nqn = &c.nqn;
        let Some(sub) = target.subsystem(nqn) else {
            adds.push(step(
                "nvmf_create_subsystem",
                json!({
                    "nqn": nqn,
                    "serial_number": c.serial,
                    "model_number": c.model,
                    "allow_any_host": c.allow_any_host,
                    "max_namespaces": c.max_namespaces,
                    "min_cntlid": c.cntlid_range.0,
                    "max_cntlid": c.cntlid_range.1,
                }),
                &s.origin,
                Note::SubsystemAdded(nqn.clone()),
            ));
            for h in &c.hosts {
                adds.push(step(
                    "nvmf_subsystem_add_host",
                    json!({"nqn": nqn, "host": h}),
                    &s.origin,
                    Note::None,
                ));
            }
            listener_steps(
                nqn,
                &plan.listeners_of(s),
                &[],
                &whole,
                &mut adds,
                &mut removes,
            );
            for n in &s.namespaces {
                adds.push(step(
                    "nvmf_subsystem_add_ns",
                    json!({"nqn": nqn, "namespace": {"bdev_name": n.bdev, "nsid": n.nsid}}),
                    &n.origin,
                    Note::NsAdded(nqn.clone(), n.nsid),
                ));
            }
            continue;
        };
        // Hosts.
        if sub.allows_any_host() != c.allow_any_host {
            adds.push(step(
                "nvmf_subsystem_allow_any_host",
                json!({"nqn": nqn, "allow_any_host": c.allow_any_host}),
                &s.origin,
                Note::Host(format!("allow_any_host {} on {nqn}", c.allow_any_host)),
            ));
        }
        let had: BTreeSet<String> = sub.hosts().into_iter().collect();
        let want: BTreeSet<String> = c.hosts.iter().cloned().collect();
        for h in want.difference(&had) {
            adds.push(step(
                "nvmf_subsystem_add_host",
                json!({"nqn": nqn, "host": h}),
                &s.origin,
                Note::Host(format!("+{h} on {nqn}")),
            ));
        }
        for h in had.difference(&want) {
            removes.push(step(
                "nvmf_subsystem_remove_host",
                json!({"nqn": nqn, "host": h}),
                &s.origin,
                Note::Host(format!("-{h} on {nqn}")),
            ));
        }
        listener_steps(
            nqn,
            &plan.listeners_of(s),
            &sub.listeners(),
            &whole,
            &mut adds,
            &mut removes,
        );
        // Namespaces: removed or backed by another bdev now, then added.
        let want_ns: BTreeMap<u32, &str> = s
            .namespaces
            .iter()
            .map(|n| (n.nsid, n.bdev.as_str()))
            .collect();
        let mut freed = BTreeSet::new();
        for ns in sub.namespaces() {
            let keep = want_ns
                .get(&ns.nsid())
                .is_some_and(|b| *b == ns.bdev().info().name());
            if !keep {
                freed.insert(ns.nsid());
                removes.push(step(
                    "nvmf_subsystem_remove_ns",
                    json!({"nqn": nqn, "nsid": ns.nsid()}),
                    &s.origin,
                    Note::NsRemoved(nqn.clone(), ns.nsid()),
                ));
            }
        }
        for n in &s.namespaces {
            if sub.namespace(n.nsid).is_some() && !freed.contains(&n.nsid) {
                continue;
            }
            let st = step(
                "nvmf_subsystem_add_ns",
                json!({"nqn": nqn, "namespace": {"bdev_name": n.bdev, "nsid": n.nsid}}),
                &n.origin,
                Note::NsAdded(nqn.clone(), n.nsid),
            );
            // A replacement goes in once the old namespace is out.
            if freed.contains(&n.nsid) {
                removes.push(st);
            } else {
                adds.push(st);
            }
        }
    }
    // Subsystems gone from the file.
    for nqn in &running {
        if !plan.subsystems.iter().any(|s| &s.config.nqn == nqn) {
            removes.push(step(
                "nvmf_delete_subsystem",
                json!({"nqn": nqn}),
                &whole,
                Note::SubsystemRemoved(nqn.clone()),
            ));
        }
    }

    // Bdevs new in the file (before the namespaces that use them).
    let mut created = Vec::new();
    let wanted: BTreeSet<&str> = plan
        .subsystems
        .iter()
        .flat_map(|s| s.namespaces.iter().map(|n| n.bdev.as_str()))
        .collect();
    for b in &plan.bdevs {
        if built.registry.get(&b.name).is_none() && wanted.contains(b.name.as_str()) {
            if let Err(e) = built.registry.create_from(&b.spec) {
                undo_bdevs(built, &created);
                return Err(b
                    .origin
                    .err(format!("cannot create bdev '{}': {e}", b.name)));
            }
            created.push(b.name.clone());
        }
    }

    // The calls: additions (undone if a later call fails), then removals.
    let mut undo: Vec<ConfigEntry> = Vec::new();
    for st in adds.into_iter().chain(removes) {
        match svc.call(&st.call.method, st.call.params.clone()) {
            Ok(result) => {
                if let Some(u) = svc.undo_of(&st.call.method, st.call.params.as_ref(), &result) {
                    undo.push(u);
                }
                note(&mut rep, st.note);
            }
            Err(e) => {
                for u in undo.iter().rev() {
                    if let Err(ue) = svc.call(&u.method, u.params.clone()) {
                        log::warn!("reload: undoing with {} failed: {ue}", u.method);
                    }
                }
                undo_bdevs(built, &created);
                return Err(st.origin.err(format!("{}: {e}", st.call.method)));
            }
        }
    }
    rep.bdevs_created = created;
    Ok(rep)
}

/// The calls that make subsystem `nqn` listen on `want` when it listens
/// on `have`: additions for what is new, removals for what is gone (at
/// `whole`, the file: a removed listener has no line).
fn listener_steps(
    nqn: &str,
    want: &[&ListenerPlan],
    have: &[TransportId],
    whole: &Origin,
    adds: &mut Vec<Step>,
    removes: &mut Vec<Step>,
) {
    for l in want.iter().filter(|l| !have.contains(&l.trid)) {
        adds.push(step(
            "nvmf_subsystem_add_listener",
            json!({"nqn": nqn, "listen_address": describe_trid(&l.trid)}),
            &l.origin,
            Note::None,
        ));
    }
    for t in have.iter().filter(|t| !want.iter().any(|l| &l.trid == *t)) {
        removes.push(step(
            "nvmf_subsystem_remove_listener",
            json!({"nqn": nqn, "listen_address": describe_trid(t)}),
            whole,
            Note::None,
        ));
    }
}

fn note(rep: &mut ReloadReport, n: Note) {
    match n {
        Note::None => {}
        Note::NsAdded(nqn, id) => rep.added.push((nqn, id)),
        Note::NsRemoved(nqn, id) => rep.removed.push((nqn, id)),
        Note::SubsystemAdded(nqn) => rep.subsystems_added.push(nqn),
        Note::SubsystemRemoved(nqn) => rep.subsystems_removed.push(nqn),
        Note::Host(h) => rep.hosts_changed.push(h),
    }
}

fn undo_bdevs<P: Provider>(built: &Built<P>, names: &[String]) {
    for n in names.iter().rev() {
        if let Err(e) = built.registry.destroy(n) {
            log::warn!("reload: removing bdev {n} again: {e}");
        }
    }
}
