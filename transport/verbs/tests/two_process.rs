//! A real two-process test of the soft provider: the test binary spawns
//! itself as the peer (`POLLUX_VERBS_CHILD=<addr>`). Covers connect with
//! private data, reject, accept, RDMA READ/WRITE as single copies between
//! the processes' arenas, SEND both ways, and peer death mid-transfer (the
//! survivor sees DISCONNECTED and flush errors; nothing hangs). Also: a
//! peer that registers fresh memory for every transfer and deregisters it
//! afterwards leaves no descriptors or mappings behind in this process.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::time::{Duration, Instant};

use pollux_reactor::mem::{ArenaOptions, DmaArena, HugepageMode};
use pollux_verbs::soft::{Soft, SoftCq, SOFT_DEVICE_NAME};
use pollux_verbs::*;

const CHILD_ENV: &str = "POLLUX_VERBS_CHILD";
/// The role of a child that registers a fresh MR per transfer
/// (`<addr>,regular` or `<addr>,fast-reg`).
const MR_CHILD_ENV: &str = "POLLUX_VERBS_MR_CHILD";

/// Whether this process is a spawned peer.
fn is_child() -> bool {
    std::env::var_os(CHILD_ENV).is_some() || std::env::var_os(MR_CHILD_ENV).is_some()
}

/// The parent tests run one at a time: the release test counts this
/// process's descriptors and mappings.
fn serial() -> pollux_reactor::sync::MutexGuard<'static, ()> {
    static SERIAL: pollux_reactor::sync::Mutex<()> = pollux_reactor::sync::Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
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
    pd: <Soft as Provider>::Pd,
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
        pd,
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
#[ignore = "child process entry point, spawned by spawn_peer"]
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
    if is_child() {
        return;
    }
    let (_serial, addr, p, l) = listening_parent("");
    let mut child = spawn_peer("child_main", CHILD_ENV, &addr);
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
    child.kill();
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

/// Transfers in the release test (the first [`WARM_UP`] set the baseline).
const ROUNDS: u8 = 40;
const WARM_UP: u8 = 4;
/// Bytes of each fresh peer buffer, and of each WRITE into it.
const FRESH: usize = 64 * 1024;
const WRITE: u32 = 4096;

/// Open descriptors and mapping lines of this process.
fn fds_and_maps() -> (usize, usize) {
    let fds = std::fs::read_dir("/proc/self/fd").unwrap().count();
    let maps = std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .count();
    (fds, maps)
}

/// The peer of the release test: per round a fresh arena and MR (a regular
/// MR with remote rights, or a local one exposed by a fast registration),
/// its address and key sent to the parent, the parent's WRITE checked, then
/// the MR deregistered and the arena dropped. Finally a zero key: "all
/// released". Does nothing in a normal test run.
#[test]
#[ignore = "child process entry point, spawned by spawn_peer"]
fn mr_child_main() {
    let Ok(arg) = std::env::var(MR_CHILD_ENV) else {
        return;
    };
    let (addr, mode) = arg.rsplit_once(',').unwrap();
    let fast_reg = mode == "fast-reg";
    let s = side();
    let fr = fast_reg.then(|| s.pd.alloc_fast_reg_mr(16).unwrap());
    s.recv(1, 0);
    let id = s
        .dev
        .connect(&CmAddr::new(addr), &s.qp, &ConnParam::with_data(b"mr"))
        .unwrap();
    match wait(|| id.get_event().unwrap()) {
        CmEvent::Established { .. } => {}
        e => panic!("mr child: {e:?}"),
    }
    let wait_ok = |want: WrId| {
        let w = s.next_wc();
        assert_eq!((w.wr_id, w.status), (want, WcStatus::Success), "mr child");
    };
    for round in 0..ROUNDS {
        let arena = DmaArena::new(
            FRESH,
            ArenaOptions::named("2p-fresh").hugepages(HugepageMode::Never),
        )
        .unwrap();
        let remote = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let (mr, key) = match &fr {
            None => {
                let mr = s.pd.reg_mr(&arena, 0, FRESH, remote).unwrap();
                let key = mr.rkey();
                (mr, key)
            }
            Some(fr) => {
                let mr = s.pd.reg_mr(&arena, 0, FRESH, Access::LOCAL_WRITE).unwrap();
                let key = fr.next_key();
                let pages = [Sge {
                    addr: mr.addr(),
                    length: FRESH as u32,
                    lkey: mr.lkey(),
                }];
                let op = SendOp::RegMr {
                    key,
                    iova: mr.addr(),
                    access: remote,
                };
                s.qp.post_send(&[SendWr::new(WrId(2), op, &pages).signaled()])
                    .unwrap();
                wait_ok(WrId(2));
                (mr, key)
            }
        };
        let mut info = [0u8; 12];
        info[..8].copy_from_slice(&mr.addr().to_le_bytes());
        info[8..].copy_from_slice(&key.to_le_bytes());
        s.send(3, 4096, &info);
        wait_ok(WrId(3));
        wait_ok(WrId(1));
        s.recv(1, 0);
        let mut got = vec![0u8; WRITE as usize];
        arena.copy_out(0, &mut got).unwrap();
        assert!(got.iter().all(|&b| b == round), "mr child: round {round}");
        if let Some(fr) = &fr {
            let inv = SendOp::LocalInv { key: fr.lkey() };
            s.qp.post_send(&[SendWr::new(WrId(4), inv, &[]).signaled()])
                .unwrap();
            wait_ok(WrId(4));
        }
        drop(mr);
        drop(arena);
    }
    s.send(3, 4096, &[0; 12]);
    wait_ok(WrId(3));
    wait(|| {
        id.get_event()
            .unwrap()
            .filter(|e| *e == CmEvent::Disconnected)
    });
}

