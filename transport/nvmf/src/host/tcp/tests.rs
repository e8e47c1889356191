//! The NVMe/TCP host queue against a scripted target on a raw socket:
//! read data split over C2HData PDUs landing in multi-segment buffers
//! (from the receive buffer and straight from the socket), R2T writes
//! split by MAXH2CDATA and in-capsule writes sent from the caller's
//! buffers, every digest combination, a bad data digest, an early
//! response to a write whose data is not out, a target that vanishes
//! mid-I/O, a target that sends a C2HTermReq, a PDU for an unknown
//! command or a PLEN shorter than its header mid-I/O. Data is checked
//! byte for byte.
#![allow(clippy::unwrap_used)]

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use pollux_reactor::mem::SgList;

use super::super::transport::{DataDir, HostQueue, Queued, SlotBufs};
use super::super::{HostError, IoError, Qpair};
use super::TcpQueue;
use crate::fuzz_tcp_host::{scripted_target, segments};
use crate::spec::cmd::NvmeCmd;
use crate::spec::cpl::{NvmeCompletion, NvmeStatus};
use crate::spec::tcp::{
    crc32c, C2hData, CapsuleResp, CommonHeader, Digests, Fes, H2cData, PduType, R2t, SendLayout,
    TermReq, CH_LEN, CMD_HLEN, DIGEST_LEN, FLAG_LAST_PDU, FLAG_SUCCESS, SHORT_HLEN,
    TERM_REQ_MAX_DATA,
};
use crate::spec::{le16, le32};
use crate::tcp_bufs::SendBuf;

const ALL_DIGESTS: [Digests; 4] = [
    Digests {
        header: false,
        data: false,
    },
    Digests {
        header: true,
        data: false,
    },
    Digests {
        header: false,
        data: true,
    },
    Digests {
        header: true,
        data: true,
    },
];

/// The buffers of the commands in flight, by slot (what the core lends).
#[derive(Default)]
struct Lender(Vec<Option<SgList>>);

impl SlotBufs for Lender {
    fn bufs(&self, slot: u16) -> Option<&SgList> {
        self.0.get(usize::from(slot))?.as_ref()
    }

    fn bufs_mut(&mut self, slot: u16) -> Option<&mut SgList> {
        self.0.get_mut(usize::from(slot))?.as_mut()
    }
}

fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(7) ^ (i >> 9) ^ seed) as u8)
        .collect()
}

fn flat(l: &SgList) -> Vec<u8> {
    let mut v = vec![0u8; l.total_len()];
    l.copy_to_slice(&mut v);
    v
}

/// The target end of a host queue's socket (non-blocking): whole PDUs in
/// and out, calling `pump` (a host poll) whenever the socket would block.
struct Tgt {
    t: TcpStream,
    digests: Digests,
}

impl Tgt {
    /// Exactly `n` bytes from the host.
    fn recv(&mut self, n: usize, pump: &mut dyn FnMut()) -> Vec<u8> {
        let mut out = vec![0u8; n];
        let mut got = 0;
        let start = Instant::now();
        while got < n {
            match self.t.read(&mut out[got..]) {
                Ok(0) => panic!("the host closed the connection"),
                Ok(k) => got += k,
                Err(e) if e.kind() == ErrorKind::WouldBlock => pump(),
                Err(e) => panic!("{e}"),
            }
            assert!(start.elapsed() < Duration::from_secs(30));
        }
        out
    }

    /// One whole PDU from the host.
    fn pdu(&mut self, pump: &mut dyn FnMut()) -> Vec<u8> {
        let mut p = self.recv(CH_LEN, pump);
        let plen = le32(&p, 4) as usize;
        p.extend(self.recv(plen - CH_LEN, pump));
        p
    }

