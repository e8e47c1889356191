//! Both ends of a soft-provider connection in one thread, for profiling the
//! data path with deterministic instruction counts:
//!
//! ```text
//! cargo build --release -p pollux-verbs --example soft_loop
//! valgrind --tool=callgrind target/release/examples/soft_loop send 200000 32
//! ```
//!
//! Modes: `send` (64-byte SENDs in batches, receives re-posted in batches)
//! and `write` (4 KiB RDMA WRITEs in batches).

#![allow(clippy::unwrap_used)]

use pollux_verbs::conformance::{Pair, SoftFixture};
use pollux_verbs::*;

const F: SoftFixture = SoftFixture::new("pollux-loop");

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map_or("send", String::as_str).to_owned();
    let iters: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(200_000);
    let batch: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(32);
    let caps = QpCaps {
        max_send_wr: 1024,
        max_recv_wr: 1024,
        ..QpCaps::default()
    };
    let p = Pair::connect_with(&F, caps, 1 << 20, 4096, 7);
    let size = if mode == "write" { 4096 } else { 64 };
    let ss = [p.a.sge(0, size)];
    let rs = [p.b.sge(65536, size)];
    let recvs = vec![
        RecvWr {
            wr_id: WrId(0),
            sg_list: &rs,
        };
        batch
    ];
    if mode == "send" {
        p.b.qp.post_recv(&recvs).unwrap();
    }
    let remote = RemoteAddr {
        addr: p.b.addr(131072),
        rkey: p.b.mr.rkey(),
    };
    let op = if mode == "write" {
        SendOp::RdmaWrite { remote }
    } else {
        SendOp::Send
    };
    let mut wrs = vec![SendWr::new(WrId(0), op, &ss); batch];
    if let Some(last) = wrs.last_mut() {
        *last = last.signaled();
    }
    let mut wc = [Wc::default(); 64];
    let t0 = std::time::Instant::now();
    let mut done = 0u64;
    while done < iters {
        p.a.qp.post_send(&wrs).unwrap();
        if mode == "send" {
            let mut got = 0;
            while got < batch {
                got += p.b.rcq.poll(&mut wc).unwrap();
            }
            p.b.qp.post_recv(&recvs).unwrap();
        }
        while p.a.scq.poll(&mut wc[..1]).unwrap() == 0 {}
        done += batch as u64;
    }
    let s = t0.elapsed().as_secs_f64();
    println!(
        "{mode}: {done} msgs of {size} B, batch {batch}: {:.1} ns/msg ({:.2} M msg/s, one thread does both ends)",
        s * 1e9 / done as f64,
        done as f64 / s / 1e6
    );
}
