//! The Commands Supported and Effects log (05h) of an I/O controller: the
//! admin and NVM commands this target executes, with what each may change.
//! [`classify_admin`](super::QueuePair) and `classify_io` accept exactly
//! these opcodes (the `effects_log_lists_exactly_what_executes` test in
//! `tests/admin.rs` checks it over the loopback transport).

use crate::spec::cmd::{AdminOpcode, IoOpcode};
use crate::spec::log_page::{effects, encode_cmd_effects, CMD_EFFECTS_LOG_SIZE};

/// Admin commands of an I/O controller and their effects. Set Features
/// changes nothing the host caches (Number of Queues only before I/O
/// queues exist; the others are accepted without effect).
const ADMIN: [(AdminOpcode, u32); 7] = [
    (AdminOpcode::GetLogPage, effects::CSUPP),
    (AdminOpcode::Identify, effects::CSUPP),
    (AdminOpcode::Abort, effects::CSUPP),
    (AdminOpcode::SetFeatures, effects::CSUPP),
    (AdminOpcode::GetFeatures, effects::CSUPP),
    (AdminOpcode::AsyncEventRequest, effects::CSUPP),
    (AdminOpcode::KeepAlive, effects::CSUPP),
];

/// NVM commands and their effects: the writes change logical block
/// content.
const IO: [(IoOpcode, u32); 5] = [
    (IoOpcode::Flush, effects::CSUPP),
    (IoOpcode::Write, effects::CSUPP | effects::LBCC),
    (IoOpcode::Read, effects::CSUPP),
    (IoOpcode::WriteZeroes, effects::CSUPP | effects::LBCC),
    (IoOpcode::DatasetManagement, effects::CSUPP | effects::LBCC),
];

/// The log page.
pub(crate) fn cmd_effects_log() -> [u8; CMD_EFFECTS_LOG_SIZE] {
    let admin = ADMIN.map(|(op, e)| (op.code(), e));
    let io = IO.map(|(op, e)| (op.code(), e));
    encode_cmd_effects(&admin, &io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::log_page::cmd_effects_of;

    #[test]
    fn writes_change_block_content() {
        let b = cmd_effects_log();
        let w = cmd_effects_of(&b, false, IoOpcode::Write.code()).unwrap_or(0);
        assert_eq!(w, effects::CSUPP | effects::LBCC);
        let r = cmd_effects_of(&b, false, IoOpcode::Read.code()).unwrap_or(0);
        assert_eq!(r, effects::CSUPP);
        let create = cmd_effects_of(&b, true, AdminOpcode::CreateIoSq.code()).unwrap_or(1);
        assert_eq!(create, 0, "queue creation is not a fabrics command");
    }
}
