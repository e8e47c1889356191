//! The conformance cases.

use std::time::{Duration, Instant};

use super::fast_reg::{
    fast_reg_access_beyond_window_fails, fast_reg_local_inv_invalidates, fast_reg_rebind_new_key,
    fast_reg_send_with_inv_invalidates, fast_reg_window_read_write,
};
use super::harness::{for_a_while, spin, CqOverflowReport, Endpoint, Fixture, Pair, WAIT_LIMIT};
use crate::cm::{CmEvent, ConnParam};
use crate::error::{PostErrorKind, VerbsError};
use crate::provider::{
    CmId, CmListener, CompletionQueue, Device, MemoryRegion, ProtectionDomain, QpInit, QueuePair,
    SharedRecvQueue,
};
use crate::types::{
    Access, FastRegMode, QpAttr, QpCaps, QpState, RemoteAddr, WcFlags, WcOpcode, WcStatus, WrId,
};
use crate::wr::{RecvWr, SendOp, SendWr};

const MEM: usize = 1 << 20;

/// A case of the suite.
pub type Case<F> = fn(&F);

/// Every case, by name.
pub fn all<F: Fixture>() -> Vec<(&'static str, Case<F>)> {
    vec![
        (
            "connect_accept_private_data",
            connect_accept_private_data::<F>,
        ),
        ("reject_with_private_data", reject_with_private_data::<F>),
        ("private_data_limits", private_data_limits::<F>),
        (
            "qp_state_table_and_post_checks",
            qp_state_table_and_post_checks::<F>,
        ),
        ("send_recv_imm_inline", send_recv_imm_inline::<F>),
        ("write_then_send_ordering", write_then_send_ordering::<F>),
        ("write_with_imm", write_with_imm::<F>),
        ("rdma_read", rdma_read::<F>),
        (
            "bad_rkey_is_remote_access_error",
            bad_rkey_is_remote_access_error::<F>,
        ),
        ("out_of_bounds_and_rights", out_of_bounds_and_rights::<F>),
        (
            "bad_lkey_is_local_protection_error",
            bad_lkey_is_local_protection_error::<F>,
        ),
        ("recv_too_small", recv_too_small::<F>),
        ("rnr_retry_forever_waits", rnr_retry_forever_waits::<F>),
        ("rnr_retry_exhausted", rnr_retry_exhausted::<F>),
        (
            "fast_reg_send_with_inv_local_inv",
            fast_reg_send_with_inv_local_inv::<F>,
        ),
        (
            "flush_after_error_and_drain",
            flush_after_error_and_drain::<F>,
        ),
        (
            "srq_shared_by_qps_and_cq_shared",
            srq_shared_by_qps_and_cq_shared::<F>,
        ),
        ("cq_overflow", cq_overflow::<F>),
        ("disconnect_during_traffic", disconnect_during_traffic::<F>),
        ("cq_arm_event_fd", cq_arm_event_fd::<F>),
        ("integrity_t10_pi", integrity_t10_pi::<F>),
        (
            "fast_reg_window_read_write",
            fast_reg_window_read_write::<F>,
        ),
        (
            "fast_reg_access_beyond_window_fails",
            fast_reg_access_beyond_window_fails::<F>,
        ),
        (
            "fast_reg_send_with_inv_invalidates",
            fast_reg_send_with_inv_invalidates::<F>,
        ),
        (
            "fast_reg_local_inv_invalidates",
            fast_reg_local_inv_invalidates::<F>,
        ),
        ("fast_reg_rebind_new_key", fast_reg_rebind_new_key::<F>),
    ]
}

fn caps() -> QpCaps {
    QpCaps::default()
}

fn post_recv<F: Fixture>(e: &Endpoint<F>, id: u64, off: usize, len: u32) {
    let sge = [e.sge(off, len)];
    e.qp.post_recv(&[RecvWr {
        wr_id: WrId(id),
        sg_list: &sge,
    }])
    .unwrap();
}

/// Connect/accept carry private data, padded to 56/196 bytes.
pub fn connect_accept_private_data<F: Fixture>(f: &F) {
    let a = Endpoint::<F>::new(f, caps(), 4096, 16);
    let b = Endpoint::<F>::new(f, caps(), 4096, 16);
    let addr = f.listen_addr();
    let l = b.dev.listen(&addr, 4).unwrap();
    let mut p = ConnParam::with_data(b"nvme-connect");
    p.responder_resources = 3;
    p.initiator_depth = 5;
    let ida = a.dev.connect(&addr, &a.qp, &p).unwrap();
    let idb = spin(|| l.get_request().unwrap()).unwrap();
    let req = *idb.request().unwrap();
    assert_eq!(req.private_data.as_bytes().len(), 56);
    assert_eq!(&req.private_data.as_bytes()[..12], b"nvme-connect");
    assert!(req.private_data.as_bytes()[12..].iter().all(|&x| x == 0));
    assert_eq!(req.responder_resources, 5, "depths are reported swapped");
    assert_eq!(req.initiator_depth, 3);
    assert_eq!(req.qp_num, a.qp.qp_num());
    idb.accept(&b.qp, &ConnParam::with_data(&[7u8; 196]))
        .unwrap();
    assert_eq!(b.qp.state(), QpState::Rts);
    match spin(|| ida.get_event().unwrap()).unwrap() {
        CmEvent::Established { private_data } => {
            assert_eq!(private_data.as_bytes(), &[7u8; 196][..])
        }
        e => panic!("{e:?}"),
    }
    assert_eq!(a.qp.state(), QpState::Rts);
    assert!(matches!(
        spin(|| idb.get_event().unwrap()).unwrap(),
        CmEvent::Established { .. }
    ));
}

