//! Fuzz entry point for NVMe/TCP (feature `fuzzing`; always built for this
//! crate's tests): [`fuzz_tcp_pdu`] runs every PDU parser of
//! [`crate::spec::tcp`] on the bytes (with invariants and lossless round
//! trips), then sends them, after a valid ICReq, down a socket to a live
//! TCP target on 127.0.0.1. The target must answer without panicking,
//! close the connection when the host does, and give every data buffer
//! back. The first input byte selects the digests the ICReq asks for.
//!
//! Each thread keeps one target on a one-core `TestCluster` across calls.

use std::cell::RefCell;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::rc::Rc;
use std::sync::Arc;

use pollux_bdev::BdevRegistry;
use pollux_reactor::TestCluster;

use crate::fuzz::Slot;
use crate::spec::tcp::{
    C2hData, CapsuleCmdHdr, CapsuleResp, CommonHeader, Digests, Frame, H2cData, IcReq, IcResp,
    PduType, R2t, TermReq, IC_PDU_LEN,
};
use crate::spec::transport_id::TransportId;
use crate::target::tcp::{TcpOptions, TcpPollGroup, TcpTransport};
use crate::target::{NamespaceConfig, SubsystemConfig, Target, TargetOptions};

/// The subsystem a fuzzed host may connect to.
pub const FUZZ_TCP_NQN: &str = "nqn.2024-01.io.pollux:fuzz-tcp";

/// Polls a stream may take to be handled or closed (a finding past it).
const SPINS: usize = 100_000;

/// Every parser on `data`, with the invariants a caller relies on.
fn parse_pdus(data: &[u8]) {
    let ch = CommonHeader::parse(data);
    for from_host in [true, false] {
        for bits in 0..4u8 {
            let d = Digests::from_bits(bits);
            let Ok(f) = Frame::check(&ch, from_host, d, 64 * 1024) else {
                continue;
            };
            assert!(f.header_len() <= f.data_offset, "{f:?}");
            let tail = if f.ddgst { 4 } else { 0 };
            assert!(f.data_offset + f.data_len + tail <= f.plen, "{f:?}");
            assert!(f.data_len <= 64 * 1024 || f.pdu_type.hlen() == 24, "{f:?}");
            let Some(pdu) = data.get(..f.header_len()) else {
                continue;
            };
            let _ = f.verify_hdgst(pdu);
            match f.pdu_type {
                PduType::IcReq => {
                    if let Ok(r) = IcReq::parse(pdu) {
                        assert_eq!(IcReq::parse(&r.encode()), Ok(r));
                    }
                }
                PduType::IcResp => {
                    if let Ok(r) = IcResp::parse(pdu) {
                        assert_eq!(IcResp::parse(&r.encode()), Ok(r));
                    }
                }
                PduType::CapsuleCmd => {
                    let sqe = CapsuleCmdHdr::sqe(pdu);
                    assert!(sqe.is_some());
                }
                PduType::CapsuleResp => {
                    assert!(CapsuleResp::cqe(pdu).is_some());
                }
                PduType::H2cData => {
                    if let Ok(h) = H2cData::parse(pdu, f.data_len) {
                        assert_eq!(H2cData::parse(&h.encode(), f.data_len), Ok(h));
                    }
                }
                PduType::C2hData => {
                    if let Ok(h) = C2hData::parse(pdu, f.data_len) {
                        assert_eq!(C2hData::parse(&h.encode(), f.data_len), Ok(h));
                    }
                }
                PduType::R2t => {
                    if let Ok(r) = R2t::parse(pdu) {
                        assert_eq!(R2t::parse(&r.encode()), Ok(r));
                    }
                }
                PduType::H2cTermReq | PduType::C2hTermReq => {
                    let _ = TermReq::parse(pdu);
                }
            }
        }
    }
}

struct Harness {
    cluster: TestCluster,
    target: Arc<Target>,
    pg: Rc<TcpPollGroup>,
    addr: SocketAddr,
    _registry: BdevRegistry,
}

impl Harness {
    fn new() -> Option<Harness> {
        let cluster = TestCluster::new(1);
        let target = Target::new(TargetOptions::for_tests()).ok()?;
        let mut sc = SubsystemConfig::new(FUZZ_TCP_NQN);
        sc.allow_any_host = true;
        let sub = target.add_subsystem(sc).ok()?;
        let registry = BdevRegistry::new();
        let bdev = registry
            .create("malloc:size=1M,block=512,name=fuzztcp0")
            .ok()?;
        sub.add_namespace(NamespaceConfig::new(bdev).with_nsid(1))
            .ok()?;
        let t = TcpTransport::new(&target, TcpOptions::default()).ok()?;
        target.add_transport(t.clone()).ok()?;
        let pg = cluster.on(0, |r| t.create_poll_group(r)).ok()?;
        let port = pollux_reactor::free_tcp_port("127.0.0.1");
        target
            .add_listener(TransportId::tcp_ipv4("127.0.0.1", port.to_string()))
            .ok()?;
        Some(Harness {
            cluster,
            target,
            pg,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            _registry: registry,
        })
    }

