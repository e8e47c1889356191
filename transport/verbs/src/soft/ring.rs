//! The shared-memory link between two QPs: one memfd holding a control block
//! and a single-producer/single-consumer byte ring per direction.
//!
//! Layout: page 0 header; control block of direction `d` at
//! `4096 * (1 + d)` (`tail` @0, `head` @64, `nak` @128, `fatal` @192,
//! `consumer_armed` @256, `producer_armed` @320, `rnr_retry` @384,
//! `sig_error` @448); ring data of direction `d` at `16384 + d * RING_SIZE`.
//! Direction 0 carries active → passive traffic.
//!
//! Records are 16-byte aligned (a 64-byte SEND takes 80 bytes of ring, not
//! 128: fewer cache lines move between the cores): a 16-byte header `{kind u8, flags u8,
//! pad u16, len u32, imm u32, aux u32}` and `len` payload bytes. A record
//! never wraps: a PAD record fills the end of the ring instead. Positions are
//! free-running `u64`s. The consumer validates every value it reads (tail
//! distance, kind, length) and treats a violation as a fatal protocol error,
//! so a broken peer can never make it read out of bounds or loop.

use std::cell::Cell;
use std::sync::atomic::Ordering;

use super::shm::{Shm, Span};

/// Bytes of ring data per direction (power of two, ≥ 2 × max message).
pub const RING_SIZE: u64 = 4 << 20;
/// Total size of a link memfd.
pub const LINK_LEN: usize = 16384 + 2 * RING_SIZE as usize;

pub(crate) const CTL_TAIL: usize = 0;
pub(crate) const CTL_HEAD: usize = 64;
pub(crate) const CTL_NAK: usize = 128;
pub(crate) const CTL_FATAL: usize = 192;
pub(crate) const CTL_CONSUMER_ARMED: usize = 256;
pub(crate) const CTL_PRODUCER_ARMED: usize = 320;
pub(crate) const CTL_RNR_RETRY: usize = 384;
/// A PI error the producer found in the consumer's integrity MR:
/// `valid u32 @0, key u32 @4, kind u32 @8, expected u64 @16, actual u64 @24,
/// offset u64 @32` (the consumer clears `valid` when it takes it).
pub(crate) const CTL_SIGERR: usize = 448;
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

/// A record header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RecHdr {
    pub(crate) kind: u8,
    pub(crate) flags: u8,
    pub(crate) len: u32,
    pub(crate) imm: u32,
    pub(crate) aux: u32,
}

impl RecHdr {
    fn encode(&self) -> [u8; HDR] {
        let mut b = [0u8; HDR];
        b[0] = self.kind;
        b[1] = self.flags;
        b[4..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..12].copy_from_slice(&self.imm.to_le_bytes());
        b[12..16].copy_from_slice(&self.aux.to_le_bytes());
        b
    }

    fn decode(b: &[u8; HDR]) -> RecHdr {
        let u = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        RecHdr {
            kind: b[0],
            flags: b[1],
            len: u(4),
            imm: u(8),
            aux: u(12),
        }
    }
}

