//! The target-wide options an SPDK JSON configuration asks for.
//!
//! SPDK sizes its data buffers per transport (`nvmf_create_transport`'s
//! `max_io_size`, `io_unit_size`, `in_capsule_data_size`,
//! `num_shared_buffers`, `buf_cache_size`, `max_queue_depth`); Pollux's
//! target owns one pool for every transport and is made before a `--json`
//! file is applied. So that a file SPDK's `nvmf_tgt` saved starts the
//! target as SPDK ran it, [`size_from_json`] takes those values from the
//! file's first `nvmf_create_transport` for every option the TOML file
//! does not set (the TOML file wins; a value that then differs is refused
//! by `nvmf_create_transport`, naming the option). `buf_cache_size`
//! `4294967295` is SPDK's "size it automatically": the target keeps its
//! own.

use pollux_rpc::nvmf::params::BUF_CACHE_AUTO;
use pollux_rpc::JsonConfig;
use serde_json::Value;

use super::config::TgtPlan;

/// Sets `plan`'s target options that its file left unset from `cfg`'s
/// first `nvmf_create_transport`; returns the names of those it set.
pub fn size_from_json(plan: &mut TgtPlan, cfg: &JsonConfig) -> Vec<&'static str> {
    let Some(p) = cfg
        .entries()
        .find(|(_, _, e)| e.method == "nvmf_create_transport")
        .and_then(|(_, _, e)| e.params.as_ref())
    else {
        return Vec::new();
    };
    let given = |key: &str| {
        p.get(key)
            .and_then(Value::as_u64)
            .and_then(|v| u32::try_from(v).ok())
    };
    let in_toml: Vec<&str> = plan.option_origins.iter().map(|(k, _)| *k).collect();
    let t = &mut plan.target;
    let mut set = Vec::new();
    for key in [
        "max_queue_depth",
        "max_io_size",
        "io_unit_size",
        "in_capsule_data_size",
        "num_shared_buffers",
        "buf_cache_size",
    ] {
        let Some(v) = given(key).filter(|_| !in_toml.contains(&key)) else {
            continue;
        };
        let n = v as usize;
        match key {
            "max_queue_depth" => match u16::try_from(v) {
                Ok(d) => t.max_queue_depth = d,
                Err(_) => continue,
            },
            "max_io_size" => t.max_io_size = v,
            "io_unit_size" => t.io_unit_size = v,
            "in_capsule_data_size" => t.in_capsule_data_size = v,
            "num_shared_buffers" => t.num_data_buffers = n,
            _ if v == BUF_CACHE_AUTO => continue,
            _ => t.buffer_cache_size = n,
        }
        set.push(key);
    }
    set
}
