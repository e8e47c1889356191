//! Logout Request (0x06) and Logout Response (0x26).

use super::bhs::{be16, be32, put16, put32, reserved, Common, BHS_LEN, FINAL};
use super::PduError;

/// Logout reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LogoutReason {
    /// Close the session.
    CloseSession = 0,
    /// Close the connection.
    CloseConnection = 1,
    /// Remove the connection for recovery.
    RemoveForRecovery = 2,
}

/// A Logout Request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogoutRequest {
    /// Immediate delivery.
    pub immediate: bool,
    /// Reason.
    pub reason: LogoutReason,
    /// Initiator Task Tag.
    pub itt: u32,
    /// Connection ID (reasons 1 and 2).
    pub cid: u16,
    /// CmdSN.
    pub cmd_sn: u32,
    /// ExpStatSN.
    pub exp_stat_sn: u32,
}

impl LogoutRequest {
    pub(crate) fn parse(c: &Common, b: &[u8; BHS_LEN]) -> Result<Self, PduError> {
        if b[1] & FINAL == 0 {
            return Err(PduError::InvalidField("logout without F"));
        }
        let reason = match b[1] & 0x7F {
            0 => LogoutReason::CloseSession,
            1 => LogoutReason::CloseConnection,
            2 => LogoutReason::RemoveForRecovery,
            _ => return Err(PduError::InvalidField("logout reason")),
        };
        reserved(b, 2, 4, "logout bytes 2-3")?;
        reserved(b, 8, 16, "logout bytes 8-15")?;
        reserved(b, 22, 24, "logout bytes 22-23")?;
        reserved(b, 32, 48, "logout bytes 32-47")?;
        if c.dsl != 0 {
            return Err(PduError::InvalidField("logout carries data"));
        }
        Ok(LogoutRequest {
            immediate: c.immediate,
            reason,
            itt: c.itt,
            cid: be16(b, 20),
            cmd_sn: be32(b, 24),
            exp_stat_sn: be32(b, 28),
        })
    }

    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[1] = FINAL | self.reason as u8;
        put32(b, 16, self.itt);
        put16(b, 20, self.cid);
        put32(b, 24, self.cmd_sn);
        put32(b, 28, self.exp_stat_sn);
    }
}

/// Logout Response codes (RFC 7143 §11.15.1).
pub mod logout_response {
    /// The connection or session was closed successfully.
    pub const SUCCESS: u8 = 0;
    /// CID not found (a close-connection request naming another connection).
    pub const CID_NOT_FOUND: u8 = 1;
    /// Connection recovery is not supported (remove-for-recovery at
    /// ErrorRecoveryLevel below 2).
    pub const RECOVERY_NOT_SUPPORTED: u8 = 2;
    /// Cleanup failed for various reasons.
    pub const CLEANUP_FAILED: u8 = 3;
}

/// A Logout Response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogoutResponse {
    /// 0 success, 1 CID not found, 2 recovery not supported, 3 cleanup failed.
    pub response: u8,
    /// ITT (echoed).
    pub itt: u32,
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
    /// Time2Wait.
    pub time2wait: u16,
    /// Time2Retain.
    pub time2retain: u16,
}

impl LogoutResponse {
    pub(crate) fn parse(c: &Common, b: &[u8; BHS_LEN]) -> Result<Self, PduError> {
        if b[1] != FINAL {
            return Err(PduError::InvalidField(
                "logout response byte 1 must be 0x80",
            ));
        }
        if b[2] > 3 {
            return Err(PduError::InvalidField("logout response code"));
        }
        reserved(b, 3, 4, "logout response byte 3")?;
        reserved(b, 8, 16, "logout response bytes 8-15")?;
        reserved(b, 44, 48, "logout response bytes 44-47")?;
        Ok(LogoutResponse {
            response: b[2],
            itt: c.itt,
            stat_sn: be32(b, 24),
            exp_cmd_sn: be32(b, 28),
            max_cmd_sn: be32(b, 32),
            time2wait: be16(b, 40),
            time2retain: be16(b, 42),
        })
    }

    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN]) {
        b[1] = FINAL;
        b[2] = self.response;
        put32(b, 16, self.itt);
        put32(b, 24, self.stat_sn);
        put32(b, 28, self.exp_cmd_sn);
        put32(b, 32, self.max_cmd_sn);
        put16(b, 40, self.time2wait);
        put16(b, 42, self.time2retain);
    }
}
