//! Task Management Function Request (0x02) and Response (0x22).

use super::bhs::{be32, lun_at, put32, reserved, Common, Lun, BHS_LEN, FINAL};
use super::PduError;

/// Task management functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TmfFunction {
    /// Abort one task (Referenced Task Tag).
    AbortTask = 1,
    /// Abort every task of the LUN from this session.
    AbortTaskSet = 2,
    /// Clear ACA.
    ClearAca = 3,
    /// Clear every task of the LUN.
    ClearTaskSet = 4,
    /// Logical unit reset.
    LogicalUnitReset = 5,
    /// Target warm reset.
    TargetWarmReset = 6,
    /// Target cold reset.
    TargetColdReset = 7,
    /// Task reassign (ERL 2).
    TaskReassign = 8,
}

/// TMF response codes.
pub mod tmf_response {
    /// Function complete.
    pub const COMPLETE: u8 = 0;
    /// Task does not exist.
    pub const NO_TASK: u8 = 1;
    /// LUN does not exist.
    pub const NO_LUN: u8 = 2;
    /// Task still allegiant.
    pub const ALLEGIANT: u8 = 3;
    /// Task allegiance reassignment not supported.
    pub const NO_REASSIGN: u8 = 4;
    /// Function not supported.
    pub const NOT_SUPPORTED: u8 = 5;
    /// Function authorization failed.
    pub const AUTH_FAILED: u8 = 6;
    /// Function rejected.
    pub const REJECTED: u8 = 255;
}

/// A Task Management Function Request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TmfRequest {
    /// Immediate delivery.
    pub immediate: bool,
    /// The function.
    pub function: TmfFunction,
    /// Logical unit.
    pub lun: Lun,
    /// ITT of this request.
    pub itt: u32,
    /// ITT of the task to abort.
    pub ref_task_tag: u32,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
    /// RefCmdSN.
    pub ref_cmd_sn: u32,
    /// ExpDataSN.
    pub exp_data_sn: u32,
}

impl TmfRequest {
    pub(crate) fn parse(c: &Common, b: &[u8; BHS_LEN]) -> Result<Self, PduError> {
        if b[1] & FINAL == 0 {
            return Err(PduError::InvalidField("TMF request without F"));
        }
        use TmfFunction::*;
        let function = match b[1] & 0x7F {
            1 => AbortTask,
            2 => AbortTaskSet,
            3 => ClearAca,
            4 => ClearTaskSet,
            5 => LogicalUnitReset,
            6 => TargetWarmReset,
            7 => TargetColdReset,
            8 => TaskReassign,
            _ => return Err(PduError::InvalidField("TMF function")),
        };
        reserved(b, 2, 4, "TMF bytes 2-3")?;
        reserved(b, 40, 48, "TMF bytes 40-47")?;
        if c.dsl != 0 {
            return Err(PduError::InvalidField("TMF request carries data"));
        }
        Ok(TmfRequest {
            immediate: c.immediate,
            function,
            lun: lun_at(b),
            itt: c.itt,
            ref_task_tag: be32(b, 20),
            cmd_sn: be32(b, 24),
            exp_stat_sn: be32(b, 28),
            ref_cmd_sn: be32(b, 32),
            exp_data_sn: be32(b, 36),
        })
    }

    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[1] = FINAL | self.function as u8;
        b[8..16].copy_from_slice(&self.lun.0);
        put32(b, 16, self.itt);
        put32(b, 20, self.ref_task_tag);
        put32(b, 24, self.cmd_sn);
        put32(b, 28, self.exp_stat_sn);
        put32(b, 32, self.ref_cmd_sn);
        put32(b, 36, self.exp_data_sn);
    }
}

/// A Task Management Function Response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TmfResponse {
    /// Response code ([`tmf_response`]).
    pub response: u8,
    /// ITT of the request.
    pub itt: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
}

impl TmfResponse {
    pub(crate) fn parse(c: &Common, b: &[u8; BHS_LEN]) -> Result<Self, PduError> {
        if b[1] != FINAL {
            return Err(PduError::InvalidField("TMF response byte 1 must be 0x80"));
        }
        reserved(b, 3, 4, "TMF response byte 3")?;
        reserved(b, 8, 16, "TMF response bytes 8-15")?;
        Ok(TmfResponse {
            response: b[2],
            itt: c.itt,
            stat_sn: be32(b, 24),
            exp_cmd_sn: be32(b, 28),
            max_cmd_sn: be32(b, 32),
        })
    }

    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[1] = FINAL;
        b[2] = self.response;
        put32(b, 16, self.itt);
        put32(b, 24, self.stat_sn);
        put32(b, 28, self.exp_cmd_sn);
        put32(b, 32, self.max_cmd_sn);
    }
}
