//! Bad input from a raw socket: each fatal error gets its C2HTermReq
//! (status and field offset), the connection closes and nothing leaks; a
//! bad data digest fails only its command; 1,000 abrupt disconnects in
//! the middle of R2T transfers leave every pool as it started.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;

use super::*;
use crate::host::{Controller, CtrlOptions};
use crate::spec::cmd::{IoOpcode, NvmeCmd};
use crate::spec::connect::{ConnectCmd, ConnectData, CNTLID_DYNAMIC, CONNECT_DATA_SIZE};
use crate::spec::cpl::{NvmeCompletion, NvmeStatus};
use crate::spec::sgl::SglDescriptor;
use crate::spec::tcp::{
    crc32c, CapsuleCmdHdr, CommonHeader, Digests, Fes, H2cData, IcReq, IcResp, PduType, R2t,
    SendLayout, TermReq,
};

/// A raw NVMe/TCP client on a non-blocking socket; every wait polls the
/// cluster (bounded).
struct Raw {
    s: TcpStream,
    layout: SendLayout,
    buf: Vec<u8>,
}

const SPINS: usize = 200_000;

impl Raw {
    fn connect(f: &Fx) -> Raw {
        let s = TcpStream::connect(f.addr).unwrap();
        s.set_nonblocking(true).unwrap();
        Raw {
            s,
            layout: SendLayout::new(Digests::default(), 0),
            buf: Vec::new(),
        }
    }

    /// ICReq / ICResp with `digests`.
    fn handshake(f: &Fx, digests: Digests) -> Raw {
        let mut r = Raw::connect(f);
        r.send(
            &IcReq {
                pfv: 0,
                hpda: 0,
                digests,
                maxr2t: 0,
            }
            .encode(),
        );
        let rsp = r.recv(f, 128);
        let ic = IcResp::parse(&rsp).unwrap();
        assert_eq!(ic.digests, digests);
        r.layout = SendLayout::new(ic.digests, ic.cpda);
        r
    }

    fn send(&mut self, b: &[u8]) {
        let mut off = 0;
        while off < b.len() {
            match self.s.write(&b[off..]) {
                Ok(n) => off += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("send: {e}"),
            }
        }
    }

