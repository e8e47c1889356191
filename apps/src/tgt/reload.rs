//! Configuration reload (SIGHUP in `pollux-tgt`): re-read the TOML file
//! and apply its namespace changes to the running target, without
//! disconnecting any host.
//!
//! What a reload applies: bdevs that are new in the file are created;
//! in every subsystem that already runs, namespaces that are new in the
//! file are added, namespaces gone from it are removed, and a namespace
//! whose bdev changed is replaced. Each change raises a Namespace Attribute
//! Changed event on the subsystem's controllers (an outstanding AER
//! completes; the changed-namespace log page lists the NSIDs), so hosts
//! see it without reconnecting. Everything else (subsystems added or
//! removed, hosts, listeners, transport options, cores, iSCSI) needs a
//! restart: a reload reports those differences and leaves them alone.
//! A file that does not parse or check leaves the target as it was.

use std::collections::BTreeMap;
use std::path::Path;

use pollux_nvmf::target::NamespaceConfig;
use pollux_verbs::Provider;

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
            "{} namespace(s) added, {} removed, {} bdev(s) created",
            self.added.len(),
            self.removed.len(),
            self.bdevs_created.len()
        )?;
        if !self.added.is_empty() {
            write!(f, "; added: {}", list(&self.added))?;
        }
        if !self.removed.is_empty() {
            write!(f, "; removed: {}", list(&self.removed))?;
        }
        for i in &self.ignored {
            write!(f, "; not applied (restart needed): {i}")?;
        }
        Ok(())
    }
}

/// Re-read `path` and apply its namespace changes to `built` (see the
/// module docs).
///
/// # Errors
/// [`AppError::Config`] (the file does not load, a new bdev cannot be
/// created, a namespace is refused) naming the line and field; changes
/// made before the failing one stay.
pub fn reload<P: Provider>(path: &Path, built: &Built<P>) -> Result<ReloadReport, AppError> {
    let plan = TgtPlan::load(path)?;
    apply(&plan, built)
}

/// Apply `plan`'s namespace changes to `built`.
///
/// # Errors
/// As [`reload`].
pub fn apply<P: Provider>(plan: &TgtPlan, built: &Built<P>) -> Result<ReloadReport, AppError> {
    let mut rep = ReloadReport::default();
    let target = &built.target;
    let running: Vec<String> = target
        .subsystems()
        .iter()
        .map(|s| s.nqn().to_string())
        .collect();
    for nqn in &running {
        if !plan.subsystems.iter().any(|s| &s.config.nqn == nqn) {
            rep.ignored
                .push(format!("subsystem {nqn} removed from the file"));
        }
    }
    for s in &plan.subsystems {
        let nqn = &s.config.nqn;
        let Some(sub) = target.subsystem(nqn) else {
            rep.ignored.push(format!("new subsystem {nqn}"));
            continue;
        };
        let want: BTreeMap<u32, &str> = s
            .namespaces
            .iter()
            .map(|n| (n.nsid, n.bdev.as_str()))
            .collect();
        // Removed, or backed by another bdev now.
        for ns in sub.namespaces() {
            let keep = want
                .get(&ns.nsid())
                .is_some_and(|b| *b == ns.bdev().info().name());
            if !keep {
                sub.remove_namespace(ns.nsid()).map_err(|e| {
                    s.origin
                        .err(format!("removing namespace {}: {e}", ns.nsid()))
                })?;
                rep.removed.push((nqn.clone(), ns.nsid()));
            }
        }
        for n in &s.namespaces {
            if sub.namespace(n.nsid).is_some() {
                continue;
            }
            let bdev = match built.registry.get(&n.bdev) {
                Some(b) => b,
                None => {
                    let b = plan
                        .bdevs
                        .iter()
                        .find(|b| b.name == n.bdev)
                        .ok_or_else(|| n.origin.err(format!("no bdev named '{}'", n.bdev)))?;
                    let made = built.registry.create_from(&b.spec).map_err(|e| {
                        b.origin
                            .err(format!("cannot create bdev '{}': {e}", b.name))
                    })?;
                    rep.bdevs_created.push(b.name.clone());
                    made
                }
            };
            sub.add_namespace(NamespaceConfig::new(bdev).with_nsid(n.nsid))
                .map_err(|e| n.origin.err(e))?;
            rep.added.push((nqn.clone(), n.nsid));
        }
    }
    let had: Vec<String> = target
        .listeners()
        .iter()
        .map(|l| super::cm_addr(&l.trid).to_string())
        .collect();
    let now: Vec<String> = plan
        .listeners
        .iter()
        .map(|l| super::cm_addr(&l.trid).to_string())
        .collect();
    if had.len() != now.len() || now.iter().any(|a| !had.contains(a)) {
        rep.ignored.push("listeners changed".into());
    }
    Ok(rep)
}
