//! One NVMe/TCP queue on the target: its socket, the receive state machine
//! over the byte stream, the send buffer, the R2T table, the core's
//! [`QueuePair`] and the [`QpairOps`] that move its data.
//!
//! Receive: one non-blocking `read` into the connection's receive buffer,
//! then every whole PDU in it is handled where it lies: a command capsule
//! goes to the core from the buffer itself (no copy when the SQE and its
//! in-capsule data are contiguous, i.e. no header digest and no padding;
//! else one copy into a scratch capsule); an H2CData payload goes into the
//! request's data buffers, straight from the socket (`read` into the
//! buffer slice) once the receive buffer holds no more of it.
//!
//! Send: PDUs (ICResp, R2T, C2HData headers, CapsuleResp, C2HTermReq) are
//! appended to one send buffer; read data of a page or more stays in the
//! request's buffers and goes out by scatter-gather beside the headers
//! ([`TxQueue`]), the response `Pending` until its last byte is written
//! (smaller payloads are copied, and their response is
//! [`Transfer::Done`] at once). The queue is written once per poll with
//! as few `writev` calls as the socket takes; a partial write resumes at
//! the next poll.
//!
//! Bad input ends the connection with a C2HTermReq carrying the fatal
//! error status and field offset of the [`TcpPduError`], after which the
//! queue is torn down: every transfer still waiting for host data is
//! failed back to the core, then the core's queue is dropped.

use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use pollux_reactor::mem::SgList;
use pollux_reactor::Reactor;

use super::super::error::CapsuleError;
use super::super::qpair::QueuePair;
use super::super::transport::{QpairOps, RemoteBuf, ReqTag, Response, Transfer, TransportError};
use super::quiet::{QuietSet, CORE_EVERY_QUIET, QUIET_AFTER};
use super::transport::TcpTransport;
use super::tx_queue::{TxQueue, BY_REF_MIN};
use super::wake;
use crate::sg_at;
use crate::spec::cpl::{NvmeCompletion, NvmeStatus};
use crate::spec::tcp::{
    crc32c, crc32c_append, C2hData, CapsuleCmdHdr, CapsuleResp, CommonHeader, Digests, Frame,
    H2cData, IcReq, IcResp, PduType, R2t, SendLayout, TcpPduError, TermReq, CH_LEN, DIGEST_LEN,
    FLAG_LAST_PDU, FLAG_SUCCESS, IC_PDU_LEN, MAX_HEADER_LEN, SHORT_HLEN, TERM_REQ_MAX_DATA,
};
use crate::spec::SQE_SIZE;
use crate::tcp_bufs::{RecvBuf, MAX_PAD};
use crate::tcp_sock::NoSigpipe;

/// Reads per poll per socket at most (fairness between sockets); a read
/// that takes less than it offered ends the poll's reading.
const READS_PER_POLL: usize = 4;
/// Data phases at least this long are read straight into the request's
/// buffers once the receive buffer is empty.
const DIRECT_MIN: usize = 1024;
/// Unsent bytes above which responses answer `Busy` (back-pressure).
const TX_HIGH_WATER: usize = 4 << 20;
/// Polls a closing connection waits for its last bytes (the TermReq) to
/// leave before it is dropped anyway.
const CLOSE_POLLS: u32 = 10_000;

/// One outstanding host-to-controller transfer (by request slot).
#[derive(Debug, Clone, Copy, Default)]
struct Xfer {
    active: bool,
    tag: Option<ReqTag>,
    cccid: u16,
    total: u32,
    /// End of the data asked for by R2Ts so far.
    asked: u32,
    /// Data received so far (the next DATAO expected).
    received: u32,
    /// A data digest failed: the command fails once its data is in.
    failed: bool,
}

/// Where the receive state machine is.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Waiting for (the rest of) a PDU header.
    Header,
    /// An H2CData payload for request slot `slot`: `left` bytes still to
    /// come, the next at `off` in the request's data.
    Data {
        slot: usize,
        off: usize,
        left: usize,
        crc: u32,
        ddgst: bool,
        last_of_pdu: usize,
    },
    /// The data digest of that payload.
    DataDigest { slot: usize, crc: u32, len: usize },
}

