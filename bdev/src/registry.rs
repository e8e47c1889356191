//! Create and destroy bdevs by name, from spec strings or [`BdevSpec`] values.
//!
//! Control path: the registry takes a `Mutex`, creating a bdev allocates,
//! opens files and maps memory. Nothing here runs per I/O.
//!
//! Spec strings are `TYPE:key=value,key=value...`:
//!
//! | key | types | meaning |
//! |---|---|---|
//! | `name` | all | bdev name (default `null0`, `malloc0`, `aio0`, ...: the first free) |
//! | `size` | all | capacity, with an optional `K`/`M`/`G`/`T` suffix (powers of 1024); required for null and malloc; for aio it creates or extends a regular file |
//! | `block` | all | block size, 512 or 4096 (default 512; 4096 for aio) |
//! | `md` | all | metadata bytes per block: 0, 8, 16, 32, 64 or 128 (default 0) |
//! | `md_interleave` | all | `true`/`false`: metadata interleaved with the data (default false) |
//! | `pi` | all | T10 PI type 0..3 (needs `md` >= 8; the tuple is the last 8 metadata bytes; null and malloc only, aio takes no metadata). See `pollux_bdev::pi` |
//! | `depth` | all | I/Os in flight per channel, 1 to 65536 (default 1024) |
//! | `latency_us` | null | fixed completion latency in microseconds (default 0) |
//! | `path` | aio | file or block device (required) |
//! | `engine` | aio | `uring`, `aio` (Linux native AIO) or `auto` (default: io_uring, else AIO) |
//! | `direct` | aio | `true` (default): open with O_DIRECT and fail if refused; `false`: page cache |
//!
//! Examples: `null:size=1G,block=4096`, `malloc:size=64M,block=512`,
//! `aio:path=/tmp/f,block=4096,engine=uring,depth=128`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};

use pollux_reactor::sync::Mutex;

use crate::aio::{AioBackend, AioEngineKind, AioOptions, OptionValueError};
use crate::backend::{BdevBackend, MAX_QUEUE_DEPTH};
use crate::bdev::Bdev;
use crate::info::{BdevInfo, PiType};
use crate::io::BdevError;
use crate::malloc::MallocBackend;
use crate::null::{NullBackend, NullOptions};

/// What kind of backend a [`BdevSpec`] makes, with its own options.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendSpec {
    /// [`NullBackend`]: discards writes, reads leave buffers untouched.
    Null {
        /// Fixed completion latency in microseconds (0 = next poll).
        latency_us: u64,
    },
    /// [`MallocBackend`]: a RAM disk in DMA arenas.
    Malloc,
    /// [`AioBackend`]: a file or block device.
    Aio {
        /// The file or block device.
        path: PathBuf,
        /// Which kernel interface submits the I/O.
        engine: AioEngineKind,
        /// Open with O_DIRECT (and fail when it is refused).
        direct: bool,
    },
}

impl BackendSpec {
    /// The type word of the spec string (`"null"`, `"malloc"`, `"aio"`).
    pub fn type_name(&self) -> &'static str {
        match self {
            BackendSpec::Null { .. } => "null",
            BackendSpec::Malloc => "malloc",
            BackendSpec::Aio { .. } => "aio",
        }
    }
}

/// A parsed bdev description: what a spec string says, as plain data.
///
/// Built by [`BdevSpec::parse`] or directly (the apps build it from their
/// serde/TOML config); [`BdevRegistry::create_from`] makes the bdev.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BdevSpec {
    /// Bdev name; `None` picks the first free `<type><n>`.
    pub name: Option<String>,
    /// Block size in bytes; `None` means 512 (4096 for aio).
    pub block_size: Option<u32>,
    /// Capacity in bytes; required for null and malloc, optional for aio.
    pub size: Option<u64>,
    /// Metadata bytes per block.
    pub md_size: u32,
    /// Metadata interleaved with the data.
    pub md_interleave: bool,
    /// T10 PI type (see [`crate::pi`]).
    pub pi_type: PiType,
    /// I/Os in flight per channel (1 to [`MAX_QUEUE_DEPTH`]); `None` means
    /// the backend default.
    pub queue_depth: Option<usize>,
    /// Backend type and its options.
    pub backend: BackendSpec,
}

