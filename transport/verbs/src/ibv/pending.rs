//! An RDMA CM connect request detached from the core that received it
//! ([`CmId::detach`](crate::provider::CmId::detach)): the request's
//! `rdma_cm_id` and the event channel it was migrated to when it arrived
//! (`rdma_migrate_id` in `get_request`), and what the request said.
//!
//! The core that attaches it checks that the id is bound to the device it
//! opened (same device name: every core opens its own `ibv_context` of the
//! device, and librdmacm's `id->verbs` is yet another one of the same
//! device), and accepts with a QP of its own PD and CQs; librdmacm moves
//! that QP to RTR/RTS through the id, whichever thread calls.
//!
//! Dropped without being attached, it rejects the request (`rdma_reject`,
//! no private data) and destroys the id and its channel.

use std::ptr;
use std::rc::Rc;

use rdma_sys::rdma_reject;

use super::cm::{on_device, IbvCmId, RawId};
use super::device::IbvDevice;
use super::{last_err, Ibverbs};
use crate::cm::ConnRequestInfo;
use crate::error::VerbsError;
use crate::provider::PendingConn;

/// A detached RDMA CM connect request (`Send`; see the module docs).
pub struct IbvPendingConn {
    /// `None` once attached (nothing left to reject on drop).
    raw: Option<RawId>,
    request: ConnRequestInfo,
}

// SAFETY: `IbvPendingConn` owns its `rdma_cm_id` and that id's event
// channel exclusively: the `IbvCmId` it came from was consumed by `detach`,
// no QP is attached (the request is unanswered), and it holds no `Rc` or
// other handle of the core it left. Only one thread at a time can reach it
// (it is moved, never shared: it is not `Sync`). librdmacm ids and event
// channels are not bound to the thread that created them (librdmacm guards
// an id's state with its own mutex and its calls are plain `write`s to the
// ucma device), so calling `rdma_accept`/`rdma_reject`/`rdma_get_cm_event`
// on another thread after the move is the documented use.
unsafe impl Send for IbvPendingConn {}

impl std::fmt::Debug for IbvPendingConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvPendingConn")
            .field("request", &self.request)
            .finish_non_exhaustive()
    }
}

impl IbvPendingConn {
    pub(super) fn new(raw: RawId, request: ConnRequestInfo) -> IbvPendingConn {
        IbvPendingConn {
            raw: Some(raw),
            request,
        }
    }
}

impl PendingConn<Ibverbs> for IbvPendingConn {
    fn request(&self) -> &ConnRequestInfo {
        &self.request
    }

    fn attach(mut self, dev: &IbvDevice) -> Result<IbvCmId, VerbsError> {
        let on_dev = self
            .raw
            .as_ref()
            .is_some_and(|raw| on_device(raw, &dev.ctx));
        if !on_dev {
            // Dropping `self` rejects the request.
            return Err(VerbsError::InvalidArgument(
                "the request arrived on another RDMA device",
            ));
        }
        let raw = self
            .raw
            .take()
            .ok_or(VerbsError::CmState("the request was attached already"))?;
        Ok(IbvCmId::passive(raw, Rc::clone(&dev.ctx), self.request))
    }
}

impl Drop for IbvPendingConn {
    fn drop(&mut self) {
        let Some(raw) = self.raw.take() else {
            return;
        };
        // SAFETY: live id of an unanswered request, owned by us; no private
        // data (NULL, 0).
        if unsafe { rdma_reject(raw.id.as_ptr(), ptr::null(), 0) } != 0 {
            log::debug!(
                "rdma_cm: rejecting a dropped connect request: {}",
                last_err()
            );
        }
        // `raw` drops here: the id, then its channel.
    }
}