    /// Poll until `n` bytes came; `None` on EOF first.
    fn try_recv(&mut self, f: &Fx, n: usize) -> Option<Vec<u8>> {
        let mut tmp = [0u8; 4096];
        for _ in 0..SPINS {
            if self.buf.len() >= n {
                return Some(self.buf.drain(..n).collect());
            }
            f.cl.poll_once_all();
            match self.s.read(&mut tmp) {
                Ok(0) => return None,
                Ok(k) => self.buf.extend_from_slice(&tmp[..k]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(_) => return None,
            }
        }
        panic!("no {n} bytes from the target");
    }

    fn recv(&mut self, f: &Fx, n: usize) -> Vec<u8> {
        self.try_recv(f, n)
            .expect("the target closed the connection")
    }

    /// The next PDU (header and data; no digests expected).
    fn pdu(&mut self, f: &Fx) -> Vec<u8> {
        let mut p = self.recv(f, 8);
        let plen = CommonHeader::parse(&p).plen as usize;
        p.extend(self.recv(f, plen - 8));
        p
    }

    /// Expect a C2HTermReq with `fes` (and `fei`), then the close.
    fn expect_term(&mut self, f: &Fx, fes: Fes, fei: Option<u32>) {
        let p = self.pdu(f);
        assert_eq!(p[0], PduType::C2hTermReq.code(), "not a C2HTermReq: {p:?}");
        let t = TermReq::parse(&p);
        assert_eq!(Fes::from_code(t.fes), Some(fes));
        if let Some(fei) = fei {
            assert_eq!(t.fei, fei);
        }
        assert!(self.try_recv(f, 1).is_none(), "the connection stays open");
    }

    fn capsule(&self, cmd: &NvmeCmd, data: &[u8]) -> Vec<u8> {
        let mut h = [0u8; 512];
        let hdr = CapsuleCmdHdr::encode(&cmd.encode());
        h[..hdr.len()].copy_from_slice(&hdr);
        let n = self
            .layout
            .finish_header(&mut h, PduType::CapsuleCmd, 0, data.len());
        let mut out = h[..n].to_vec();
        out.extend_from_slice(data);
        if self.layout.ddgst_len(data.len()) > 0 {
            out.extend_from_slice(&crc32c(data).to_le_bytes());
        }
        out
    }

    fn h2c(&self, h: &H2cData, data: &[u8]) -> Vec<u8> {
        let mut b = [0u8; 512];
        b[..24].copy_from_slice(&h.encode());
        let n = self
            .layout
            .finish_header(&mut b, PduType::H2cData, 0, data.len());
        let mut out = b[..n].to_vec();
        out.extend_from_slice(data);
        out
    }
}

fn connect_cmd(qid: u16, cntlid: u16, sgl: SglDescriptor) -> (NvmeCmd, Vec<u8>) {
    let mut cmd = ConnectCmd {
        recfmt: 0,
        qid,
        sqsize: 31,
        cattr: 0,
        kato: if qid == 0 { 30_000 } else { 0 },
    }
    .to_cmd(7);
    cmd.set_sgl(&sgl);
    let mut data = [0u8; CONNECT_DATA_SIZE];
    ConnectData {
        hostid: who().hostid,
        cntlid,
        subnqn: NQN.into(),
        hostnqn: DEFAULT_HOSTNQN.into(),
    }
    .encode_into(&mut data);
    (cmd, data.to_vec())
}

fn after(f: &Fx, terminated: u64) {
    f.settle();
    f.assert_pool_full();
    assert_eq!(f.transport.stats().terminated, terminated);
}

#[test]
fn a_pdu_before_icreq_is_a_sequence_error() {
    let f = fixture(TcpOptions::default());
    let mut r = Raw::connect(&f);
    let (cmd, _) = connect_cmd(0, CNTLID_DYNAMIC, SglDescriptor::Transport { len: 0 });
    let p = r.capsule(&cmd, &[]);
    r.send(&p);
    r.expect_term(&f, Fes::SequenceError, None);
    after(&f, 1);
}

#[test]
fn a_length_that_lies_names_plen() {
    let f = fixture(TcpOptions::default());
    let mut r = Raw::handshake(&f, Digests::default());
    let (cmd, data) = connect_cmd(0, CNTLID_DYNAMIC, SglDescriptor::in_capsule(0, 1024));
    let mut p = r.capsule(&cmd, &data);
    // plen says less than the header.
    p[4..8].copy_from_slice(&40u32.to_le_bytes());
    r.send(&p);
    r.expect_term(&f, Fes::InvalidHeaderField, Some(4));
    after(&f, 1);
}

#[test]
fn in_capsule_data_over_the_limit_is_a_data_limit_error() {
    let f = fixture(TcpOptions::default());
    let mut r = Raw::handshake(&f, Digests::default());
    let (cmd, _) = connect_cmd(0, CNTLID_DYNAMIC, SglDescriptor::in_capsule(0, 1024));
    let p = r.capsule(&cmd, &vec![0u8; 12 * 1024]);
    r.send(&p);
    r.expect_term(&f, Fes::DataLimitExceeded, None);
    after(&f, 1);
}

#[test]
fn a_bad_header_digest_is_fatal() {
    let f = fixture(TcpOptions::default());
    let both = Digests {
        header: true,
        data: true,
    };
    let mut r = Raw::handshake(&f, both);
    let (cmd, data) = connect_cmd(0, CNTLID_DYNAMIC, SglDescriptor::in_capsule(0, 1024));
    let mut p = r.capsule(&cmd, &data);
    p[72] ^= 0xFF; // the header digest
    r.send(&p);
    r.expect_term(&f, Fes::HeaderDigest, None);
    after(&f, 1);
}

#[test]
fn a_bad_data_digest_fails_only_its_command() {
    let f = fixture(TcpOptions::default());
    let ddgst = Digests {
        header: false,
        data: true,
    };
    let mut r = Raw::handshake(&f, ddgst);
    let (cmd, data) = connect_cmd(0, CNTLID_DYNAMIC, SglDescriptor::in_capsule(0, 1024));
    let mut p = r.capsule(&cmd, &data);
    let last = p.len() - 1;
    p[last] ^= 0xFF;
    r.send(&p);
    let rsp = r.pdu(&f);
    assert_eq!(rsp[0], PduType::CapsuleResp.code());
    let cpl = NvmeCompletion::parse(&rsp[8..24]).unwrap();
    assert_eq!(cpl.status, NvmeStatus::TRANSIENT_TRANSPORT_ERROR);
    // The same Connect with a good digest succeeds on the same connection.
    let p = r.capsule(&cmd, &data);
    r.send(&p);
    let rsp = r.pdu(&f);
    let cpl = NvmeCompletion::parse(&rsp[8..24]).unwrap();
    assert!(cpl.status.is_success(), "{cpl:?}");
    drop(r);
    after(&f, 0);
}

#[test]
fn h2cdata_without_an_r2t_names_its_ttag() {
    let f = fixture(TcpOptions::default());
    let mut r = Raw::handshake(&f, Digests::default());
    let h = H2cData {
        cccid: 1,
        ttag: 5,
        datao: 0,
        datal: 512,
    };
    let p = r.h2c(&h, &[0u8; 512]);
    r.send(&p);
    r.expect_term(&f, Fes::InvalidHeaderField, Some(10));
    after(&f, 1);
}

/// A Connect whose data goes by R2T; returns the R2T.
fn connect_by_r2t(f: &Fx, r: &mut Raw) -> R2t {
    let (cmd, _) = connect_cmd(0, CNTLID_DYNAMIC, SglDescriptor::Transport { len: 1024 });
    let p = r.capsule(&cmd, &[]);
    r.send(&p);
    let pdu = r.pdu(f);
    assert_eq!(pdu[0], PduType::R2t.code());
    let r2t = R2t::parse(&pdu).unwrap();
    assert_eq!((r2t.cccid, r2t.r2to, r2t.r2tl), (7, 0, 1024));
    r2t
}

/// A new connection whose Connect waits for its data by R2T, answered
/// with an H2CData PDU at `datao` carrying `data`; returns the connection.
fn answer_r2t(f: &Fx, datao: u32, data: &[u8]) -> Raw {
    let mut r = Raw::handshake(f, Digests::default());
    let r2t = connect_by_r2t(f, &mut r);
    let h = H2cData {
        cccid: r2t.cccid,
        ttag: r2t.ttag,
        datao,
        datal: data.len() as u32,
    };
    let p = r.h2c(&h, data);
    r.send(&p);
    r
}

#[test]
fn h2cdata_outside_its_r2t_is_out_of_range() {
    let f = fixture(TcpOptions::default());
    // Not at the expected offset, then past the end of the R2T.
    answer_r2t(&f, 512, &[0u8; 512]).expect_term(&f, Fes::DataOutOfRange, None);
    answer_r2t(&f, 0, &[0u8; 2048]).expect_term(&f, Fes::DataOutOfRange, None);
    // The right data completes the Connect.
    let (_, data) = connect_cmd(0, CNTLID_DYNAMIC, SglDescriptor::Transport { len: 1024 });
    let mut r = answer_r2t(&f, 0, &data);
    let rsp = r.pdu(&f);
    assert_eq!(rsp[0], PduType::CapsuleResp.code());
    assert!(NvmeCompletion::parse(&rsp[8..24])
        .unwrap()
        .status
        .is_success());
    drop(r);
    after(&f, 2);
}

#[test]
fn a_second_icreq_is_a_sequence_error() {
    let f = fixture(TcpOptions::default());
    let mut r = Raw::handshake(&f, Digests::default());
    r.send(
        &IcReq {
            pfv: 0,
            hpda: 0,
            digests: Digests::default(),
            maxr2t: 0,
        }
        .encode(),
    );
    r.expect_term(&f, Fes::SequenceError, None);
    after(&f, 1);
}

#[test]
fn a_host_that_refuses_digests_is_turned_away_when_they_are_required() {
    let f = fixture(TcpOptions {
        digest: super::super::DigestPolicy::Require,
        ..TcpOptions::default()
    });
    let mut r = Raw::connect(&f);
    r.send(
        &IcReq {
            pfv: 0,
            hpda: 0,
            digests: Digests::default(),
            maxr2t: 0,
        }
        .encode(),
    );
    r.expect_term(&f, Fes::UnsupportedParameter, Some(11));
    after(&f, 1);
}

#[test]
fn a_thousand_abrupt_disconnects_leave_every_pool_full() {
    let f = fixture(TcpOptions::default());
    f.cl.on(0, |_| {
        let t = f.host(false, false);
        let c = Controller::connect(&t, who(), CtrlOptions::default()).unwrap();
        let cntlid = c.info().cntlid;
        for i in 0..1000u32 {
            let mut r = Raw::handshake(&f, Digests::default());
            let (cmd, data) = connect_cmd(1, cntlid, SglDescriptor::in_capsule(0, 1024));
            let p = r.capsule(&cmd, &data);
            r.send(&p);
            let rsp = r.pdu(&f);
            assert!(NvmeCompletion::parse(&rsp[8..24])
                .unwrap()
                .status
                .is_success());
            // A 64 KiB write by R2T (pool buffers), cut off half way.
            let mut w = NvmeCmd::new(IoOpcode::Write.code(), 9);
            w.nsid = 1;
            w.cdw10 = i % 1024;
            w.cdw12 = 127;
            w.set_sgl(&SglDescriptor::Transport { len: 65536 });
            let p = r.capsule(&w, &[]);
            r.send(&p);
            let r2t = R2t::parse(&r.pdu(&f)).unwrap();
            if i % 2 == 0 {
                let h = H2cData {
                    cccid: r2t.cccid,
                    ttag: r2t.ttag,
                    datao: 0,
                    datal: 8192,
                };
                let p = r.h2c(&h, &[0x5A; 8192]);
                r.send(&p);
            }
            drop(r);
            f.cl.poll_once_all();
        }
        drop(c);
    });
    f.settle();
    f.assert_pool_full();
    let st = f.transport.stats();
    assert_eq!(st.accepted, 1001);
    assert_eq!(st.destroyed, 1001);
    assert_eq!(f.transport.queues_per_group(), vec![0]);
}
