//! `DmaArena`: an fd-backed (memfd), shared, mapped region of DMA-able memory.
//!
//! Control path: creating and dropping an arena makes system calls, allocates
//! and takes the [`ArenaRegistry`](super::ArenaRegistry) lock.

use std::fmt;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Once};

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

use super::error::{MemError, MemResult};
use super::registry::ArenaRegistry;

/// Size of a 2 MiB hugepage, the unit hugepage arenas are rounded to.
pub const HUGEPAGE_SIZE: usize = 2 << 20;

/// `statfs.f_type` of hugetlbfs (`HUGETLBFS_MAGIC` in `linux/magic.h`).
const HUGETLBFS_MAGIC: u64 = 0x9584_58f6;

/// Process-unique identity of a [`DmaArena`] (never reused within a process).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ArenaId(u64);

impl ArenaId {
    fn next() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        ArenaId(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// The id as a plain integer (for logs and wire tokens).
    pub fn as_u64(self) -> u64 {
        self.0
    }
}

impl fmt::Display for ArenaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "arena#{}", self.0)
    }
}

/// Whether an arena uses 2 MiB hugepages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HugepageMode {
    /// Use hugepages when the kernel can give them, else ordinary pages with one
    /// warning per process.
    #[default]
    Auto,
    /// Fail with [`MemError::HugepagesUnavailable`] when hugepages cannot be mapped.
    Require,
    /// Always use ordinary pages (no warning).
    Never,
}

/// Options of [`DmaArena::new`].
#[derive(Debug, Clone)]
pub struct ArenaOptions {
    /// Hugepage policy.
    pub hugepages: HugepageMode,
    /// A name for logs and `/proc/<pid>/maps` (`memfd:<name>`).
    pub name: String,
}

impl Default for ArenaOptions {
    fn default() -> Self {
        ArenaOptions {
            hugepages: HugepageMode::Auto,
            name: "pollux-dma".to_owned(),
        }
    }
}

impl ArenaOptions {
    /// Options with a name and [`HugepageMode::Auto`].
    pub fn named(name: impl Into<String>) -> Self {
        ArenaOptions {
            name: name.into(),
            ..ArenaOptions::default()
        }
    }

    /// The same options with another hugepage policy.
    pub fn hugepages(mut self, mode: HugepageMode) -> Self {
        self.hugepages = mode;
        self
    }
}

/// A mapped, fd-backed region of DMA-able memory.
///
/// Local arenas ([`DmaArena::new`]) are `memfd`s (hugetlb when 2 MiB pages are
/// reserved), sealed against shrinking and growing, mapped `MAP_SHARED`,
/// locked when `RLIMIT_MEMLOCK` allows, and listed in the global
/// [`ArenaRegistry`] from creation until drop. Foreign arenas
/// ([`DmaArena::map_foreign`]) map a peer's arena from its fd and are not
/// registered. An arena is unmapped and its fd closed on drop.
///
/// An arena hands out no references to its bytes itself: [`DmaBuf`](super::DmaBuf)s
/// and pools carve disjoint, exclusively owned ranges out of it.
pub struct DmaArena {
    // INVARIANT: `base..base+len` is a live `MAP_SHARED` read/write mapping of
    // `fd` from offset 0, created in `map` and unmapped only in `Drop`; `len`
    // never exceeds the (sealed or checked) size of the file, so no access in
    // range can fault with SIGBUS. The arena never reads or writes the bytes;
    // whoever carves a range out of it (a pool, a standalone buffer) owns that
    // range exclusively, which is what makes `Send + Sync` sound.
    id: ArenaId,
    fd: OwnedFd,
    base: NonNull<u8>,
    len: usize,
    page_size: usize,
    hugepage: bool,
    locked: bool,
    local: bool,
    name: String,
}

// SAFETY: the arena is a handle to plain shared memory; it never dereferences
// `base` itself and the mapping stays valid until drop (see INVARIANT), so it
// may be used and dropped from any thread.
unsafe impl Send for DmaArena {}
// SAFETY: all `&self` methods only read immutable fields; the bytes are
// accessed only through exclusively owned carved ranges (see INVARIANT).
unsafe impl Sync for DmaArena {}

