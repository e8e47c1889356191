//! Shared-memory mappings of memfds (link rings, MR tables), with bounds-
//! and alignment-checked atomic accessors. All raw memory access of the soft
//! provider's control structures goes through here.

use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

use crate::error::VerbsError;

/// A mapped memfd.
pub(crate) struct Shm {
    // INVARIANT: `base..base+len` is a live MAP_SHARED mapping of `fd` (read-
    // only when `!writable`), unmapped only in Drop; the file is sealed against
    // shrinking (checked in `map`), so every byte in range stays backed.
    fd: OwnedFd,
    base: NonNull<u8>,
    len: usize,
    writable: bool,
}

static ZERO_U64: AtomicU64 = AtomicU64::new(0);
static ZERO_U32: AtomicU32 = AtomicU32::new(0);

impl Shm {
    /// Create a zeroed, sealed (no shrink/grow) memfd of `len` bytes, mapped
    /// read/write.
    pub(crate) fn create(name: &str, len: usize) -> Result<Shm, VerbsError> {
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .map_err(|e| VerbsError::sys("memfd_create", e))?;
        rustix::fs::ftruncate(&fd, len as u64).map_err(|e| VerbsError::sys("ftruncate", e))?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(|e| VerbsError::sys("F_ADD_SEALS", e))?;
        Self::map_fd(fd, len, true)
    }

