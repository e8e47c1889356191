//! Parameters of the bdev methods, with SPDK's names and defaults; the
//! server decodes them and `pollux-rpc` builds them, so both agree.
//!
//! Every parameter SPDK's method takes is accepted (so requests from
//! `spdk-rpc` and files saved by SPDK decode); values Pollux cannot honour
//! are refused with -95 (`Operation not supported`), naming the parameter.
//! `queue_depth`, `latency_us` (null), `md_interleave` (null) and
//! `direct`/`engine` (aio) are Pollux's own, optional.

use serde::{Deserialize, Serialize};

/// `bdev_malloc_create`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MallocCreate {
    /// Bdev name (default: the first free `MallocN`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Data block size in bytes (512 or 4096).
    pub block_size: u32,
    /// Number of blocks.
    pub num_blocks: u64,
    /// UUID (default: a random one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Split boundary in blocks (only 0, none, is supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimal_io_boundary: Option<u32>,
    /// Metadata bytes per block (0, 8, 16, 32, 64, 128).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub md_size: Option<u32>,
    /// Metadata interleaved with the data (default false: separate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub md_interleave: Option<bool>,
    /// Protection information type 0..3 (0: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dif_type: Option<i32>,
    /// PI in the first 8 metadata bytes (Pollux keeps it in the last 8;
    /// only true with 8-byte metadata, where both are the same).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dif_is_head_of_md: Option<bool>,
    /// Physical block size (only the block size itself is supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub physical_block_size: Option<u32>,
    /// PI format (only 0, 16-bit guard, is supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dif_pi_format: Option<u32>,
    /// NUMA node for the memory (only -1, any, is supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_id: Option<i32>,
    /// Pollux: I/Os in flight per core.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_depth: Option<u32>,
}

/// `bdev_null_create`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NullCreate {
    /// Bdev name.
    pub name: String,
    /// Data block size in bytes (512 or 4096).
    pub block_size: u32,
    /// Number of blocks.
    pub num_blocks: u64,
    /// UUID (default: a random one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Physical block size (only the block size itself is supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub physical_block_size: Option<u32>,
    /// Metadata bytes per block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub md_size: Option<u32>,
    /// Protection information type 0..3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dif_type: Option<i32>,
    /// PI format (only 0 is supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dif_pi_format: Option<u32>,
    /// PI in the first metadata bytes (see [`MallocCreate::dif_is_head_of_md`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dif_is_head_of_md: Option<bool>,
    /// Preferred write granularity (only 0 is supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_write_granularity: Option<u32>,
    /// Preferred write alignment (only 0 is supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_write_alignment: Option<u32>,
    /// Optimal write size (only 0 is supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimal_write_size: Option<u32>,
    /// Preferred unmap granularity (only 0 is supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_unmap_granularity: Option<u32>,
    /// Preferred unmap alignment (only 0 is supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_unmap_alignment: Option<u32>,
    /// Pollux: metadata interleaved with the data (default true, as SPDK's
    /// null bdev; false keeps it in separate buffers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub md_interleave: Option<bool>,
    /// Pollux: fixed completion latency in microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_us: Option<u64>,
    /// Pollux: I/Os in flight per core.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_depth: Option<u32>,
}

/// `bdev_aio_create`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AioCreate {
    /// Bdev name.
    pub name: String,
    /// The file or block device.
    pub filename: String,
    /// Block size (default 4096).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_size: Option<u32>,
    /// Read-only (not supported: only false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readonly: Option<bool>,
    /// Unmap by fallocate (not supported: only false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallocate: Option<bool>,
    /// UUID (default: a random one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// RWF_NOWAIT (not supported: only false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nowait: Option<bool>,
    /// Pollux: O_DIRECT. Absent: O_DIRECT, falling back to the page cache
    /// when the file refuses it (as SPDK does); true: O_DIRECT or fail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct: Option<bool>,
    /// Pollux: `uring`, `aio` or `auto` (default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    /// Pollux: I/Os in flight per core.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_depth: Option<u32>,
}

/// `bdev_malloc_delete`, `bdev_null_delete`, `bdev_aio_delete`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Delete {
    /// Bdev name.
    pub name: String,
}

/// `bdev_get_bdevs`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetBdevs {
    /// Only this bdev.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Milliseconds to wait for `name` to appear (0: answer at once;
    /// at most [`super::MAX_WAIT_MS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
}

/// `bdev_get_iostat`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetIostat {
    /// Only this bdev (what `spdk-rpc bdev_get_iostat -b` sends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Only these bdevs (SPDK's newer form).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub names: Option<Vec<String>>,
    /// One entry per core's channel (needs exactly one bdev).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_channel: Option<bool>,
    /// Reset after reading (only `none` is supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset_mode: Option<String>,
}
