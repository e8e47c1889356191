//! The startup check of the descriptor limit: a target whose
//! `RLIMIT_NOFILE` cannot hold its configured connections would otherwise
//! fail late, in `accept` or `memfd_create`, while serving.

use std::io::Write;

/// Descriptors the process holds before any connection (reactors, pools,
/// listeners, logs; generous).
const BASE_FDS: u64 = 64;

/// Descriptors one connection holds on the target, by provider: the soft
/// provider keeps the CM socket, the peer's link and MR table memfds, two
/// CQ eventfds and the peer's exposed arenas (a few per host: 12 per queue
/// measured with `pollux-perf`-like hosts, 16 leaves room); ibverbs keeps
/// none of its own (the CM channel and the device are shared).
pub fn fds_per_connection(provider_is_soft: bool) -> u64 {
    if provider_is_soft {
        16
    } else {
        0
    }
}

/// Descriptors one NVMe/TCP connection holds on the target: its socket
/// (its queue's buffers come from the target's shared pools).
pub const FDS_PER_TCP_CONNECTION: u64 = 1;

/// Descriptors needed for `connections`: `(count, descriptors each)` per
/// kind of connection.
pub fn needed(connections: &[(u64, u64)]) -> u64 {
    connections.iter().fold(BASE_FDS, |acc, &(n, per)| {
        acc.saturating_add(n.saturating_mul(per))
    })
}

/// The soft `RLIMIT_NOFILE` (`None`: unlimited or unknown).
pub fn current_limit() -> Option<u64> {
    let l = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    l.current
}

/// Write a warning to `out` (and the log) when `limit` cannot hold
/// `connections` (`(count, descriptors each)` per kind of connection);
/// returns whether it warned.
pub fn warn_if_short(
    out: &mut dyn Write,
    what: &str,
    connections: &[(u64, u64)],
    limit: Option<u64>,
) -> bool {
    let need = needed(connections);
    let Some(limit) = limit.filter(|&l| l < need) else {
        return false;
    };
    let count: u64 = connections.iter().map(|&(n, _)| n).sum();
    let msg = format!(
        "warning: the descriptor limit (RLIMIT_NOFILE {limit}) cannot hold {what} ({count} connections need about {need}); raise it (ulimit -n {need}) or lower the limit in the configuration"
    );
    log::warn!("{msg}");
    let _ = writeln!(out, "pollux-tgt: {msg}");
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warns_only_when_the_limit_is_short() {
        let mut out = Vec::new();
        assert!(!warn_if_short(&mut out, "max_qpairs", &[(10, 16)], None));
        assert!(!warn_if_short(
            &mut out,
            "max_qpairs",
            &[(10, 16)],
            Some(10_000)
        ));
        assert!(out.is_empty());
        assert!(warn_if_short(
            &mut out,
            "max_qpairs",
            &[(4096, 16)],
            Some(1024)
        ));
        let s = String::from_utf8(out).expect("utf8");
        assert!(s.contains("RLIMIT_NOFILE 1024"), "{s}");
        assert!(s.contains("max_qpairs"), "{s}");
    }

    #[test]
    fn tcp_connections_count_toward_the_limit() {
        let mut out = Vec::new();
        // 64 base + 10 * 16 RDMA = 224 fits in 300; with 1024 TCP sockets it does not.
        assert!(!warn_if_short(
            &mut out,
            "max_qpairs",
            &[(10, 16)],
            Some(300)
        ));
        let both = [(10, 16), (1024, FDS_PER_TCP_CONNECTION)];
        assert_eq!(needed(&both), 64 + 160 + 1024);
        assert!(warn_if_short(
            &mut out,
            "max_qpairs (RDMA and TCP)",
            &both,
            Some(300)
        ));
        let s = String::from_utf8(out).expect("utf8");
        assert!(s.contains("1034 connections need about 1248"), "{s}");
    }
}
