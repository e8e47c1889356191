//! The shared-memory link between two QPs: one memfd holding a control block
//! and a single-producer/single-consumer byte ring per direction.
//!
//! Layout: page 0 header; control block of direction `d` at
//! `4096 * (1 + d)` (`tail` @0, `head` @128, `nak` @256, `fatal` @384,
//! `consumer_armed` @512, `producer_armed` @640, `rnr_retry` @768,
//! `sig_error` @896); ring data of direction `d` at `16384 + d * RING_SIZE`.
//! Each word has a 128-byte pair of cache lines to itself: the producer's
//! `tail` and the consumer's `head` never share a line, nor a pair that the
//! adjacent-line prefetcher would pull across cores together.
//! Direction 0 carries active → passive traffic.
//! Every control word has one writer: `consumer_armed` and `producer_armed`
//! count the arms of the side that sleeps on that CQ; the side that would
//! wake it only reads them and remembers the count it last answered (no
//! atomic read-modify-write on a line the other core writes).
//!
//! Records are 16-byte aligned (a 64-byte SEND takes 80 bytes of ring, not
//! 128: fewer cache lines move between the cores): a 16-byte header
//! `{stamp u32, word u32 (len: 24 bits, kind: 4, flags: 4), imm u32, aux u32}`
//! and the payload. A WRITE_WITH_IMM record carries no payload (its length
//! is in `aux`); a PAD record's `len` covers the rest of its space. A record
//! never wraps: a PAD record fills the end of the ring instead. Positions are
//! free-running `u64`s.
//!
//! **Stamps.** The producer writes a record's payload, zeroes the stamp
//! word of the slot after the record, writes the header, then stores its
//! `stamp` (a non-zero function of its position) with release. So the
//! word at the consumer's head is always either zero (nothing yet) or the
//! stamp of a complete record: the consumer finds records by polling that
//! word, in the line the record itself arrives in, without first fetching
//! the tail's line from the other core (one cache-line transfer less per
//! message and direction). The tail is still published once per batch: it
//! acknowledges nothing, but bounds the ring (a torn or impossible tail is
//! detected by the consumer's periodic `check_tail`, not on every empty
//! poll: the tail's line then stays in the producer's cache) and serves CQ
//! arming.
//!
//! The consumer validates every value it reads (stamp, tail distance, kind,
//! length) and treats a violation as a fatal protocol error, so a broken
//! peer can never make it read out of bounds or loop.

use std::cell::Cell;
use std::sync::atomic::Ordering;

use super::shm::{Shm, Span};

/// Bytes of ring data per direction (power of two, ≥ 2 × max message).
pub const RING_SIZE: u64 = 4 << 20;
/// The producer wraps early (a PAD record to the end of the ring) when a
/// record would leave the first `HOT_WINDOW` bytes and the consumer has
/// room for that: while it keeps up, records cycle through this much of
/// the ring, whose lines stay in the two cores' caches, instead of
/// streaming through all of it (a cache miss to the shared cache for
/// every new line). A slow consumer still gets the whole ring.
pub const HOT_WINDOW: u64 = 256 << 10;
/// Total size of a link memfd.
pub const LINK_LEN: usize = 16384 + 2 * RING_SIZE as usize;

pub(crate) const CTL_TAIL: usize = 0;
pub(crate) const CTL_HEAD: usize = 128;
pub(crate) const CTL_NAK: usize = 256;
pub(crate) const CTL_FATAL: usize = 384;
pub(crate) const CTL_CONSUMER_ARMED: usize = 512;
pub(crate) const CTL_PRODUCER_ARMED: usize = 640;
pub(crate) const CTL_RNR_RETRY: usize = 768;
/// A PI error the producer found in the consumer's integrity MR:
/// `valid u32 @0, key u32 @4, kind u32 @8, expected u64 @16, actual u64 @24,
/// offset u64 @32` (the consumer clears `valid` when it takes it).
pub(crate) const CTL_SIGERR: usize = 896;
/// Record kinds.
pub(crate) const REC_SEND: u8 = 1;
pub(crate) const REC_WRITE_IMM: u8 = 2;
pub(crate) const REC_PAD: u8 = 3;

/// Record flags.
pub(crate) const RF_IMM: u8 = 1;
pub(crate) const RF_INV: u8 = 2;

