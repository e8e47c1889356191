//! Protection domains: own the MR table and create MRs, SRQs and QPs.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use pollux_reactor::mem::DmaArena;

use super::arena_slots::slot_arena;
use super::device::SoftDevice;
use super::mr::{
    resolve, resolve_segs, resolve_sig, sig_geometry, table_invalidate, table_key, table_write,
    table_write_sig, KeyErr, MrKind, Seg, SigSide, SigState, SoftMr, MR_ENTRY_SIZE, MR_MAX_SEGS,
    MR_TABLE_ENTRIES,
};
use super::qp::SoftQp;
use super::shm::{arena_span, Shm, Span, SpanList};
use super::srq::SoftSrq;
use super::Soft;
use crate::error::VerbsError;
use crate::provider::{ProtectionDomain, QpInit};
use crate::sig::{SigAttrs, SigError};
use crate::types::{Access, Sge};

/// A soft protection domain.
#[derive(Clone)]
pub struct SoftPd(pub(crate) Rc<PdInner>);

#[derive(Clone, Copy)]
struct LocalEntry {
    in_use: bool,
    kind: MrKind,
    max_segs: u32,
    cur_key: u32,
    sig: SigState,
}

/// The owner's private copy of a regular (one-segment, never invalidated
/// by the peer) MR: local keys are checked against it without touching the
/// shared table (no atomics, no seqlock). Key 0 = not a regular MR.
#[derive(Clone, Copy, Default)]
struct FastMr {
    key: u32,
    access: Access,
    iova: u64,
    len: u64,
    slot: u64,
    off: u64,
}

/// A regular MR's key resolved once and kept by a QP across batches
/// ([`PdInner::resolve_local_cached`]): valid while its PD's key generation
/// (bumped whenever a regular MR is registered or freed) is unchanged.
#[derive(Clone, Copy)]
pub(crate) struct LocalKey {
    key: u32,
    /// The PD's key generation when it was resolved.
    gen: u64,
    access: Access,
    /// The first address (0 for zero-based MRs).
    lo: u64,
    len: u64,
    /// Where byte 0 of the MR is mapped (checked inside its arena).
    base: *mut u8,
}

/// The local keys a QP direction used last (newest first), kept across
/// posts and polls. Two entries: a responder's receives often name two MRs
/// (a command buffer and a data buffer, as the NVMe-oF target's capsule +
/// in-capsule data receives), and a requester alternates between a
/// response buffer's MR and a data MR; a single entry would miss on every
/// SGE of such a pattern.
#[derive(Clone, Copy, Default)]
pub(crate) struct KeyCache([Option<LocalKey>; 2]);

impl KeyCache {
    /// Forget every key (keys may change: fast registration, invalidation).
    pub(crate) fn clear(&mut self) {
        self.0 = [None, None];
    }

    /// The cached entry for `key` at generation `gen`.
    #[inline(always)]
    fn find(&self, key: u32, gen: u64) -> Option<&LocalKey> {
        self.0
            .iter()
            .flatten()
            .find(|c| c.key == key && c.gen == gen)
    }

    /// Make `k` the newest entry.
    fn insert(&mut self, k: LocalKey) {
        self.0[1] = self.0[0];
        self.0[0] = Some(k);
    }
}

impl LocalKey {
    /// The memory of `sge` if it is inside the MR and `need` is granted.
    #[inline(always)]
    fn span(&self, sge: &Sge, need: Access) -> Option<Span> {
        let len = u64::from(sge.length);
        let start = sge.addr.checked_sub(self.lo)?;
        if !self.access.contains(need) || start.checked_add(len)? > self.len {
            return None;
        }
        // SAFETY: `start + len <= self.len` and `[base, base + self.len)` is
        // inside the MR's arena mapping (checked by `arena_span` when the key
        // was resolved). Callers use a `LocalKey` only while the PD's key
        // generation is the one it was resolved at, i.e. the MR was not
        // freed, and a live MR holds its arena (the mapping) alive.
        let ptr = unsafe { self.base.add(start as usize) };
        Some(Span {
            ptr,
            len: len as usize,
        })
    }
}

