use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::*;

fn ring_with<B: StableBuf>(cfg: SockRingConfig) -> Option<SockRing<B>> {
    match SockRing::new(cfg) {
        Ok(r) => Some(r),
        Err(e) => {
            crate::test_env::skip(
                &format!("an io_uring socket ring ({e})"),
                "run on a recent Linux kernel with io_uring enabled \
                 (kernel.io_uring_disabled=0, not blocked by seccomp)",
            );
            None
        }
    }
}

fn ring<B: StableBuf>() -> Option<SockRing<B>> {
    ring_with(SockRingConfig::default())
}

/// A connected pair: (client side, server side).
fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    (c, s)
}

/// What one event said, owned.
enum Ev<B> {
    Recv(SockId, Vec<u8>),
    RecvEnd(SockId, Option<i32>),
    Sent(SockId, SendList<B>, Result<usize, io::ErrorKind>),
    Closed(SockId),
}

impl<B> fmt::Debug for Ev<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ev::Recv(s, d) => write!(f, "Recv({s:?}, {} bytes)", d.len()),
            Ev::RecvEnd(s, e) => write!(f, "RecvEnd({s:?}, {e:?})"),
            Ev::Sent(s, l, r) => write!(f, "Sent({s:?}, {l:?}, {r:?})"),
            Ev::Closed(s) => write!(f, "Closed({s:?})"),
        }
    }
}

/// Submits and reaps until `done` says so (10 s at most).
fn run_until<B: StableBuf>(
    r: &mut SockRing<B>,
    mut done: impl FnMut(&[Ev<B>]) -> bool,
) -> Vec<Ev<B>> {
    let mut evs = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done(&evs) {
        assert!(Instant::now() < deadline, "timed out; events: {evs:?}");
        r.submit().unwrap();
        r.reap(64, |ev| {
            evs.push(match ev {
                SockEvent::Recv { sock, data } => Ev::Recv(sock, data.to_vec()),
                SockEvent::RecvEnd { sock, error } => {
                    Ev::RecvEnd(sock, error.and_then(|e| e.raw_os_error()))
                }
                SockEvent::Sent { sock, list, result } => {
                    Ev::Sent(sock, list, result.map_err(|e| e.kind()))
                }
                SockEvent::Closed { sock } => Ev::Closed(sock),
            })
        });
    }
    evs
}

