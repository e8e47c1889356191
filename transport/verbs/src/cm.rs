//! Connection-manager types: addresses, connection parameters, private data
//! with its size limits, and events.

use crate::error::VerbsError;

/// Private-data limit of a connect request (IB/RoCE, `RDMA_PS_TCP`).
pub const CONNECT_PRIVATE_DATA_MAX: usize = 56;
/// Private-data limit of an accept (reply).
pub const ACCEPT_PRIVATE_DATA_MAX: usize = 196;
/// Private-data limit of a reject.
pub const REJECT_PRIVATE_DATA_MAX: usize = 148;

/// IB CM reject reason of a consumer reject (`rdma_reject`).
pub const REJECT_REASON_CONSUMER: i32 = 28;
/// IB CM reject reason "invalid service ID" (nobody listens).
pub const REJECT_REASON_INVALID_SERVICE_ID: i32 = 8;

/// Private data as delivered with an event: reported zero-padded to the
/// limit of its message kind (56/196/148), as IB/RoCE does.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PrivateData {
    len: u8,
    bytes: [u8; ACCEPT_PRIVATE_DATA_MAX],
}

impl PrivateData {
    /// Empty private data.
    pub const EMPTY: PrivateData = PrivateData {
        len: 0,
        bytes: [0; ACCEPT_PRIVATE_DATA_MAX],
    };

    /// Copy `data` and report it padded to `max` bytes.
    ///
    /// # Errors
    /// [`VerbsError::PrivateDataTooLong`] if `data.len() > max` (or `max > 196`).
    pub fn padded(data: &[u8], max: usize) -> Result<Self, VerbsError> {
        if data.len() > max || max > ACCEPT_PRIVATE_DATA_MAX {
            return Err(VerbsError::PrivateDataTooLong {
                len: data.len(),
                max,
            });
        }
        let mut p = PrivateData::EMPTY;
        p.bytes[..data.len()].copy_from_slice(data);
        // `max <= 196 < 256` was checked above.
        p.len = max as u8;
        Ok(p)
    }

    /// The bytes (zero padded to the message kind's limit).
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl std::fmt::Debug for PrivateData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PrivateData({} bytes)", self.len)
    }
}

/// Connection parameters (`rdma_conn_param`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnParam<'a> {
    /// Private data for the peer.
    pub private_data: &'a [u8],
    /// Inbound READ depth we accept.
    pub responder_resources: u8,
    /// Outbound READ depth we want.
    pub initiator_depth: u8,
    /// Transport retries (3 bits).
    pub retry_count: u8,
    /// RNR retries (3 bits, 7 = forever).
    pub rnr_retry_count: u8,
}

impl<'a> ConnParam<'a> {
    /// Parameters with `private_data` and defaults (depth 16, retries 7).
    pub fn with_data(private_data: &'a [u8]) -> Self {
        ConnParam {
            private_data,
            responder_resources: 16,
            initiator_depth: 16,
            retry_count: 7,
            rnr_retry_count: 7,
        }
    }
}

/// What a passive side learns from a connect request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnRequestInfo {
    /// The peer's private data, reported as 56 bytes.
    pub private_data: PrivateData,
    /// = the peer's initiator_depth (swapped, as RDMA CM reports it).
    pub responder_resources: u8,
    /// = the peer's responder_resources.
    pub initiator_depth: u8,
    /// The peer's RNR retry count.
    pub rnr_retry_count: u8,
    /// The peer's QP number.
    pub qp_num: u32,
}

/// A connection-manager event on a connection id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CmEvent {
    /// Connected; the QP is RTS. Active side: the accept's private data
    /// (196 bytes reported); passive side: empty.
    Established {
        /// Private data from the accept.
        private_data: PrivateData,
    },
    /// The peer rejected (active side), with its private data (148 bytes).
    Rejected {
        /// IB CM reason (28 = consumer reject, 8 = nobody listens).
        reason: i32,
        /// Private data from the reject.
        private_data: PrivateData,
    },
    /// Nobody answered.
    Unreachable,
    /// Connecting failed after the request was answered.
    ConnectError,
    /// The connection is gone (peer disconnect, crash, or local disconnect);
    /// the QP is in ERR and its WRs flush.
    Disconnected,
}

/// A connection-manager address: a provider-specific string. The soft
/// provider takes a Unix socket path (`/run/pollux/…`) or an abstract name
/// (`@name`); the ibverbs provider takes `ip:port`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmAddr(pub String);

impl CmAddr {
    /// Wrap an address string.
    pub fn new(s: impl Into<String>) -> Self {
        CmAddr(s.into())
    }
}

impl std::fmt::Display for CmAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why [`CmId::detach`](crate::provider::CmId::detach) refused: the id
/// comes back unchanged (accept or reject it where it is), with the reason.
pub struct DetachError<T> {
    /// The id, still usable on this core.
    pub id: T,
    /// Why it cannot be detached ([`VerbsError::CmState`]: not a pending
    /// connect request, already answered, or still shared).
    pub error: VerbsError,
}

impl<T> std::fmt::Debug for DetachError<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DetachError")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<T> std::fmt::Display for DetachError<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot detach the connect request: {}", self.error)
    }
}

impl<T> std::error::Error for DetachError<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}
