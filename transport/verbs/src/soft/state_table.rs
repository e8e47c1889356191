//! The RC QP state table (`ibv_modify_qp`), as in verbs-semantics §2.

use crate::types::QpState;

/// Whether `from → to` is allowed: RESET→INIT, INIT→INIT, INIT→RTR,
/// RTR→RTS, RTS→RTS, RTS→SQD, SQD→SQD, SQD→RTS, SQE→RTS, any→RESET, any→ERR.
pub fn transition_allowed(from: QpState, to: QpState) -> bool {
    use QpState::*;
    matches!(
        (from, to),
        (_, Reset)
            | (_, Err)
            | (Reset, Init)
            | (Init, Init)
            | (Init, Rtr)
            | (Rtr, Rts)
            | (Rts, Rts)
            | (Rts, Sqd)
            | (Sqd, Sqd)
            | (Sqd, Rts)
            | (Sqe, Rts)
    )
}

/// Whether send WRs are accepted (and executed or flushed) in `s`.
pub fn send_allowed(s: QpState) -> bool {
    matches!(s, QpState::Rts | QpState::Sqd | QpState::Sqe | QpState::Err)
}

/// Whether receive WRs are accepted in `s`.
pub fn recv_allowed(s: QpState) -> bool {
    !matches!(s, QpState::Reset)
}

/// Whether inbound messages are processed in `s`.
pub fn inbound_processed(s: QpState) -> bool {
    matches!(s, QpState::Rtr | QpState::Rts | QpState::Sqd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use QpState::*;

    const ALL: [QpState; 7] = [Reset, Init, Rtr, Rts, Sqd, Sqe, Err];

    #[test]
    fn table_matches_the_spec_exactly() {
        let mut allowed = 0;
        for f in ALL {
            for t in ALL {
                if transition_allowed(f, t) {
                    allowed += 1;
                }
            }
        }
        // 7 sources × {RESET, ERR} + 9 listed = 23.
        assert_eq!(allowed, 23);
        assert!(!transition_allowed(Reset, Rtr));
        assert!(!transition_allowed(Init, Rts));
        assert!(!transition_allowed(Err, Rts));
        assert!(!transition_allowed(Rtr, Init));
        assert!(transition_allowed(Sqe, Rts));
    }
}
