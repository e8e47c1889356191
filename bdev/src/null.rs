//! The null backend: completes every I/O on the next poll and stores nothing.
//!
//! For benchmarking the rest of the stack (like SPDK's null bdev): writes,
//! write zeroes, unmap and flush are discarded (separate metadata buffers
//! too), and **reads do not touch the data** (the buffers keep whatever they
//! held).
//!
//! With a PI type, a read **generates valid PI** over the data its buffers
//! hold, as SPDK's null bdev does, so that read-verify passes: each block's
//! tuple (in the interleaved metadata, or in the read's `md_bufs` when
//! separate; nothing without them) gets the guard of the buffer's data and
//! the metadata before the tuple, and the tags of the read's
//! [`PiAction`](crate::PiAction) (its app tag, its Type 2/3 ref tag), or,
//! for a read without one, app tag 0 and ref tag = the LBA. This costs one
//! CRC per block per read. With a `latency`, each I/O is
//! held in a FIFO until `submit time + latency`, measured with the reactor's
//! cached loop time; with no latency the data path reads no clock at all.
//!
//! This is also the template for a new backend: copy this file (see the
//! crate docs, "Writing a backend").

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use pollux_reactor::{PollStatus, Reactor};

use crate::backend::{BackendChannel, BdevBackend, Completions, Submitted, DEFAULT_QUEUE_DEPTH};
use crate::info::BdevInfo;
use crate::io::{BdevError, BdevIo, IoTag, IoType};
use crate::pi::{PiAction, PiFormat};

/// Options of a null bdev.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NullOptions {
    /// Fixed completion latency (zero: the next poll).
    pub latency: Duration,
    /// I/Os in flight per channel (`None`: [`DEFAULT_QUEUE_DEPTH`]).
    pub queue_depth: Option<usize>,
}

/// The shared half of a null bdev.
#[derive(Debug)]
pub struct NullBackend {
    info: BdevInfo,
    opts: NullOptions,
}

impl NullBackend {
    /// The product string of null bdevs.
    pub const PRODUCT: &'static str = "Null disk";

    /// A null bdev of the given geometry.
    pub fn new(info: BdevInfo, opts: NullOptions) -> Self {
        Self { info, opts }
    }
}

impl BdevBackend for NullBackend {
    fn info(&self) -> &BdevInfo {
        &self.info
    }

    fn supports(&self, _io_type: IoType) -> bool {
        true
    }

    fn queue_depth(&self) -> usize {
        self.opts.queue_depth.unwrap_or(DEFAULT_QUEUE_DEPTH)
    }

    fn create_channel(&self, reactor: &Reactor) -> Result<Box<dyn BackendChannel>, BdevError> {
        let depth = self.queue_depth();
        let latency = self.opts.latency;
        Ok(Box::new(NullChannel {
            pi: PiFormat::of(&self.info),
            reactor: reactor.clone(),
            latency,
            immediate: latency.is_zero(),
            delayed: VecDeque::with_capacity(if latency.is_zero() { 0 } else { depth }),
        }))
    }
}

/// Per-core state: the I/Os waiting for the next poll (or for their deadline).
struct NullChannel {
    /// Generate PI on reads.
    pi: Option<PiFormat>,
    reactor: Reactor,
    latency: Duration,
    /// `latency` is zero.
    immediate: bool,
    /// Latency non-zero: complete once the loop time reaches the deadline.
    delayed: VecDeque<(IoTag, Instant)>,
}

impl NullChannel {
    /// A read of a PI bdev returns valid protection information: generate it
    /// (with the I/O's own action, or the default one: reference tag = LBA).
    #[cold]
    #[inline(never)]
    fn generate_pi(&self, io: &mut BdevIo) {
        let Some(fmt) = self.pi.as_ref() else {
            return;
        };
        if io.io_type() == IoType::Read && (fmt.interleave() || !io.md_bufs.is_empty()) {
            let lba = io.offset_blocks();
            let a = io
                .pi_action()
                .copied()
                .unwrap_or_else(|| PiAction::write_generate().with_ref_tag(lba as u32));
            // The generic layer checked the lengths: this cannot fail.
            let r = fmt.generate(lba, &a, &mut io.bufs, &mut io.md_bufs);
            debug_assert!(r.is_ok(), "null PI generation: {r:?}");
        }
    }

    /// Complete `tag` once the latency has passed. The queue was sized to the
    /// channel depth, which the generic layer enforces: this push never
    /// allocates.
    #[cold]
    #[inline(never)]
    fn delay(&mut self, tag: IoTag) -> Submitted {
        self.delayed
            .push_back((tag, self.reactor.now() + self.latency));
        Submitted::Queued
    }
}

