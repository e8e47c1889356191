//! Sequence numbers (RFC 7143 §4.2.2): serial arithmetic (RFC 1982) and
//! the CmdSN window the target enforces.

/// `a < b` in 32-bit serial arithmetic.
#[inline]
pub fn sn_lt(a: u32, b: u32) -> bool {
    a != b && b.wrapping_sub(a) < 0x8000_0000
}

/// `a <= b` in 32-bit serial arithmetic.
#[inline]
pub fn sn_le(a: u32, b: u32) -> bool {
    a == b || sn_lt(a, b)
}

/// What to do with a command's CmdSN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmdSnCheck {
    /// Execute it (and, if not immediate, the window advanced).
    Accept,
    /// Outside `ExpCmdSN..=MaxCmdSN` (or a gap on a single connection):
    /// drop it silently (RFC 7143: a target discards such commands).
    Drop,
}

/// The session's command window, kept by the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmdWindow {
    exp_cmd_sn: u32,
    depth: u32,
    /// Commands accepted and not yet answered.
    outstanding: u32,
}

impl CmdWindow {
    /// A window starting at `initial_cmd_sn` with room for `depth` (≥ 1)
    /// outstanding commands.
    pub fn new(initial_cmd_sn: u32, depth: u32) -> CmdWindow {
        CmdWindow {
            exp_cmd_sn: initial_cmd_sn,
            depth: depth.max(1),
            outstanding: 0,
        }
    }

    /// ExpCmdSN.
    pub fn exp_cmd_sn(&self) -> u32 {
        self.exp_cmd_sn
    }

    /// MaxCmdSN: ExpCmdSN + free slots − 1 (ExpCmdSN − 1 closes the window).
    pub fn max_cmd_sn(&self) -> u32 {
        let free = self.depth.saturating_sub(self.outstanding);
        self.exp_cmd_sn.wrapping_add(free).wrapping_sub(1)
    }

    /// Check a PDU's CmdSN. Non-immediate commands must carry exactly
    /// ExpCmdSN (one connection per session delivers in order) and fit in
    /// the window; they advance ExpCmdSN and take a slot. Immediate commands
    /// carry the current ExpCmdSN-ish value and are not windowed (`takes_slot`
    /// still counts them when they hold a task).
    pub fn check(&mut self, cmd_sn: u32, immediate: bool, takes_slot: bool) -> CmdSnCheck {
        if immediate {
            if takes_slot {
                self.outstanding = self.outstanding.saturating_add(1);
            }
            return CmdSnCheck::Accept;
        }
        if cmd_sn != self.exp_cmd_sn || !sn_le(cmd_sn, self.max_cmd_sn()) {
            return CmdSnCheck::Drop;
        }
        if self.outstanding >= self.depth {
            return CmdSnCheck::Drop;
        }
        self.exp_cmd_sn = self.exp_cmd_sn.wrapping_add(1);
        if takes_slot {
            self.outstanding += 1;
        }
        CmdSnCheck::Accept
    }

    /// A command that took a slot finished.
    pub fn release(&mut self) {
        self.outstanding = self.outstanding.saturating_sub(1);
    }

    /// Commands holding a slot.
    pub fn outstanding(&self) -> u32 {
        self.outstanding
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_arithmetic_wraps() {
        assert!(sn_lt(1, 2));
        assert!(sn_lt(u32::MAX, 0));
        assert!(!sn_lt(0, u32::MAX));
        assert!(sn_le(5, 5));
    }

    #[test]
    fn window_opens_closes_and_drops() {
        let mut w = CmdWindow::new(u32::MAX - 1, 2);
        assert_eq!(w.max_cmd_sn(), u32::MAX);
        assert_eq!(w.check(u32::MAX - 1, false, true), CmdSnCheck::Accept);
        assert_eq!(w.check(u32::MAX, false, true), CmdSnCheck::Accept);
        // Window closed: MaxCmdSN = ExpCmdSN - 1.
        assert_eq!(w.exp_cmd_sn(), 0);
        assert_eq!(w.max_cmd_sn(), u32::MAX);
        assert_eq!(w.check(0, false, true), CmdSnCheck::Drop);
        w.release();
        assert_eq!(w.max_cmd_sn(), 0);
        assert_eq!(w.check(0, false, true), CmdSnCheck::Accept);
        // Duplicate and gap are dropped.
        w.release();
        w.release();
        assert_eq!(w.check(0, false, true), CmdSnCheck::Drop);
        assert_eq!(w.check(5, false, true), CmdSnCheck::Drop);
        // Immediate commands pass and do not advance.
        assert_eq!(w.check(1, true, false), CmdSnCheck::Accept);
        assert_eq!(w.exp_cmd_sn(), 1);
        // A non-slot command (NOP-Out with CmdSN) advances without a slot.
        assert_eq!(w.check(1, false, false), CmdSnCheck::Accept);
        assert_eq!(w.outstanding(), 0);
    }
}
