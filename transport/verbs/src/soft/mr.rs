//! Memory regions and the shared MR table.
//!
//! Each PD owns one MR table: a sealed memfd of [`MR_TABLE_ENTRIES`]
//! entries of [`MR_ENTRY_SIZE`] bytes, mapped read/write by the owner and
//! read-only by every connected peer, so a requester checks an rkey, the
//! access rights and the bounds without a round trip, then copies.
//!
//! Key format: `pd_tag << 24 | index << 8 | consumer byte`. Entry layout
//! (all little-endian atomics): `key u32 @0` (the valid key, 0 = free),
//! `access u32 @4`, `nseg u32 @8`, `kind u32 @12`, `iova u64 @16`,
//! `len u64 @24`, then up to [`MR_MAX_SEGS`] segments of
//! `{arena slot u64, arena offset u64, len u64}` from @32.
//!
//! `seq u32 @472` counts the entry's changes (see `E_SEQ`).
//!
//! Updates are seqlock-like: the owner stores key 0, bumps `seq`, a release
//! fence, the fields, then the new key with release. A reader loads the key (acquire),
//! the fields, an acquire fence, and the key again: any change means the key
//! was invalidated or re-registered meanwhile, and the access fails (no
//! retry loop).

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use pollux_reactor::mem::DmaArena;

use super::arena_slots::{slot_arena, SlotArena};
use super::pd::SoftPd;
use super::shm::{arena_span, Shm, SpanList};
use crate::error::VerbsError;
use crate::provider::MemoryRegion;
use crate::sig::{GuardType, SigAttrs, SigDomain, SigError, T10Dif};
use crate::types::Access;

/// Bytes per MR table entry.
pub const MR_ENTRY_SIZE: usize = 512;
/// Entries per PD table (index 0 is never used, so key 0 is never valid).
pub const MR_TABLE_ENTRIES: u32 = 4096;
/// Maximum segments of one MR (fast-reg scatter entries).
pub const MR_MAX_SEGS: usize = 16;

const E_KEY: usize = 0;
const E_ACCESS: usize = 4;
const E_NSEG: usize = 8;
const E_KIND: usize = 12;
const E_IOVA: usize = 16;
const E_LEN: usize = 24;
const E_SEG: usize = 32;
const SEG_SIZE: usize = 24;
/// Integrity MRs: number of data segments (the rest are PI segments).
const E_NDATA: usize = 416;
/// Integrity MRs: the check mask.
const E_CHECK: usize = 420;
/// Integrity MRs: memory domain (6 words), then wire domain (6 words).
const E_MEM: usize = 424;
const E_WIRE: usize = 448;
/// Change counter (u32), bumped by every write and invalidation of the
/// entry before its key changes: a peer that cached what a key resolves to
/// ([`super::rkey_cache`]) checks the key and this word, and so notices a
/// key that was invalidated, or freed and registered again with the same
/// value (the consumer byte wraps after 256 registrations of one index).
pub(crate) const E_SEQ: usize = 472;
const _: () = assert!(E_WIRE + 24 <= E_SEQ && E_SEQ + 4 <= MR_ENTRY_SIZE);
/// Largest protection interval an integrity MR accepts (bounce buffer).
pub(crate) const SIG_MAX_INTERVAL: u32 = 4096;

/// Kind of an MR table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MrKind {
    /// `reg_mr`: never invalidated by LOCAL_INV/SEND_WITH_INV.
    Regular = 1,
    /// Fast registration.
    FastReg = 2,
    /// Integrity (signature) MR.
    Integrity = 3,
}

/// One segment of an MR: a range of an arena slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Seg {
    pub(crate) slot: u64,
    pub(crate) off: u64,
    pub(crate) len: u64,
}

/// Why a key check failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyErr {
    /// Bad key, wrong PD, bounds or rights.
    Denied,
    /// The MR points into an arena slot this side has not mapped (yet).
    UnknownArena,
    /// A valid integrity key: take the signature path ([`resolve_sig`]).
    Integrity,
}

