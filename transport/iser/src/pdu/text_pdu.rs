//! Text Request (0x04) and Text Response (0x24): the PDUs that carry
//! key=value text after login (SendTargets discovery).

use super::bhs::{be32, lun_at, put32, reserved, Common, Lun, BHS_LEN, FINAL};
use super::PduError;

/// Text flag: Continue.
pub const TEXT_C: u8 = 0x40;

/// A Text Request or Text Response (the same fields; the opcode tells them
/// apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TextPdu {
    /// Immediate delivery (requests only).
    pub immediate: bool,
    /// F: final.
    pub final_: bool,
    /// C: continue.
    pub cont: bool,
    /// LUN or 0.
    pub lun: Lun,
    /// Initiator Task Tag.
    pub itt: u32,
    /// Target Transfer Tag.
    pub ttt: u32,
    /// Request: CmdSN. Response: StatSN.
    pub sn: u32,
    /// Request: ExpStatSN. Response: ExpCmdSN.
    pub exp_sn: u32,
    /// Response: MaxCmdSN (0 in requests).
    pub max_cmd_sn: u32,
}

impl TextPdu {
    pub(crate) fn parse(c: &Common, b: &[u8; BHS_LEN], request: bool) -> Result<Self, PduError> {
        let f = b[1];
        if f & 0x3F != 0 {
            return Err(PduError::Reserved("text byte 1"));
        }
        let final_ = f & FINAL != 0;
        let cont = f & TEXT_C != 0;
        if final_ && cont {
            return Err(PduError::InvalidField("text F and C both set"));
        }
        reserved(b, 2, 4, "text bytes 2-3")?;
        if request {
            reserved(b, 32, 48, "text request bytes 32-47")?;
        } else {
            reserved(b, 36, 48, "text response bytes 36-47")?;
        }
        Ok(TextPdu {
            immediate: c.immediate,
            final_,
            cont,
            lun: lun_at(b),
            itt: c.itt,
            ttt: be32(b, 20),
            sn: be32(b, 24),
            exp_sn: be32(b, 28),
            max_cmd_sn: if request { 0 } else { be32(b, 32) },
        })
    }

    pub(crate) fn encode(&self, b: &mut [u8; BHS_LEN], request: bool) {
        b[1] = (if self.final_ { FINAL } else { 0 }) | if self.cont { TEXT_C } else { 0 };
        b[8..16].copy_from_slice(&self.lun.0);
        put32(b, 16, self.itt);
        put32(b, 20, self.ttt);
        put32(b, 24, self.sn);
        put32(b, 28, self.exp_sn);
        if !request {
            put32(b, 32, self.max_cmd_sn);
        }
    }
}