    /// Everything the host sends until it closes the connection (end of
    /// stream or reset), bounded.
    fn rest(&mut self, pump: &mut dyn FnMut()) -> Vec<u8> {
        let mut out = Vec::new();
        let mut tmp = [0u8; 4096];
        let start = Instant::now();
        loop {
            match self.t.read(&mut tmp) {
                Ok(0) => return out,
                Ok(k) => out.extend_from_slice(&tmp[..k]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => pump(),
                Err(_) => return out,
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the host keeps the connection open"
            );
        }
    }

    /// Everything in `b` to the host.
    fn send(&mut self, b: &[u8], pump: &mut dyn FnMut()) {
        let mut at = 0;
        let start = Instant::now();
        while at < b.len() {
            match self.t.write(&b[at..]) {
                Ok(k) => at += k,
                Err(e) if e.kind() == ErrorKind::WouldBlock => pump(),
                Err(e) => panic!("{e}"),
            }
            assert!(start.elapsed() < Duration::from_secs(30));
        }
    }

    fn layout(&self) -> SendBuf {
        let mut sb = SendBuf::new(1024);
        sb.layout = SendLayout::new(self.digests, 0);
        sb
    }

    /// A C2HData PDU carrying `data` at `datao` of command `cid`.
    fn c2h(&self, cid: u16, datao: usize, data: &[u8], flags: u8) -> Vec<u8> {
        let mut sb = self.layout();
        let h = C2hData {
            cccid: cid,
            datao: datao as u32,
            datal: data.len() as u32,
        };
        sb.push_pdu(PduType::C2hData, &h.encode(), flags, data.len());
        sb.push_data(data.len(), |o| o.extend_from_slice(data));
        sb.unsent_bytes().to_vec()
    }

    fn r2t(&self, cid: u16, ttag: u16, off: usize, len: usize) -> Vec<u8> {
        let mut sb = self.layout();
        let h = R2t {
            cccid: cid,
            ttag,
            r2to: off as u32,
            r2tl: len as u32,
        };
        sb.push_pdu(PduType::R2t, &h.encode(), 0, 0);
        sb.unsent_bytes().to_vec()
    }

    fn resp(&self, cid: u16, status: NvmeStatus) -> Vec<u8> {
        let mut sb = self.layout();
        let cqe = NvmeCompletion::new(1, cid, status).encode();
        sb.push_pdu(PduType::CapsuleResp, &CapsuleResp::encode(&cqe), 0, 0);
        sb.unsent_bytes().to_vec()
    }

    /// The data of a PDU from the host (after PDO), its data digest
    /// checked.
    fn data_of<'a>(&self, p: &'a [u8]) -> &'a [u8] {
        let ch = CommonHeader::parse(p);
        let pdo = usize::from(ch.pdo);
        let end = p.len() - if self.digests.data { DIGEST_LEN } else { 0 };
        let d = &p[pdo..end];
        if self.digests.data && !d.is_empty() {
            assert_eq!(le32(p, end), crc32c(d), "data digest of a host PDU");
        }
        d
    }
}

/// A host queue and the target end of its socket, driven from one thread.
struct Rig {
    q: TcpQueue,
    tgt: Tgt,
    bufs: Lender,
    done: Vec<(u16, NvmeCompletion)>,
    gen: u16,
}

impl Rig {
    fn new(digests: Digests, maxh2cdata: u32, inline_limit: u32) -> Rig {
        let (q, t) = scripted_target(digests, maxh2cdata, inline_limit);
        Rig {
            q,
            tgt: Tgt { t, digests },
            bufs: Lender((0..16).map(|_| None).collect()),
            done: Vec::new(),
            gen: 0,
        }
    }

    /// Queue a command on `slot` with `data`; returns its CID.
    fn submit(&mut self, slot: u16, dir: DataDir, data: SgList) -> u16 {
        self.gen = self.gen.wrapping_add(1);
        let mut cmd = NvmeCmd::new(if dir == DataDir::ToCtrl { 1 } else { 2 }, 0);
        cmd.cid = slot | ((self.gen & 0x3F) << 10);
        let q = self.q.queue_cmd(slot, &mut cmd, dir, &data).unwrap();
        assert_eq!(q, Queued::Yes);
        self.bufs.0[usize::from(slot)] = Some(data);
        self.q.flush(&self.bufs).unwrap();
        cmd.cid
    }

    /// One host poll.
    fn pump(&mut self) -> Result<bool, HostError> {
        self.q.poll(&mut self.done, &mut self.bufs)
    }

    /// Poll the host until `slot` completes (bounded); its completion and
    /// buffers.
    fn wait(&mut self, slot: u16) -> (NvmeCompletion, SgList) {
        let start = Instant::now();
        loop {
            if let Some(i) = self.done.iter().position(|d| d.0 == slot) {
                let (_, cpl) = self.done.remove(i);
                return (cpl, self.bufs.0[usize::from(slot)].take().unwrap());
            }
            self.pump().unwrap();
            assert!(start.elapsed() < Duration::from_secs(30), "slot {slot}");
        }
    }

