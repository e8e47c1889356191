//! [`TcpQueue`]: one NVMe/TCP host queue (see the module docs of
//! [`super`]).

use std::io::{ErrorKind, IoSliceMut, Read};
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

use pollux_reactor::mem::SgList;

use super::super::transport::{DataDir, HostQueue, NoSlotBufs, QueueParams, Queued, SlotBufs};
use super::super::HostError;
use super::tx::{TxQueue, BY_REF_MIN};
use super::TcpHostOptions;
use crate::sg_at;
use crate::spec::cmd::NvmeCmd;
use crate::spec::cpl::{NvmeCompletion, NvmeStatus};
use crate::spec::sgl::SglDescriptor;
use crate::spec::tcp::{
    crc32c_append, C2hData, CapsuleCmdHdr, CapsuleResp, CommonHeader, Digests, Frame, H2cData,
    IcReq, IcResp, PduType, R2t, SendLayout, TcpPduError, TermReq, ADMIN_ICD_SIZE, CH_LEN,
    DIGEST_LEN, FLAG_LAST_PDU, FLAG_SUCCESS, IC_PDU_LEN, SHORT_HLEN, TERM_REQ_MAX_DATA,
};
use crate::tcp_bufs::RecvBuf;

/// Receive buffer size.
const RX_LEN: usize = 256 * 1024;
/// Reads per poll at most; a read that takes less than it offered ends
/// the poll's reading.
const READS_PER_POLL: usize = 4;
/// SQHD of a completion the transport made up (C2H SUCCESS).
const SQHD_NONE: u16 = 0xFFFF;
/// C2HData payload left at least this long is read straight from the
/// socket into the caller's buffers once the receive buffer is empty.
const DIRECT_MIN: usize = 1024;
/// C2HData payloads at least this long make the queue read in small
/// windows until a shorter one comes: the receive buffer then takes a
/// header and the start of the next payload, and the rest of that payload
/// is read straight into the caller's buffers instead of being copied out
/// of a large buffered read.
const BIG_C2H: usize = 16 * 1024;
/// The most a read into the receive buffer takes while payloads are big.
const BIG_RX_WINDOW: usize = 4096;
/// Slices of one direct read at most: the caller's buffers (as many as the
/// payload spans, up to all but one), then the receive buffer, which takes
/// whatever follows the payload (its digest, the next PDU).
const RX_IOV: usize = 17;

/// Counters of one queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TcpQueueStats {
    /// Writes sent in the capsule.
    pub inline: u64,
    /// R2Ts answered.
    pub r2t: u64,
    /// H2CData PDUs sent.
    pub h2c_pdus: u64,
    /// Write payloads (in-capsule data or H2CData) sent from the caller's
    /// buffers by scatter-gather rather than copied.
    pub sent_by_ref: u64,
    /// C2HData PDUs received.
    pub c2h_pdus: u64,
    /// Read data bytes read from the socket straight into the caller's
    /// buffers (the rest was copied there once from the receive buffer).
    pub c2h_direct_bytes: u64,
    /// Reads completed by a C2HData SUCCESS flag (no response capsule).
    pub c2h_success: u64,
    /// PDUs whose data digest did not match (the command failed).
    pub data_digest_errors: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    busy: bool,
    cid: u16,
    dir: Option<DataDir>,
    len: usize,
    /// Read data received so far.
    received: usize,
    /// A C2HData digest failed.
    corrupt: bool,
    /// Payloads of this slot queued by reference and not written yet.
    tx_refs: u32,
    /// The completion, held back while `tx_refs > 0` (the target answered
    /// before all of the command's data left; its buffers are still
    /// referred to).
    held: Option<NvmeCompletion>,
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    Header,
    /// C2HData payload for `slot`: `left` bytes still to come, the next at
    /// `off` in the slot's buffers.
    Data {
        slot: usize,
        off: usize,
        left: usize,
        crc: u32,
        ddgst: bool,
        flags: u8,
    },
    Digest {
        slot: usize,
        crc: u32,
        flags: u8,
    },
}

