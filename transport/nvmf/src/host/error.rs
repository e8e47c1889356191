//! Typed errors of the host: control-path failures ([`HostError`]) and the
//! status of one I/O ([`IoError`]).

use std::time::Duration;

use crate::spec::connect::{data_off, parse_invalid_param_dw0, sqe_off};
use crate::spec::cpl::{NvmeStatus, StatusCodeType};
use crate::spec::rdma_cm::CmRejectStatus;

/// A control-path failure: connecting, enabling, identifying, a dead queue.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// The transport ID string is malformed.
    #[error("transport ID: {0}")]
    Trid(String),
    /// Nobody answered at the address (no listener, unreachable).
    #[error("no NVMe-oF target answers at {0}")]
    Unreachable(String),
    /// The target refused the queue at the transport level (RDMA CM REJ).
    #[error("target rejected the connection (queue {qid}): {status:?}")]
    Rejected {
        /// The queue.
        qid: u16,
        /// The NVMe-oF reject status of the REJ private data.
        status: CmRejectStatus,
    },
    /// The target answered a command with an error status.
    #[error("{what} failed: {status}")]
    Nvme {
        /// The command.
        what: &'static str,
        /// Its status.
        status: NvmeStatus,
    },
    /// A Fabrics Connect was refused (unknown subsystem, host not allowed,
    /// bad queue size or id). `param` names the field the target blamed
    /// (IATTR/IPO of Connect Invalid Parameters or Invalid Host).
    #[error("Connect (queue {qid}) refused: {}{}", connect_reason(*status), param.map(|p| format!(": {p}")).unwrap_or_default())]
    ConnectRefused {
        /// The queue.
        qid: u16,
        /// Its status.
        status: NvmeStatus,
        /// The field the target blamed, when the status carries one.
        param: Option<InvalidParam>,
    },
    /// The target did not answer in time.
    #[error("{what} timed out after {after:?}")]
    Timeout {
        /// What was awaited.
        what: &'static str,
        /// How long.
        after: Duration,
    },
    /// The connection is gone (the target disconnected or died).
    #[error("the connection to the target is lost: {0}")]
    Disconnected(String),
    /// The controller was lost and not reconnected within `ctrl_loss_tmo`
    /// (or reconnects are off): every new command fails with this.
    #[error("the controller is lost for good (no reconnect within ctrl_loss_tmo): {0}")]
    CtrlLost(String),
    /// The target's answer makes no sense (bad identify data, unknown CID).
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The transport could not set up resources.
    #[error("transport: {0}")]
    Transport(String),
    /// The request cannot be carried by this queue or transport.
    #[error("unsupported: {0}")]
    Unsupported(String),
}

/// Why one I/O failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IoError {
    /// The target completed the command with an error status.
    #[error("NVMe status {0}")]
    Nvme(NvmeStatus),
    /// The queue died (target gone, transport error) before the command
    /// completed.
    #[error("aborted: the queue is disconnected")]
    Aborted,
    /// The command did not complete within the I/O timeout (the queue is
    /// torn down).
    #[error("timed out")]
    TimedOut,
}

/// The field a target blamed for a refused Connect: IPO (a byte offset)
/// and IATTR bit 0 (the offset is in the 1024-byte Connect data, else in
/// the Connect command itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidParam {
    /// Byte offset of the bad field (IPO).
    pub offset: u16,
    /// The offset is in the Connect data (IATTR bit 0), else in the SQE.
    pub in_data: bool,
}

impl InvalidParam {
    /// The blamed field of a refused Connect's completion: `Some` only for
    /// the statuses that carry IATTR/IPO (Connect Invalid Parameters,
    /// Connect Invalid Host).
    pub fn from_completion(status: NvmeStatus, dw0: u32) -> Option<Self> {
        let carries = status.sct() == StatusCodeType::CommandSpecific
            && (status.sc() == NvmeStatus::CONNECT_INVALID_PARAMETERS.sc()
                || status.sc() == NvmeStatus::CONNECT_INVALID_HOST.sc());
        if !carries {
            return None;
        }
        let (offset, in_data) = parse_invalid_param_dw0(dw0);
        Some(InvalidParam { offset, in_data })
    }

    /// The name of the field at the offset (`None`: not a field start).
    pub fn field(&self) -> Option<&'static str> {
        let o = usize::from(self.offset);
        if self.in_data {
            match o {
                data_off::HOSTID => Some("hostid"),
                data_off::CNTLID => Some("cntlid"),
                data_off::SUBNQN => Some("subnqn"),
                data_off::HOSTNQN => Some("hostnqn"),
                _ => None,
            }
        } else {
            match o {
                sqe_off::RECFMT => Some("recfmt"),
                sqe_off::QID => Some("qid"),
                sqe_off::SQSIZE => Some("sqsize"),
                sqe_off::CATTR => Some("cattr"),
                sqe_off::KATO => Some("kato"),
                _ => None,
            }
        }
    }
}

impl std::fmt::Display for InvalidParam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let place = if self.in_data { "data" } else { "command" };
        write!(
            f,
            "invalid parameter at offset {} of the Connect {place}",
            self.offset
        )?;
        if let Some(name) = self.field() {
            write!(f, " ({name})")?;
        }
        Ok(())
    }
}

/// A Connect status in words (the raw status follows in brackets).
fn connect_reason(status: NvmeStatus) -> String {
    let words = if status.sct() != StatusCodeType::CommandSpecific {
        None
    } else if status.sc() == NvmeStatus::CONNECT_INCOMPATIBLE_FORMAT.sc() {
        Some("incompatible format")
    } else if status.sc() == NvmeStatus::CONNECT_CONTROLLER_BUSY.sc() {
        Some("controller busy")
    } else if status.sc() == NvmeStatus::CONNECT_INVALID_PARAMETERS.sc() {
        Some("invalid parameters")
    } else if status.sc() == NvmeStatus::CONNECT_INVALID_HOST.sc() {
        Some("host not allowed")
    } else if status.sc() == NvmeStatus::CONNECT_RESTART_DISCOVERY.sc() {
        Some("restart discovery")
    } else {
        None
    };
    match words {
        Some(w) => format!("{w} [{status}]"),
        None => status.to_string(),
    }
}
