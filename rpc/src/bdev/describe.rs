//! The bdev methods' result shapes: `bdev_get_bdevs` entries,
//! `bdev_get_iostat` figures and the create calls of the configuration.

use std::sync::Arc;

use pollux_bdev::{AioEngineKind, BackendSpec, Bdev, BdevSpec, ChannelStats, IoType, PiType};
use pollux_reactor::CoreId;
use serde_json::{json, Map, Value};

use crate::config::ConfigEntry;
use crate::uuid::Uuid;

/// SPDK's I/O type names, in its order; Pollux's backends handle the
/// first five kinds at most.
const IO_TYPES: [&str; 20] = [
    "read",
    "write",
    "unmap",
    "flush",
    "reset",
    "nvme_admin",
    "nvme_io",
    "nvme_io_md",
    "write_zeroes",
    "zcopy",
    "get_zone_info",
    "zone_management",
    "zone_append",
    "compare",
    "compare_and_write",
    "abort",
    "seek_hole",
    "seek_data",
    "copy",
    "nvme_iov_md",
];

fn io_type(name: &str) -> Option<IoType> {
    match name {
        "read" => Some(IoType::Read),
        "write" => Some(IoType::Write),
        "unmap" => Some(IoType::Unmap),
        "flush" => Some(IoType::Flush),
        "write_zeroes" => Some(IoType::WriteZeroes),
        _ => None,
    }
}

/// One `bdev_get_bdevs` entry, in SPDK's shape. `block_size` is the
/// block as a host sees it (data plus interleaved metadata), as SPDK
/// reports it; `claimed` means open by a user (a namespace, LUN or job),
/// which Pollux lets share a bdev (`read_many_write_shared`).
pub(super) fn bdev_json(b: &Arc<Bdev>, spec: Option<&BdevSpec>, uuid: Uuid) -> Value {
    let info = b.info();
    // SPDK registers the UUID as an alias (unless it is the name).
    let uuid_text = uuid.to_string();
    let aliases: Vec<&str> = if uuid_text == b.name() {
        Vec::new()
    } else {
        vec![uuid_text.as_str()]
    };
    let mut v = json!({
        "name": b.name(),
        "aliases": aliases,
        "product_name": info.product(),
        "block_size": info.buf_block_size(),
        "num_blocks": info.num_blocks(),
        "uuid": uuid.to_string(),
        "assigned_rate_limits": {
            "rw_ios_per_sec": 0,
            "rw_mbytes_per_sec": 0,
            "r_mbytes_per_sec": 0,
            "w_mbytes_per_sec": 0
        },
        "claimed": b.open_count() > 0,
        "zoned": false,
    });
    if info.md_size() != 0 {
        v["md_size"] = json!(info.md_size());
        v["md_interleave"] = json!(info.md_interleave());
        v["dif_type"] = json!(info.pi_type().number());
        if info.pi_type() != PiType::None {
            v["dif_is_head_of_md"] = json!(info.md_size() == 8);
            v["enabled_dif_check_types"] = json!({
                "reftag": info.pi_type() != PiType::Type3,
                "apptag": false,
                "guard": true
            });
            v["dif_pi_format"] = json!(0);
        }
    }
    if b.open_count() > 0 {
        v["claim_type"] = json!("read_many_write_shared");
    }
    let mut io = Map::new();
    for name in IO_TYPES {
        io.insert(
            name.into(),
            Value::Bool(io_type(name).is_some_and(|t| b.supports(t))),
        );
    }
    v["supported_io_types"] = Value::Object(io);
    v["driver_specific"] = match spec.map(|s| &s.backend) {
        Some(BackendSpec::Aio { path, .. }) => json!({"aio": {
            "filename": path.display().to_string(),
            "block_size_override": spec.is_some_and(|s| s.block_size.is_some()),
            "readonly": false,
            "fallocate": false,
            "nowait": false,
        }}),
        _ => json!({}),
    };
    v
}

/// The parameters malloc and null creates share.
fn geometry(b: &Arc<Bdev>, uuid: Uuid) -> Value {
    let info = b.info();
    json!({
        "name": b.name(),
        "num_blocks": info.num_blocks(),
        "block_size": info.block_size(),
        "uuid": uuid.to_string(),
        "md_size": info.md_size(),
        "dif_type": info.pi_type().number(),
    })
}