    /// Map a peer's memfd of `len` bytes; the file must have exactly that
    /// size and be sealed against shrinking.
    pub(crate) fn map(fd: OwnedFd, len: usize, writable: bool) -> Result<Shm, VerbsError> {
        let st = rustix::fs::fstat(&fd).map_err(|e| VerbsError::sys("fstat", e))?;
        if u64::try_from(st.st_size).ok() != Some(len as u64) || len == 0 {
            return Err(VerbsError::Protocol("shared memory size mismatch"));
        }
        let seals = rustix::fs::fcntl_get_seals(&fd)
            .map_err(|_| VerbsError::Protocol("shared memory not sealed"))?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err(VerbsError::Protocol("shared memory not sealed"));
        }
        Self::map_fd(fd, len, writable)
    }

    fn map_fd(fd: OwnedFd, len: usize, writable: bool) -> Result<Shm, VerbsError> {
        let prot = if writable {
            ProtFlags::READ | ProtFlags::WRITE
        } else {
            ProtFlags::READ
        };
        // SAFETY: a fresh mapping at a kernel-chosen address (null hint)
        // replaces no existing memory; `len` is the file size.
        let p =
            unsafe { rustix::mm::mmap(std::ptr::null_mut(), len, prot, MapFlags::SHARED, &fd, 0) }
                .map_err(|e| VerbsError::sys("mmap", e))?;
        let base =
            NonNull::new(p.cast::<u8>()).ok_or(VerbsError::Protocol("mmap returned null"))?;
        Ok(Shm {
            fd,
            base,
            len,
            writable,
        })
    }

    /// The memfd (to pass to the peer).
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn in_range(&self, off: usize, size: usize, align: usize) -> bool {
        off % align == 0 && off.checked_add(size).is_some_and(|e| e <= self.len)
    }

    /// The `AtomicU64` at `off`. Offsets come from the provider's own layout;
    /// a misaligned or out-of-range offset yields a detached zero (never UB).
    pub(crate) fn u64_at(&self, off: usize) -> &AtomicU64 {
        if !self.in_range(off, 8, 8) {
            return &ZERO_U64;
        }
        // SAFETY: in range and 8-aligned (the mapping is page-aligned), live
        // for `&self` (INVARIANT); atomics tolerate concurrent access by the
        // peer. Stores on a read-only mapping are never issued (see `store_ok`).
        unsafe { &*self.base.as_ptr().add(off).cast::<AtomicU64>() }
    }

    /// The `AtomicU32` at `off` (same rules as [`Shm::u64_at`]).
    pub(crate) fn u32_at(&self, off: usize) -> &AtomicU32 {
        if !self.in_range(off, 4, 4) {
            return &ZERO_U32;
        }
        // SAFETY: as in `u64_at`.
        unsafe { &*self.base.as_ptr().add(off).cast::<AtomicU32>() }
    }

    /// Copy `dst.len()` bytes out of the mapping at `off`; false if out of range.
    pub(crate) fn read_bytes(&self, off: usize, dst: &mut [u8]) -> bool {
        if !self.in_range(off, dst.len(), 1) {
            return false;
        }
        // SAFETY: source range in the live mapping (checked); `dst` is a
        // distinct local buffer. The peer may write concurrently: we copy raw
        // bytes and validate them afterwards, never form references.
        unsafe {
            std::ptr::copy_nonoverlapping(self.base.as_ptr().add(off), dst.as_mut_ptr(), dst.len())
        };
        true
    }

    /// Copy `src` into the mapping at `off`; false if out of range or read-only.
    pub(crate) fn write_bytes(&self, off: usize, src: &[u8]) -> bool {
        if !self.writable || !self.in_range(off, src.len(), 1) {
            return false;
        }
        // SAFETY: destination range in the live, writable mapping (checked).
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.base.as_ptr().add(off), src.len())
        };
        true
    }

    /// Raw pointer to `off..off+len` of the mapping, if in range.
    pub(crate) fn span(&self, off: usize, len: usize) -> Option<Span> {
        if !self.in_range(off, len, 1) {
            return None;
        }
        // SAFETY: in range of the live mapping (checked), so `add` stays inside.
        let ptr = unsafe { self.base.as_ptr().add(off) };
        Some(Span { ptr, len })
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map_fd` (INVARIANT); nothing borrows it
        // past `&self`.
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// A checked range of mapped memory (own or a peer's).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    /// First byte.
    pub(crate) ptr: *mut u8,
    /// Length.
    pub(crate) len: usize,
}

/// At most this many spans describe one side of a copy.
pub(crate) const MAX_SPANS: usize = 64;

/// A fixed-capacity list of spans (no heap allocation, and no
/// initialisation of the unused entries: creating one is free).
pub(crate) struct SpanList {
    // INVARIANT: `spans[..n]` are initialised.
    spans: [MaybeUninit<Span>; MAX_SPANS],
    n: usize,
    total: usize,
}

impl SpanList {
    pub(crate) fn new() -> Self {
        SpanList {
            spans: [const { MaybeUninit::uninit() }; MAX_SPANS],
            n: 0,
            total: 0,
        }
    }

    /// Append; false when full.
    pub(crate) fn push(&mut self, s: Span) -> bool {
        if s.len == 0 {
            return true;
        }
        if self.n == MAX_SPANS {
            return false;
        }
        self.spans[self.n].write(s);
        self.n += 1;
        self.total += s.len;
        true
    }

    /// Total bytes.
    pub(crate) fn total(&self) -> usize {
        self.total
    }

    /// The spans.
    pub(crate) fn as_slice(&self) -> &[Span] {
        // SAFETY: `spans[..n]` are initialised (INVARIANT); `MaybeUninit<Span>`
        // has the layout of `Span`.
        unsafe { std::slice::from_raw_parts(self.spans.as_ptr().cast::<Span>(), self.n) }
    }
}

/// Copy `min(dst.total, src.total, limit)` bytes from `src` to `dst`, span
/// by span. Returns the number of bytes copied.
///
/// Every span was produced by a bounds check against a live mapping (a
/// `DmaArena` or a [`Shm`]) that outlives this call.
pub(crate) fn copy_spans(dst: &SpanList, src: &SpanList, limit: usize) -> usize {
    let want = dst.total.min(src.total).min(limit);
    let (ds, ss) = (dst.as_slice(), src.as_slice());
    if let ([d], [s]) = (ds, ss) {
        // One span a side (a one-SGE SEND into a one-SGE receive): no walk.
        // SAFETY: as below; `want` is at most either span's length.
        unsafe { std::ptr::copy(s.ptr, d.ptr, want) };
        return want;
    }
    let (mut di, mut doff, mut si, mut soff, mut done) = (0, 0, 0, 0, 0);
    while done < want {
        let (d, s) = (ds[di], ss[si]);
        let n = (d.len - doff).min(s.len - soff).min(want - done);
        // SAFETY: both ranges lie inside live mappings (see above); `copy`
        // allows overlap (loopback on the same memory).
        unsafe { std::ptr::copy(s.ptr.add(soff), d.ptr.add(doff), n) };
        done += n;
        doff += n;
        soff += n;
        if doff == d.len {
            di += 1;
            doff = 0;
        }
        if soff == s.len {
            si += 1;
            soff = 0;
        }
    }
    done
}

/// A span over a [`pollux_reactor::mem::DmaArena`] range, if in bounds.
pub(crate) fn arena_span(
    arena: &pollux_reactor::mem::DmaArena,
    off: u64,
    len: u64,
) -> Option<Span> {
    let off = usize::try_from(off).ok()?;
    let len = usize::try_from(len).ok()?;
    if off.checked_add(len)? > arena.len() {
        return None;
    }
    // SAFETY: `off+len <= arena.len()` (checked), so the pointer stays inside
    // the arena's live mapping.
    let ptr = unsafe { arena.base().add(off) };
    Some(Span { ptr, len })
}

/// A sequential reader/writer over a [`SpanList`] (the slow path of
/// integrity MRs, which moves one protection interval at a time).
pub(crate) struct Cursor<'a> {
    spans: &'a [Span],
    i: usize,
    off: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(list: &'a SpanList) -> Self {
        Cursor {
            spans: list.as_slice(),
            i: 0,
            off: 0,
        }
    }

    /// Move `buf.len()` bytes between the spans and `buf` (`to_buf`: out of
    /// the spans). False (nothing more moved) when the spans run out.
    fn step(&mut self, buf: &mut [u8], ext: Option<&[u8]>) -> bool {
        let want = ext.map_or(buf.len(), <[u8]>::len);
        let mut done = 0;
        while done < want {
            let Some(s) = self.spans.get(self.i) else {
                return false;
            };
            let n = (s.len - self.off).min(want - done);
            // SAFETY: every span was bounds-checked against a live mapping
            // (a DmaArena or a Shm) that outlives the copy (see `copy_spans`);
            // `off + n <= s.len`; the local buffer is distinct memory.
            unsafe {
                let p = s.ptr.add(self.off);
                match ext {
                    Some(src) => std::ptr::copy_nonoverlapping(src.as_ptr().add(done), p, n),
                    None => std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr().add(done), n),
                }
            }
            done += n;
            self.off += n;
            if self.off == s.len {
                self.i += 1;
                self.off = 0;
            }
        }
        true
    }

    /// Read the next `buf.len()` bytes.
    pub(crate) fn read(&mut self, buf: &mut [u8]) -> bool {
        self.step(buf, None)
    }

    /// Write `src` at the cursor.
    pub(crate) fn write(&mut self, src: &[u8]) -> bool {
        self.step(&mut [], Some(src))
    }
}