impl fmt::Debug for DmaArena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaArena")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("base", &self.base)
            .field("len", &self.len)
            .field("hugepage", &self.hugepage)
            .field("locked", &self.locked)
            .field("local", &self.local)
            .finish()
    }
}

/// How many times the fallback warning was printed (0 or 1; for tests).
static FALLBACK_WARNINGS: AtomicU64 = AtomicU64::new(0);

/// Print, once per process, how to get hugepages and locked memory.
fn warn_fallback_once(name: &str, why: &str) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        FALLBACK_WARNINGS.fetch_add(1, Ordering::Relaxed);
        let msg = format!(
            "pollux: DMA arena `{name}` uses ordinary 4 KiB pages because 2 MiB hugepages are \
             unavailable ({why}). I/O works but is slower and not pinned against migration. \
             Reserve hugepages with `echo 1024 > /proc/sys/vm/nr_hugepages` (as root) and \
             raise the locked-memory limit (`ulimit -l unlimited` or memlock in \
             /etc/security/limits.conf). This message is shown once per process."
        );
        // Through the application's logger when it has one, else on
        // stderr: said once either way, never lost.
        if log::log_enabled!(log::Level::Warn) {
            log::warn!("{msg}");
        } else {
            eprintln!("{msg}");
        }
    });
}

/// Print, once per process, that memory could not be locked.
fn warn_mlock_once(name: &str, err: &rustix::io::Errno) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let msg = format!(
            "pollux: could not lock DMA arena `{name}` in memory ({err}); RLIMIT_MEMLOCK is \
             probably too low. Raise it with `ulimit -l unlimited` or memlock in \
             /etc/security/limits.conf. This message is shown once per process."
        );
        // Through the application's logger when it has one, else on
        // stderr: said once either way, never lost.
        if log::log_enabled!(log::Level::Warn) {
            log::warn!("{msg}");
        } else {
            eprintln!("{msg}");
        }
    });
}

fn sys(op: &'static str, name: &str, e: rustix::io::Errno) -> MemError {
    MemError::Sys {
        op,
        name: name.to_owned(),
        source: e.into(),
    }
}

fn round_up(len: usize, to: usize) -> Option<usize> {
    len.checked_add(to - 1).map(|l| l / to * to)
}

/// A freshly created and mapped memfd, not yet an arena.
struct Mapped {
    fd: OwnedFd,
    base: NonNull<u8>,
    len: usize,
    page_size: usize,
}

impl DmaArena {
    /// Create, map and register a new local arena of at least `len` bytes.
    ///
    /// With hugepages the length is rounded up to 2 MiB, else to the page size.
    /// Falling back to ordinary pages (mode `Auto`) or failing to lock the
    /// memory prints one warning per process, never an error.
    ///
    /// # Errors
    /// [`MemError::InvalidArgument`] for `len == 0`,
    /// [`MemError::HugepagesUnavailable`] in mode `Require` when hugepages
    /// cannot be mapped, [`MemError::Sys`] when the memfd cannot be created or
    /// mapped at all.
    pub fn new(len: usize, opts: ArenaOptions) -> MemResult<Arc<DmaArena>> {
        if len == 0 {
            return Err(MemError::InvalidArgument("arena length is zero"));
        }
        let name = opts.name;
        let mapped = match opts.hugepages {
            HugepageMode::Never => Self::map_fresh(len, &name, false)?,
            HugepageMode::Require => Self::map_fresh(len, &name, true).map_err(|e| match e {
                MemError::Sys { source, .. } => MemError::HugepagesUnavailable {
                    name: name.clone(),
                    len: round_up(len, HUGEPAGE_SIZE).unwrap_or(len),
                    source,
                },
                other => other,
            })?,
            HugepageMode::Auto => match Self::map_fresh(len, &name, true) {
                Ok(m) => m,
                Err(MemError::Sys { op, source, .. }) => {
                    warn_fallback_once(&name, &format!("{op}: {source}"));
                    log::debug!("arena `{name}`: hugepages unavailable ({op}: {source})");
                    Self::map_fresh(len, &name, false)?
                }
                Err(other) => return Err(other),
            },
        };
        let hugepage = mapped.page_size >= HUGEPAGE_SIZE;
        // SAFETY: `base..base+len` is the mapping just created by `map_fresh`,
        // owned by nobody else yet.
        let locked = match unsafe { rustix::mm::mlock(mapped.base.as_ptr().cast(), mapped.len) } {
            Ok(()) => true,
            Err(e) => {
                // Hugetlb pages are never swapped or migrated, so only an
                // ordinary-page arena is worth a warning.
                if !hugepage {
                    warn_mlock_once(&name, &e);
                }
                false
            }
        };
        let arena = Arc::new(DmaArena {
            id: ArenaId::next(),
            fd: mapped.fd,
            base: mapped.base,
            len: mapped.len,
            page_size: mapped.page_size,
            hugepage,
            locked,
            local: true,
            name,
        });
        log::debug!("created {arena:?}");
        ArenaRegistry::global().add(&arena);
        Ok(arena)
    }

