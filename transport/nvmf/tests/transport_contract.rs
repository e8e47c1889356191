//! The core/transport contract, driven directly with a fake transport:
//! `Pending` transfers and responses, `Busy` back-pressure, transfer
//! errors, stale tags, queue overflow and malformed capsules. This is what
//! an RDMA transport relies on.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use pollux_bdev::BdevRegistry;
use pollux_nvmf::spec::cmd::{NvmeCmd, SQE_SIZE};
use pollux_nvmf::spec::connect::{ConnectCmd, ConnectData, CNTLID_DYNAMIC};
use pollux_nvmf::spec::cpl::{NvmeCompletion, NvmeStatus};
use pollux_nvmf::spec::property::{ofst, PropertyCmd, PropertySize};
use pollux_nvmf::spec::sgl::SglDescriptor;
use pollux_nvmf::spec::transport_id::TransportId;
use pollux_nvmf::target::{
    CapsuleError, NamespaceConfig, QpairOps, QpairParams, QueuePair, RemoteBuf, ReqState, ReqTag,
    Response, SubsystemConfig, Target, TargetOptions, Transfer, TransportError,
};
use pollux_reactor::mem::SgList;
use pollux_reactor::TestCluster;

const NQN: &str = "nqn.2024-01.io.pollux:contract";
const HOSTNQN: &str = "nqn.2024-01.io.pollux:h";

/// What the fake answers and what it saw.
#[derive(Default)]
struct FakeOps {
    /// Host memory the keyed SGLs point at (key → bytes).
    host: Vec<(u32, Vec<u8>)>,
    data_answer: Option<Result<Transfer, TransportError>>,
    rsp_answer: Option<Result<Transfer, TransportError>>,
    pulls: Vec<(ReqTag, RemoteBuf)>,
    sent: Vec<(ReqTag, NvmeCompletion, Vec<u8>, Option<u32>)>,
    disconnects: usize,
}

impl QpairOps for FakeOps {
    fn data_from_host(
        &mut self,
        tag: ReqTag,
        remote: &RemoteBuf,
        bufs: &mut SgList,
    ) -> Result<Transfer, TransportError> {
        let answer = self.data_answer.clone().unwrap_or(Ok(Transfer::Done));
        if answer == Ok(Transfer::Busy) {
            return answer;
        }
        self.pulls.push((tag, *remote));
        if let Some((_, bytes)) = self.host.iter().find(|(k, _)| *k == remote.key) {
            let a = remote.addr as usize;
            bufs.copy_from_slice(&bytes[a..a + remote.len as usize]);
        }
        answer
    }

    fn send_response(
        &mut self,
        tag: ReqTag,
        rsp: &Response<'_>,
    ) -> Result<Transfer, TransportError> {
        let answer = self.rsp_answer.clone().unwrap_or(Ok(Transfer::Done));
        if answer == Ok(Transfer::Busy) {
            return answer;
        }
        assert_eq!(NvmeCompletion::parse(&rsp.cqe).unwrap(), rsp.cpl);
        let mut data = Vec::new();
        if let Some(d) = &rsp.data {
            data = vec![0u8; d.len as usize];
            d.bufs.copy_to_slice(&mut data);
            assert!(d.len <= d.remote.len);
        }
        self.sent.push((tag, rsp.cpl, data, rsp.invalidate_key));
        answer
    }

    fn disconnect(&mut self) {
        self.disconnects += 1;
    }
}

fn capsule(cmd: &NvmeCmd, icd: &[u8]) -> Vec<u8> {
    let mut v = cmd.encode().to_vec();
    v.extend_from_slice(icd);
    v
}

struct Setup {
    cluster: TestCluster,
    target: Arc<Target>,
    _reg: BdevRegistry,
}

fn setup() -> Setup {
    let cluster = TestCluster::new(1);
    let target = Target::new(TargetOptions::for_tests()).unwrap();
    let s = target.add_subsystem(SubsystemConfig::new(NQN)).unwrap();
    // The subsystem listens where the queues say they came in.
    target
        .add_transport(Arc::new(common::ListOnlyRdma))
        .unwrap();
    target.add_subsystem_listener(NQN, listener()).unwrap();
    let reg = BdevRegistry::new();
    let b = reg.create("malloc:size=64K,block=512,name=c0").unwrap();
    s.add_namespace(NamespaceConfig::new(b)).unwrap();
    Setup {
        cluster,
        target,
        _reg: reg,
    }
}

fn listener() -> TransportId {
    TransportId::rdma_ipv4("10.0.0.1", "4420")
}

