//! [`IserOptions`]: the iSER target transport's knobs and the one place
//! that sizes queues, CQs and send/receive buffers.

use std::time::Duration;

use pollux_verbs::placement::PlacementPolicy;

use crate::pdu::ISER_HEADERS_LEN;
use crate::target::NopPing;

/// Data bytes of one receive buffer: a login/text PDU or a command with
/// immediate data (TargetRecvDataSegmentLength, 8 KiB).
pub const RECV_DATA_LEN: usize = 8192;
/// Bytes of one receive buffer (iSER header + BHS + data).
pub const RECV_BUF_LEN: usize = ISER_HEADERS_LEN + RECV_DATA_LEN;
/// Bytes of a small send slot (responses with sense, NOP-In, Reject).
pub(crate) const SMALL_SLOT: usize = 512;
/// Bytes of a large send slot (login and text responses).
pub(crate) const LARGE_SLOT: usize = ISER_HEADERS_LEN + RECV_DATA_LEN + 52;
/// Large send slots per connection (login and text are lock-step).
pub(crate) const LARGE_SLOTS: usize = 4;

/// How long the target waits, after its Logout Response has been sent,
/// for the initiator to disconnect before it disconnects the connection
/// itself ([`IserOptions::logout_grace`]).
///
/// After a Logout Response the initiator is the one that completely closes
/// the logging-out connection (RFC 7143 §11.14; over TCP the target only
/// half-closes). An RDMA CM disconnect has no half-close: a target that
/// disconnects first ends the connection under the initiator, and Linux's
/// `ib_iser` reports a DISCONNECTED event that arrives before `iscsid` has
/// stopped the connection as a connection error (`detected conn error
/// (1011)`). So the target waits for the initiator's disconnect. Linux's
/// initiator disconnects as soon as `iscsid` has read the response (a
/// round trip through user space: milliseconds); 2 s is far above that on
/// a loaded machine, and short enough that an initiator that never
/// disconnects holds its connection's seat, session and send slots only
/// briefly. The RFC sets no number (the response's Time2Wait and
/// Time2Retain are 0). LIO's isert does not wait: it disconnects once the
/// response's SEND has completed, as this target did before.
pub const LOGOUT_GRACE: Duration = Duration::from_secs(2);

/// iSER transport options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IserOptions {
    /// Verbs device to open; `None`: the provider's first device.
    pub device: Option<String>,
    /// Receive buffers of each poll group's SRQ.
    pub max_srq_depth: u32,
    /// Completion queue entries of each poll group.
    pub num_cqe: u32,
    /// Answer with SEND_WITH_INVALIDATE when the initiator allows it (its
    /// CM header has SEND_W_INV_NOT_SUP clear) and the device supports it.
    pub send_with_invalidate: bool,
    /// Listen backlog.
    pub acceptor_backlog: u32,
    /// Most RDMA READs in flight per connection.
    pub max_read_depth: u8,
    /// Hugepages for the receive buffers.
    pub hugepages: pollux_reactor::mem::HugepageMode,
    /// Which poll group (core) serves a new connection (default: the one
    /// with the fewest connections, ties round robin).
    pub placement: PlacementPolicy,
    /// Most connections (all sessions) the transport serves at once; a
    /// connect request beyond it is rejected before it takes any resource.
    pub max_connections: usize,
    /// Most connections one poll group (core) serves at once (a full
    /// group's requests go to another group, as for `max_connections` when
    /// every group is full).
    pub max_connections_per_core: usize,
    /// Silence after which a connection in full feature phase gets a
    /// NOP-In ping (SPDK `nop_in_interval`, default 30 s; zero: never).
    pub nop_in_interval: Duration,
    /// How long the target waits for any PDU after its ping before it
    /// drops the connection and counts a NOP timeout (SPDK
    /// `nop_timeout`, default 60 s).
    pub nop_timeout: Duration,
    /// After a Logout Response has been sent, how long the target waits
    /// for the initiator to disconnect before it disconnects itself
    /// (default [`LOGOUT_GRACE`], 2 s). A protocol error or an unanswered
    /// ping still closes at once.
    pub logout_grace: Duration,
}

impl Default for IserOptions {
    fn default() -> Self {
        IserOptions {
            device: None,
            max_srq_depth: 1024,
            num_cqe: 16384,
            send_with_invalidate: true,
            acceptor_backlog: 100,
            max_read_depth: 16,
            hugepages: pollux_reactor::mem::HugepageMode::Auto,
            placement: PlacementPolicy::LeastConnections,
            max_connections: 1024,
            max_connections_per_core: 1024,
            nop_in_interval: NopPing::default().interval,
            nop_timeout: NopPing::default().timeout,
            logout_grace: LOGOUT_GRACE,
        }
    }
}

impl IserOptions {
    /// The keep-alive ping of each connection.
    pub fn nop_ping(&self) -> NopPing {
        NopPing {
            interval: self.nop_in_interval,
            timeout: self.nop_timeout,
        }
    }

    /// Small pools and ordinary pages, for tests.
    pub fn for_tests() -> Self {
        IserOptions {
            max_srq_depth: 128,
            num_cqe: 4096,
            hugepages: pollux_reactor::mem::HugepageMode::Never,
            ..IserOptions::default()
        }
    }

    /// Small send slots of one connection at queue depth `depth`: one
    /// response per task plus NOP-In/Reject/Async headroom.
    pub(crate) fn small_slots(depth: u32) -> usize {
        depth as usize + 8
    }

    /// Send work requests one connection needs at `depth`: per task one
    /// RDMA WRITE or READ plus its response SEND, plus the other PDUs.
    pub(crate) fn send_wrs(depth: u32) -> u32 {
        2 * depth + (Self::small_slots(depth) - depth as usize + LARGE_SLOTS) as u32 + 1
    }
}