    /// memfd_create + ftruncate + seal + mmap. Every failure is `MemError::Sys`.
    fn map_fresh(len: usize, name: &str, huge: bool) -> MemResult<Mapped> {
        let mut flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
        if huge {
            flags |= MemfdFlags::HUGETLB | MemfdFlags::HUGE_2MB;
        }
        let unit = if huge { HUGEPAGE_SIZE } else { 4096 };
        let len = round_up(len, unit).ok_or(MemError::InvalidArgument("arena length overflows"))?;
        let fd = rustix::fs::memfd_create(name, flags).map_err(|e| sys("memfd_create", name, e))?;
        rustix::fs::ftruncate(&fd, len as u64).map_err(|e| sys("ftruncate", name, e))?;
        // Seal the size so a peer that maps this fd can trust it (no SIGBUS).
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(|e| sys("fcntl(F_ADD_SEALS)", name, e))?;
        let page_size = page_size_of(&fd, name)?;
        let base = map_shared(&fd, len, name)?;
        Ok(Mapped {
            fd,
            base,
            len,
            page_size,
        })
    }

    /// Map a peer's arena from its fd (received over a Unix socket): a shared
    /// mapping of the same pages. The result is not added to the registry.
    ///
    /// `len` must be the peer's [`len()`](Self::len), i.e. the size of the file,
    /// and the file must be sealed against shrinking (Pollux arenas are), so
    /// that the peer cannot truncate it under this mapping.
    ///
    /// # Errors
    /// [`MemError::ForeignSizeMismatch`], [`MemError::ForeignNotSealed`], or
    /// [`MemError::Sys`] when `fstat`/`mmap` fail.
    pub fn map_foreign(fd: OwnedFd, len: usize) -> MemResult<Arc<DmaArena>> {
        let name = "foreign";
        if len == 0 {
            return Err(MemError::InvalidArgument("foreign arena length is zero"));
        }
        let st = rustix::fs::fstat(&fd).map_err(|e| sys("fstat", name, e))?;
        let actual = u64::try_from(st.st_size).unwrap_or(0);
        if actual != len as u64 {
            return Err(MemError::ForeignSizeMismatch {
                expected: len,
                actual,
            });
        }
        let seals = rustix::fs::fcntl_get_seals(&fd).map_err(|_| MemError::ForeignNotSealed)?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err(MemError::ForeignNotSealed);
        }
        let page_size = page_size_of(&fd, name)?;
        let base = map_shared(&fd, len, name)?;
        let hugepage = rustix::fs::fstatfs(&fd)
            .map(|s| s.f_type as u64 == HUGETLBFS_MAGIC)
            .unwrap_or(false);
        Ok(Arc::new(DmaArena {
            id: ArenaId::next(),
            fd,
            base,
            len,
            page_size,
            hugepage,
            locked: false,
            local: false,
            name: name.to_owned(),
        }))
    }

    /// Process-unique id.
    pub fn id(&self) -> ArenaId {
        self.id
    }

    /// The memfd behind the mapping, to pass to a peer (`SCM_RIGHTS`).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// First byte of the mapping.
    ///
    /// Writing through this pointer is only sound for a range the caller owns
    /// exclusively (e.g. a range it carved out itself).
    pub fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// First byte of the mapping as an address.
    pub fn base_addr(&self) -> usize {
        self.base.as_ptr() as usize
    }

    /// Length in bytes (a multiple of [`page_size()`](Self::page_size)).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: arenas are never empty. Present for API symmetry.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the arena is backed by 2 MiB hugepages.
    pub fn is_hugepage(&self) -> bool {
        self.hugepage
    }

    /// The page size backing the arena (2 MiB or 4 KiB).
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Whether `mlock` succeeded.
    pub fn is_locked(&self) -> bool {
        self.locked
    }

    /// Whether this is a local arena (listed in the registry) rather than a
    /// mapping of a peer's arena.
    pub fn is_local(&self) -> bool {
        self.local
    }

    /// The name given at creation (`"foreign"` for mapped peer arenas).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether `addr..addr+len` lies entirely inside this arena.
    pub fn contains(&self, addr: usize, len: usize) -> bool {
        let base = self.base_addr();
        addr >= base
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= base + self.len)
    }
}