/// The send half: buffered PDUs, and what the core's callbacks need.
pub(super) struct TcpOps {
    tx: TxQueue,
    xfers: Vec<Xfer>,
    /// Transfers the core started whose first R2T is not out yet.
    new_xfers: Vec<ReqTag>,
    maxh2cdata: u32,
    max_c2h: usize,
    c2h_success: bool,
    /// The core asked to disconnect, or the connection is closing.
    closing: bool,
    /// The core asked to disconnect.
    core_disconnect: bool,
}

impl TcpOps {
    fn push_r2t(&mut self, slot: usize) {
        let Some(x) = self.xfers.get_mut(slot) else {
            return;
        };
        let len = (x.total - x.asked).min(self.maxh2cdata);
        let r = R2t {
            cccid: x.cccid,
            ttag: slot as u16,
            r2to: x.asked,
            r2tl: len,
        };
        x.asked += len;
        self.tx.push_pdu(PduType::R2t, &r.encode(), 0, 0);
    }
}

impl QpairOps for TcpOps {
    fn data_from_host(
        &mut self,
        tag: ReqTag,
        remote: &RemoteBuf,
        _bufs: &mut SgList,
    ) -> Result<Transfer, TransportError> {
        if self.closing {
            return Err(TransportError::Disconnected);
        }
        if remote.len == 0 {
            return Ok(Transfer::Done);
        }
        let Some(x) = self.xfers.get_mut(tag.slot()) else {
            return Err(TransportError::Other(format!(
                "request slot {} beyond the R2T table",
                tag.slot()
            )));
        };
        *x = Xfer {
            active: true,
            tag: Some(tag),
            cccid: 0,
            total: remote.len,
            asked: 0,
            received: 0,
            failed: false,
        };
        // The R2T goes out after the core returns (it names the CID).
        self.new_xfers.push(tag);
        Ok(Transfer::Pending)
    }

    fn send_response(
        &mut self,
        tag: ReqTag,
        rsp: &Response<'_>,
    ) -> Result<Transfer, TransportError> {
        if self.closing {
            return Err(TransportError::Disconnected);
        }
        if self.tx.unsent() > TX_HIGH_WATER {
            return Ok(Transfer::Busy);
        }
        let cpl = &rsp.cpl;
        let mut success_sent = false;
        let mut by_ref = false;
        if let Some(d) = &rsp.data {
            let total = d.len.min(d.remote.len) as usize;
            // From the request's buffers when they hold all of it.
            by_ref = total >= BY_REF_MIN && d.bufs.iter().map(|b| b.len()).sum::<usize>() >= total;
            // SUCCESS only for a plain success (no result dwords to carry).
            let success =
                self.c2h_success && cpl.status.is_success() && cpl.dw0 == 0 && cpl.dw1 == 0;
            let mut off = 0;
            while off < total {
                let n = (total - off).min(self.max_c2h);
                let last = off + n == total;
                let mut flags = 0;
                if last {
                    flags |= FLAG_LAST_PDU;
                    if success {
                        flags |= FLAG_SUCCESS;
                        success_sent = true;
                    }
                }
                let h = C2hData {
                    cccid: cpl.cid,
                    datao: off as u32,
                    datal: n as u32,
                };
                if by_ref {
                    self.tx.push_pdu(PduType::C2hData, &h.encode(), flags, n);
                    self.tx.push_ref(tag, d.bufs, off, n);
                } else {
                    self.tx
                        .push_pdu_copy(PduType::C2hData, &h.encode(), flags, d.bufs, off, n);
                }
                off += n;
            }
        }
        if !success_sent {
            self.tx
                .push_pdu(PduType::CapsuleResp, &CapsuleResp::encode(&rsp.cqe), 0, 0);
        }
        if by_ref {
            self.tx.mark(tag);
            return Ok(Transfer::Pending);
        }
        Ok(Transfer::Done)
    }

    fn disconnect(&mut self) {
        self.core_disconnect = true;
        self.closing = true;
    }
}

