//! Target and host in two network namespaces joined by a veth pair: a
//! real network path (10.250.N.1 ↔ 10.250.N.2), no VM. The test creates
//! the namespaces and the pair and removes them even when it fails; it is
//! skipped (`pollux_reactor::test_env::skip`: a failure in a strict run)
//! when not run as root or without `ip`.
//!
//! Namespaces are per thread: the test thread enters the target's
//! namespace to bind the listener, the host's to connect (a socket stays
//! in the namespace it was created in), and returns to its own.

use std::fs::File;
use std::os::fd::AsFd;
use std::process::Command;

use pollux_reactor::mem::{DmaBuf, SgList};
use rustix::thread::{move_into_link_name_space, LinkNameSpaceType};

use super::*;
use crate::host::{Controller, CtrlOptions};

/// Run `ip args`; `Err` with its stderr when it fails.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The two namespaces (and with them the veth pair); removed on drop.
struct Namespaces {
    names: Vec<String>,
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for n in &self.names {
            if let Err(e) = ip(&["netns", "del", n]) {
                eprintln!("cleanup: {e}");
            }
        }
    }
}

fn enter(path: &str) {
    let f = File::open(path).unwrap();
    move_into_link_name_space(f.as_fd(), Some(LinkNameSpaceType::Network)).unwrap();
}

/// Enters the thread's own namespace again when dropped.
struct Home(File);

impl Drop for Home {
    fn drop(&mut self) {
        if let Err(e) = move_into_link_name_space(self.0.as_fd(), Some(LinkNameSpaceType::Network))
        {
            eprintln!("cannot return to the test's network namespace: {e}");
        }
    }
}

fn skip_reason() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("root (this process is not)".into());
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Some("the `ip` tool (not installed)".into());
    }
    None
}

/// A target with `opts` in one of two new namespaces joined by a veth pair
/// (10.250.N.1 and .2, names tagged with `tag`), this thread in the other
/// (the host's): what the tests
/// hold until their end. `None` when the test is skipped (not root, no
/// `ip`).
struct Across {
    f: Fx,
    /// This thread's own namespace, entered again when dropped.
    home: Home,
    ns: Namespaces,
    /// The host's namespace and its end of the pair.
    host_ns: String,
    host_veth: String,
}

fn across_a_veth_pair(tag: &str, opts: TcpOptions) -> Option<Across> {
    if let Some(why) = skip_reason() {
        pollux_reactor::test_env::skip(
            &why,
            "run as root (CAP_SYS_ADMIN, CAP_NET_ADMIN) with iproute2's `ip` installed",
        );
        return None;
    }
    let pid = std::process::id();
    let net = 1 + (pid + u32::from(!tag.is_empty())) % 250;
    let (ta, tb) = (
        format!("pollux-tgt-{tag}{pid}"),
        format!("pollux-host-{tag}{pid}"),
    );
    let (va, vb) = (format!("pxt{tag}{pid}"), format!("pxh{tag}{pid}"));
    let mut ns = Namespaces { names: Vec::new() };
    for n in [&ta, &tb] {
        ip(&["netns", "add", n]).unwrap();
        ns.names.push(n.clone());
    }
    let (a_ip, b_ip) = (format!("10.250.{net}.1"), format!("10.250.{net}.2"));
    ip(&[
        "link", "add", &va, "netns", &ta, "type", "veth", "peer", "name", &vb, "netns", &tb,
    ])
    .unwrap();
    for (n, v, addr) in [(&ta, &va, &a_ip), (&tb, &vb, &b_ip)] {
        ip(&["-n", n, "addr", "add", &format!("{addr}/24"), "dev", v]).unwrap();
        ip(&["-n", n, "link", "set", v, "up"]).unwrap();
        ip(&["-n", n, "link", "set", "lo", "up"]).unwrap();
    }
    let home = Home(File::open("/proc/thread-self/ns/net").unwrap());
    enter(&format!("/run/netns/{ta}"));
    let f = fixture_at(&a_ip, opts);
    enter(&format!("/run/netns/{tb}"));
    Some(Across {
        f,
        home,
        ns,
        host_ns: tb,
        host_veth: vb,
    })
}