/// Smallest [`DmaArena::copy_in`] that uses non-temporal stores (x86-64).
pub const NT_COPY_MIN: usize = 4096;

/// Orders every non-temporal store this thread made before it (an
/// `sfence` on x86-64, nothing elsewhere): after it, the data of earlier
/// [`DmaArena::copy_in_unfenced`] calls is visible like a normal copy's.
#[inline]
pub fn streaming_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a plain fence (SSE, baseline): it only orders earlier stores
    // before later ones.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// Copies `len` bytes with non-temporal 16-byte stores, left unordered
/// (the caller fences: [`streaming_fence`]).
///
/// # Safety
///
/// `dst..dst+len` must be writable and 16-byte aligned, `src..src+len`
/// readable, the two must not overlap, and `len` must be a multiple of 64.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn nt_copy(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    let d = dst.cast::<__m128i>();
    let s = src.cast::<__m128i>();
    let mut i = 0;
    while i < len / 16 {
        // SAFETY: `i + 3 < len / 16`, so every access is inside both ranges
        // (caller's contract); SSE2 is part of the x86-64 baseline; stores
        // are to 16-byte-aligned addresses, loads may be unaligned.
        unsafe {
            let a = _mm_loadu_si128(s.add(i));
            let b = _mm_loadu_si128(s.add(i + 1));
            let c = _mm_loadu_si128(s.add(i + 2));
            let e = _mm_loadu_si128(s.add(i + 3));
            _mm_stream_si128(d.add(i), a);
            _mm_stream_si128(d.add(i + 1), b);
            _mm_stream_si128(d.add(i + 2), c);
            _mm_stream_si128(d.add(i + 3), e);
        }
        i += 4;
    }
}