/// One NVMe/TCP host queue (`!Send`).
pub struct TcpQueue {
    sock: TcpStream,
    qid: u16,
    inline: u32,
    digests: Digests,
    maxh2cdata: u32,
    slots: Vec<Slot>,
    tx: TxQueue,
    rx: RecvBuf,
    phase: Phase,
    /// Slots whose held completion may go now (preallocated, one per slot).
    released: Vec<u16>,
    /// The most one read into the receive buffer takes (smaller while
    /// C2HData payloads are big, see [`BIG_C2H`]).
    rx_window: usize,
    dead: Option<String>,
    stats: TcpQueueStats,
}

impl std::fmt::Debug for TcpQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpQueue")
            .field("qid", &self.qid)
            .field("digests", &self.digests)
            .field("dead", &self.dead)
            .finish()
    }
}

fn io(what: &str) -> impl Fn(std::io::Error) -> HostError + '_ {
    move |e| HostError::Transport(format!("{what}: {e}"))
}

impl TcpQueue {
    /// Connect, exchange ICReq/ICResp (control path, bounded by the
    /// connect timeout).
    pub(crate) fn connect(
        addr: SocketAddr,
        opts: &TcpHostOptions,
        p: &QueueParams,
    ) -> Result<Self, HostError> {
        let sock = TcpStream::connect_timeout(&addr, opts.connect_timeout)
            .map_err(|e| HostError::Unreachable(format!("{addr}: {e}")))?;
        sock.set_nodelay(true).map_err(io("TCP_NODELAY"))?;
        sock.set_nonblocking(true).map_err(io("non-blocking"))?;
        let entries = usize::from(p.entries.max(1));
        let mut q = TcpQueue {
            sock,
            qid: p.qid,
            inline: if p.qid == 0 {
                ADMIN_ICD_SIZE
            } else {
                p.inline_limit
            },
            digests: Digests::default(),
            maxh2cdata: crate::spec::tcp::MIN_MAXH2CDATA,
            slots: vec![Slot::default(); entries],
            tx: TxQueue::new(64 * 1024, entries),
            rx: RecvBuf::new(RX_LEN),
            phase: Phase::Header,
            released: Vec::with_capacity(entries),
            rx_window: RX_LEN,
            dead: None,
            stats: TcpQueueStats::default(),
        };
        let req = IcReq {
            pfv: 0,
            hpda: 0,
            digests: Digests {
                header: opts.header_digest,
                data: opts.data_digest,
            },
            maxr2t: 0,
        };
        q.tx.push_raw(&req.encode());
        let start = Instant::now();
        loop {
            q.write_out(&NoSlotBufs)?;
            q.read_in()?;
            if q.rx.avail() >= IC_PDU_LEN {
                break;
            }
            if start.elapsed() > opts.connect_timeout {
                return Err(HostError::Timeout {
                    what: "NVMe/TCP ICResp",
                    after: opts.connect_timeout,
                });
            }
            match pollux_reactor::Reactor::current() {
                // An in-process target on this reactor makes progress.
                Some(r) => {
                    r.poll_once();
                }
                None => std::thread::yield_now(),
            }
        }
        let ic = &q.rx.buf[q.rx.head..q.rx.head + IC_PDU_LEN];
        let f = Frame::check(&CommonHeader::parse(ic), false, Digests::default(), 0);
        let rsp = match f {
            Ok(f) if f.pdu_type == PduType::IcResp => IcResp::parse(ic),
            Ok(f) => {
                return Err(HostError::Protocol(format!(
                    "expected ICResp, got PDU type {:?}",
                    f.pdu_type
                )))
            }
            Err(e) => Err(e),
        }
        .map_err(|e| HostError::Protocol(format!("ICResp: {e}")))?;
        if (rsp.digests.header && !req.digests.header) || (rsp.digests.data && !req.digests.data) {
            return Err(HostError::Protocol(
                "the target enabled a digest the host did not ask for".into(),
            ));
        }
        q.rx.head += IC_PDU_LEN;
        q.digests = rsp.digests;
        q.tx.buf.layout = SendLayout::new(rsp.digests, rsp.cpda);
        q.maxh2cdata = rsp.maxh2cdata;
        log::debug!(
            "nvmf tcp host: queue {} up, digests {:?}, MAXH2CDATA {}",
            p.qid,
            rsp.digests,
            rsp.maxh2cdata
        );
        Ok(q)
    }

