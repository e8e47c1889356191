//! The aio backend: a file or block device, opened with `O_DIRECT`, driven
//! through io_uring or Linux native AIO.
//!
//! One engine (`pollux_reactor::io::AnyEngine`) per channel, i.e. per
//! reactor. Reads, writes and flushes (`fsync`) are queued on the engine in
//! `submit` and handed to the kernel with **one** `submit()` per poll, then
//! reaped by the same poll. Write zeroes and unmap are `fallocate`
//! (`ZERO_RANGE` and `PUNCH_HOLE`, keeping the size) run on the channel's
//! helper thread ([`crate::aio_fallocate`]) and reaped by the channel's
//! poll, so a large range never stalls the reactor's other I/O. A file
//! system or device that refuses them completes the I/O with
//! [`IoError::Device`] and its errno.
//!
//! The size comes from the file or device; `size=` creates or extends a
//! regular file. A trailing partial block is not used. Metadata is not
//! supported (`md` must be 0).

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use pollux_reactor::io::{AnyEngine, EngineConfig, EngineKind, IoEngine, IoOp};
use pollux_reactor::{PollStatus, Reactor};
use rustix::fs::FallocateFlags;

use crate::aio_fallocate::{fallocate, FallocateWorker};

use crate::backend::{BackendChannel, BdevBackend, Completions, Submitted};
use crate::info::BdevInfo;
use crate::io::{BdevError, BdevIo, IoError, IoTag, IoType};
use crate::registry::BdevSpec;

/// The default queue depth of an aio channel (and of its engine).
pub const AIO_DEFAULT_DEPTH: usize = 128;

/// Most segments in one aio I/O.
pub const AIO_MAX_SEGS: usize = 32;

const EINVAL: i32 = 22;

/// Which kernel interface an aio bdev submits through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AioEngineKind {
    /// io_uring when the kernel allows it, else Linux native AIO.
    #[default]
    Auto,
    /// io_uring only.
    Uring,
    /// Linux native AIO (`io_submit`) only.
    LinuxAio,
}

/// An option value its parser does not know (the message names the
/// values it takes).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionValueError {
    /// Not an [`AioEngineKind`].
    #[error("unknown engine `{0}` (uring, aio or auto)")]
    AioEngine(String),
}

impl FromStr for AioEngineKind {
    type Err = OptionValueError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "uring" | "io_uring" => Ok(Self::Uring),
            "aio" | "libaio" => Ok(Self::LinuxAio),
            other => Err(OptionValueError::AioEngine(other.to_owned())),
        }
    }
}

/// Options of an aio bdev.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AioOptions {
    /// The file or block device.
    pub path: PathBuf,
    /// The submission engine.
    pub engine: AioEngineKind,
    /// Open with O_DIRECT.
    pub direct: bool,
    /// Create or extend a regular file to this many bytes.
    pub size: Option<u64>,
    /// I/Os in flight per channel.
    pub queue_depth: Option<usize>,
}

/// The shared half of an aio bdev: the open file.
#[derive(Debug)]
pub struct AioBackend {
    info: BdevInfo,
    file: Arc<File>,
    engine: AioEngineKind,
    queue_depth: usize,
}

impl AioBackend {
    /// The product string of aio bdevs.
    pub const PRODUCT: &'static str = "AIO disk";

