//! `SlotTable`: the in-flight I/Os of an engine, each with a preallocated,
//! address-stable iovec array, keyed by a generation-checked `u64`.

use std::marker::PhantomData;
use std::rc::Rc;

use super::engine::{IoDone, IoKind, QueueError};
use crate::mem::SgList;

struct Slot {
    busy: bool,
    gen: u32,
    token: u64,
    bufs: SgList,
    /// `max_segs` entries, allocated once.
    iov: Box<[libc::iovec]>,
}

/// A slot just taken for an I/O: where its iovecs are.
pub(super) struct Taken {
    /// The key to put in the kernel's user data.
    pub key: u64,
    /// First iovec (stable until the slot is completed).
    pub iov: *const libc::iovec,
    /// Number of iovecs filled.
    pub nr: usize,
}

/// The in-flight table (`!Send`).
pub(super) struct SlotTable {
    // INVARIANT: a slot's `iov[..n]` describe exactly the buffers of its
    // `bufs` (owned by the slot) while `busy`; the boxed iovec arrays are
    // never reallocated, so pointers from `take` stay valid until `complete`
    // for the same key returns the buffers.
    slots: Vec<Slot>,
    free: Vec<u32>,
    _not_send: PhantomData<Rc<()>>,
}

impl SlotTable {
    /// `depth` slots of `max_segs` iovecs each (control path).
    pub(super) fn new(depth: usize, max_segs: usize) -> SlotTable {
        let empty = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        let slots = (0..depth)
            .map(|_| Slot {
                busy: false,
                gen: 0,
                token: 0,
                bufs: SgList::new(),
                iov: vec![empty; max_segs].into_boxed_slice(),
            })
            .collect();
        SlotTable {
            slots,
            free: (0..depth as u32).rev().collect(),
            _not_send: PhantomData,
        }
    }

    pub(super) fn capacity(&self) -> usize {
        self.slots.len()
    }

    pub(super) fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Take a slot for `bufs`, filling its iovecs.
    // The error hands the buffers back by value; see `IoEngine::queue`.
    #[allow(clippy::result_large_err)]
    pub(super) fn take(
        &mut self,
        kind: IoKind,
        mut bufs: SgList,
        token: u64,
    ) -> Result<Taken, QueueError> {
        let Some(&idx) = self.free.last() else {
            return Err(QueueError::Full(bufs));
        };
        let slot = &mut self.slots[idx as usize];
        if kind != IoKind::Fsync && bufs.len() > slot.iov.len() {
            return Err(QueueError::TooManySegments(bufs));
        }
        self.free.pop();
        let nr = if kind == IoKind::Fsync { 0 } else { bufs.len() };
        for (v, b) in slot.iov.iter_mut().zip(bufs.iter_mut()) {
            v.iov_base = b.as_mut_ptr().cast();
            v.iov_len = b.len();
        }
        slot.busy = true;
        slot.gen = slot.gen.wrapping_add(1);
        slot.token = token;
        slot.bufs = bufs;
        Ok(Taken {
            key: (u64::from(slot.gen) << 32) | u64::from(idx),
            iov: slot.iov.as_ptr(),
            nr,
        })
    }

    /// Forget the buffers of every busy slot (they are leaked, never reused):
    /// for an engine torn down while the kernel may still use them.
    pub(super) fn leak_busy(&mut self) {
        for s in self.slots.iter_mut().filter(|s| s.busy) {
            std::mem::forget(std::mem::take(&mut s.bufs));
            s.busy = false;
        }
        if self.free.len() < self.slots.len() {
            log::error!("io engine torn down with I/O in flight: buffers leaked");
        }
    }

    /// Finish the I/O of `key` with `res` (bytes, or a negative errno);
    /// `None` for an unknown or stale key.
    pub(super) fn complete(&mut self, key: u64, res: i64) -> Option<IoDone> {
        let idx = key as u32;
        let gen = (key >> 32) as u32;
        let slot = self.slots.get_mut(idx as usize)?;
        if !slot.busy || slot.gen != gen {
            return None;
        }
        slot.busy = false;
        self.free.push(idx);
        let result = if res < 0 {
            Err(i32::try_from(-res).unwrap_or(libc::EIO))
        } else {
            Ok(usize::try_from(res).unwrap_or(0))
        };
        Some(IoDone {
            token: slot.token,
            result,
            bufs: std::mem::take(&mut slot.bufs),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::DmaBuf;

    fn sg(n: usize) -> SgList {
        (0..n).map(|_| DmaBuf::alloc(512).unwrap()).collect()
    }

    #[test]
    fn full_and_too_many_segments_give_buffers_back() {
        let mut t = SlotTable::new(1, 2);
        match t.take(IoKind::Read, sg(3), 1) {
            Err(QueueError::TooManySegments(b)) => assert_eq!(b.len(), 3),
            _ => panic!("expected TooManySegments"),
        }
        let a = t.take(IoKind::Read, sg(2), 1).ok().unwrap();
        assert_eq!(a.nr, 2);
        assert_eq!(t.in_flight(), 1);
        match t.take(IoKind::Write, sg(1), 2) {
            Err(QueueError::Full(b)) => assert_eq!(b.len(), 1),
            _ => panic!("expected Full"),
        }
        let done = t.complete(a.key, 1024).unwrap();
        assert_eq!((done.token, done.result, done.bufs.len()), (1, Ok(1024), 2));
        assert!(t.complete(a.key, 0).is_none(), "stale key");
        assert!(t.complete(u64::MAX, 0).is_none(), "unknown key");
        let b = t.take(IoKind::Read, sg(1), 3).ok().unwrap();
        assert_ne!(a.key, b.key, "generation changes on reuse");
        assert_eq!(t.complete(b.key, -5).unwrap().result, Err(5));
    }
}
