//! SCSI Command (0x01) and SCSI Response (0x21).

use super::bhs::{be32, lun_at, put32, reserved, Common, Lun, BHS_LEN, FINAL, RESERVED_TAG};
use super::PduError;

/// SCSI Command flag: data will be read (Data-In).
pub const CMD_READ: u8 = 0x40;
/// SCSI Command flag: data will be written (Data-Out).
pub const CMD_WRITE: u8 = 0x20;

/// Task attribute (byte 1 bits 0-2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskAttr {
    /// Untagged.
    Untagged = 0,
    /// Simple.
    Simple = 1,
    /// Ordered.
    Ordered = 2,
    /// Head of queue.
    HeadOfQueue = 3,
    /// ACA.
    Aca = 4,
}

/// A SCSI Command PDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScsiCommand {
    /// Immediate delivery.
    pub immediate: bool,
    /// F: no unsolicited Data-Out follows.
    pub final_: bool,
    /// R: the command reads data.
    pub read: bool,
    /// W: the command writes data.
    pub write: bool,
    /// Task attribute.
    pub attr: TaskAttr,
    /// Logical unit.
    pub lun: Lun,
    /// Initiator Task Tag (never the reserved value).
    pub itt: u32,
    /// Expected Data Transfer Length.
    pub edtl: u32,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
    /// The first 16 CDB bytes (longer CDBs continue in an extended-CDB AHS).
    pub cdb: [u8; 16],
}

impl ScsiCommand {
    pub(crate) fn parse(c: &Common, b: &[u8; BHS_LEN]) -> Result<Self, PduError> {
        let f = b[1];
        if f & 0x18 != 0 {
            return Err(PduError::Reserved("SCSI Command byte 1 bits 3-4"));
        }
        reserved(b, 2, 4, "SCSI Command bytes 2-3")?;
        let attr = match f & 7 {
            0 => TaskAttr::Untagged,
            1 => TaskAttr::Simple,
            2 => TaskAttr::Ordered,
            3 => TaskAttr::HeadOfQueue,
            4 => TaskAttr::Aca,
            _ => return Err(PduError::InvalidField("task attribute")),
        };
        let read = f & CMD_READ != 0;
        let write = f & CMD_WRITE != 0;
        let final_ = f & FINAL != 0;
        let edtl = be32(b, 20);
        if c.itt == RESERVED_TAG {
            return Err(PduError::InvalidField("ITT is the reserved tag"));
        }
        if edtl != 0 && !read && !write {
            return Err(PduError::InvalidField("EDTL without R or W"));
        }
        if !final_ && !write {
            return Err(PduError::InvalidField("F=0 without W"));
        }
        if c.dsl > 0 && !write {
            return Err(PduError::InvalidField("immediate data without W"));
        }
        if c.dsl as u64 > u64::from(edtl) {
            return Err(PduError::InvalidField("immediate data beyond EDTL"));
        }
        let mut cdb = [0u8; 16];
        cdb.copy_from_slice(&b[32..48]);
        Ok(ScsiCommand {
            immediate: c.immediate,
            final_,
            read,
            write,
            attr,
            lun: lun_at(b),
            itt: c.itt,
            edtl,
            cmd_sn: be32(b, 24),
            exp_stat_sn: be32(b, 28),
            cdb,
        })
    }

    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[1] = self.attr as u8
            | if self.final_ { FINAL } else { 0 }
            | if self.read { CMD_READ } else { 0 }
            | if self.write { CMD_WRITE } else { 0 };
        b[8..16].copy_from_slice(&self.lun.0);
        put32(b, 16, self.itt);
        put32(b, 20, self.edtl);
        put32(b, 24, self.cmd_sn);
        put32(b, 28, self.exp_stat_sn);
        b[32..48].copy_from_slice(&self.cdb);
    }
}

/// SCSI Response flag: bidirectional read residual overflow.
pub const RSP_BIDI_OVERFLOW: u8 = 0x10;
/// SCSI Response flag: bidirectional read residual underflow.
pub const RSP_BIDI_UNDERFLOW: u8 = 0x08;
/// SCSI Response flag: residual overflow.
pub const RSP_OVERFLOW: u8 = 0x04;
/// SCSI Response flag: residual underflow.
pub const RSP_UNDERFLOW: u8 = 0x02;

/// A SCSI Response PDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScsiResponse {
    /// o/u/O/U bits (`RSP_*`).
    pub flags: u8,
    /// iSCSI response: 0 = command completed at target, 1 = target failure.
    pub response: u8,
    /// SCSI status (valid when `response` is 0).
    pub status: u8,
    /// Initiator Task Tag.
    pub itt: u32,
    /// SNACK tag.
    pub snack_tag: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// ExpDataSN.
    pub exp_data_sn: u32,
    /// Bidirectional read residual count.
    pub bidi_residual: u32,
    /// Residual count.
    pub residual: u32,
}

impl ScsiResponse {
    pub(crate) fn parse(_c: &Common, b: &[u8; BHS_LEN]) -> Result<Self, PduError> {
        let f = b[1];
        if f & FINAL == 0 {
            return Err(PduError::InvalidField("SCSI Response without F"));
        }
        if f & 0x61 != 0 {
            return Err(PduError::Reserved("SCSI Response byte 1"));
        }
        if f & RSP_OVERFLOW != 0 && f & RSP_UNDERFLOW != 0 {
            return Err(PduError::InvalidField("both overflow and underflow"));
        }
        if f & RSP_BIDI_OVERFLOW != 0 && f & RSP_BIDI_UNDERFLOW != 0 {
            return Err(PduError::InvalidField("both bidi overflow and underflow"));
        }
        reserved(b, 8, 16, "SCSI Response bytes 8-15")?;
        Ok(ScsiResponse {
            flags: f & 0x1E,
            response: b[2],
            status: b[3],
            itt: be32(b, 16),
            snack_tag: be32(b, 20),
            stat_sn: be32(b, 24),
            exp_cmd_sn: be32(b, 28),
            max_cmd_sn: be32(b, 32),
            exp_data_sn: be32(b, 36),
            bidi_residual: be32(b, 40),
            residual: be32(b, 44),
        })
    }

    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[1] = FINAL | (self.flags & 0x1E);
        b[2] = self.response;
        b[3] = self.status;
        put32(b, 16, self.itt);
        put32(b, 20, self.snack_tag);
        put32(b, 24, self.stat_sn);
        put32(b, 28, self.exp_cmd_sn);
        put32(b, 32, self.max_cmd_sn);
        put32(b, 36, self.exp_data_sn);
        put32(b, 40, self.bidi_residual);
        put32(b, 44, self.residual);
    }
}