/// Whole-arena byte access, for a backend that owns an arena outright (the
/// malloc bdev's disk image) rather than carving buffers out of it.
///
/// The bytes are plain shared memory, like a disk's media: the copies below
/// check bounds and never hand out a reference, so no Rust reference ever
/// aliases them. Two copies that overlap in time and space (two cores writing
/// one block, or a read racing a write) leave one of the writes or a mix of
/// both, exactly as a real disk would; callers that need ordering (a
/// filesystem, NVMe fused commands) provide it above. Do not use these on an
/// arena whose ranges are carved into [`DmaBuf`](super::DmaBuf)s by a pool.
impl DmaArena {
    fn check_range(&self, offset: usize, len: usize) -> MemResult<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(MemError::InvalidArgument("range outside the arena")),
        }
    }

    /// Copies `src` into the arena at byte `offset`.
    ///
    /// Copies of [`NT_COPY_MIN`] bytes or more (a multiple of 64, to a
    /// 16-byte-aligned place) use non-temporal stores on x86-64: the data
    /// goes to memory without first reading the destination's cache lines
    /// and without evicting the cache, which more than doubles the rate of
    /// random 4 KiB writes into a large arena (a malloc bdev). The copy is
    /// complete and ordered (`sfence`) when this returns.
    ///
    /// # Errors
    ///
    /// [`MemError::InvalidArgument`] when `offset + src.len()` passes the end.
    pub fn copy_in(&self, offset: usize, src: &[u8]) -> MemResult<()> {
        self.copy_in_unfenced(offset, src)?;
        streaming_fence();
        Ok(())
    }

    /// [`copy_in`](Self::copy_in) without the closing fence: a copy that
    /// used non-temporal stores is not yet ordered with this thread's later
    /// stores, nor visible to other cores. Call [`streaming_fence`] before
    /// anything depends on the data (a completion reported, a read or a fill
    /// of the range, another core told): one fence can close a whole batch
    /// of copies, which is what makes a batch of them fast (a fence per 4 KiB
    /// copy costs about a third of the copy rate).
    ///
    /// # Errors
    ///
    /// [`MemError::InvalidArgument`] when `offset + src.len()` passes the end.
    #[inline]
    pub fn copy_in_unfenced(&self, offset: usize, src: &[u8]) -> MemResult<()> {
        self.check_range(offset, src.len())?;
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: `offset..offset+len` is inside the live mapping (checked above).
            let dst = unsafe { self.base.as_ptr().add(offset) };
            if src.len() >= NT_COPY_MIN && src.len() % 64 == 0 && (dst as usize) % 16 == 0 {
                // SAFETY: `dst..dst+len` is inside the mapping and 16-byte
                // aligned, `len` is a multiple of 64, `src` is a live slice of
                // `len` bytes that cannot overlap the arena (see below).
                unsafe { nt_copy(dst, src.as_ptr(), src.len()) };
                return Ok(());
            }
        }
        // SAFETY: the range is inside the live mapping (checked above,
        // INVARIANT of DmaArena); `src` is a Rust slice and cannot overlap the
        // arena, because the arena's bytes are never lent out as references by
        // this API. Racing copies only mix bytes (documented above).
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.base.as_ptr().add(offset), src.len());
        }
        Ok(())
    }

    /// Copies bytes from the arena at `offset` into `dst`.
    ///
    /// # Errors
    ///
    /// [`MemError::InvalidArgument`] when `offset + dst.len()` passes the end.
    pub fn copy_out(&self, offset: usize, dst: &mut [u8]) -> MemResult<()> {
        self.check_range(offset, dst.len())?;
        // SAFETY: as in `copy_in`, with the direction reversed; `dst` is an
        // exclusive Rust slice outside the arena's never-lent bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.base.as_ptr().add(offset),
                dst.as_mut_ptr(),
                dst.len(),
            );
        }
        Ok(())
    }

    /// Sets `len` bytes at `offset` to `byte`.
    ///
    /// # Errors
    ///
    /// [`MemError::InvalidArgument`] when the range passes the end.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> MemResult<()> {
        self.check_range(offset, len)?;
        // SAFETY: the range is inside the live mapping (checked above).
        unsafe {
            std::ptr::write_bytes(self.base.as_ptr().add(offset), byte, len);
        }
        Ok(())
    }
}

impl Drop for DmaArena {
    fn drop(&mut self) {
        if self.local {
            ArenaRegistry::global().remove(self.id);
        }
        // SAFETY: `base..base+len` is the mapping created at construction (see
        // INVARIANT); nothing references it any more because every carved
        // range holds an `Arc` to this arena.
        if let Err(e) = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.len) } {
            log::error!("munmap of {} failed: {e}", self.id);
        }
    }
}

fn page_size_of(fd: &OwnedFd, name: &str) -> MemResult<usize> {
    let st = rustix::fs::fstat(fd).map_err(|e| sys("fstat", name, e))?;
    // tmpfs reports PAGE_SIZE, hugetlbfs the huge page size.
    Ok(usize::try_from(st.st_blksize)
        .ok()
        .filter(|s| s.is_power_of_two())
        .unwrap_or(4096))
}

