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

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

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
            if TcpListener::bind((ip, port as u16)).is_ok() {
                return port as u16;
            }
        }
    }
    TcpListener::bind((ip, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no TCP port on {ip}: {e}"))
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
            TcpListener::bind(("127.0.0.1", p)).expect("the port can be listened on");
        }
    }
}
