//! [`free_tcp_port`]: a TCP port for a test's listener. Behind the
//! `test-util` feature.
//!
//! The usual trick, binding port 0 and closing the socket, hands out a port
//! from the kernel's ephemeral range: between the close and the test's own
//! `listen`, any outgoing connection (another test's host, in the same
//! process) may be given that port as its source, and the listen fails with
//! "Address already in use". Ports below the ephemeral range are never
//! given to outgoing connections, so a port found free there stays free
//! until a listener takes it.
//!
//! The probe binds the port without listening (with `SO_REUSEADDR`, as
//! every listener of this project and of std has): a bound socket that
//! listens conflicts with any later `listen` on the port until the last
//! copy of its descriptor closes, and a child that another test thread
//! forks at that moment holds a copy until it `exec`s, so the test's own
//! `listen` failed with "Address already in use" now and then. A bound,
//! non-listening probe still finds a port that something listens on (that
//! bind fails), and a copy of it blocks no listener.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};

use rustix::net::{self as rnet, sockopt, AddressFamily, SocketType};

/// The lowest port handed out.
const FIRST: u32 = 10_000;

/// The low end of the kernel's ephemeral port range (32768 by default).
fn ephemeral_low() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// A TCP port on `ip` that nobody listens on now and that the kernel does
/// not give to outgoing connections (below the ephemeral range). Each call
/// in a process returns a different port; processes start at different
/// places (by process id). Falls back to an ephemeral port (bind to port 0)
/// when the ephemeral range leaves no room below it.
///
/// # Panics
///
/// When `ip` is not a local address.
pub fn free_tcp_port(ip: &str) -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let span = ephemeral_low()
        .saturating_sub(FIRST)
        .min(u32::from(u16::MAX) - FIRST);
    if span >= 1_000 {
        let start = std::process::id().wrapping_mul(7_919) % span;
        for _ in 0..span {
            let port = FIRST + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
            if probe(ip, port as u16).is_ok() {
                return port as u16;
            }
        }
    }
    std::net::TcpListener::bind((ip, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no TCP port on {ip}: {e}"))
}

/// Bind a TCP socket with `SO_REUSEADDR` to `ip`:`port` without listening,
/// then close it: `Ok` when nothing listens there (see the module docs).
fn probe(ip: &str, port: u16) -> std::io::Result<()> {
    let ip: IpAddr = ip
        .parse()
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let addr = SocketAddr::new(ip, port);
    let family = match ip {
        IpAddr::V4(_) => AddressFamily::INET,
        IpAddr::V6(_) => AddressFamily::INET6,
    };
    let sock = rnet::socket_with(family, SocketType::STREAM, rnet::SocketFlags::CLOEXEC, None)?;
    sockopt::set_socket_reuseaddr(&sock, true)?;
    rnet::bind(&sock, &addr)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_below_the_ephemeral_range_and_listenable() {
        let low = ephemeral_low();
        let a = free_tcp_port("127.0.0.1");
        let b = free_tcp_port("127.0.0.1");
        assert_ne!(a, b);
        for p in [a, b] {
            if low > FIRST + 1_000 {
                assert!(
                    u32::from(p) >= FIRST && u32::from(p) < low,
                    "{p} (ephemeral from {low})"
                );
            }
            std::net::TcpListener::bind(("127.0.0.1", p)).expect("the port can be listened on");
        }
    }

    #[test]
    fn a_port_something_listens_on_is_not_handed_out() {
        let p = free_tcp_port("127.0.0.1");
        let l = std::net::TcpListener::bind(("127.0.0.1", p)).unwrap();
        assert!(probe("127.0.0.1", p).is_err(), "{p} is taken by a listener");
        drop(l);
        assert!(probe("127.0.0.1", p).is_ok());
    }

    /// A copy of the probe's socket that outlives it (as in a child forked
    /// by another thread before its `exec`) does not keep the test's
    /// listener from the port.
    #[test]
    fn a_lingering_copy_of_the_probe_blocks_no_listener() {
        let p = free_tcp_port("127.0.0.1");
        let addr: SocketAddr = format!("127.0.0.1:{p}").parse().unwrap();
        let copy = rnet::socket(AddressFamily::INET, SocketType::STREAM, None).unwrap();
        sockopt::set_socket_reuseaddr(&copy, true).unwrap();
        rnet::bind(&copy, &addr).unwrap();
        std::net::TcpListener::bind(addr).expect("listen beside a bound copy");
    }
}
