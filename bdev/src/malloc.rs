//! The malloc backend: a RAM disk with real copies.
//!
//! Writes copy the buffers into the bdev's memory and reads copy them back
//! out, at submit time; the completion follows on the next poll. Write
//! zeroes and unmap zero the range (so a read after unmap returns zeroes).
//! Flush has nothing to do. With interleaved metadata, each block stores
//! `block_size + md_size` bytes, copied as they are. Separate metadata (DIX)
//! lives in a second arena, `md_size` bytes per block: a write with
//! `md_bufs` stores them, a write without leaves the stored metadata as it
//! is, a read with `md_bufs` returns it. PI checks and generation are the
//! generic layer's ([`crate::pi`]); the backend stores what it is given.
//!
//! A new malloc bdev with PI is formatted (as SPDK's is), and write zeroes
//! and unmap on it leave **valid** PI behind: zeroed data and metadata, then each block's
//! tuple is guard 0x0000 (the CRC of zeroes), application tag 0 and
//! reference tag = the low 32 bits of the block's LBA, whatever the PI type.
//! So a read-verify of a zeroed range passes for Type 1, for Type 2 when its
//! `ref_tag` is the first LBA, and for Type 3 always.
//!
//! The memory is shared by every core and written without locks, like a real
//! disk: concurrent writes to the same block leave one of them or a mix, and
//! a read racing a write may see a mix. It is one [`DmaArena`] (2 MiB
//! hugepages when reserved, ordinary pages otherwise), accessed only through
//! the arena's bounds-checked copies.
//!
//! A 4 KiB or larger write is copied with non-temporal stores, left
//! unordered ([`DmaArena::copy_in_unfenced`]); the channel fences them once
//! per poll, before the generic layer delivers the completions of that poll,
//! and before any read, fill or drop of the channel that follows them. A
//! fence per copy cost about a third of the write rate.

use std::sync::Arc;

use pollux_reactor::mem::{streaming_fence, ArenaOptions, DmaArena, HugepageMode};
use pollux_reactor::{PollStatus, Reactor};

use crate::backend::{BackendChannel, BdevBackend, Completions, Submitted, DEFAULT_QUEUE_DEPTH};
use crate::info::{BdevInfo, PiType, PI_TUPLE_SIZE};
use crate::io::{BdevError, BdevIo, IoTag, IoType};

/// The bdev's memory: one DMA arena (2 MiB hugepages when reserved), copied
/// in and out with bounds-checked `memcpy`s.
struct Store {
    arena: Arc<DmaArena>,
}

impl Store {
    fn new(name: &str, len: u64) -> Result<Self, BdevError> {
        let len = usize::try_from(len)
            .map_err(|_| BdevError::Memory(format!("{len} bytes do not fit in memory")))?;
        let opts = ArenaOptions::named(format!("malloc:{name}")).hugepages(HugepageMode::Auto);
        let arena = DmaArena::new(len, opts)
            .map_err(|e| BdevError::Memory(format!("cannot allocate {len} bytes: {e}")))?;
        Ok(Self { arena })
    }

    /// Copy `dst.len()` bytes from byte offset `off` (the caller checked the range).
    fn read(&self, off: usize, dst: &mut [u8]) {
        // The generic layer checked the range against the bdev's size, which
        // the arena covers; a failure here would be a bug, not bad input.
        let r = self.arena.copy_out(off, dst);
        debug_assert!(r.is_ok(), "malloc read outside its arena");
    }

    /// Copy `src` to byte offset `off` (the caller checked the range).
    fn write(&self, off: usize, src: &[u8]) {
        let r = self.arena.copy_in(off, src);
        debug_assert!(r.is_ok(), "malloc write outside its arena");
    }

    /// [`write`](Self::write), its non-temporal stores left unordered: the
    /// caller fences ([`streaming_fence`]) before the data is relied on.
    fn write_unfenced(&self, off: usize, src: &[u8]) {
        let r = self.arena.copy_in_unfenced(off, src);
        debug_assert!(r.is_ok(), "malloc write outside its arena");
    }

    /// Zero `len` bytes from `off`.
    fn zero(&self, off: usize, len: usize) {
        let r = self.arena.fill(off, len, 0);
        debug_assert!(r.is_ok(), "malloc zero outside its arena");
    }
}

/// The shared half of a malloc bdev: its memory.
pub struct MallocBackend {
    info: BdevInfo,
    store: std::sync::Arc<Store>,
    /// Separate metadata (DIX), `md_size` bytes per block.
    md_store: Option<std::sync::Arc<Store>>,
    queue_depth: usize,
}