pub(crate) struct PdInner {
    pub(crate) dev: SoftDevice,
    pub(crate) tag: u8,
    /// The shared MR table (peers map it read-only).
    pub(crate) table: Shm,
    local: RefCell<Vec<LocalEntry>>,
    fast: RefCell<Vec<FastMr>>,
    free: RefCell<Vec<u32>>,
    /// Bumped whenever `fast` changes (a regular MR registered or freed):
    /// a cached [`LocalKey`] of an older generation is never used.
    key_gen: Cell<u64>,
}

impl SoftPd {
    pub(crate) fn new(dev: &SoftDevice) -> Result<SoftPd, VerbsError> {
        let table = Shm::create(
            "pollux-soft-mrtable",
            MR_TABLE_ENTRIES as usize * MR_ENTRY_SIZE,
        )?;
        let blank = LocalEntry {
            in_use: false,
            kind: MrKind::Regular,
            max_segs: 0,
            cur_key: 0,
            sig: SigState::default(),
        };
        Ok(SoftPd(Rc::new(PdInner {
            dev: dev.clone(),
            tag: dev.0.next_tag(),
            table,
            local: RefCell::new(vec![blank; MR_TABLE_ENTRIES as usize]),
            fast: RefCell::new(vec![FastMr::default(); MR_TABLE_ENTRIES as usize]),
            free: RefCell::new((1..MR_TABLE_ENTRIES).rev().collect()),
            key_gen: Cell::new(0),
        })))
    }

    fn alloc_entry(&self, kind: MrKind, max_segs: u32) -> Result<u32, VerbsError> {
        let idx = self
            .0
            .free
            .borrow_mut()
            .pop()
            .ok_or(VerbsError::Limit("MR table full"))?;
        let mut l = self.0.local.borrow_mut();
        let e = &mut l[idx as usize];
        e.in_use = true;
        e.kind = kind;
        e.max_segs = max_segs;
        e.cur_key = (u32::from(self.0.tag) << 24) | (idx << 8) | (e.cur_key & 0xff);
        e.sig = SigState::default();
        Ok(idx)
    }

    fn alloc_special(&self, max_segments: u32, kind: MrKind) -> Result<SoftMr, VerbsError> {
        if max_segments == 0 || max_segments as usize > MR_MAX_SEGS {
            return Err(VerbsError::InvalidArgument("max_segments out of range"));
        }
        self.0.dev.0.expose_all();
        let idx = self.alloc_entry(kind, max_segments)?;
        Ok(SoftMr {
            pd: self.clone(),
            idx,
            kind,
            _arena: None,
        })
    }
}

impl PdInner {
    pub(crate) fn cur_key(&self, idx: u32) -> u32 {
        self.local
            .borrow()
            .get(idx as usize)
            .map_or(0, |e| e.cur_key)
    }

    pub(crate) fn free_mr(&self, idx: u32) {
        table_invalidate(&self.table, idx);
        let regular_slot = self.fast.borrow_mut().get_mut(idx as usize).and_then(|f| {
            let slot = (f.key != 0).then_some(f.slot);
            f.key = 0;
            slot
        });
        if let Some(slot) = regular_slot {
            self.dev.0.release_slot(slot);
        }
        self.key_gen.set(self.key_gen.get().wrapping_add(1));
        if let Some(e) = self.local.borrow_mut().get_mut(idx as usize) {
            e.in_use = false;
            // Bump the consumer byte so a stale key never matches again.
            e.cur_key = e.cur_key.wrapping_add(1) & 0xff;
        }
        self.free.borrow_mut().push(idx);
    }