    /// Open (and with `size`, create or extend) the file or device.
    /// Control path: opens files, may write file metadata.
    ///
    /// # Errors
    ///
    /// [`BdevError::DirectRefused`] when `direct` and the file system refuses
    /// O_DIRECT, [`BdevError::Os`] for other open/size errors,
    /// [`BdevError::Unsupported`] for metadata, [`BdevError::InvalidGeometry`]
    /// for a file smaller than one block.
    pub fn open(spec: &BdevSpec, name: String, opts: AioOptions) -> Result<Self, BdevError> {
        let path = opts.path.display().to_string();
        if spec.md_size != 0 {
            return Err(BdevError::Unsupported(
                "aio bdevs do not support metadata (md must be 0)".into(),
            ));
        }
        let mut oo = OpenOptions::new();
        oo.read(true).write(true).create(opts.size.is_some());
        if opts.direct {
            oo.custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32);
        }
        let mut file = oo.open(&opts.path).map_err(|source| {
            if opts.direct && source.raw_os_error() == Some(EINVAL) {
                BdevError::DirectRefused {
                    path: path.clone(),
                    source,
                }
            } else {
                BdevError::Os {
                    what: "open",
                    path: path.clone(),
                    source,
                }
            }
        })?;
        let os = |what: &'static str| {
            let path = path.clone();
            move |source| BdevError::Os { what, path, source }
        };
        let meta = file.metadata().map_err(os("stat"))?;
        let mut size = if meta.is_file() {
            meta.len()
        } else {
            // Block devices report their size at the end.
            file.seek(SeekFrom::End(0)).map_err(os("size"))?
        };
        if let Some(want) = opts.size {
            if !meta.is_file() {
                return Err(BdevError::Unsupported(format!(
                    "size= only applies to regular files; `{path}` is not one"
                )));
            }
            if size < want {
                file.set_len(want).map_err(os("extend"))?;
                size = want;
            }
        }
        let block = spec.effective_block_size();
        let num_blocks = size / u64::from(block);
        if num_blocks == 0 {
            return Err(BdevError::InvalidGeometry(format!(
                "`{path}` holds {size} bytes, less than one {block}-byte block"
            )));
        }
        let info = spec.info(name, Self::PRODUCT, num_blocks)?;
        Ok(Self {
            info,
            file: Arc::new(file),
            engine: opts.engine,
            queue_depth: opts
                .queue_depth
                .unwrap_or(AIO_DEFAULT_DEPTH)
                .clamp(1, 32768),
        })
    }
}

impl BdevBackend for AioBackend {
    fn info(&self) -> &BdevInfo {
        &self.info
    }

    fn supports(&self, _io_type: IoType) -> bool {
        true
    }

    fn queue_depth(&self) -> usize {
        self.queue_depth
    }

    fn create_channel(&self, _reactor: &Reactor) -> Result<Box<dyn BackendChannel>, BdevError> {
        let kind = match self.engine {
            AioEngineKind::Auto => EngineKind::Auto,
            AioEngineKind::Uring => EngineKind::IoUring,
            AioEngineKind::LinuxAio => EngineKind::LinuxAio,
        };
        let cfg = EngineConfig {
            // Clamped to 1..=32768 in `open`.
            depth: self.queue_depth as u32,
            max_segs: AIO_MAX_SEGS,
        };
        let engine = AnyEngine::new(kind, cfg).map_err(|e| BdevError::Engine(e.to_string()))?;
        Ok(Box::new(AioChannel {
            engine,
            fd: self.file.as_raw_fd(),
            file: Arc::clone(&self.file),
            block: u64::from(self.info.block_size()),
            queued: 0,
            falloc: None,
            depth: self.queue_depth,
        }))
    }
}

/// Per-core state: the engine and the I/Os finished without it.
struct AioChannel {
    /// Dropped first: it waits for the kernel to give the buffers back.
    engine: AnyEngine,
    fd: RawFd,
    /// Keeps `fd` open while the engine may use it.
    file: Arc<File>,
    block: u64,
    /// I/Os queued on the engine since the last `submit()`.
    queued: usize,
    /// The `fallocate` thread (write zeroes, unmap), from the first one.
    falloc: Option<FallocateWorker>,
    depth: usize,
}

impl AioChannel {
    /// Hand a write zeroes or unmap to the helper thread (started on first
    /// use). Should the thread be unavailable, it runs here, as before.
    fn fallocate(&mut self, tag: IoTag, flags: FallocateFlags, io: &BdevIo) -> Submitted {
        let (offset, len) = (
            io.offset_blocks() * self.block,
            io.num_blocks() * self.block,
        );
        if self.falloc.is_none() {
            match FallocateWorker::start(Arc::clone(&self.file), self.depth) {
                Ok(w) => self.falloc = Some(w),
                Err(e) => log::warn!("aio: no fallocate thread ({e}); running it on the reactor"),
            }
        }
        let queued = self
            .falloc
            .as_mut()
            .is_some_and(|w| w.submit(tag.as_u64(), flags, offset, len).is_ok());
        if queued {
            Submitted::Queued
        } else {
            Submitted::Done(fallocate(&self.file, flags, offset, len))
        }
    }
}