const HDR: usize = 16;
/// Record alignment (the header size: a PAD record always fits).
const REC_ALIGN: usize = 16;
/// Largest length the header's 24-bit field holds (> max SEND and > a PAD).
const LEN_MAX: u32 = (1 << 24) - 1;

/// A record header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RecHdr {
    pub(crate) kind: u8,
    pub(crate) flags: u8,
    /// Message length (SEND: the payload; WRITE_WITH_IMM: the write's
    /// length, no payload; PAD: the bytes it skips after its header).
    pub(crate) len: u32,
    pub(crate) imm: u32,
    pub(crate) aux: u32,
}

impl RecHdr {
    /// Payload bytes that follow the header in the ring.
    fn payload_len(&self) -> usize {
        match self.kind {
            REC_SEND => self.len as usize,
            _ => 0,
        }
    }

    /// Ring bytes the record takes.
    fn footprint(&self) -> u64 {
        match self.kind {
            REC_WRITE_IMM => HDR as u64,
            _ => rec_len(self.len as usize),
        }
    }

    /// Header bytes 4..16 (everything but the stamp).
    fn encode(&self) -> [u8; HDR - 4] {
        let (len, aux) = match self.kind {
            REC_WRITE_IMM => (0, self.len),
            _ => (self.len, self.aux),
        };
        let word =
            (len & LEN_MAX) | u32::from(self.kind & 0xf) << 24 | u32::from(self.flags & 0xf) << 28;
        let mut b = [0u8; HDR - 4];
        b[0..4].copy_from_slice(&word.to_le_bytes());
        b[4..8].copy_from_slice(&self.imm.to_le_bytes());
        b[8..12].copy_from_slice(&aux.to_le_bytes());
        b
    }

    fn decode(b: &[u8; HDR - 4]) -> RecHdr {
        let u = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let word = u(0);
        let kind = (word >> 24 & 0xf) as u8;
        let (len, aux) = match kind {
            REC_WRITE_IMM => (u(8), 0),
            _ => (word & LEN_MAX, u(8)),
        };
        RecHdr {
            kind,
            flags: (word >> 28) as u8,
            len,
            imm: u(4),
            aux,
        }
    }
}

pub(crate) fn rec_len(payload: usize) -> u64 {
    ((HDR + payload + REC_ALIGN - 1) & !(REC_ALIGN - 1)) as u64
}

/// The stamp of the record at position `pos` (never zero).
fn stamp_of(pos: u64) -> u32 {
    ((pos / REC_ALIGN as u64) as u32).wrapping_add(1).max(1)
}

/// Offset of direction `d`'s control block.
pub(crate) fn ctl_off(d: usize) -> usize {
    4096 * (1 + d)
}

fn data_off(d: usize) -> usize {
    16384 + d * RING_SIZE as usize
}

/// A consumed-record view: header, record length and payload span.
pub(crate) struct Peeked {
    pub(crate) hdr: RecHdr,
    pub(crate) rec_len: u64,
    pub(crate) payload: Span,
}

/// The ring is corrupt (peer bug or crash mid-write of control words).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Corrupt;