pub(crate) fn rec_len(payload: usize) -> u64 {
    ((HDR + payload + REC_ALIGN - 1) & !(REC_ALIGN - 1)) as u64
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
/// writes the payload into the given span. Returns the new tail, or `None`
/// when the ring lacks space (back-pressure: retry later).
/// `head_cache` is the producer's last view of the consumer's head: the
/// shared head line is read only when the cached view shows no room (one
/// cache-line transfer per ring's worth of records, not per record).
pub(crate) fn produce(
    shm: &Shm,
    d: usize,
    tail: u64,
    head_cache: &Cell<u64>,
    hdr: RecHdr,
    fill: impl FnOnce(Span),
) -> Option<u64> {
    let len = hdr.len as usize;
    let need = rec_len(len);
    let off = tail % RING_SIZE;
    let pad = if off + need > RING_SIZE {
        RING_SIZE - off
    } else {
        0
    };
    let fits = |head: u64| {
        let used = tail.wrapping_sub(head);
        used <= RING_SIZE && used + pad + need <= RING_SIZE
    };
    if !fits(head_cache.get()) {
        let head = shm.u64_at(ctl_off(d) + CTL_HEAD).load(Ordering::Acquire);
        head_cache.set(head);
        if !fits(head) {
            return None;
        }
    }
    let base = data_off(d);
    let mut t = tail;
    if pad > 0 {
        let p = RecHdr {
            kind: REC_PAD,
            len: (pad as usize - HDR) as u32,
            ..RecHdr::default()
        };
        shm.write_bytes(base + off as usize, &p.encode());
        t += pad;
    }
    let o = base + (t % RING_SIZE) as usize;
    // One bounds check for header and payload (the record fits the ring:
    // checked above; the link mapping is writable on both sides).
    let rec = shm.span(o, HDR + len)?;
    // SAFETY: `rec` covers `HDR + len` bytes of the live link mapping.
    unsafe {
        rec.ptr.cast::<[u8; HDR]>().write_unaligned(hdr.encode());
    }
    fill(Span {
        // SAFETY: `HDR <= rec.len`.
        ptr: unsafe { rec.ptr.add(HDR) },
        len,
    });
    Some(t + need)
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

/// Consumer: look at the record at `head`, if any, given a `tail` from
/// [`load_tail`].
pub(crate) fn peek(shm: &Shm, d: usize, head: u64, tail: u64) -> Result<Option<Peeked>, Corrupt> {
    let avail = tail.wrapping_sub(head);
    if avail == 0 {
        return Ok(None);
    }
    if avail > RING_SIZE || head % REC_ALIGN as u64 != 0 {
        return Err(Corrupt);
    }
    let off = head % RING_SIZE;
    let base = data_off(d) + off as usize;
    let mut hb = [0u8; HDR];
    if !shm.read_bytes(base, &mut hb) {
        return Err(Corrupt);
    }
    let hdr = RecHdr::decode(&hb);
    let len = hdr.len as usize;
    let rl = rec_len(len);
    let ok_kind = matches!(hdr.kind, REC_SEND | REC_WRITE_IMM | REC_PAD);
    let payload_len = if hdr.kind == REC_WRITE_IMM || hdr.kind == REC_PAD {
        0
    } else {
        len
    };
    if !ok_kind || rl > avail || off + rl > RING_SIZE {
        return Err(Corrupt);
    }
    let payload = shm.span(base + HDR, payload_len).ok_or(Corrupt)?;
    Ok(Some(Peeked {
        hdr,
        rec_len: rl,
        payload,
    }))
}

/// Consumer: free everything before `head`.
pub(crate) fn release(shm: &Shm, d: usize, head: u64) {
    shm.u64_at(ctl_off(d) + CTL_HEAD)
        .store(head, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn produce_peek_release_and_wrap() {
        let shm = Shm::create("t-ring", LINK_LEN).unwrap();
        let hc = Cell::new(0);
        let mut tail = 0u64;
        let mut head = 0u64;
        // Fill and drain several times so records wrap with PAD.
        for round in 0..40u32 {
            let len = 300_000 + round * 1000;
            let hdr = RecHdr {
                kind: REC_SEND,
                len,
                imm: round,
                ..RecHdr::default()
            };
            tail = produce(&shm, 0, tail, &hc, hdr, |s| {
                // SAFETY: the span is inside the ring mapping.
                unsafe { std::ptr::write_bytes(s.ptr, round as u8, s.len) }
            })
            .unwrap();
            publish(&shm, 0, tail);
            loop {
                let p = peek(&shm, 0, head, load_tail(&shm, 0)).unwrap().unwrap();
                head += p.rec_len;
                if p.hdr.kind == REC_PAD {
                    continue;
                }
                assert_eq!(p.hdr.imm, round);
                assert_eq!(p.payload.len, len as usize);
                break;
            }
            release(&shm, 0, head);
        }
        assert!(peek(&shm, 0, head, load_tail(&shm, 0)).unwrap().is_none());
    }

    #[test]
    fn full_ring_refuses_and_corrupt_tail_is_detected() {
        let shm = Shm::create("t-ring2", LINK_LEN).unwrap();
        let hc = Cell::new(0);
        let mut tail = 0;
        let hdr = RecHdr {
            kind: REC_SEND,
            len: 1 << 20,
            ..RecHdr::default()
        };
        let mut n = 0;
        while let Some(t) = produce(&shm, 0, tail, &hc, hdr, |_| {}) {
            tail = t;
            n += 1;
        }
        assert_eq!(n, 3);
        shm.u64_at(ctl_off(0) + CTL_TAIL)
            .store(RING_SIZE * 10, Ordering::Release);
        assert_eq!(peek(&shm, 0, 0, load_tail(&shm, 0)).err(), Some(Corrupt));
    }
}