    /// The queue id.
    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// The digests the target enabled.
    pub fn digests(&self) -> Digests {
        self.digests
    }

    /// Counters.
    pub fn stats(&self) -> TcpQueueStats {
        self.stats
    }

    /// Write what is queued, taking referenced write data from `bufs`;
    /// `true` when bytes left. A slot whose last referenced payload went
    /// out and whose completion was held back is queued for release.
    fn write_out(&mut self, bufs: &dyn SlotBufs) -> Result<bool, HostError> {
        let slots = &mut self.slots;
        let released = &mut self.released;
        let mut sock = crate::tcp_sock::NoSigpipe(&self.sock);
        let res = self.tx.flush(&mut sock, bufs, &mut |slot| {
            if let Some(s) = slots.get_mut(usize::from(slot)) {
                s.tx_refs = s.tx_refs.saturating_sub(1);
                if s.tx_refs == 0 && s.held.is_some() {
                    released.push(slot);
                }
            }
        });
        match res {
            Ok(wrote) => Ok(wrote),
            Err(e) if e.kind() == ErrorKind::WriteZero => {
                Err(self.fail("the target closed the connection".into()))
            }
            Err(e) => Err(self.fail(format!("send: {e}"))),
        }
    }

    /// One read into the receive buffer; `true` when bytes came.
    fn read_in(&mut self) -> Result<bool, HostError> {
        match self.rx.fill_at_most(&mut self.sock, self.rx_window) {
            Ok(0) => Err(self.fail("the target closed the connection".into())),
            Ok(_) => Ok(true),
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                Ok(false)
            }
            Err(e) => Err(self.fail(format!("receive: {e}"))),
        }
    }

    /// Whether the next read should go straight into a slot's buffers: the
    /// receive buffer is empty and a long C2HData payload is under way.
    fn direct_slot(&self) -> Option<usize> {
        match self.phase {
            Phase::Data { slot, left, .. } if left >= DIRECT_MIN && self.rx.avail() == 0 => {
                Some(slot)
            }
            _ => None,
        }
    }

    /// One read of C2HData payload straight into slot `slot`'s buffers (at
    /// the payload's offset, as many of them as it spans), with the
    /// receive buffer last for whatever follows the payload. The data
    /// digest runs over the bytes where they landed. `true` when bytes
    /// came.
    fn read_direct(
        &mut self,
        slot: usize,
        bufs: &mut dyn SlotBufs,
        done: &mut Vec<(u16, NvmeCompletion)>,
    ) -> Result<bool, HostError> {
        let Phase::Data {
            off,
            left,
            crc,
            ddgst,
            ..
        } = self.phase
        else {
            return self.read_in();
        };
        let Some(data) = bufs.bufs_mut(slot as u16) else {
            return self.read_in();
        };
        // Empty (see `direct_slot`): what follows the payload lands at 0.
        self.rx.head = 0;
        self.rx.tail = 0;
        let (res, cover) = {
            let mut iov: [IoSliceMut<'_>; RX_IOV] =
                std::array::from_fn(|_| IoSliceMut::new(&mut []));
            let (mut n, mut cover, mut skip) = (0, 0, off);
            for b in data.iter_mut() {
                if n == RX_IOV - 1 || cover == left {
                    break;
                }
                let s = b.as_mut_slice();
                if skip >= s.len() {
                    skip -= s.len();
                    continue;
                }
                let take = (s.len() - skip).min(left - cover);
                iov[n] = IoSliceMut::new(&mut s[skip..skip + take]);
                n += 1;
                cover += take;
                skip = 0;
            }
            if cover == 0 {
                // Cannot happen (the offset was checked against the
                // length): take the ordinary path.
                return self.read_in();
            }
            iov[n] = IoSliceMut::new(&mut self.rx.buf[..self.rx_window]);
            n += 1;
            ((&self.sock).read_vectored(&mut iov[..n]), cover)
        };
        let got = match res {
            Ok(0) => return Err(self.fail("the target closed the connection".into())),
            Ok(got) => got,
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                return Ok(false)
            }
            Err(e) => return Err(self.fail(format!("receive: {e}"))),
        };
        let landed = got.min(cover);
        self.rx.tail = got - landed;
        self.rx.drained = got < cover + self.rx_window;
        let mut crc = crc;
        if ddgst {
            sg_at::for_each_slice(data, off, landed, |s| crc = crc32c_append(crc, s));
        }
        self.stats.c2h_direct_bytes += landed as u64;
        self.data_in(landed, crc, done);
        Ok(true)
    }

    /// `n` more bytes of the C2HData payload under way are in the slot's
    /// buffers (`crc`: the digest so far); finish the payload when they
    /// were its last.
    fn data_in(&mut self, n: usize, crc: u32, done: &mut Vec<(u16, NvmeCompletion)>) {
        let Phase::Data {
            slot,
            off,
            left,
            ddgst,
            flags,
            ..
        } = self.phase
        else {
            return;
        };
        if let Some(s) = self.slots.get_mut(slot) {
            s.received += n;
        }
        self.phase = if left > n {
            Phase::Data {
                slot,
                off: off + n,
                left: left - n,
                crc,
                ddgst,
                flags,
            }
        } else if ddgst {
            Phase::Digest { slot, crc, flags }
        } else {
            self.c2h_done(slot, flags, true, done);
            Phase::Header
        };
    }

    fn fail(&mut self, why: String) -> HostError {
        if self.dead.is_none() {
            log::debug!("nvmf tcp host: queue {} down: {why}", self.qid);
            self.dead = Some(why.clone());
            let _ = self.sock.shutdown(std::net::Shutdown::Both);
            // Nothing more goes out: drop every reference to the caller's
            // buffers (the core takes them back through `abandon`).
            self.tx.discard(&mut |_| {});
            self.released.clear();
            for s in &mut self.slots {
                s.tx_refs = 0;
                s.held = None;
            }
        }
        HostError::Disconnected(why)
    }

    /// A fatal PDU error: H2CTermReq (none for a C2HTermReq whose PLEN is
    /// invalid), then down.
    fn terminate(&mut self, e: TcpPduError, bufs: &dyn SlotBufs) -> HostError {
        if !e.answered() {
            return self.fail(format!("protocol error from the target: {e}"));
        }
        let end = (self.rx.head + TERM_REQ_MAX_DATA).min(self.rx.tail);
        let mut out = [0u8; SHORT_HLEN + TERM_REQ_MAX_DATA];
        let n = TermReq {
            fes: e.fes().code(),
            fei: e.fei(),
        }
        .encode_into(false, &self.rx.buf[self.rx.head..end], &mut out);
        self.tx.push_raw(&out[..n]);
        let _ = self.write_out(bufs);
        self.fail(format!("protocol error from the target: {e}"))
    }

    fn slot_of(&self, cid: u16) -> Option<usize> {
        let guess = usize::from(cid & 0x3FF);
        if self
            .slots
            .get(guess)
            .is_some_and(|s| s.busy && s.cid == cid)
        {
            return Some(guess);
        }
        self.slots.iter().position(|s| s.busy && s.cid == cid)
    }

    /// Handle the buffered bytes: C2HData payloads go into the caller's
    /// buffers (`bufs`), completions to `done`.
    fn handle(
        &mut self,
        done: &mut Vec<(u16, NvmeCompletion)>,
        bufs: &mut dyn SlotBufs,
    ) -> Result<(), TcpPduError> {
        loop {
            if self.dead.is_some() {
                return Ok(());
            }
            let avail = self.rx.tail - self.rx.head;
            match self.phase {
                Phase::Data {
                    slot,
                    off,
                    left,
                    crc,
                    ddgst,
                    ..
                } => {
                    if avail == 0 {
                        return Ok(());
                    }
                    let n = avail.min(left);
                    let src = &self.rx.buf[self.rx.head..self.rx.head + n];
                    let mut crc = crc;
                    match bufs.bufs_mut(slot as u16) {
                        Some(data) if ddgst => {
                            sg_at::write_at_with(data, off, src, |s| crc = crc32c_append(crc, s));
                        }
                        Some(data) => {
                            sg_at::write_at(data, off, src);
                        }
                        // Not lent (cannot happen): the bytes are dropped,
                        // the stream stays framed.
                        None if ddgst => crc = crc32c_append(crc, src),
                        None => {}
                    }
                    self.rx.head += n;
                    self.data_in(n, crc, done);
                }
                Phase::Digest { slot, crc, flags } => {
                    if avail < DIGEST_LEN {
                        return Ok(());
                    }
                    let got = crate::spec::le32(&self.rx.buf, self.rx.head);
                    self.rx.head += DIGEST_LEN;
                    self.phase = Phase::Header;
                    self.c2h_done(slot, flags, got == crc, done);
                }
                Phase::Header => {
                    if avail < CH_LEN {
                        return Ok(());
                    }
                    let ch = CommonHeader::parse(&self.rx.buf[self.rx.head..self.rx.tail]);
                    let f = Frame::check(&ch, false, self.digests, u32::MAX)?;
                    let need = if f.pdu_type == PduType::C2hData {
                        f.data_offset
                    } else {
                        f.plen
                    };
                    if avail < need {
                        return Ok(());
                    }
                    let pdu = self.rx.head..self.rx.head + need;
                    f.verify_hdgst(&self.rx.buf[pdu.clone()])?;
                    match f.pdu_type {
                        PduType::CapsuleResp => {
                            let cpl = CapsuleResp::cqe(&self.rx.buf[pdu])
                                .map(|c| NvmeCompletion::parse(c));
                            if let Some(Ok(cpl)) = cpl {
                                if let Some(slot) = self.slot_of(cpl.cid) {
                                    self.complete(slot, cpl, done);
                                } else {
                                    return Err(TcpPduError::InvalidField {
                                        what: "CID",
                                        offset: 20,
                                        value: u64::from(cpl.cid),
                                    });
                                }
                            }
                            self.rx.head += need;
                        }
                        PduType::C2hData => {
                            let h = C2hData::parse(&self.rx.buf[pdu], f.data_len)?;
                            let slot = self.check_c2h(&h)?;
                            self.rx.head += need;
                            self.stats.c2h_pdus += 1;
                            self.rx_window = if h.datal as usize >= BIG_C2H {
                                BIG_RX_WINDOW
                            } else {
                                RX_LEN
                            };
                            self.phase = Phase::Data {
                                slot,
                                off: h.datao as usize,
                                left: h.datal as usize,
                                crc: 0,
                                ddgst: f.ddgst,
                                flags: f.flags,
                            };
                        }
                        PduType::R2t => {
                            let r = R2t::parse(&self.rx.buf[pdu])?;
                            self.rx.head += need;
                            self.answer_r2t(&r, &*bufs)?;
                        }
                        PduType::C2hTermReq => {
                            let t = TermReq::parse(&self.rx.buf[pdu]);
                            self.rx.head += need;
                            let why = format!(
                                "the target terminated the connection (FES {:#x}, FEI {:#x})",
                                t.fes, t.fei
                            );
                            let _ = self.fail(why);
                            return Ok(());
                        }
                        other => {
                            return Err(TcpPduError::Sequence {
                                pdu_type: other.code(),
                                why: "not expected by a host after ICResp",
                            })
                        }
                    }
                }
            }
        }
    }

    fn check_c2h(&self, h: &C2hData) -> Result<usize, TcpPduError> {
        let slot = self
            .slot_of(h.cccid)
            .filter(|&s| self.slots[s].dir == Some(DataDir::FromCtrl))
            .ok_or(TcpPduError::InvalidField {
                what: "CCCID",
                offset: 8,
                value: u64::from(h.cccid),
            })?;
        let s = &self.slots[slot];
        let end = h.datao as usize + h.datal as usize;
        if h.datao as usize != s.received || end > s.len || h.datal == 0 {
            return Err(TcpPduError::DataOutOfRange {
                offset: h.datao,
                len: h.datal,
                limit: s.len as u32,
            });
        }
        Ok(slot)
    }

    fn c2h_done(
        &mut self,
        slot: usize,
        flags: u8,
        ok: bool,
        done: &mut Vec<(u16, NvmeCompletion)>,
    ) {
        if !ok {
            self.stats.data_digest_errors += 1;
        }
        let Some(s) = self.slots.get_mut(slot) else {
            return;
        };
        s.corrupt |= !ok;
        if flags & FLAG_SUCCESS != 0 && flags & FLAG_LAST_PDU != 0 {
            let status = if s.corrupt {
                NvmeStatus::TRANSIENT_TRANSPORT_ERROR
            } else {
                NvmeStatus::SUCCESS
            };
            let mut cpl = NvmeCompletion::new(self.qid, s.cid, status);
            cpl.sqhd = SQHD_NONE;
            self.stats.c2h_success += 1;
            self.complete(slot, cpl, done);
        }
    }

    /// Slot `slot`'s command is finished: report it, or hold the report
    /// back while payloads of it queued by reference are not all out.
    fn complete(
        &mut self,
        slot: usize,
        mut cpl: NvmeCompletion,
        done: &mut Vec<(u16, NvmeCompletion)>,
    ) {
        let s = &mut self.slots[slot];
        if s.corrupt && cpl.status.is_success() {
            cpl.status = NvmeStatus::TRANSIENT_TRANSPORT_ERROR;
        }
        s.busy = false;
        if s.tx_refs > 0 {
            s.held = Some(cpl);
        } else {
            done.push((slot as u16, cpl));
        }
    }

    /// Report the held completions whose data is out now.
    fn report_released(&mut self, done: &mut Vec<(u16, NvmeCompletion)>) {
        for slot in self.released.drain(..) {
            if let Some(cpl) = self
                .slots
                .get_mut(usize::from(slot))
                .and_then(|s| s.held.take())
            {
                done.push((slot, cpl));
            }
        }
    }

    /// Queue the H2CData PDUs an R2T asks for (each at most MAXH2CDATA),
    /// their payloads from slot's buffers in `bufs`: by reference from a
    /// page up, copied below.
    fn answer_r2t(&mut self, r: &R2t, bufs: &dyn SlotBufs) -> Result<(), TcpPduError> {
        let slot = self
            .slot_of(r.cccid)
            .filter(|&s| self.slots[s].dir == Some(DataDir::ToCtrl))
            .ok_or(TcpPduError::InvalidField {
                what: "CCCID",
                offset: 8,
                value: u64::from(r.cccid),
            })?;
        let len = self.slots[slot].len;
        let (off, n) = (r.r2to as usize, r.r2tl as usize);
        if off + n > len {
            return Err(TcpPduError::DataOutOfRange {
                offset: r.r2to,
                len: r.r2tl,
                limit: len as u32,
            });
        }
        let Some(data) = bufs.bufs(slot as u16) else {
            // The core lends every slot in flight: a bug, not the target's.
            let _ = self.fail(format!("slot {slot}'s write buffers are not lent"));
            return Ok(());
        };
        self.stats.r2t += 1;
        let max = (self.maxh2cdata as usize).max(1);
        let mut at = off;
        while at < off + n {
            let chunk = (off + n - at).min(max);
            let last = at + chunk == off + n;
            let h = H2cData {
                cccid: r.cccid,
                ttag: r.ttag,
                datao: at as u32,
                datal: chunk as u32,
            };
            let flags = if last { FLAG_LAST_PDU } else { 0 };
            if chunk < BY_REF_MIN {
                self.tx
                    .push_pdu_copy(PduType::H2cData, &h.encode(), flags, data, at, chunk);
            } else {
                self.tx
                    .push_pdu(PduType::H2cData, &h.encode(), flags, chunk);
                self.tx.push_ref(slot as u16, data, at, chunk);
                self.tx.mark(slot as u16);
                self.slots[slot].tx_refs += 1;
                self.stats.sent_by_ref += 1;
            }
            self.stats.h2c_pdus += 1;
            at += chunk;
        }
        Ok(())
    }
}