impl BackendChannel for AioChannel {
    fn submit(&mut self, tag: IoTag, io: &mut BdevIo) -> Submitted {
        let offset = io.offset_blocks() * self.block;
        let op = match io.io_type() {
            IoType::Read => IoOp::read(self.fd, offset),
            IoType::Write => IoOp::write(self.fd, offset),
            IoType::Flush => IoOp::fsync(self.fd),
            IoType::WriteZeroes => return self.fallocate(tag, FallocateFlags::ZERO_RANGE, io),
            IoType::Unmap => return self.fallocate(tag, FallocateFlags::PUNCH_HOLE, io),
        };
        let bufs = std::mem::take(&mut io.bufs);
        match self.engine.queue(op, bufs, tag.as_u64()) {
            Ok(()) => {
                self.queued += 1;
                Submitted::Queued
            }
            Err(e) => {
                // The engine's depth is the channel's, so only too many
                // segments gets here.
                io.bufs = e.into_bufs();
                Submitted::Done(Err(IoError::Device(EINVAL)))
            }
        }
    }

    fn poll(&mut self, done: &mut Completions<'_>) -> PollStatus {
        let mut work = false;
        if self.queued > 0 {
            match self.engine.submit() {
                Ok(_) => self.queued = 0,
                // The I/Os stay queued: try again on the next poll.
                Err(e) => log::warn!("aio submit failed: {e}"),
            }
            work = true;
        }
        let block = self.block;
        let reaped = self.engine.reap(done.depth(), |d| {
            let Some(tag) = IoTag::from_u64(d.token) else {
                return;
            };
            let Some(mut io) = done.io_mut(tag) else {
                // Unknown token: `complete` counts it as stale.
                done.complete(tag, Err(IoError::Device(EINVAL)));
                return;
            };
            let expected = if io.io_type().has_data() {
                io.num_blocks() * block
            } else {
                0
            };
            io.bufs = d.bufs;
            drop(io);
            let status = match d.result {
                Ok(n) if n as u64 == expected => Ok(()),
                Ok(n) => Err(IoError::ShortTransfer {
                    expected,
                    done: n as u64,
                }),
                Err(errno) => Err(IoError::Device(errno)),
            };
            done.complete(tag, status);
        });
        work |= reaped > 0;
        if let Some(w) = self.falloc.as_mut().filter(|w| w.in_flight() > 0) {
            work |= w.reap(|token, st| {
                if let Some(tag) = IoTag::from_u64(token) {
                    done.complete(tag, st);
                }
            }) > 0;
        }
        PollStatus::from_work(work)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use pollux_reactor::TestCluster;

    use super::*;
    use crate::io::IoStatus;
    use crate::registry::BdevRegistry;
    use crate::testutil::{bytes_of, pattern, sg, sg_with, Recorder};

    /// A temp file path on a file system that accepts O_DIRECT (`$TMPDIR`
    /// or, where that is tmpfs, the workspace's `target/`), removed on drop.
    /// A directory whose file system also zeroes ranges (`fallocate`, for
    /// write zeroes; tmpfs does not) is preferred.
    struct TempFile(PathBuf);

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn direct_temp_file(tag: &str) -> Option<TempFile> {
        let name = format!("pollux-bdev-aio-{}-{tag}", std::process::id());
        let mut tried = Vec::new();
        let target = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target"));
        let mut direct_only = None;
        for dir in [std::env::temp_dir(), target] {
            let p = dir.join(&name);
            let r = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
                .open(&p);
            match r {
                Ok(f) => {
                    let zero = FallocateFlags::ZERO_RANGE | FallocateFlags::KEEP_SIZE;
                    if rustix::fs::fallocate(&f, zero, 0, 4096).is_ok() {
                        drop(direct_only);
                        return Some(TempFile(p));
                    }
                    direct_only.get_or_insert(TempFile(p));
                }
                Err(e) => {
                    let _ = std::fs::remove_file(&p);
                    tried.push(format!("{}: {e}", dir.display()));
                }
            }
        }
        if direct_only.is_some() {
            return direct_only;
        }
        pollux_reactor::test_env::skip(
            &format!(
                "a directory that accepts O_DIRECT for aio test {tag} ({})",
                tried.join("; ")
            ),
            "point TMPDIR at a disk file system such as ext4 or xfs, not tmpfs",
        );
        None
    }

    /// Poll until `n` completions are recorded: the kernel finishes the I/O
    /// asynchronously, so an idle round does not mean it is done.
    fn wait_for(cluster: &TestCluster, rec: &Recorder, n: usize) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while rec.len() < n {
            assert!(
                std::time::Instant::now() < deadline,
                "aio I/O never completed"
            );
            if cluster.poll_once_all() == PollStatus::Idle {
                std::thread::yield_now();
            }
        }
        assert_eq!(rec.len(), n, "more completions than I/Os");
    }