/// Reject delivers its private data (148 bytes) and consumer reason 28;
/// connecting where nobody listens is rejected with reason 8.
pub fn reject_with_private_data<F: Fixture>(f: &F) {
    let a = Endpoint::<F>::new(f, caps(), 4096, 16);
    let b = Endpoint::<F>::new(f, caps(), 4096, 16);
    let addr = f.listen_addr();
    let l = b.dev.listen(&addr, 4).unwrap();
    let ida = a
        .dev
        .connect(&addr, &a.qp, &ConnParam::with_data(b"x"))
        .unwrap();
    let idb = spin(|| l.get_request().unwrap()).unwrap();
    idb.reject(b"go away").unwrap();
    match spin(|| ida.get_event().unwrap()).unwrap() {
        CmEvent::Rejected {
            reason,
            private_data,
        } => {
            assert_eq!(reason, 28);
            assert_eq!(private_data.as_bytes().len(), 148);
            assert_eq!(&private_data.as_bytes()[..7], b"go away");
        }
        e => panic!("{e:?}"),
    }
    let c = Endpoint::<F>::new(f, caps(), 4096, 16);
    let nobody = f.listen_addr();
    let id = c
        .dev
        .connect(&nobody, &c.qp, &ConnParam::with_data(b""))
        .unwrap();
    match spin(|| id.get_event().unwrap()).unwrap() {
        CmEvent::Rejected { reason, .. } => assert_eq!(reason, 8),
        CmEvent::Unreachable => {}
        e => panic!("{e:?}"),
    }
}

/// Private data over 56 (connect), 196 (accept), 148 (reject) is refused.
pub fn private_data_limits<F: Fixture>(f: &F) {
    let a = Endpoint::<F>::new(f, caps(), 4096, 16);
    let b = Endpoint::<F>::new(f, caps(), 4096, 16);
    let addr = f.listen_addr();
    let l = b.dev.listen(&addr, 4).unwrap();
    let too_long = [0u8; 197];
    assert!(matches!(
        a.dev
            .connect(&addr, &a.qp, &ConnParam::with_data(&too_long[..57])),
        Err(VerbsError::PrivateDataTooLong { max: 56, .. })
    ));
    let _ida = a
        .dev
        .connect(&addr, &a.qp, &ConnParam::with_data(&too_long[..56]))
        .unwrap();
    let idb = spin(|| l.get_request().unwrap()).unwrap();
    assert!(matches!(
        idb.reject(&too_long[..149]),
        Err(VerbsError::PrivateDataTooLong { max: 148, .. })
    ));
    assert!(matches!(
        idb.accept(&b.qp, &ConnParam::with_data(&too_long)),
        Err(VerbsError::PrivateDataTooLong { max: 196, .. })
    ));
}

/// The state table and post-time checks (state, SGE count, inline, queue full).
pub fn qp_state_table_and_post_checks<F: Fixture>(f: &F) {
    let e = Endpoint::<F>::new(f, caps(), 4096, 64);
    assert_eq!(e.qp.state(), QpState::Reset);
    let sge = [e.sge(0, 8)];
    let rwr = RecvWr {
        wr_id: WrId(1),
        sg_list: &sge,
    };
    assert!(matches!(
        e.qp.post_recv(&[rwr]).unwrap_err().kind,
        PostErrorKind::WrongState(QpState::Reset)
    ));
    assert!(
        e.qp.modify(&QpAttr::to(QpState::Rtr)).is_err(),
        "RESET->RTR"
    );
    assert_eq!(
        e.qp.state(),
        QpState::Reset,
        "no change on a refused transition"
    );
    e.qp.modify(&QpAttr::to(QpState::Init)).unwrap();
    e.qp.post_recv(&[rwr]).unwrap();
    let swr = SendWr::new(WrId(2), SendOp::Send, &sge);
    let err = e.qp.post_send(&[swr]).unwrap_err();
    assert_eq!(
        (err.index, err.kind),
        (0, PostErrorKind::WrongState(QpState::Init))
    );
    assert!(e.qp.modify(&QpAttr::to(QpState::Rts)).is_err(), "INIT->RTS");
    // The real capacities: a provider may round up what was asked (rxe
    // makes a 64-deep RQ 127 deep).
    let real = e.qp.caps();
    assert!(real.max_recv_wr >= caps().max_recv_wr && real.max_recv_sge >= caps().max_recv_sge);
    let many = vec![e.sge(0, 1); real.max_recv_sge as usize + 1];
    let bad = RecvWr {
        wr_id: WrId(3),
        sg_list: &many,
    };
    let err = e.qp.post_recv(&[rwr, bad]).unwrap_err();
    assert_eq!((err.index, err.kind), (1, PostErrorKind::TooManySge));
    // Fill the RQ (2 posted): it takes what `caps` reports, then refuses.
    let list = vec![rwr; real.max_recv_wr as usize - 2];
    e.qp.post_recv(&list).unwrap();
    let mut more = 0;
    let full = loop {
        match e.qp.post_recv(&[rwr]) {
            Ok(()) => more += 1,
            Err(err) => break err.kind,
        }
        assert!(more <= 4 * real.max_recv_wr + 64, "the RQ never fills");
    };
    assert_eq!(full, PostErrorKind::QueueFull);
    if more > 0 {
        eprintln!(
            "RQ: caps report {} WRs, the queue took {}",
            real.max_recv_wr,
            real.max_recv_wr + more
        );
    }
    assert!(
        more == 0 || !f.expected().exact_queue_caps,
        "the RQ took {more} WRs more than caps report"
    );
    // RESET discards without completions (then INIT -> ERR: the kernel's
    // state table has no RESET -> ERR).
    e.qp.modify(&QpAttr::to(QpState::Reset)).unwrap();
    e.qp.modify(&QpAttr::to(QpState::Init)).unwrap();
    e.poll();
    assert!(
        e.take_rwc().is_empty(),
        "RESET dropped the receives silently"
    );
    // Entering ERR flushes what is queued; in ERR, posts are accepted and
    // flushed.
    e.qp.post_recv(&[RecvWr {
        wr_id: WrId(4),
        sg_list: &sge,
    }])
    .unwrap();
    e.qp.modify(&QpAttr::to(QpState::Err)).unwrap();
    e.qp.post_recv(&[rwr]).unwrap();
    e.qp.post_send(&[swr]).unwrap();
    let want_r = if f.expected().flush_recv_posted_in_err {
        2
    } else {
        1
    };
    let start = Instant::now();
    while e.rwc.borrow().len() < want_r || e.swc.borrow().is_empty() {
        e.poll();
        assert!(
            start.elapsed() < WAIT_LIMIT,
            "flush completions: {} receive(s), {} send(s)",
            e.rwc.borrow().len(),
            e.swc.borrow().len()
        );
    }
    let r = e.take_rwc();
    let s = e.take_swc();
    assert_eq!((r[0].wr_id, r[0].status), (WrId(4), WcStatus::WrFlushErr));
    assert!(r[1..]
        .iter()
        .all(|w| (w.wr_id, w.status) == (WrId(1), WcStatus::WrFlushErr)));
    assert_eq!(
        (s.len(), s[0].status, s[0].wr_id),
        (1, WcStatus::WrFlushErr, WrId(2))
    );
    // Inline too long.
    let p = Pair::<F>::connect(f, caps(), 4096);
    let big = [0u8; 4096];
    let wr = SendWr::new(WrId(9), SendOp::Send, &[]).with_inline(&big);
    assert_eq!(
        p.a.qp.post_send(&[wr]).unwrap_err().kind,
        PostErrorKind::InlineTooLong
    );
}