/// Index bits of a key.
pub(crate) fn key_index(key: u32) -> u32 {
    (key >> 8) & 0xffff
}

/// PD-tag bits of a key.
pub(crate) fn key_tag(key: u32) -> u8 {
    (key >> 24) as u8
}

pub(crate) fn entry_off(idx: u32) -> usize {
    idx as usize * MR_ENTRY_SIZE
}

/// Count one change of the entry at `e` (owner only: one writer, no RMW)
/// when a peer may have cached it: the entry is, or becomes (`new_kind`),
/// a regular MR. Fast-reg entries change on every I/O and are never
/// cached, so their changes leave the counter's cache line alone (a peer
/// would otherwise pull that line across once per I/O); any move between
/// a regular MR and anything else still counts.
fn bump_seq(t: &Shm, e: usize, new_kind: Option<MrKind>) {
    let regular = MrKind::Regular as u32;
    if t.u32_at(e + E_KIND).load(Ordering::Relaxed) != regular
        && new_kind.map(|k| k as u32) != Some(regular)
    {
        return;
    }
    let w = t.u32_at(e + E_SEQ);
    w.store(w.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
}

/// Write an entry (owner only) and make `key` valid. The MR length is the
/// sum of the segments, or `wire_len` (integrity MRs).
#[allow(clippy::too_many_arguments)]
pub(crate) fn table_write(
    t: &Shm,
    idx: u32,
    key: u32,
    access: Access,
    kind: MrKind,
    iova: u64,
    segs: &[Seg],
    wire_len: Option<u64>,
) {
    let e = entry_off(idx);
    let len: u64 = wire_len.unwrap_or_else(|| segs.iter().map(|s| s.len).sum());
    t.u32_at(e + E_KEY).store(0, Ordering::Relaxed);
    bump_seq(t, e, Some(kind));
    fence(Ordering::Release);
    t.u32_at(e + E_ACCESS)
        .store(access.bits(), Ordering::Relaxed);
    t.u32_at(e + E_NSEG)
        .store(segs.len().min(MR_MAX_SEGS) as u32, Ordering::Relaxed);
    t.u32_at(e + E_KIND).store(kind as u32, Ordering::Relaxed);
    t.u64_at(e + E_IOVA).store(iova, Ordering::Relaxed);
    t.u64_at(e + E_LEN).store(len, Ordering::Relaxed);
    for (i, s) in segs.iter().take(MR_MAX_SEGS).enumerate() {
        let so = e + E_SEG + i * SEG_SIZE;
        t.u64_at(so).store(s.slot, Ordering::Relaxed);
        t.u64_at(so + 8).store(s.off, Ordering::Relaxed);
        t.u64_at(so + 16).store(s.len, Ordering::Relaxed);
    }
    t.u32_at(e + E_KEY).store(key, Ordering::Release);
}

/// Invalidate an entry (owner only).
pub(crate) fn table_invalidate(t: &Shm, idx: u32) {
    let e = entry_off(idx);
    bump_seq(t, e, None);
    t.u32_at(e + E_KEY).store(0, Ordering::Release);
}

/// The valid key of entry `idx` (0 = free).
pub(crate) fn table_key(t: &Shm, idx: u32) -> u32 {
    t.u32_at(entry_off(idx) + E_KEY).load(Ordering::Acquire)
}

/// `(iova, len, access)` of entry `idx`.
pub(crate) fn table_info(t: &Shm, idx: u32) -> (u64, u64, Access) {
    let e = entry_off(idx);
    (
        t.u64_at(e + E_IOVA).load(Ordering::Relaxed),
        t.u64_at(e + E_LEN).load(Ordering::Relaxed),
        Access(t.u32_at(e + E_ACCESS).load(Ordering::Relaxed)),
    )
}

/// Check `key` for `[addr, addr+len)` with rights `need` in table `t` (of the
/// PD tagged `tag`) and append the memory it reaches to `out`. `arenas` maps
/// the slots named in the table to mappings on this side. Every value read
/// from the table is validated: a hostile table can only cause a denial.
#[allow(clippy::too_many_arguments)]
pub(crate) fn resolve(
    t: &Shm,
    tag: u8,
    key: u32,
    addr: u64,
    len: u64,
    need: Access,
    arenas: &[Option<SlotArena>],
    out: &mut SpanList,
) -> Result<(), KeyErr> {
    let idx = key_index(key);
    if key_tag(key) != tag || idx == 0 || idx >= MR_TABLE_ENTRIES || key == 0 {
        return Err(KeyErr::Denied);
    }
    let e = entry_off(idx);
    let k1 = t.u32_at(e + E_KEY).load(Ordering::Acquire);
    if k1 != key {
        return Err(KeyErr::Denied);
    }
    let access = Access(t.u32_at(e + E_ACCESS).load(Ordering::Relaxed));
    let nseg = t.u32_at(e + E_NSEG).load(Ordering::Relaxed) as usize;
    let iova = t.u64_at(e + E_IOVA).load(Ordering::Relaxed);
    let mlen = t.u64_at(e + E_LEN).load(Ordering::Relaxed);
    if !access.contains(need) || nseg > MR_MAX_SEGS {
        return Err(KeyErr::Denied);
    }
    if t.u32_at(e + E_KIND).load(Ordering::Relaxed) == MrKind::Integrity as u32 {
        return Err(KeyErr::Integrity);
    }
    let start = if access.contains(Access::ZERO_BASED) {
        addr
    } else {
        addr.checked_sub(iova).ok_or(KeyErr::Denied)?
    };
    if start.checked_add(len).map_or(true, |end| end > mlen) {
        return Err(KeyErr::Denied);
    }
    let (mut skip, mut left) = (start, len);
    let mut i = 0;
    while left > 0 && i < nseg {
        let so = e + E_SEG + i * SEG_SIZE;
        let slot = t.u64_at(so).load(Ordering::Relaxed);
        let soff = t.u64_at(so + 8).load(Ordering::Relaxed);
        let slen = t.u64_at(so + 16).load(Ordering::Relaxed);
        i += 1;
        if skip >= slen {
            skip -= slen;
            continue;
        }
        let n = (slen - skip).min(left);
        let arena = slot_arena(arenas, slot).ok_or(KeyErr::UnknownArena)?;
        let span = arena_span(arena, soff.checked_add(skip).ok_or(KeyErr::Denied)?, n)
            .ok_or(KeyErr::Denied)?;
        if !out.push(span) {
            return Err(KeyErr::Denied);
        }
        skip = 0;
        left -= n;
    }
    fence(Ordering::Acquire);
    if left != 0 || t.u32_at(e + E_KEY).load(Ordering::Relaxed) != k1 {
        return Err(KeyErr::Denied);
    }
    Ok(())
}

/// What a regular, one-segment MR's entry said at one moment, for a peer's
/// key cache ([`super::rkey_cache`]): valid while [`entry_unchanged`] says
/// the key and the change counter are the same.
#[derive(Debug)]
pub(crate) struct EntrySnapshot {
    /// Offset of the entry in the table.
    pub(crate) entry: usize,
    /// The change counter then.
    pub(crate) seq: u32,
    pub(crate) access: Access,
    /// The address of the MR's first byte (0 when zero-based).
    pub(crate) lo: u64,
    pub(crate) len: u64,
    /// The arena slot and offset of the MR's first byte.
    pub(crate) slot: u64,
    pub(crate) off: u64,
}

/// A consistent snapshot of `key`'s entry when it is a valid regular MR of
/// one segment (the only kind worth caching: fast-reg keys change per I/O),
/// `None` otherwise or when the entry changed while being read.
pub(crate) fn snapshot_regular(t: &Shm, tag: u8, key: u32) -> Option<EntrySnapshot> {
    let idx = key_index(key);
    if key_tag(key) != tag || idx == 0 || idx >= MR_TABLE_ENTRIES || key == 0 {
        return None;
    }
    let e = entry_off(idx);
    if t.u32_at(e + E_KEY).load(Ordering::Acquire) != key {
        return None;
    }
    // Kind first, from the entry's first cache line: a fast-reg key (new
    // per I/O) is turned away without touching the line of `E_SEQ`, which
    // its owner writes on every registration (reading it here would bounce
    // that line between the two cores once per I/O).
    if t.u32_at(e + E_KIND).load(Ordering::Relaxed) != MrKind::Regular as u32 {
        return None;
    }
    let seq = t.u32_at(e + E_SEQ).load(Ordering::Relaxed);
    if t.u32_at(e + E_KIND).load(Ordering::Relaxed) != MrKind::Regular as u32 {
        return None;
    }
    let nseg = t.u32_at(e + E_NSEG).load(Ordering::Relaxed);
    let access = Access(t.u32_at(e + E_ACCESS).load(Ordering::Relaxed));
    let iova = t.u64_at(e + E_IOVA).load(Ordering::Relaxed);
    let len = t.u64_at(e + E_LEN).load(Ordering::Relaxed);
    let slot = t.u64_at(e + E_SEG).load(Ordering::Relaxed);
    let off = t.u64_at(e + E_SEG + 8).load(Ordering::Relaxed);
    let seg_len = t.u64_at(e + E_SEG + 16).load(Ordering::Relaxed);
    fence(Ordering::Acquire);
    if !entry_unchanged(t, e, key, seq) || nseg != 1 || seg_len != len {
        return None;
    }
    Some(EntrySnapshot {
        entry: e,
        seq,
        access,
        lo: if access.contains(Access::ZERO_BASED) {
            0
        } else {
            iova
        },
        len,
        slot,
        off,
    })
}

/// Whether the entry at offset `e` still holds `key` at change count `seq`
/// (nothing in it changed since a snapshot taken at `seq`).
#[inline(always)]
pub(crate) fn entry_unchanged(t: &Shm, e: usize, key: u32, seq: u32) -> bool {
    t.u32_at(e + E_KEY).load(Ordering::Acquire) == key
        && t.u32_at(e + E_SEQ).load(Ordering::Relaxed) == seq
}

/// The segments `key` covers for `[addr, addr+len)` in the owner's table,
/// for building a fast registration out of local SGEs. Returns the number of
/// segments written into `out` (merged with `out[..n]` if contiguous).
pub(crate) fn resolve_segs(
    t: &Shm,
    tag: u8,
    key: u32,
    addr: u64,
    len: u64,
    out: &mut [Seg; MR_MAX_SEGS],
    mut n: usize,
) -> Option<usize> {
    let idx = key_index(key);
    if key_tag(key) != tag || idx == 0 || idx >= MR_TABLE_ENTRIES || table_key(t, idx) != key {
        return None;
    }
    let e = entry_off(idx);
    if t.u32_at(e + E_KIND).load(Ordering::Relaxed) == MrKind::Integrity as u32 {
        return None;
    }
    let access = Access(t.u32_at(e + E_ACCESS).load(Ordering::Relaxed));
    let nseg = (t.u32_at(e + E_NSEG).load(Ordering::Relaxed) as usize).min(MR_MAX_SEGS);
    let (iova, mlen, _) = table_info(t, idx);
    let start = if access.contains(Access::ZERO_BASED) {
        addr
    } else {
        addr.checked_sub(iova)?
    };
    if start.checked_add(len)? > mlen {
        return None;
    }
    let (mut skip, mut left) = (start, len);
    for i in 0..nseg {
        if left == 0 {
            break;
        }
        let so = e + E_SEG + i * SEG_SIZE;
        let s = Seg {
            slot: t.u64_at(so).load(Ordering::Relaxed),
            off: t.u64_at(so + 8).load(Ordering::Relaxed),
            len: t.u64_at(so + 16).load(Ordering::Relaxed),
        };
        if skip >= s.len {
            skip -= s.len;
            continue;
        }
        let take = (s.len - skip).min(left);
        let seg = Seg {
            slot: s.slot,
            off: s.off + skip,
            len: take,
        };
        if n > 0 && out[n - 1].slot == seg.slot && out[n - 1].off + out[n - 1].len == seg.off {
            out[n - 1].len += take;
        } else {
            if n == MR_MAX_SEGS {
                return None;
            }
            out[n] = seg;
            n += 1;
        }
        skip = 0;
        left -= take;
    }
    (left == 0).then_some(n)
}

/// A soft-provider memory region. Deregistered (its key invalidated and its
/// table entry freed) on drop.
pub struct SoftMr {
    pub(crate) pd: SoftPd,
    pub(crate) idx: u32,
    pub(crate) kind: MrKind,
    /// Keeps the arena of a regular MR mapped.
    pub(crate) _arena: Option<Arc<DmaArena>>,
}

impl std::fmt::Debug for SoftMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SoftMr(idx {}, {:?}, key {:#x})",
            self.idx,
            self.kind,
            self.lkey()
        )
    }
}

