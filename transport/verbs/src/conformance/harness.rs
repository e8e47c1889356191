//! Fixture and helpers of the conformance suite.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pollux_reactor::mem::{ArenaOptions, DmaArena, HugepageMode};

use crate::cm::{CmAddr, CmEvent, ConnParam};
use crate::provider::{
    CmId, CmListener, CompletionQueue, Device, MemoryRegion, ProtectionDomain, Provider, QpInit,
};
use crate::types::{Access, QpCaps, Sge, Wc, WcStatus};

/// How long a wait may last before the case fails. A failure bound, not a
/// timing assumption: every wait normally ends in micro- to milliseconds
/// (seconds for an RNR budget on rxe, or under an emulated CPU); this only
/// turns a hang into a failure. No case asserts on how long anything took.
pub const WAIT_LIMIT: Duration = Duration::from_secs(60);

/// How a provider reports a CQ overflow (verbs-semantics §10: an
/// `IBV_EVENT_CQ_ERR` async event; `ibv_poll_cq` may or may not fail).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CqOverflowReport {
    /// Both: [`CompletionQueue::poll`] fails with `CqError::Overflow` and the
    /// device raises [`AsyncEvent::CqErr`](crate::types::AsyncEvent::CqErr).
    PollErrorAndEvent,
    /// Either one is enough (rxe raises only the async event).
    PollErrorOrEvent,
}

/// The completion statuses (and reports) that legitimately differ between
/// providers, and the set each case accepts. Everything else in the suite is
/// exact for every provider.
///
/// The soft provider reports the statuses of the verbs-semantics doc (§6,
/// the IB spec's classes as hardware reports them): one status per case. A
/// libibverbs device may also be soft-RoCE (rxe), whose requester puts every
/// local error of a WR (bad lkey included) out as `LOC_QP_OP_ERR`, and whose
/// responder completes an over-long SEND's receive with `LOC_QP_OP_ERR` (6.x
/// kernels: it treats the receive WQE as malformed, so the requester gets
/// the NAK of that class, `REM_OP_ERR`, doc §6 row "responder's receive WR is
/// malformed") or `REM_INV_REQ_ERR` (doc §6). rxe also accepts more receive
/// WRs than its create call reports (its ring holds 2^n − 1; the ibverbs
/// provider asks the QP for the real values). And a receive posted by user
/// space to an rxe QP already in ERR sits in the RQ until the kernel's
/// responder runs again (user-space rxe posts receives without a system
/// call), so its flush completion is not guaranteed to come.
#[derive(Debug, Clone, Copy)]
pub struct Expected {
    /// A SEND whose SGE has a bad lkey: the requester's status.
    pub bad_lkey: &'static [WcStatus],
    /// A SEND longer than the receive buffer: the responder's receive status.
    pub recv_too_small: &'static [WcStatus],
    /// The same SEND: the requester's status.
    pub recv_too_small_requester: &'static [WcStatus],
    /// A queue takes exactly `QueuePair::caps` WRs (else at least that many).
    pub exact_queue_caps: bool,
    /// A receive posted to a QP in ERR completes (flush) by itself.
    pub flush_recv_posted_in_err: bool,
    /// How CQ overflow shows.
    pub cq_overflow: CqOverflowReport,
    /// A remote access through a fast-registered key that leaves the
    /// registered range but stays inside the MR under it: the requester's
    /// status. rxe checks a memory-window access against the window's MR
    /// only (Linux `rxe_resp.c`, `check_rkey`), so there it succeeds.
    pub beyond_window: &'static [WcStatus],
}

impl Expected {
    /// The precise statuses (IB spec classes, verbs-semantics §6): the soft
    /// provider.
    pub const EXACT: Expected = Expected {
        bad_lkey: &[WcStatus::LocProtErr],
        recv_too_small: &[WcStatus::LocLenErr],
        recv_too_small_requester: &[WcStatus::RemInvReqErr],
        exact_queue_caps: true,
        flush_recv_posted_in_err: true,
        cq_overflow: CqOverflowReport::PollErrorAndEvent,
        beyond_window: &[WcStatus::RemAccessErr],
    };
    /// Any libibverbs device: hardware (the precise statuses) or rxe.
    pub const IBVERBS: Expected = Expected {
        bad_lkey: &[WcStatus::LocProtErr, WcStatus::LocQpOpErr],
        recv_too_small: &[
            WcStatus::LocLenErr,
            WcStatus::LocQpOpErr,
            WcStatus::RemInvReqErr,
        ],
        recv_too_small_requester: &[WcStatus::RemInvReqErr, WcStatus::RemOpErr],
        exact_queue_caps: false,
        flush_recv_posted_in_err: false,
        cq_overflow: CqOverflowReport::PollErrorOrEvent,
        beyond_window: &[WcStatus::RemAccessErr, WcStatus::Success],
    };

