//! `recv_buf_size` / `send_buf_size` reach every accepted socket; 0 leaves
//! the kernel's.

use super::*;
use crate::host::{Controller, CtrlOptions};

fn buffers_of_a_connection(opts: TcpOptions) -> Vec<(usize, usize)> {
    let f = fixture(opts);
    let seen = f.cl.on(0, |_| {
        let t = f.host(false, false);
        let c = Controller::connect(&t, who(), CtrlOptions::default()).unwrap();
        let qp = c.connect_io(&t, 1, 8, None).unwrap();
        let seen: Vec<(usize, usize)> = f.pgs.iter().flat_map(|g| g.socket_buffers()).collect();
        drop(qp);
        drop(c);
        seen
    });
    f.settle();
    seen
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