impl HostQueue for TcpQueue {
    fn max_inline(&self) -> u32 {
        self.inline
    }

    fn queue_cmd(
        &mut self,
        slot: u16,
        cmd: &mut NvmeCmd,
        dir: DataDir,
        data: &SgList,
    ) -> Result<Queued, HostError> {
        if let Some(why) = &self.dead {
            return Err(HostError::Disconnected(why.clone()));
        }
        let si = usize::from(slot);
        if si >= self.slots.len() {
            return Err(HostError::Protocol(format!("slot {slot} beyond the queue")));
        }
        let len = match dir {
            DataDir::None => 0,
            _ => data.total_len(),
        };
        let len32 = u32::try_from(len)
            .map_err(|_| HostError::Unsupported(format!("{len} bytes in one command")))?;
        let inline = dir == DataDir::ToCtrl && len > 0 && len32 <= self.inline;
        let sgl = if inline {
            SglDescriptor::in_capsule(0, len32)
        } else {
            SglDescriptor::Transport { len: len32 }
        };
        cmd.set_sgl(&sgl);
        self.slots[si] = Slot {
            busy: true,
            cid: cmd.cid,
            dir: Some(dir),
            len,
            ..Slot::default()
        };
        let hdr = CapsuleCmdHdr::encode(&cmd.encode());
        if !inline {
            self.tx.push_pdu(PduType::CapsuleCmd, &hdr, 0, 0);
        } else if len < BY_REF_MIN {
            self.stats.inline += 1;
            self.tx
                .push_pdu_copy(PduType::CapsuleCmd, &hdr, 0, data, 0, len);
        } else {
            self.stats.inline += 1;
            self.tx.push_pdu(PduType::CapsuleCmd, &hdr, 0, len);
            // The core keeps `data` in the slot and lends it to flush.
            self.tx.push_ref(slot, data, 0, len);
            self.tx.mark(slot);
            self.slots[si].tx_refs = 1;
            self.stats.sent_by_ref += 1;
        }
        Ok(Queued::Yes)
    }