impl BdevSpec {
    /// A spec of the given backend with every common option at its default.
    pub fn new(backend: BackendSpec) -> Self {
        Self {
            name: None,
            block_size: None,
            size: None,
            md_size: 0,
            md_interleave: false,
            pi_type: PiType::None,
            queue_depth: None,
            backend,
        }
    }

    /// Parse a spec string such as `null:size=1G,block=4096` (see the module docs).
    ///
    /// # Errors
    ///
    /// [`BdevError::Spec`] naming the key (or `type`) that is unknown,
    /// repeated, missing or has a bad value.
    pub fn parse(s: &str) -> Result<Self, BdevError> {
        let s = s.trim();
        let (ty, rest) = s.split_once(':').unwrap_or((s, ""));
        let mut spec = match ty.trim() {
            "null" => BdevSpec::new(BackendSpec::Null { latency_us: 0 }),
            "malloc" => BdevSpec::new(BackendSpec::Malloc),
            "aio" => BdevSpec::new(BackendSpec::Aio {
                path: PathBuf::new(),
                engine: AioEngineKind::Auto,
                direct: true,
            }),
            other => {
                return Err(spec_err(
                    "type",
                    format!("unknown bdev type `{other}` (expected null, malloc or aio)"),
                ))
            }
        };
        let mut seen: Vec<&str> = Vec::new();
        let mut have_path = false;
        for item in rest.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (key, value) = item
                .split_once('=')
                .map(|(k, v)| (k.trim(), v.trim()))
                .ok_or_else(|| spec_err(item, "expected key=value".into()))?;
            if seen.contains(&key) {
                return Err(spec_err(key, "given twice".into()));
            }
            seen.push(key);
            match (key, &mut spec.backend) {
                ("name", _) => {
                    if value.is_empty() || value.contains(|c: char| c.is_whitespace()) {
                        return Err(spec_err(
                            key,
                            "a name must be non-empty, without spaces".into(),
                        ));
                    }
                    spec.name = Some(value.to_owned());
                }
                ("size", _) => spec.size = Some(parse_size(key, value)?),
                ("block", _) => spec.block_size = Some(parse_num(key, value)?),
                ("md", _) => spec.md_size = parse_num(key, value)?,
                ("md_interleave", _) => spec.md_interleave = parse_bool(key, value)?,
                ("pi", _) => {
                    let n: u8 = parse_num(key, value)?;
                    spec.pi_type = PiType::from_number(n)
                        .ok_or_else(|| spec_err(key, format!("`{value}` is not 0, 1, 2 or 3")))?;
                }
                ("depth", _) => spec.queue_depth = Some(parse_num(key, value)?),
                ("latency_us", BackendSpec::Null { latency_us }) => {
                    *latency_us = parse_num(key, value)?
                }
                ("path", BackendSpec::Aio { path, .. }) => {
                    if value.is_empty() {
                        return Err(spec_err(key, "empty path".into()));
                    }
                    *path = PathBuf::from(value);
                    have_path = true;
                }
                ("engine", BackendSpec::Aio { engine, .. }) => {
                    *engine = value
                        .parse()
                        .map_err(|e: OptionValueError| spec_err(key, e.to_string()))?
                }
                ("direct", BackendSpec::Aio { direct, .. }) => *direct = parse_bool(key, value)?,
                (key, backend) => {
                    return Err(spec_err(
                        key,
                        format!("unknown key for a {} bdev", backend.type_name()),
                    ))
                }
            }
        }
        if matches!(spec.backend, BackendSpec::Aio { .. }) && !have_path {
            return Err(spec_err("path", "an aio bdev needs path=FILE".into()));
        }
        spec.validate()?;
        Ok(spec)
    }

    /// Check the values against each other (size against block size, PI
    /// against metadata, depth), without touching any file or memory.
    ///
    /// # Errors
    ///
    /// [`BdevError::Spec`] naming the offending key.
    pub fn validate(&self) -> Result<(), BdevError> {
        let block = self.effective_block_size();
        if !crate::info::SUPPORTED_BLOCK_SIZES.contains(&block) {
            return Err(spec_err("block", format!("{block} is not 512 or 4096")));
        }
        if !crate::info::SUPPORTED_MD_SIZES.contains(&self.md_size) {
            return Err(spec_err(
                "md",
                format!("{} is not one of 0, 8, 16, 32, 64, 128", self.md_size),
            ));
        }
        if self.pi_type != PiType::None && self.md_size < crate::info::PI_TUPLE_SIZE {
            return Err(spec_err("pi", "PI needs md=8 or more".into()));
        }
        if self.md_interleave && self.md_size == 0 {
            return Err(spec_err("md_interleave", "needs md=N".into()));
        }
        if self
            .queue_depth
            .is_some_and(|d| d == 0 || d > MAX_QUEUE_DEPTH)
        {
            return Err(spec_err(
                "depth",
                format!("must be between 1 and {MAX_QUEUE_DEPTH}"),
            ));
        }
        match (self.size, &self.backend) {
            (None, BackendSpec::Null { .. } | BackendSpec::Malloc) => {
                return Err(spec_err(
                    "size",
                    format!("a {} bdev needs size=N", self.backend.type_name()),
                ))
            }
            (Some(size), _) if size == 0 || size % u64::from(block) != 0 => {
                return Err(spec_err(
                    "size",
                    format!("{size} is not a non-zero multiple of the block size {block}"),
                ))
            }
            _ => {}
        }
        Ok(())
    }

    /// The block size, with the backend's default applied.
    pub fn effective_block_size(&self) -> u32 {
        match (self.block_size, &self.backend) {
            (Some(b), _) => b,
            (None, BackendSpec::Aio { .. }) => 4096,
            (None, _) => 512,
        }
    }

    /// The [`BdevInfo`] of a bdev of `num_blocks` blocks named `name` made from this spec.
    pub(crate) fn info(
        &self,
        name: String,
        product: &'static str,
        num_blocks: u64,
    ) -> Result<BdevInfo, BdevError> {
        BdevInfo::new(name, product, self.effective_block_size(), num_blocks)?.with_metadata(
            self.md_size,
            self.md_interleave,
            self.pi_type,
        )
    }

    /// The number of blocks `size` makes (for null and malloc, where it is required).
    pub(crate) fn num_blocks(&self) -> Result<u64, BdevError> {
        let size = self
            .size
            .ok_or_else(|| spec_err("size", "missing".into()))?;
        Ok(size / u64::from(self.effective_block_size()))
    }
}

