//! [`RdmaOptions`]: the RDMA transport's knobs, with SPDK's names and
//! defaults, and the one place that sizes queues, CQs and receive pools.

use super::super::target::TargetOptions;

/// RDMA transport options (SPDK `nvmf_create_transport -t RDMA` names).
/// Queue depth, I/O size, I/O unit size, in-capsule data size and the
/// shared data buffer pool are the target's ([`TargetOptions`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaOptions {
    /// Verbs device to open; `None`: the provider's first device.
    pub device: Option<String>,
    /// Per-QP receive queues instead of one shared receive queue per poll
    /// group (SPDK `no_srq`).
    pub no_srq: bool,
    /// Receive buffers of each poll group's SRQ (SPDK `max_srq_depth`,
    /// default 4096). Without an SRQ: the receive buffer budget of a poll
    /// group, from which each queue takes its depth.
    pub max_srq_depth: u32,
    /// Completion queue entries of each poll group (one CQ per device per
    /// poll group, shared by its queues; admission control keeps it from
    /// overflowing).
    pub num_cqe: u32,
    /// Answer keyed SGLs that ask for remote invalidation with
    /// SEND_WITH_INVALIDATE (turn off for testing, or for devices that
    /// misreport support).
    pub send_with_invalidate: bool,
    /// Listen backlog (SPDK `acceptor_backlog`).
    pub acceptor_backlog: u32,
    /// Most RDMA READs in flight per queue (capped by what the host offers
    /// and the device's `max_qp_init_rd_atom`).
    pub max_read_depth: u8,
    /// Hugepages for the receive buffers (like the target's data pool).
    pub hugepages: pollux_reactor::mem::HugepageMode,
    /// Which poll group (core) serves a new queue.
    pub placement: QueuePlacement,
    /// Most queue pairs (admin and I/O, all hosts) the transport serves at
    /// once; a connect request beyond it is rejected with the NVMe/RDMA CM
    /// status "no resources" before it takes any resource.
    pub max_qpairs: usize,
    /// Most queue pairs one poll group (core) serves at once; with
    /// [`QueuePlacement::LeastConnections`] a full group's requests go to
    /// another group, and are rejected like [`max_qpairs`](Self::max_qpairs)
    /// when every group is full.
    pub max_qpairs_per_core: usize,
}

/// Where the RDMA transport puts a new queue (connection): the placement
/// policy shared with the iSER target ([`pollux_verbs::placement`]).
/// With [`QueuePlacement::LeastConnections`] (the default) the admin and
/// I/O queues of one controller may live on different cores.
pub use pollux_verbs::placement::PlacementPolicy as QueuePlacement;

impl Default for RdmaOptions {
    fn default() -> Self {
        RdmaOptions {
            device: None,
            no_srq: false,
            max_srq_depth: 4096,
            num_cqe: 32768,
            send_with_invalidate: true,
            acceptor_backlog: 100,
            max_read_depth: 16,
            hugepages: pollux_reactor::mem::HugepageMode::Auto,
            placement: QueuePlacement::LeastConnections,
            max_qpairs: 1024,
            max_qpairs_per_core: 1024,
        }
    }
}

/// Why a combination of options cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid RDMA transport options: {0}")]
pub struct OptionsError(pub String);

impl RdmaOptions {
    /// Small pools and ordinary pages, for tests.
    pub fn for_tests() -> Self {
        RdmaOptions {
            max_srq_depth: 256,
            num_cqe: 8192,
            hugepages: pollux_reactor::mem::HugepageMode::Never,
            ..RdmaOptions::default()
        }
    }

    /// Bytes of one receive buffer: the 64-byte SQE plus in-capsule data.
    pub fn recv_buf_size(t: &TargetOptions) -> usize {
        64 + t.in_capsule_data_size as usize
    }