impl SoftMr {
    /// The key a `RegMr`/`RegMrIntegrity` WR should use next: same index,
    /// consumer byte incremented (`ib_inc_rkey`).
    pub fn next_key(&self) -> u32 {
        let k = self.lkey();
        (k & !0xff) | (k.wrapping_add(1) & 0xff)
    }
}

impl MemoryRegion for SoftMr {
    fn lkey(&self) -> u32 {
        self.pd.0.cur_key(self.idx)
    }
    fn rkey(&self) -> u32 {
        self.lkey()
    }
    fn addr(&self) -> u64 {
        table_info(&self.pd.0.table, self.idx).0
    }
    fn len(&self) -> u64 {
        if table_key(&self.pd.0.table, self.idx) == 0 {
            return 0;
        }
        table_info(&self.pd.0.table, self.idx).1
    }
    fn access(&self) -> Access {
        table_info(&self.pd.0.table, self.idx).2
    }
    fn check_sig_status(&self) -> Result<Option<SigError>, VerbsError> {
        if self.kind != MrKind::Integrity {
            return Err(VerbsError::Unsupported("not an integrity MR"));
        }
        Ok(self.pd.0.take_sig_error(self.idx))
    }
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        self.pd.0.free_mr(self.idx);
    }
}

/// Signature state of an integrity MR (owner side): the first PI error
/// found by a local copy since the last `check_sig_status`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SigState {
    pub(crate) err: Option<SigError>,
}