fn received<B>(evs: &[Ev<B>]) -> Vec<u8> {
    let mut v = Vec::new();
    for e in evs {
        if let Ev::Recv(_, d) = e {
            v.extend_from_slice(d);
        }
    }
    v
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn loopback_echo() {
    let Some(mut r) = ring::<Vec<u8>>() else {
        return;
    };
    let (mut c, s) = pair();
    let id = r.attach(s.into()).unwrap();
    c.write_all(b"ping 1234").unwrap();
    let evs = run_until(&mut r, |e| received(e).len() >= 9);
    assert_eq!(received(&evs), b"ping 1234");
    assert!(matches!(evs[0], Ev::Recv(sock, _) if sock == id));

    // Echo it: copied header bytes, then a held buffer's slice.
    let mut list = SendList::with_capacity(64, 4);
    list.push_bytes(b"echo:");
    list.push_buf_range(received(&evs), 5, 4);
    assert_eq!(list.len(), 9);
    r.send(id, list).unwrap();
    assert!(r.is_sending(id));
    let evs = run_until(&mut r, |e| e.iter().any(|e| matches!(e, Ev::Sent(..))));
    match &evs[..] {
        [Ev::Sent(sock, list, Ok(9))] => {
            assert_eq!(*sock, id);
            assert_eq!(list.len(), 9);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(!r.is_sending(id));
    let mut got = [0u8; 9];
    c.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"echo:1234");
    assert_eq!(r.stats().sends, 1);
    assert!(r.stats().recvs >= 1);
}

#[test]
fn a_second_send_waits_for_the_first() {
    let Some(mut r) = ring::<Vec<u8>>() else {
        return;
    };
    let (mut c, s) = pair();
    let id = r.attach(s.into()).unwrap();
    let mut a = SendList::new();
    a.push_buf(b"first ".to_vec());
    r.send(id, a).unwrap();
    let mut b = SendList::new();
    b.push_bytes(b"second");
    let b = match r.send(id, b) {
        Err(SendError::Busy(b)) => b,
        other => panic!("expected Busy, got {other:?}"),
    };
    run_until(&mut r, |e| !e.is_empty());
    r.send(id, b).unwrap();
    run_until(&mut r, |e| !e.is_empty());
    let mut got = [0u8; 12];
    c.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"first second");
}

#[test]
fn short_sends_are_continued_in_order() {
    let Some(mut r) = ring::<Rc<[u8]>>() else {
        return;
    };
    let (mut c, s) = pair();
    // A small send buffer and a peer that reads late: the kernel takes the
    // list in pieces.
    rustix::net::sockopt::set_socket_send_buffer_size(&s, 16 * 1024).unwrap();
    let id = r.attach(s.into()).unwrap();
    // 3000 stretches (more than one sendmsg's 1024 iovecs), 6 MiB in all:
    // a header copied into the list, then 2 KiB of a shared buffer.
    let data: Rc<[u8]> = pattern(4096, 7).into();
    let mut list = SendList::with_capacity(3000 * 8, 6000);
    let mut want = Vec::new();
    for i in 0..3000u32 {
        list.push_bytes(&i.to_le_bytes());
        want.extend_from_slice(&i.to_le_bytes());
        let off = (i as usize * 13) % 2048;
        list.push_buf_range(data.clone(), off, 2048);
        want.extend_from_slice(&data[off..off + 2048]);
    }
    assert_eq!(list.len(), want.len());
    r.send(id, list).unwrap();
    let total = want.len();
    let reader = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        let mut got = vec![0u8; total];
        c.read_exact(&mut got).unwrap();
        (got, c)
    });
    let evs = run_until(&mut r, |e| e.iter().any(|e| matches!(e, Ev::Sent(..))));
    let (got, _c) = reader.join().unwrap();
    assert!(got == want, "stream differs");
    match evs.iter().find(|e| matches!(e, Ev::Sent(..))) {
        Some(Ev::Sent(_, list, Ok(n))) => {
            assert_eq!(*n, total);
            assert_eq!(list.len(), total);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(r.stats().send_continues > 0, "{:?}", r.stats());
    // The list's shared buffers come back with it and can be dropped.
    assert_eq!(Rc::strong_count(&data), 3001);
    if let Some(Ev::Sent(_, mut list, _)) = evs.into_iter().find(|e| matches!(e, Ev::Sent(..))) {
        assert_eq!(list.drain_bufs().count(), 3000);
        assert!(list.is_empty());
    }
    assert_eq!(Rc::strong_count(&data), 1);
}

#[test]
fn few_small_provided_buffers_rearm_and_keep_order() {
    let cfg = SockRingConfig {
        entries: 8,
        bufs: 2,
        buf_size: 64,
        taskrun: TaskRun::Defer,
    };
    let Some(mut r) = ring_with::<Vec<u8>>(cfg) else {
        return;
    };
    let (mut c, s) = pair();
    r.attach(s.into()).unwrap();
    let want = pattern(10_000, 3);
    c.write_all(&want).unwrap();
    let evs = run_until(&mut r, |e| received(e).len() >= want.len());
    assert!(received(&evs) == want, "stream differs");
    assert!(evs
        .iter()
        .all(|e| matches!(e, Ev::Recv(_, d) if d.len() <= 64)));
    assert!(r.stats().recv_rearms > 0, "{:?}", r.stats());
}

#[test]
fn every_taskrun_mode_receives_and_sends() {
    for taskrun in [TaskRun::Interrupt, TaskRun::Coop, TaskRun::Defer] {
        let cfg = SockRingConfig {
            taskrun,
            ..SockRingConfig::default()
        };
        let Some(mut r) = ring_with::<Box<[u8]>>(cfg) else {
            continue;
        };
        let (mut c, s) = pair();
        let id = r.attach(s.into()).unwrap();
        c.write_all(b"abc").unwrap();
        let evs = run_until(&mut r, |e| received(e).len() >= 3);
        assert_eq!(received(&evs), b"abc", "{taskrun:?}");
        let mut list = SendList::new();
        list.push_buf(b"xyz".to_vec().into_boxed_slice());
        r.send(id, list).unwrap();
        run_until(&mut r, |e| !e.is_empty());
        let mut got = [0u8; 3];
        c.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"xyz", "{taskrun:?}");
    }
}