    /// The first PI error of integrity MR `idx`: found by a local copy, or
    /// reported by a peer that copied through it (scans the device's
    /// connections; no allocation).
    pub(crate) fn take_sig_error(&self, idx: u32) -> Option<SigError> {
        let local = self
            .local
            .borrow_mut()
            .get_mut(idx as usize)
            .and_then(|e| e.sig.err.take());
        if local.is_some() {
            return local;
        }
        // Walked in place, not cloned (this runs once per protected I/O): an
        // upgraded connection is also held elsewhere, so dropping it here
        // never runs a connection's teardown under this borrow.
        let conns = self.dev.0.conns.borrow();
        conns
            .iter()
            .filter_map(std::rc::Weak::upgrade)
            .filter_map(|c| c.link())
            .find_map(|l| l.take_sig_error(idx))
    }

    /// [`PdInner::resolve_local`] through a key cache: a regular MR's key
    /// resolved before (by this batch or an earlier one, as long as no
    /// regular MR of the PD was registered or freed since) is checked
    /// against `cache` (bounds and rights; no table, no `RefCell`). Keys the
    /// fast path does not know (fast-reg and integrity MRs, unknown keys)
    /// take the full path, so failures and their statuses are unchanged.
    ///
    /// The cached span base stays mapped: the MR holds its arena until it
    /// is freed, and freeing it bumps the key generation.
    #[inline(always)]
    pub(crate) fn resolve_local_cached(
        &self,
        sge: &Sge,
        need: Access,
        out: &mut SpanList,
        cache: &mut KeyCache,
    ) -> bool {
        match self.span_cached(sge, need, cache) {
            Some(span) => out.push(span),
            None => self.resolve_local(sge, need, out),
        }
    }

    /// The memory of `sge` if its key is a regular MR of this PD, in
    /// bounds and granting `need` (through `cache`, see
    /// [`PdInner::resolve_local_cached`]); `None` otherwise (the caller
    /// takes the full path, which reports the precise error).
    #[inline(always)]
    pub(crate) fn span_cached(
        &self,
        sge: &Sge,
        need: Access,
        cache: &mut KeyCache,
    ) -> Option<Span> {
        if let Some(c) = cache.find(sge.lkey, self.key_gen.get()) {
            return c.span(sge, need);
        }
        self.key_miss(sge, need, cache)
    }

    /// [`PdInner::span_cached`] without a usable cached key.
    #[inline(never)]
    fn key_miss(&self, sge: &Sge, need: Access, cache: &mut KeyCache) -> Option<Span> {
        let c = self.local_key(sge.lkey)?;
        cache.insert(c);
        c.span(sge, need)
    }

    /// A regular MR's key, resolved once for [`PdInner::resolve_local_cached`].
    fn local_key(&self, key: u32) -> Option<LocalKey> {
        let slots = self.dev.0.slots.borrow();
        let fast = self.fast.borrow();
        let f = fast
            .get(super::mr::key_index(key) as usize)
            .filter(|f| f.key == key)?;
        let arena = slot_arena(&slots, f.slot)?;
        let whole = arena_span(arena, f.off, f.len)?;
        Some(LocalKey {
            key,
            gen: self.key_gen.get(),
            access: f.access,
            lo: if f.access.contains(Access::ZERO_BASED) {
                0
            } else {
                f.iova
            },
            len: f.len,
            base: whole.ptr,
        })
    }

    /// Check a local SGE and append its memory to `out` (data path).
    pub(crate) fn resolve_local(&self, sge: &Sge, need: Access, out: &mut SpanList) -> bool {
        let slots = self.dev.0.slots.borrow();
        let idx = super::mr::key_index(sge.lkey) as usize;
        if let Some(f) = self.fast.borrow().get(idx).filter(|f| f.key == sge.lkey) {
            let start = if f.access.contains(Access::ZERO_BASED) {
                Some(sge.addr)
            } else {
                sge.addr.checked_sub(f.iova)
            };
            let len = u64::from(sge.length);
            let span = start
                .filter(|s| s.checked_add(len).is_some_and(|e| e <= f.len))
                .filter(|_| f.access.contains(need))
                .and_then(|s| {
                    let arena = slot_arena(&slots, f.slot)?;
                    arena_span(arena, f.off + s, len)
                });
            return span.is_some_and(|sp| out.push(sp));
        }
        matches!(
            resolve(
                &self.table,
                self.tag,
                sge.lkey,
                sge.addr,
                u64::from(sge.length),
                need,
                &slots,
                out
            ),
            Ok(())
        )
    }