impl BackendChannel for NullChannel {
    #[inline]
    fn submit(&mut self, tag: IoTag, io: &mut BdevIo) -> Submitted {
        if self.pi.is_some() {
            self.generate_pi(io);
        }
        // Without a latency the I/O is done: the generic layer delivers it on
        // its next poll.
        if self.immediate {
            return Submitted::Done(Ok(()));
        }
        self.delay(tag)
    }

    fn poll(&mut self, done: &mut Completions<'_>) -> PollStatus {
        let mut work = false;
        if !self.delayed.is_empty() {
            // Deadlines are in submit order (one fixed latency): stop at the first one not due.
            let now = self.reactor.now();
            while let Some(&(tag, due)) = self.delayed.front() {
                if due > now {
                    break;
                }
                self.delayed.pop_front();
                done.complete(tag, Ok(()));
                work = true;
            }
        }
        PollStatus::from_work(work)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use pollux_reactor::TestCluster;

    use super::*;
    use crate::bdev::Bdev;
    use crate::io::IoError;
    use crate::testutil::{sg, Recorder};

    fn bdev(latency: Duration) -> Arc<Bdev> {
        let info = BdevInfo::new("null", NullBackend::PRODUCT, 512, 1024).unwrap();
        Bdev::new(Arc::new(NullBackend::new(
            info,
            NullOptions {
                latency,
                queue_depth: Some(8),
            },
        )))
    }

    #[test]
    fn completes_every_type_on_the_next_poll_and_leaves_reads_untouched() {
        let b = bdev(Duration::ZERO);
        let desc = b.open(true).unwrap();
        let cluster = TestCluster::new(1);
        let (rec, cb) = Recorder::new();
        cluster.on(0, |r| {
            let ch = desc.channel(r).unwrap();
            ch.read(0, 2, sg(&[512, 512], 0xAB), &cb, 0).unwrap();
            ch.write(1022, 2, sg(&[1024], 1), &cb, 1).unwrap();
            ch.flush(0, 1024, &cb, 2).unwrap();
            ch.write_zeroes(5, 100, &cb, 3).unwrap();
            ch.unmap(0, 1024, &cb, 4).unwrap();
            ch.read(1023, 2, sg(&[1024], 0), &cb, 5).unwrap();
            assert_eq!(rec.len(), 0);
            assert_eq!(r.poll_once(), PollStatus::Busy);
            assert_eq!(rec.len(), 6, "all complete on the first poll");
            assert_eq!(r.poll_once(), PollStatus::Idle);
        });
        let mut done = rec.take();
        done.sort_by_key(|d| d.1.ctx);
        assert!(done[..5].iter().all(|d| d.1.status.is_ok()));
        assert!(matches!(done[5].1.status, Err(IoError::OutOfRange { .. })));
        // Null reads do not touch the data.
        let bufs = &done[0].1.bufs;
        assert_eq!(bufs.len(), 2);
        assert!(bufs.iter().all(|b| b.as_slice().iter().all(|x| *x == 0xAB)));
    }

    #[test]
    fn latency_holds_completions_until_due() {
        let b = bdev(Duration::from_micros(100));
        let desc = b.open(false).unwrap();
        let cluster = TestCluster::new(1);
        let (rec, cb) = Recorder::new();
        let ch = cluster.on(0, |r| desc.channel(r).unwrap());
        cluster.on(0, |_| ch.read(0, 1, sg(&[512], 0), &cb, 0).unwrap());
        cluster.poll_until_idle().unwrap();
        assert_eq!(rec.len(), 0, "completed before its latency");
        cluster.advance(Duration::from_micros(60));
        // Submits use the loop's cached time: let a loop see the new time.
        cluster.poll_until_idle().unwrap();
        cluster.on(0, |_| ch.read(1, 1, sg(&[512], 0), &cb, 1).unwrap());
        cluster.poll_until_idle().unwrap();
        assert_eq!(rec.len(), 0);
        cluster.advance(Duration::from_micros(40));
        cluster.poll_until_idle().unwrap();
        assert_eq!(rec.one().ctx, 0, "the first is due, the second is not");
        cluster.advance(Duration::from_micros(60));
        cluster.poll_until_idle().unwrap();
        assert_eq!(rec.one().ctx, 1);
        assert_eq!(ch.in_flight(), 0);
    }
}