fn new_qp(s: &Setup, depth: u16) -> QueuePair {
    let params = QpairParams {
        depth,
        in_capsule_data_size: 0,
        listener: listener(),
        qid: Some(0),
        io_queue_depth: s.target.options().max_queue_depth,
    };
    QueuePair::new(&s.target, &s.cluster.reactor(0), params).unwrap()
}

fn connect_capsule(cid: u16, key: u32) -> Vec<u8> {
    let mut cmd = ConnectCmd {
        qid: 0,
        sqsize: 3,
        ..ConnectCmd::default()
    }
    .to_cmd(cid);
    cmd.set_sgl(&SglDescriptor::keyed(0, 1024, key, true).unwrap());
    capsule(&cmd, &[])
}

fn connect_data() -> Vec<u8> {
    ConnectData {
        hostid: [1; 16],
        cntlid: CNTLID_DYNAMIC,
        subnqn: NQN.into(),
        hostnqn: HOSTNQN.into(),
    }
    .encode()
    .to_vec()
}

#[test]
fn pending_transfer_and_response_complete_through_the_callbacks() {
    let s = setup();
    let mut qp = new_qp(&s, 4);
    let mut ops = FakeOps {
        host: vec![(7, connect_data())],
        data_answer: Some(Ok(Transfer::Pending)),
        rsp_answer: Some(Ok(Transfer::Pending)),
        ..FakeOps::default()
    };
    qp.submit_capsule(&connect_capsule(9, 7), &mut ops).unwrap();
    assert_eq!(ops.pulls.len(), 1);
    let (tag, remote) = ops.pulls[0];
    assert_eq!((remote.len, remote.key, remote.invalidate), (1024, 7, true));
    assert_eq!(qp.request_state(tag), Some(ReqState::TransferringIn));
    assert_eq!(qp.transfers_in_flight(), 1);
    assert!(!qp.is_connected());
    // A stale or bogus tag is ignored.
    assert!(!qp.transfer_done(ReqTag::from_u64(0xFFFF_FFFF), Ok(()), &mut ops));
    assert!(!qp.response_sent(tag), "not responding yet");

    assert!(qp.transfer_done(tag, Ok(()), &mut ops));
    assert!(qp.is_connected());
    assert_eq!(ops.sent.len(), 1);
    let (rtag, cpl, _, inv) = &ops.sent[0];
    assert_eq!(*rtag, tag);
    assert_eq!((cpl.cid, cpl.status), (9, NvmeStatus::SUCCESS));
    assert_eq!(*inv, Some(7), "SEND_WITH_INV for the 0x4F SGL");
    assert_eq!(qp.request_state(tag), Some(ReqState::Responding));
    assert_eq!(qp.outstanding(), 1);
    assert!(qp.response_sent(tag));
    assert_eq!(qp.outstanding(), 0);
    assert_eq!(qp.transfers_in_flight(), 0);
    assert!(qp.request_state(tag).is_none());
    assert!(!qp.response_sent(tag), "only once");
    assert_eq!(qp.cntlid(), Some(cpl.dw0 as u16));
}

#[test]
fn busy_parks_and_the_next_poll_retries_in_order() {
    let s = setup();
    let mut qp = new_qp(&s, 4);
    let mut ops = FakeOps {
        host: vec![(7, connect_data())],
        data_answer: Some(Ok(Transfer::Busy)),
        ..FakeOps::default()
    };
    qp.submit_capsule(&connect_capsule(1, 7), &mut ops).unwrap();
    assert!(ops.pulls.is_empty() && ops.sent.is_empty());
    assert!(!qp.poll(&mut ops).is_busy(), "still busy: no progress");
    ops.data_answer = None;
    ops.rsp_answer = Some(Ok(Transfer::Busy));
    assert!(qp.poll(&mut ops).is_busy());
    assert_eq!(ops.pulls.len(), 1);
    assert!(ops.sent.is_empty(), "response parked");
    // Two property gets queue up behind it.
    for cid in [2u16, 3] {
        let c = PropertyCmd::get(ofst::VS, PropertySize::Four, cid);
        qp.submit_capsule(&capsule(&c, &[]), &mut ops).unwrap();
    }
    ops.rsp_answer = None;
    qp.poll(&mut ops);
    let cids: Vec<u16> = ops.sent.iter().map(|s| s.1.cid).collect();
    assert_eq!(cids, vec![1, 2, 3], "oldest first");
    assert_eq!(ops.sent[2].1.dw0, 0x0001_0400);
    assert_eq!(qp.outstanding(), 0);
    assert!(qp.stats().parked >= 2);
}