/// SEND, SEND_WITH_IMM and inline SEND land in posted receives in order.
pub fn send_recv_imm_inline<F: Fixture>(f: &F) {
    let p = Pair::<F>::connect(f, caps(), MEM);
    for i in 0..3 {
        post_recv(&p.b, 100 + i, 4096 * i as usize, 4096);
    }
    p.a.fill(0, b"first message");
    let s1 = [p.a.sge(0, 13)];
    let wrs = [
        SendWr::new(WrId(1), SendOp::Send, &s1).signaled(),
        SendWr::new(WrId(2), SendOp::SendWithImm { imm: 0xdead_beef }, &s1).signaled(),
        SendWr::new(WrId(3), SendOp::Send, &[])
            .with_inline(b"inline!")
            .signaled(),
    ];
    p.a.qp.post_send(&wrs).unwrap();
    p.until(|p| p.b.rwc.borrow().len() == 3 && p.a.swc.borrow().len() == 3);
    let r = p.b.take_rwc();
    assert_eq!(
        r.iter().map(|w| w.wr_id.0).collect::<Vec<_>>(),
        [100, 101, 102]
    );
    assert!(r
        .iter()
        .all(|w| w.status == WcStatus::Success && w.opcode == WcOpcode::Recv));
    assert_eq!(r[0].byte_len, 13);
    assert_eq!(r[0].qp_num, p.b.qp.qp_num());
    assert!(!r[0].flags.contains(WcFlags::WITH_IMM));
    assert!(r[1].flags.contains(WcFlags::WITH_IMM));
    assert_eq!(r[1].imm, 0xdead_beef);
    assert_eq!(p.b.read(0, 13), b"first message");
    assert_eq!(p.b.read(8192, 7), b"inline!");
    let s = p.a.take_swc();
    assert_eq!(s.iter().map(|w| w.wr_id.0).collect::<Vec<_>>(), [1, 2, 3]);
    assert!(s
        .iter()
        .all(|w| w.status == WcStatus::Success && w.opcode == WcOpcode::Send));
    // A 0-byte SEND is allowed.
    post_recv(&p.b, 200, 0, 16);
    p.a.qp
        .post_send(&[SendWr::new(WrId(4), SendOp::Send, &[]).signaled()])
        .unwrap();
    p.until(|p| p.b.rwc.borrow().len() == 1);
    assert_eq!(p.b.take_rwc()[0].byte_len, 0);
}

/// WRITE then SEND in one post: the data is there at the receive completion.
pub fn write_then_send_ordering<F: Fixture>(f: &F) {
    let p = Pair::<F>::connect(f, caps(), MEM);
    post_recv(&p.b, 1, 0, 64);
    let data: Vec<u8> = (0..65536u32).map(|i| (i * 7) as u8).collect();
    p.a.fill(4096, &data);
    let ws = [p.a.sge(4096, 65536)];
    let ss = [p.a.sge(0, 16)];
    let wrs = [
        SendWr::new(
            WrId(1),
            SendOp::RdmaWrite {
                remote: RemoteAddr {
                    addr: p.b.addr(131072),
                    rkey: p.b.mr.rkey(),
                },
            },
            &ws,
        ),
        SendWr::new(WrId(2), SendOp::Send, &ss).signaled(),
    ];
    p.a.qp.post_send(&wrs).unwrap();
    p.until(|p| !p.b.rwc.borrow().is_empty());
    assert_eq!(p.b.read(131072, 65536), data);
    p.until(|p| !p.a.swc.borrow().is_empty());
    let s = p.a.take_swc();
    assert_eq!(s.len(), 1, "the unsignaled WRITE has no completion");
    assert_eq!((s[0].wr_id, s[0].status), (WrId(2), WcStatus::Success));
}

/// WRITE_WITH_IMM consumes a receive at the responder.
pub fn write_with_imm<F: Fixture>(f: &F) {
    let p = Pair::<F>::connect(f, caps(), MEM);
    post_recv(&p.b, 5, 0, 0);
    p.a.fill(0, b"abcdef");
    let s = [p.a.sge(0, 6)];
    let op = SendOp::RdmaWriteWithImm {
        remote: RemoteAddr {
            addr: p.b.addr(500),
            rkey: p.b.mr.rkey(),
        },
        imm: 42,
    };
    p.a.qp
        .post_send(&[SendWr::new(WrId(1), op, &s).signaled()])
        .unwrap();
    p.until(|p| !p.b.rwc.borrow().is_empty() && !p.a.swc.borrow().is_empty());
    let r = p.b.take_rwc();
    assert_eq!(r[0].opcode, WcOpcode::RecvRdmaWithImm);
    assert_eq!((r[0].imm, r[0].byte_len), (42, 6));
    assert!(r[0].flags.contains(WcFlags::WITH_IMM));
    assert_eq!(p.b.read(500, 6), b"abcdef");
    assert_eq!(p.a.take_swc()[0].opcode, WcOpcode::RdmaWrite);
}

