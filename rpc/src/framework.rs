//! The framework's own methods (SPDK's names, parameters and result shapes):
//! `spdk_get_version`, `rpc_get_methods`, `framework_start_init`,
//! `framework_wait_init`, `framework_get_reactors`,
//! `framework_get_subsystems`, `framework_get_config`, `save_config`,
//! `load_config`.
//!
//! `spdk-rpc save_config` and `spdk-rpc load_config` do their work in the
//! client, with `framework_get_subsystems`, `framework_get_config`,
//! `rpc_get_methods` and one call per entry; `save_config` and
//! `load_config` here do the same on the server, in one request (what
//! `pollux-rpc` uses), and `load_config` loads all or nothing.

use serde::Deserialize;
use serde_json::{json, Value};

use crate::config::{self, JsonConfig};
use crate::error::{RpcError, INVALID_STATE};
use crate::service::{decode, encode, Method, RpcService, RpcState, StateMask};

/// No parameters (an empty object, null or none).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NoParams {}

/// `rpc_get_methods` parameters.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetMethods {
    /// Only the methods callable in the current state.
    #[serde(default)]
    pub current: bool,
    /// Include deprecated aliases (Pollux has none).
    #[serde(default)]
    pub include_aliases: bool,
}

/// `framework_get_config` parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetConfig {
    /// The subsystem.
    pub name: String,
    /// Keep SPDK's batch arrays (Pollux writes none).
    #[serde(default)]
    pub with_batches: bool,
}

/// The framework's methods.
pub(crate) fn methods() -> Vec<Method> {
    vec![
        Method::new("spdk_get_version", StateMask::ANY, |_, p| {
            decode::<NoParams>(p)?;
            Ok(version())
        }),
        Method::new("rpc_get_methods", StateMask::ANY, |svc, p| {
            let req: GetMethods = decode(p)?;
            encode(&svc.method_names(req.current))
        }),
        Method::new("framework_start_init", StateMask::STARTUP, |svc, p| {
            decode::<NoParams>(p)?;
            svc.set_state(RpcState::Runtime);
            Ok(Value::Bool(true))
        }),
        Method::new("framework_wait_init", StateMask::ANY, |svc, p| {
            decode::<NoParams>(p)?;
            match svc.state() {
                RpcState::Runtime => Ok(Value::Bool(true)),
                RpcState::Startup => Err(RpcError::new(
                    INVALID_STATE,
                    "the framework waits for framework_start_init",
                )),
            }
        }),
        Method::runtime("framework_get_reactors", |svc, p| {
            decode::<NoParams>(p)?;
            reactors(svc)
        }),
        Method::new("framework_get_subsystems", StateMask::ANY, |svc, p| {
            decode::<NoParams>(p)?;
            Ok(Value::Array(
                svc.subsystems()
                    .iter()
                    .map(|s| json!({"subsystem": s.name(), "depends_on": s.depends_on()}))
                    .collect(),
            ))
        }),
        Method::runtime("framework_get_config", |svc, p| {
            let req: GetConfig = decode(p)?;
            let sub = svc.subsystem(&req.name).ok_or_else(|| {
                RpcError::invalid_params(format!("Subsystem '{}' not found", req.name))
            })?;
            encode(&sub.config(svc)?)
        }),
        Method::runtime("save_config", |svc, p| {
            decode::<NoParams>(p)?;
            encode(&config::save(svc)?)
        }),
        Method::runtime("load_config", |svc, p| {
            let cfg: JsonConfig = decode(p)?;
            cfg.apply(svc).map_err(|e| e.to_rpc())?;
            Ok(Value::Bool(true))
        }),
    ]
}

/// `spdk_get_version`: Pollux's version in SPDK's shape.
fn version() -> Value {
    let v = env!("CARGO_PKG_VERSION");
    let mut parts = v.splitn(3, '.');
    let mut num = || -> u64 {
        parts
            .next()
            .and_then(|p| p.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|p| p.parse().ok())
            .unwrap_or(0)
    };
    let (major, minor, patch) = (num(), num(), num());
    let suffix = v.find('-').map(|i| &v[i..]).unwrap_or("");
    json!({
        "version": format!("Pollux v{v}"),
        "fields": {"major": major, "minor": minor, "patch": patch, "suffix": suffix},
    })
}

/// What one core reports for `framework_get_reactors`.
struct CoreReport {
    stats: pollux_reactor::ReactorStats,
    tid: i32,
    in_interrupt: bool,
}

/// `framework_get_reactors`: one entry per reactor, from the reactor
/// itself. Times are in nanoseconds (`tick_rate` 1e9); each reactor is
/// one thread, listed as its one `lw_thread`; `usr`, `sys` and `irq` are
/// the core's counters from `/proc/stat` (clock ticks).
fn reactors(svc: &RpcService) -> Result<Value, RpcError> {
    let answers = svc.cores().on_each_core(|r| CoreReport {
        stats: r.stats(),
        tid: rustix::thread::gettid().as_raw_nonzero().get(),
        in_interrupt: r.idle_mode().sleeps(),
    })?;
    let proc_stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let list: Vec<Value> = answers
        .into_iter()
        .map(|(core, c)| {
            let (usr, sys, irq) = cpu_times(&proc_stat, core).unwrap_or((0, 0, 0));
            json!({
                "lcore": core,
                "tid": c.tid,
                "busy": c.stats.busy_ns,
                "idle": c.stats.idle_ns,
                "in_interrupt": c.in_interrupt,
                "irq": irq,
                "sys": sys,
                "usr": usr,
                "lw_threads": [{
                    "name": format!("reactor_{core}"),
                    "id": u64::from(core) + 1,
                    "cpumask": format!("{:x}", 1u128 << (core % 128)),
                    "elapsed": c.stats.busy_ns.saturating_add(c.stats.idle_ns),
                }],
            })
        })
        .collect();
    Ok(json!({
        "tick_rate": 1_000_000_000u64,
        "pid": std::process::id(),
        "reactors": list,
    }))
}

/// `(user, system, irq)` clock ticks of `cpuN` in `/proc/stat` text.
fn cpu_times(proc_stat: &str, core: u32) -> Option<(u64, u64, u64)> {
    let tag = format!("cpu{core}");
    let line = proc_stat
        .lines()
        .find(|l| l.split_whitespace().next() == Some(tag.as_str()))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    Some((*f.first()?, *f.get(2)?, *f.get(5)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_has_spdks_shape() {
        let v = version();
        assert!(v["version"].as_str().unwrap_or("").starts_with("Pollux v"));
        for k in ["major", "minor", "patch"] {
            assert!(v["fields"][k].is_u64(), "{k}");
        }
        assert!(v["fields"]["suffix"].is_string());
    }

    #[test]
    fn proc_stat_lines_are_read() {
        let text = "cpu  1 2 3 4 5 6 7\ncpu0 10 0 20 99 0 30 0\ncpu1 11 0 21 99 0 31 0\n";
        assert_eq!(cpu_times(text, 1), Some((11, 21, 31)));
        assert_eq!(cpu_times(text, 2), None);
    }

    #[test]
    fn method_names_are_distinct() {
        let names: Vec<&str> = methods().iter().map(|m| m.name()).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len());
    }
}