#[test]
fn tcp_across_two_network_namespaces_over_a_veth_pair() {
    let Some(Across { f, home, ns, .. }) = across_a_veth_pair("", TcpOptions::default()) else {
        return;
    };
    f.cl.on(0, |r| {
        let t = f.host(true, true);
        let c = Controller::connect(&t, who(), CtrlOptions::default()).unwrap();
        let mut qp = c.connect_io(&t, 1, 16, None).unwrap();
        for (i, size) in [512usize, 65536, 1 << 20].into_iter().enumerate() {
            let mut b = DmaBuf::alloc(size).unwrap();
            b.as_mut_slice()
                .iter_mut()
                .enumerate()
                .for_each(|(k, x)| *x = (k * 7 + i) as u8);
            let want = b.as_slice().to_vec();
            let lba = (i as u64) * 4096;
            qp.write(1, lba, (size / 512) as u32, SgList::from_buf(b), 1)
                .unwrap();
            let mut done = None;
            for _ in 0..2_000_000 {
                qp.poll(&mut |c| done = Some(c));
                if done.is_some() {
                    break;
                }
                r.poll_once();
            }
            assert!(done.take().unwrap().result.is_ok());
            qp.read(
                1,
                lba,
                (size / 512) as u32,
                SgList::from_buf(DmaBuf::alloc(size).unwrap()),
                2,
            )
            .unwrap();
            for _ in 0..2_000_000 {
                qp.poll(&mut |c| done = Some(c));
                if done.is_some() {
                    break;
                }
                r.poll_once();
            }
            let c = done.unwrap();
            assert!(c.result.is_ok());
            let mut have = vec![0u8; size];
            c.data.copy_to_slice(&mut have);
            assert!(have == want, "{size} B across the veth pair miscompared");
        }
    });
    drop(home);
    f.settle();
    f.assert_pool_full();
    drop(ns);
}

/// A host that vanishes without a FIN or a reset (its end of the veth pair
/// goes down) after connecting a controller with no NVMe keep-alive (KATO
/// 0): the target's TCP keep-alive (here 1 s idle, 1 s between probes, 2
/// probes) ends the connection, and everything it held returns. The bound
/// on the wait is generous; without keep-alive nothing would ever end it.
#[test]
fn a_host_that_vanishes_silently_is_ended_by_tcp_keepalive() {
    use crate::target::tcp::TcpKeepalive;
    let opts = TcpOptions {
        keepalive: Some(TcpKeepalive {
            idle: Duration::from_secs(1),
            interval: Duration::from_secs(1),
            probes: 2,
        }),
        ..TcpOptions::default()
    };
    let Some(Across {
        f,
        home,
        ns,
        host_ns,
        host_veth,
    }) = across_a_veth_pair("k", opts)
    else {
        return;
    };
    let held = f.cl.on(0, |_| {
        let t = f.host(false, false);
        let o = CtrlOptions {
            kato: Duration::ZERO,
            ..CtrlOptions::default()
        };
        let c = Controller::connect(&t, who(), o).unwrap();
        let qp = c.connect_io(&t, 1, 16, None).unwrap();
        (t, c, qp)
    });
    drop(home);
    until_connections(&f, 2);
    // The host's end goes away: nothing it sends or answers gets through.
    ip(&["-n", &host_ns, "link", "set", &host_veth, "down"]).unwrap();
    let start = std::time::Instant::now();
    while f.transport.queues_per_group().iter().sum::<usize>() > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the target still holds {:?} connections of a vanished host",
            f.transport.queues_per_group()
        );
        f.cl.poll_once_all();
    }
    assert!(
        start.elapsed() >= Duration::from_secs(1),
        "ended before any keep-alive probe could have failed"
    );
    f.assert_pool_full();
    drop(held);
    drop(ns);
}