impl std::fmt::Debug for MallocBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MallocBackend")
            .field("info", &self.info)
            .finish()
    }
}

impl MallocBackend {
    /// The product string of malloc bdevs.
    pub const PRODUCT: &'static str = "Malloc disk";

    /// A zero-filled RAM disk of the given geometry (with PI: formatted, each
    /// block's tuple as after a write zeroes).
    /// Control path: allocates and zeroes all of its memory.
    ///
    /// # Errors
    ///
    /// [`BdevError::Memory`] when the memory cannot be allocated.
    pub fn new(info: BdevInfo, queue_depth: Option<usize>) -> Result<Self, BdevError> {
        let len = info.num_blocks() * u64::from(info.buf_block_size());
        let md_store = if info.md_size() > 0 && !info.md_interleave() {
            let md_len = info.num_blocks() * u64::from(info.md_size());
            let name = format!("{}.md", info.name());
            Some(std::sync::Arc::new(Store::new(&name, md_len)?))
        } else {
            None
        };
        let me = Self {
            store: std::sync::Arc::new(Store::new(info.name(), len)?),
            md_store,
            info,
            queue_depth: queue_depth.unwrap_or(DEFAULT_QUEUE_DEPTH),
        };
        if me.info.pi_type() != PiType::None {
            // The memory is zeroed already: write the reference tags.
            me.channel().write_ref_tags(0, me.info.num_blocks());
        }
        Ok(me)
    }
}

impl MallocBackend {
    fn channel(&self) -> MallocChannel {
        MallocChannel {
            store: std::sync::Arc::clone(&self.store),
            md_store: self.md_store.clone(),
            block: self.info.buf_block_size() as usize,
            md: self.info.md_size() as usize,
            pi: self.info.pi_type() != PiType::None,
            unfenced: false,
        }
    }
}

impl BdevBackend for MallocBackend {
    fn info(&self) -> &BdevInfo {
        &self.info
    }

    fn supports(&self, _io_type: IoType) -> bool {
        true
    }

    fn queue_depth(&self) -> usize {
        self.queue_depth
    }

    fn create_channel(&self, _reactor: &Reactor) -> Result<Box<dyn BackendChannel>, BdevError> {
        Ok(Box::new(self.channel()))
    }
}

struct MallocChannel {
    store: std::sync::Arc<Store>,
    md_store: Option<std::sync::Arc<Store>>,
    /// Bytes per block in the store and in the buffers.
    block: usize,
    /// Metadata bytes per block (interleaved in `block`, or in `md_store`).
    md: usize,
    /// The bdev has PI (write zeroes and unmap leave valid tuples).
    pi: bool,
    /// Writes since the last fence may still be unordered (see the module docs).
    unfenced: bool,
}

impl MallocChannel {
    /// Order the non-temporal stores of the writes since the last fence.
    #[inline]
    fn fence(&mut self) {
        streaming_fence();
        self.unfenced = false;
    }

    /// Write zeroes / unmap: zero the data and metadata of the range; with
    /// PI, write each block's tuple (guard 0, app tag 0, ref tag = LBA).
    fn zero(&self, lba: u64, n: u64) {
        let (first, n) = (lba as usize, n as usize);
        self.store.zero(first * self.block, n * self.block);
        if let Some(md) = self.md_store.as_deref() {
            md.zero(first * self.md, n * self.md);
        }
        if self.pi {
            self.write_ref_tags(lba, n as u64);
        }
    }

    /// Write the reference tag (the LBA's low 32 bits) of each block of a
    /// zeroed range, which makes its PI valid (guard 0, app tag 0).
    fn write_ref_tags(&self, lba: u64, n: u64) {
        let (first, n) = (lba as usize, n as usize);
        let tuple = PI_TUPLE_SIZE as usize;
        for b in first..first + n {
            // The ref tag: the last 4 bytes of the tuple, in the last 8
            // bytes of the block's metadata.
            let ref_tag = (b as u32).to_be_bytes();
            match self.md_store.as_deref() {
                Some(md) => md.write((b + 1) * self.md - tuple + 4, &ref_tag),
                None => self.store.write((b + 1) * self.block - tuple + 4, &ref_tag),
            }
        }
    }
}

