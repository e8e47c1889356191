//! Write zeroes and unmap of the aio backend: `fallocate` (`ZERO_RANGE`,
//! `PUNCH_HOLE`) on one helper thread per channel, so a large range never
//! stalls the reactor: neither engine carries `fallocate` for both kinds
//! (Linux AIO has no such opcode), and the call can take as long as the file
//! system needs to free or zero the range.
//!
//! The channel hands a request to the thread through a bounded queue
//! (sized at the channel's depth: never full while the channel respects
//! its depth, no allocation per request) and reaps the answers on its
//! poll, only while some are outstanding. The thread starts with the first
//! such I/O and ends with the channel (joined: dropping the channel waits
//! for a running `fallocate`).

use std::fs::File;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;

use rustix::fs::FallocateFlags;

use crate::io::{IoError, IoStatus};

/// One `fallocate` to run.
struct Req {
    token: u64,
    flags: FallocateFlags,
    offset: u64,
    len: u64,
}

/// The helper thread of one aio channel.
pub(crate) struct FallocateWorker {
    tx: Option<SyncSender<Req>>,
    rx: Receiver<(u64, IoStatus)>,
    in_flight: usize,
    thread: Option<JoinHandle<()>>,
}

/// Run `fallocate` on `file` (`KEEP_SIZE` added): the I/O's status.
pub(crate) fn fallocate(file: &File, flags: FallocateFlags, offset: u64, len: u64) -> IoStatus {
    rustix::fs::fallocate(file, flags | FallocateFlags::KEEP_SIZE, offset, len)
        .map_err(|e| IoError::Device(e.raw_os_error()))
}

impl FallocateWorker {
    /// Start the thread for `file`, queueing up to `depth` requests
    /// (control path).
    ///
    /// # Errors
    /// The thread could not be spawned.
    pub(crate) fn start(file: Arc<File>, depth: usize) -> std::io::Result<FallocateWorker> {
        let (tx, req_rx) = sync_channel::<Req>(depth.max(1));
        let (done_tx, rx) = sync_channel::<(u64, IoStatus)>(depth.max(1));
        #[cfg(test)]
        let gate = test_gate::take(&file);
        let thread = std::thread::Builder::new()
            .name("pollux-aio-falloc".into())
            .spawn(move || {
                while let Ok(r) = req_rx.recv() {
                    #[cfg(test)]
                    if let Some(g) = &gate {
                        let _ = g.recv();
                    }
                    let st = fallocate(&file, r.flags, r.offset, r.len);
                    if done_tx.send((r.token, st)).is_err() {
                        break;
                    }
                }
            })?;
        Ok(FallocateWorker {
            tx: Some(tx),
            rx,
            in_flight: 0,
            thread: Some(thread),
        })
    }

    /// Hand one request to the thread; `Err(token)` when it cannot take it
    /// (more than `depth` outstanding, or the thread is gone).
    pub(crate) fn submit(
        &mut self,
        token: u64,
        flags: FallocateFlags,
        offset: u64,
        len: u64,
    ) -> Result<(), u64> {
        let Some(tx) = &self.tx else {
            return Err(token);
        };
        match tx.try_send(Req {
            token,
            flags,
            offset,
            len,
        }) {
            Ok(()) => {
                self.in_flight += 1;
                Ok(())
            }
            Err(TrySendError::Full(r) | TrySendError::Disconnected(r)) => Err(r.token),
        }
    }

    /// Requests handed over and not reaped yet.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Give every finished request to `f` (token, status); how many.
    pub(crate) fn reap(&mut self, mut f: impl FnMut(u64, IoStatus)) -> usize {
        let mut n = 0;
        while self.in_flight > 0 {
            match self.rx.try_recv() {
                Ok((token, st)) => {
                    self.in_flight -= 1;
                    n += 1;
                    f(token, st);
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    // The thread is gone (it panicked): nothing more comes.
                    log::warn!(
                        "aio: the fallocate thread ended with {} request(s) outstanding",
                        self.in_flight
                    );
                    self.in_flight = 0;
                    break;
                }
            }
        }
        n
    }
}

impl Drop for FallocateWorker {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Tests hold a file's `fallocate` thread before each request until they
/// let it go, to see the reactor keep working while one is outstanding.
#[cfg(test)]
pub(crate) mod test_gate {
    use pollux_reactor::sync::Mutex;
    use std::fs::File;
    use std::sync::mpsc::{channel, Receiver, Sender};

    type Gates = Vec<((u64, u64), Receiver<()>)>;
    static GATES: Mutex<Gates> = Mutex::new(Vec::new());

    fn id(f: &File) -> (u64, u64) {
        rustix::fs::fstat(f).map_or((0, 0), |s| (s.st_dev, s.st_ino))
    }

    /// Gate the thread that will serve `file`: each request waits for one
    /// `send(())` on the returned sender.
    pub(crate) fn install(file: &File) -> Sender<()> {
        let (tx, rx) = channel();
        GATES
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((id(file), rx));
        tx
    }

    pub(super) fn take(file: &File) -> Option<Receiver<()>> {
        let me = id(file);
        let mut g = GATES.lock().unwrap_or_else(|p| p.into_inner());
        let i = g.iter().position(|(k, _)| *k == me)?;
        Some(g.swap_remove(i).1)
    }
}
