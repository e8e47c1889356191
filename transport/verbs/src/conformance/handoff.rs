//! Conformance cases of the cross-core handoff of a connect request
//! ([`CmId::detach`], [`PendingConn`]): a request received on one thread is
//! answered on another, with that thread's own device, PD, CQ and QP, and
//! carries traffic both ways; a detached request dropped unanswered is a
//! reject the peer sees.

use std::sync::Arc;

use pollux_reactor::mem::{ArenaOptions, DmaArena, HugepageMode};

use super::harness::{spin, Endpoint, Fixture};
use crate::cm::{CmEvent, ConnParam, REJECT_REASON_CONSUMER};
use crate::error::VerbsError;
use crate::provider::{
    CmId, CmListener, CompletionQueue, Device, MemoryRegion, PendingConn, ProtectionDomain,
    Provider, QpInit, QueuePair,
};
use crate::types::{
    Access, QpAttr, QpCaps, QpState, RemoteAddr, Sge, Wc, WcOpcode, WcStatus, WrId,
};
use crate::wr::{RecvWr, SendOp, SendWr};

use super::cases::Case;

/// The handoff cases, by name.
pub fn all<F: Fixture>() -> Vec<(&'static str, Case<F>)> {
    vec![
        ("accept_on_another_thread", accept_on_another_thread::<F>),
        (
            "dropped_detached_request_is_rejected",
            dropped_detached_request_is_rejected::<F>,
        ),
    ]
}

const MEM: usize = 64 * 1024;
/// Where the active side keeps the data the passive side READs.
const A_DATA: usize = 4096;
/// Where the active side READs the passive side's data into.
const A_READ: usize = 16384;
/// Where the passive side READs into.
const B_READ: usize = 4096;
/// Where the passive side keeps the data the active side READs.
const B_DATA: usize = 8192;
const DATA_LEN: u32 = 4096;

fn pattern(seed: u8) -> Vec<u8> {
    (0..DATA_LEN as usize)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

/// The passive side, built on its own thread.
struct Passive<P: Provider> {
    qp: P::Qp,
    cq: P::Cq,
    mr: P::Mr,
    arena: Arc<DmaArena>,
    _pd: P::Pd,
    dev: P::Device,
}

impl<P: Provider> Passive<P> {
    fn new(dev_name: &str) -> Self {
        let dev = P::open_device(dev_name).expect("open the device on the new thread");
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(64).unwrap();
        let qp = pd
            .create_qp(&QpInit {
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                caps: QpCaps::default(),
                sq_sig_all: false,
            })
            .unwrap();
        let arena = DmaArena::new(
            MEM,
            ArenaOptions::named("conformance-handoff").hugepages(HugepageMode::Never),
        )
        .expect("arena");
        let mr = pd
            .reg_mr(
                &arena,
                0,
                MEM,
                Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
            )
            .unwrap();
        Passive {
            qp,
            cq,
            mr,
            arena,
            _pd: pd,
            dev,
        }
    }

    fn sge(&self, off: usize, len: u32) -> Sge {
        Sge {
            addr: self.mr.addr() + off as u64,
            length: len,
            lkey: self.mr.lkey(),
        }
    }

    fn bytes(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= self.arena.len());
        let mut v = vec![0; len];
        // SAFETY: in bounds of the arena (checked); no WR writes the range now.
        unsafe { std::ptr::copy_nonoverlapping(self.arena.base().add(off), v.as_mut_ptr(), len) }
        v
    }

    fn put(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.arena.len());
        // SAFETY: in bounds of the arena (checked); no WR uses the range now.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.arena.base().add(off), data.len())
        }
    }

    fn next_wc(&self) -> Wc {
        let mut wc = [Wc::default(); 1];
        spin(|| (self.cq.poll(&mut wc).expect("CQ poll") == 1).then_some(wc[0]))
            .expect("a completion on the passive thread")
    }
}