#[test]
fn peer_close_ends_the_receive_and_fails_sends() {
    let Some(mut r) = ring::<Vec<u8>>() else {
        return;
    };
    let (c, s) = pair();
    let id = r.attach(s.into()).unwrap();
    drop(c);
    let evs = run_until(&mut r, |e| e.iter().any(|e| matches!(e, Ev::RecvEnd(..))));
    assert!(
        matches!(evs.last(), Some(Ev::RecvEnd(sock, None)) if *sock == id),
        "{evs:?}"
    );
    // The first send may still be taken (the peer answers it with a
    // reset); a later one fails.
    let mut failed = None;
    for _ in 0..10 {
        let mut list = SendList::new();
        list.push_bytes(&[1u8; 1000]);
        r.send(id, list).unwrap();
        let evs = run_until(&mut r, |e| !e.is_empty());
        if let Some(Ev::Sent(_, _, Err(k))) = evs.last() {
            failed = Some(*k);
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let k = failed.expect("a send to a closed peer fails");
    assert!(
        matches!(
            k,
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
        ),
        "{k:?}"
    );
    r.close(id).unwrap();
    assert!(r.close(id).is_err(), "closing twice");
    let evs = run_until(&mut r, |e| !e.is_empty());
    assert!(
        matches!(evs[..], [Ev::Closed(sock)] if sock == id),
        "{evs:?}"
    );
    assert_eq!(r.sockets(), 0);
}

/// An attached socket with a small send buffer, an 8 MiB send in flight
/// on it and a peer (returned) that reads nothing.
fn stuck_send(r: &mut SockRing<Vec<u8>>) -> (TcpStream, SockId) {
    let (c, s) = pair();
    rustix::net::sockopt::set_socket_send_buffer_size(&s, 4096).unwrap();
    let id = r.attach(s.into()).unwrap();
    let mut list = SendList::new();
    list.push_buf(vec![5u8; 8 << 20]);
    r.send(id, list).unwrap();
    r.submit().unwrap();
    (c, id)
}

#[test]
fn close_with_a_receive_armed_and_a_send_stuck() {
    let Some(mut r) = ring::<Vec<u8>>() else {
        return;
    };
    // The peer reads nothing: the send waits for room until the close.
    let (c, id) = stuck_send(&mut r);
    r.close(id).unwrap();
    let mut list = SendList::new();
    list.push_bytes(b"late");
    assert!(matches!(r.send(id, list), Err(SendError::NoSocket(_))));
    let evs = run_until(&mut r, |e| e.iter().any(|e| matches!(e, Ev::Closed(..))));
    assert!(
        evs.iter().any(|e| matches!(e, Ev::Sent(_, _, Err(_)))),
        "{evs:?}"
    );
    assert!(matches!(evs.last(), Some(Ev::Closed(sock)) if *sock == id));
    drop(c);
}

#[test]
fn drop_with_a_send_stuck_returns() {
    let Some(mut r) = ring::<Vec<u8>>() else {
        return;
    };
    let (_c, _id) = stuck_send(&mut r);
    let t = Instant::now();
    drop(r);
    assert!(t.elapsed() < DROP_WAIT, "drop waited {:?}", t.elapsed());
}

#[test]
fn bad_configs_are_refused() {
    for cfg in [
        SockRingConfig {
            entries: 3,
            ..SockRingConfig::default()
        },
        SockRingConfig {
            bufs: 0,
            ..SockRingConfig::default()
        },
        SockRingConfig {
            buf_size: 0,
            ..SockRingConfig::default()
        },
    ] {
        assert!(matches!(
            SockRing::<Vec<u8>>::new(cfg),
            Err(SockRingError::InvalidConfig(_))
        ));
    }
}

#[test]
fn send_list_bookkeeping() {
    let mut l: SendList<Vec<u8>> = SendList::new();
    assert!(l.is_empty());
    l.push_bytes(b"ab");
    l.push_bytes(b"cd");
    l.push_buf_range(vec![1, 2, 3], 2, 10);
    l.push_buf(Vec::new());
    assert_eq!(l.len(), 5);
    assert_eq!(l.segs.len(), 2, "adjacent bytes merge; empty slices vanish");
    l.build_iov();
    assert_eq!(l.iov.len(), 2);
    assert_eq!(l.iov[0].iov_len, 4);
    assert_eq!(l.iov[1].iov_len, 1);
    l.clear();
    assert!(l.is_empty());
    assert_eq!(l.drain_bufs().count(), 0);
}