/// Producer: reserve and write one record at local tail `tail`. `fill`
/// writes the payload into the given span (the caller's copy straight into
/// the ring slot: no staging). Returns the new tail, or `None` when the ring
/// lacks space (back-pressure: retry later; nothing was written). The
/// record is visible to the consumer when this returns (its stamp); the
/// tail is published separately, once per batch ([`publish`]).
/// `head_cache` is the producer's last view of the consumer's head: the
/// shared head line is read only when the cached view shows no room (one
/// cache-line transfer per ring's worth of records, not per record).
#[inline(always)]
pub(crate) fn produce(
    shm: &Shm,
    d: usize,
    tail: u64,
    head_cache: &Cell<u64>,
    hdr: RecHdr,
    fill: impl FnOnce(Span),
) -> Option<u64> {
    if hdr.kind != REC_WRITE_IMM && hdr.len > LEN_MAX {
        return None;
    }
    let len = hdr.payload_len();
    let need = hdr.footprint();
    let off = tail % RING_SIZE;
    // Room for the record and the next slot's stamp word (zeroed below).
    let fits_with = |head: u64, pad: u64| {
        let used = tail.wrapping_sub(head);
        used <= RING_SIZE && used + pad + need + HDR as u64 <= RING_SIZE
    };
    let mut pad = if off + need > RING_SIZE {
        RING_SIZE - off
    } else {
        0
    };
    if pad == 0 && off != 0 && off < HOT_WINDOW && off + need > HOT_WINDOW {
        // Leaving the hot window: go back to the start of the ring if the
        // consumer is far enough behind us for that (checked once a lap).
        let early = |head: u64| fits_with(head, RING_SIZE - off);
        if early(head_cache.get()) || refresh_head(shm, d, head_cache, early) {
            pad = RING_SIZE - off;
        }
    }
    let fits = |head: u64| fits_with(head, pad);
    if !fits(head_cache.get()) && !refresh_head(shm, d, head_cache, fits) {
        return None;
    }
    let base = data_off(d);
    let t = tail + pad;
    let o = base + (t % RING_SIZE) as usize;
    // One bounds check for header and payload (the record fits the ring:
    // checked above; the link mapping is writable on both sides).
    let rec = shm.span(o, HDR + len)?;
    // Write order (x86 commits stores in program order): the payload, then
    // the next slot's stamp word, then the header and the stamp. A small
    // record's second line (payload tail, next stamp) is complete before
    // its first line (header, stamp) is touched again, so a consumer that
    // pulls the second line early ([`touch_next_line`]) never takes it
    // back from the producer in the middle of its writes.
    fill(Span {
        // SAFETY: `HDR <= rec.len`.
        ptr: unsafe { rec.ptr.add(HDR) },
        len,
    });
    // The slot after the record reads "nothing yet" before the record's
    // stamp can be seen.
    shm.u32_at(base + ((t + need) % RING_SIZE) as usize)
        .store(0, Ordering::Relaxed);
    // SAFETY: `rec` covers `HDR + len` bytes of the live link mapping.
    unsafe {
        rec.ptr
            .add(4)
            .cast::<[u8; HDR - 4]>()
            .write_unaligned(hdr.encode());
    }
    shm.u32_at(o).store(stamp_of(t), Ordering::Release);
    if pad > 0 {
        // Only now the PAD: the consumer never sees it before the record
        // it skips to (whose slot it has just zeroed, above or here).
        write_pad(shm, base + off as usize, tail, pad);
    }
    Some(t + need)
}

/// The ring looked full through the cached head: read the shared head line
/// (the only time the producer touches it) and retry `fits`.
#[inline(never)]
fn refresh_head(shm: &Shm, d: usize, head_cache: &Cell<u64>, fits: impl Fn(u64) -> bool) -> bool {
    let head = shm.u64_at(ctl_off(d) + CTL_HEAD).load(Ordering::Acquire);
    head_cache.set(head);
    fits(head)
}

/// Fill `pad` bytes at position `pos` (ring offset `at`) with a PAD record
/// (rare: once per wrap).
#[cold]
#[inline(never)]
fn write_pad(shm: &Shm, at: usize, pos: u64, pad: u64) {
    let p = RecHdr {
        kind: REC_PAD,
        len: (pad as usize - HDR) as u32,
        ..RecHdr::default()
    };
    shm.write_bytes(at + 4, &p.encode());
    shm.u32_at(at).store(stamp_of(pos), Ordering::Release);
}

/// Producer: make records up to `tail` visible.
pub(crate) fn publish(shm: &Shm, d: usize, tail: u64) {
    shm.u64_at(ctl_off(d) + CTL_TAIL)
        .store(tail, Ordering::Release);
}

/// Consumer: the producer's published tail (load it once per batch).
pub(crate) fn load_tail(shm: &Shm, d: usize) -> u64 {
    shm.u64_at(ctl_off(d) + CTL_TAIL).load(Ordering::Acquire)
}

/// Consumer: the complete record at `head`, if its stamp says there is one
/// (no tail needed). `Ok(None)`: nothing there yet (then [`check_tail`]).
#[inline(always)]
pub(crate) fn peek(shm: &Shm, d: usize, head: u64) -> Result<Option<Peeked>, Corrupt> {
    if head % REC_ALIGN as u64 != 0 {
        return Err(Corrupt);
    }
    let off = head % RING_SIZE;
    let base = data_off(d) + off as usize;
    let stamp = shm.u32_at(base).load(Ordering::Acquire);
    if stamp == 0 {
        return Ok(None);
    }
    if stamp != stamp_of(head) {
        return Err(Corrupt);
    }
    let mut hb = [0u8; HDR - 4];
    if !shm.read_bytes(base + 4, &mut hb) {
        return Err(Corrupt);
    }
    let hdr = RecHdr::decode(&hb);
    let rl = hdr.footprint();
    let ok_kind = matches!(hdr.kind, REC_SEND | REC_WRITE_IMM | REC_PAD);
    if !ok_kind || off + rl > RING_SIZE {
        return Err(Corrupt);
    }
    let payload = shm.span(base + HDR, hdr.payload_len()).ok_or(Corrupt)?;
    Ok(Some(Peeked {
        hdr,
        rec_len: rl,
        payload,
    }))
}