/// The passive thread's script: attach, accept, READ the active side's
/// data, offer its own for READ, and wait for the end.
fn passive_thread<P: Provider>(dev_name: &str, pending: P::PendingConn, a_data: RemoteAddr) {
    let b = Passive::<P>::new(dev_name);
    b.qp.modify(&QpAttr::to(QpState::Init)).unwrap();
    for (i, off) in [(1u64, 0usize), (2, 64)] {
        b.qp.post_recv(&[RecvWr {
            wr_id: WrId(i),
            sg_list: &[b.sge(off, 64)],
        }])
        .unwrap();
    }
    let id = pending.attach(&b.dev).expect("attach on the new thread");
    assert_eq!(
        &id.request().expect("passive id").private_data.as_bytes()[..7],
        b"handoff"
    );
    id.accept(&b.qp, &ConnParam::with_data(b"accepted elsewhere"))
        .expect("accept on the new thread");
    assert_eq!(b.qp.state(), QpState::Rts);
    let ev = spin(|| id.get_event().unwrap()).expect("passive event");
    assert!(matches!(ev, CmEvent::Established { .. }), "{ev:?}");

    // "ping" from the active side.
    let wc = b.next_wc();
    assert_eq!((wc.wr_id, wc.status), (WrId(1), WcStatus::Success));
    assert_eq!(wc.opcode, WcOpcode::Recv);
    assert_eq!(b.bytes(0, 4), b"ping");
    // READ the active side's data with this thread's QP and MR.
    let sge = [b.sge(B_READ, DATA_LEN)];
    b.qp.post_send(&[SendWr::new(WrId(10), SendOp::RdmaRead { remote: a_data }, &sge).signaled()])
        .unwrap();
    let wc = b.next_wc();
    assert_eq!((wc.wr_id, wc.status), (WrId(10), WcStatus::Success));
    assert!(
        b.bytes(B_READ, DATA_LEN as usize) == pattern(1),
        "READ from the active side differs"
    );
    // Offer this thread's memory: address and rkey in a SEND.
    b.put(B_DATA, &pattern(2));
    let mut msg = [0u8; 12];
    msg[..8].copy_from_slice(&(b.mr.addr() + B_DATA as u64).to_le_bytes());
    msg[8..].copy_from_slice(&b.mr.rkey().to_le_bytes());
    b.put(128, &msg);
    let sge = [b.sge(128, 12)];
    b.qp.post_send(&[SendWr::new(WrId(11), SendOp::Send, &sge).signaled()])
        .unwrap();
    // That SEND's completion and the "done" the active side sends once it
    // has READ the data share the CQ, in either order.
    let mut got = [b.next_wc(), b.next_wc()];
    got.sort_by_key(|w| w.wr_id.0);
    assert_eq!((got[0].wr_id, got[0].status), (WrId(2), WcStatus::Success));
    assert_eq!((got[1].wr_id, got[1].status), (WrId(11), WcStatus::Success));
    assert_eq!(b.bytes(64, 4), b"done");
    let ev = spin(|| id.get_event().unwrap()).expect("the active side's disconnect");
    assert_eq!(ev, CmEvent::Disconnected);
}

fn active_send<F: Fixture>(a: &Endpoint<F>, wr: u64, off: usize, data: &[u8]) {
    a.fill(off, data);
    let sge = [a.sge(off, data.len() as u32)];
    a.qp.post_send(&[SendWr::new(WrId(wr), SendOp::Send, &sge).signaled()])
        .unwrap();
}

fn active_wc<F: Fixture>(a: &Endpoint<F>, recv: bool) -> Wc {
    spin(|| {
        a.poll();
        let mut v = if recv {
            a.rwc.borrow_mut()
        } else {
            a.swc.borrow_mut()
        };
        (!v.is_empty()).then(|| v.remove(0))
    })
    .expect("an active-side completion")
}

