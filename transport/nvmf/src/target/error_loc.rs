//! The Parameter Error Location of an error log entry: the byte (bits 7:0)
//! and bit (bits 10:8) of the submission queue entry field the failed
//! command got wrong, or FFFFh when no single field is to blame.
//!
//! Read back from the command and its status when the entry is made
//! (control path, admin queue), so no command path carries it.

use crate::spec::cmd::{AdminOpcode, NvmeCmd};
use crate::spec::cpl::NvmeStatus;
use crate::spec::features::fid;
use crate::spec::log_page::GetLogPageCmd;

/// No single field (the spec's FFFFh).
pub const NO_LOCATION: u16 = 0xFFFF;

/// SQE byte offsets used as locations.
mod at {
    /// Opcode (byte 0).
    pub const OPCODE: u16 = 0;
    /// FUSE and PSDT (byte 1).
    pub const FLAGS: u16 = 1;
    /// Namespace identifier.
    pub const NSID: u16 = 4;
    /// Data pointer (the SGL descriptor).
    pub const DPTR: u16 = 24;
    /// Command dword 10.
    pub const CDW10: u16 = 40;
    /// Command dword 11.
    pub const CDW11: u16 = 44;
    /// Command dword 12.
    pub const CDW12: u16 = 48;
}

/// `byte` and `bit` as a location.
const fn loc(byte: u16, bit: u16) -> u16 {
    byte | (bit << 8)
}

/// Where in `cmd` (an admin command) the error `status` lies.
pub fn param_error_location(cmd: &NvmeCmd, status: NvmeStatus) -> u16 {
    if status == NvmeStatus::INVALID_OPCODE {
        return at::OPCODE;
    }
    if status == NvmeStatus::INVALID_NAMESPACE {
        return at::NSID;
    }
    if status == NvmeStatus::DATA_SGL_LENGTH_INVALID
        || status == NvmeStatus::SGL_DESCRIPTOR_TYPE_INVALID
        || status == NvmeStatus::SGL_OFFSET_INVALID
    {
        return at::DPTR;
    }
    if status == NvmeStatus::INVALID_LOG_PAGE {
        return at::CDW10;
    }
    if status == NvmeStatus::FEATURE_NOT_SAVEABLE {
        // Set Features SV: CDW10 bit 31.
        return loc(at::CDW10 + 3, 7);
    }
    if status != NvmeStatus::INVALID_FIELD {
        return NO_LOCATION;
    }
    if cmd.fuse() != 0 {
        return loc(at::FLAGS, 0);
    }
    if cmd.psdt() != 1 {
        return loc(at::FLAGS, 6);
    }
    match AdminOpcode::from_code(cmd.opcode) {
        // The CNS: CDW10's low byte.
        Some(AdminOpcode::Identify) => at::CDW10,
        // A feature an I/O controller implements was given a bad value
        // (CDW11); any other feature identifier is itself the fault (CDW10).
        Some(AdminOpcode::SetFeatures | AdminOpcode::GetFeatures) => match cmd.cdw10 as u8 {
            fid::ARBITRATION
            | fid::POWER_MANAGEMENT
            | fid::TEMPERATURE_THRESHOLD
            | fid::VOLATILE_WRITE_CACHE
            | fid::NUMBER_OF_QUEUES
            | fid::ASYNC_EVENT_CONFIG
            | fid::KEEP_ALIVE_TIMER
            | fid::HOST_IDENTIFIER => at::CDW11,
            _ => at::CDW10,
        },
        Some(AdminOpcode::GetLogPage) => {
            // An offset (unaligned or past the end) is LPO's fault;
            // without one, the length (NUMDL, CDW10 bits 31:16) is.
            if GetLogPageCmd::from_cmd(cmd).lpo != 0 {
                at::CDW12
            } else {
                at::CDW10 + 2
            }
        }
        _ => NO_LOCATION,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::identify::IdentifyCmd;

    #[test]
    fn locations_name_the_field() {
        let id = IdentifyCmd::to_cmd(0x55, 0, 1);
        assert_eq!(param_error_location(&id, NvmeStatus::INVALID_FIELD), 40);
        assert_eq!(param_error_location(&id, NvmeStatus::INVALID_OPCODE), 0);
        assert_eq!(
            param_error_location(&id, NvmeStatus::DATA_SGL_LENGTH_INVALID),
            24
        );
        let mut g = GetLogPageCmd::to_cmd(2, 0, 512, 0, false, 1).unwrap_or_default();
        g.cdw12 = 2;
        assert_eq!(param_error_location(&g, NvmeStatus::INVALID_FIELD), 48);
        assert_eq!(param_error_location(&g, NvmeStatus::INVALID_LOG_PAGE), 40);
        assert_eq!(
            param_error_location(&g, NvmeStatus::COMMAND_SEQUENCE_ERROR),
            NO_LOCATION
        );
        let mut f = IdentifyCmd::to_cmd(1, 0, 1);
        f.flags |= 1;
        assert_eq!(param_error_location(&f, NvmeStatus::INVALID_FIELD), 1);
    }
}