    type AioFixture = (
        TestCluster,
        Arc<crate::Bdev>,
        crate::BdevDesc,
        crate::IoChannel,
    );

    /// An aio bdev from `spec`, opened, and its channel on a one-reactor
    /// cluster; `None` (after `pollux_reactor::test_env::skip` naming
    /// `what`) when the engine is unavailable here.
    fn aio_channel(spec: &str, engine: &str, what: &str) -> Option<AioFixture> {
        let bdev = match BdevRegistry::new().create(spec) {
            Ok(b) => b,
            Err(e) => panic!("{spec}: {e}"),
        };
        let desc = bdev.open(true).unwrap();
        let cluster = TestCluster::new(1);
        match cluster.on(0, |r| desc.channel(r)) {
            Ok(ch) => Some((cluster, bdev, desc, ch)),
            Err(BdevError::Engine(e)) => {
                pollux_reactor::test_env::skip(
                    &format!("aio engine={engine} for the {what} ({e})"),
                    "run on Linux with io_uring and libaio (AIO) enabled, \
                     not blocked by seccomp or kernel.io_uring_disabled",
                );
                None
            }
            Err(e) => panic!("channel: {e}"),
        }
    }

    fn round_trip(engine: &str) {
        let Some(tmp) = direct_temp_file(engine) else {
            return;
        };
        let spec = format!(
            "aio:path={},size=1M,block=4096,engine={engine},depth=8",
            tmp.0.display()
        );
        let Some((cluster, bdev, _desc, ch)) = aio_channel(&spec, engine, "round trip") else {
            return;
        };
        assert_eq!(bdev.info().num_blocks(), 256);
        let (rec, cb) = Recorder::new();
        let data = pattern(4 * 4096, 9);
        cluster.on(0, |_| {
            ch.write(3, 4, sg_with(&data, &[4096, 8192, 4096]), &cb, 0)
                .unwrap();
            ch.flush(0, 0, &cb, 1).unwrap();
            ch.write(256, 1, sg(&[4096], 0), &cb, 2).unwrap();
            assert_eq!(rec.len(), 0, "completed inside submit");
        });
        wait_for(&cluster, &rec, 3);
        let mut done = rec.take();
        done.sort_by_key(|d| d.1.ctx);
        assert_eq!(done[0].1.status, Ok(()));
        assert_eq!(done[1].1.status, Ok(()));
        assert!(matches!(done[2].1.status, Err(IoError::OutOfRange { .. })));
        cluster.on(0, |_| {
            ch.read(2, 6, sg(&[8192, 16384], 0xEE), &cb, 3).unwrap()
        });
        wait_for(&cluster, &rec, 1);
        let got = bytes_of(&rec.one().bufs);
        assert!(
            got[..4096].iter().all(|b| *b == 0),
            "block 2 was never written"
        );
        assert_eq!(&got[4096..5 * 4096], &data[..]);
        // Write zeroes and unmap through fallocate, if the file system has it.
        cluster.on(0, |_| {
            ch.write_zeroes(3, 1, &cb, 4).unwrap();
            ch.unmap(6, 1, &cb, 5).unwrap();
        });
        wait_for(&cluster, &rec, 2);
        let st: Vec<IoStatus> = rec.take().into_iter().map(|d| d.1.status).collect();
        if st.iter().any(|s| s.is_err()) {
            pollux_reactor::test_env::skip(
                &format!("fallocate punch-hole/zero-range for write_zeroes/unmap ({st:?})"),
                "point TMPDIR at ext4 or xfs, which support both",
            );
        } else {
            cluster.on(0, |_| ch.read(3, 4, sg(&[4 * 4096], 0xEE), &cb, 6).unwrap());
            wait_for(&cluster, &rec, 1);
            let got = bytes_of(&rec.one().bufs);
            let mut want = data.clone();
            want[..4096].fill(0);
            want[3 * 4096..].fill(0);
            assert_eq!(got, want);
        }
        assert_eq!(ch.in_flight(), 0);
        assert_eq!(ch.stats().stale_completions, 0);
    }

