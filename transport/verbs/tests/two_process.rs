//! A real two-process test of the soft provider: the test binary spawns
//! itself as the peer (`POLLUX_VERBS_CHILD=<addr>`). Covers connect with
//! private data, reject, accept, RDMA READ/WRITE as single copies between
//! the processes' arenas, SEND both ways, and peer death mid-transfer (the
//! survivor sees DISCONNECTED and flush errors; nothing hangs).

#![allow(clippy::unwrap_used, clippy::panic)]

use std::time::{Duration, Instant};

use pollux_reactor::mem::{ArenaOptions, DmaArena, HugepageMode};
use pollux_verbs::soft::{Soft, SoftCq, SOFT_DEVICE_NAME};
use pollux_verbs::*;

const CHILD_ENV: &str = "POLLUX_VERBS_CHILD";
const MEM: usize = 1 << 20;

/// Generous failure deadline; passing never depends on it.
fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(20)
}

fn wait<T>(mut f: impl FnMut() -> Option<T>) -> T {
    let d = deadline();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < d, "timed out");
        std::thread::yield_now();
    }
}

fn poll_one(cqs: &[&SoftCq]) -> Option<Wc> {
    let mut b = [Wc::default(); 1];
    for cq in cqs {
        if cq.poll(&mut b).unwrap() == 1 {
            return Some(b[0]);
        }
    }
    None
}

struct Side {
    dev: <Soft as Provider>::Device,
    _pd: <Soft as Provider>::Pd,
    scq: SoftCq,
    rcq: SoftCq,
    qp: <Soft as Provider>::Qp,
    arena: std::sync::Arc<DmaArena>,
    mr: <Soft as Provider>::Mr,
}

fn side() -> Side {
    let dev = Soft::open_device(SOFT_DEVICE_NAME).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let scq = dev.create_cq(256).unwrap();
    let rcq = dev.create_cq(256).unwrap();
    let qp = pd
        .create_qp(&QpInit {
            send_cq: &scq,
            recv_cq: &rcq,
            srq: None,
            caps: QpCaps::default(),
            sq_sig_all: false,
        })
        .unwrap();
    // Post receives before connecting (RDMA CM puts its QPs in INIT).
    qp.modify(&QpAttr::to(QpState::Init)).unwrap();
    let arena = DmaArena::new(
        MEM,
        ArenaOptions::named("2p").hugepages(HugepageMode::Never),
    )
    .unwrap();
    let mr = pd
        .reg_mr(
            &arena,
            0,
            MEM,
            Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
        )
        .unwrap();
    Side {
        dev,
        _pd: pd,
        scq,
        rcq,
        qp,
        arena,
        mr,
    }
}

impl Side {
    fn sge(&self, off: usize, len: u32) -> Sge {
        Sge {
            addr: self.mr.addr() + off as u64,
            length: len,
            lkey: self.mr.lkey(),
        }
    }
    fn fill(&self, off: usize, v: u8, len: usize) {
        assert!(off + len <= self.arena.len());
        // SAFETY: in bounds; no WR uses the range now.
        unsafe { std::ptr::write_bytes(self.arena.base().add(off), v, len) }
    }
    fn read(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= self.arena.len());
        let mut v = vec![0; len];
        // SAFETY: in bounds.
        unsafe { std::ptr::copy_nonoverlapping(self.arena.base().add(off), v.as_mut_ptr(), len) }
        v
    }
    fn recv(&self, id: u64, off: usize) {
        let s = [self.sge(off, 256)];
        self.qp
            .post_recv(&[RecvWr {
                wr_id: WrId(id),
                sg_list: &s,
            }])
            .unwrap();
    }
    fn send(&self, id: u64, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.arena.len());
        // SAFETY: in bounds; no WR uses the range now.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.arena.base().add(off), data.len())
        }
        let s = [self.sge(off, data.len() as u32)];
        self.qp
            .post_send(&[SendWr::new(WrId(id), SendOp::Send, &s).signaled()])
            .unwrap();
    }
    fn next_wc(&self) -> Wc {
        wait(|| poll_one(&[&self.scq, &self.rcq]))
    }
}