impl FromStr for BdevSpec {
    type Err = BdevError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        BdevSpec::parse(s)
    }
}

fn spec_err(key: &str, reason: String) -> BdevError {
    BdevError::Spec {
        key: key.to_owned(),
        reason,
    }
}

fn parse_num<T: FromStr>(key: &str, value: &str) -> Result<T, BdevError> {
    value
        .parse()
        .map_err(|_| spec_err(key, format!("`{value}` is not a valid number")))
}

fn parse_bool(key: &str, value: &str) -> Result<bool, BdevError> {
    match value {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(spec_err(key, format!("`{value}` is not true or false"))),
    }
}

/// Parse a size with an optional binary suffix: `4096`, `64K`, `1G`, `2T`.
pub fn parse_size(key: &str, value: &str) -> Result<u64, BdevError> {
    let (digits, shift) = match value.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => {
                    return Err(spec_err(
                        key,
                        format!("`{value}`: unknown suffix `{c}` (K, M, G, T)"),
                    ))
                }
            };
            (&value[..i], shift)
        }
        _ => (value, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| spec_err(key, format!("`{value}` is not a size")))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| spec_err(key, format!("`{value}` overflows 64 bits")))
}

struct RegistryInner {
    bdevs: BTreeMap<String, Arc<Bdev>>,
    /// The spec each bdev made by [`BdevRegistry::create_from`] came from
    /// (its name filled in), so that it can be described and made again.
    specs: BTreeMap<String, BdevSpec>,
}