/// A request received (and detached) on this thread is attached and
/// accepted on another thread with that thread's own device, PD, CQ and
/// QP; RDMA READ and SEND then work both ways, and the other thread sees
/// this side's disconnect.
pub fn accept_on_another_thread<F: Fixture>(f: &F) {
    let a = Endpoint::<F>::new(f, QpCaps::default(), MEM, 64);
    let b_dev = f.open();
    let dev_name = b_dev.name().to_owned();
    let addr = f.listen_addr();
    let l = b_dev.listen(&addr, 4).unwrap();
    a.qp.modify(&QpAttr::to(QpState::Init)).unwrap();
    let rsge = [a.sge(0, 64)];
    a.qp.post_recv(&[RecvWr {
        wr_id: WrId(100),
        sg_list: &rsge,
    }])
    .unwrap();
    a.fill(A_DATA, &pattern(1));
    let ida = a
        .dev
        .connect(&addr, &a.qp, &ConnParam::with_data(b"handoff"))
        .unwrap();
    let idb = spin(|| l.get_request().unwrap()).expect("connect request");
    let pending = idb.detach().expect("detach an unanswered request");
    assert_eq!(&pending.request().private_data.as_bytes()[..7], b"handoff");
    assert_eq!(pending.request().qp_num, a.qp.qp_num());
    let a_data = RemoteAddr {
        addr: a.addr(A_DATA),
        rkey: a.mr.rkey(),
    };
    std::thread::scope(|s| {
        let t = s.spawn(move || passive_thread::<F::P>(&dev_name, pending, a_data));
        match spin(|| ida.get_event().unwrap()).expect("active event") {
            CmEvent::Established { private_data } => {
                assert_eq!(&private_data.as_bytes()[..18], b"accepted elsewhere")
            }
            e => panic!("{e:?}"),
        }
        active_send(&a, 1, 256, b"ping");
        assert_eq!(active_wc(&a, false).status, WcStatus::Success);
        let wc = active_wc(&a, true);
        assert_eq!((wc.wr_id, wc.status), (WrId(100), WcStatus::Success));
        assert_eq!(wc.byte_len, 12);
        let msg = a.read(0, 12);
        let remote = RemoteAddr {
            addr: u64::from_le_bytes(msg[..8].try_into().unwrap()),
            rkey: u32::from_le_bytes(msg[8..].try_into().unwrap()),
        };
        let sge = [a.sge(A_READ, DATA_LEN)];
        a.qp.post_send(&[SendWr::new(WrId(2), SendOp::RdmaRead { remote }, &sge).signaled()])
            .unwrap();
        let wc = active_wc(&a, false);
        assert_eq!((wc.wr_id, wc.status), (WrId(2), WcStatus::Success));
        assert!(
            a.read(A_READ, DATA_LEN as usize) == pattern(2),
            "READ from the other thread's memory differs"
        );
        active_send(&a, 3, 256, b"done");
        assert_eq!(active_wc(&a, false).status, WcStatus::Success);
        ida.disconnect().unwrap();
        t.join().expect("the passive thread failed");
    });
    drop(l);
}

/// A detached request dropped (on another thread) without being attached
/// is a consumer reject the peer sees; an id that is no longer an
/// unanswered request cannot be detached and comes back intact.
pub fn dropped_detached_request_is_rejected<F: Fixture>(f: &F) {
    let a = Endpoint::<F>::new(f, QpCaps::default(), 4096, 16);
    let b_dev = f.open();
    let addr = f.listen_addr();
    let l = b_dev.listen(&addr, 4).unwrap();
    let ida = a
        .dev
        .connect(&addr, &a.qp, &ConnParam::with_data(b"drop me"))
        .unwrap();
    let idb = spin(|| l.get_request().unwrap()).expect("connect request");
    let pending = idb.detach().expect("detach");
    std::thread::scope(|s| s.spawn(move || drop(pending)).join()).expect("drop thread");
    match spin(|| ida.get_event().unwrap()).expect("active event") {
        CmEvent::Rejected { reason, .. } => assert_eq!(reason, REJECT_REASON_CONSUMER),
        e => panic!("a dropped request must be rejected, got {e:?}"),
    }

    // A second connection: rejected here, then detach refuses it.
    let c = Endpoint::<F>::new(f, QpCaps::default(), 4096, 16);
    let d_dev = f.open();
    let addr2 = f.listen_addr();
    let l2 = d_dev.listen(&addr2, 4).unwrap();
    let idc = c
        .dev
        .connect(&addr2, &c.qp, &ConnParam::with_data(b"x"))
        .unwrap();
    let idd = spin(|| l2.get_request().unwrap()).expect("connect request");
    idd.reject(b"no").unwrap();
    let err = idd
        .detach()
        .expect_err("a rejected id is not a pending request");
    assert!(matches!(err.error, VerbsError::CmState(_)), "{err}");
    assert!(err.id.request().is_some(), "the id comes back");
    match spin(|| idc.get_event().unwrap()).expect("active event") {
        CmEvent::Rejected { reason, .. } => assert_eq!(reason, REJECT_REASON_CONSUMER),
        e => panic!("{e:?}"),
    }
    drop((l, l2));
}