impl BackendChannel for MallocChannel {
    fn submit(&mut self, _tag: IoTag, io: &mut BdevIo) -> Submitted {
        // The generic layer checked the range against the bdev (whose store
        // holds `num_blocks * block` bytes, which fits in memory) and, for
        // reads and writes, that the buffers add up to the range exactly.
        let start = io.offset_blocks() as usize * self.block;
        if self.unfenced && io.io_type() != IoType::Write {
            // A read, fill or flush after unordered writes: order them first.
            self.fence();
        }
        match io.io_type() {
            IoType::Read => {
                let mut off = start;
                for seg in io.bufs.iter_mut() {
                    let dst = seg.as_mut_slice();
                    self.store.read(off, dst);
                    off += dst.len();
                }
                if let Some(md) = self.md_store.as_deref() {
                    let mut off = io.offset_blocks() as usize * self.md;
                    for seg in io.md_bufs.iter_mut() {
                        let dst = seg.as_mut_slice();
                        md.read(off, dst);
                        off += dst.len();
                    }
                }
            }
            IoType::Write => {
                let mut off = start;
                for seg in io.bufs.iter() {
                    self.store.write_unfenced(off, seg.as_slice());
                    off += seg.len();
                }
                self.unfenced = true;
                if let Some(md) = self.md_store.as_deref() {
                    let mut off = io.offset_blocks() as usize * self.md;
                    for seg in io.md_bufs.iter() {
                        md.write(off, seg.as_slice());
                        off += seg.len();
                    }
                }
            }
            IoType::WriteZeroes | IoType::Unmap => self.zero(io.offset_blocks(), io.num_blocks()),
            IoType::Flush => {}
        }
        // Copied: the generic layer delivers it on its next poll.
        Submitted::Done(Ok(()))
    }

    fn poll(&mut self, _done: &mut Completions<'_>) -> PollStatus {
        // Every I/O finished in `submit`; the generic layer delivers their
        // completions after this returns, so the writes among them are
        // ordered and visible to every core before anyone hears of them.
        if self.unfenced {
            self.fence();
        }
        PollStatus::Idle
    }
}

