//! What the host transports' tests share: reap completions while the
//! reactor runs, and write a pattern through a queue, read it back and
//! compare.
#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

use pollux_reactor::mem::{BufPool, SgList};
use pollux_reactor::Reactor;

use super::{Completion, HostQueue, Qpair, SubmitErrorKind};

/// Poll `qp` and the reactor until `n` completions came (bounded).
pub(crate) fn reap<Q: HostQueue>(r: &Reactor, qp: &mut Qpair<Q>, n: usize) -> Vec<Completion> {
    let mut out = Vec::new();
    for _ in 0..2_000_000 {
        qp.poll(&mut |c| out.push(c));
        if out.len() >= n {
            return out;
        }
        r.poll_once();
    }
    panic!("only {} of {n} completions", out.len());
}

/// The test pattern of I/O `seed`.
pub(crate) fn pattern(seed: u64, b: &mut [u8]) {
    for (i, x) in b.iter_mut().enumerate() {
        *x = (i as u64).wrapping_mul(31).wrapping_add(seed) as u8;
    }
}

/// Write `n` I/Os of the pool's buffer size (512-byte blocks, I/O `i` at
/// block `i * size / 512` of namespace 1, pattern `seed + i`), then read
/// them back and compare; every I/O must succeed. Returns the miscompares.
pub(crate) fn write_read_verify<Q: HostQueue>(
    r: &Reactor,
    qp: &mut Qpair<Q>,
    pool: &BufPool,
    seed: u64,
    n: u64,
) -> usize {
    let size = pool.buf_size();
    let blocks = (size / 512) as u32;
    let mut submitted = 0;
    let mut done = Vec::new();
    while submitted < n {
        let Some(mut b) = pool.get() else {
            done.extend(reap(r, qp, 1));
            continue;
        };
        pattern(seed + submitted, b.as_mut_slice());
        let lba = submitted * u64::from(blocks);
        match qp.write(1, lba, blocks, SgList::from_buf(b), submitted) {
            Ok(()) => submitted += 1,
            Err(e) => {
                assert_eq!(e.kind, SubmitErrorKind::Busy);
                done.extend(reap(r, qp, 1));
            }
        }
    }
    while done.len() < n as usize {
        done.extend(reap(r, qp, 1));
    }
    if let Some(c) = done.iter().find(|c| c.result.is_err()) {
        panic!("a write of {size} B failed: {:?}", c.result);
    }
    drop(done);
    let (mut bad, mut got, mut next) = (0, 0, 0u64);
    while got < n {
        if next < n {
            if let Some(mut b) = pool.get() {
                b.as_mut_slice().fill(0xEE);
                let lba = next * u64::from(blocks);
                match qp.read(1, lba, blocks, SgList::from_buf(b), next) {
                    Ok(()) => next += 1,
                    Err(e) => assert_eq!(e.kind, SubmitErrorKind::Busy),
                }
            }
        }
        qp.poll(&mut |c| {
            assert!(c.result.is_ok(), "a read of {size} B: {:?}", c.result);
            let mut want = vec![0u8; size];
            pattern(seed + c.ctx, &mut want);
            let mut have = vec![0u8; size];
            c.data.copy_to_slice(&mut have);
            if have != want {
                bad += 1;
            }
            got += 1;
        });
        r.poll_once();
    }
    bad
}
