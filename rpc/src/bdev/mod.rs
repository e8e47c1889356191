//! The `bdev` subsystem: `bdev_malloc_create|delete`,
//! `bdev_null_create|delete`, `bdev_aio_create|delete`, `bdev_get_bdevs`,
//! `bdev_get_iostat`, over a [`BdevRegistry`].
//!
//! Creating a bdev is one registry call: it exists whole or not at all
//! (a refused request leaves nothing). A bdev in use (a namespace, LUN or
//! job holds it open) is not deleted: the request is refused with -16
//! (`Device or resource busy`) naming the bdev. `bdev_get_iostat` asks
//! every core for its channel's counters by a reactor message and
//! answers once all have. The configuration (`framework_get_config bdev`)
//! lists one create call per bdev, with the UUID it shows, so a saved
//! configuration brings back the same `bdev_get_bdevs`.

mod describe;
pub mod params;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use pollux_bdev::{AioEngineKind, BackendSpec, Bdev, BdevError, BdevRegistry, BdevSpec, PiType};
use pollux_reactor::sync::Mutex;
use serde_json::{json, Value};

use self::params::{AioCreate, Delete, GetBdevs, GetIostat, MallocCreate, NullCreate};
use crate::config::ConfigEntry;
use crate::error::{Errno, RpcError};
use crate::service::{decode, Method, RpcService, Subsystem};
use crate::uuid::Uuid;

/// The longest `bdev_get_bdevs` waits for a bdev to appear (the server
/// answers one request at a time, so a wait holds the other clients).
pub const MAX_WAIT_MS: u64 = 10_000;

/// The `bdev` subsystem over one registry.
pub struct BdevSubsystem {
    registry: Arc<BdevRegistry>,
    /// UUIDs by bdev name; an entry counts only while it names the same
    /// bdev object (a bdev deleted and made again elsewhere gets a new one).
    uuids: Mutex<BTreeMap<String, (Weak<Bdev>, Uuid)>>,
}

impl std::fmt::Debug for BdevSubsystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BdevSubsystem").finish_non_exhaustive()
    }
}

/// Which backend a create or delete method is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Malloc,
    Null,
    Aio,
}

impl Kind {
    fn of(spec: &BackendSpec) -> Option<Kind> {
        match spec {
            BackendSpec::Malloc => Some(Kind::Malloc),
            BackendSpec::Null { .. } => Some(Kind::Null),
            BackendSpec::Aio { .. } => Some(Kind::Aio),
            _ => None,
        }
    }

    fn word(self) -> &'static str {
        match self {
            Kind::Malloc => "malloc",
            Kind::Null => "null",
            Kind::Aio => "aio",
        }
    }
}

impl BdevSubsystem {
    /// The subsystem over `registry` (the one the target's namespaces and
    /// LUNs take their bdevs from).
    pub fn new(registry: Arc<BdevRegistry>) -> Arc<Self> {
        Arc::new(Self {
            registry,
            uuids: Mutex::new(BTreeMap::new()),
        })
    }

    /// The registry.
    pub fn registry(&self) -> &Arc<BdevRegistry> {
        &self.registry
    }

    /// The UUID of `bdev`: the one it was given, else a new random one,
    /// kept from then on.
    ///
    /// # Errors
    ///
    /// -5 when no random bytes can be read.
    pub fn uuid_of(&self, bdev: &Arc<Bdev>) -> Result<Uuid, RpcError> {
        let mut map = self.uuids.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((w, u)) = map.get(bdev.name()) {
            if w.upgrade().is_some_and(|b| Arc::ptr_eq(&b, bdev)) {
                return Ok(*u);
            }
        }
        let u =
            Uuid::random().map_err(|e| RpcError::errno(Errno::Io, format!("random UUID: {e}")))?;
        map.insert(bdev.name().to_owned(), (Arc::downgrade(bdev), u));
        Ok(u)
    }