fn write_domain(t: &Shm, off: usize, d: &SigDomain) {
    let w = |i: usize, v: u32| t.u32_at(off + 4 * i).store(v, Ordering::Relaxed);
    match d {
        SigDomain::None => w(0, 0),
        SigDomain::T10Dif(x) => {
            w(0, 1);
            w(1, x.pi_interval);
            w(2, x.ref_tag);
            w(3, u32::from(x.bg) | (u32::from(x.app_tag) << 16));
            let flags = u32::from(x.ref_remap)
                | (u32::from(x.app_escape) << 1)
                | (u32::from(x.ref_escape) << 2)
                | (u32::from(x.bg_type == GuardType::IpCsum) << 3);
            w(4, u32::from(x.apptag_check_mask) | (flags << 16));
        }
    }
}

fn read_domain(t: &Shm, off: usize) -> Option<SigDomain> {
    let r = |i: usize| t.u32_at(off + 4 * i).load(Ordering::Relaxed);
    match r(0) {
        0 => Some(SigDomain::None),
        1 => {
            let (w3, w4) = (r(3), r(4));
            let flags = w4 >> 16;
            Some(SigDomain::T10Dif(T10Dif {
                bg_type: if flags & 8 != 0 {
                    GuardType::IpCsum
                } else {
                    GuardType::Crc
                },
                pi_interval: r(1),
                bg: w3 as u16,
                app_tag: (w3 >> 16) as u16,
                ref_tag: r(2),
                ref_remap: flags & 1 != 0,
                app_escape: flags & 2 != 0,
                ref_escape: flags & 4 != 0,
                apptag_check_mask: w4 as u16,
            }))
        }
        _ => None,
    }
}