/// One connection (queue) on its poll group's reactor.
pub(super) struct TcpConn {
    sock: TcpStream,
    qp: QueuePair,
    ops: TcpOps,
    transport: Arc<TcpTransport>,
    rx: RecvBuf,
    phase: Phase,
    capsule: Vec<u8>,
    ic_done: bool,
    digests: Digests,
    capsule_limit: u32,
    peer_gone: bool,
    close_polls: u32,
    /// A fatal protocol error ended the connection (a TermReq was sent).
    pub(super) terminated: bool,
    /// Requests whose responses one flush finished (capacity: all).
    sent: Vec<ReqTag>,
    /// The socket as a wake source of the reactor (adaptive idle mode).
    wake: Option<pollux_reactor::WakeWatch>,
    /// Polls in a row whose read found the socket empty (and nothing
    /// buffered).
    empty_reads: u32,
    /// Watched by the group's [`QuietSet`] (so it may turn quiet).
    watched: bool,
    /// Quiet: read only when the group's set reports bytes.
    quiet: bool,
    /// The set reported bytes (or a hang-up) since the last read.
    readable: bool,
    /// Polls skipped in a row while quiet with nothing in flight.
    skipped_polls: u32,
    /// Reads of the socket issued (diagnostics, tests).
    reads: u64,
}

impl TcpConn {
    pub(super) fn new(sock: TcpStream, qp: QueuePair, transport: &Arc<TcpTransport>) -> Self {
        let o = &transport.opts;
        let capsule_limit = o.capsule_limit();
        let rx_len = (64 * 1024).max(capsule_limit as usize + MAX_HEADER_LEN + MAX_PAD + 64);
        let nreq = qp.requests();
        TcpConn {
            sock,
            qp,
            ops: TcpOps {
                tx: TxQueue::new(64 * 1024, nreq),
                xfers: vec![Xfer::default(); nreq],
                new_xfers: Vec::with_capacity(nreq),
                maxh2cdata: o.maxh2cdata,
                max_c2h: o.max_c2h_data as usize,
                c2h_success: false,
                closing: false,
                core_disconnect: false,
            },
            transport: Arc::clone(transport),
            rx: RecvBuf::new(rx_len),
            phase: Phase::Header,
            capsule: Vec::with_capacity(SQE_SIZE + capsule_limit as usize),
            ic_done: false,
            digests: Digests::default(),
            capsule_limit,
            peer_gone: false,
            close_polls: 0,
            terminated: false,
            sent: Vec::with_capacity(nreq),
            wake: None,
            empty_reads: 0,
            watched: false,
            quiet: false,
            readable: false,
            skipped_polls: 0,
            reads: 0,
        }
    }

    /// Wake `reactor` from an adaptive sleep when this socket has bytes.
    pub(super) fn watch(&mut self, reactor: &Reactor) {
        self.wake = wake::watch(reactor, &self.sock);
    }

    /// The core's queue (tests, stats).
    pub(super) fn queue(&self) -> &QueuePair {
        &self.qp
    }

    /// Receive, run the core, send. Returns whether it did work; `done`
    /// is set when the connection is finished and may be dropped.
    /// A quiet connection reads only once the group's set (`quiet`)
    /// reported its socket ([`mark_readable`](Self::mark_readable)); one
    /// whose reads found nothing [`QUIET_AFTER`] polls in a row turns quiet.
    ///
    /// A quiet connection with no command in flight (an AER waiting for an
    /// event does not count) and nothing to send can only be woken by its
    /// socket (watched), a controller event or a deadline: its queue pair
    /// is polled on every [`CORE_EVERY_QUIET`]th poll only.
    pub(super) fn poll(&mut self, done: &mut bool, quiet: &mut QuietSet) -> bool {
        if self.quiet
            && !self.readable
            && !self.ops.closing
            && self.qp.working() == 0
            && self.ops.tx.is_empty()
        {
            self.skipped_polls += 1;
            if self.skipped_polls < CORE_EVERY_QUIET {
                return false;
            }
        }
        self.skipped_polls = 0;
        let mut busy = false;
        if !self.ops.closing && (!self.quiet || std::mem::take(&mut self.readable)) {
            let got = self.receive();
            busy |= got;
            self.note_read(got, quiet);
        }
        self.ops.c2h_success = self.transport.opts.c2h_success && self.qp.sq_flow_disabled();
        busy |= self.qp.poll(&mut self.ops).is_busy();
        self.issue_r2ts();
        busy |= self.flush();
        // Bytes the socket did not take yet keep the reactor awake (its
        // wake-up watches readability only).
        busy |= !self.ops.tx.is_empty();
        if self.ops.closing {
            *done = self.close_step();
        }
        busy
    }