impl Drop for MallocChannel {
    fn drop(&mut self) {
        if self.unfenced {
            self.fence();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use pollux_reactor::TestCluster;

    use super::*;
    use crate::bdev::Bdev;
    use crate::info::PiType;
    use crate::io::IoError;
    use crate::testutil::{bytes_of, pattern, sg, sg_with, Recorder};

    fn malloc(block: u32, blocks: u64) -> Arc<Bdev> {
        let info = BdevInfo::new("m", MallocBackend::PRODUCT, block, blocks).unwrap();
        Bdev::new(Arc::new(MallocBackend::new(info, Some(16)).unwrap()))
    }

    #[test]
    fn write_then_read_round_trips_across_scatter_gather_lists() {
        let b = malloc(512, 64);
        let desc = b.open(true).unwrap();
        let cluster = TestCluster::new(1);
        let (rec, cb) = Recorder::new();
        let data = pattern(4 * 512, 1);
        let ch = cluster.on(0, |r| desc.channel(r).unwrap());
        // Three uneven segments in, two out.
        cluster.on(0, |_| {
            ch.write(10, 4, sg_with(&data, &[100, 1000, 948]), &cb, 0)
                .unwrap()
        });
        cluster.poll_until_idle().unwrap();
        assert_eq!(rec.one().status, Ok(()));
        cluster.on(0, |_| ch.read(10, 4, sg(&[1536, 512], 0), &cb, 1).unwrap());
        // And the neighbours were not touched.
        cluster.on(0, |_| ch.read(9, 1, sg(&[512], 0xFF), &cb, 2).unwrap());
        cluster.on(0, |_| ch.read(14, 1, sg(&[512], 0xFF), &cb, 3).unwrap());
        cluster.poll_until_idle().unwrap();
        let mut done = rec.take();
        done.sort_by_key(|d| d.1.ctx);
        assert_eq!(bytes_of(&done[0].1.bufs), data);
        assert!(bytes_of(&done[1].1.bufs).iter().all(|x| *x == 0));
        assert!(bytes_of(&done[2].1.bufs).iter().all(|x| *x == 0));
        let s = ch.stats();
        assert_eq!((s.read_ops, s.bytes_read, s.write_ops), (3, 6 * 512, 1));
    }

    #[test]
    fn write_zeroes_and_unmap_zero_the_range() {
        let b = malloc(4096, 8);
        let desc = b.open(true).unwrap();
        let cluster = TestCluster::new(1);
        let (rec, cb) = Recorder::new();
        let ch = cluster.on(0, |r| desc.channel(r).unwrap());
        let data = pattern(8 * 4096, 2);
        cluster.on(0, |_| {
            ch.write(0, 8, sg_with(&data, &[8 * 4096]), &cb, 0).unwrap()
        });
        cluster.poll_until_idle().unwrap();
        cluster.on(0, |_| {
            ch.write_zeroes(1, 2, &cb, 1).unwrap();
            ch.unmap(6, 1, &cb, 2).unwrap();
            ch.flush(0, 8, &cb, 3).unwrap();
        });
        cluster.poll_until_idle().unwrap();
        cluster.on(0, |_| ch.read(0, 8, sg(&[8 * 4096], 0xEE), &cb, 4).unwrap());
        cluster.poll_until_idle().unwrap();
        let done = rec.take();
        assert!(done.iter().all(|d| d.1.status.is_ok()));
        let got = bytes_of(&done.last().unwrap().1.bufs);
        let mut want = data.clone();
        want[4096..3 * 4096].fill(0);
        want[6 * 4096..7 * 4096].fill(0);
        assert_eq!(got, want);
    }

    #[test]
    fn cores_share_the_memory_and_bad_ios_fail() {
        let b = malloc(512, 16);
        let desc = b.open(true).unwrap();
        let cluster = TestCluster::new(2);
        let (rec, cb) = Recorder::new();
        let data = pattern(512, 3);
        let ch0 = cluster.on(0, |r| desc.channel(r).unwrap());
        let ch1 = cluster.on(1, |r| desc.channel(r).unwrap());
        cluster.on(0, |_| {
            ch0.write(15, 1, sg_with(&data, &[512]), &cb, 0).unwrap()
        });
        cluster.poll_until_idle().unwrap();
        cluster.on(1, |_| {
            ch1.read(15, 1, sg(&[512], 0), &cb, 1).unwrap();
            ch1.read(15, 2, sg(&[1024], 0), &cb, 2).unwrap();
            ch1.write(0, 1, sg(&[511], 0), &cb, 3).unwrap();
        });
        cluster.poll_until_idle().unwrap();
        let mut done = rec.take();
        done.sort_by_key(|d| d.1.ctx);
        assert_eq!(
            bytes_of(&done[1].1.bufs),
            data,
            "core 1 reads what core 0 wrote"
        );
        assert!(matches!(done[2].1.status, Err(IoError::OutOfRange { .. })));
        assert_eq!(
            done[3].1.status,
            Err(IoError::BadLength {
                expected: 512,
                actual: 511
            })
        );
    }

    #[test]
    fn interleaved_metadata_is_stored_with_each_block() {
        let info = BdevInfo::new("md", MallocBackend::PRODUCT, 512, 4)
            .unwrap()
            .with_metadata(8, true, PiType::Type1)
            .unwrap();
        let b = Bdev::new(Arc::new(MallocBackend::new(info, None).unwrap()));
        let desc = b.open(true).unwrap();
        let cluster = TestCluster::new(1);
        let (rec, cb) = Recorder::new();
        let ch = cluster.on(0, |r| desc.channel(r).unwrap());
        let data = pattern(2 * 520, 4);
        cluster.on(0, |_| {
            ch.write(1, 2, sg_with(&data, &[1040]), &cb, 0).unwrap()
        });
        cluster.poll_until_idle().unwrap();
        cluster.on(0, |_| ch.read(2, 1, sg(&[520], 0), &cb, 1).unwrap());
        cluster.poll_until_idle().unwrap();
        let done = rec.take();
        assert_eq!(bytes_of(&done[1].1.bufs), &data[520..]);
        let s = ch.stats();
        assert_eq!(s.bytes_written, 1024, "stats count data bytes");
    }

    #[test]
    fn store_copies_unaligned_ranges() {
        let s = Store::new("t", 64).unwrap();
        let data: Vec<u8> = (1..=37).collect();
        s.write(3, &data);
        let mut out = vec![0u8; 64];
        s.read(0, &mut out);
        assert_eq!(&out[..3], &[0, 0, 0]);
        assert_eq!(&out[3..40], &data[..]);
        assert!(out[40..].iter().all(|b| *b == 0));
        s.zero(0, 16);
        s.read(0, &mut out);
        assert!(out[..16].iter().all(|b| *b == 0));
        assert_eq!(&out[16..40], &data[13..]);
    }
}
