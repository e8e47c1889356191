//! `pollux-tgt` serving NVMe/TCP beside RDMA (soft provider): the banner
//! names both, discovery lists both listeners, a TCP host with both
//! digests connects and moves data (in-capsule and by R2T), `pollux-perf`
//! runs over TCP with digests and verification, and SIGTERM closes every
//! queue of both transports.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

mod common;

use common::tcp_host::free_port;
use common::{tmp, Tgt, WAIT};

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use pollux_nvmf::host::tcp::{TcpHost, TcpHostOptions};
use pollux_nvmf::host::{discover, Controller, CtrlOptions, HostIdentity, DEFAULT_HOSTNQN};
use pollux_nvmf::spec::log_page::SUBTYPE_NVME;
use pollux_nvmf::spec::transport_id::TrType;
use pollux_reactor::mem::{DmaBuf, SgList};
use rustix::process::Signal;

const NQN: &str = "nqn.2016-06.io.pollux:tgt-tcp-test";

fn config(soft: &str, port: u16) -> String {
    format!(
        r#"cores = "0"
provider = "soft"
[transport]
max_queue_depth = 64
num_shared_buffers = 64
buf_cache_size = 8
max_srq_depth = 256
num_cqe = 4096
hugepages = "never"

[transport.tcp]
in_capsule_data_size = 4096
max_queue_depth = 64
max_io_qpairs_per_ctrlr = 4
c2h_success = true
sock_priority = 1
keepalive_idle_s = 30
keepalive_interval_s = 5
keepalive_probes = 3
digest = "allow"
max_qpairs = 64
max_qpairs_per_core = 64

[[bdev]]
spec = "malloc:name=Malloc0,size=8M,block=512"

[[subsystem]]
nqn = "{NQN}"
allow_any_host = true
namespaces = [{{ bdev = "Malloc0", nsid = 1 }}]

[[listener]]
traddr = "{soft}"

[[listener]]
trtype = "tcp"
traddr = "127.0.0.1"
trsvcid = "{port}"
"#
    )
}

fn io(qp: &mut pollux_nvmf::host::Qpair<pollux_nvmf::host::tcp::TcpQueue>, size: usize) {
    let mut w = DmaBuf::alloc(size).unwrap();
    w.as_mut_slice()
        .iter_mut()
        .enumerate()
        .for_each(|(i, x)| *x = (i * 13 + size) as u8);
    let want = w.as_slice().to_vec();
    let blocks = (size / 512) as u32;
    qp.write(1, 64, blocks, SgList::from_buf(w), 1).unwrap();
    let deadline = Instant::now() + WAIT;
    let mut wrote = false;
    while !wrote {
        assert!(
            Instant::now() < deadline,
            "write of {size} B did not complete"
        );
        qp.poll(&mut |c| {
            assert!(c.result.is_ok(), "{:?}", c.result);
            wrote = true;
        });
    }
    qp.read(
        1,
        64,
        blocks,
        SgList::from_buf(DmaBuf::alloc(size).unwrap()),
        2,
    )
    .unwrap();
    let mut got = None;
    while got.is_none() {
        assert!(
            Instant::now() < deadline,
            "read of {size} B did not complete"
        );
        qp.poll(&mut |c| {
            assert!(c.result.is_ok(), "{:?}", c.result);
            let mut have = vec![0u8; size];
            c.data.copy_to_slice(&mut have);
            got = Some(have);
        });
    }
    assert!(got.unwrap() == want, "{size} B read back differs");
}

/// The target's stats file as JSON (`Null` while it is not there yet).
fn read_stats(path: &std::path::Path) -> serde_json::Value {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default()
}