    /// Move between busy and quiet after a read: bytes (or bytes left
    /// buffered) make it busy, [`QUIET_AFTER`] empty reads in a row quiet.
    fn note_read(&mut self, got: bool, quiet: &mut QuietSet) {
        if got || self.rx.head != self.rx.tail {
            self.empty_reads = 0;
            if self.quiet {
                self.quiet = false;
                quiet.leave();
            }
        } else if self.watched && !self.quiet {
            self.empty_reads += 1;
            if self.empty_reads >= QUIET_AFTER {
                self.empty_reads = 0;
                self.quiet = true;
                quiet.enter();
            }
        }
    }

    /// Join the group's set (on adoption), as the group's connection `index`.
    pub(super) fn join_quiet_set(&mut self, quiet: &mut QuietSet, index: usize) {
        self.watched = quiet.watch(&self.sock, index);
    }

    /// This connection moved to `index` in the group: re-tag its entry in
    /// the set. If the kernel refuses, it leaves the set and is read on
    /// every poll from then on.
    pub(super) fn moved_in_quiet_set(&mut self, quiet: &mut QuietSet, index: usize) {
        if self.watched && !quiet.retag(&self.sock, index) {
            self.leave_quiet_set(quiet);
        }
    }

    /// Leave the group's set (the connection goes).
    pub(super) fn leave_quiet_set(&mut self, quiet: &mut QuietSet) {
        if self.quiet {
            self.quiet = false;
            quiet.leave();
        }
        if self.watched {
            self.watched = false;
            quiet.unwatch(&self.sock);
        }
    }

    /// The group's set reported this socket readable: read it next poll.
    pub(super) fn mark_readable(&mut self) {
        self.readable = true;
    }

    /// Whether it is quiet (read only when the group's set reports bytes).
    pub(super) fn is_quiet(&self) -> bool {
        self.quiet
    }

    /// Reads of the socket issued so far.
    pub(super) fn reads(&self) -> u64 {
        self.reads
    }

    /// `(SO_RCVBUF, SO_SNDBUF)` of the socket, as the kernel reports them.
    pub(super) fn socket_buffers(&self) -> Option<(usize, usize)> {
        let s = socket2::SockRef::from(&self.sock);
        Some((s.recv_buffer_size().ok()?, s.send_buffer_size().ok()?))
    }

    /// The socket's TCP keep-alive as the kernel reports it: `None` when
    /// off, else (idle, interval, probes).
    #[cfg(test)]
    pub(super) fn socket_keepalive(
        &self,
    ) -> Option<(std::time::Duration, std::time::Duration, u32)> {
        let s = socket2::SockRef::from(&self.sock);
        if !s.keepalive().ok()? {
            return None;
        }
        Some((
            s.tcp_keepalive_time().ok()?,
            s.tcp_keepalive_interval().ok()?,
            s.tcp_keepalive_retries().ok()?,
        ))
    }

    /// Close at once (the poll group is going away): fail what waits for
    /// host data, close the socket.
    pub(super) fn shut_down(&mut self) {
        self.ops.closing = true;
        self.fail_transfers();
        self.release_responses();
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }

    /// The first R2T of each transfer the core started.
    fn issue_r2ts(&mut self) {
        while let Some(tag) = self.ops.new_xfers.pop() {
            let Some(cid) = self.qp.command_id(tag) else {
                continue;
            };
            let slot = tag.slot();
            if let Some(x) = self.ops.xfers.get_mut(slot) {
                x.cccid = cid;
            }
            self.ops.push_r2t(slot);
        }
    }

    /// Write what the send queue holds, and free the requests whose
    /// responses are out; `true` when it wrote.
    fn flush(&mut self) -> bool {
        let sent = &mut self.sent;
        let res = self
            .ops
            .tx
            .flush(&mut NoSigpipe(&self.sock), &self.qp, &mut |t| sent.push(t));
        for t in self.sent.drain(..) {
            self.qp.response_sent(t);
        }
        match res {
            Ok(wrote) => wrote,
            Err(e) => {
                log::debug!("nvmf tcp: send failed: {e}");
                self.peer_gone = true;
                self.ops.closing = true;
                false
            }
        }
    }

