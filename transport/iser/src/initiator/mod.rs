//! The iSER initiator, generic over the verbs
//! [`Provider`](pollux_verbs::Provider): one [`IserInitiator`] per
//! connection (= session, MaxConnections 1), polled by its owner. While
//! it waits for its target (connect, login, tasks outstanding, a ping,
//! logout) it holds the reactor it runs on awake (`Reactor::hold_awake`):
//! its completions cannot wake a reactor that sleeps in an adaptive or
//! hybrid idle mode.
//!
//! - Connect: RDMA CM with the 4-byte iSER CM header (ZBVA_NOT_SUP; plus
//!   SEND_W_INV_NOT_SUP unless [`InitiatorOptions::remote_invalidate`]);
//!   the reply's header says whether the target will invalidate.
//! - Login (driven by [`IserInitiator::poll`]): security stage
//!   (`AuthMethod=None`, names, session type) → operational stage
//!   ([`SessionParams::initiator_offer`](crate::session::SessionParams::initiator_offer),
//!   answers applied with `apply_answer`) → full feature phase.
//! - Tasks: [`IserInitiator::read`] / [`IserInitiator::write`] (READ(16)
//!   / WRITE(16) on a LU whose [`LunGeometry`] was set) and
//!   [`IserInitiator::submit`] (any CDB) take the caller's `SgList` and a
//!   context; [`IserInitiator::poll`] hands back a [`TaskResult`] with the
//!   SCSI status, sense, PI failure and the buffers. Each task with a data
//!   phase fast-registers its buffers (REG_MR chained before the command
//!   SEND; the STag and real VA go into the iSER header), and the
//!   registration is undone by the target's SEND_WITH_INV (the completion's
//!   with-invalidate flag and rkey are checked) or by a LOCAL_INV before the
//!   task completes. A provider without fast registration (user-space
//!   verbs on a device without memory windows, e.g. rxe) gets
//!   pre-registered memory instead ([`InitiatorOptions::pre_registered`]):
//!   each arena is registered once with remote access, the STag is its
//!   rkey, a task's data must be one contiguous buffer, and the CM header
//!   asks the target not to invalidate. Writes send up to FirstBurstLength
//!   (8 KiB at most) as immediate data; the rest is RDMA-READ by the
//!   target. The CmdSN window is honoured (`SubmitError::Busy`).
//! - T10 PI ([`PiPolicy`]), Types 1-3 (Type 2 in READ(32)/WRITE(32), the
//!   CDB's bytes 16.. in an extended CDB AHS): with signature offload one
//!   integrity MR per task, wire domain T10 DIF and memory domain none
//!   (insert: the provider generates on write and checks + strips on read)
//!   or DIX ([`PiPolicy::Dix`]: the caller's tuples follow the data in its
//!   `SgList`, registered as the MR's protection SGEs, checked both ways);
//!   the signature status is read after the response. Otherwise
//!   `pollux-pi` does the same in software through a per-task bounce slot.
//!   Initiator-detected errors come back as [`TaskResult::pi_error`] with
//!   the LBA and as ILLEGAL REQUEST 10/0x.
//! - [`IserInitiator::send_targets`] (discovery), [`IserInitiator::logout`].
//! - [`scsi`]: CDB builders and parsers for LUN discovery.

mod error;
mod options;
mod pi;
pub mod scsi;
mod session;
mod task;

pub use error::{InitiatorError, SubmitError};
pub use options::{InitiatorOptions, PiEngine, PiPolicy, PiPolicyError, SessionKind};
pub use pi::pi_sense;
pub use scsi::LunGeometry;
pub use session::{InitiatorStats, IserInitiator, SessionState};
pub use task::{DataDir, Invalidation, PiFailure, TaskResult};
