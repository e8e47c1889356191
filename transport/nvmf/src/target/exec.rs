//! Execution dispatch: a `ReadyToExecute` request goes to the fabrics,
//! admin or I/O command code.

use super::qpair::{ExecOutcome, QueuePair};
use super::req::Exec;

impl QueuePair {
    /// Run request `slot`'s command.
    pub(crate) fn execute(&mut self, slot: u16) -> ExecOutcome {
        match self.reqs[usize::from(slot)].plan.exec {
            Exec::Connect => ExecOutcome::Done(self.exec_connect(slot)),
            Exec::PropertyGet => ExecOutcome::Done(self.exec_property_get(slot)),
            Exec::PropertySet => ExecOutcome::Done(self.exec_property_set(slot)),
            Exec::Admin(op) => self.exec_admin(slot, op),
            Exec::Read | Exec::Write | Exec::Flush | Exec::WriteZeroes | Exec::Dsm => {
                self.exec_io(slot)
            }
        }
    }
}
