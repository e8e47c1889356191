//! [`RecvBufs`]: a poll group's receive buffers, split the way SPDK posts
//! them: each receive has a fixed 64-byte command slot (the SQE lands
//! there) and, when in-capsule data is enabled, a separate in-capsule data
//! buffer as its second SGE.
//!
//! The data buffer can be *lent*: a write whose data came in the capsule
//! takes the buffer into its request and hands it to the bdev in place (no
//! copy). The command slot is free as soon as the SQE is parsed; it is
//! posted again with a fresh data buffer from the group's cache, and the
//! lent one goes back to that cache when the request responds (dropping a
//! pool buffer returns it). Buffers therefore come back out of order and
//! are bound to no slot: a slot is posted only when a buffer is at hand,
//! so the receives posted plus the buffers lent never exceed the budget.
//! A slot whose buffer was not lent keeps it and is posted again as is.

use std::sync::Arc;

use pollux_reactor::mem::{
    ArenaId, BufCache, BufPool, BufPoolOptions, DmaArena, DmaBuf, HugepageMode,
};
use pollux_verbs::Sge;

use crate::spec::cmd::SQE_SIZE;

/// Receive buffers of one poll group (see the module docs).
pub(crate) struct RecvBufs {
    /// One 64-byte command slot per receive, never lent.
    cmd: Vec<DmaBuf>,
    /// Each command slot's SGE (set with the keys).
    cmd_sges: Vec<Sge>,
    /// In-capsule data buffers: the pool (the budget), this core's cache
    /// of it, and the buffer each posted receive holds.
    data_pool: Option<BufPool>,
    data_cache: Option<BufCache>,
    data: Vec<Option<DmaBuf>>,
    /// The SGE of the buffer in each slot of `data` (valid while it is
    /// there).
    data_sges: Vec<Sge>,
    data_lkeys: Vec<(ArenaId, u32)>,
    _cmd_pool: BufPool,
}

/// Room the command slot pool keeps per receive (one SQE).
const CMD_SLOT: usize = SQE_SIZE;

impl RecvBufs {
    /// `n` receives with `data_size` bytes of in-capsule data each (0: the
    /// command slot only). Control path: allocates both pools. Register
    /// every arena of [`arenas`](Self::arenas) and pass the keys to
    /// [`set_lkeys`](Self::set_lkeys) before posting.
    pub(crate) fn new(n: usize, data_size: usize, hugepages: HugepageMode) -> Result<Self, String> {
        let mut po = BufPoolOptions::new("nvmf-rdma-cmd", CMD_SLOT, n.max(1));
        po.align = 64;
        po.cache_size = 2;
        po.hugepages = hugepages;
        let cmd_pool = BufPool::new(po).map_err(|e| e.to_string())?;
        let mut cmd = Vec::with_capacity(n);
        for _ in 0..n {
            cmd.push(cmd_pool.get().ok_or("command slot pool short")?);
        }
        let (data_pool, data_cache) = if data_size > 0 {
            let mut po = BufPoolOptions::new("nvmf-rdma-icd", data_size, n.max(1));
            po.cache_size = 64.min(n.max(2));
            po.hugepages = hugepages;
            let pool = BufPool::new(po).map_err(|e| e.to_string())?;
            let cache = BufCache::new(&pool, 0);
            (Some(pool), Some(cache))
        } else {
            (None, None)
        };
        Ok(RecvBufs {
            cmd,
            cmd_sges: Vec::new(),
            data_pool,
            data_cache,
            data: (0..n).map(|_| None).collect(),
            data_sges: vec![Sge::default(); n],
            data_lkeys: Vec::new(),
            _cmd_pool: cmd_pool,
        })
    }

    /// Number of receives (command slots).
    pub(crate) fn len(&self) -> usize {
        self.cmd.len()
    }

    /// SGEs of one receive: 2 with in-capsule data, else 1.
    pub(crate) fn sges_per_recv(&self) -> u32 {
        if self.data_pool.is_some() {
            2
        } else {
            1
        }
    }

    /// Every arena to register with the PD.
    pub(crate) fn arenas(&self) -> Vec<Arc<DmaArena>> {
        let mut v: Vec<Arc<DmaArena>> = self._cmd_pool.arenas().to_vec();
        if let Some(p) = &self.data_pool {
            v.extend(p.arenas().iter().cloned());
        }
        v
    }

    /// Local keys of the registered arenas (`lkey_of(arena)`).
    pub(crate) fn set_lkeys(&mut self, lkey_of: impl Fn(ArenaId) -> Option<u32>) {
        let cmd_lkey = self
            .cmd
            .first()
            .and_then(|b| lkey_of(b.arena_id()))
            .unwrap_or(0);
        self.cmd_sges = self
            .cmd
            .iter()
            .map(|c| Sge {
                addr: c.addr() as u64,
                length: CMD_SLOT as u32,
                lkey: cmd_lkey,
            })
            .collect();
        self.data_lkeys = self
            .data_pool
            .iter()
            .flat_map(|p| p.arenas().iter())
            .map(|a| (a.id(), lkey_of(a.id()).unwrap_or(0)))
            .collect();
    }

    /// The SGEs to post receive `id` with, written into `out`, taking a
    /// data buffer from the cache when the slot has none; how many (1 or
    /// 2), or `None` when no buffer is at hand (the caller keeps the slot
    /// pending and retries later) or `id` is unknown.
    #[inline]
    pub(crate) fn sges(&mut self, id: u32, out: &mut [Sge; 2]) -> Option<usize> {
        let i = id as usize;
        out[0] = *self.cmd_sges.get(i)?;
        let Some(cache) = &self.data_cache else {
            return Some(1);
        };
        let slot = self.data.get_mut(i)?;
        let sge = self.data_sges.get_mut(i)?;
        if slot.is_none() {
            // A fresh buffer (the last one was lent): its SGE once. A
            // buffer left in its slot keeps its SGE (nothing else puts
            // one there: a lend that fails puts the same one back).
            let mut b = cache.get()?;
            let cap = b.capacity();
            let _ = b.set_len(cap);
            let id = b.arena_id();
            let lkey = if self.data_lkeys.len() == 1 {
                self.data_lkeys[0].1
            } else {
                self.data_lkeys
                    .iter()
                    .find(|(a, _)| *a == id)
                    .map_or(0, |(_, k)| *k)
            };
            *sge = Sge {
                addr: b.addr() as u64,
                length: b.len() as u32,
                lkey,
            };
            *slot = Some(b);
        }
        out[1] = *sge;
        Some(2)
    }

    /// The SQE and the slot's data buffer of a completed receive, the
    /// buffer lendable (take it out of the `Option` to lend it).
    pub(crate) fn parts(&mut self, id: u32) -> Option<(&[u8], &mut Option<DmaBuf>)> {
        let i = id as usize;
        let c = self.cmd.get(i)?;
        let d = self.data.get_mut(i)?;
        Some((c.as_slice(), d))
    }

    /// Data buffers not lent to a request (posted, cached or in the pool).
    pub(crate) fn data_idle(&self) -> Option<usize> {
        let pool = self.data_pool.as_ref()?;
        let held = self.data.iter().filter(|d| d.is_some()).count();
        let cached = self.data_cache.as_ref().map_or(0, |c| c.cached());
        Some(held + cached + pool.available())
    }
}