    /// One whole PDU from the host, polling it meanwhile.
    fn pdu(&mut self) -> Vec<u8> {
        let Rig {
            q, tgt, bufs, done, ..
        } = self;
        tgt.pdu(&mut || {
            q.poll(done, bufs).unwrap();
        })
    }

    /// `b` to the host, polling it meanwhile.
    fn send(&mut self, b: &[u8]) {
        let Rig {
            q, tgt, bufs, done, ..
        } = self;
        tgt.send(b, &mut || {
            q.poll(done, bufs).unwrap();
        });
    }
}

/// How the scripted target delivers a read's PDUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    /// All PDUs in one write: the host finds most data in its receive
    /// buffer.
    AtOnce,
    /// Each PDU's header and a few bytes first, the rest once the host
    /// has polled: the host reads the rest straight into the buffers.
    Trickled,
}

fn read_case(
    digests: Digests,
    size: usize,
    parts: usize,
    pdu: usize,
    how: Delivery,
    success: bool,
) {
    let mut r = Rig::new(digests, 16 * 1024, 0);
    let want = pattern(size + parts, size);
    let cid = r.submit(3, DataDir::FromCtrl, segments(size, parts, 0xEE));
    let cmd = r.pdu();
    assert_eq!(
        CommonHeader::parse(&cmd).pdu_type,
        PduType::CapsuleCmd.code()
    );
    assert_eq!(le16(&cmd, 8 + 2), cid);
    let mut off = 0;
    let mut all = Vec::new();
    while off < size {
        let n = pdu.min(size - off);
        let last = off + n == size;
        let flags = if last && success {
            FLAG_LAST_PDU | FLAG_SUCCESS
        } else if last {
            FLAG_LAST_PDU
        } else {
            0
        };
        let p = r.tgt.c2h(cid, off, &want[off..off + n], flags);
        match how {
            Delivery::AtOnce => all.extend(p),
            Delivery::Trickled => {
                let head = (p.len() - n - if digests.data { 4 } else { 0 }) + 5;
                r.send(&p[..head]);
                for _ in 0..3 {
                    r.pump().unwrap();
                }
                r.send(&p[head..]);
            }
        }
        off += n;
    }
    if !success {
        all.extend(r.tgt.resp(cid, NvmeStatus::SUCCESS));
    }
    let all = all;
    r.send(&all);
    let (cpl, data) = r.wait(3);
    assert!(cpl.status.is_success(), "{cpl:?}");
    assert_eq!(cpl.cid, cid);
    assert!(
        flat(&data) == want,
        "read data of {size} B ({how:?}, {digests:?})"
    );
    let st = r.q.stats();
    assert_eq!(st.c2h_pdus as usize, size.div_ceil(pdu));
    assert_eq!(st.data_digest_errors, 0);
    assert_eq!(st.c2h_success, u64::from(success));
    if how == Delivery::Trickled && pdu.min(size) - 5 >= 1024 {
        assert!(st.c2h_direct_bytes > 0, "{st:?}");
    }
    if pdu >= 16 * 1024 && size >= 8 * pdu {
        // After the first big payload the queue reads in small windows:
        // most of the rest goes straight into the buffers.
        assert!(st.c2h_direct_bytes as usize >= size / 2, "{st:?}");
    }
}

#[test]
fn reads_split_over_c2h_pdus_land_in_multi_segment_buffers() {
    for d in ALL_DIGESTS {
        for (size, parts, pdu) in [
            (512, 1, 512),
            (4096, 3, 1000),
            (65536, 5, 16384),
            (65536, 4, 24_000),
            (1 << 20, 7, 128 * 1024),
        ] {
            for how in [Delivery::AtOnce, Delivery::Trickled] {
                read_case(d, size, parts, pdu, how, true);
            }
        }
        read_case(d, 65536, 3, 20_000, Delivery::AtOnce, false);
        read_case(d, 200_000, 6, 70_000, Delivery::Trickled, false);
    }
}