    /// Send work requests one queue needs at `depth`: per request one
    /// response SEND plus its data WRs (one per `max_sge` data buffers),
    /// plus one spare.
    pub fn send_wrs_per_queue(t: &TargetOptions, depth: u16, max_sge: u32) -> u32 {
        let units = t.max_io_size.div_ceil(t.io_unit_size.max(1)).max(1);
        let data_wrs = units.div_ceil(max_sge.max(1)).max(1);
        u32::from(depth) * (1 + data_wrs) + 1
    }

    /// Requests (and so response slots) one queue of `depth` entries
    /// gets: one and a half times the depth. A request stays busy after its response is
    /// posted until a signaled SEND at or after it completes, while the
    /// host, which has read the response, already reuses the command
    /// slot: with only `depth` requests its next capsule would wait for
    /// that completion (in the backlog, a poll round later). (Twice the
    /// depth measured the same at 512 B and 1-2 % slower at 4 KiB: more
    /// buffers in use.)
    pub fn requests_per_queue(depth: u16) -> u16 {
        depth.saturating_add(depth / 2)
    }

    /// CQ entries one queue reserves in its poll group's CQ: its receives
    /// (without SRQ) and the send queue of
    /// [`requests_per_queue`](Self::requests_per_queue) requests.
    pub fn cqes_per_queue(&self, t: &TargetOptions, depth: u16, max_sge: u32) -> u32 {
        let recv = if self.no_srq { u32::from(depth) } else { 0 };
        recv + Self::send_wrs_per_queue(t, Self::requests_per_queue(depth), max_sge)
    }

    /// Check the combination with the target's options.
    ///
    /// # Errors
    ///
    /// [`OptionsError`] naming the options that conflict.
    pub fn validate(&self, t: &TargetOptions) -> Result<(), OptionsError> {
        let depth = u32::from(t.max_queue_depth);
        if self.max_srq_depth < depth {
            return Err(OptionsError(format!(
                "max_srq_depth ({}) must be at least max_queue_depth ({depth}): one queue's receives must fit",
                self.max_srq_depth
            )));
        }
        if self.max_qpairs == 0 || self.max_qpairs_per_core == 0 {
            return Err(OptionsError(
                "max_qpairs and max_qpairs_per_core must be positive".into(),
            ));
        }
        let srq = if self.no_srq { 0 } else { self.max_srq_depth };
        let one = self.cqes_per_queue(t, t.max_queue_depth, 1) + srq;
        if self.num_cqe < one {
            return Err(OptionsError(format!(
                "num_cqe ({}) cannot hold one queue of max_queue_depth {depth} (needs {one} with max_srq_depth {srq})",
                self.num_cqe
            )));
        }
        if t.in_capsule_data_size > 0 && t.in_capsule_data_size < 256 {
            return Err(OptionsError(
                "in_capsule_data_size must be 0 or at least 256 (16 SGL descriptors)".into(),
            ));
        }
        let per_io = t.max_io_size.div_ceil(t.io_unit_size.max(1)) as usize;
        if t.num_data_buffers < per_io {
            return Err(OptionsError(format!(
                "num_shared_buffers ({}) cannot hold one I/O of max_io_size {} in io_unit_size {} buffers ({per_io} needed)",
                t.num_data_buffers, t.max_io_size, t.io_unit_size
            )));
        }
        if self.max_read_depth == 0 {
            return Err(OptionsError("max_read_depth must be at least 1".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_combinations_are_named() {
        let t = TargetOptions::default();
        RdmaOptions::default().validate(&t).expect("defaults");
        let o = RdmaOptions {
            max_srq_depth: 64,
            ..RdmaOptions::default()
        };
        let e = o.validate(&t).unwrap_err().to_string();
        assert!(e.contains("max_srq_depth"), "{e}");
        let o = RdmaOptions {
            num_cqe: 128,
            ..RdmaOptions::default()
        };
        assert!(o.validate(&t).unwrap_err().to_string().contains("num_cqe"));
        let t2 = TargetOptions {
            num_data_buffers: 2,
            ..TargetOptions::default()
        };
        assert!(RdmaOptions::default()
            .validate(&t2)
            .unwrap_err()
            .to_string()
            .contains("num_shared_buffers"));
    }
}