/// Consumer: whether the stamp word at `head` is set (a record, or a
/// corrupt word [`peek`] will reject). One load of the line the next
/// record arrives in: the whole cost of polling an empty ring.
#[inline(always)]
pub(crate) fn stamped(shm: &Shm, d: usize, head: u64) -> bool {
    let off = (head % RING_SIZE) as usize;
    shm.u32_at(data_off(d) + (off & !(REC_ALIGN - 1)))
        .load(Ordering::Acquire)
        != 0
}

/// Consumer, polling an empty ring at `head`: load the line after the one
/// the next record starts in. A small SEND (16-byte header + payload) spans
/// two lines; the producer writes the second one completely before it
/// stamps the first ([`produce`]), so the next empty poll after the second
/// line changed fetches it while the stamp's line is still in flight: the
/// two cache misses overlap instead of following one another (measured by
/// `benches/baseline.rs --lines`). A plain load: it never writes shared
/// memory, and what it reads is discarded.
#[inline(always)]
pub(crate) fn touch_next_line(shm: &Shm, d: usize, head: u64) {
    let next = ((head % RING_SIZE) | 63) + 1;
    let w = shm
        .u32_at(data_off(d) + (next % RING_SIZE) as usize)
        .load(Ordering::Relaxed);
    std::hint::black_box(w);
}

/// Consumer, after [`peek`] found nothing at `head`: check the published
/// tail. It may lag the stamps (the producer publishes once per batch), but
/// a tail ahead of `head` with still no record there, or further ahead than
/// the ring, is a torn or broken producer.
pub(crate) fn check_tail(shm: &Shm, d: usize, head: u64) -> Result<(), Corrupt> {
    let tail = load_tail(shm, d);
    let ahead = tail.wrapping_sub(head);
    if ahead == 0 || ahead as i64 <= 0 {
        return Ok(());
    }
    if ahead > RING_SIZE {
        return Err(Corrupt);
    }
    // The tail (acquired) covers a record at `head`: its stamp must show.
    match peek(shm, d, head)? {
        Some(_) => Ok(()),
        None => Err(Corrupt),
    }
}

/// Whether a record waits at `head` (CQ arming).
pub(crate) fn has_record(shm: &Shm, d: usize, head: u64) -> bool {
    let off = (head % RING_SIZE) as usize;
    shm.u32_at(data_off(d) + off).load(Ordering::SeqCst) != 0
}

