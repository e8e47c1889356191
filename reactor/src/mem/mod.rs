//! DMA-able memory: fd-backed hugepage arenas, buffer pools and object pools.
//!
//! - [`DmaArena`]: a memfd-backed shared mapping (2 MiB hugepages when
//!   reserved, ordinary pages with one warning per process otherwise), listed
//!   in the global [`ArenaRegistry`], whose [`subscribe`](ArenaRegistry::subscribe)
//!   hook lets a verbs provider register each arena once.
//! - [`DmaBuf`]: an exclusively owned, aligned buffer in an arena; dropping it
//!   returns it to its pool. [`SgList`]: a list of them (one inline, longer
//!   lists in a block recycled per thread).
//! - [`BufPool`] (shared, lock-free queue) and [`BufCache`] (per reactor,
//!   `!Send`, token waiters for back-pressure); [`PoolSet`]: small + large
//!   pools like SPDK's iobuf.
//! - [`ObjPool`]: fixed-capacity slab of request objects.
//! - `CountingAlloc` (feature `test-util`): a counting global allocator for
//!   the data-path rule tests (no allocation, no lock per I/O).
//!
//! ```
//! use pollux_reactor::mem::{BufCache, BufPool, BufPoolOptions, HugepageMode, SgList};
//! let mut opts = BufPoolOptions::new("doc", 4096, 8);
//! opts.hugepages = HugepageMode::Never;
//! let pool = BufPool::new(opts)?;
//! let cache = BufCache::new(&pool, 16);
//! let mut buf = cache.get().expect("pool has buffers");
//! buf.as_mut_slice()[..5].copy_from_slice(b"hello");
//! let sg = SgList::from_buf(buf);
//! assert_eq!(sg.total_len(), 4096);
//! drop(sg); // back to this thread's cache
//! assert_eq!(cache.cached() + pool.available(), 8);
//! # Ok::<(), pollux_reactor::mem::MemError>(())
//! ```

mod arena;
mod buf;
mod cache;
#[cfg(any(test, feature = "test-util"))]
mod counting_alloc;
mod error;
mod obj_pool;
mod pool;
mod pool_set;
mod registry;
mod sg_list;
pub(crate) mod tsc;

pub use arena::{
    streaming_fence, ArenaId, ArenaOptions, DmaArena, HugepageMode, HUGEPAGE_SIZE, NT_COPY_MIN,
};
pub use buf::DmaBuf;
pub use cache::{BufCache, CacheStats};
#[cfg(any(test, feature = "test-util"))]
pub use counting_alloc::{CountingAlloc, DataPathCounts};
pub use error::{MemError, MemResult};
pub use obj_pool::{ObjKey, ObjPool};
pub use pool::{BufPool, BufPoolOptions};
pub use pool_set::{PoolClass, PoolSet, PoolSetCache, PoolSetOptions};
pub use registry::{ArenaEvent, ArenaHook, ArenaRegistry, Subscription};
pub use sg_list::{SgIntoIter, SgList, SG_INLINE};
