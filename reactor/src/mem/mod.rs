//! DMA-able memory: fd-backed hugepage arenas, buffer pools and object pools.