/// A write of `size` bytes by R2T (two R2Ts of half each, split by
/// MAXH2CDATA); returns the stats.
fn r2t_case(digests: Digests, size: usize, parts: usize) -> super::TcpQueueStats {
    let maxh2c = 16 * 1024;
    let mut r = Rig::new(digests, maxh2c as u32, 0);
    let want = pattern(size ^ 0x55, size);
    let mut data = segments(size, parts, 0);
    data.copy_from_slice(&want);
    let cid = r.submit(5, DataDir::ToCtrl, data);
    let cmd = r.pdu();
    // No in-capsule data.
    assert_eq!(
        cmd.len(),
        CMD_HLEN + if digests.header { DIGEST_LEN } else { 0 }
    );
    let half = size / 2;
    let mut got = vec![0u8; size];
    let mut seen = 0;
    for (ttag, off, len) in [(7u16, 0, half), (8, half, size - half)] {
        if len == 0 {
            continue;
        }
        let p = r.tgt.r2t(cid, ttag, off, len);
        r.send(&p);
        let mut at = off;
        while at < off + len {
            let p = r.pdu();
            let ch = CommonHeader::parse(&p);
            assert_eq!(ch.pdu_type, PduType::H2cData.code());
            let data = r.tgt.data_of(&p);
            let h = H2cData::parse(&p, data.len()).unwrap();
            assert_eq!((h.cccid, h.ttag, h.datao as usize), (cid, ttag, at));
            assert!(h.datal as usize <= maxh2c);
            let last = at + data.len() == off + len;
            assert_eq!(ch.flags & FLAG_LAST_PDU != 0, last);
            got[at..at + data.len()].copy_from_slice(data);
            at += data.len();
            seen += data.len();
        }
    }
    assert_eq!(seen, size);
    assert!(got == want, "write data of {size} B ({digests:?})");
    let p = r.tgt.resp(cid, NvmeStatus::SUCCESS);
    r.send(&p);
    let (cpl, back) = r.wait(5);
    assert!(cpl.status.is_success());
    assert!(flat(&back) == want, "the caller's buffers changed");
    r.q.stats()
}

#[test]
fn r2t_writes_split_by_maxh2cdata_go_out_from_the_callers_buffers() {
    for d in ALL_DIGESTS {
        for (size, parts) in [(512, 1), (8192, 3), (65536, 5), (100_000, 4), (1 << 20, 9)] {
            let st = r2t_case(d, size, parts);
            assert!(st.r2t >= 1 && st.h2c_pdus >= 2, "{st:?}");
            if size >= 8192 {
                assert!(st.sent_by_ref > 0, "{size} B: {st:?}");
            } else {
                assert_eq!(st.sent_by_ref, 0, "{size} B: {st:?}");
            }
        }
    }
}

#[test]
fn in_capsule_writes_go_out_from_the_callers_buffers() {
    for d in ALL_DIGESTS {
        for (size, parts) in [(512, 2), (4095, 3), (4096, 1), (8192, 4)] {
            let mut r = Rig::new(d, 16 * 1024, 8192);
            let want = pattern(size, size);
            let mut data = segments(size, parts, 0);
            data.copy_from_slice(&want);
            let cid = r.submit(0, DataDir::ToCtrl, data);
            let p = r.pdu();
            assert!(
                r.tgt.data_of(&p) == want.as_slice(),
                "{size} B in the capsule"
            );
            let st = r.q.stats();
            assert_eq!(st.inline, 1);
            assert_eq!(st.sent_by_ref, u64::from(size >= 4096), "{size} B: {st:?}");
            let p = r.tgt.resp(cid, NvmeStatus::SUCCESS);
            r.send(&p);
            let (cpl, back) = r.wait(0);
            assert!(cpl.status.is_success());
            assert!(flat(&back) == want);
        }
    }
}

#[test]
fn a_bad_data_digest_fails_only_its_read() {
    let d = Digests {
        header: true,
        data: true,
    };
    for how in [Delivery::AtOnce, Delivery::Trickled] {
        let mut r = Rig::new(d, 16 * 1024, 0);
        let size = 65536;
        let want = pattern(9, size);
        let cid = r.submit(2, DataDir::FromCtrl, segments(size, 3, 0));
        r.pdu();
        let mut p1 = r.tgt.c2h(cid, 0, &want[..40_000], 0);
        let n = p1.len();
        p1[n - 1] ^= 0x40;
        let p2 = r
            .tgt
            .c2h(cid, 40_000, &want[40_000..], FLAG_LAST_PDU | FLAG_SUCCESS);
        if how == Delivery::Trickled {
            r.send(&p1[..100]);
            r.pump().unwrap();
        } else {
            r.send(&p1[..100]);
        }
        r.send(&p1[100..]);
        r.send(&p2);
        let (cpl, _) = r.wait(2);
        assert_eq!(cpl.status, NvmeStatus::TRANSIENT_TRANSPORT_ERROR);
        assert_eq!(r.q.stats().data_digest_errors, 1);
        // The queue goes on: the next read is fine.
        let cid = r.submit(2, DataDir::FromCtrl, segments(4096, 2, 0));
        r.pdu();
        let p = r
            .tgt
            .c2h(cid, 0, &want[..4096], FLAG_LAST_PDU | FLAG_SUCCESS);
        r.send(&p);
        let (cpl, data) = r.wait(2);
        assert!(cpl.status.is_success());
        assert!(flat(&data) == want[..4096]);
    }
}

