//! [`MrTable`]: memory regions of whole arenas, found by arena id (a
//! poll group registers its receive buffers and its target's data pools
//! once; a connection registers a stray arena on first use).

use std::sync::Arc;

use pollux_reactor::mem::{ArenaId, DmaArena};

use crate::provider::{MemoryRegion, ProtectionDomain, Provider};
use crate::types::Access;
use crate::VerbsError;

/// Memory regions by arena (a few entries: a linear scan).
pub struct MrTable<P: Provider>(Vec<(ArenaId, P::Mr)>);

impl<P: Provider> std::fmt::Debug for MrTable<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(a, _)| a))
            .finish()
    }
}

impl<P: Provider> Default for MrTable<P> {
    fn default() -> Self {
        MrTable(Vec::new())
    }
}

impl<P: Provider> MrTable<P> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// The local key of arena `id`, if registered here.
    #[inline]
    pub fn lkey(&self, id: ArenaId) -> Option<u32> {
        self.0.iter().find(|(a, _)| *a == id).map(|(_, m)| m.lkey())
    }

    /// Register all of `arena` for local writes in `pd`, unless it is
    /// already; its local key.
    ///
    /// # Errors
    /// What `reg_mr` returned.
    pub fn register(&mut self, pd: &P::Pd, arena: &Arc<DmaArena>) -> Result<u32, VerbsError> {
        if let Some(k) = self.lkey(arena.id()) {
            return Ok(k);
        }
        let mr = pd.reg_mr(arena, 0, arena.len(), Access::LOCAL_WRITE)?;
        let k = mr.lkey();
        self.0.push((arena.id(), mr));
        Ok(k)
    }
}