/// Store the signature words of a free integrity entry (owner only, before
/// [`table_write`] publishes the key).
pub(crate) fn table_write_sig(t: &Shm, idx: u32, ndata: usize, sig: &SigAttrs) {
    let e = entry_off(idx);
    t.u32_at(e + E_NDATA).store(ndata as u32, Ordering::Relaxed);
    t.u32_at(e + E_CHECK)
        .store(u32::from(sig.check_mask), Ordering::Relaxed);
    write_domain(t, e + E_MEM, &sig.mem);
    write_domain(t, e + E_WIRE, &sig.wire);
}

/// The protection interval and the wire/memory block sizes of `sig`, if it
/// is one the soft provider implements (CRC guard, one interval size of at
/// most [`SIG_MAX_INTERVAL`], at least one T10-DIF domain).
pub(crate) fn sig_geometry(sig: &SigAttrs, dix: bool) -> Option<SigGeom> {
    let dif = |d: &SigDomain| match d {
        SigDomain::T10Dif(x) => Some(*x),
        SigDomain::None => None,
    };
    let (m, w) = (dif(&sig.mem), dif(&sig.wire));
    let interval = match (m, w) {
        (Some(a), Some(b)) if a.pi_interval != b.pi_interval => return None,
        (Some(a), _) | (None, Some(a)) => a.pi_interval,
        (None, None) => return None,
    };
    if interval == 0 || interval > SIG_MAX_INTERVAL {
        return None;
    }
    if [m, w].iter().flatten().any(|d| d.bg_type != GuardType::Crc) {
        return None;
    }
    let pi = crate::sig::PI_TUPLE_SIZE as u64;
    let iv = u64::from(interval);
    Some(SigGeom {
        interval: iv,
        wire_block: iv + if w.is_some() { pi } else { 0 },
        mem_block: iv + if m.is_some() && !dix { pi } else { 0 },
        dix: m.is_some() && dix,
        mem: m,
        wire: w,
    })
}