    fn set_uuid(&self, bdev: &Arc<Bdev>, u: Uuid) {
        let mut map = self.uuids.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, (w, _)| w.strong_count() > 0);
        map.insert(bdev.name().to_owned(), (Arc::downgrade(bdev), u));
    }

    /// The bdev that has UUID `u`, if any.
    fn holder_of(&self, u: Uuid) -> Option<String> {
        let map = self.uuids.lock().unwrap_or_else(|p| p.into_inner());
        map.iter()
            .filter(|(_, (_, v))| *v == u)
            .find(|(name, (w, _))| {
                w.upgrade()
                    .zip(self.registry.get(name))
                    .is_some_and(|(a, b)| Arc::ptr_eq(&a, &b))
            })
            .map(|(name, _)| name.clone())
    }

    /// The bdev whose UUID (its alias, as SPDK's) is `text`.
    fn by_uuid(&self, text: &str) -> Option<Arc<Bdev>> {
        let name = self.holder_of(Uuid::parse(text).ok()?)?;
        self.registry.get(&name)
    }

    /// Makes the bdev of `spec` with `uuid` (all or nothing). A null UUID
    /// is none (a random one is made, as SPDK does); one another bdev has
    /// is refused with -17, as SPDK, which registers it as a bdev name.
    fn create(&self, spec: BdevSpec, uuid: Option<&str>) -> Result<Value, RpcError> {
        let uuid = uuid
            .map(|u| {
                Uuid::parse(u).map_err(|e| RpcError::errno(Errno::Invalid, format!("uuid: {e}")))
            })
            .transpose()?
            .filter(|u| *u != Uuid::from_bytes([0; 16]));
        if let Some(u) = uuid {
            if let Some(other) = self.holder_of(u) {
                return Err(RpcError::errno(
                    Errno::Exists,
                    format!("uuid {u}: bdev `{other}` has it already"),
                ));
            }
        }
        let bdev = self.registry.create_from(&spec).map_err(spec_error)?;
        if let Some(u) = uuid {
            self.set_uuid(&bdev, u);
        }
        Ok(Value::String(bdev.name().to_owned()))
    }

    fn delete(&self, kind: Kind, p: Option<Value>) -> Result<Value, RpcError> {
        let req: Delete = decode(p)?;
        let spec = self.registry.spec(&req.name).ok_or_else(|| {
            RpcError::errno(Errno::NoDevice, format!("no bdev named `{}`", req.name))
        })?;
        if Kind::of(&spec.backend) != Some(kind) {
            return Err(RpcError::errno(
                Errno::NoDevice,
                format!(
                    "bdev `{}` is a {} bdev, not {}",
                    req.name,
                    spec.backend.type_name(),
                    kind.word()
                ),
            ));
        }
        self.registry.destroy(&req.name)?;
        Ok(Value::Bool(true))
    }

    fn malloc_create(&self, p: Option<Value>) -> Result<Value, RpcError> {
        let req: MallocCreate = decode(p)?;
        unsupported_if(
            "optimal_io_boundary",
            req.optimal_io_boundary.is_some_and(|v| v != 0),
        )?;
        unsupported_if("numa_id", req.numa_id.is_some_and(|v| v != -1))?;
        let name = match req.name {
            Some(n) => n,
            None => (0u64..)
                .map(|i| format!("Malloc{i}"))
                .find(|n| self.registry.get(n).is_none())
                .unwrap_or_else(|| "Malloc".into()),
        };
        let mut spec = BdevSpec::new(BackendSpec::Malloc);
        Geometry {
            name,
            block_size: req.block_size,
            num_blocks: req.num_blocks,
            md_size: req.md_size.unwrap_or(0),
            md_interleave: req.md_interleave.unwrap_or(false),
            dif_type: req.dif_type,
            dif_pi_format: req.dif_pi_format,
            dif_is_head_of_md: req.dif_is_head_of_md,
            physical_block_size: req.physical_block_size,
            queue_depth: req.queue_depth,
        }
        .fill(&mut spec)?;
        self.create(spec, req.uuid.as_deref())
    }

    fn null_create(&self, p: Option<Value>) -> Result<Value, RpcError> {
        let req: NullCreate = decode(p)?;
        for (key, v) in [
            (
                "preferred_write_granularity",
                req.preferred_write_granularity,
            ),
            ("preferred_write_alignment", req.preferred_write_alignment),
            ("optimal_write_size", req.optimal_write_size),
            (
                "preferred_unmap_granularity",
                req.preferred_unmap_granularity,
            ),
            ("preferred_unmap_alignment", req.preferred_unmap_alignment),
        ] {
            unsupported_if(key, v.is_some_and(|v| v != 0))?;
        }
        let mut spec = BdevSpec::new(BackendSpec::Null {
            latency_us: req.latency_us.unwrap_or(0),
        });
        let md_size = req.md_size.unwrap_or(0);
        Geometry {
            name: req.name,
            block_size: req.block_size,
            num_blocks: req.num_blocks,
            md_size,
            // SPDK's null bdev interleaves its metadata.
            md_interleave: md_size > 0 && req.md_interleave.unwrap_or(true),
            dif_type: req.dif_type,
            dif_pi_format: req.dif_pi_format,
            dif_is_head_of_md: req.dif_is_head_of_md,
            physical_block_size: req.physical_block_size,
            queue_depth: req.queue_depth,
        }
        .fill(&mut spec)?;
        self.create(spec, req.uuid.as_deref())
    }

    fn aio_create(&self, p: Option<Value>) -> Result<Value, RpcError> {
        let req: AioCreate = decode(p)?;
        unsupported_if("readonly", req.readonly == Some(true))?;
        unsupported_if("fallocate", req.fallocate == Some(true))?;
        unsupported_if("nowait", req.nowait == Some(true))?;
        check_name(&req.name)?;
        if req.filename.is_empty() {
            return Err(RpcError::errno(Errno::Invalid, "filename: empty"));
        }
        let engine: AioEngineKind = match &req.engine {
            Some(e) => e.parse().map_err(|e: pollux_bdev::OptionValueError| {
                RpcError::errno(Errno::Invalid, format!("engine: {e}"))
            })?,
            None => AioEngineKind::Auto,
        };
        let make = |direct: bool| {
            let mut spec = BdevSpec::new(BackendSpec::Aio {
                path: PathBuf::from(&req.filename),
                engine,
                direct,
            });
            spec.name = Some(req.name.clone());
            spec.block_size = req.block_size;
            spec.queue_depth = req.queue_depth.map(|d| d as usize);
            spec
        };
        match self.create(make(req.direct.unwrap_or(true)), req.uuid.as_deref()) {
            Err(e)
                if req.direct.is_none()
                    && e.code == -Errno::Invalid.number()
                    && e.data.as_deref().is_some_and(|d| d.contains("O_DIRECT")) =>
            {
                log::info!(
                    "bdev_aio_create {}: {} refuses O_DIRECT; using the page cache",
                    req.name,
                    req.filename
                );
                self.create(make(false), req.uuid.as_deref())
            }
            other => other,
        }
    }

    fn get_bdevs(&self, p: Option<Value>) -> Result<Value, RpcError> {
        let req: GetBdevs = decode(p)?;
        let Some(name) = req.name else {
            let list = self
                .registry
                .list()
                .iter()
                .map(|b| self.describe(b))
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(Value::Array(list));
        };
        let wait = Duration::from_millis(req.timeout.unwrap_or(0).min(MAX_WAIT_MS));
        let deadline = Instant::now() + wait;
        loop {
            if let Some(b) = self.registry.get(&name).or_else(|| self.by_uuid(&name)) {
                return Ok(Value::Array(vec![self.describe(&b)?]));
            }
            if Instant::now() >= deadline {
                return Err(RpcError::errno(
                    Errno::NoDevice,
                    format!("no bdev named `{name}`"),
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn describe(&self, b: &Arc<Bdev>) -> Result<Value, RpcError> {
        let spec = self.registry.spec(b.name());
        Ok(describe::bdev_json(b, spec.as_ref(), self.uuid_of(b)?))
    }

    fn get_iostat(&self, svc: &RpcService, p: Option<Value>) -> Result<Value, RpcError> {
        let req: GetIostat = decode(p)?;
        match req.reset_mode.as_deref() {
            None | Some("none") => {}
            Some(other) => {
                return Err(RpcError::errno(
                    Errno::NotSupported,
                    format!("reset_mode `{other}`: only `none` is supported"),
                ))
            }
        }
        let mut names: Vec<String> = req.names.unwrap_or_default();
        names.extend(req.name);
        let bdevs: Vec<Arc<Bdev>> = if names.is_empty() {
            self.registry.list()
        } else {
            names
                .iter()
                .map(|n| {
                    self.registry.get(n).ok_or_else(|| {
                        RpcError::errno(Errno::NoDevice, format!("no bdev named `{n}`"))
                    })
                })
                .collect::<Result<_, _>>()?
        };
        let per_channel = req.per_channel.unwrap_or(false);
        if per_channel && bdevs.len() != 1 {
            return Err(RpcError::errno(
                Errno::Invalid,
                "per_channel needs exactly one bdev (name)",
            ));
        }
        let targets = bdevs.clone();
        let per_core = svc.cores().on_each_core(move |r| {
            targets
                .iter()
                .map(|b| r.existing_channel(b).map(|ch| ch.stats()))
                .collect::<Vec<_>>()
        })?;
        Ok(describe::iostat_json(&bdevs, &per_core, per_channel))
    }

    fn config_entries(&self) -> Result<Vec<ConfigEntry>, RpcError> {
        let mut out = Vec::new();
        for b in self.registry.list() {
            let Some(spec) = self.registry.spec(b.name()) else {
                log::warn!(
                    "save_config: bdev {} was not made by a create method; left out",
                    b.name()
                );
                continue;
            };
            if let Some(e) = describe::create_entry(&b, &spec, self.uuid_of(&b)?) {
                out.push(e);
            }
        }
        Ok(out)
    }
}

/// -95 naming `key` when `refused`.
fn unsupported_if(key: &str, refused: bool) -> Result<(), RpcError> {
    if refused {
        return Err(RpcError::errno(
            Errno::NotSupported,
            format!("{key}: this value is not supported by Pollux"),
        ));
    }
    Ok(())
}

/// -22 unless `name` is non-empty, without whitespace or control characters.
fn check_name(name: &str) -> Result<(), RpcError> {
    if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(RpcError::errno(
            Errno::Invalid,
            format!("name: {name:?} must be non-empty, without spaces or control characters"),
        ));
    }
    Ok(())
}

/// The geometry parameters malloc and null bdevs share.
struct Geometry {
    name: String,
    block_size: u32,
    num_blocks: u64,
    md_size: u32,
    md_interleave: bool,
    dif_type: Option<i32>,
    dif_pi_format: Option<u32>,
    dif_is_head_of_md: Option<bool>,
    physical_block_size: Option<u32>,
    queue_depth: Option<u32>,
}

impl Geometry {
    /// Checks the values and fills `spec` with them.
    fn fill(self, spec: &mut BdevSpec) -> Result<(), RpcError> {
        check_name(&self.name)?;
        unsupported_if("dif_pi_format", self.dif_pi_format.is_some_and(|v| v != 0))?;
        // Pollux keeps the PI tuple in the last 8 metadata bytes: the head
        // too only when there are just 8.
        unsupported_if(
            "dif_is_head_of_md",
            self.dif_is_head_of_md == Some(true) && self.md_size != 8,
        )?;
        unsupported_if(
            "physical_block_size",
            self.physical_block_size
                .is_some_and(|v| v != 0 && v != self.block_size),
        )?;
        let size = self
            .num_blocks
            .checked_mul(u64::from(self.block_size))
            .ok_or_else(|| {
                RpcError::errno(Errno::Invalid, "num_blocks * block_size overflows 64 bits")
            })?;
        let pi = match self.dif_type.unwrap_or(0) {
            n @ 0..=3 => PiType::from_number(n as u8).unwrap_or_default(),
            n => {
                return Err(RpcError::errno(
                    Errno::Invalid,
                    format!("dif_type: {n} is not 0, 1, 2 or 3"),
                ))
            }
        };
        spec.name = Some(self.name);
        spec.block_size = Some(self.block_size);
        spec.size = Some(size);
        spec.md_size = self.md_size;
        spec.md_interleave = self.md_interleave;
        spec.pi_type = pi;
        spec.queue_depth = self.queue_depth.map(|d| d as usize);
        Ok(())
    }
}

/// A registry error, with the spec keys named as the methods' parameters.
fn spec_error(e: BdevError) -> RpcError {
    match e {
        BdevError::Spec { key, reason } => {
            let param = match key.as_str() {
                "block" => "block_size",
                "size" => "num_blocks",
                "md" => "md_size",
                "pi" => "dif_type",
                "depth" => "queue_depth",
                "path" => "filename",
                other => other,
            };
            RpcError::errno(Errno::Invalid, format!("{param}: {reason}"))
        }
        other => other.into(),
    }
}

impl Subsystem for BdevSubsystem {
    fn name(&self) -> &'static str {
        "bdev"
    }

    fn methods(self: Arc<Self>) -> Vec<Method> {
        let s = self;
        let m = |name: &'static str, f: fn(&BdevSubsystem, &RpcService, Option<Value>) -> Result<Value, RpcError>| {
            let s = Arc::clone(&s);
            Method::runtime(name, move |svc, p| f(&s, svc, p))
        };
        vec![
            m("bdev_malloc_create", |s, _, p| s.malloc_create(p)),
            m("bdev_malloc_delete", |s, _, p| s.delete(Kind::Malloc, p)),
            m("bdev_null_create", |s, _, p| s.null_create(p)),
            m("bdev_null_delete", |s, _, p| s.delete(Kind::Null, p)),
            m("bdev_aio_create", |s, _, p| s.aio_create(p)),
            m("bdev_aio_delete", |s, _, p| s.delete(Kind::Aio, p)),
            m("bdev_get_bdevs", |s, _, p| s.get_bdevs(p)),
            m("bdev_get_iostat", |s, svc, p| s.get_iostat(svc, p)),
        ]
    }

    fn config(&self, _svc: &RpcService) -> Result<Vec<ConfigEntry>, RpcError> {
        self.config_entries()
    }

    fn undo(&self, method: &str, _params: Option<&Value>, result: &Value) -> Option<ConfigEntry> {
        let delete = method
            .strip_suffix("_create")
            .map(|m| format!("{m}_delete"))?;
        let name = result.as_str()?;
        Some(ConfigEntry::new(delete, json!({ "name": name })))
    }
}