    /// The set for a provider, by [`Provider::NAME`].
    pub fn for_provider(name: &str) -> &'static Expected {
        match name {
            "ibverbs" => &Self::IBVERBS,
            _ => &Self::EXACT,
        }
    }
}

/// What a provider must supply to run the suite.
pub trait Fixture {
    /// The provider under test.
    type P: Provider;
    /// Open the device to test (may be called several times).
    fn open(&self) -> <Self::P as Provider>::Device;
    /// A fresh, unused listen address.
    fn listen_addr(&self) -> CmAddr;
    /// The provider-dependent statuses to accept (see [`Expected`]); by
    /// default the provider's set.
    fn expected(&self) -> &'static Expected {
        Expected::for_provider(<Self::P as Provider>::NAME)
    }
    /// DMA memory for MRs (defaults to an ordinary-page arena).
    fn arena(&self, len: usize) -> Arc<DmaArena> {
        DmaArena::new(
            len,
            ArenaOptions::named("conformance").hugepages(HugepageMode::Never),
        )
        .expect("arena")
    }
}

type Dev<F> = <<F as Fixture>::P as Provider>::Device;
type Pd<F> = <<F as Fixture>::P as Provider>::Pd;
type Cq<F> = <<F as Fixture>::P as Provider>::Cq;
type Qp<F> = <<F as Fixture>::P as Provider>::Qp;
type Mr<F> = <<F as Fixture>::P as Provider>::Mr;
type Id<F> = <<F as Fixture>::P as Provider>::CmId;

/// One side of a connection.
pub struct Endpoint<F: Fixture> {
    /// Device.
    pub dev: Dev<F>,
    /// PD.
    pub pd: Pd<F>,
    /// Send CQ.
    pub scq: Cq<F>,
    /// Receive CQ.
    pub rcq: Cq<F>,
    /// QP.
    pub qp: Qp<F>,
    /// Arena backing `mr`.
    pub arena: Arc<DmaArena>,
    /// An MR over the whole arena (local write, remote read/write).
    pub mr: Mr<F>,
    /// CM id.
    pub id: Option<Id<F>>,
    /// Completions collected from `scq`.
    pub swc: RefCell<Vec<Wc>>,
    /// Completions collected from `rcq`.
    pub rwc: RefCell<Vec<Wc>>,
}

impl<F: Fixture> Endpoint<F> {
    /// A new endpoint with `caps` and a `mem`-byte MR.
    pub fn new(f: &F, caps: QpCaps, mem: usize, cq_depth: u32) -> Self {
        let dev = f.open();
        let pd = dev.alloc_pd().unwrap();
        let scq = dev.create_cq(cq_depth).unwrap();
        let rcq = dev.create_cq(cq_depth).unwrap();
        let qp = pd
            .create_qp(&QpInit {
                send_cq: &scq,
                recv_cq: &rcq,
                srq: None,
                caps,
                sq_sig_all: false,
            })
            .unwrap();
        let arena = f.arena(mem);
        let mr = pd
            .reg_mr(
                &arena,
                0,
                mem,
                Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
            )
            .unwrap();
        Endpoint {
            dev,
            pd,
            scq,
            rcq,
            qp,
            arena,
            mr,
            id: None,
            swc: RefCell::new(Vec::new()),
            rwc: RefCell::new(Vec::new()),
        }
    }

    /// Address of byte `off` of the MR.
    pub fn addr(&self, off: usize) -> u64 {
        self.mr.addr() + off as u64
    }

    /// An SGE over `[off, off+len)` of the MR.
    pub fn sge(&self, off: usize, len: u32) -> Sge {
        Sge {
            addr: self.addr(off),
            length: len,
            lkey: self.mr.lkey(),
        }
    }