#[test]
fn transfer_errors_complete_the_command() {
    let s = setup();
    let mut qp = new_qp(&s, 4);
    let mut ops = FakeOps {
        data_answer: Some(Err(TransportError::Disconnected)),
        ..FakeOps::default()
    };
    qp.submit_capsule(&connect_capsule(5, 7), &mut ops).unwrap();
    assert_eq!(ops.sent[0].1.status, NvmeStatus::DATA_TRANSFER_ERROR);
    // The same through a Pending transfer that fails later.
    ops.data_answer = Some(Ok(Transfer::Pending));
    qp.submit_capsule(&connect_capsule(6, 7), &mut ops).unwrap();
    let tag = ops.pulls.last().unwrap().0;
    qp.transfer_done(tag, Err(TransportError::Other("flush".into())), &mut ops);
    assert_eq!(ops.sent[1].1.status, NvmeStatus::DATA_TRANSFER_ERROR);
    assert_eq!(qp.outstanding(), 0);
    assert!(!qp.is_connected());
    // A response that cannot be sent frees the request anyway.
    ops.rsp_answer = Some(Err(TransportError::Disconnected));
    let c = PropertyCmd::get(ofst::VS, PropertySize::Four, 8);
    qp.submit_capsule(&capsule(&c, &[]), &mut ops).unwrap();
    assert_eq!(qp.outstanding(), 0);
}

#[test]
fn overflow_and_malformed_capsules_are_refused() {
    let s = setup();
    let mut qp = new_qp(&s, 2);
    let mut ops = FakeOps {
        rsp_answer: Some(Ok(Transfer::Pending)),
        ..FakeOps::default()
    };
    assert_eq!(
        qp.submit_capsule(&[0u8; 10], &mut ops),
        Err(CapsuleError::Malformed(10))
    );
    let c = NvmeCmd::new(0x06, 1);
    qp.submit_capsule(&capsule(&c, &[]), &mut ops).unwrap();
    qp.submit_capsule(&capsule(&c, &[]), &mut ops).unwrap();
    assert_eq!(
        qp.submit_capsule(&capsule(&c, &[]), &mut ops),
        Err(CapsuleError::QueueFull)
    );
    // Unconnected queue: Identify is Invalid Opcode, answered (Pending).
    assert!(ops
        .sent
        .iter()
        .all(|s| s.1.status == NvmeStatus::INVALID_OPCODE));
    assert_eq!(ops.sent.len(), 2);
    let tags: Vec<ReqTag> = ops.sent.iter().map(|s| s.0).collect();
    for t in tags {
        assert!(qp.response_sent(t));
    }
    assert_eq!(qp.outstanding(), 0);
    assert_eq!(SQE_SIZE, 64);
}

#[test]
fn a_dead_controller_asks_the_transport_to_disconnect_once() {
    let s = setup();
    let mut qp = new_qp(&s, 4);
    let mut ops = FakeOps {
        host: vec![(7, connect_data())],
        ..FakeOps::default()
    };
    let mut cmd = ConnectCmd {
        qid: 0,
        sqsize: 3,
        kato: 1000,
        ..ConnectCmd::default()
    }
    .to_cmd(1);
    cmd.set_sgl(&SglDescriptor::keyed(0, 1024, 7, false).unwrap());
    qp.submit_capsule(&capsule(&cmd, &[]), &mut ops).unwrap();
    let ctrl = qp.controller().unwrap().clone();
    assert_eq!(s.target.controller_count(), 1);
    qp.poll(&mut ops);
    assert_eq!(ops.disconnects, 0);
    // The keep-alive timer (a reactor timed poller) fires after 1 s of silence.
    s.cluster.advance(std::time::Duration::from_millis(1500));
    s.cluster.poll_until_idle().unwrap();
    assert!(ctrl.is_dead());
    assert!(ctrl.csts().cfs);
    assert_eq!(s.target.controller_count(), 0);
    assert!(qp.poll(&mut ops).is_busy());
    qp.poll(&mut ops);
    assert_eq!(ops.disconnects, 1);
    assert!(qp.is_disconnecting());
    let c = PropertyCmd::get(ofst::VS, PropertySize::Four, 2);
    assert_eq!(
        qp.submit_capsule(&capsule(&c, &[]), &mut ops),
        Err(CapsuleError::Disconnecting)
    );
    drop(qp);
}