#[test]
fn serves_tcp_beside_rdma_and_shuts_both_down() {
    let soft = format!("@pollux-tgt-tcp-test-{}", std::process::id());
    let port = free_port();
    let cfg = tmp("tgt-tcp.toml");
    std::fs::write(&cfg, config(&soft, port)).unwrap();
    let stats = tmp("tgt-tcp-stats.json");
    let _ = std::fs::remove_file(&stats);
    let mut tgt = Tgt::start(&cfg, &["--stats-file", stats.to_str().unwrap()]);
    tgt.wait_line("pollux-tgt: ready");
    let banner = tgt.seen.join("\n");
    assert!(banner.contains("NVMe-oF target (rdma, tcp)"), "{banner}");
    assert!(
        banner.contains(&format!("listener 127.0.0.1:{port} (trtype tcp")),
        "{banner}"
    );
    assert!(
        banner.contains("c2h_success true sock_priority 1"),
        "{banner}"
    );
    assert!(
        banner.contains("tcp keepalive: idle 30 s, a probe every 5 s, 3 probes"),
        "{banner}"
    );
    assert!(
        banner.contains(&format!(
            "host: -r 'trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{NQN}'"
        )),
        "{banner}"
    );

    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let t = TcpHost::new(
        addr,
        TcpHostOptions {
            header_digest: true,
            data_digest: true,
            ..TcpHostOptions::default()
        },
    );
    let log = discover(&t, DEFAULT_HOSTNQN, CtrlOptions::default()).unwrap();
    let mut kinds: Vec<TrType> = log
        .iter()
        .filter(|e| e.subtype == SUBTYPE_NVME)
        .map(|e| e.trtype)
        .collect();
    kinds.sort_by_key(|k| k.code());
    assert_eq!(kinds, [TrType::Rdma, TrType::Tcp]);

    let who = HostIdentity {
        hostnqn: DEFAULT_HOSTNQN.into(),
        hostid: *b"pollux-tgt-tcp-1",
        subnqn: NQN.into(),
    };
    let mut c = Controller::connect(&t, who, CtrlOptions::default()).unwrap();
    assert_eq!(c.info().ident.subnqn, NQN);
    let mut qp = c.connect_io(&t, 1, 16, None).unwrap();
    let d = qp.transport().digests();
    assert!(d.header && d.data);
    io(&mut qp, 4096);
    io(&mut qp, 128 * 1024);
    assert!(qp.transport().stats().r2t > 0);

    // pollux-perf over TCP, both digests, data verified.
    let two = std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2;
    let out = Command::new(env!("CARGO_BIN_EXE_pollux-perf"))
        .args([
            "-r",
            &format!("trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{NQN}"),
            "--hdr-digest",
            "--data-digest",
            "-q",
            "8",
            "-o",
            "8k",
            "-w",
            "write",
            "--verify",
            "-t",
            "0.3",
            "--json",
            "--cores",
            if two { "1" } else { "0" },
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    assert!(v["iops"].as_f64().unwrap() > 0.0, "{v}");

    // pollux-perf has exited, but the target may not have read the end of
    // its connections yet (a loaded machine): wait until only this test's
    // two queues are left, so that the count below is exact.
    let deadline = Instant::now() + WAIT;
    loop {
        let v = read_stats(&stats);
        if v["connections"] == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "stats: {v}");
        qp.poll(&mut |_| {});
        std::thread::sleep(Duration::from_millis(50));
    }

    // SIGTERM: the TCP host sees its queues close, the target exits 0.
    tgt.signal(Signal::TERM);
    let deadline = Instant::now() + WAIT;
    loop {
        if c.poll().is_err() {
            break;
        }
        assert!(Instant::now() < deadline, "the host saw no disconnect");
        qp.poll(&mut |_| {});
        std::thread::yield_now();
    }
    let st = tgt.wait_exit();
    tgt.wait_line("pollux-tgt: stopped");
    let out = tgt.seen.join("\n");
    assert!(st.success(), "{st}; stdout:\n{out}");
    assert!(out.contains("disconnecting 2 queue(s)"), "{out}");
    assert!(
        out.contains("tcp limits: max_qpairs 64 max_qpairs_per_core 64"),
        "{out}"
    );
    let _ = std::fs::remove_file(&cfg);
    let _ = std::fs::remove_file(&stats);
}

/// With `--idle adaptive` the target's reactor sleeps in `epoll_wait`
/// once idle; its listener and connection sockets are wake sources, so a
/// host at queue depth 1 that pauses between I/Os is served when its
/// command arrives, not when some timer next wakes the reactor (before the
/// sockets were registered, each such I/O took about a second).
#[test]
fn an_adaptive_idle_target_wakes_for_its_tcp_sockets() {
    let soft = format!("@pollux-tgt-tcp-adaptive-{}", std::process::id());
    let port = free_port();
    let cfg = tmp("tgt-tcp-adaptive.toml");
    // The soft-RDMA listener stays: a poll group that only listens lets
    // the reactor sleep too (its listener's descriptor wakes it).
    let text = config(&soft, port).replace("keepalive_idle_s = 30", "keepalive = false");
    assert!(text.contains(&format!("[[listener]]\ntraddr = \"{soft}\"\n")));
    std::fs::write(&cfg, text).unwrap();
    let stats = tmp("tgt-tcp-adaptive-stats.json");
    let _ = std::fs::remove_file(&stats);
    let mut tgt = Tgt::start(
        &cfg,
        &[
            "--idle",
            "adaptive:100",
            "--stats-file",
            stats.to_str().unwrap(),
        ],
    );
    tgt.wait_line("pollux-tgt: ready");
    let banner = tgt.seen.join("\n");
    assert!(banner.contains("tcp keepalive: off"), "{banner}");
    let (c, mut qp) = common::tcp_host::connect(port, NQN, *b"pollux-tgt-tcp-2");
    let started = Instant::now();
    for i in 0..20u64 {
        // Long enough for the reactor to fall asleep (it sleeps after 100 us idle).
        std::thread::sleep(std::time::Duration::from_millis(5));
        let buf = SgList::from_buf(DmaBuf::alloc(4096).unwrap());
        qp.read(1, i * 8, 8, buf, i).unwrap();
        let deadline = Instant::now() + WAIT;
        let mut done = false;
        while !done {
            assert!(Instant::now() < deadline, "read {i} did not complete");
            qp.poll(&mut |cpl| {
                assert!(cpl.result.is_ok(), "{:?}", cpl.result);
                done = true;
            });
        }
    }
    let took = started.elapsed();
    // 20 x 5 ms of pauses; a reactor that slept through its sockets'
    // readiness took about a second per read.
    assert!(
        took < std::time::Duration::from_secs(8),
        "20 reads took {took:?}: the sockets do not wake the sleeping reactor"
    );
    // And it did sleep between them (the stats file is rewritten each second).
    let deadline = Instant::now() + WAIT;
    loop {
        let s = read_stats(&stats);
        if s["sleeps"][0].as_u64().unwrap_or(0) > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the reactor never slept: {s}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    drop(qp);
    drop(c);
    tgt.signal(Signal::TERM);
    let st = tgt.wait_exit();
    assert!(st.success(), "{st}");
    let _ = std::fs::remove_file(&cfg);
}

#[test]
fn tcp_listener_errors_name_line_and_field() {
    let soft = "@unused";
    for (from, to, field) in [
        ("trtype = \"tcp\"", "trtype = \"fc\"", "listener[1].trtype"),
        (
            "traddr = \"127.0.0.1\"",
            "traddr = \"localhost\"",
            "listener[1].traddr",
        ),
        (
            "sock_priority = 1",
            "sock_priority = 9",
            "transport.tcp.sock_priority",
        ),
        (
            "digest = \"allow\"",
            "digest = \"maybe\"",
            "transport.tcp.digest",
        ),
        (
            "keepalive_idle_s = 30",
            "keepalive_idle_s = 0",
            "transport.tcp.keepalive_idle_s",
        ),
        (
            "keepalive_interval_s = 5",
            "keepalive_interval_s = 40000",
            "transport.tcp.keepalive_interval_s",
        ),
        (
            "keepalive_probes = 3",
            "keepalive_probes = 0",
            "transport.tcp.keepalive_probes",
        ),
        (
            "max_qpairs = 64",
            "max_qpairs = 0",
            "transport.tcp.max_qpairs",
        ),
    ] {
        let text = config(soft, 4420).replace(from, to);
        let cfg = tmp("tgt-tcp-bad.toml");
        std::fs::write(&cfg, &text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_pollux-tgt"))
            .arg("-c")
            .arg(&cfg)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{to}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(field), "{to}: {err}");
        let _ = std::fs::remove_file(&cfg);
    }
}

/// A host that opens a TCP connection and then says nothing (no ICReq,
/// no Connect) holds a queue with no controller: `pollux-tgt` closes it
/// once `[transport] connect_timeout_ms` has passed, and the stats file
/// counts it in `connect_timeouts`.
#[test]
fn a_silent_connection_is_closed_after_the_connect_timeout_and_counted() {
    use std::io::Read;
    use std::time::Duration;
    let port = free_port();
    let text = config(
        &format!("@pollux-tgt-tcp-silent-{}", std::process::id()),
        port,
    )
    .replacen(
        "hugepages = \"never\"",
        "hugepages = \"never\"\nconnect_timeout_ms = 300",
        1,
    );
    let cfg = tmp("tgt-tcp-silent.toml");
    std::fs::write(&cfg, text).unwrap();
    let stats = tmp("tgt-tcp-silent-stats.json");
    let _ = std::fs::remove_file(&stats);
    let mut tgt = Tgt::start(&cfg, &["--stats-file", stats.to_str().unwrap()]);
    tgt.wait_line("pollux-tgt: ready");
    let start = Instant::now();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut b = [0u8; 64];
    // EOF (or a reset): the target closed it without a word.
    let n = s.read(&mut b).unwrap_or(0);
    assert_eq!(n, 0, "the target sent {n} bytes to a silent connection");
    assert!(
        start.elapsed() >= Duration::from_millis(300),
        "closed after {:?}, before the timeout",
        start.elapsed()
    );
    assert!(start.elapsed() < WAIT, "the silent connection stayed open");
    let deadline = Instant::now() + WAIT;
    loop {
        let v = read_stats(&stats);
        if v["connect_timeouts"] == 1 {
            assert_eq!(v["connections"], 0, "{v}");
            break;
        }
        assert!(Instant::now() < deadline, "stats: {v}");
        std::thread::sleep(Duration::from_millis(100));
    }
    tgt.signal(Signal::TERM);
    assert!(tgt.wait_exit().success());
    let _ = std::fs::remove_file(&cfg);
    let _ = std::fs::remove_file(&stats);
}