    /// Invalidate an invalidatable (fast-reg/integrity) key. Errors when the
    /// key is not one, is free, or its consumer byte does not match.
    pub(crate) fn invalidate(&self, key: u32) -> Result<(), KeyErr> {
        let idx = super::mr::key_index(key);
        if super::mr::key_tag(key) != self.tag || idx == 0 || idx >= MR_TABLE_ENTRIES {
            return Err(KeyErr::Denied);
        }
        let kind = self.local.borrow()[idx as usize].kind;
        let in_use = self.local.borrow()[idx as usize].in_use;
        if !in_use || kind == MrKind::Regular || table_key(&self.table, idx) != key {
            return Err(KeyErr::Denied);
        }
        table_invalidate(&self.table, idx);
        Ok(())
    }

    /// Fast registration (REG_MR / REG_MR_INTEGRITY) executed from the SQ.
    /// For REG_MR_INTEGRITY the last `nprot` SGEs are the PI (DIX) list.
    pub(crate) fn fast_reg(
        &self,
        key: u32,
        iova: u64,
        access: Access,
        sges: &[Sge],
        sig: Option<SigAttrs>,
        nprot: usize,
    ) -> Result<(), KeyErr> {
        let idx = super::mr::key_index(key);
        if super::mr::key_tag(key) != self.tag || idx == 0 || idx >= MR_TABLE_ENTRIES {
            return Err(KeyErr::Denied);
        }
        let e = self.local.borrow()[idx as usize];
        let want = if sig.is_some() {
            MrKind::Integrity
        } else {
            MrKind::FastReg
        };
        if !e.in_use
            || e.kind != want
            || table_key(&self.table, idx) != 0
            || sges.len() > e.max_segs as usize + nprot
            || nprot > sges.len()
            || !access.is_consistent()
        {
            return Err(KeyErr::Denied);
        }
        let (data, prot) = sges.split_at(sges.len() - nprot);
        let mut segs = [Seg::default(); MR_MAX_SEGS];
        let n = self.segs_of(data, &mut segs)?;
        let mut wire_len = None;
        let mut total = n;
        if let Some(sig) = &sig {
            let geom = sig_geometry(sig, !prot.is_empty()).ok_or(KeyErr::Denied)?;
            let data_len: u64 = segs[..n].iter().map(|s| s.len).sum();
            if data_len == 0 || data_len % geom.mem_block != 0 {
                return Err(KeyErr::Denied);
            }
            let blocks = data_len / geom.mem_block;
            if geom.dix {
                let mut psegs = [Seg::default(); MR_MAX_SEGS];
                let np = self.segs_of(prot, &mut psegs)?;
                let plen: u64 = psegs[..np].iter().map(|s| s.len).sum();
                if plen < blocks * crate::sig::PI_TUPLE_SIZE as u64 || n + np > MR_MAX_SEGS {
                    return Err(KeyErr::Denied);
                }
                segs[n..n + np].copy_from_slice(&psegs[..np]);
                total = n + np;
            }
            wire_len = Some(blocks * geom.wire_block);
            table_write_sig(&self.table, idx, n, sig);
        }
        table_write(
            &self.table,
            idx,
            key,
            access,
            want,
            iova,
            &segs[..total],
            wire_len,
        );
        let mut l = self.local.borrow_mut();
        l[idx as usize].cur_key = key;
        l[idx as usize].sig = SigState { err: None };
        Ok(())
    }

