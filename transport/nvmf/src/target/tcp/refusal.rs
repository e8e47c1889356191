//! [`Refusal`]: a connection the transport will not serve (its limits,
//! [`TcpOptions::max_qpairs`](super::TcpOptions::max_qpairs) and
//! [`max_qpairs_per_core`](super::TcpOptions::max_qpairs_per_core), are
//! reached), answered cleanly and closed.
//!
//! The socket is accepted (so it never waits in the listen backlog), the
//! ICReq is answered with an ICResp (digests as the policy grants them),
//! the first command capsule, the Fabrics Connect, gets a CapsuleResp
//! with Connect Controller Busy (SCT 1, SC 0x81, DNR clear: the host may
//! try again later), and the socket is closed once the response left.
//! No queue and no buffer from the target's pools is taken: only the
//! socket and a receive buffer of one capsule. Anything else (a bad PDU,
//! a first command that is not a Connect, a host that goes quiet for
//! [`REFUSAL_TIMEOUT`]) closes the socket at once.

use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use pollux_reactor::Reactor;

use super::options::DigestPolicy;
use super::wake;
use crate::spec::connect::sqe_off;
use crate::spec::cpl::{NvmeCompletion, NvmeStatus};
use crate::spec::tcp::{
    CapsuleResp, CommonHeader, Digests, Frame, IcReq, IcResp, PduType, SendLayout, CH_LEN,
    IC_PDU_LEN,
};
use crate::spec::SQE_SIZE;
use crate::tcp_bufs::SendBuf;

/// How long a refused connection may take to send its ICReq and Connect.
pub(super) const REFUSAL_TIMEOUT: Duration = Duration::from_secs(5);

/// Refused connections one poll group answers at once; more are closed
/// without an answer.
pub(super) const MAX_REFUSALS: usize = 64;

/// Where a refused connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Waiting for the 128-byte ICReq.
    IcReq,
    /// Waiting for the first CapsuleCmd (the Connect).
    Capsule,
    /// The answer is being written; then close.
    Answered,
}

/// One connection being refused (poll group core only).
#[derive(Debug)]
pub(super) struct Refusal {
    sock: TcpStream,
    rx: Vec<u8>,
    tx: SendBuf,
    step: Step,
    digests: Digests,
    policy: DigestPolicy,
    maxh2cdata: u32,
    capsule_limit: u32,
    deadline: Instant,
    /// The socket as a wake source of the reactor (adaptive idle mode).
    wake: Option<pollux_reactor::WakeWatch>,
}

impl Refusal {
    /// Start refusing `sock` (made non-blocking here).
    pub(super) fn new(
        sock: TcpStream,
        policy: DigestPolicy,
        maxh2cdata: u32,
        capsule_limit: u32,
    ) -> std::io::Result<Self> {
        sock.set_nonblocking(true)?;
        Ok(Refusal {
            sock,
            rx: Vec::with_capacity(IC_PDU_LEN),
            tx: SendBuf::new(IC_PDU_LEN + 64),
            step: Step::IcReq,
            digests: Digests::default(),
            policy,
            maxh2cdata,
            capsule_limit,
            deadline: Instant::now() + REFUSAL_TIMEOUT,
            wake: None,
        })
    }

    /// Wake `reactor` from an adaptive sleep when this socket has bytes.
    pub(super) fn watch(&mut self, reactor: &Reactor) {
        self.wake = wake::watch(reactor, &self.sock);
    }

    /// One step; `true` when the socket is closed and the refusal may be
    /// dropped.
    pub(super) fn poll(&mut self) -> bool {
        let ok = self.advance();
        let answered = self.step == Step::Answered && self.tx.unsent() == 0;
        if !ok || answered || Instant::now() >= self.deadline {
            log::debug!("nvmf tcp: refused connection closed (Connect answered: {answered})");
            let _ = self.sock.shutdown(std::net::Shutdown::Both);
            return true;
        }
        false
    }

    /// Read and answer what came; `false` when the socket must close now.
    fn advance(&mut self) -> bool {
        match self.step {
            Step::IcReq => {
                let Some(done) = self.fill(IC_PDU_LEN) else {
                    return false;
                };
                if done && !self.answer_icreq() {
                    return false;
                }
            }
            Step::Capsule => {
                let Some(mut done) = self.fill(CH_LEN) else {
                    return false;
                };
                if done {
                    let ch = CommonHeader::parse(&self.rx);
                    let Ok(f) = Frame::check(&ch, true, self.digests, self.capsule_limit) else {
                        return false;
                    };
                    if f.pdu_type != PduType::CapsuleCmd {
                        return false;
                    }
                    let Some(d) = self.fill(f.plen) else {
                        return false;
                    };
                    done = d;
                }
                if done && !self.answer_connect() {
                    return false;
                }
            }
            Step::Answered => {}
        }
        self.tx.flush(&mut self.sock).is_ok()
    }

    /// Read until `rx` holds `want` bytes (never past them): `Some(true)`
    /// when it does, `Some(false)` when more must come, `None` on EOF or
    /// an error.
    fn fill(&mut self, want: usize) -> Option<bool> {
        let mut tmp = [0u8; 512];
        while self.rx.len() < want {
            let n = (want - self.rx.len()).min(tmp.len());
            match self.sock.read(&mut tmp[..n]) {
                Ok(0) => return None,
                Ok(k) => self.rx.extend_from_slice(&tmp[..k]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Some(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return None,
            }
        }
        Some(true)
    }

    fn answer_icreq(&mut self) -> bool {
        let Ok(req) = IcReq::parse(&self.rx) else {
            return false;
        };
        let Some(granted) = self.policy.grant(req.digests) else {
            return false;
        };
        let rsp = IcResp {
            pfv: 0,
            cpda: 0,
            digests: granted,
            maxh2cdata: self.maxh2cdata,
        };
        self.tx.push_raw(&rsp.encode());
        self.tx.layout = SendLayout::new(granted, req.hpda);
        self.digests = granted;
        self.rx.clear();
        self.step = Step::Capsule;
        true
    }

    fn answer_connect(&mut self) -> bool {
        let Some(sqe) = self.rx.get(CH_LEN..CH_LEN + SQE_SIZE) else {
            return false;
        };
        let is_connect = sqe.first() == Some(&crate::spec::OPC_FABRICS)
            && sqe.get(4) == Some(&crate::spec::FabricsType::Connect.code());
        if !is_connect {
            return false;
        }
        let cid = crate::spec::le16(sqe, 2);
        let qid = crate::spec::le16(sqe, sqe_off::QID);
        let cpl = NvmeCompletion::new(qid, cid, NvmeStatus::CONNECT_CONTROLLER_BUSY);
        self.tx.push_pdu(
            PduType::CapsuleResp,
            &CapsuleResp::encode(&cpl.encode()),
            0,
            0,
        );
        self.rx = Vec::new();
        self.step = Step::Answered;
        true
    }
}
