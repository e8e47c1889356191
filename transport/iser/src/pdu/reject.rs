//! Reject (0x3F) and Asynchronous Message (0x32).

use super::bhs::{be16, be32, lun_at, put16, put32, reserved, Common, Lun, BHS_LEN, FINAL};
use super::PduError;

/// Reject reasons.
pub mod reject_reason {
    /// Data (payload) digest error.
    pub const DATA_DIGEST: u8 = 0x02;
    /// SNACK reject.
    pub const SNACK: u8 = 0x03;
    /// Protocol error.
    pub const PROTOCOL_ERROR: u8 = 0x04;
    /// Command not supported.
    pub const NOT_SUPPORTED: u8 = 0x05;
    /// Immediate command rejected (too many).
    pub const IMMEDIATE_REJECTED: u8 = 0x06;
    /// Task in progress.
    pub const TASK_IN_PROGRESS: u8 = 0x07;
    /// Invalid data ACK.
    pub const INVALID_DATA_ACK: u8 = 0x08;
    /// Invalid PDU field.
    pub const INVALID_PDU_FIELD: u8 = 0x09;
    /// Long operation reject (out of resources).
    pub const OUT_OF_RESOURCES: u8 = 0x0A;
    /// Waiting for logout.
    pub const WAITING_FOR_LOGOUT: u8 = 0x0C;
}

/// A Reject PDU; its data segment is the rejected BHS (48 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reject {
    /// Reason ([`reject_reason`]).
    pub reason: u8,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// DataSN/R2TSN.
    pub data_sn: u32,
}

impl Reject {
    pub(crate) fn parse(c: &Common, b: &[u8; BHS_LEN]) -> Result<Self, PduError> {
        if b[1] != FINAL {
            return Err(PduError::InvalidField("reject byte 1 must be 0x80"));
        }
        reserved(b, 3, 4, "reject byte 3")?;
        reserved(b, 8, 16, "reject bytes 8-15")?;
        reserved(b, 40, 48, "reject bytes 40-47")?;
        if c.itt != super::bhs::RESERVED_TAG {
            return Err(PduError::InvalidField("reject ITT must be reserved"));
        }
        if c.dsl != BHS_LEN {
            return Err(PduError::InvalidField("reject data must be one BHS"));
        }
        Ok(Reject {
            reason: b[2],
            stat_sn: be32(b, 24),
            exp_cmd_sn: be32(b, 28),
            max_cmd_sn: be32(b, 32),
            data_sn: be32(b, 36),
        })
    }

    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[1] = FINAL;
        b[2] = self.reason;
        put32(b, 16, super::bhs::RESERVED_TAG);
        put32(b, 24, self.stat_sn);
        put32(b, 28, self.exp_cmd_sn);
        put32(b, 32, self.max_cmd_sn);
        put32(b, 36, self.data_sn);
    }
}

/// An Asynchronous Message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AsyncMessage {
    /// Logical unit.
    pub lun: Lun,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// AsyncEvent (0 SCSI event, 1 logout requested, 2 connection drop, 3
    /// all dropped, 4 renegotiate, 255 vendor).
    pub event: u8,
    /// AsyncVCode.
    pub vcode: u8,
    /// Parameter1.
    pub param1: u16,
    /// Parameter2.
    pub param2: u16,
    /// Parameter3.
    pub param3: u16,
}

impl AsyncMessage {
    pub(crate) fn parse(c: &Common, b: &[u8; BHS_LEN]) -> Result<Self, PduError> {
        if b[1] != FINAL {
            return Err(PduError::InvalidField("async byte 1 must be 0x80"));
        }
        reserved(b, 2, 4, "async bytes 2-3")?;
        reserved(b, 20, 24, "async bytes 20-23")?;
        reserved(b, 44, 48, "async bytes 44-47")?;
        if c.itt != super::bhs::RESERVED_TAG {
            return Err(PduError::InvalidField("async ITT must be reserved"));
        }
        Ok(AsyncMessage {
            lun: lun_at(b),
            stat_sn: be32(b, 24),
            exp_cmd_sn: be32(b, 28),
            max_cmd_sn: be32(b, 32),
            event: b[36],
            vcode: b[37],
            param1: be16(b, 38),
            param2: be16(b, 40),
            param3: be16(b, 42),
        })
    }

    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[1] = FINAL;
        b[8..16].copy_from_slice(&self.lun.0);
        put32(b, 16, super::bhs::RESERVED_TAG);
        put32(b, 24, self.stat_sn);
        put32(b, 28, self.exp_cmd_sn);
        put32(b, 32, self.max_cmd_sn);
        b[36] = self.event;
        b[37] = self.vcode;
        put16(b, 38, self.param1);
        put16(b, 40, self.param2);
        put16(b, 42, self.param3);
    }
}