    fn flush(&mut self, bufs: &dyn SlotBufs) -> Result<(), HostError> {
        if let Some(why) = &self.dead {
            return Err(HostError::Disconnected(why.clone()));
        }
        self.write_out(bufs).map(|_| ())
    }

    fn poll(
        &mut self,
        done: &mut Vec<(u16, NvmeCompletion)>,
        bufs: &mut dyn SlotBufs,
    ) -> Result<bool, HostError> {
        if let Some(why) = &self.dead {
            return Err(HostError::Disconnected(why.clone()));
        }
        let mut busy = self.write_out(&*bufs)?;
        for _ in 0..READS_PER_POLL {
            let got = match self.direct_slot() {
                Some(slot) => self.read_direct(slot, bufs, done)?,
                None => self.read_in()?,
            };
            if let Err(e) = self.handle(done, bufs) {
                return Err(self.terminate(e, &*bufs));
            }
            if let Some(why) = &self.dead {
                return Err(HostError::Disconnected(why.clone()));
            }
            if !got {
                break;
            }
            busy = true;
            if self.rx.drained {
                // The socket had no more: no read that would only fail
                // with `WouldBlock`.
                break;
            }
        }
        // R2T answers go out in the same poll.
        busy |= self.write_out(&*bufs)?;
        self.report_released(done);
        Ok(busy || !done.is_empty())
    }

    fn disable_sq_flow(&self) -> bool {
        true
    }

    /// Data moves in PDUs: a controller without keyed SGLs (Linux
    /// nvmet-tcp) is fine.
    fn needs_keyed_sgls(&self) -> bool {
        false
    }

    fn abandon(&mut self, slot: u16) {
        if let Some(s) = self.slots.get_mut(usize::from(slot)) {
            s.busy = false;
            s.held = None;
        }
    }

    fn slot_state(&self, slot: u16) -> Option<String> {
        let s = self.slots.get(usize::from(slot))?;
        Some(format!(
            "busy {} dir {:?} len {} received {} unsent payloads {} held {}",
            s.busy,
            s.dir,
            s.len,
            s.received,
            s.tx_refs,
            s.held.is_some()
        ))
    }

    fn disconnect(&mut self) {
        let _ = self.fail("disconnected by the host".into());
    }
}