/// The bdevs of a process, by name. Control path: every method takes a lock.
pub struct BdevRegistry {
    inner: Mutex<RegistryInner>,
}

impl Default for BdevRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl BdevRegistry {
    /// An empty registry (tests and embedders; apps usually use [`BdevRegistry::global`]).
    pub fn new() -> Self {
        Self {
            inner: Mutex::new(RegistryInner {
                bdevs: BTreeMap::new(),
                specs: BTreeMap::new(),
            }),
        }
    }

    /// The process-wide registry.
    pub fn global() -> &'static BdevRegistry {
        static GLOBAL: OnceLock<BdevRegistry> = OnceLock::new();
        GLOBAL.get_or_init(BdevRegistry::new)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RegistryInner> {
        // A panic while holding the lock leaves the map itself consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Parse `spec` and create the bdev it describes.
    ///
    /// # Errors
    ///
    /// Parse errors ([`BdevError::Spec`]), [`BdevError::AlreadyExists`], and
    /// whatever the backend reports (memory, files, O_DIRECT).
    pub fn create(&self, spec: &str) -> Result<Arc<Bdev>, BdevError> {
        self.create_from(&BdevSpec::parse(spec)?)
    }

    /// Create the bdev `spec` describes and register it.
    ///
    /// The lock is held while the backend is built, so two creates of the
    /// same name cannot both succeed.
    ///
    /// # Errors
    ///
    /// As [`BdevRegistry::create`].
    pub fn create_from(&self, spec: &BdevSpec) -> Result<Arc<Bdev>, BdevError> {
        spec.validate()?;
        let mut inner = self.lock();
        let name = match &spec.name {
            Some(n) if inner.bdevs.contains_key(n) => {
                return Err(BdevError::AlreadyExists(n.clone()))
            }
            Some(n) => n.clone(),
            None => {
                let ty = spec.backend.type_name();
                (0u64..)
                    .map(|i| format!("{ty}{i}"))
                    .find(|n| !inner.bdevs.contains_key(n))
                    .unwrap_or_else(|| ty.to_owned())
            }
        };
        let backend: Arc<dyn BdevBackend> = match &spec.backend {
            BackendSpec::Null { latency_us } => {
                let info = spec.info(name.clone(), NullBackend::PRODUCT, spec.num_blocks()?)?;
                Arc::new(NullBackend::new(
                    info,
                    NullOptions {
                        latency: std::time::Duration::from_micros(*latency_us),
                        queue_depth: spec.queue_depth,
                    },
                ))
            }
            BackendSpec::Malloc => {
                let info = spec.info(name.clone(), MallocBackend::PRODUCT, spec.num_blocks()?)?;
                Arc::new(MallocBackend::new(info, spec.queue_depth)?)
            }
            BackendSpec::Aio {
                path,
                engine,
                direct,
            } => Arc::new(AioBackend::open(
                spec,
                name.clone(),
                AioOptions {
                    path: path.clone(),
                    engine: *engine,
                    direct: *direct,
                    size: spec.size,
                    queue_depth: spec.queue_depth,
                },
            )?),
        };
        let bdev = Bdev::new(backend);
        let mut made = spec.clone();
        made.name = Some(name.clone());
        inner.specs.insert(name.clone(), made);
        inner.bdevs.insert(name, Arc::clone(&bdev));
        Ok(bdev)
    }

    /// Register a bdev made by hand (a custom backend).
    ///
    /// # Errors
    ///
    /// [`BdevError::AlreadyExists`] when the name is taken.
    pub fn register(&self, bdev: Arc<Bdev>) -> Result<(), BdevError> {
        let mut inner = self.lock();
        let name = bdev.name().to_owned();
        if inner.bdevs.contains_key(&name) {
            return Err(BdevError::AlreadyExists(name));
        }
        inner.bdevs.insert(name, bdev);
        Ok(())
    }

    /// The bdev named `name`.
    pub fn get(&self, name: &str) -> Option<Arc<Bdev>> {
        self.lock().bdevs.get(name).cloned()
    }

    /// Every registered bdev, sorted by name.
    pub fn list(&self) -> Vec<Arc<Bdev>> {
        self.lock().bdevs.values().cloned().collect()
    }

    /// The spec the bdev `name` was made from, its name filled in (`None`
    /// for a bdev [registered](BdevRegistry::register) by hand, or none of
    /// that name).
    pub fn spec(&self, name: &str) -> Option<BdevSpec> {
        self.lock().specs.get(name).cloned()
    }

    /// Unregister the bdev `name`.
    ///
    /// Refused while it has open descriptors. After this the bdev cannot be
    /// opened again; its memory and files are released when the last `Arc`
    /// (held by per-core channels, for instance) goes away.
    ///
    /// # Errors
    ///
    /// [`BdevError::NotFound`], or [`BdevError::InUse`] with the number of
    /// open descriptors.
    pub fn destroy(&self, name: &str) -> Result<(), BdevError> {
        let mut inner = self.lock();
        let bdev = inner
            .bdevs
            .get(name)
            .ok_or_else(|| BdevError::NotFound(name.to_owned()))?;
        bdev.mark_removed()?;
        inner.bdevs.remove(name);
        inner.specs.remove(name);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(e: BdevError) -> String {
        match e {
            BdevError::Spec { key, .. } => key,
            other => panic!("expected a spec error, got {other:?}"),
        }
    }

    #[test]
    fn parses_the_documented_examples() {
        let s = BdevSpec::parse("null:size=1G,block=4096").unwrap();
        assert_eq!(s.size, Some(1 << 30));
        assert_eq!(s.effective_block_size(), 4096);
        assert_eq!(s.backend, BackendSpec::Null { latency_us: 0 });
        let s = BdevSpec::parse("malloc:size=64M,block=512,name=m").unwrap();
        assert_eq!(s.size, Some(64 << 20));
        assert_eq!(s.name.as_deref(), Some("m"));
        let s: BdevSpec = "aio:path=/tmp/f,block=4096,engine=aio,depth=64,direct=false"
            .parse()
            .unwrap();
        assert_eq!(
            s.backend,
            BackendSpec::Aio {
                path: "/tmp/f".into(),
                engine: AioEngineKind::LinuxAio,
                direct: false
            }
        );
        assert_eq!(s.queue_depth, Some(64));
        let s = BdevSpec::parse("null:size=8K,latency_us=5,md=8,pi=1,md_interleave=1").unwrap();
        assert_eq!(s.backend, BackendSpec::Null { latency_us: 5 });
        assert_eq!(
            (s.md_size, s.pi_type, s.md_interleave),
            (8, PiType::Type1, true)
        );
    }

    #[test]
    fn sizes_take_suffixes() {
        assert_eq!(parse_size("size", "4096").unwrap(), 4096);
        assert_eq!(parse_size("size", "4k").unwrap(), 4096);
        assert_eq!(parse_size("size", "2T").unwrap(), 2 << 40);
        assert!(parse_size("size", "1X").is_err());
        assert!(parse_size("size", "G").is_err());
        assert!(parse_size("size", "99999999999T").is_err());
    }

    #[test]
    fn errors_name_the_key() {
        let cases = [
            ("disk:size=1G", "type"),
            ("null:size=1G,colour=red", "colour"),
            ("null:size=1G,path=/x", "path"),
            ("malloc:size=1G,latency_us=3", "latency_us"),
            ("null:size=abc", "size"),
            ("null:size=1000", "size"),
            ("null:block=512", "size"),
            ("null:size=1M,block=1024", "block"),
            ("null:size=1M,md=7", "md"),
            ("null:size=1M,pi=1", "pi"),
            ("null:size=1M,pi=9,md=8", "pi"),
            ("null:size=1M,depth=0", "depth"),
            ("null:size=1M,size=2M", "size"),
            ("null:size=1M,md_interleave=maybe", "md_interleave"),
            ("aio:block=4096", "path"),
            ("aio:path=/x,engine=spdk", "engine"),
            ("null:size=1M,oops", "oops"),
        ];
        for (spec, key) in cases {
            let err = BdevSpec::parse(spec).expect_err(spec);
            assert!(err.to_string().contains(key), "{spec}: {err}");
            assert_eq!(key_of(err), key, "{spec}");
        }
    }

    #[test]
    fn a_depth_no_channel_can_allocate_is_refused_with_a_spec_error() {
        // Accepted up to 2^32-1 before, and the first channel aborted the
        // process allocating its request table (755 GB for 2^32-1).
        for spec in [
            "null:size=1M,depth=65537",
            "malloc:size=1M,depth=4294967295",
        ] {
            let err = BdevSpec::parse(spec).expect_err(spec);
            assert_eq!(key_of(err), "depth", "{spec}");
        }
        let mut s = BdevSpec::parse("null:size=1M").unwrap();
        s.queue_depth = Some(usize::MAX);
        assert_eq!(
            key_of(BdevRegistry::new().create_from(&s).unwrap_err()),
            "depth"
        );
        let b = BdevRegistry::new()
            .create("null:size=1M,depth=65536")
            .unwrap();
        assert_eq!(b.backend().queue_depth(), MAX_QUEUE_DEPTH);
    }

    #[test]
    fn a_backend_asking_for_a_deeper_channel_gets_the_maximum() {
        let info = BdevInfo::new("deep", NullBackend::PRODUCT, 512, 8).unwrap();
        let opts = NullOptions {
            queue_depth: Some(u32::MAX as usize),
            ..NullOptions::default()
        };
        let b = Bdev::new(Arc::new(NullBackend::new(info, opts)));
        let desc = b.open(false).unwrap();
        let cluster = pollux_reactor::TestCluster::new(1);
        let depth = cluster.on(0, |r| desc.channel(r).unwrap().queue_depth());
        assert_eq!(depth, MAX_QUEUE_DEPTH);
    }

    #[test]
    fn create_get_list_destroy() {
        let reg = BdevRegistry::new();
        let a = reg.create("null:size=1M").unwrap();
        let b = reg.create("null:size=2M,block=4096").unwrap();
        assert_eq!(a.name(), "null0");
        assert_eq!(b.name(), "null1");
        assert_eq!(b.info().num_blocks(), 512);
        assert!(matches!(
            reg.create("null:size=1M,name=null1"),
            Err(BdevError::AlreadyExists(_))
        ));
        let names: Vec<String> = reg.list().iter().map(|b| b.name().to_owned()).collect();
        assert_eq!(names, ["null0", "null1"]);
        let spec = reg.spec("null1").unwrap();
        assert_eq!(spec.name.as_deref(), Some("null1"));
        assert_eq!(spec.size, Some(2 << 20));
        let desc = a.open(true).unwrap();
        assert!(matches!(
            reg.destroy("null0"),
            Err(BdevError::InUse { opens: 1, .. })
        ));
        drop(desc);
        reg.destroy("null0").unwrap();
        assert!(reg.get("null0").is_none());
        assert!(reg.spec("null0").is_none());
        assert!(a.open(false).is_err(), "a destroyed bdev cannot be opened");
        assert!(matches!(reg.destroy("null0"), Err(BdevError::NotFound(_))));
        assert!(reg.get("null1").is_some());
    }
}
