//! Parameters of the nvmf methods, with SPDK's names (`nvmf_rpc.c`,
//! `nvmf_rpc_create_transport`). `tgt_name`, when given, must name the
//! one target (`nvmf_tgt`). Transport tuning values SPDK takes that have
//! no meaning for Pollux's transports are accepted and left out (see
//! [`CreateTransport`]).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A listen address (`listen_address` of the listener methods).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenAddress {
    /// `RDMA` or `TCP` (any case).
    pub trtype: String,
    /// `IPv4`, `IPv6` or `INTRA_HOST` (the soft RDMA provider, whose
    /// `traddr` is a socket name `@name` or path `/path`; the default for
    /// such an address, else `IPv4`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adrfam: Option<String>,
    /// Address.
    pub traddr: String,
    /// Port (service id; none for the soft provider).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trsvcid: Option<String>,
}

/// SPDK's `buf_cache_size` that asks for a cache sized automatically (what
/// its `save_config` writes by default): Pollux's target sized its own.
pub const BUF_CACHE_AUTO: u32 = u32::MAX;

/// `nvmf_create_transport`.
///
/// Pollux's own per-transport options are `max_queue_depth`,
/// `max_io_qpairs_per_ctrlr`, `in_capsule_data_size`, `c2h_success` and
/// `sock_priority` (TCP). `max_io_size`, `io_unit_size`,
/// `num_shared_buffers` and `buf_cache_size` are target-wide in Pollux:
/// accepted when equal to the target's values (`buf_cache_size`: or
/// [`BUF_CACHE_AUTO`]), refused with -95 otherwise (`pollux-tgt --json`
/// sizes its target from the file's first `nvmf_create_transport` when its
/// TOML file does not set them). The rest of SPDK's options are accepted and have no effect.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTransport {
    /// `RDMA` or `TCP`.
    pub trtype: String,
    /// Target name (only the default target exists).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tgt_name: Option<String>,
    /// Queue depth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_queue_depth: Option<u16>,
    /// I/O queues per controller (SPDK: including the admin queue).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_io_qpairs_per_ctrlr: Option<u16>,
    /// In-capsule data bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_capsule_data_size: Option<u32>,
    /// Largest I/O (target-wide in Pollux).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_io_size: Option<u32>,
    /// Buffer size (target-wide in Pollux).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_unit_size: Option<u32>,
    /// Shared buffers (target-wide in Pollux).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_shared_buffers: Option<u32>,
    /// Per-core buffer cache (target-wide in Pollux).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buf_cache_size: Option<u32>,
    /// TCP: C2H success optimisation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub c2h_success: Option<bool>,
    /// TCP: socket priority 0..=6.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sock_priority: Option<u8>,
    /// Accepted, no effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_aq_depth: Option<Value>,
    /// Accepted, no effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dif_insert_or_strip: Option<Value>,
    /// Accepted, no effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abort_timeout_sec: Option<Value>,
    /// Accepted, no effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zcopy: Option<Value>,
    /// Accepted, no effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ack_timeout: Option<Value>,
    /// Accepted, no effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_wr_pool_size: Option<Value>,
    /// Accepted, no effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport_specific: Option<Value>,
    /// Accepted, no effect (RDMA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_srq_depth: Option<Value>,
    /// Accepted, no effect (RDMA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_srq: Option<Value>,
    /// Accepted, no effect (RDMA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_cqe: Option<Value>,
    /// Accepted, no effect (RDMA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acceptor_backlog: Option<Value>,
    /// Accepted, no effect (RDMA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_wr_batching: Option<Value>,
    /// Accepted, no effect (TCP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_msg_num: Option<Value>,
    /// Accepted, no effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acceptor_poll_rate: Option<Value>,
    /// Accepted, no effect (vfio-user).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_mappable_bar0: Option<Value>,
    /// Accepted, no effect (vfio-user).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_adaptive_irq: Option<Value>,
    /// Accepted, no effect (vfio-user).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_shadow_doorbells: Option<Value>,
    /// Accepted, no effect (Pollux has no passthrough commands).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_command_passthru: Option<Value>,
    /// Accepted, no effect (keep-alive granularity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kas: Option<Value>,
    /// Accepted, no effect (the target takes the host's KATO).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_kato: Option<Value>,
}