#[test]
fn an_early_response_waits_until_the_writes_data_is_out() {
    // More than the sockets buffer: the host's H2CData stays queued (by
    // reference) while the target answers.
    let d = Digests {
        header: false,
        data: true,
    };
    let mut r = Rig::new(d, 1 << 20, 0);
    let size = 32 << 20;
    let want = pattern(3, size);
    let mut data = segments(size, 8, 0);
    data.copy_from_slice(&want);
    let cid = r.submit(4, DataDir::ToCtrl, data);
    r.pdu();
    let p = r.tgt.r2t(cid, 1, 0, size);
    r.send(&p);
    r.pump().unwrap();
    let p = r.tgt.resp(cid, NvmeStatus::SUCCESS);
    r.send(&p);
    for _ in 0..10 {
        r.pump().unwrap();
    }
    assert!(
        r.done.is_empty(),
        "completed while its data was still queued"
    );
    assert!(r.q.slot_state(4).is_some_and(|s| s.contains("held true")));
    // The target takes the data: then the completion comes.
    let mut got = Vec::with_capacity(size);
    while got.len() < size {
        let p = r.pdu();
        got.extend_from_slice(r.tgt.data_of(&p));
    }
    assert!(got == want);
    let (cpl, back) = r.wait(4);
    assert!(cpl.status.is_success());
    assert_eq!(back.total_len(), size);
}

/// Submit `pairs` 64 KiB reads (ctx `i`) and writes (ctx `10 + i`) on
/// `qp`, flush, and take their capsules at the scripted target (nothing
/// may complete meanwhile): each command's (CID, is a write), in the
/// order they arrived.
fn reads_and_writes_in_flight(
    qp: &mut Qpair<TcpQueue>,
    tgt: &mut Tgt,
    pairs: u64,
) -> Vec<(u16, bool)> {
    for i in 0..pairs {
        for (dir, ctx) in [(DataDir::FromCtrl, i), (DataDir::ToCtrl, 10 + i)] {
            let opc = if dir == DataDir::ToCtrl { 1 } else { 2 };
            qp.submit(NvmeCmd::new(opc, 0), dir, segments(65536, 3, 1), ctx)
                .unwrap();
        }
    }
    qp.flush();
    let mut idle = || {
        qp.poll(&mut |c| panic!("nothing can complete yet: {:?}", c.result));
    };
    (0..2 * pairs)
        .map(|_| {
            let p = tgt.pdu(&mut idle);
            (le16(&p, 8 + 2), p[8] == 1)
        })
        .collect()
}

#[test]
fn a_target_that_vanishes_mid_io_fails_every_command_and_hands_every_buffer_back() {
    let d = Digests {
        header: true,
        data: true,
    };
    let Rig { q, mut tgt, .. } = Rig::new(d, 16 * 1024, 4096);
    let mut qp = Qpair::new(q, 1, 16, Duration::from_secs(30));
    let cids = reads_and_writes_in_flight(&mut qp, &mut tgt, 4);
    let mut idle = || {
        qp.poll(&mut |c| panic!("nothing can complete yet: {:?}", c.result));
    };
    // One write's R2T is answered in part, one read gets half its data,
    // then the target is gone.
    let (wcid, _) = *cids.iter().find(|c| c.1).unwrap();
    let (rcid, _) = *cids.iter().find(|c| !c.1).unwrap();
    let r2t = tgt.r2t(wcid, 1, 0, 65536);
    tgt.send(&r2t, &mut idle);
    let _ = tgt.pdu(&mut idle);
    let c2h = tgt.c2h(rcid, 0, &[0x5A; 32768], FLAG_LAST_PDU | FLAG_SUCCESS);
    tgt.send(&c2h[..c2h.len() / 2], &mut idle);
    for _ in 0..10 {
        idle();
    }
    drop(tgt);
    let mut back = Vec::new();
    let start = Instant::now();
    while back.len() < 8 {
        qp.poll(&mut |c| back.push(c));
        assert!(start.elapsed() < Duration::from_secs(30));
    }
    assert!(!qp.is_alive());
    assert_eq!(qp.outstanding(), 0);
    for c in &back {
        assert!(matches!(c.result, Err(IoError::Aborted)), "{:?}", c.result);
        assert_eq!(c.data.total_len(), 65536);
    }
}