/// RDMA READ copies from the responder's memory, with a multi-SGE target.
pub fn rdma_read<F: Fixture>(f: &F) {
    let p = Pair::<F>::connect(f, caps(), MEM);
    let data: Vec<u8> = (0..10000u32).map(|i| (i % 251) as u8).collect();
    p.b.fill(7, &data);
    let s = [p.a.sge(0, 4000), p.a.sge(50000, 6000)];
    let op = SendOp::RdmaRead {
        remote: RemoteAddr {
            addr: p.b.addr(7),
            rkey: p.b.mr.rkey(),
        },
    };
    p.a.qp
        .post_send(&[SendWr::new(WrId(8), op, &s).signaled()])
        .unwrap();
    p.until(|p| !p.a.swc.borrow().is_empty());
    let w = p.a.take_swc()[0];
    assert_eq!(
        (w.status, w.opcode),
        (WcStatus::Success, WcOpcode::RdmaRead)
    );
    assert_eq!(p.a.read(0, 4000), data[..4000]);
    assert_eq!(p.a.read(50000, 6000), data[4000..]);
}

fn expect_remote_access_error<F: Fixture>(p: &Pair<F>, op: SendOp<'_>) {
    let s = [p.a.sge(0, 64)];
    let later = [p.a.sge(0, 8)];
    post_recv(&p.b, 77, 0, 64);
    let wrs = [
        SendWr::new(WrId(1), op, &s),
        SendWr::new(WrId(2), SendOp::Send, &later).signaled(),
    ];
    p.a.qp.post_send(&wrs).unwrap();
    p.until(|p| p.a.swc.borrow().len() == 2);
    let s = p.a.take_swc();
    assert_eq!(
        (s[0].wr_id, s[0].status),
        (WrId(1), WcStatus::RemAccessErr),
        "unsignaled error WR completes"
    );
    assert_eq!((s[1].wr_id, s[1].status), (WrId(2), WcStatus::WrFlushErr));
    assert_eq!(p.a.qp.state(), QpState::Err);
    p.until(|p| p.b.qp.state() == QpState::Err);
    p.until(|p| !p.b.rwc.borrow().is_empty());
    assert_eq!(p.b.take_rwc()[0].status, WcStatus::WrFlushErr);
}

/// A bad rkey: REM_ACCESS_ERR at the requester, both QPs in ERR, flushes.
pub fn bad_rkey_is_remote_access_error<F: Fixture>(f: &F) {
    let p = Pair::<F>::connect(f, caps(), MEM);
    let op = SendOp::RdmaWrite {
        remote: RemoteAddr {
            addr: p.b.addr(0),
            rkey: p.b.mr.rkey() ^ 0x100,
        },
    };
    expect_remote_access_error(&p, op);
}

/// Out-of-bounds access and missing REMOTE_READ rights are access errors.
pub fn out_of_bounds_and_rights<F: Fixture>(f: &F) {
    let p = Pair::<F>::connect(f, caps(), MEM);
    let op = SendOp::RdmaRead {
        remote: RemoteAddr {
            addr: p.b.addr(MEM - 32),
            rkey: p.b.mr.rkey(),
        },
    };
    expect_remote_access_error(&p, op);
    let p = Pair::<F>::connect(f, caps(), MEM);
    let wo =
        p.b.pd
            .reg_mr(
                &p.b.arena,
                0,
                4096,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            )
            .unwrap();
    let op = SendOp::RdmaRead {
        remote: RemoteAddr {
            addr: wo.addr(),
            rkey: wo.rkey(),
        },
    };
    expect_remote_access_error(&p, op);
    assert!(
        p.b.pd
            .reg_mr(&p.b.arena, 0, 4096, Access::REMOTE_WRITE)
            .is_err(),
        "REMOTE_WRITE requires LOCAL_WRITE"
    );
}

/// A bad lkey fails with LOC_PROT_ERR (rxe: LOC_QP_OP_ERR, see
/// [`Expected`](super::Expected)), even unsignaled, and the QP is in ERR.
pub fn bad_lkey_is_local_protection_error<F: Fixture>(f: &F) {
    let p = Pair::<F>::connect(f, caps(), MEM);
    let mut s = [p.a.sge(0, 8)];
    s[0].lkey ^= 0x100;
    p.a.qp
        .post_send(&[SendWr::new(WrId(1), SendOp::Send, &s)])
        .unwrap();
    p.until(|p| !p.a.swc.borrow().is_empty());
    let w = p.a.take_swc()[0];
    let ok = f.expected().bad_lkey;
    assert!(
        w.wr_id == WrId(1) && ok.contains(&w.status),
        "{:?}: expected one of {ok:?}",
        w.status
    );
    p.until(|p| p.a.qp.state() == QpState::Err);
}

/// A SEND longer than the receive: LOC_LEN_ERR there (rxe: LOC_QP_OP_ERR
/// or REM_INV_REQ_ERR, see [`Expected`](super::Expected)), REM_INV_REQ_ERR
/// here.
pub fn recv_too_small<F: Fixture>(f: &F) {
    let p = Pair::<F>::connect(f, caps(), MEM);
    post_recv(&p.b, 1, 0, 16);
    let s = [p.a.sge(0, 64)];
    p.a.qp
        .post_send(&[SendWr::new(WrId(1), SendOp::Send, &s).signaled()])
        .unwrap();
    p.until(|p| !p.a.swc.borrow().is_empty() && !p.b.rwc.borrow().is_empty());
    let r = p.b.take_rwc()[0];
    let ok = f.expected().recv_too_small;
    assert!(
        r.wr_id == WrId(1) && ok.contains(&r.status),
        "{:?}: expected one of {ok:?}",
        r.status
    );
    let w = p.a.take_swc()[0];
    let ok = f.expected().recv_too_small_requester;
    assert!(
        w.wr_id == WrId(1) && ok.contains(&w.status),
        "requester {:?}: expected one of {ok:?}",
        w.status
    );
    p.until(|p| p.a.qp.state() == QpState::Err && p.b.qp.state() == QpState::Err);
}

/// rnr_retry 7: the SEND waits (no error) until a receive is posted.
pub fn rnr_retry_forever_waits<F: Fixture>(f: &F) {
    let p = Pair::<F>::connect(f, caps(), MEM);
    let s = [p.a.sge(0, 8)];
    p.a.qp
        .post_send(&[SendWr::new(WrId(1), SendOp::Send, &s).signaled()])
        .unwrap();
    // Some time with no receive: nothing may complete.
    for_a_while(10_000, Duration::from_millis(50), || p.poll());
    assert!(p.a.swc.borrow().is_empty());
    assert_eq!(p.a.qp.state(), QpState::Rts);
    post_recv(&p.b, 9, 0, 8);
    p.until(|p| !p.a.swc.borrow().is_empty());
    assert_eq!(p.a.take_swc()[0].status, WcStatus::Success);
    assert_eq!(p.b.take_rwc()[0].wr_id, WrId(9));
}

