//! Tests every engine must pass (test-only): each engine's `tests` module
//! runs these against itself.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::engine::{IoDone, IoEngine, IoOp, QueueError};
use crate::mem::{BufPool, BufPoolOptions, DmaBuf, HugepageMode, SgList};

/// A temp file opened `O_DIRECT`, removed on drop.
pub(super) struct DirectFile {
    pub file: File,
    path: PathBuf,
}

impl Drop for DirectFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A fresh `O_DIRECT` file of `len` bytes in `$TMPDIR` or, where that
/// refuses `O_DIRECT` (tmpfs), in the workspace's `target/`; `None` (after
/// [`crate::test_env::skip`]) when both refuse it.
pub(super) fn direct_file(tag: &str, len: u64) -> Option<DirectFile> {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("pollux-io-{tag}-{}-{n}", std::process::id());
    let target = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target"));
    let mut tried = Vec::new();
    for dir in [std::env::temp_dir(), target] {
        let path = dir.join(&name);
        let opened = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .and_then(|file| file.set_len(len).map(|()| file));
        match opened {
            Ok(file) => return Some(DirectFile { file, path }),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                tried.push(format!("{}: {e}", dir.display()));
            }
        }
    }
    crate::test_env::skip(
        &format!("a directory that accepts O_DIRECT ({})", tried.join("; ")),
        "point TMPDIR at a disk file system such as ext4 or xfs, not tmpfs",
    );
    None
}

fn pool(n: usize) -> BufPool {
    let mut o = BufPoolOptions::new("t-io", 4096, n);
    o.hugepages = HugepageMode::Never;
    BufPool::new(o).unwrap()
}

/// Submit and reap until `want` completions arrived (bounded by a generous
/// deadline that only a hung I/O reaches).
pub(super) fn run_until<E: IoEngine>(e: &mut E, want: usize) -> Vec<IoDone> {
    let mut done = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while done.len() < want {
        e.submit().unwrap();
        e.reap(want - done.len(), |d| done.push(d));
        assert!(Instant::now() < deadline, "I/O did not complete");
        if done.len() < want {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    done
}

/// Write 3 buffers (gather), fsync, read back into 2 buffers (scatter).
pub(super) fn write_then_read_back<E: IoEngine>(e: &mut E) {
    let Some(f) = direct_file("rw", 64 << 10) else {
        return;
    };
    let fd = f.file.as_raw_fd();
    let p = pool(8);
    let mut w = SgList::new();
    for i in 0..3u8 {
        let mut b = p.get().unwrap();
        for (j, x) in b.as_mut_slice().iter_mut().enumerate() {
            *x = i.wrapping_mul(31).wrapping_add(j as u8);
        }
        w.push(b);
    }
    let expect: Vec<u8> = w.iter().flat_map(|b| b.as_slice().to_vec()).collect();
    e.queue(IoOp::write(fd, 8192), w, 7).unwrap();
    assert_eq!(e.in_flight(), 1);
    let d = run_until(e, 1).pop().unwrap();
    assert_eq!(d.token, 7);
    assert_eq!(d.result, Ok(3 * 4096));
    assert_eq!(d.bufs.len(), 3, "buffers come back");
    drop(d);

    e.queue(IoOp::fsync(fd), SgList::new(), 8).unwrap();
    let d = run_until(e, 1).pop().unwrap();
    assert_eq!((d.token, d.result), (8, Ok(0)));

    // Read 12 KiB back as one 4 KiB and one 8 KiB-long pair of buffers, and
    // a single-buffer read of the middle block.
    let mut r: SgList = (0..3).map(|_| p.get().unwrap()).collect();
    for b in r.iter_mut() {
        b.as_mut_slice().fill(0xEE);
    }
    e.queue(IoOp::read(fd, 8192), r, 9).unwrap();
    let one = SgList::from_buf(p.get().unwrap());
    e.queue(IoOp::read(fd, 8192 + 4096), one, 10).unwrap();
    assert_eq!(e.in_flight(), 2);
    let mut got = run_until(e, 2);
    got.sort_by_key(|d| d.token);
    assert_eq!(got[0].result, Ok(3 * 4096));
    let mut back = vec![0u8; 3 * 4096];
    assert_eq!(got[0].bufs.copy_to_slice(&mut back), 3 * 4096);
    assert_eq!(back, expect);
    assert_eq!(got[1].result, Ok(4096));
    assert_eq!(got[1].bufs.as_slice()[0].as_slice(), &expect[4096..8192]);
    assert_eq!(e.in_flight(), 0);
    drop(got);
    assert_eq!(p.available(), 8);
}

/// A bad fd completes with `EBADF`, buffers returned.
pub(super) fn bad_fd_is_an_errno<E: IoEngine>(e: &mut E) {
    let b = DmaBuf::alloc(4096).unwrap();
    e.queue(IoOp::read(-1, 0), SgList::from_buf(b), 1).unwrap();
    e.queue(IoOp::write(1_000_000, 0), SgList::new(), 2)
        .unwrap();
    let mut got = run_until(e, 2);
    got.sort_by_key(|d| d.token);
    assert_eq!(got[0].result, Err(libc::EBADF));
    assert_eq!(got[0].bufs.len(), 1);
    assert_eq!(got[1].result, Err(libc::EBADF));
    assert_eq!(e.in_flight(), 0);
}

/// Queueing past capacity returns the buffers; after reaping there is room.
pub(super) fn queue_full_returns_buffers<E: IoEngine>(e: &mut E) {
    let Some(f) = direct_file("full", 64 << 10) else {
        return;
    };
    let fd = f.file.as_raw_fd();
    let p = pool(e.capacity() + 1);
    for i in 0..e.capacity() {
        let sg = SgList::from_buf(p.get().unwrap());
        e.queue(IoOp::read(fd, 0), sg, i as u64).unwrap();
    }
    assert_eq!(e.in_flight(), e.capacity());
    let extra = SgList::from_buf(p.get().unwrap());
    match e.queue(IoOp::read(fd, 0), extra, 99) {
        Err(QueueError::Full(b)) => assert_eq!(b.len(), 1),
        other => panic!("expected Full, got {other:?}"),
    }
    let got = run_until(e, e.capacity());
    assert!(got.iter().all(|d| d.result == Ok(4096)));
    drop(got);
    assert_eq!(p.available(), e.capacity() + 1);
    let sg = SgList::from_buf(p.get().unwrap());
    e.queue(IoOp::read(fd, 0), sg, 100).unwrap();
    assert_eq!(run_until(e, 1)[0].token, 100);
}