/// A spawned peer, killed when the test ends (passed or failed).
struct Child(std::process::Child);

impl Child {
    /// Kill the peer now and reap it.
    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The parent's start: the tests' turn (see [`serial`]), an address
/// named by `tag`, a side and its listener.
fn listening_parent(
    tag: &str,
) -> (
    pollux_reactor::sync::MutexGuard<'static, ()>,
    String,
    Side,
    <Soft as Provider>::CmListener,
) {
    let turn = serial();
    let addr = format!("@pollux-2p-{tag}{}", std::process::id());
    let p = side();
    let l = p.dev.listen(&CmAddr::new(addr.clone()), 8).unwrap();
    (turn, addr, p, l)
}

/// This test binary again, running only test `role` (an ignored entry
/// point) with `env=value`.
fn spawn_peer(role: &str, env: &str, value: &str) -> Child {
    Child(
        pollux_reactor::test_env::child_test(role)
            .env(env, value)
            .spawn()
            .unwrap(),
    )
}

/// The responder's side of [`mr_child_main`]: WRITE into each fresh peer
/// buffer; this process's descriptors and mappings stay at their level
/// after the warm-up, and the last peer buffer's are gone once the peer
/// deregistered it.
fn peer_mrs_are_released(mode: &str) {
    if is_child() {
        return;
    }
    let (_serial, addr, p, l) = listening_parent(&format!("mr-{mode}-"));
    let _child = spawn_peer("mr_child_main", MR_CHILD_ENV, &format!("{addr},{mode}"));
    let id = wait(|| l.get_request().unwrap());
    p.recv(1, 0);
    id.accept(&p.qp, &ConnParam::with_data(b"ok")).unwrap();
    let mut base = None;
    let mut last = (0, 0);
    for round in 0..=ROUNDS {
        let w = p.next_wc();
        assert_eq!((w.wr_id, w.status), (WrId(1), WcStatus::Success), "{w:?}");
        let info = p.read(0, 12);
        p.recv(1, 0);
        let raddr = u64::from_le_bytes(info[..8].try_into().unwrap());
        let rkey = u32::from_le_bytes(info[8..].try_into().unwrap());
        if rkey == 0 {
            break;
        }
        p.fill(8192, round, WRITE as usize);
        let ws = [p.sge(8192, WRITE)];
        let remote = RemoteAddr { addr: raddr, rkey };
        p.qp.post_send(&[SendWr::new(WrId(2), SendOp::RdmaWrite { remote }, &ws).signaled()])
            .unwrap();
        let w = p.next_wc();
        assert_eq!((w.wr_id, w.status), (WrId(2), WcStatus::Success), "{w:?}");
        last = fds_and_maps();
        if round < WARM_UP {
            base = Some(last);
        }
        let (b_fds, b_maps) = base.unwrap();
        assert!(
            last.0 <= b_fds && last.1 <= b_maps + 4,
            "round {round}: {last:?} descriptors and mapping lines, {:?} after the warm-up",
            (b_fds, b_maps)
        );
        p.send(3, 16384, &[1]);
        let w = p.next_wc();
        assert_eq!((w.wr_id, w.status), (WrId(3), WcStatus::Success), "{w:?}");
    }
    // The peer deregistered its last MR and dropped its arena before its
    // final SEND: what it announced on the way is read with the next poll.
    let _ = id.get_event().unwrap();
    let (fds, _) = fds_and_maps();
    assert!(
        fds < last.0,
        "the last peer buffer's descriptor is closed: {fds}, {} while it was registered",
        last.0
    );
}

#[test]
fn a_peer_registering_fresh_memory_per_transfer_leaves_nothing_behind() {
    peer_mrs_are_released("regular");
}

#[test]
fn a_peer_fast_registering_fresh_memory_per_transfer_leaves_nothing_behind() {
    peer_mrs_are_released("fast-reg");
}