/// Four 64 KiB commands in flight on a host [`Qpair`] (two reads, two
/// writes by R2T): one write's data all sent after its R2T, half of one
/// read's data in; then the scripted target sends `bad(read cid, write
/// cid)`. Every command ends with [`IoError::Aborted`] and its caller's
/// buffers whole (a write's data unchanged), nothing is outstanding, the
/// queue is dead and its socket closed. Returns the bad PDU and what the
/// host sent after it, up to the end of the stream.
fn bad_pdu_mid_io(bad: impl FnOnce(&Tgt, u16, u16) -> Vec<u8>) -> (Vec<u8>, Vec<u8>) {
    let Rig { q, mut tgt, .. } = Rig::new(Digests::default(), 16 * 1024, 0);
    let mut qp = Qpair::new(q, 1, 16, Duration::from_secs(30));
    let cids = reads_and_writes_in_flight(&mut qp, &mut tgt, 2);
    let mut idle = || {
        qp.poll(&mut |c| panic!("nothing can complete yet: {:?}", c.result));
    };
    let (wcid, _) = *cids.iter().find(|c| c.1).unwrap();
    let (rcid, _) = *cids.iter().find(|c| !c.1).unwrap();
    let r2t = tgt.r2t(wcid, 1, 0, 65536);
    tgt.send(&r2t, &mut idle);
    for _ in 0..4 {
        let p = tgt.pdu(&mut idle);
        assert_eq!(p[0], PduType::H2cData.code());
    }
    let c2h = tgt.c2h(rcid, 0, &[0x5A; 32768], 0);
    tgt.send(&c2h, &mut idle);
    for _ in 0..10 {
        idle();
    }
    let b = bad(&tgt, rcid, wcid);
    tgt.send(&b, &mut || {});
    let mut back = Vec::new();
    let start = Instant::now();
    while back.len() < 4 {
        qp.poll(&mut |c| back.push(c));
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{} of 4 commands ended",
            back.len()
        );
    }
    assert!(!qp.is_alive());
    assert_eq!(qp.outstanding(), 0);
    let mut ctxs: Vec<u64> = back.iter().map(|c| c.ctx).collect();
    ctxs.sort_unstable();
    assert_eq!(ctxs, [0, 1, 10, 11]);
    for c in &back {
        assert!(matches!(c.result, Err(IoError::Aborted)), "{:?}", c.result);
        assert_eq!(c.data.total_len(), 65536);
        if c.ctx >= 10 {
            assert!(flat(&c.data).iter().all(|&b| b == 1), "write data changed");
        }
    }
    let rest = tgt.rest(&mut || {
        qp.poll(&mut |c| panic!("completed twice: {:?}", c.ctx));
    });
    (b, rest)
}

/// What the host sent after a bad PDU `bad` must be one H2CTermReq with
/// `fes` and `fei` carrying (the start of) the bad PDU, then nothing.
fn assert_h2c_term(rest: &[u8], bad: &[u8], fes: Fes, fei: u32) {
    assert!(rest.len() >= SHORT_HLEN + CH_LEN, "no H2CTermReq: {rest:?}");
    assert_eq!(rest[0], PduType::H2cTermReq.code(), "not an H2CTermReq");
    assert_eq!(
        le32(rest, 4) as usize,
        rest.len(),
        "bytes after the H2CTermReq"
    );
    let t = TermReq::parse(rest);
    assert_eq!((Fes::from_code(t.fes), t.fei), (Some(fes), fei));
    assert!(rest.len() <= SHORT_HLEN + TERM_REQ_MAX_DATA);
    assert!(
        bad.starts_with(&rest[SHORT_HLEN..]),
        "not the bad PDU's header"
    );
}

