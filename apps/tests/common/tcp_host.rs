//! An NVMe/TCP host for the end-to-end tests: connects to a subsystem on
//! 127.0.0.1 and does verified I/O to namespace 1, measuring the longest
//! gap between two completions.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pollux_nvmf::host::tcp::{TcpHost, TcpHostOptions, TcpQueue};
use pollux_nvmf::host::{Controller, CtrlOptions, HostIdentity, Qpair, DEFAULT_HOSTNQN};
use pollux_reactor::mem::{DmaBuf, SgList};

use super::WAIT;

/// A port nobody listens on now, below the ephemeral range.
pub fn free_port() -> u16 {
    pollux_reactor::free_tcp_port("127.0.0.1")
}

/// Connects to `subnqn` at 127.0.0.1:`port` as host `hostid` (no
/// digests): the controller and one I/O queue of 16 entries.
pub fn connect(
    port: u16,
    subnqn: &str,
    hostid: [u8; 16],
) -> (Controller<TcpHost>, Qpair<TcpQueue>) {
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let t = TcpHost::new(addr, TcpHostOptions::default());
    let who = HostIdentity {
        hostnqn: DEFAULT_HOSTNQN.into(),
        hostid,
        subnqn: subnqn.into(),
    };
    let c = Controller::connect(&t, who, CtrlOptions::default()).unwrap();
    let qp = c.connect_io(&t, 1, 16, None).unwrap();
    (c, qp)
}

/// What the host did: completions, and the longest gap between two.
pub struct HostRun {
    /// Completions (writes and reads).
    pub completions: u64,
    /// The longest wait for one.
    pub longest_gap: Duration,
}

/// Connects to `subnqn` at 127.0.0.1:`port`, writes a pattern to a block,
/// reads it back and compares, over and over until `stop` (20 rounds at
/// least), adding each completion to `count`; panics on any error or
/// mismatch.
pub fn host_io(port: u16, subnqn: &str, stop: &AtomicBool, count: &AtomicU64) -> HostRun {
    // The controller (its admin queue) lives as long as the I/O queue.
    let (_ctrlr, mut qp) = connect(port, subnqn, *b"pollux-rpc-nvmf1");
    let mut run = HostRun {
        completions: 0,
        longest_gap: Duration::ZERO,
    };
    let mut last = Instant::now();
    let mut round: u64 = 0;
    while !stop.load(Ordering::SeqCst) || round < 20 {
        round += 1;
        let lba = round % 1024;
        let mut w = DmaBuf::alloc(4096).unwrap();
        w.as_mut_slice()
            .iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = (i as u64 * 7 + round) as u8);
        let want = w.as_slice().to_vec();
        qp.write(1, lba, 8, SgList::from_buf(w), 1).unwrap();
        let mut done = false;
        while !done {
            assert!(last.elapsed() < WAIT, "write {round} did not complete");
            qp.poll(&mut |cpl| {
                assert!(cpl.result.is_ok(), "write {round}: {:?}", cpl.result);
                done = true;
            });
        }
        run.longest_gap = run.longest_gap.max(last.elapsed());
        last = Instant::now();
        run.completions += 1;
        count.fetch_add(1, Ordering::SeqCst);
        let r = DmaBuf::alloc(4096).unwrap();
        qp.read(1, lba, 8, SgList::from_buf(r), 2).unwrap();
        let mut got = None;
        while got.is_none() {
            assert!(last.elapsed() < WAIT, "read {round} did not complete");
            qp.poll(&mut |cpl| {
                assert!(cpl.result.is_ok(), "read {round}: {:?}", cpl.result);
                let mut have = vec![0u8; 4096];
                cpl.data.copy_to_slice(&mut have);
                got = Some(have);
            });
        }
        assert!(got.unwrap() == want, "round {round}: read back differs");
        run.longest_gap = run.longest_gap.max(last.elapsed());
        last = Instant::now();
        run.completions += 1;
        count.fetch_add(1, Ordering::SeqCst);
    }
    run
}