fn map_shared(fd: &OwnedFd, len: usize, name: &str) -> MemResult<NonNull<u8>> {
    // SAFETY: a fresh mapping at an address the kernel chooses (null hint), so
    // no existing memory is replaced; `len` is the size of the file, so every
    // byte of the mapping is backed.
    let ptr = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED,
            fd,
            0,
        )
    }
    .map_err(|e| sys("mmap", name, e))?;
    NonNull::new(ptr.cast::<u8>()).ok_or(MemError::InvalidArgument("mmap returned null"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_mode_gives_ordinary_pages() {
        let a = DmaArena::new(
            10_000,
            ArenaOptions::named("t-never").hugepages(HugepageMode::Never),
        )
        .unwrap();
        assert!(!a.is_hugepage());
        assert_eq!(a.len(), 12_288);
        assert_eq!(a.page_size(), 4096);
        assert_eq!(a.base_addr() % 4096, 0);
        // The memory is usable and zeroed.
        // SAFETY: the test owns the whole fresh arena.
        let bytes = unsafe { std::slice::from_raw_parts_mut(a.base(), a.len()) };
        assert!(bytes.iter().all(|&b| b == 0));
        bytes[a.len() - 1] = 7;
        assert_eq!(bytes[a.len() - 1], 7);
    }

    #[test]
    fn zero_length_is_rejected() {
        assert!(matches!(
            DmaArena::new(0, ArenaOptions::default()),
            Err(MemError::InvalidArgument(_))
        ));
    }

    #[test]
    fn ids_are_unique() {
        let o = ArenaOptions::named("t-ids").hugepages(HugepageMode::Never);
        let a = DmaArena::new(4096, o.clone()).unwrap();
        let b = DmaArena::new(4096, o).unwrap();
        assert_ne!(a.id(), b.id());
    }

    /// Free hugepages not promised to a mapping yet (`Free - Rsvd`).
    fn free_hugepages() -> usize {
        let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let field = |name: &str| -> usize {
            info.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
                .unwrap_or(0)
        };
        field("HugePages_Free:").saturating_sub(field("HugePages_Rsvd:"))
    }

    /// Only this test of the crate asks for hugepages (all others use
    /// `Never`), and cargo runs test binaries one at a time, so the free count
    /// read here is what the test gets.
    #[test]
    fn auto_and_require_follow_hugepage_availability() {
        let free = free_hugepages();
        if free < 2 {
            println!(
                "no hugepages reserved ({free} free): checking the fallback and Require's error"
            );
            let auto = DmaArena::new(4096, ArenaOptions::named("t-auto")).unwrap();
            assert!(!auto.is_hugepage());
            assert_eq!(auto.len(), 4096);
            let again = DmaArena::new(4096, ArenaOptions::named("t-auto-2")).unwrap();
            assert!(!again.is_hugepage());
            assert_eq!(
                FALLBACK_WARNINGS.load(Ordering::Relaxed),
                1,
                "the fallback warning is printed once per process"
            );
            let req = DmaArena::new(
                4096,
                ArenaOptions::named("t-require").hugepages(HugepageMode::Require),
            );
            assert!(matches!(req, Err(MemError::HugepagesUnavailable { .. })));
            return;
        }
        println!("{free} hugepages free: checking hugepage arenas");
        let auto = DmaArena::new(4096, ArenaOptions::named("t-auto")).unwrap();
        assert!(auto.is_hugepage());
        assert_eq!(auto.len(), HUGEPAGE_SIZE);
        assert_eq!(auto.page_size(), HUGEPAGE_SIZE);
        assert_eq!(auto.base_addr() % HUGEPAGE_SIZE, 0);
        let req = DmaArena::new(
            HUGEPAGE_SIZE,
            ArenaOptions::named("t-require").hugepages(HugepageMode::Require),
        )
        .unwrap();
        assert!(req.is_hugepage());
        assert_eq!(free_hugepages(), free - 2, "both arenas hold one hugepage");
        // A peer mapping of a hugetlb memfd sees the same pages.
        let f = DmaArena::map_foreign(req.fd().try_clone_to_owned().unwrap(), req.len()).unwrap();
        assert!(f.is_hugepage());
        // SAFETY: the test owns both mappings of the fresh arena.
        unsafe {
            req.base().add(HUGEPAGE_SIZE - 1).write_volatile(0x42);
            assert_eq!(f.base().add(HUGEPAGE_SIZE - 1).read_volatile(), 0x42);
        }
        drop((auto, req, f));
        assert_eq!(free_hugepages(), free, "hugepages released on drop");
    }

    #[test]
    fn foreign_mapping_sees_the_same_memory() {
        let a = DmaArena::new(
            8192,
            ArenaOptions::named("t-foreign").hugepages(HugepageMode::Never),
        )
        .unwrap();
        let dup = a.fd().try_clone_to_owned().unwrap();
        let f = DmaArena::map_foreign(dup, a.len()).unwrap();
        assert!(!f.is_local());
        assert_ne!(f.base_addr(), a.base_addr());
        // SAFETY: the test owns both mappings; they alias the same pages,
        // accessed through volatile ops one at a time.
        unsafe {
            a.base().add(100).write_volatile(0xAB);
            assert_eq!(f.base().add(100).read_volatile(), 0xAB);
            f.base().add(8000).write_volatile(0x5A);
            assert_eq!(a.base().add(8000).read_volatile(), 0x5A);
        }
        assert!(crate::mem::ArenaRegistry::global()
            .lookup(f.base_addr(), 1)
            .is_none());
    }

    #[test]
    fn foreign_mapping_checks_size_and_seals() {
        let a = DmaArena::new(
            8192,
            ArenaOptions::named("t-fsize").hugepages(HugepageMode::Never),
        )
        .unwrap();
        let dup = a.fd().try_clone_to_owned().unwrap();
        assert!(matches!(
            DmaArena::map_foreign(dup, 16384),
            Err(MemError::ForeignSizeMismatch { .. })
        ));
        let unsealed = rustix::fs::memfd_create("t-unsealed", MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&unsealed, 4096).unwrap();
        assert!(matches!(
            DmaArena::map_foreign(unsealed, 4096),
            Err(MemError::ForeignNotSealed)
        ));
    }

    #[test]
    fn whole_arena_copies_are_bounds_checked() {
        let a = DmaArena::new(
            8192,
            ArenaOptions::named("copy-test").hugepages(HugepageMode::Never),
        )
        .unwrap();
        a.copy_in(100, b"hello").unwrap();
        let mut out = [0u8; 5];
        a.copy_out(100, &mut out).unwrap();
        assert_eq!(&out, b"hello");
        a.fill(101, 3, b'z').unwrap();
        a.copy_out(100, &mut out).unwrap();
        assert_eq!(&out, b"hzzzo");
        let len = a.len();
        assert!(a.copy_in(len - 2, b"abc").is_err());
        assert!(a.copy_out(usize::MAX, &mut out).is_err());
        assert!(a.fill(len, 1, 0).is_err());
        a.copy_in(len - 3, b"abc").unwrap();
    }

    #[test]
    fn large_copies_in_are_exact_whatever_the_alignment() {
        let a = DmaArena::new(
            64 << 10,
            ArenaOptions::named("nt-copy-test").hugepages(HugepageMode::Never),
        )
        .unwrap();
        let src: Vec<u8> = (0..3 * NT_COPY_MIN + 64)
            .map(|i| (i * 7 + 3) as u8)
            .collect();
        // Aligned and a multiple of 64 (streaming), unaligned, odd lengths.
        for (off, len) in [
            (4096, NT_COPY_MIN),
            (16, 3 * NT_COPY_MIN + 64),
            (8193, NT_COPY_MIN),
            (12288, NT_COPY_MIN + 1),
        ] {
            a.fill(0, a.len(), 0xEE).unwrap();
            a.copy_in(off, &src[..len]).unwrap();
            let mut out = vec![0u8; len + 2];
            a.copy_out(off - 1, &mut out).unwrap();
            assert_eq!(out[0], 0xEE);
            assert_eq!(&out[1..=len], &src[..len], "offset {off} len {len}");
            assert_eq!(out[len + 1], 0xEE);
        }
    }

    #[test]
    fn a_batch_of_unfenced_copies_is_exact_after_one_fence() {
        let a = DmaArena::new(
            64 << 10,
            ArenaOptions::named("nt-batch-test").hugepages(HugepageMode::Never),
        )
        .unwrap();
        a.fill(0, a.len(), 0).unwrap();
        let blocks = a.len() / NT_COPY_MIN;
        // Every block written twice, the second write last: a block's
        // later copy in program order wins.
        for pass in 0..2u8 {
            for b in 0..blocks {
                let src = vec![pass * 100 + b as u8; NT_COPY_MIN];
                a.copy_in_unfenced(b * NT_COPY_MIN, &src).unwrap();
            }
        }
        streaming_fence();
        let mut out = vec![0u8; NT_COPY_MIN];
        for b in 0..blocks {
            a.copy_out(b * NT_COPY_MIN, &mut out).unwrap();
            assert!(out.iter().all(|&x| x == 100 + b as u8), "block {b}");
        }
        assert!(a.copy_in_unfenced(a.len() - 1, b"ab").is_err());
    }
}