/// The create call that makes `b` again (`None` for a backend without one).
pub(super) fn create_entry(b: &Arc<Bdev>, spec: &BdevSpec, uuid: Uuid) -> Option<ConfigEntry> {
    let info = b.info();
    let depth = spec.queue_depth;
    match &spec.backend {
        BackendSpec::Malloc => {
            let mut p = geometry(b, uuid);
            p["md_interleave"] = json!(info.md_interleave());
            if let Some(d) = depth {
                p["queue_depth"] = json!(d);
            }
            Some(ConfigEntry::new("bdev_malloc_create", p))
        }
        BackendSpec::Null { latency_us } => {
            let mut p = geometry(b, uuid);
            if info.md_size() != 0 && !info.md_interleave() {
                p["md_interleave"] = json!(false);
            }
            if *latency_us != 0 {
                p["latency_us"] = json!(latency_us);
            }
            if let Some(d) = depth {
                p["queue_depth"] = json!(d);
            }
            Some(ConfigEntry::new("bdev_null_create", p))
        }
        BackendSpec::Aio {
            path,
            engine,
            direct,
        } => {
            let mut p = json!({
                "name": b.name(),
                "filename": path.display().to_string(),
                "readonly": false,
                "fallocate": false,
                "uuid": uuid.to_string(),
            });
            if spec.block_size.is_some() {
                p["block_size"] = json!(info.block_size());
            }
            if !direct {
                p["direct"] = json!(false);
            }
            let engine = match engine {
                AioEngineKind::Auto => None,
                AioEngineKind::Uring => Some("uring"),
                AioEngineKind::LinuxAio => Some("aio"),
            };
            if let Some(e) = engine {
                p["engine"] = json!(e);
            }
            if let Some(d) = depth {
                p["queue_depth"] = json!(d);
            }
            Some(ConfigEntry::new("bdev_aio_create", p))
        }
        _ => None,
    }
}

/// SPDK's counter names for one set of channel counters.
fn counters(s: &ChannelStats) -> Map<String, Value> {
    let mut m = Map::new();
    for (k, v) in [
        ("bytes_read", s.bytes_read),
        ("num_read_ops", s.read_ops),
        ("bytes_written", s.bytes_written),
        ("num_write_ops", s.write_ops),
        ("num_unmap_ops", s.unmap_ops),
        ("num_write_zeroes_ops", s.write_zeroes_ops),
        ("num_flush_ops", s.flush_ops),
        ("num_io_errors", s.errors),
        ("num_rejected", s.rejected),
    ] {
        m.insert(k.into(), Value::from(v));
    }
    m
}

/// `bdev_get_iostat`'s result: per bdev, the sum over the cores that have
/// a channel for it; with `per_channel`, one entry per such core
/// (`thread_id` is the core). Times are nanoseconds (`tick_rate` 1e9).
pub(super) fn iostat_json(
    bdevs: &[Arc<Bdev>],
    per_core: &[(CoreId, Vec<Option<ChannelStats>>)],
    per_channel: bool,
) -> Value {
    let ticks = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut out = json!({"tick_rate": 1_000_000_000u64, "ticks": ticks});
    if per_channel {
        let Some(b) = bdevs.first() else {
            return out;
        };
        out["name"] = json!(b.name());
        let chans: Vec<Value> = per_core
            .iter()
            .filter_map(|(core, list)| {
                let s = list.first().copied().flatten()?;
                let mut m = counters(&s);
                m.insert("thread_id".into(), json!(core));
                Some(Value::Object(m))
            })
            .collect();
        out["channels"] = Value::Array(chans);
        return out;
    }
    let list: Vec<Value> = bdevs
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let mut total = ChannelStats::default();
            for (_, l) in per_core {
                if let Some(Some(s)) = l.get(i) {
                    total.add(s);
                }
            }
            let mut m = counters(&total);
            m.insert("name".into(), json!(b.name()));
            Value::Object(m)
        })
        .collect();
    out["bdevs"] = Value::Array(list);
    out
}