    /// A write zeroes and an unmap held on the helper thread (as a large
    /// range on a slow file system would be) while the same reactor keeps
    /// completing reads: progress counted in completions.
    fn fallocate_does_not_stall_the_reactor(engine: &str) {
        let Some(tmp) = direct_temp_file(&format!("falloc-{engine}")) else {
            return;
        };
        let spec = format!(
            "aio:path={},size=4M,block=4096,engine={engine},depth=16",
            tmp.0.display()
        );
        let Some((cluster, _bdev, _desc, ch)) = aio_channel(&spec, engine, "fallocate check")
        else {
            return;
        };
        let (rec, cb) = Recorder::new();
        let gate = crate::aio_fallocate::test_gate::install(&File::open(&tmp.0).unwrap());
        cluster.on(0, |_| {
            ch.write_zeroes(16, 512, &cb, 1000).unwrap();
            ch.unmap(600, 256, &cb, 1001).unwrap();
        });
        const READS: u64 = 64;
        for i in 0..READS {
            cluster.on(0, |_| {
                ch.read(i % 16, 1, sg(&[4096], 0xEE), &cb, i).unwrap()
            });
            wait_for(&cluster, &rec, 1);
            let d = rec.take();
            assert_eq!(d[0].1.ctx, i, "read {i} completed, not the held fallocate");
            assert_eq!(d[0].1.status, Ok(()));
        }
        assert_eq!(
            ch.in_flight(),
            2,
            "write zeroes and unmap still outstanding after {READS} reads"
        );
        gate.send(()).unwrap();
        gate.send(()).unwrap();
        wait_for(&cluster, &rec, 2);
        let mut d = rec.take();
        d.sort_by_key(|d| d.1.ctx);
        assert_eq!((d[0].1.ctx, d[1].1.ctx), (1000, 1001));
        for x in &d {
            assert!(
                x.1.status.is_ok() || matches!(x.1.status, Err(IoError::Device(_))),
                "{:?}",
                x.1.status
            );
        }
        assert_eq!(ch.in_flight(), 0);
    }

    #[test]
    fn fallocate_does_not_stall_the_reactor_with_io_uring() {
        fallocate_does_not_stall_the_reactor("uring");
    }

    #[test]
    fn fallocate_does_not_stall_the_reactor_with_linux_aio() {
        fallocate_does_not_stall_the_reactor("aio");
    }

    #[test]
    fn round_trip_with_io_uring() {
        round_trip("uring");
    }

    #[test]
    fn round_trip_with_linux_aio() {
        round_trip("aio");
    }

    #[test]
    fn open_errors_are_clear() {
        let reg = BdevRegistry::new();
        let missing = Path::new("/nonexistent-pollux-dir/f");
        let err = reg
            .create(&format!("aio:path={}", missing.display()))
            .unwrap_err();
        assert!(matches!(err, BdevError::Os { what: "open", .. }), "{err}");
        assert!(err.to_string().contains("/nonexistent-pollux-dir/f"));
        let Some(tmp) = direct_temp_file("small") else {
            return;
        };
        let err = reg
            .create(&format!("aio:path={},direct=false", tmp.0.display()))
            .unwrap_err();
        assert!(matches!(err, BdevError::InvalidGeometry(_)), "{err}");
        let err = reg
            .create(&format!("aio:path={},size=8K,md=8", tmp.0.display()))
            .unwrap_err();
        assert!(matches!(err, BdevError::Unsupported(_)), "{err}");
    }
}
