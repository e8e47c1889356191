//! The contract between the transport-independent connection core
//! ([`Connection`](super::Connection)) and a transport (iSER, later TCP).
//!
//! The core parses every PDU, runs login, the CmdSN window, SCSI execution
//! and PI; the transport only moves bytes:
//! - [`ConnOps::send_pdu`]: send one PDU (the transport adds its iSER
//!   header and copies header + data into a registered send buffer);
//!   with `invalidate`, as SEND_WITH_INVALIDATE of that rkey.
//! - [`ConnOps::read_data`]: RDMA READ `len` bytes from the initiator's
//!   buffer into a task buffer; `Pending` means call
//!   [`Connection::data_done`](super::Connection::data_done) later.
//! - [`ConnOps::write_data`]: RDMA WRITE a task buffer to the initiator.
//!   `Pending` (the iSER transport): the buffer is the WRITE's source
//!   until the device has read it, so the core keeps the task and sends
//!   the response only at
//!   [`Connection::data_done`](super::Connection::data_done); `Done`: the
//!   bytes are already out and the response may follow at once.
//! - [`ConnOps::close`]: tear the connection down once queued sends are out.
//! - [`ConnOps::close_after_logout`]: the Logout Response is queued; the
//!   initiator closes the connection (the transport waits for it, bounded).
//! - [`ConnOps::abort`]: tear it down now (its initiator stopped answering:
//!   queued sends may never complete).
//!
//! `Busy` is back-pressure: the core parks the task and retries at its
//! next [`poll`](super::Connection::poll).

use pollux_reactor::mem::DmaBuf;

use crate::pdu::{Stag, BHS_LEN};

/// The outcome of a data-movement request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transfer {
    /// Finished already (or posted with completion ordering guaranteed).
    Done,
    /// Posted; the transport calls back when it completes.
    Pending,
    /// No resources now; retry later.
    Busy,
}

/// What a transport does for the core.
pub trait ConnOps {
    /// Send one PDU with `data` as its data segment. `false` when no send
    /// slot is free (retry later).
    fn send_pdu(&mut self, bhs: &[u8; BHS_LEN], data: &[u8], invalidate: Option<u32>) -> bool;

    /// Pull `len` bytes from the initiator's `from` buffer into
    /// `buf[offset..offset + len]` (which stays put until completion).
    fn read_data(
        &mut self,
        task: u16,
        from: Stag,
        buf: &DmaBuf,
        offset: usize,
        len: usize,
    ) -> Transfer;

    /// Push `buf[..len]` into the initiator's `to` buffer.
    fn write_data(&mut self, task: u16, to: Stag, buf: &DmaBuf, len: usize) -> Transfer;

    /// Close the connection after the queued sends.
    fn close(&mut self);

    /// The connection ends in an orderly logout: the Logout Response is
    /// queued (the core is closed and takes no more PDUs). After a Logout
    /// Response it is the initiator that completely closes the logging-out
    /// connection (RFC 7143 §11.14; on TCP the target only half-closes), so
    /// a transport without a half-close (an RDMA CM disconnect ends both
    /// directions) should wait for the initiator's close and close the
    /// connection itself only when the initiator has not done so within a
    /// bounded grace. The default closes after the queued sends as
    /// [`close`](Self::close) does.
    fn close_after_logout(&mut self) {
        self.close();
    }

    /// Close the connection now, without waiting for the queued sends: the
    /// initiator is alive but silent (an RC SEND to a peer that posts no
    /// receive is retried without end), so they may never complete.
    fn abort(&mut self) {
        self.close();
    }
}