/// Sizes of an integrity MR's domains.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SigGeom {
    pub(crate) interval: u64,
    /// Bytes per interval on the wire (the MR's address space).
    pub(crate) wire_block: u64,
    /// Bytes per interval in the data buffer.
    pub(crate) mem_block: u64,
    /// Memory tuples in a separate PI buffer.
    pub(crate) dix: bool,
    pub(crate) mem: Option<T10Dif>,
    pub(crate) wire: Option<T10Dif>,
}

/// One side of a copy through an integrity MR: the memory it reaches for
/// a whole-interval wire range, and how to transform it.
pub(crate) struct SigSide {
    pub(crate) key: u32,
    pub(crate) check_mask: u8,
    pub(crate) geom: SigGeom,
    /// Index (in the MR) of the first interval of the range.
    pub(crate) first_block: u64,
    /// Wire offset of the range in the MR.
    pub(crate) wire_off: u64,
    /// Intervals in the range.
    pub(crate) blocks: u64,
    pub(crate) data: SpanList,
    pub(crate) prot: SpanList,
}

/// Append the memory of segments `segs` (a sub-list of entry `e`) for the
/// byte range `[skip, skip+len)` of their concatenation.
fn seg_spans(
    t: &Shm,
    e: usize,
    segs: std::ops::Range<usize>,
    mut skip: u64,
    mut left: u64,
    arenas: &[Option<SlotArena>],
    out: &mut SpanList,
) -> Result<(), KeyErr> {
    for i in segs {
        if left == 0 {
            break;
        }
        let so = e + E_SEG + i * SEG_SIZE;
        let slot = t.u64_at(so).load(Ordering::Relaxed);
        let soff = t.u64_at(so + 8).load(Ordering::Relaxed);
        let slen = t.u64_at(so + 16).load(Ordering::Relaxed);
        if skip >= slen {
            skip -= slen;
            continue;
        }
        let n = (slen - skip).min(left);
        let arena = slot_arena(arenas, slot).ok_or(KeyErr::UnknownArena)?;
        let span = arena_span(arena, soff.checked_add(skip).ok_or(KeyErr::Denied)?, n)
            .ok_or(KeyErr::Denied)?;
        if !out.push(span) {
            return Err(KeyErr::Denied);
        }
        skip = 0;
        left -= n;
    }
    if left == 0 {
        Ok(())
    } else {
        Err(KeyErr::Denied)
    }
}