    /// Send `stream` after an ICReq asking for `digests`; close; check the
    /// target closed its end and leaked nothing.
    fn feed(&self, digests: Digests, stream: &[u8]) {
        let Ok(mut s) = TcpStream::connect(self.addr) else {
            return;
        };
        if s.set_nonblocking(true).is_err() {
            return;
        }
        let ic = IcReq {
            pfv: 0,
            hpda: 0,
            digests,
            maxr2t: 0,
        }
        .encode();
        let mut out = ic.to_vec();
        out.extend_from_slice(stream);
        let mut sent = 0;
        let mut buf = [0u8; 4096];
        let mut got = 0usize;
        for _ in 0..SPINS {
            self.cluster.poll_once_all();
            if sent < out.len() {
                match s.write(&out[sent..]) {
                    Ok(n) => sent += n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(_) => break,
                }
            }
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(_) => break,
            }
            if sent == out.len() && got >= IC_PDU_LEN && self.cluster.poll_until_idle().is_ok() {
                break;
            }
        }
        drop(s);
        for _ in 0..SPINS {
            self.cluster.poll_once_all();
            if self.pg.connections() == 0 {
                break;
            }
        }
        assert_eq!(
            self.pg.connections(),
            0,
            "the target kept a closed connection"
        );
        let cached = self
            .cluster
            .on(0, |r| self.target.core_ctx(r).cached_buffers());
        let p = self.target.data_pool();
        assert_eq!(p.available() + cached, p.count(), "data buffers leaked");
    }
}

thread_local! {
    /// Leaked at thread exit (see `fuzz::Slot`).
    static HARNESS: RefCell<Slot<Harness>> = const { RefCell::new(Slot(None)) };
}

/// The fuzz target: the first byte picks the digests (bits 0 and 1), the
/// rest is parsed and sent to a live TCP target after the ICReq.
pub fn fuzz_tcp_pdu(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    parse_pdus(rest);
    HARNESS.with(|s| {
        let mut s = s.borrow_mut();
        if s.0.is_none() {
            s.0 = Harness::new();
        }
        if let Some(h) = s.0.as_ref() {
            h.feed(Digests::from_bits(sel), rest);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::cmd::NvmeCmd;
    use crate::spec::connect::{ConnectCmd, ConnectData, CONNECT_DATA_SIZE};
    use crate::spec::sgl::SglDescriptor;
    use crate::spec::tcp::SendLayout;

    /// A Connect capsule with in-capsule data, laid out for `digests`.
    fn connect_capsule(digests: Digests) -> Vec<u8> {
        let mut cmd: NvmeCmd = ConnectCmd {
            recfmt: 0,
            qid: 0,
            sqsize: 31,
            cattr: 0,
            kato: 0,
        }
        .to_cmd(1);
        cmd.set_sgl(&SglDescriptor::in_capsule(0, CONNECT_DATA_SIZE as u32));
        let mut data = [0u8; CONNECT_DATA_SIZE];
        ConnectData {
            hostid: [1; 16],
            cntlid: 0xFFFF,
            subnqn: FUZZ_TCP_NQN.into(),
            hostnqn: "nqn.2024-01.io.pollux:fuzz-host".into(),
        }
        .encode_into(&mut data);
        let l = SendLayout::new(digests, 0);
        let mut h = [0u8; 512];
        h[..72].copy_from_slice(&CapsuleCmdHdr::encode(&cmd.encode()));
        let n = l.finish_header(&mut h, PduType::CapsuleCmd, 0, data.len());
        let mut v = h[..n].to_vec();
        v.extend_from_slice(&data);
        if l.ddgst {
            v.extend_from_slice(&crate::spec::tcp::crc32c(&data).to_le_bytes());
        }
        v
    }

    #[test]
    fn seeds_and_their_mutations_never_break_the_target() {
        let mut inputs: Vec<Vec<u8>> = Vec::new();
        for bits in 0..4u8 {
            let mut v = vec![bits];
            v.extend(connect_capsule(Digests::from_bits(bits)));
            inputs.push(v);
        }
        // Every single-byte corruption of the first 80 bytes of each seed,
        // and truncations.
        let mut more = Vec::new();
        for s in &inputs {
            for i in 1..80.min(s.len()) {
                let mut m = s.clone();
                m[i] ^= 0xA5;
                more.push(m);
            }
            for cut in [1, 9, 40, 73, 200] {
                more.push(s[..cut.min(s.len())].to_vec());
            }
        }
        inputs.extend(more);
        for i in &inputs {
            fuzz_tcp_pdu(i);
        }
    }
}
