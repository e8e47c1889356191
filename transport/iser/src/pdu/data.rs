//! SCSI Data-Out (0x05), SCSI Data-In (0x25) and R2T (0x31).

use super::bhs::{be32, lun_at, put32, reserved, Common, Lun, BHS_LEN, FINAL};
use super::PduError;

/// A SCSI Data-Out PDU (unsolicited data on iSER, solicited data on TCP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DataOut {
    /// F: last PDU of the sequence.
    pub final_: bool,
    /// Logical unit.
    pub lun: Lun,
    /// Initiator Task Tag.
    pub itt: u32,
    /// Target Transfer Tag (reserved tag for unsolicited data).
    pub ttt: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
    /// DataSN.
    pub data_sn: u32,
    /// Offset of this PDU's data in the command's buffer.
    pub buffer_offset: u32,
}

impl DataOut {
    pub(crate) fn parse(c: &Common, b: &[u8; BHS_LEN]) -> Result<Self, PduError> {
        if b[1] & 0x7F != 0 {
            return Err(PduError::Reserved("Data-Out byte 1"));
        }
        reserved(b, 2, 4, "Data-Out bytes 2-3")?;
        reserved(b, 24, 28, "Data-Out bytes 24-27")?;
        reserved(b, 32, 36, "Data-Out bytes 32-35")?;
        reserved(b, 44, 48, "Data-Out bytes 44-47")?;
        Ok(DataOut {
            final_: b[1] & FINAL != 0,
            lun: lun_at(b),
            itt: c.itt,
            ttt: be32(b, 20),
            exp_stat_sn: be32(b, 28),
            data_sn: be32(b, 36),
            buffer_offset: be32(b, 40),
        })
    }

    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[1] = if self.final_ { FINAL } else { 0 };
        b[8..16].copy_from_slice(&self.lun.0);
        put32(b, 16, self.itt);
        put32(b, 20, self.ttt);
        put32(b, 28, self.exp_stat_sn);
        put32(b, 36, self.data_sn);
        put32(b, 40, self.buffer_offset);
    }
}

/// Data-In flag: acknowledge requested.
pub const DATA_IN_ACK: u8 = 0x40;
/// Data-In flag: residual overflow.
pub const DATA_IN_OVERFLOW: u8 = 0x04;
/// Data-In flag: residual underflow.
pub const DATA_IN_UNDERFLOW: u8 = 0x02;
/// Data-In flag: status is carried.
pub const DATA_IN_STATUS: u8 = 0x01;

/// A SCSI Data-In PDU (never sent on iSER; parsed for completeness).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DataIn {
    /// Byte 1 flags (F, A, O, U, S).
    pub flags: u8,
    /// SCSI status (valid with S).
    pub status: u8,
    /// Logical unit.
    pub lun: Lun,
    /// Initiator Task Tag.
    pub itt: u32,
    /// Target Transfer Tag.
    pub ttt: u32,
    /// StatSN (valid with S).
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// DataSN.
    pub data_sn: u32,
    /// Buffer offset.
    pub buffer_offset: u32,
    /// Residual count.
    pub residual: u32,
}

impl DataIn {
    pub(crate) fn parse(c: &Common, b: &[u8; BHS_LEN]) -> Result<Self, PduError> {
        let f = b[1];
        if f & 0x38 != 0 {
            return Err(PduError::Reserved("Data-In byte 1"));
        }
        if f & DATA_IN_STATUS != 0 && f & FINAL == 0 {
            return Err(PduError::InvalidField("Data-In S without F"));
        }
        if f & DATA_IN_OVERFLOW != 0 && f & DATA_IN_UNDERFLOW != 0 {
            return Err(PduError::InvalidField("both overflow and underflow"));
        }
        reserved(b, 2, 3, "Data-In byte 2")?;
        Ok(DataIn {
            flags: f,
            status: b[3],
            lun: lun_at(b),
            itt: c.itt,
            ttt: be32(b, 20),
            stat_sn: be32(b, 24),
            exp_cmd_sn: be32(b, 28),
            max_cmd_sn: be32(b, 32),
            data_sn: be32(b, 36),
            buffer_offset: be32(b, 40),
            residual: be32(b, 44),
        })
    }

    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[1] = self.flags & !0x38;
        b[3] = self.status;
        b[8..16].copy_from_slice(&self.lun.0);
        put32(b, 16, self.itt);
        put32(b, 20, self.ttt);
        put32(b, 24, self.stat_sn);
        put32(b, 28, self.exp_cmd_sn);
        put32(b, 32, self.max_cmd_sn);
        put32(b, 36, self.data_sn);
        put32(b, 40, self.buffer_offset);
        put32(b, 44, self.residual);
    }
}

/// An R2T PDU (never sent on iSER; parsed for completeness).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct R2t {
    /// Logical unit.
    pub lun: Lun,
    /// Initiator Task Tag.
    pub itt: u32,
    /// Target Transfer Tag.
    pub ttt: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// R2TSN.
    pub r2t_sn: u32,
    /// Buffer offset.
    pub buffer_offset: u32,
    /// Desired data transfer length (non-zero).
    pub desired_len: u32,
}

impl R2t {
    pub(crate) fn parse(c: &Common, b: &[u8; BHS_LEN]) -> Result<Self, PduError> {
        if b[1] != FINAL {
            return Err(PduError::InvalidField("R2T byte 1 must be 0x80"));
        }
        reserved(b, 2, 4, "R2T bytes 2-3")?;
        if c.ahs_len != 0 || c.dsl != 0 {
            return Err(PduError::InvalidField("R2T carries no AHS or data"));
        }
        let desired_len = be32(b, 44);
        if desired_len == 0 {
            return Err(PduError::InvalidField("R2T desired length 0"));
        }
        Ok(R2t {
            lun: lun_at(b),
            itt: c.itt,
            ttt: be32(b, 20),
            stat_sn: be32(b, 24),
            exp_cmd_sn: be32(b, 28),
            max_cmd_sn: be32(b, 32),
            r2t_sn: be32(b, 36),
            buffer_offset: be32(b, 40),
            desired_len,
        })
    }

    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[1] = FINAL;
        b[8..16].copy_from_slice(&self.lun.0);
        put32(b, 16, self.itt);
        put32(b, 20, self.ttt);
        put32(b, 24, self.stat_sn);
        put32(b, 28, self.exp_cmd_sn);
        put32(b, 32, self.max_cmd_sn);
        put32(b, 36, self.r2t_sn);
        put32(b, 40, self.buffer_offset);
        put32(b, 44, self.desired_len);
    }
}
