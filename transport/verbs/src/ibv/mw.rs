//! Fast registration through type-2 memory windows: the device-wide tables
//! that let a `RegMr` WR (keys only) become an `IBV_WR_BIND_MW` (object
//! pointers), and the user-space view of each window's state.
//!
//! User-space verbs have no REG_MR work request. A fast-reg "MR" of this
//! provider is a type-2 memory window (`ibv_alloc_mw`); a `RegMr` WR over a
//! virtually contiguous range of one registered MR binds it with the WR's
//! key and remote rights; LOCAL_INV or a peer's SEND_WITH_INV frees it.
//!
//! The window state kept here (free or bound, under which key) guards the
//! kernel: soft-RoCE (Linux `rxe_mw.c`) looks a window up by the key it had
//! when last bound (`ibv_mw.rkey`, which only the caller updates for type-2
//! windows), and invalidating a type-2 window that is already free makes it
//! drop references it does not hold. So the provider refuses, at post time,
//! a LOCAL_INV of a window that is not bound under that key, and a bind of a
//! window that is not free; a peer's SEND_WITH_INV frees the window when its
//! receive completion is polled (`WITH_INV` and the key).
//!
//! Lookups are hash-map reads (no allocation); the tables change only when
//! MRs and windows are created or dropped (control path).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ptr::NonNull;
use std::rc::Rc;

use rdma_sys::*;

use crate::types::Access;

/// Most SGEs one `RegMr` may merge into a window (they must be contiguous;
/// the limit only bounds the work per WR).
pub(super) const MW_MAX_SEGMENTS: u32 = 256;

/// A registered MR as a bind needs it.
#[derive(Clone, Copy)]
pub(super) struct MrEntry {
    pub(super) mr: NonNull<ibv_mr>,
    pub(super) pd: NonNull<ibv_pd>,
    /// First address of the MR (its iova).
    pub(super) start: u64,
    pub(super) len: u64,
    pub(super) access: Access,
}

/// One type-2 window: its `ibv_mw` and what user space knows of it.
pub(super) struct Window {
    // INVARIANT: allocated by `ibv_alloc_mw`, deallocated by its `IbvMr`
    // only after the entry left the table.
    pub(super) mw: NonNull<ibv_mw>,
    pub(super) pd: NonNull<ibv_pd>,
    /// The key of the last bind posted (the allocation key before any).
    pub(super) key: Cell<u32>,
    /// Bound (a bind was posted and no invalidation since).
    pub(super) bound: Cell<bool>,
    /// The bound range (meaningful while `bound`).
    pub(super) addr: Cell<u64>,
    pub(super) len: Cell<u64>,
}

impl Window {
    /// Record an invalidation of `key`; false when the window is not bound
    /// under that key.
    pub(super) fn invalidate(&self, key: u32) -> bool {
        if self.bound.get() && self.key.get() == key {
            self.bound.set(false);
            true
        } else {
            false
        }
    }

    /// Tell libibverbs the window's current key: the kernel finds a type-2
    /// window by the key of its last bind, read from `ibv_mw.rkey` at post.
    pub(super) fn publish_key(&self, key: u32) {
        // SAFETY: the window is allocated (type invariant); `rkey` is a
        // plain field of our `ibv_mw`, read by libibverbs only inside
        // `ibv_post_send` on this thread.
        unsafe { (*self.mw.as_ptr()).rkey = key };
    }
}

/// The MRs and windows of one device context.
#[derive(Default)]
pub(super) struct KeyTables {
    mrs: RefCell<HashMap<u32, MrEntry>>,
    windows: RefCell<HashMap<u32, Rc<Window>>>,
}

/// The table index of a window key (its upper 24 bits).
fn index(key: u32) -> u32 {
    key >> 8
}

impl KeyTables {
    pub(super) fn add_mr(&self, lkey: u32, e: MrEntry) {
        self.mrs.borrow_mut().insert(lkey, e);
    }

    pub(super) fn remove_mr(&self, lkey: u32) {
        self.mrs.borrow_mut().remove(&lkey);
    }

    pub(super) fn mr(&self, lkey: u32) -> Option<MrEntry> {
        self.mrs.borrow().get(&lkey).copied()
    }

    pub(super) fn add_window(&self, w: Rc<Window>) {
        let i = index(w.key.get());
        self.windows.borrow_mut().insert(i, w);
    }

    pub(super) fn remove_window(&self, key: u32) {
        self.windows.borrow_mut().remove(&index(key));
    }

    /// The window whose index bits `key` carries (any consumer byte).
    pub(super) fn window(&self, key: u32) -> Option<Rc<Window>> {
        self.windows.borrow().get(&index(key)).cloned()
    }

    /// A peer invalidated `key` (SEND_WITH_INV): free the window if it is
    /// one of ours bound under that key.
    pub(super) fn remote_invalidated(&self, key: u32) {
        if let Some(w) = self.windows.borrow().get(&index(key)) {
            w.invalidate(key);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A window over a plain (never allocated) `ibv_mw`: the tables and
    /// the state only read and write its `rkey`.
    fn window(raw: &mut ibv_mw, key: u32) -> Rc<Window> {
        raw.rkey = key;
        Rc::new(Window {
            mw: NonNull::from(raw),
            pd: NonNull::dangling(),
            key: Cell::new(key),
            bound: Cell::new(false),
            addr: Cell::new(0),
            len: Cell::new(0),
        })
    }

    #[test]
    fn windows_are_found_by_index_and_freed_by_their_key_only() {
        // SAFETY: all-zero is a valid ibv_mw (pointers and integers).
        let mut raw: ibv_mw = unsafe { std::mem::zeroed() };
        let t = KeyTables::default();
        t.add_window(window(&mut raw, 0x0100_0107));
        let w = t.window(0x0100_0108).expect("same index, other byte");
        assert!(t.window(0x0100_0207).is_none());
        assert!(
            !w.invalidate(0x0100_0107),
            "a free window is not invalidated"
        );
        w.key.set(0x0100_0108);
        w.bound.set(true);
        t.remote_invalidated(0x0100_0107);
        assert!(w.bound.get(), "an old key does not free the window");
        t.remote_invalidated(0x0100_0108);
        assert!(!w.bound.get());
        w.publish_key(0x0100_0108);
        assert_eq!(raw.rkey, 0x0100_0108);
        t.remove_window(0x0100_01ff);
        assert!(t.window(0x0100_0108).is_none());
    }

    #[test]
    fn with_inv_bits_cover_rxe_kernel_flag() {
        use crate::ibv::device::with_inv_bits;
        assert_eq!(with_inv_bits(0x02c9), ibv_wc_flags::IBV_WC_WITH_INV.0);
        assert_eq!(with_inv_bits(0x00ff_ffff), 8 | 4);
    }
}