    /// Fill bytes of the arena (test code owns the whole arena).
    pub fn fill(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.arena.len());
        // SAFETY: in bounds of the arena (checked); no WR is using the range.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.arena.base().add(off), data.len())
        }
    }

    /// Read bytes of the arena.
    pub fn read(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= self.arena.len());
        let mut v = vec![0; len];
        // SAFETY: in bounds of the arena (checked).
        unsafe { std::ptr::copy_nonoverlapping(self.arena.base().add(off), v.as_mut_ptr(), len) }
        v
    }

    /// Poll both CQs once, collecting completions. Returns false on CQ error.
    pub fn poll(&self) -> bool {
        let mut buf = [Wc::default(); 32];
        let mut ok = true;
        match self.scq.poll(&mut buf) {
            Ok(n) => self.swc.borrow_mut().extend_from_slice(&buf[..n]),
            Err(_) => ok = false,
        }
        match self.rcq.poll(&mut buf) {
            Ok(n) => self.rwc.borrow_mut().extend_from_slice(&buf[..n]),
            Err(_) => ok = false,
        }
        ok
    }

    /// Drain collected send completions.
    pub fn take_swc(&self) -> Vec<Wc> {
        std::mem::take(&mut *self.swc.borrow_mut())
    }

    /// Drain collected receive completions.
    pub fn take_rwc(&self) -> Vec<Wc> {
        std::mem::take(&mut *self.rwc.borrow_mut())
    }
}

/// Two connected endpoints (active `a`, passive `b`).
pub struct Pair<F: Fixture> {
    /// Active side.
    pub a: Endpoint<F>,
    /// Passive side.
    pub b: Endpoint<F>,
}

impl<F: Fixture> Pair<F> {
    /// Connect two fresh endpoints through the CM.
    pub fn connect(f: &F, caps: QpCaps, mem: usize) -> Self {
        Self::connect_with(f, caps, mem, 256, 7)
    }

    /// Connect with a CQ depth and the active side's RNR retry count
    /// (applied to the passive QP, as RDMA CM does) and vice versa.
    pub fn connect_with(f: &F, caps: QpCaps, mem: usize, cq_depth: u32, rnr: u8) -> Self {
        let mut a = Endpoint::new(f, caps, mem, cq_depth);
        let mut b = Endpoint::new(f, caps, mem, cq_depth);
        let addr = f.listen_addr();
        let l = b.dev.listen(&addr, 16).unwrap();
        let mut p = ConnParam::with_data(b"hello");
        p.rnr_retry_count = rnr;
        let ida = a.dev.connect(&addr, &a.qp, &p).unwrap();
        let idb = spin(|| l.get_request().unwrap()).expect("connect request");
        let mut pb = ConnParam::with_data(b"welcome");
        pb.rnr_retry_count = rnr;
        idb.accept(&b.qp, &pb).unwrap();
        let ev = spin(|| ida.get_event().unwrap()).expect("active event");
        assert!(matches!(ev, CmEvent::Established { .. }), "{ev:?}");
        let ev = spin(|| idb.get_event().unwrap()).expect("passive event");
        assert!(matches!(ev, CmEvent::Established { .. }), "{ev:?}");
        a.id = Some(ida);
        b.id = Some(idb);
        Pair { a, b }
    }

    /// Poll both sides once.
    pub fn poll(&self) {
        self.a.poll();
        self.b.poll();
    }

    /// Poll until `cond` holds (bounded by [`WAIT_LIMIT`]).
    pub fn until(&self, mut cond: impl FnMut(&Self) -> bool) {
        let start = Instant::now();
        loop {
            self.poll();
            if cond(self) {
                return;
            }
            assert!(
                start.elapsed() < WAIT_LIMIT,
                "condition not reached within {WAIT_LIMIT:?}"
            );
        }
    }
}

/// Call `f` until it returns `Some`; `None` after [`WAIT_LIMIT`].
pub fn spin<T>(mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if start.elapsed() >= WAIT_LIMIT {
            return None;
        }
        std::hint::spin_loop();
    }
}

/// Call `f` for at least `rounds` calls and at least `min` (a window in
/// which something must *not* happen; nothing is asserted about time).
pub fn for_a_while(rounds: usize, min: Duration, mut f: impl FnMut()) {
    let start = Instant::now();
    let mut n = 0;
    while n < rounds || start.elapsed() < min {
        f();
        n += 1;
    }
}
