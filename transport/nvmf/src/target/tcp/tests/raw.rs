//! A raw NVMe/TCP client for the tests that speak PDUs themselves (bad
//! input, placement): a non-blocking socket whose every wait polls the
//! whole cluster.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;

use super::*;
use crate::spec::cmd::NvmeCmd;
use crate::spec::connect::{ConnectCmd, ConnectData, CNTLID_DYNAMIC, CONNECT_DATA_SIZE};
use crate::spec::sgl::SglDescriptor;
use crate::spec::tcp::{
    crc32c, CapsuleCmdHdr, CommonHeader, Digests, Fes, H2cData, IcReq, IcResp, PduType, SendLayout,
    TermReq,
};

/// A raw NVMe/TCP client on a non-blocking socket; every wait polls the
/// cluster (bounded).
pub(super) struct Raw {
    s: TcpStream,
    layout: SendLayout,
    buf: Vec<u8>,
}

const SPINS: usize = 200_000;

impl Raw {
    pub(super) fn connect(f: &Fx) -> Raw {
        let s = TcpStream::connect(f.addr).unwrap();
        s.set_nonblocking(true).unwrap();
        Raw {
            s,
            layout: SendLayout::new(Digests::default(), 0),
            buf: Vec::new(),
        }
    }

    /// ICReq / ICResp with `digests`.
    pub(super) fn handshake(f: &Fx, digests: Digests) -> Raw {
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

    pub(super) fn send(&mut self, b: &[u8]) {
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
    pub(super) fn try_recv(&mut self, f: &Fx, n: usize) -> Option<Vec<u8>> {
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

    /// Poll until the target closes the connection (EOF or reset; any
    /// bytes before it are dropped) or `limit` passes; whether it closed.
    pub(super) fn closed_within(&mut self, f: &Fx, limit: std::time::Duration) -> bool {
        let start = std::time::Instant::now();
        let mut tmp = [0u8; 4096];
        while start.elapsed() < limit {
            f.cl.poll_once_all();
            match self.s.read(&mut tmp) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(_) => return true,
            }
        }
        false
    }

    pub(super) fn recv(&mut self, f: &Fx, n: usize) -> Vec<u8> {
        self.try_recv(f, n)
            .expect("the target closed the connection")
    }

    /// The next PDU (header and data; no digests expected).
    pub(super) fn pdu(&mut self, f: &Fx) -> Vec<u8> {
        let mut p = self.recv(f, 8);
        let plen = CommonHeader::parse(&p).plen as usize;
        p.extend(self.recv(f, plen - 8));
        p
    }

    /// Expect a C2HTermReq with `fes` (and `fei`), then the close.
    pub(super) fn expect_term(&mut self, f: &Fx, fes: Fes, fei: Option<u32>) {
        let p = self.pdu(f);
        assert_eq!(p[0], PduType::C2hTermReq.code(), "not a C2HTermReq: {p:?}");
        let t = TermReq::parse(&p);
        assert_eq!(Fes::from_code(t.fes), Some(fes));
        if let Some(fei) = fei {
            assert_eq!(t.fei, fei);
        }
        assert!(self.try_recv(f, 1).is_none(), "the connection stays open");
    }

    pub(super) fn capsule(&self, cmd: &NvmeCmd, data: &[u8]) -> Vec<u8> {
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

    /// An admin-queue Connect capsule (new controller) with its 1 KiB of
    /// data in the capsule, laid out for this connection's digests.
    pub(super) fn admin_connect(&self) -> Vec<u8> {
        let (cmd, data) = connect_cmd(0, CNTLID_DYNAMIC, SglDescriptor::in_capsule(0, 1024));
        self.capsule(&cmd, &data)
    }

    /// Send an H2CData PDU for a transfer tag no R2T handed out (fatal),
    /// then expect the C2HTermReq naming TTAG (offset 10) and the close.
    pub(super) fn h2c_without_r2t(&mut self, f: &Fx) {
        let h = H2cData {
            cccid: 1,
            ttag: 0xBEEF,
            datao: 0,
            datal: 512,
        };
        let p = self.h2c(&h, &[0u8; 512]);
        self.send(&p);
        self.expect_term(f, Fes::InvalidHeaderField, Some(10));
    }

    pub(super) fn h2c(&self, h: &H2cData, data: &[u8]) -> Vec<u8> {
        let mut b = [0u8; 512];
        b[..24].copy_from_slice(&h.encode());
        let n = self
            .layout
            .finish_header(&mut b, PduType::H2cData, 0, data.len());
        let mut out = b[..n].to_vec();
        out.extend_from_slice(data);
        if self.layout.ddgst_len(data.len()) > 0 {
            out.extend_from_slice(&crc32c(data).to_le_bytes());
        }
        out
    }
}

pub(super) fn connect_cmd(qid: u16, cntlid: u16, sgl: SglDescriptor) -> (NvmeCmd, Vec<u8>) {
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