/// Check integrity `key` for the wire range `[addr, addr+len)` with rights
/// `need` and resolve the memory behind it. The range must start and end on
/// wire interval boundaries. Every value read from the table is validated.
#[allow(clippy::too_many_arguments)]
pub(crate) fn resolve_sig(
    t: &Shm,
    tag: u8,
    key: u32,
    addr: u64,
    len: u64,
    need: Access,
    arenas: &[Option<SlotArena>],
) -> Result<SigSide, KeyErr> {
    let idx = key_index(key);
    if key_tag(key) != tag || idx == 0 || idx >= MR_TABLE_ENTRIES || key == 0 {
        return Err(KeyErr::Denied);
    }
    let e = entry_off(idx);
    let k1 = t.u32_at(e + E_KEY).load(Ordering::Acquire);
    if k1 != key || t.u32_at(e + E_KIND).load(Ordering::Relaxed) != MrKind::Integrity as u32 {
        return Err(KeyErr::Denied);
    }
    let access = Access(t.u32_at(e + E_ACCESS).load(Ordering::Relaxed));
    let nseg = t.u32_at(e + E_NSEG).load(Ordering::Relaxed) as usize;
    let ndata = t.u32_at(e + E_NDATA).load(Ordering::Relaxed) as usize;
    let iova = t.u64_at(e + E_IOVA).load(Ordering::Relaxed);
    let mlen = t.u64_at(e + E_LEN).load(Ordering::Relaxed);
    let check_mask = t.u32_at(e + E_CHECK).load(Ordering::Relaxed) as u8;
    if !access.contains(need) || nseg > MR_MAX_SEGS || ndata > nseg || ndata == 0 {
        return Err(KeyErr::Denied);
    }
    let sig = SigAttrs {
        check_mask,
        mem: read_domain(t, e + E_MEM).ok_or(KeyErr::Denied)?,
        wire: read_domain(t, e + E_WIRE).ok_or(KeyErr::Denied)?,
        meta_length: 0,
    };
    let geom = sig_geometry(&sig, nseg > ndata).ok_or(KeyErr::Denied)?;
    let start = if access.contains(Access::ZERO_BASED) {
        addr
    } else {
        addr.checked_sub(iova).ok_or(KeyErr::Denied)?
    };
    if start.checked_add(len).map_or(true, |end| end > mlen)
        || start % geom.wire_block != 0
        || len % geom.wire_block != 0
    {
        return Err(KeyErr::Denied);
    }
    let (b0, nb) = (start / geom.wire_block, len / geom.wire_block);
    let mut side = SigSide {
        key,
        check_mask,
        geom,
        first_block: b0,
        wire_off: start,
        blocks: nb,
        data: SpanList::new(),
        prot: SpanList::new(),
    };
    let pi = crate::sig::PI_TUPLE_SIZE as u64;
    let mb = geom.mem_block;
    seg_spans(t, e, 0..ndata, b0 * mb, nb * mb, arenas, &mut side.data)?;
    if geom.dix {
        seg_spans(t, e, ndata..nseg, b0 * pi, nb * pi, arenas, &mut side.prot)?;
    }
    fence(Ordering::Acquire);
    if t.u32_at(e + E_KEY).load(Ordering::Relaxed) != k1 {
        return Err(KeyErr::Denied);
    }
    Ok(side)
}