    /// One step of closing: fail what waits for host data, let the last
    /// bytes leave; `true` when the connection can be dropped.
    fn close_step(&mut self) -> bool {
        self.fail_transfers();
        self.close_polls += 1;
        if self.peer_gone || self.close_polls > CLOSE_POLLS {
            self.release_responses();
        }
        let drained = self.ops.tx.is_empty();
        if (drained || self.peer_gone || self.close_polls > CLOSE_POLLS)
            && self.qp.transfers_in_flight() == 0
        {
            let _ = self.sock.shutdown(std::net::Shutdown::Both);
            return true;
        }
        false
    }

    /// Drop what was not sent and free the requests whose data it held.
    fn release_responses(&mut self) {
        let sent = &mut self.sent;
        self.ops.tx.discard(&mut |t| sent.push(t));
        for t in self.sent.drain(..) {
            self.qp.response_sent(t);
        }
    }

    fn fail_transfers(&mut self) {
        self.ops.new_xfers.clear();
        for slot in 0..self.ops.xfers.len() {
            let x = self.ops.xfers[slot];
            if !x.active {
                continue;
            }
            self.ops.xfers[slot].active = false;
            if let Some(tag) = x.tag {
                self.qp
                    .transfer_done(tag, Err(TransportError::Disconnected), &mut self.ops);
            }
        }
    }