/// A C2HTermReq from the target in the middle of I/O ends every command
/// ([`bad_pdu_mid_io`]) and the host closes without a TermReq of its own.
#[test]
fn a_c2h_term_req_mid_io_ends_every_command_and_the_connection() {
    let (_, rest) = bad_pdu_mid_io(|_, _, _| {
        let mut out = [0u8; SHORT_HLEN + TERM_REQ_MAX_DATA];
        let n = TermReq {
            fes: Fes::DataOutOfRange.code(),
            fei: 0,
        }
        .encode_into(true, &[0u8; 24], &mut out);
        out[..n].to_vec()
    });
    assert!(rest.is_empty(), "the host answered a TermReq: {rest:?}");
}

/// C2HData for a command id that names no command, C2HData for a write,
/// and a CapsuleResp for an unknown command id: each ends every command
/// ([`bad_pdu_mid_io`]) with an H2CTermReq (Invalid PDU Header Field)
/// naming CCCID (byte 8) or the CQE's CID (byte 20).
#[test]
fn a_pdu_for_an_unknown_command_ends_every_command_and_the_connection() {
    type Bad = fn(&Tgt, u16, u16) -> Vec<u8>;
    let cases: [(Bad, u32); 3] = [
        (
            |t, rcid, _| t.c2h(rcid ^ 0x8000, 0, &[1; 512], FLAG_LAST_PDU | FLAG_SUCCESS),
            8,
        ),
        (
            |t, _, wcid| t.c2h(wcid, 0, &[1; 512], FLAG_LAST_PDU | FLAG_SUCCESS),
            8,
        ),
        (|t, rcid, _| t.resp(rcid ^ 0x8000, NvmeStatus::SUCCESS), 20),
    ];
    for (bad, fei) in cases {
        let (sent, rest) = bad_pdu_mid_io(bad);
        assert_h2c_term(&rest, &sent, Fes::InvalidHeaderField, fei);
    }
}

/// A C2HData and a CapsuleResp whose PLEN is shorter than their 24-byte
/// header: each ends every command ([`bad_pdu_mid_io`]) with an
/// H2CTermReq (Invalid PDU Header Field) naming PLEN (byte 4).
#[test]
fn a_pdu_shorter_than_its_header_ends_every_command_and_the_connection() {
    type Bad = fn(&Tgt, u16, u16) -> Vec<u8>;
    let cases: [Bad; 2] = [
        |t, rcid, _| t.c2h(rcid, 32768, &[2; 32768], FLAG_LAST_PDU | FLAG_SUCCESS),
        |t, rcid, _| t.resp(rcid, NvmeStatus::SUCCESS),
    ];
    for bad in cases {
        let (sent, rest) = bad_pdu_mid_io(|t, r, w| {
            let mut b = bad(t, r, w);
            b[4..8].copy_from_slice(&20u32.to_le_bytes());
            b
        });
        assert_h2c_term(&rest, &sent, Fes::InvalidHeaderField, 4);
    }
}

/// A C2HData with SUCCESS but not LAST_PDU (SUCCESS is allowed on the last
/// data PDU of a command only): it ends every command
/// ([`bad_pdu_mid_io`]) with an H2CTermReq (Invalid PDU Header Field)
/// naming FLAGS (byte 1), where the host took the data and waited for a
/// completion that no PDU would bring.
#[test]
fn c2hdata_with_success_but_not_last_pdu_ends_every_command_and_the_connection() {
    let (sent, rest) = bad_pdu_mid_io(|t, rcid, _| t.c2h(rcid, 32768, &[2; 32768], FLAG_SUCCESS));
    assert_h2c_term(&rest, &sent, Fes::InvalidHeaderField, 1);
}

/// A C2HTermReq whose PLEN lies outside 24..=152 ends every command
/// ([`bad_pdu_mid_io`]) and the connection, with no H2CTermReq in answer.
#[test]
fn a_c2h_term_req_with_a_bad_plen_is_closed_without_an_answer() {
    let (_, rest) = bad_pdu_mid_io(|_, _, _| {
        let mut out = [0u8; SHORT_HLEN + TERM_REQ_MAX_DATA];
        let n = TermReq {
            fes: Fes::DataOutOfRange.code(),
            fei: 0,
        }
        .encode_into(true, &[0u8; 24], &mut out);
        out[4..8].copy_from_slice(&4096u32.to_le_bytes());
        out[..n].to_vec()
    });
    assert!(rest.is_empty(), "the host answered a TermReq: {rest:?}");
}
