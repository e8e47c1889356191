//! The iSER target transport over `pollux_verbs::Provider` — **not written
//! yet**. The intended shape (same as `pollux_nvmf::target::rdma`):
//!
//! - `IserTransport<P>` (`Send + Sync`): listeners per portal group,
//!   options (receive buffer size 76 + 8192, queue depth).
//! - `IserPollGroup<P>` (one per reactor, `!Send`): PD, one CQ, one SRQ
//!   with receive buffers of 76 + 8192 bytes, the task-buffer arenas of
//!   [`IscsiTarget::arenas`](super::IscsiTarget::arenas) registered once,
//!   CM accept with the 4-byte iSER CM header
//!   ([`IserCmHdr`](crate::pdu::IserCmHdr): REP = ZBVA_NOT_USED, plus
//!   SEND_W_INV_NOT_USED when the REQ had 0x40 set), and one
//!   [`Connection`](super::Connection) per QP driven through a
//!   [`ConnOps`](super::ConnOps) impl: `send_pdu` = SEND (or
//!   SEND_WITH_INV) of iSER header + BHS + data from a send slot,
//!   `read_data` = RDMA READ (signaled) into the task buffer,
//!   `write_data` = unsignaled RDMA WRITE chained before the response.