/// `nvmf_create_subsystem`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSubsystem {
    /// NQN.
    pub nqn: String,
    /// Target name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tgt_name: Option<String>,
    /// Serial number (SPDK's default `00000000000000000000`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial_number: Option<String>,
    /// Model number (SPDK's default `SPDK bdev Controller`; Pollux's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_number: Option<String>,
    /// Any host may connect (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_any_host: Option<bool>,
    /// Largest NSID (default, and 0: SPDK's 32; at most 1024).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_namespaces: Option<u32>,
    /// Lowest controller id (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_cntlid: Option<u16>,
    /// Highest controller id (default 0xFFEF).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cntlid: Option<u16>,
    /// ANA reporting (only false is supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ana_reporting: Option<bool>,
    /// Accepted, no effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_discard_size_kib: Option<Value>,
    /// Accepted, no effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_write_zeroes_size_kib: Option<Value>,
    /// Accepted, no effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dmrsl: Option<Value>,
    /// Accepted, no effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wzsl: Option<Value>,
    /// NVMe passthrough (only false is supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passthrough: Option<bool>,
    /// NVM subsystem reset (only false is supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_nssr: Option<bool>,
}

/// Methods that name only a subsystem (`nvmf_delete_subsystem`,
/// `nvmf_subsystem_get_controllers|qpairs|listeners`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubsystemRef {
    /// NQN.
    pub nqn: String,
    /// Target name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tgt_name: Option<String>,
}

/// `nvmf_get_subsystems` and `nvmf_get_transports` (all filters optional).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetFilter {
    /// Target name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tgt_name: Option<String>,
    /// `nvmf_get_subsystems`: only this subsystem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nqn: Option<String>,
    /// `nvmf_get_transports`: only this transport.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trtype: Option<String>,
}

/// The namespace of `nvmf_subsystem_add_ns`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceParams {
    /// Backing bdev.
    pub bdev_name: String,
    /// NSID (default 0: the lowest free one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nsid: Option<u32>,
    /// NGUID, 32 hex digits (dashes allowed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nguid: Option<String>,
    /// EUI-64, 16 hex digits (dashes allowed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eui64: Option<String>,
    /// UUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Accepted when absent or empty only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ptpl_file: Option<String>,
    /// Accepted when absent or 0/1 only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anagrpid: Option<u32>,
    /// Accepted when absent or false only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_auto_visible: Option<bool>,
    /// Accepted when absent or false only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hide_metadata: Option<bool>,
}

/// `nvmf_subsystem_add_ns`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddNs {
    /// Subsystem NQN.
    pub nqn: String,
    /// The namespace.
    pub namespace: NamespaceParams,
    /// Target name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tgt_name: Option<String>,
}

/// `nvmf_subsystem_remove_ns`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoveNs {
    /// Subsystem NQN.
    pub nqn: String,
    /// NSID.
    pub nsid: u32,
    /// Target name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tgt_name: Option<String>,
}

/// `nvmf_subsystem_add_listener` and `nvmf_subsystem_remove_listener`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerParams {
    /// Subsystem NQN.
    pub nqn: String,
    /// The address.
    pub listen_address: ListenAddress,
    /// Target name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tgt_name: Option<String>,
    /// Accepted when absent or false only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secure_channel: Option<bool>,
    /// Accepted when absent or `optimized` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ana_state: Option<String>,
    /// The socket implementation of a TCP listener: accepted when absent
    /// or `posix` (what Pollux's TCP transport uses) only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sock_impl: Option<String>,
}

/// `nvmf_subsystem_add_host` and `nvmf_subsystem_remove_host`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostParams {
    /// Subsystem NQN.
    pub nqn: String,
    /// Host NQN.
    pub host: String,
    /// Target name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tgt_name: Option<String>,
    /// Accepted when absent only (no TLS here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub psk: Option<String>,
    /// Accepted when absent only (no DH-HMAC-CHAP here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_key: Option<String>,
    /// Accepted when absent only (no DH-HMAC-CHAP here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_ctrlr_key: Option<String>,
}

/// `nvmf_subsystem_allow_any_host`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllowAnyHost {
    /// Subsystem NQN.
    pub nqn: String,
    /// Allow any host.
    pub allow_any_host: bool,
    /// Target name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tgt_name: Option<String>,
}

/// `nvmf_get_stats`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetStats {
    /// Target name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tgt_name: Option<String>,
}