    /// Read and handle PDUs; `true` when bytes came in.
    fn receive(&mut self) -> bool {
        let mut busy = false;
        for _ in 0..READS_PER_POLL {
            if let Err(e) = self.handle_buffered() {
                self.fatal(e);
                return true;
            }
            if self.ops.closing {
                return true;
            }
            let got = if self.rx.head == self.rx.tail && self.direct_target().is_some() {
                self.read_direct()
            } else {
                self.read_buffered()
            };
            match got {
                Ok(0) => {
                    log::debug!("nvmf tcp: the host closed the connection");
                    self.peer_gone = true;
                    self.ops.closing = true;
                    return true;
                }
                Ok(_) => {
                    busy = true;
                    if self.rx.drained {
                        // The socket had no more: no read that would
                        // only fail with `WouldBlock`.
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    log::debug!("nvmf tcp: receive failed: {e}");
                    self.peer_gone = true;
                    self.ops.closing = true;
                    return true;
                }
            }
        }
        if let Err(e) = self.handle_buffered() {
            self.fatal(e);
        }
        busy
    }

    fn read_buffered(&mut self) -> std::io::Result<usize> {
        self.reads += 1;
        self.rx.fill(&mut self.sock)
    }

    /// The request slot a data phase would read straight into.
    fn direct_target(&self) -> Option<usize> {
        match self.phase {
            Phase::Data { slot, left, .. } if left >= DIRECT_MIN => {
                self.ops.xfers.get(slot).filter(|x| x.active && !x.failed)?;
                Some(slot)
            }
            _ => None,
        }
    }

    /// Read payload bytes straight into the request's buffers.
    fn read_direct(&mut self) -> std::io::Result<usize> {
        let Phase::Data {
            slot, off, left, ..
        } = self.phase
        else {
            return Ok(usize::MAX);
        };
        let Some(tag) = self.ops.xfers.get(slot).and_then(|x| x.tag) else {
            return self.read_buffered();
        };
        let Some(bufs) = self.qp.incoming_bufs(tag) else {
            return self.read_buffered();
        };
        let dst = sg_at::slice_at_mut(bufs, off);
        let n = dst.len().min(left);
        if n == 0 {
            return self.read_buffered();
        }
        self.reads += 1;
        let got = self.sock.read(&mut dst[..n])?;
        self.rx.drained = got < n;
        if got > 0 {
            let crc_in = &dst[..got];
            if let Phase::Data { crc, ddgst, .. } = &mut self.phase {
                if *ddgst {
                    *crc = crc32c_append(*crc, crc_in);
                }
            }
            self.advance_data(got);
        }
        Ok(got)
    }

    /// Account `n` payload bytes of the data phase; finish the PDU when
    /// they were the last.
    fn advance_data(&mut self, n: usize) {
        if let Phase::Data {
            slot,
            off,
            left,
            crc,
            ddgst,
            last_of_pdu,
        } = self.phase
        {
            let left = left - n;
            if left > 0 {
                self.phase = Phase::Data {
                    slot,
                    off: off + n,
                    left,
                    crc,
                    ddgst,
                    last_of_pdu,
                };
            } else if ddgst {
                self.phase = Phase::DataDigest {
                    slot,
                    crc,
                    len: last_of_pdu,
                };
            } else {
                self.phase = Phase::Header;
                self.h2c_done(slot, last_of_pdu, true);
            }
        }
    }

    /// Handle every whole PDU (and payload bytes) in the receive buffer.
    fn handle_buffered(&mut self) -> Result<(), TcpPduError> {
        loop {
            if self.ops.closing {
                return Ok(());
            }
            let avail = self.rx.tail - self.rx.head;
            match self.phase {
                Phase::Data {
                    slot, off, left, ..
                } => {
                    if avail == 0 {
                        return Ok(());
                    }
                    let n = avail.min(left);
                    let src = self.rx.head..self.rx.head + n;
                    let usable = self.ops.xfers.get(slot).filter(|x| x.active && !x.failed);
                    if let Some(tag) = usable.and_then(|x| x.tag) {
                        if let Some(bufs) = self.qp.incoming_bufs(tag) {
                            sg_at::write_at(bufs, off, &self.rx.buf[src.clone()]);
                        }
                    }
                    if let Phase::Data {
                        crc, ddgst: true, ..
                    } = &mut self.phase
                    {
                        *crc = crc32c_append(*crc, &self.rx.buf[src]);
                    }
                    self.rx.head += n;
                    self.advance_data(n);
                }
                Phase::DataDigest { slot, crc, len } => {
                    if avail < DIGEST_LEN {
                        return Ok(());
                    }
                    let got = crate::spec::le32(&self.rx.buf, self.rx.head);
                    self.rx.head += DIGEST_LEN;
                    self.phase = Phase::Header;
                    if got != crc {
                        log::debug!("nvmf tcp: H2CData data digest mismatch");
                    }
                    self.h2c_done(slot, len, got == crc);
                }
                Phase::Header => {
                    if avail < CH_LEN {
                        return Ok(());
                    }
                    if !self.handle_pdu()? {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Handle the PDU at `head` if enough of it is here; `false` to wait.
    fn handle_pdu(&mut self) -> Result<bool, TcpPduError> {
        let avail = self.rx.tail - self.rx.head;
        let ch = CommonHeader::parse(&self.rx.buf[self.rx.head..self.rx.tail]);
        let is_ic = ch.pdu_type == PduType::IcReq.code();
        if self.ic_done == is_ic {
            return Err(TcpPduError::Sequence {
                pdu_type: ch.pdu_type,
                why: if is_ic {
                    "a second ICReq"
                } else {
                    "a PDU before ICReq"
                },
            });
        }
        let max_data = if ch.pdu_type == PduType::H2cData.code() {
            self.ops.maxh2cdata
        } else {
            self.capsule_limit
        };
        let f = Frame::check(&ch, true, self.digests, max_data)?;
        let need = match f.pdu_type {
            PduType::H2cData => f.data_offset,
            _ => f.plen,
        };
        if avail < need {
            return Ok(false);
        }
        let pdu = self.rx.head..self.rx.head + need;
        f.verify_hdgst(&self.rx.buf[pdu.clone()])?;
        match f.pdu_type {
            PduType::IcReq => {
                self.handle_icreq()?;
                self.rx.head += need;
            }
            PduType::CapsuleCmd => {
                self.handle_capsule(&f)?;
                self.rx.head += need;
            }
            PduType::H2cData => {
                let h = H2cData::parse(&self.rx.buf[pdu], f.data_len)?;
                if h.datal == 0 {
                    return Err(TcpPduError::InvalidField {
                        what: "DATAL",
                        offset: 16,
                        value: 0,
                    });
                }
                let slot = self.check_h2c(&h)?;
                self.rx.head += need;
                self.phase = Phase::Data {
                    slot,
                    off: h.datao as usize,
                    left: f.data_len,
                    // crc32c_append(0, x) == crc32c(x).
                    crc: 0,
                    ddgst: f.ddgst,
                    last_of_pdu: f.data_len,
                };
            }
            PduType::H2cTermReq => {
                let t = TermReq::parse(&self.rx.buf[pdu]);
                log::info!(
                    "nvmf tcp: the host terminated the connection (FES {:#x}, FEI {:#x})",
                    t.fes,
                    t.fei
                );
                self.rx.head += need;
                self.ops.closing = true;
            }
            other => {
                return Err(TcpPduError::Sequence {
                    pdu_type: other.code(),
                    why: "the controller never receives that type",
                })
            }
        }
        Ok(true)
    }

    fn handle_icreq(&mut self) -> Result<(), TcpPduError> {
        let req = IcReq::parse(&self.rx.buf[self.rx.head..self.rx.head + IC_PDU_LEN])?;
        let Some(granted) = self.transport.opts.digest.grant(req.digests) else {
            return Err(TcpPduError::Unsupported {
                what: "DGST",
                offset: 11,
                value: u64::from(req.digests.to_bits()),
            });
        };
        let rsp = IcResp {
            pfv: 0,
            cpda: 0,
            digests: granted,
            maxh2cdata: self.ops.maxh2cdata,
        };
        log::debug!(
            "nvmf tcp: ICReq granted: header digest {}, data digest {}, host PDA {}",
            granted.header,
            granted.data,
            req.hpda
        );
        // ICResp itself carries no digest.
        self.ops.tx.push_raw(&rsp.encode());
        self.digests = granted;
        self.ops.tx.buf.layout = SendLayout::new(granted, req.hpda);
        self.ic_done = true;
        Ok(())
    }

    /// A whole CapsuleCmd PDU at `head`.
    ///
    /// # Errors
    ///
    /// [`TcpPduError::Sequence`] when the host sends more commands than
    /// the queue holds (fatal: the C2HTermReq carries this capsule's
    /// header).
    fn handle_capsule(&mut self, f: &Frame) -> Result<(), TcpPduError> {
        // A host past its SQSIZE (never more than the queue's depth)
        // overran its queue, even while the target's queue has room: a
        // fatal PDU sequence error, told with a C2HTermReq rather than a
        // silent close.
        if self.qp.host_sq_full() {
            return Err(overrun());
        }
        let start = self.rx.head;
        let data = start + f.data_offset..start + f.data_offset + f.data_len;
        if f.ddgst {
            let got = crate::spec::le32(&self.rx.buf, data.end);
            if got != crc32c(&self.rx.buf[data.clone()]) {
                // Not fatal: the command fails with a transient transport
                // error without running (it still takes its SQ entry).
                log::debug!("nvmf tcp: capsule data digest mismatch");
                let sqe = &self.rx.buf[start + CH_LEN..start + CH_LEN + SQE_SIZE];
                let res = self.qp.refuse_capsule(
                    sqe,
                    NvmeStatus::TRANSIENT_TRANSPORT_ERROR,
                    &mut self.ops,
                );
                return match res {
                    Ok(()) => Ok(()),
                    Err(CapsuleError::QueueFull) => Err(overrun()),
                    Err(e) => {
                        log::debug!("nvmf tcp: capsule refused, closing the queue: {e}");
                        self.ops.closing = true;
                        Ok(())
                    }
                };
            }
        }
        let sqe_at = start + CH_LEN;
        if let Some(cpl) = self.refuse_connect(&self.rx.buf[sqe_at..sqe_at + SQE_SIZE]) {
            self.ops.tx.push_pdu(
                PduType::CapsuleResp,
                &CapsuleResp::encode(&cpl.encode()),
                0,
                0,
            );
            return Ok(());
        }
        let res = if f.data_len == 0 || data.start == sqe_at + SQE_SIZE {
            // SQE and data lie back to back in the receive buffer.
            let end = if f.data_len == 0 {
                sqe_at + SQE_SIZE
            } else {
                data.end
            };
            self.qp
                .submit_capsule(&self.rx.buf[sqe_at..end], &mut self.ops)
        } else {
            self.capsule.clear();
            if let Some(sqe) = CapsuleCmdHdr::sqe(&self.rx.buf[start..]) {
                self.capsule.extend_from_slice(sqe);
            }
            self.capsule.extend_from_slice(&self.rx.buf[data]);
            self.qp.submit_capsule(&self.capsule, &mut self.ops)
        };
        match res {
            Ok(()) => {}
            // Caught above already (no request took the capsule, so there
            // is nothing to answer).
            Err(CapsuleError::QueueFull) => return Err(overrun()),
            Err(e) => {
                log::debug!("nvmf tcp: capsule refused, closing the queue: {e}");
                self.ops.closing = true;
            }
        }
        self.issue_r2ts();
        Ok(())
    }

    /// The refusal of a Connect for an I/O queue beyond
    /// `max_io_qpairs_per_ctrlr` (the core sees only the subsystem's limit).
    fn refuse_connect(&self, sqe: &[u8]) -> Option<NvmeCompletion> {
        use crate::spec::connect::{invalid_param_dw0, sqe_off};
        let is_connect = sqe.first() == Some(&crate::spec::OPC_FABRICS)
            && sqe.get(4) == Some(&crate::spec::FabricsType::Connect.code());
        if self.qp.is_connected() || !is_connect {
            return None;
        }
        let qid = crate::spec::le16(sqe, sqe_off::QID);
        if qid <= self.transport.opts.max_io_qpairs_per_ctrlr {
            return None;
        }
        log::debug!("nvmf tcp: Connect for I/O queue {qid} refused (max_io_qpairs_per_ctrlr)");
        let cid = crate::spec::le16(sqe, 2);
        let mut cpl = NvmeCompletion::new(qid, cid, NvmeStatus::CONNECT_INVALID_PARAMETERS);
        cpl.dw0 = invalid_param_dw0(sqe_off::QID as u16, false);
        Some(cpl)
    }

    /// Check an H2CData header against its R2T; returns the request slot.
    fn check_h2c(&self, h: &H2cData) -> Result<usize, TcpPduError> {
        let slot = usize::from(h.ttag);
        let Some(x) = self.ops.xfers.get(slot).filter(|x| x.active) else {
            return Err(TcpPduError::InvalidField {
                what: "TTAG",
                offset: 10,
                value: u64::from(h.ttag),
            });
        };
        if x.cccid != h.cccid {
            return Err(TcpPduError::InvalidField {
                what: "CCCID",
                offset: 8,
                value: u64::from(h.cccid),
            });
        }
        let end = u64::from(h.datao) + u64::from(h.datal);
        if h.datao != x.received || end > u64::from(x.asked) {
            return Err(TcpPduError::DataOutOfRange {
                offset: h.datao,
                len: h.datal,
                limit: x.asked,
            });
        }
        Ok(slot)
    }

    /// One H2CData PDU of `len` bytes is in (its digest `ok`): on to the
    /// next R2T, or hand the finished transfer to the core.
    fn h2c_done(&mut self, slot: usize, len: usize, ok: bool) {
        let Some(x) = self.ops.xfers.get_mut(slot) else {
            return;
        };
        if !x.active {
            return;
        }
        x.received += len as u32;
        x.failed |= !ok;
        if x.received < x.asked {
            return;
        }
        if x.received < x.total {
            self.ops.push_r2t(slot);
            return;
        }
        x.active = false;
        let (tag, failed) = (x.tag, x.failed);
        if let Some(tag) = tag {
            let res = if failed {
                Err(TransportError::DataDigest)
            } else {
                Ok(())
            };
            self.qp.transfer_done(tag, res, &mut self.ops);
            self.issue_r2ts();
        }
    }

    /// End the connection for `e`: a C2HTermReq with its status and the
    /// offending header (none for an H2CTermReq whose PLEN is invalid),
    /// then close.
    fn fatal(&mut self, e: TcpPduError) {
        log::info!("nvmf tcp: fatal PDU error, terminating the connection: {e}");
        self.transport
            .stats
            .terminated
            .fetch_add(1, Ordering::Relaxed);
        self.terminated = true;
        if !e.answered() {
            self.rx.head = self.rx.tail;
            self.ops.closing = true;
            return;
        }
        let bad_end = (self.rx.head + TERM_REQ_MAX_DATA).min(self.rx.tail);
        let mut out = [0u8; SHORT_HLEN + TERM_REQ_MAX_DATA];
        let n = TermReq {
            fes: e.fes().code(),
            fei: e.fei(),
        }
        .encode_into(true, &self.rx.buf[self.rx.head..bad_end], &mut out);
        self.ops.tx.push_raw(&out[..n]);
        self.rx.head = self.rx.tail;
        self.ops.closing = true;
    }
}

/// A host that sent a command past its SQSIZE (or the queue's depth).
fn overrun() -> TcpPduError {
    TcpPduError::Sequence {
        pdu_type: PduType::CapsuleCmd.code(),
        why: "more commands than the host's SQSIZE allows",
    }
}