/// The child's role (active side). Does nothing in a normal test run.
#[test]
fn child_main() {
    let Ok(addr) = std::env::var(CHILD_ENV) else {
        return;
    };
    let addr = CmAddr::new(addr);
    // First attempt: expect a reject with private data.
    let s0 = side();
    let id = s0
        .dev
        .connect(&addr, &s0.qp, &ConnParam::with_data(b"first"))
        .unwrap();
    match wait(|| id.get_event().unwrap()) {
        CmEvent::Rejected {
            reason: 28,
            private_data,
        } if private_data.as_bytes().starts_with(b"busy") => {}
        e => panic!("child: expected reject, got {e:?}"),
    }
    let s = side();
    s.fill(0, 0xC1, 65536);
    s.recv(1, 512 * 1024);
    let id = s
        .dev
        .connect(&addr, &s.qp, &ConnParam::with_data(b"child-hello"))
        .unwrap();
    match wait(|| id.get_event().unwrap()) {
        CmEvent::Established { private_data } => {
            assert!(private_data.as_bytes().starts_with(b"parent-ok"))
        }
        e => panic!("child: {e:?}"),
    }
    // Tell the parent where our memory is.
    let mut info = [0u8; 12];
    info[..8].copy_from_slice(&s.mr.addr().to_le_bytes());
    info[8..].copy_from_slice(&s.mr.rkey().to_le_bytes());
    s.send(10, 600 * 1024, &info);
    // Wait for "check", verify the parent's WRITE, answer.
    let mut answered = false;
    loop {
        let _ = id.get_event();
        if let Some(w) = poll_one(&[&s.scq, &s.rcq]) {
            assert_eq!(w.status, WcStatus::Success, "child: {w:?}");
            if w.wr_id == WrId(1) && !answered {
                let ok = s.read(65536, 65536).iter().all(|&b| b == 0xA5);
                s.send(11, 700 * 1024, if ok { b"ok" } else { b"bad" });
                answered = true;
            }
        }
        // After answering: post no receives, keep polling until killed.
    }
}

#[test]
fn two_processes_connect_read_write_send_and_peer_death() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let addr = format!("@pollux-2p-{}", std::process::id());
    let p = side();
    let l = p.dev.listen(&CmAddr::new(addr.clone()), 8).unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_main", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, &addr)
        .spawn()
        .unwrap();
    // Reject the first request with private data.
    let r = wait(|| l.get_request().unwrap());
    assert!(r
        .request()
        .unwrap()
        .private_data
        .as_bytes()
        .starts_with(b"first"));
    r.reject(b"busy, retry").unwrap();
    let id = wait(|| l.get_request().unwrap());
    let req = *id.request().unwrap();
    assert_eq!(req.private_data.as_bytes().len(), 56);
    assert!(req.private_data.as_bytes().starts_with(b"child-hello"));
    p.recv(1, 0);
    p.recv(2, 4096);
    id.accept(&p.qp, &ConnParam::with_data(b"parent-ok"))
        .unwrap();
    // The child's memory info.
    let w = p.next_wc();
    assert_eq!(
        (w.wr_id, w.status, w.byte_len),
        (WrId(1), WcStatus::Success, 12)
    );
    let info = p.read(0, 12);
    let raddr = u64::from_le_bytes(info[..8].try_into().unwrap());
    let rkey = u32::from_le_bytes(info[8..].try_into().unwrap());
    // READ 64 KiB from the child, WRITE 64 KiB into it, then SEND "check".
    let rs = [p.sge(128 * 1024, 65536)];
    p.fill(256 * 1024, 0xA5, 65536);
    let ws = [p.sge(256 * 1024, 65536)];
    p.fill(8192, b'c', 5);
    let cs = [p.sge(8192, 5)];
    p.qp.post_send(&[
        SendWr::new(
            WrId(20),
            SendOp::RdmaRead {
                remote: RemoteAddr { addr: raddr, rkey },
            },
            &rs,
        )
        .signaled(),
        SendWr::new(
            WrId(21),
            SendOp::RdmaWrite {
                remote: RemoteAddr {
                    addr: raddr + 65536,
                    rkey,
                },
            },
            &ws,
        ),
        SendWr::new(WrId(22), SendOp::Send, &cs).signaled(),
    ])
    .unwrap();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let w = p.next_wc();
        assert_eq!(w.status, WcStatus::Success, "{w:?}");
        seen.push(w.wr_id.0);
    }
    seen.sort_unstable();
    assert_eq!(seen, [2, 20, 22]);
    assert!(
        p.read(128 * 1024, 65536).iter().all(|&b| b == 0xC1),
        "READ single copy"
    );
    assert_eq!(
        &p.read(4096, 2),
        b"ok",
        "the child saw our WRITE before our SEND"
    );
    // Peer death mid-transfer: the child posts no more receives, so these
    // SENDs wait (RNR, retry forever); kill the child.
    let ss = [p.sge(8192, 64)];
    let wrs = [SendWr::new(WrId(30), SendOp::Send, &ss).signaled(); 16];
    p.qp.post_send(&wrs).unwrap();
    for _ in 0..1000 {
        let _ = poll_one(&[&p.scq]);
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // ESTABLISHED (RTU) came earlier and was not consumed yet.
    wait(|| {
        id.get_event()
            .unwrap()
            .filter(|e| *e == CmEvent::Disconnected)
    });
    assert_eq!(p.qp.state(), QpState::Err);
    let mut flushed = 0;
    while flushed < 16 {
        let w = p.next_wc();
        assert_eq!((w.wr_id, w.status), (WrId(30), WcStatus::WrFlushErr));
        flushed += 1;
    }
}