/// rnr_retry 6: RNR_RETRY_EXC_ERR once the retries are spent.
pub fn rnr_retry_exhausted<F: Fixture>(f: &F) {
    let p = Pair::<F>::connect_with(f, caps(), MEM, 64, 6);
    let s = [p.a.sge(0, 8)];
    p.a.qp
        .post_send(&[SendWr::new(WrId(1), SendOp::Send, &s)])
        .unwrap();
    p.until(|p| !p.a.swc.borrow().is_empty());
    let w = p.a.take_swc()[0];
    assert_eq!((w.wr_id, w.status), (WrId(1), WcStatus::RnrRetryExcErr));
    assert_eq!(p.a.qp.state(), QpState::Err);
}

/// Page-list fast registration (two distant pages under an iova of their
/// own), SEND_WITH_INV and LOCAL_INV change what a key reaches; LOCAL_INV of
/// a free key is an error. A memory-window provider refuses that page list
/// and that LOCAL_INV at post time ([`FastRegMode::MemoryWindow`]).
pub fn fast_reg_send_with_inv_local_inv<F: Fixture>(f: &F) {
    let p = Pair::<F>::connect(f, caps(), MEM);
    if !p.b.dev.caps().mem_mgt_extensions {
        eprintln!("skip: no memory-management extensions");
        return;
    }
    let fr = p.b.pd.alloc_fast_reg_mr(4).unwrap();
    let key = (fr.lkey() & !0xff) | ((fr.lkey() + 1) & 0xff);
    let pages = [p.b.sge(8192, 4096), p.b.sge(65536, 4096)];
    let reg = SendOp::RegMr {
        key,
        iova: 0x10_0000,
        access: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
    };
    let posted =
        p.b.qp
            .post_send(&[SendWr::new(WrId(1), reg, &pages).signaled()]);
    if let FastRegMode::MemoryWindow { .. } = p.b.dev.caps().fast_reg {
        // A window covers one contiguous range at its own address: this
        // page list (two distant pages under another iova) is refused at
        // post time, and so is a LOCAL_INV of a free fast-reg MR (the
        // device must never see it). The window cases are in `fast_reg`.
        let e = posted.unwrap_err();
        assert!(
            e.index == 0 && matches!(e.kind, PostErrorKind::Refused(_)),
            "{e:?}"
        );
        let inv = SendOp::LocalInv { key: fr.lkey() };
        let e =
            p.b.qp
                .post_send(&[SendWr::new(WrId(4), inv, &[]).signaled()])
                .unwrap_err();
        assert!(matches!(e.kind, PostErrorKind::Refused(_)), "{e:?}");
        return;
    }
    posted.unwrap();
    p.until(|p| !p.b.swc.borrow().is_empty());
    let w = p.b.take_swc()[0];
    assert_eq!((w.status, w.opcode), (WcStatus::Success, WcOpcode::RegMr));
    assert_eq!(fr.rkey(), key);
    // A WRITE spanning both pages of the registration.
    p.a.fill(0, &[0x5a; 8192]);
    let s = [p.a.sge(0, 8192)];
    let op = SendOp::RdmaWrite {
        remote: RemoteAddr {
            addr: 0x10_0000,
            rkey: key,
        },
    };
    post_recv(&p.b, 2, 0, 64);
    let wrs = [
        SendWr::new(WrId(2), op, &s),
        SendWr::new(WrId(3), SendOp::SendWithInv { rkey: key }, &[]).signaled(),
    ];
    p.a.qp.post_send(&wrs).unwrap();
    p.until(|p| !p.b.rwc.borrow().is_empty() && !p.a.swc.borrow().is_empty());
    assert_eq!(p.b.read(8192, 4096), vec![0x5a; 4096]);
    assert_eq!(p.b.read(65536, 4096), vec![0x5a; 4096]);
    let r = p.b.take_rwc()[0];
    assert!(r.flags.contains(WcFlags::WITH_INV));
    assert_eq!(r.imm, key);
    assert_eq!(p.a.take_swc()[0].status, WcStatus::Success);
    // The invalidated key no longer reaches memory.
    let op = SendOp::RdmaWrite {
        remote: RemoteAddr {
            addr: 0x10_0000,
            rkey: key,
        },
    };
    let p2 = p;
    let s = [p2.a.sge(0, 8)];
    p2.a.qp.post_send(&[SendWr::new(WrId(5), op, &s)]).unwrap();
    p2.until(|p| !p.a.swc.borrow().is_empty());
    assert_eq!(p2.a.take_swc()[0].status, WcStatus::RemAccessErr);
    // LOCAL_INV of a free key is an error (on a live connection).
    let p3 = Pair::<F>::connect(f, caps(), MEM);
    let fr = p3.b.pd.alloc_fast_reg_mr(1).unwrap();
    let inv = SendOp::LocalInv { key: fr.lkey() };
    p3.b.qp
        .post_send(&[SendWr::new(WrId(4), inv, &[])])
        .unwrap();
    p3.until(|p| !p.b.swc.borrow().is_empty());
    let w = p3.b.take_swc()[0];
    assert_eq!((w.wr_id, w.status), (WrId(4), WcStatus::LocQpOpErr));
}

/// After ERR every outstanding and later WR flushes, signaled or not,
/// including a drain marker.
pub fn flush_after_error_and_drain<F: Fixture>(f: &F) {
    let p = Pair::<F>::connect(f, caps(), MEM);
    for i in 0..4 {
        post_recv(&p.a, 10 + i, 0, 64);
    }
    let s = [p.a.sge(0, 8)];
    // No receives at b: these wait (RNR, retry forever).
    let wrs = [
        SendWr::new(WrId(1), SendOp::Send, &s),
        SendWr::new(WrId(2), SendOp::Send, &s).signaled(),
    ];
    p.a.qp.post_send(&wrs).unwrap();
    p.a.qp.modify(&QpAttr::to(QpState::Err)).unwrap();
    p.a.qp
        .post_send(&[SendWr::new(WrId(99), SendOp::Send, &s).signaled()])
        .unwrap();
    p.until(|p| p.a.swc.borrow().len() == 3 && p.a.rwc.borrow().len() == 4);
    let s = p.a.take_swc();
    assert_eq!(s.iter().map(|w| w.wr_id.0).collect::<Vec<_>>(), [1, 2, 99]);
    assert!(s.iter().all(|w| w.status == WcStatus::WrFlushErr));
    assert!(p
        .a
        .take_rwc()
        .iter()
        .all(|w| w.status == WcStatus::WrFlushErr));
}

