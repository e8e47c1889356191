//! Memory regions over DMA arenas.

use std::ptr::NonNull;
use std::rc::Rc;
use std::sync::Arc;

use pollux_reactor::mem::DmaArena;
use rdma_sys::*;

use super::device::PdInner;
use super::last_err;
use crate::error::VerbsError;
use crate::provider::MemoryRegion;
use crate::sig::SigError;
use crate::types::Access;

/// A registered memory region (`ibv_mr`) over part of a [`DmaArena`].
/// Deregistered on drop; keeps its PD and its arena alive until then.
pub struct IbvMr {
    // INVARIANT: registered on `_pd`, over memory of `_arena`; deregistered
    // in `drop` only.
    mr: NonNull<ibv_mr>,
    iova: u64,
    access: Access,
    _arena: Arc<DmaArena>,
    _pd: Rc<PdInner>,
}

impl std::fmt::Debug for IbvMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvMr")
            .field("lkey", &self.lkey())
            .field("addr", &self.iova)
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
        let flags = (access.bits() & !Access::ZERO_BASED.bits()) as i32;
        // SAFETY: `addr..addr+len` lies inside the arena's mapping (checked
        // above), which `_arena` keeps mapped for the MR's whole life.
        let mr = unsafe { ibv_reg_mr_iova(pd.pd.as_ptr(), addr as *mut _, len, iova, flags) };
        let mr = NonNull::new(mr).ok_or_else(|| VerbsError::sys("ibv_reg_mr", last_err()))?;
        Ok(IbvMr {
            mr,
            iova,
            access,
            _arena: arena.clone(),
            _pd: pd.clone(),
        })
    }

    fn raw(&self) -> &ibv_mr {
        // SAFETY: registered until drop (type invariant).
        unsafe { self.mr.as_ref() }
    }
}

impl Drop for IbvMr {
    fn drop(&mut self) {
        // SAFETY: registered by `register`, deregistered once, here.
        unsafe { ibv_dereg_mr(self.mr.as_ptr()) };
    }
}

impl MemoryRegion for IbvMr {
    fn lkey(&self) -> u32 {
        self.raw().lkey
    }

    fn rkey(&self) -> u32 {
        self.raw().rkey
    }

    fn addr(&self) -> u64 {
        self.iova
    }

    fn len(&self) -> u64 {
        self.raw().length as u64
    }

    fn access(&self) -> Access {
        self.access
    }

    fn check_sig_status(&self) -> Result<Option<SigError>, VerbsError> {
        Err(VerbsError::Unsupported("not an integrity MR"))
    }
}