    fn segs_of(&self, sges: &[Sge], segs: &mut [Seg; MR_MAX_SEGS]) -> Result<usize, KeyErr> {
        let mut n = 0;
        for s in sges {
            n = resolve_segs(
                &self.table,
                self.tag,
                s.lkey,
                s.addr,
                u64::from(s.length),
                segs,
                n,
            )
            .ok_or(KeyErr::Denied)?;
        }
        Ok(n)
    }

    /// Remember the first PI error of a local copy through integrity MR
    /// `key` (reported by `check_sig_status`).
    pub(crate) fn record_sig_error(&self, err: SigError) {
        let idx = super::mr::key_index(err.key) as usize;
        if let Some(e) = self.local.borrow_mut().get_mut(idx) {
            if e.in_use && e.kind == MrKind::Integrity && e.sig.err.is_none() {
                e.sig.err = Some(err);
            }
        }
    }

    /// The signature side of a local SGE over an integrity MR.
    pub(crate) fn resolve_local_sig(&self, sge: &Sge, need: Access) -> Option<SigSide> {
        let slots = self.dev.0.slots.borrow();
        resolve_sig(
            &self.table,
            self.tag,
            sge.lkey,
            sge.addr,
            u64::from(sge.length),
            need,
            &slots,
        )
        .ok()
    }
}

impl ProtectionDomain<Soft> for SoftPd {
    fn reg_mr(
        &self,
        arena: &Arc<DmaArena>,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<SoftMr, VerbsError> {
        if len == 0 {
            return Err(VerbsError::InvalidArgument("MR length is zero"));
        }
        if !access.is_consistent() {
            return Err(VerbsError::InvalidArgument(
                "REMOTE_WRITE/REMOTE_ATOMIC require LOCAL_WRITE",
            ));
        }
        if offset.checked_add(len).exceeds(arena.len()) {
            return Err(VerbsError::NotInArena {
                addr: (arena.base_addr() as u64).wrapping_add(offset as u64),
                len: len as u64,
            });
        }
        let slot = self
            .0
            .dev
            .0
            .slot_for(arena, access.intersects(Access::REMOTE_ANY));
        let idx = self.alloc_entry(MrKind::Regular, 1)?;
        let key = self.0.cur_key(idx);
        let iova = if access.contains(Access::ZERO_BASED) {
            0
        } else {
            (arena.base_addr() + offset) as u64
        };
        let seg = Seg {
            slot,
            off: offset as u64,
            len: len as u64,
        };
        table_write(
            &self.0.table,
            idx,
            key,
            access,
            MrKind::Regular,
            iova,
            &[seg],
            None,
        );
        self.0.fast.borrow_mut()[idx as usize] = FastMr {
            key,
            access,
            iova,
            len: len as u64,
            slot,
            off: offset as u64,
        };
        self.0.key_gen.set(self.0.key_gen.get().wrapping_add(1));
        Ok(SoftMr {
            pd: self.clone(),
            idx,
            kind: MrKind::Regular,
            _arena: Some(arena.clone()),
        })
    }

    fn alloc_fast_reg_mr(&self, max_segments: u32) -> Result<SoftMr, VerbsError> {
        self.alloc_special(max_segments, MrKind::FastReg)
    }

    fn alloc_integrity_mr(&self, max_segments: u32) -> Result<SoftMr, VerbsError> {
        self.alloc_special(max_segments, MrKind::Integrity)
    }

    fn create_srq(&self, max_wr: u32, max_sge: u32) -> Result<SoftSrq, VerbsError> {
        SoftSrq::new(self, max_wr, max_sge)
    }

    fn create_qp(&self, init: &QpInit<'_, Soft>) -> Result<SoftQp, VerbsError> {
        SoftQp::new(self, init)
    }
}

trait GtExt {
    fn exceeds(self, limit: usize) -> bool;
}

impl GtExt for Option<usize> {
    fn exceeds(self, limit: usize) -> bool {
        self.map_or(true, |v| v > limit)
    }
}
