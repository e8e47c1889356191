//! [`TcpQueue`]: one NVMe/TCP host queue (see the module docs of
//! [`super`]).

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

use pollux_reactor::mem::SgList;

use super::super::transport::{DataDir, HostQueue, QueueParams, Queued};
use super::super::HostError;
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
use crate::tcp_bufs::{RecvBuf, SendBuf};

/// Receive buffer size.
const RX_LEN: usize = 256 * 1024;
/// Reads per poll at most.
const READS_PER_POLL: usize = 4;
/// SQHD of a completion the transport made up (C2H SUCCESS).
const SQHD_NONE: u16 = 0xFFFF;

/// Counters of one queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TcpQueueStats {
    /// Writes sent in the capsule.
    pub inline: u64,
    /// R2Ts answered.
    pub r2t: u64,
    /// H2CData PDUs sent.
    pub h2c_pdus: u64,
    /// C2HData PDUs received.
    pub c2h_pdus: u64,
    /// Reads completed by a C2HData SUCCESS flag (no response capsule).
    pub c2h_success: u64,
    /// PDUs whose data digest did not match (the command failed).
    pub data_digest_errors: u64,
}

#[derive(Debug, Clone, Default)]
struct Slot {
    busy: bool,
    cid: u16,
    dir: Option<DataDir>,
    len: usize,
    /// Write data (R2T) or read data.
    staging: Vec<u8>,
    /// Read data received so far.
    received: usize,
    /// A C2HData digest failed.
    corrupt: bool,
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    Header,
    /// C2HData payload for `slot`.
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
    tx: SendBuf,
    rx: RecvBuf,
    phase: Phase,
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
            tx: SendBuf::new(64 * 1024),
            rx: RecvBuf::new(RX_LEN),
            phase: Phase::Header,
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
            q.write_out()?;
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
        q.tx.layout = SendLayout::new(rsp.digests, rsp.cpda);
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

    fn write_out(&mut self) -> Result<bool, HostError> {
        match self.tx.flush(&mut self.sock) {
            Ok(wrote) => Ok(wrote),
            Err(e) if e.kind() == ErrorKind::WriteZero => {
                Err(self.fail("the target closed the connection".into()))
            }
            Err(e) => Err(self.fail(format!("send: {e}"))),
        }
    }

    /// One read into the receive buffer; `true` when bytes came.
    fn read_in(&mut self) -> Result<bool, HostError> {
        match self.rx.fill(&mut self.sock) {
            Ok(0) => Err(self.fail("the target closed the connection".into())),
            Ok(_) => Ok(true),
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                Ok(false)
            }
            Err(e) => Err(self.fail(format!("receive: {e}"))),
        }
    }

    fn fail(&mut self, why: String) -> HostError {
        if self.dead.is_none() {
            log::debug!("nvmf tcp host: queue {} down: {why}", self.qid);
            self.dead = Some(why.clone());
            let _ = self.sock.shutdown(std::net::Shutdown::Both);
        }
        HostError::Disconnected(why)
    }

    /// A fatal PDU error: H2CTermReq, then down.
    fn terminate(&mut self, e: TcpPduError) -> HostError {
        let end = (self.rx.head + TERM_REQ_MAX_DATA).min(self.rx.tail);
        let mut out = [0u8; SHORT_HLEN + TERM_REQ_MAX_DATA];
        let n = TermReq {
            fes: e.fes().code(),
            fei: e.fei(),
        }
        .encode_into(false, &self.rx.buf[self.rx.head..end], &mut out);
        self.tx.push_raw(&out[..n]);
        let _ = self.write_out();
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

    /// Handle the buffered bytes; completions go to `done`.
    fn handle(&mut self, done: &mut Vec<(u16, NvmeCompletion)>) -> Result<(), TcpPduError> {
        loop {
            let avail = self.rx.tail - self.rx.head;
            match self.phase {
                Phase::Data {
                    slot,
                    off,
                    left,
                    crc,
                    ddgst,
                    flags,
                } => {
                    if avail == 0 {
                        return Ok(());
                    }
                    let n = avail.min(left);
                    let src = self.rx.head..self.rx.head + n;
                    let crc = if ddgst {
                        crc32c_append(crc, &self.rx.buf[src.clone()])
                    } else {
                        crc
                    };
                    if let Some(s) = self.slots.get_mut(slot) {
                        s.staging[off..off + n].copy_from_slice(&self.rx.buf[src]);
                        s.received += n;
                    }
                    self.rx.head += n;
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
                            self.answer_r2t(&r)?;
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
        done.push((slot as u16, cpl));
    }

    fn answer_r2t(&mut self, r: &R2t) -> Result<(), TcpPduError> {
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
        self.stats.r2t += 1;
        let max = self.maxh2cdata as usize;
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
            self.tx.push_pdu(
                PduType::H2cData,
                &h.encode(),
                if last { FLAG_LAST_PDU } else { 0 },
                chunk,
            );
            let src = &self.slots[slot].staging[at..at + chunk];
            self.tx.push_data(chunk, |out| out.extend_from_slice(src));
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
        let s = &mut self.slots[si];
        s.busy = true;
        s.cid = cmd.cid;
        s.dir = Some(dir);
        s.len = len;
        s.received = 0;
        s.corrupt = false;
        match dir {
            DataDir::ToCtrl if !inline => {
                s.staging.clear();
                sg_at::append_from(data, 0, len, &mut s.staging);
            }
            DataDir::FromCtrl => s.staging.resize(len, 0),
            _ => {}
        }
        let hdr = CapsuleCmdHdr::encode(&cmd.encode());
        let icd = if inline { len } else { 0 };
        self.tx.push_pdu(PduType::CapsuleCmd, &hdr, 0, icd);
        if inline {
            self.stats.inline += 1;
            self.tx.push_data(len, |out| {
                sg_at::append_from(data, 0, len, out);
            });
        }
        Ok(Queued::Yes)
    }

    fn flush(&mut self) -> Result<(), HostError> {
        if let Some(why) = &self.dead {
            return Err(HostError::Disconnected(why.clone()));
        }
        self.write_out().map(|_| ())
    }

    fn poll(&mut self, done: &mut Vec<(u16, NvmeCompletion)>) -> Result<bool, HostError> {
        if let Some(why) = &self.dead {
            return Err(HostError::Disconnected(why.clone()));
        }
        let mut busy = self.write_out()?;
        for _ in 0..READS_PER_POLL {
            let got = self.read_in()?;
            if let Err(e) = self.handle(done) {
                return Err(self.terminate(e));
            }
            if let Some(why) = &self.dead {
                return Err(HostError::Disconnected(why.clone()));
            }
            if !got {
                break;
            }
            busy = true;
        }
        // R2T answers go out in the same poll.
        busy |= self.write_out()?;
        Ok(busy || !done.is_empty())
    }

    fn finish(&mut self, slot: u16, data: &mut SgList) {
        if let Some(s) = self.slots.get(usize::from(slot)) {
            if s.dir == Some(DataDir::FromCtrl) {
                sg_at::write_at(data, 0, &s.staging[..s.len.min(s.staging.len())]);
            }
        }
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
        }
    }

    fn slot_state(&self, slot: u16) -> Option<String> {
        let s = self.slots.get(usize::from(slot))?;
        Some(format!(
            "busy {} dir {:?} len {} received {}",
            s.busy, s.dir, s.len, s.received
        ))
    }

    fn disconnect(&mut self) {
        let _ = self.fail("disconnected by the host".into());
    }
}
