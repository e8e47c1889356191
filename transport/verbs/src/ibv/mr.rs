//! Memory regions over DMA arenas, and fast-reg "MRs" (type-2 memory
//! windows, see [`mw`](super::mw)).

use std::ptr::NonNull;
use std::rc::Rc;
use std::sync::Arc;

use pollux_reactor::mem::DmaArena;
use rdma_sys::*;

use super::device::PdInner;
use super::last_err;
use super::mw::{MrEntry, Window};
use crate::error::VerbsError;
use crate::provider::MemoryRegion;
use crate::sig::SigError;
use crate::types::{Access, FastRegMode};

/// What an [`IbvMr`] is.
enum Kind {
    /// A registered region (`ibv_mr`) over part of an arena.
    Region {
        // INVARIANT: registered on the MR's PD, over memory of `_arena`;
        // deregistered in `drop` only.
        mr: NonNull<ibv_mr>,
        iova: u64,
        _arena: Arc<DmaArena>,
    },
    /// A type-2 memory window: the provider's fast-reg MR.
    Window(Rc<Window>),
}

/// A registered memory region (`ibv_mr`) over part of a [`DmaArena`], or a
/// fast-reg MR (a type-2 memory window, bound by `RegMr` WRs). Deregistered
/// (deallocated) on drop; keeps its PD (and its arena) alive until then.
pub struct IbvMr {
    kind: Kind,
    access: Access,
    pd: Rc<PdInner>,
}

impl std::fmt::Debug for IbvMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvMr")
            .field("window", &matches!(self.kind, Kind::Window(_)))
            .field("lkey", &self.lkey())
            .field("addr", &self.addr())
            .field("len", &self.len())
            .field("access", &self.access)
            .finish()
    }
}

impl IbvMr {
    pub(super) fn register(
        pd: &Rc<PdInner>,
        arena: &Arc<DmaArena>,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<IbvMr, VerbsError> {
        if len == 0 {
            return Err(VerbsError::InvalidArgument("MR length 0"));
        }
        if offset
            .checked_add(len)
            .map_or(true, |end| end > arena.len())
        {
            return Err(VerbsError::InvalidArgument("MR range outside the arena"));
        }
        if !access.is_consistent() {
            return Err(VerbsError::InvalidArgument(
                "REMOTE_WRITE/REMOTE_ATOMIC need LOCAL_WRITE",
            ));
        }
        let addr = arena.base_addr() + offset;
        let zero_based = access.contains(Access::ZERO_BASED);
        let iova = if zero_based { 0 } else { addr as u64 };
        // ZERO_BASED is expressed through the iova, not as a kernel flag.
        let mut flags = access.bits() & !Access::ZERO_BASED.bits();
        // Fast registration by window needs the bind right on the memory it
        // exposes; page-list registration (the verbs contract `RegMr` keeps)
        // needs none, so every window-capable MR gets it. It grants nothing
        // by itself: only a window bound by a QP of this PD, through a
        // `RegMr` its owner posts, reaches the memory.
        if matches!(pd.ctx.caps.fast_reg, FastRegMode::MemoryWindow { .. }) && !zero_based {
            flags |= Access::MW_BIND.bits();
        }
        // SAFETY: `addr..addr+len` lies inside the arena's mapping (checked
        // above), which `_arena` keeps mapped for the MR's whole life.
        let mr =
            unsafe { ibv_reg_mr_iova(pd.pd.as_ptr(), addr as *mut _, len, iova, flags as i32) };
        let mr = NonNull::new(mr).ok_or_else(|| VerbsError::sys("ibv_reg_mr", last_err()))?;
        // SAFETY: just registered.
        let lkey = unsafe { mr.as_ref().lkey };
        pd.ctx.keys.add_mr(
            lkey,
            MrEntry {
                mr,
                pd: pd.pd,
                start: iova,
                len: len as u64,
                access: Access(flags) | (access & Access::ZERO_BASED),
            },
        );
        Ok(IbvMr {
            kind: Kind::Region {
                mr,
                iova,
                _arena: arena.clone(),
            },
            access,
            pd: pd.clone(),
        })
    }

    /// A fast-reg MR: a type-2 memory window of `pd`, free until a `RegMr`
    /// binds it.
    pub(super) fn alloc_window(pd: &Rc<PdInner>) -> Result<IbvMr, VerbsError> {
        // SAFETY: live PD of an open context.
        let mw = unsafe { ibv_alloc_mw(pd.pd.as_ptr(), ibv_mw_type::IBV_MW_TYPE_2) };
        let mw = mw
            .and_then(NonNull::new)
            .ok_or_else(|| VerbsError::sys("ibv_alloc_mw", last_err()))?;
        // SAFETY: just allocated.
        let key = unsafe { mw.as_ref().rkey };
        let w = Rc::new(Window {
            mw,
            pd: pd.pd,
            key: std::cell::Cell::new(key),
            bound: std::cell::Cell::new(false),
            addr: std::cell::Cell::new(0),
            len: std::cell::Cell::new(0),
        });
        pd.ctx.keys.add_window(w.clone());
        Ok(IbvMr {
            kind: Kind::Window(w),
            access: Access::NONE,
            pd: pd.clone(),
        })
    }

    fn region(&self) -> Option<&ibv_mr> {
        match &self.kind {
            // SAFETY: registered until drop (type invariant).
            Kind::Region { mr, .. } => Some(unsafe { mr.as_ref() }),
            Kind::Window(_) => None,
        }
    }
}

impl Drop for IbvMr {
    fn drop(&mut self) {
        match &self.kind {
            Kind::Region { mr, .. } => {
                // SAFETY: registered by `register`.
                let lkey = unsafe { mr.as_ref().lkey };
                self.pd.ctx.keys.remove_mr(lkey);
                // SAFETY: registered by `register`, deregistered once, here
                // (after it left the table, so no bind can name it).
                unsafe { ibv_dereg_mr(mr.as_ptr()) };
            }
            Kind::Window(w) => {
                self.pd.ctx.keys.remove_window(w.key.get());
                // SAFETY: allocated by `alloc_window`, out of the table, and
                // deallocated once, here (a bound window is unbound by it).
                unsafe { ibv_dealloc_mw(w.mw.as_ptr()) };
            }
        }
    }
}

impl MemoryRegion for IbvMr {
    fn lkey(&self) -> u32 {
        match &self.kind {
            Kind::Region { .. } => self.region().map_or(0, |m| m.lkey),
            // A window has no local key; its key is the one of its last
            // bind (the allocation key before any), as for a fast-reg MR.
            Kind::Window(w) => w.key.get(),
        }
    }

    fn rkey(&self) -> u32 {
        match &self.kind {
            Kind::Region { .. } => self.region().map_or(0, |m| m.rkey),
            Kind::Window(w) => w.key.get(),
        }
    }

    fn addr(&self) -> u64 {
        match &self.kind {
            Kind::Region { iova, .. } => *iova,
            Kind::Window(w) => w.addr.get(),
        }
    }

    fn len(&self) -> u64 {
        match &self.kind {
            Kind::Region { .. } => self.region().map_or(0, |m| m.length as u64),
            Kind::Window(w) if w.bound.get() => w.len.get(),
            Kind::Window(_) => 0,
        }
    }

    fn access(&self) -> Access {
        self.access
    }

    fn check_sig_status(&self) -> Result<Option<SigError>, VerbsError> {
        Err(VerbsError::Unsupported("not an integrity MR"))
    }
}
