//! `recv_buf_size` / `send_buf_size` reach every accepted socket; 0 leaves
//! the kernel's. So does the TCP keep-alive (on by default).

use super::*;
use crate::host::{Controller, CtrlOptions};

/// `seen(group)` over every poll group while a host holds an admin and an
/// I/O queue on a target with `opts`.
fn of_a_connection<T>(opts: TcpOptions, seen: impl Fn(&TcpPollGroup) -> Vec<T>) -> Vec<T> {
    let f = fixture(opts);
    let out = f.cl.on(0, |_| {
        let t = f.host(false, false);
        let c = Controller::connect(&t, who(), CtrlOptions::default()).unwrap();
        let qp = c.connect_io(&t, 1, 8, None).unwrap();
        let out: Vec<T> = f.pgs.iter().flat_map(|g| seen(g)).collect();
        drop(qp);
        drop(c);
        out
    });
    f.settle();
    out
}

fn buffers_of_a_connection(opts: TcpOptions) -> Vec<(usize, usize)> {
    of_a_connection(opts, TcpPollGroup::socket_buffers)
}

#[test]
fn socket_buffer_sizes_reach_every_connection() {
    const SIZE: u32 = 96 * 1024;
    let set = buffers_of_a_connection(TcpOptions {
        recv_buf_size: SIZE,
        send_buf_size: SIZE,
        ..TcpOptions::default()
    });
    assert_eq!(set.len(), 2, "admin and I/O queue: {set:?}");
    // Linux reports twice what was set (its bookkeeping overhead).
    for (r, s) in &set {
        assert_eq!((*r, *s), (2 * SIZE as usize, 2 * SIZE as usize), "{set:?}");
    }
    let kernel = buffers_of_a_connection(TcpOptions::default());
    assert!(
        kernel
            .iter()
            .all(|&(r, s)| (r, s) != (2 * SIZE as usize, 2 * SIZE as usize)),
        "{kernel:?}"
    );
}

/// Each connection's keep-alive under `opts` (admin and I/O queue).
fn keepalives_of_a_connection(opts: TcpOptions) -> Vec<Option<(Duration, Duration, u32)>> {
    of_a_connection(opts, TcpPollGroup::socket_keepalives)
}

#[test]
fn tcp_keepalive_reaches_every_connection_and_can_be_turned_off() {
    use crate::target::tcp::TcpKeepalive;
    let d = TcpKeepalive::default();
    assert_eq!(
        keepalives_of_a_connection(TcpOptions::default()),
        vec![Some((d.idle, d.interval, d.probes)); 2],
        "the default"
    );
    let k = TcpKeepalive {
        idle: Duration::from_secs(7),
        interval: Duration::from_secs(3),
        probes: 2,
    };
    assert_eq!(
        keepalives_of_a_connection(TcpOptions {
            keepalive: Some(k),
            ..TcpOptions::default()
        }),
        vec![Some((k.idle, k.interval, k.probes)); 2]
    );
    assert_eq!(
        keepalives_of_a_connection(TcpOptions {
            keepalive: None,
            ..TcpOptions::default()
        }),
        vec![None; 2],
        "off"
    );
}