/// Consumer: free everything before `head`.
pub(crate) fn release(shm: &Shm, d: usize, head: u64) {
    shm.u64_at(ctl_off(d) + CTL_HEAD)
        .store(head, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(len: u32, imm: u32) -> RecHdr {
        RecHdr {
            kind: REC_SEND,
            len,
            imm,
            ..RecHdr::default()
        }
    }

    /// Consume the next non-PAD record (there must be one).
    fn next(shm: &Shm, head: &mut u64) -> Peeked {
        loop {
            let p = peek(shm, 0, *head).unwrap().expect("a record");
            *head += p.rec_len;
            if p.hdr.kind != REC_PAD {
                return p;
            }
        }
    }

    #[test]
    fn produce_peek_release_and_wrap() {
        let shm = Shm::create("t-ring", LINK_LEN).unwrap();
        let hc = Cell::new(0);
        let mut tail = 0u64;
        let mut head = 0u64;
        // Fill and drain several times so records wrap with PAD.
        for round in 0..40u32 {
            let len = 300_000 + round * 1000;
            tail = produce(&shm, 0, tail, &hc, send(len, round), |s| {
                // SAFETY: the span is inside the ring mapping.
                unsafe { std::ptr::write_bytes(s.ptr, round as u8, s.len) }
            })
            .unwrap();
            // Visible by its stamp before the tail is published.
            let p = next(&shm, &mut head);
            assert_eq!(p.hdr.imm, round);
            assert_eq!(p.payload.len, len as usize);
            // SAFETY: the payload span is inside the ring mapping.
            let last = unsafe { *p.payload.ptr.add(len as usize - 1) };
            assert_eq!(last, round as u8);
            publish(&shm, 0, tail);
            release(&shm, 0, head);
            assert_eq!(head, tail);
            assert!(peek(&shm, 0, head).unwrap().is_none());
            assert_eq!(check_tail(&shm, 0, head), Ok(()));
        }
        assert!(tail > RING_SIZE * 2, "the records wrapped");
    }

    #[test]
    fn header_fields_roundtrip() {
        for h in [
            RecHdr {
                kind: REC_SEND,
                flags: RF_INV,
                len: SOFT_MAX,
                imm: 7,
                aux: 0xdead_beef,
            },
            RecHdr {
                kind: REC_WRITE_IMM,
                flags: RF_IMM,
                len: u32::MAX,
                imm: 9,
                aux: 0,
            },
        ] {
            assert_eq!(RecHdr::decode(&h.encode()), h);
        }
    }

    const SOFT_MAX: u32 = 1 << 20;

    #[test]
    fn full_ring_refuses_and_torn_tail_is_detected() {
        let shm = Shm::create("t-ring2", LINK_LEN).unwrap();
        let hc = Cell::new(0);
        let mut tail = 0;
        let mut n = 0;
        while let Some(t) = produce(&shm, 0, tail, &hc, send(SOFT_MAX, 0), |_| {}) {
            tail = t;
            n += 1;
        }
        assert_eq!(n, 3);
        publish(&shm, 0, tail);
        let mut head = 0;
        for _ in 0..3 {
            next(&shm, &mut head);
        }
        assert_eq!(check_tail(&shm, 0, head), Ok(()));
        // A tail beyond the ring, or covering records that never show.
        shm.u64_at(ctl_off(0) + CTL_TAIL)
            .store(head + RING_SIZE * 10, Ordering::Release);
        assert_eq!(check_tail(&shm, 0, head), Err(Corrupt));
        shm.u64_at(ctl_off(0) + CTL_TAIL)
            .store(head + 64, Ordering::Release);
        assert_eq!(check_tail(&shm, 0, head), Err(Corrupt));
        // A stamp that is not the one of its position.
        shm.u32_at(data_off(0) + (head % RING_SIZE) as usize)
            .store(stamp_of(head + 16), Ordering::Release);
        assert!(peek(&shm, 0, head).is_err());
    }

    #[test]
    fn records_stay_in_the_hot_window_while_the_consumer_keeps_up() {
        let shm = Shm::create("t-ring3", LINK_LEN).unwrap();
        let hc = Cell::new(0);
        let (mut tail, mut head) = (0u64, 0u64);
        for i in 0..100_000u32 {
            tail = produce(&shm, 0, tail, &hc, send(64, i), |_| {}).unwrap();
            assert_eq!(next(&shm, &mut head).hdr.imm, i);
            release(&shm, 0, head);
            assert!(tail % RING_SIZE <= HOT_WINDOW, "record past the hot window");
        }
        assert!(tail > 4 * RING_SIZE, "positions keep running");
        // A consumer that stops: the producer still gets the window's worth
        // of records, in order, then back-pressure.
        let mut k = 0u32;
        while let Some(t) = produce(&shm, 0, tail, &hc, send(64, k), |_| {}) {
            tail = t;
            k += 1;
        }
        assert!(u64::from(k) * 80 >= HOT_WINDOW / 2, "only {k} records");
        for i in 0..k {
            assert_eq!(next(&shm, &mut head).hdr.imm, i);
        }
        assert_eq!(head, tail);
        release(&shm, 0, head);
        // A record that cannot fit before the window's end with the ring
        // behind it busy takes the rest of the ring, as without a window.
        let big = 1 << 20;
        while tail % RING_SIZE < HOT_WINDOW - 4096 {
            tail = produce(&shm, 0, tail, &hc, send(64, 0), |_| {}).unwrap();
        }
        tail = produce(&shm, 0, tail, &hc, send(big, 1), |_| {}).unwrap();
        assert!(tail % RING_SIZE > HOT_WINDOW + u64::from(big) - 4096);
    }
}
