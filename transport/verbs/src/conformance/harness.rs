//! Fixture and helpers of the conformance suite.

use std::cell::RefCell;
use std::sync::Arc;

use pollux_reactor::mem::{ArenaOptions, DmaArena, HugepageMode};

use crate::cm::{CmAddr, CmEvent, ConnParam};
use crate::provider::{
    CmId, CmListener, CompletionQueue, Device, MemoryRegion, ProtectionDomain, Provider, QpInit,
};
use crate::types::{Access, QpCaps, Sge, Wc};

/// Upper bound on polling rounds while waiting for something (not time).
pub const SPIN_LIMIT: usize = 2_000_000;

/// What a provider must supply to run the suite.
pub trait Fixture {
    /// The provider under test.
    type P: Provider;
    /// Open the device to test (may be called several times).
    fn open(&self) -> <Self::P as Provider>::Device;
    /// A fresh, unused listen address.
    fn listen_addr(&self) -> CmAddr;
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

    /// Poll until `cond` holds (bounded by [`SPIN_LIMIT`] rounds).
    pub fn until(&self, mut cond: impl FnMut(&Self) -> bool) {
        for _ in 0..SPIN_LIMIT {
            self.poll();
            if cond(self) {
                return;
            }
        }
        panic!("condition not reached after {SPIN_LIMIT} polling rounds");
    }
}

/// Call `f` until it returns `Some` (bounded by [`SPIN_LIMIT`] calls).
pub fn spin<T>(mut f: impl FnMut() -> Option<T>) -> Option<T> {
    for _ in 0..SPIN_LIMIT {
        if let Some(v) = f() {
            return Some(v);
        }
        std::hint::spin_loop();
    }
    None
}