/// One SRQ shared by several QPs, all on one CQ; the SRQ limit event fires once.
pub fn srq_shared_by_qps_and_cq_shared<F: Fixture>(f: &F) {
    let b_dev = f.open();
    let pd = b_dev.alloc_pd().unwrap();
    let cq = b_dev.create_cq(256).unwrap();
    let srq = pd.create_srq(64, 1).unwrap();
    let arena = f.arena(MEM);
    let mr = pd
        .reg_mr(&arena, 0, MEM, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let addr = f.listen_addr();
    let l = b_dev.listen(&addr, 16).unwrap();
    let mut clients = Vec::new();
    let mut servers = Vec::new();
    for _ in 0..3 {
        let a = Endpoint::<F>::new(f, caps(), 4096, 64);
        let qp = pd
            .create_qp(&QpInit {
                send_cq: &cq,
                recv_cq: &cq,
                srq: Some(&srq),
                caps: caps(),
                sq_sig_all: false,
            })
            .unwrap();
        let ida = a
            .dev
            .connect(&addr, &a.qp, &ConnParam::with_data(b""))
            .unwrap();
        let idb = spin(|| l.get_request().unwrap()).unwrap();
        idb.accept(&qp, &ConnParam::with_data(b"")).unwrap();
        assert!(matches!(
            spin(|| ida.get_event().unwrap()),
            Some(CmEvent::Established { .. })
        ));
        clients.push((a, ida));
        servers.push((qp, idb));
    }
    let sges: Vec<_> = (0..8u64)
        .map(|i| crate::types::Sge {
            addr: mr.addr() + i * 256,
            length: 256,
            lkey: mr.lkey(),
        })
        .collect();
    for (i, s) in sges.iter().enumerate() {
        srq.post_recv(&[RecvWr {
            wr_id: WrId(i as u64),
            sg_list: std::slice::from_ref(s),
        }])
        .unwrap();
    }
    srq.set_limit(4).unwrap();
    for (a, _) in &clients {
        a.fill(0, &[1; 8]);
        let s = [a.sge(0, 8)];
        a.qp.post_send(&[
            SendWr::new(WrId(1), SendOp::Send, &s),
            SendWr::new(WrId(2), SendOp::Send, &s),
        ])
        .unwrap();
    }
    let mut got = Vec::new();
    let mut buf = [crate::types::Wc::default(); 16];
    let start = Instant::now();
    while start.elapsed() < WAIT_LIMIT {
        for (a, _) in &clients {
            a.poll();
        }
        let n = cq.poll(&mut buf).unwrap();
        got.extend_from_slice(&buf[..n]);
        if got.len() == 6 {
            break;
        }
    }
    assert_eq!(got.len(), 6);
    assert!(got.iter().all(|w| w.status == WcStatus::Success));
    let mut qpns: Vec<u32> = got.iter().map(|w| w.qp_num).collect();
    qpns.sort_unstable();
    qpns.dedup();
    assert_eq!(qpns.len(), 3, "each QP took receives from the SRQ");
    let mut limit_events = 0;
    while let Some(ev) = b_dev.poll_async_event() {
        if matches!(ev, crate::types::AsyncEvent::SrqLimitReached { .. }) {
            limit_events += 1;
        }
    }
    assert_eq!(limit_events, 1, "the SRQ limit event is one-shot");
}

/// More completions than a CQ holds: overflow is reported, by a failing
/// poll and/or the async `CQ_ERR` event (see [`Expected`](super::Expected)),
/// and the QPs on that CQ go to ERR.
pub fn cq_overflow<F: Fixture>(f: &F) {
    let p = Pair::<F>::connect_with(f, caps(), MEM, 4, 7);
    // The real depth (a provider may round 4 up): two receives more.
    let n = p.b.rcq.depth() as usize + 2;
    let sq = p.a.qp.caps().max_send_wr as usize;
    let rq = p.b.qp.caps().max_recv_wr as usize;
    assert!(n <= sq.min(rq), "CQ depth {} beyond the QP's queues", n - 2);
    for i in 0..n {
        post_recv(&p.b, i as u64, 0, 64);
    }
    let s = [p.a.sge(0, 8)];
    // Unsignaled but the last: a's 4-deep send CQ gets one completion.
    let mut wrs = vec![SendWr::new(WrId(1), SendOp::Send, &s); n];
    wrs[n - 1] = wrs[n - 1].signaled();
    p.a.qp.post_send(&wrs).unwrap();
    let cq_num = p.b.rcq.cq_num();
    let (mut poll_err, mut event) = (false, false);
    let start = Instant::now();
    while !(poll_err && event) {
        p.a.poll();
        // Leave b's receive completions in the CQ: poll none of them.
        if p.b.rcq.poll(&mut []).is_err() {
            poll_err = true;
        }
        while let Some(ev) = p.b.dev.poll_async_event() {
            if ev == (crate::types::AsyncEvent::CqErr { cq_num }) {
                event = true;
            }
        }
        if f.expected().cq_overflow == CqOverflowReport::PollErrorOrEvent && (poll_err || event) {
            break;
        }
        assert!(
            start.elapsed() < WAIT_LIMIT,
            "overflow not reported (poll error {poll_err}, CQ_ERR event {event})"
        );
    }
    p.until(|p| p.b.qp.state() == QpState::Err);
}

/// Disconnect while WRs are in flight: both sides see DISCONNECTED and
/// every outstanding WR flushes.
pub fn disconnect_during_traffic<F: Fixture>(f: &F) {
    let p = Pair::<F>::connect(f, caps(), MEM);
    post_recv(&p.b, 1, 0, 64);
    for i in 0..4 {
        post_recv(&p.a, 10 + i, 0, 64);
    }
    let s = [p.a.sge(0, 8)];
    let wrs = [SendWr::new(WrId(1), SendOp::Send, &s).signaled(); 8];
    p.a.qp.post_send(&wrs).unwrap();
    p.b.id.as_ref().unwrap().disconnect().unwrap();
    let ea = spin(|| p.a.id.as_ref().unwrap().get_event().unwrap()).unwrap();
    assert_eq!(ea, CmEvent::Disconnected);
    let eb = spin(|| p.b.id.as_ref().unwrap().get_event().unwrap()).unwrap();
    assert_eq!(eb, CmEvent::Disconnected);
    p.until(|p| p.a.swc.borrow().len() == 8 && p.a.rwc.borrow().len() == 4);
    let s = p.a.take_swc();
    assert_eq!(p.a.qp.state(), QpState::Err);
    assert!(s
        .iter()
        .skip_while(|w| w.status == WcStatus::Success)
        .all(|w| w.status == WcStatus::WrFlushErr));
    assert!(p
        .a
        .take_rwc()
        .iter()
        .all(|w| w.status == WcStatus::WrFlushErr));
}

/// An armed CQ's event fd becomes readable when a completion arrives.
pub fn cq_arm_event_fd<F: Fixture>(f: &F) {
    let p = Pair::<F>::connect(f, caps(), MEM);
    post_recv(&p.b, 1, 0, 64);
    assert!(!p.b.rcq.ack_events());
    p.b.rcq.req_notify(false).unwrap();
    let s = [p.a.sge(0, 8)];
    p.a.qp
        .post_send(&[SendWr::new(WrId(1), SendOp::Send, &s)])
        .unwrap();
    let mut fired = false;
    let start = Instant::now();
    while start.elapsed() < WAIT_LIMIT {
        if p.b.rcq.ack_events() {
            fired = true;
            break;
        }
        p.a.poll();
    }
    assert!(fired, "event fd signalled");
    p.b.poll();
    assert_eq!(p.b.take_rwc().len(), 1);
}

/// Register integrity MR `mr` of `e` over `data` (+ `prot`) with `sig`;
/// returns its new key.
fn reg_integrity<F: Fixture>(
    e: &Endpoint<F>,
    mr: &<F::P as crate::provider::Provider>::Mr,
    data: crate::types::Sge,
    prot: &[crate::types::Sge],
    sig: crate::sig::SigAttrs,
) -> u32 {
    let k = mr.lkey();
    let key = (k & !0xff) | (k.wrapping_add(1) & 0xff);
    let op = SendOp::RegMrIntegrity {
        key,
        iova: 0x40_0000,
        access: Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
        sig,
        prot,
    };
    let sg = [data];
    e.qp.post_send(&[SendWr::new(WrId(900), op, &sg).signaled()])
        .unwrap();
    let w = spin(|| {
        e.poll();
        e.take_swc().pop()
    })
    .expect("REG_MR_INTEGRITY completion");
    assert_eq!(
        (w.status, w.opcode),
        (WcStatus::Success, WcOpcode::RegMrIntegrity)
    );
    assert_eq!(mr.rkey(), key);
    key
}

fn t10(ref_tag: u32, app_tag: u16) -> crate::sig::T10Dif {
    crate::sig::T10Dif {
        bg_type: crate::sig::GuardType::Crc,
        pi_interval: 512,
        bg: 0,
        app_tag,
        ref_tag,
        ref_remap: true,
        app_escape: true,
        ref_escape: false,
        apptag_check_mask: 0xFFFF,
    }
}

/// Integrity MRs (REG_MR_INTEGRITY) do T10-PI: the peer READs generated
/// tuples (insert), WRITEs are checked and stripped or moved to a DIX
/// buffer, SENDs through an integrity receive are checked, and a mismatch
/// completes the WR successfully but shows in `check_sig_status` (guard,
/// app tag, ref tag; wire offset of the failing interval).
pub fn integrity_t10_pi<F: Fixture>(f: &F) {
    use crate::sig::{check, SigAttrs, SigDomain, SigErrKind};
    use pollux_pi::{generate, verify, Buffers, BuffersMut, PiParams, PiType};
    let p = Pair::<F>::connect(f, caps(), MEM);
    if !p.b.dev.caps().integrity {
        eprintln!("skip: no integrity offload");
        return;
    }
    let imr = p.b.pd.alloc_integrity_mr(4).unwrap();
    assert!(imr.check_sig_status().unwrap().is_none());
    assert!(p.b.mr.check_sig_status().is_err(), "not an integrity MR");
    let all = check::GUARD | check::APPTAG | check::REFTAG;
    let sig = SigAttrs {
        check_mask: all,
        mem: SigDomain::None,
        wire: SigDomain::T10Dif(t10(100, 0x42)),
        meta_length: 0,
    };
    // 4 blocks of 512 at b:0, no PI in memory; the wire has 4 × 520.
    let data: Vec<u8> = (0..2048u32).map(|i| (i * 7 + 3) as u8).collect();
    p.b.fill(0, &data);
    let key = reg_integrity(&p.b, &imr, p.b.sge(0, 2048), &[], sig);
    let params = PiParams::for_type(PiType::Type1, 512, 100, 0x42);
    let remote = RemoteAddr {
        addr: 0x40_0000,
        rkey: key,
    };
    // READ: the target generates (inserts) the tuples.
    let s = [p.a.sge(0, 2080)];
    p.a.qp
        .post_send(&[SendWr::new(WrId(1), SendOp::RdmaRead { remote }, &s).signaled()])
        .unwrap();
    p.until(|p| !p.a.swc.borrow().is_empty());
    assert_eq!(p.a.take_swc()[0].status, WcStatus::Success);
    let wire = p.a.read(0, 2080);
    verify(Buffers::Dif(&wire), &params).unwrap();
    for b in 0..4 {
        assert_eq!(&wire[b * 520..b * 520 + 512], &data[b * 512..b * 512 + 512]);
    }
    assert!(imr.check_sig_status().unwrap().is_none());
    // WRITE new valid DIF data: checked and stripped into memory.
    let mut w: Vec<u8> = vec![0; 2080];
    for (i, b) in w.iter_mut().enumerate() {
        *b = (i * 13 + 1) as u8;
    }
    generate(BuffersMut::Dif(&mut w), &params).unwrap();
    p.a.fill(4096, &w);
    let s = [p.a.sge(4096, 2080)];
    let write = |id: u64, s: &[crate::types::Sge]| {
        p.a.qp
            .post_send(&[SendWr::new(WrId(id), SendOp::RdmaWrite { remote }, s).signaled()])
            .unwrap();
        p.until(|p| !p.a.swc.borrow().is_empty());
        assert_eq!(p.a.take_swc()[0].status, WcStatus::Success);
    };
    write(2, &s);
    assert!(imr.check_sig_status().unwrap().is_none());
    for b in 0..4 {
        assert_eq!(
            p.b.read(b * 512, 512),
            &w[b * 520..b * 520 + 512],
            "stripped block {b}"
        );
    }
    // A bad guard in block 2: the WRITE still succeeds; the status says where.
    let mut bad = w.clone();
    bad[2 * 520 + 5] ^= 0x10;
    p.a.fill(4096, &bad);
    write(3, &s);
    let e = imr.check_sig_status().unwrap().expect("guard error");
    assert_eq!(
        (e.kind, e.offset, e.key),
        (SigErrKind::BadGuard, 2 * 520, key)
    );
    assert!(
        imr.check_sig_status().unwrap().is_none(),
        "status is cleared"
    );
    // A bad app tag in block 1.
    let mut bad = w.clone();
    bad[520 + 512 + 3] ^= 1;
    p.a.fill(4096, &bad);
    write(4, &s);
    let e = imr.check_sig_status().unwrap().expect("app tag error");
    assert_eq!(
        (e.kind, e.offset, e.expected, e.actual),
        (SigErrKind::BadAppTag, 520, 0x42, 0x43)
    );

    // DIX in memory: a second integrity MR over data b:8192 + PI b:16384.
    let dmr = p.b.pd.alloc_integrity_mr(4).unwrap();
    let sig2 = SigAttrs {
        mem: SigDomain::T10Dif(t10(100, 0x42)),
        ..sig
    };
    let prot = [p.b.sge(16384, 32)];
    let key2 = reg_integrity(&p.b, &dmr, p.b.sge(8192, 2048), &prot, sig2);
    let remote2 = RemoteAddr {
        addr: 0x40_0000,
        rkey: key2,
    };
    p.a.fill(4096, &w);
    p.a.qp
        .post_send(&[SendWr::new(WrId(5), SendOp::RdmaWrite { remote: remote2 }, &s).signaled()])
        .unwrap();
    p.until(|p| !p.a.swc.borrow().is_empty());
    assert_eq!(p.a.take_swc()[0].status, WcStatus::Success);
    assert!(dmr.check_sig_status().unwrap().is_none());
    let (d, t) = (p.b.read(8192, 2048), p.b.read(16384, 32));
    verify(Buffers::Dix { data: &d, pi: &t }, &params).unwrap();
    // A wrong ref tag in block 3 (WRITE at an offset: blocks 2-3 only).
    let mut bad = w.clone();
    bad[3 * 520 + 519] ^= 0xFF;
    p.a.fill(4096, &bad);
    let s2 = [p.a.sge(4096 + 1040, 1040)];
    let off = RemoteAddr {
        addr: 0x40_0000 + 1040,
        rkey: key2,
    };
    p.a.qp
        .post_send(&[SendWr::new(WrId(6), SendOp::RdmaWrite { remote: off }, &s2).signaled()])
        .unwrap();
    p.until(|p| !p.a.swc.borrow().is_empty());
    assert_eq!(p.a.take_swc()[0].status, WcStatus::Success);
    let e = dmr.check_sig_status().unwrap().expect("ref tag error");
    assert_eq!(
        (e.kind, e.offset, e.expected),
        (SigErrKind::BadRefTag, 3 * 520, 103)
    );
    assert_eq!(e.actual, u64::from(103u32 ^ 0xFF));

    // SEND into a receive on the integrity MR: checked, stripped.
    let r = [crate::types::Sge {
        addr: 0x40_0000,
        length: 2080,
        lkey: key,
    }];
    p.b.qp
        .post_recv(&[RecvWr {
            wr_id: WrId(7),
            sg_list: &r,
        }])
        .unwrap();
    let mut bad = w.clone();
    bad[7] ^= 1;
    p.a.fill(4096, &bad);
    p.a.qp
        .post_send(&[SendWr::new(WrId(8), SendOp::Send, &s).signaled()])
        .unwrap();
    p.until(|p| !p.b.rwc.borrow().is_empty() && !p.a.swc.borrow().is_empty());
    let rw = p.b.take_rwc()[0];
    assert_eq!((rw.status, rw.byte_len), (WcStatus::Success, 2080));
    assert_eq!(p.a.take_swc()[0].status, WcStatus::Success);
    let e = imr
        .check_sig_status()
        .unwrap()
        .expect("guard error on SEND");
    assert_eq!((e.kind, e.offset), (SigErrKind::BadGuard, 0));
    assert_eq!(p.b.read(512, 512), &w[520..1032]);
    // SEND out of an integrity MR (memory without PI): tuples generated.
    post_recv(&p.a, 9, 65536, 4096);
    let g = [crate::types::Sge {
        addr: 0x40_0000,
        length: 2080,
        lkey: key,
    }];
    p.b.qp
        .post_send(&[SendWr::new(WrId(10), SendOp::Send, &g).signaled()])
        .unwrap();
    p.until(|p| !p.a.rwc.borrow().is_empty() && !p.b.swc.borrow().is_empty());
    assert_eq!(p.a.take_rwc()[0].byte_len, 2080);
    verify(Buffers::Dif(&p.a.read(65536, 2080)), &params).unwrap();
    // A range that is not whole intervals is an access error.
    let odd = RemoteAddr {
        addr: 0x40_0000 + 8,
        rkey: key,
    };
    let s3 = [p.a.sge(0, 520)];
    p.a.qp
        .post_send(&[SendWr::new(WrId(11), SendOp::RdmaRead { remote: odd }, &s3).signaled()])
        .unwrap();
    p.until(|p| !p.a.swc.borrow().is_empty());
    assert_eq!(p.a.take_swc()[0].status, WcStatus::RemAccessErr);
}
