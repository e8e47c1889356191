//! T10 protection information (`t10-pi.md`): the CRC-16/T10-DIF guard, the
//! 8-byte PI tuple, and generate/verify over interleaved (DIF: data‖PI per
//! interval) and separate (DIX: data buffer + packed tuple buffer) layouts.
//!
//! Also insert (plain → DIF), strip (DIF → plain), their in-place forms, and
//! DIX ↔ DIF conversion. Pure, allocation-free and `unsafe`-free, so the block layer and the
//! software verbs provider's integrity MRs share one implementation.
//!
//! ```
//! use pollux_pi::{crc16_t10dif, generate, verify, Buffers, BuffersMut, PiParams, PiType};
//! assert_eq!(crc16_t10dif(0, b"123456789"), 0xD0DB);
//! let p = PiParams::for_type(PiType::Type1, 512, 5, 0);
//! let mut dif = vec![0xA5u8; 2 * 520];
//! generate(BuffersMut::Dif(&mut dif), &p).unwrap();
//! assert!(verify(Buffers::Dif(&dif), &p).is_ok());
//! dif[3] ^= 1; // corrupt data of block 0
//! assert_eq!(verify(Buffers::Dif(&dif), &p).unwrap_err().block, 0);
//! ```

#![forbid(unsafe_code)]

/// Bytes of one PI tuple.
pub const TUPLE_SIZE: usize = 8;

const POLY: u16 = 0x8BB7;

/// `TABLES[k][b]`: the CRC (from 0) of byte `b` followed by `k` zero bytes.
/// `TABLES[0]` is the classic byte table; the others drive slice-by-8.
const fn make_tables() -> [[u16; 256]; 8] {
    let mut t = [[0u16; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut b = 0;
        while b < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ POLY
            } else {
                crc << 1
            };
            b += 1;
        }
        t[0][i] = crc;
        i += 1;
    }
    let mut k = 1;
    while k < 8 {
        let mut i = 0;
        while i < 256 {
            let prev = t[k - 1][i];
            t[k][i] = (prev << 8) ^ t[0][(prev >> 8) as usize];
            i += 1;
        }
        k += 1;
    }
    t
}

static TABLES: [[u16; 256]; 8] = make_tables();

/// CRC-16/T10-DIF (poly 0x8BB7, MSB first, no reflection, no final XOR),
/// continued from `seed` (0 for a fresh CRC): `crc(A‖B) ==
/// crc16_t10dif(crc16_t10dif(0, A), B)`.
///
/// Table-driven, slice-by-8 (eight 256-entry tables, 4 KiB, built at compile
/// time): eight bytes per step, the byte table for the tail. PCLMUL would be
/// faster but needs `unsafe` for the runtime CPU dispatch, which this crate
/// forbids.
#[inline]
pub fn crc16_t10dif(seed: u16, data: &[u8]) -> u16 {
    let t = &TABLES;
    let mut crc = seed;
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        // The 16-bit state folds into the first two bytes (MSB first).
        let b0 = c[0] ^ (crc >> 8) as u8;
        let b1 = c[1] ^ crc as u8;
        crc = t[7][usize::from(b0)]
            ^ t[6][usize::from(b1)]
            ^ t[5][usize::from(c[2])]
            ^ t[4][usize::from(c[3])]
            ^ t[3][usize::from(c[4])]
            ^ t[2][usize::from(c[5])]
            ^ t[1][usize::from(c[6])]
            ^ t[0][usize::from(c[7])];
    }
    for &b in chunks.remainder() {
        crc = (crc << 8) ^ t[0][usize::from((crc >> 8) as u8 ^ b)];
    }
    crc
}

/// One 8-byte PI tuple (big-endian on the wire and in memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct PiTuple {
    /// CRC-16/T10-DIF of the interval.
    pub guard: u16,
    /// Application tag (0xFFFF = escape).
    pub app_tag: u16,
    /// Reference tag.
    pub ref_tag: u32,
}

impl PiTuple {
    /// The 8 wire bytes.
    pub fn encode(&self) -> [u8; TUPLE_SIZE] {
        let mut b = [0u8; TUPLE_SIZE];
        b[..2].copy_from_slice(&self.guard.to_be_bytes());
        b[2..4].copy_from_slice(&self.app_tag.to_be_bytes());
        b[4..].copy_from_slice(&self.ref_tag.to_be_bytes());
        b
    }

    /// Parse 8 wire bytes.
    pub fn decode(b: &[u8; TUPLE_SIZE]) -> PiTuple {
        PiTuple {
            guard: u16::from_be_bytes([b[0], b[1]]),
            app_tag: u16::from_be_bytes([b[2], b[3]]),
            ref_tag: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
        }
    }
}

/// Which tuple fields to check (bits; `t10-pi.md` §7 `check_mask` groups).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Checks(pub u8);

impl Checks {
    /// Nothing.
    pub const NONE: Checks = Checks(0);
    /// The guard.
    pub const GUARD: Checks = Checks(1);
    /// The application tag (masked).
    pub const APP: Checks = Checks(2);
    /// The reference tag.
    pub const REF: Checks = Checks(4);
    /// Everything.
    pub const ALL: Checks = Checks(7);

    /// Whether every bit of `o` is set.
    pub const fn contains(self, o: Checks) -> bool {
        self.0 & o.0 == o.0
    }

    /// Union.
    pub const fn with(self, o: Checks) -> Checks {
        Checks(self.0 | o.0)
    }

    /// Without `o`.
    pub const fn without(self, o: Checks) -> Checks {
        Checks(self.0 & !o.0)
    }
}

/// The protection types (§4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PiType {
    /// Ref tag = low 32 bits of the LBA, incremented per interval.
    Type1,
    /// Ref tag = seed from the command + interval index.
    Type2,
    /// Ref tag opaque (never checked); escape needs app and ref all ones.
    Type3,
}

impl PiType {
    /// Type `n` (1-3, as NVMe's DPS and SCSI's P_TYPE + 1 number them).
    pub fn from_number(n: u8) -> Option<PiType> {
        match n {
            1 => Some(PiType::Type1),
            2 => Some(PiType::Type2),
            3 => Some(PiType::Type3),
            _ => None,
        }
    }

    /// The first block's reference tag of an I/O at `lba` as Linux seeds
    /// it: the LBA's low 32 bits (Types 1 and 2), 0 (Type 3: opaque).
    pub fn seed(self, lba: u64) -> u32 {
        match self {
            PiType::Type3 => 0,
            _ => lba as u32,
        }
    }
}

/// What to generate and what to expect, per transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PiParams {
    /// Protection interval in bytes (512, 4096, …); must be non-zero.
    pub interval: usize,
    /// Guard seed (normally 0).
    pub guard_seed: u16,
    /// Application tag to write, and to compare under `app_mask`.
    pub app_tag: u16,
    /// Bits of the application tag that are compared.
    pub app_mask: u16,
    /// Reference tag of the first interval.
    pub ref_tag: u32,
    /// Add the interval index to the reference tag (Types 1 and 2).
    pub ref_increment: bool,
    /// An application tag of 0xFFFF disables the checks of that interval.
    pub app_escape: bool,
    /// With `app_escape`: the escape also needs an all-ones reference tag
    /// (Type 3).
    pub ref_escape: bool,
    /// What [`verify`] checks.
    pub checks: Checks,
}

impl PiParams {
    /// Linux-style parameters for `ty`: `seed` is the first interval's
    /// reference tag (Type 1: the LBA mod 2^32), everything checked except
    /// what the type forbids (Type 3 never checks the reference tag), the app
    /// tag compared in full, escapes per §4.
    pub fn for_type(ty: PiType, interval: usize, seed: u32, app_tag: u16) -> PiParams {
        let t3 = ty == PiType::Type3;
        PiParams {
            interval,
            guard_seed: 0,
            app_tag,
            app_mask: 0xFFFF,
            ref_tag: seed,
            ref_increment: !t3,
            app_escape: true,
            ref_escape: t3,
            checks: if t3 {
                Checks::GUARD.with(Checks::APP)
            } else {
                Checks::ALL
            },
        }
    }

    /// [`for_type`](Self::for_type) for an I/O at `lba`, seeded as
    /// [`PiType::seed`] says.
    pub fn for_lba(ty: PiType, interval: usize, lba: u64, app_tag: u16) -> PiParams {
        Self::for_type(ty, interval, ty.seed(lba), app_tag)
    }

    /// The expected reference tag of interval `i`.
    pub fn ref_tag_at(&self, i: u64) -> u32 {
        if self.ref_increment {
            self.ref_tag.wrapping_add(i as u32)
        } else {
            self.ref_tag
        }
    }

    /// The tuple to generate for interval `i` with data `data`.
    pub fn tuple_for(&self, i: u64, data: &[u8]) -> PiTuple {
        PiTuple {
            guard: crc16_t10dif(self.guard_seed, data),
            app_tag: self.app_tag,
            ref_tag: self.ref_tag_at(i),
        }
    }

    /// The tuple to generate for interval `i` whose guard (CRC over the
    /// interval, computed by the caller, e.g. across scatter-gather
    /// segments with [`crc16_t10dif`] continued from [`guard_seed`](Self::guard_seed)) is `guard`.
    pub fn tuple_with_guard(&self, i: u64, guard: u16) -> PiTuple {
        PiTuple {
            guard,
            app_tag: self.app_tag,
            ref_tag: self.ref_tag_at(i),
        }
    }

    /// Whether tuple `t` is an escape (all checks skipped), per
    /// `app_escape`/`ref_escape`.
    pub fn is_escape(&self, t: &PiTuple) -> bool {
        self.app_escape && t.app_tag == 0xFFFF && (!self.ref_escape || t.ref_tag == 0xFFFF_FFFF)
    }

    /// Check tuple `t` of interval `i` (data `data`). `offset` is reported
    /// in the error as is.
    ///
    /// # Errors
    /// The first failing field, checked in the order guard, app tag, ref tag.
    pub fn check(&self, i: u64, data: &[u8], t: &PiTuple, offset: u64) -> Result<(), PiError> {
        if self.is_escape(t) {
            return Ok(());
        }
        let g = if self.checks.contains(Checks::GUARD) {
            crc16_t10dif(self.guard_seed, data)
        } else {
            0
        };
        self.check_with_guard(i, g, t, offset)
    }

    /// [`check`](Self::check) with the interval's guard computed by the
    /// caller (`guard` is ignored unless [`Checks::GUARD`] is set, so a
    /// caller may skip the CRC then).
    ///
    /// # Errors
    /// The first failing field, checked in the order guard, app tag, ref tag.
    pub fn check_with_guard(
        &self,
        i: u64,
        guard: u16,
        t: &PiTuple,
        offset: u64,
    ) -> Result<(), PiError> {
        if self.is_escape(t) {
            return Ok(());
        }
        let err = |kind, expected: u64, actual: u64| PiError {
            kind,
            block: i,
            offset,
            expected,
            actual,
        };
        if self.checks.contains(Checks::GUARD) && guard != t.guard {
            return Err(err(PiErrorKind::Guard, guard.into(), t.guard.into()));
        }
        if self.checks.contains(Checks::APP)
            && (t.app_tag & self.app_mask) != (self.app_tag & self.app_mask)
        {
            return Err(err(
                PiErrorKind::AppTag,
                (self.app_tag & self.app_mask).into(),
                (t.app_tag & self.app_mask).into(),
            ));
        }
        if self.checks.contains(Checks::REF) {
            let r = self.ref_tag_at(i);
            if r != t.ref_tag {
                return Err(err(PiErrorKind::RefTag, r.into(), t.ref_tag.into()));
            }
        }
        Ok(())
    }
}

/// What failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PiErrorKind {
    /// Guard (CRC) mismatch.
    Guard,
    /// Application tag mismatch.
    AppTag,
    /// Reference tag mismatch.
    RefTag,
    /// The buffers do not hold whole intervals (expected/actual: lengths).
    Length,
}

/// A protection-information failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[error("PI {kind:?} error in block {block} (offset {offset}): expected {expected:#x}, found {actual:#x}")]
pub struct PiError {
    /// What failed.
    pub kind: PiErrorKind,
    /// Index of the failing interval in the buffer (add the start LBA for
    /// the failing LBA).
    pub block: u64,
    /// Byte offset of the failing interval in the (first) buffer.
    pub offset: u64,
    /// Expected value.
    pub expected: u64,
    /// Value found.
    pub actual: u64,
}

fn length_error(expected: usize, actual: usize) -> PiError {
    PiError {
        kind: PiErrorKind::Length,
        block: 0,
        offset: 0,
        expected: expected as u64,
        actual: actual as u64,
    }
}

/// Buffers to verify.
#[derive(Debug, Clone, Copy)]
pub enum Buffers<'a> {
    /// Interleaved: `interval` data bytes then a tuple, repeated.
    Dif(&'a [u8]),
    /// Separate: data intervals, and one packed tuple per interval.
    Dix {
        /// Data.
        data: &'a [u8],
        /// Tuples.
        pi: &'a [u8],
    },
}

/// Buffers to generate into.
#[derive(Debug)]
pub enum BuffersMut<'a> {
    /// Interleaved; the tuple bytes are overwritten.
    Dif(&'a mut [u8]),
    /// Separate; `pi` is overwritten.
    Dix {
        /// Data (read only).
        data: &'a [u8],
        /// Tuples (written).
        pi: &'a mut [u8],
    },
}

/// Number of intervals, checking the layout's lengths.
fn blocks(p: &PiParams, data_len: usize, pi_len: Option<usize>) -> Result<usize, PiError> {
    if p.interval == 0 {
        return Err(length_error(1, 0));
    }
    match pi_len {
        None => {
            let b = p.interval + TUPLE_SIZE;
            if data_len % b != 0 {
                return Err(length_error(data_len.next_multiple_of(b), data_len));
            }
            Ok(data_len / b)
        }
        Some(pl) => {
            if data_len % p.interval != 0 {
                return Err(length_error(
                    data_len.next_multiple_of(p.interval),
                    data_len,
                ));
            }
            let n = data_len / p.interval;
            if pl != n * TUPLE_SIZE {
                return Err(length_error(n * TUPLE_SIZE, pl));
            }
            Ok(n)
        }
    }
}

/// Fill in the tuples (app tag, ref tag per `p`, guard over each interval).
///
/// # Errors
/// [`PiErrorKind::Length`] when the buffers do not hold whole intervals.
pub fn generate(bufs: BuffersMut<'_>, p: &PiParams) -> Result<(), PiError> {
    match bufs {
        BuffersMut::Dif(buf) => {
            let n = blocks(p, buf.len(), None)?;
            let b = p.interval + TUPLE_SIZE;
            for (i, blk) in buf.chunks_exact_mut(b).enumerate().take(n) {
                let (data, pi) = blk.split_at_mut(p.interval);
                pi.copy_from_slice(&p.tuple_for(i as u64, data).encode());
            }
        }
        BuffersMut::Dix { data, pi } => {
            blocks(p, data.len(), Some(pi.len()))?;
            for (i, (d, t)) in data
                .chunks_exact(p.interval)
                .zip(pi.chunks_exact_mut(TUPLE_SIZE))
                .enumerate()
            {
                t.copy_from_slice(&p.tuple_for(i as u64, d).encode());
            }
        }
    }
    Ok(())
}

/// Verify every interval per `p.checks` and the escapes.
///
/// # Errors
/// The first failing interval ([`PiError`]; `offset` is the interval's
/// first byte in the interleaved or data buffer), or
/// [`PiErrorKind::Length`].
pub fn verify(bufs: Buffers<'_>, p: &PiParams) -> Result<(), PiError> {
    match bufs {
        Buffers::Dif(buf) => {
            blocks(p, buf.len(), None)?;
            let b = p.interval + TUPLE_SIZE;
            for (i, blk) in buf.chunks_exact(b).enumerate() {
                let (data, pi) = blk.split_at(p.interval);
                let t = tuple_at(pi);
                p.check(i as u64, data, &t, (i * b) as u64)?;
            }
        }
        Buffers::Dix { data, pi } => {
            blocks(p, data.len(), Some(pi.len()))?;
            for (i, (d, t)) in data
                .chunks_exact(p.interval)
                .zip(pi.chunks_exact(TUPLE_SIZE))
                .enumerate()
            {
                p.check(i as u64, d, &tuple_at(t), (i * p.interval) as u64)?;
            }
        }
    }
    Ok(())
}

/// Insert (plain → DIF): copy the plain intervals of `data` into `dif`
/// (`interval + 8` bytes each) and generate their tuples per `p`
/// (SCSI WRITE_INSERT, NVMe PRACT on a write).
///
/// # Errors
/// [`PiErrorKind::Length`] when `data` is not whole intervals or `dif` is
/// not the same number of interleaved intervals.
pub fn insert(data: &[u8], dif: &mut [u8], p: &PiParams) -> Result<(), PiError> {
    let n = blocks(p, dif.len(), None)?;
    if data.len() != n * p.interval {
        return Err(length_error(n * p.interval, data.len()));
    }
    let b = p.interval + TUPLE_SIZE;
    for (i, (d, blk)) in data
        .chunks_exact(p.interval)
        .zip(dif.chunks_exact_mut(b))
        .enumerate()
    {
        let (dd, t) = blk.split_at_mut(p.interval);
        dd.copy_from_slice(d);
        t.copy_from_slice(&p.tuple_for(i as u64, d).encode());
    }
    Ok(())
}

/// Strip (DIF → plain): verify the interleaved intervals of `dif` per
/// `p.checks` (nothing with [`Checks::NONE`]) and copy their data to
/// `data` (SCSI READ_STRIP, NVMe PRACT on a read). On an error `data` holds
/// the intervals before the failing one.
///
/// # Errors
/// The first failing interval, or [`PiErrorKind::Length`].
pub fn strip(dif: &[u8], data: &mut [u8], p: &PiParams) -> Result<(), PiError> {
    let n = blocks(p, dif.len(), None)?;
    if data.len() != n * p.interval {
        return Err(length_error(n * p.interval, data.len()));
    }
    let b = p.interval + TUPLE_SIZE;
    for (i, (blk, d)) in dif
        .chunks_exact(b)
        .zip(data.chunks_exact_mut(p.interval))
        .enumerate()
    {
        let (dd, t) = blk.split_at(p.interval);
        if p.checks != Checks::NONE {
            p.check(i as u64, dd, &tuple_at(t), (i * b) as u64)?;
        }
        d.copy_from_slice(dd);
    }
    Ok(())
}

/// Insert in place: `buf[..n * interval]` holds `n` plain intervals;
/// spread them to `interval + 8` strides and generate their tuples.
/// `buf` must hold at least `n * (interval + 8)` bytes; `n` is
/// `buf.len() / (interval + 8)`. Returns `n`.
///
/// # Errors
/// [`PiErrorKind::Length`] when `p.interval` is zero.
pub fn insert_in_place(buf: &mut [u8], p: &PiParams) -> Result<usize, PiError> {
    if p.interval == 0 {
        return Err(length_error(1, 0));
    }
    let b = p.interval + TUPLE_SIZE;
    let n = buf.len() / b;
    for i in (0..n).rev() {
        buf.copy_within(i * p.interval..(i + 1) * p.interval, i * b);
        let (d, t) = buf[i * b..(i + 1) * b].split_at_mut(p.interval);
        t.copy_from_slice(&p.tuple_for(i as u64, d).encode());
    }
    Ok(n)
}

/// Strip in place: verify the interleaved intervals of `buf` per `p.checks`
/// and pack their data to the front. Returns the data length
/// (`n * interval`).
///
/// # Errors
/// The first failing interval (nothing moved then), or
/// [`PiErrorKind::Length`].
pub fn strip_in_place(buf: &mut [u8], p: &PiParams) -> Result<usize, PiError> {
    let n = blocks(p, buf.len(), None)?;
    if p.checks != Checks::NONE {
        verify(Buffers::Dif(buf), p)?;
    }
    let b = p.interval + TUPLE_SIZE;
    for i in 1..n {
        buf.copy_within(i * b..i * b + p.interval, i * p.interval);
    }
    Ok(n * p.interval)
}

/// DIX → DIF without recomputing anything (pass): interleave `data`
/// intervals and their `pi` tuples into `dif`.
///
/// # Errors
/// [`PiErrorKind::Length`] when the three lengths disagree.
pub fn interleave(data: &[u8], pi: &[u8], dif: &mut [u8], interval: usize) -> Result<(), PiError> {
    let p = PiParams::for_type(PiType::Type1, interval, 0, 0);
    let n = blocks(&p, data.len(), Some(pi.len()))?;
    if dif.len() != n * (interval + TUPLE_SIZE) {
        return Err(length_error(n * (interval + TUPLE_SIZE), dif.len()));
    }
    for ((d, t), blk) in data
        .chunks_exact(interval)
        .zip(pi.chunks_exact(TUPLE_SIZE))
        .zip(dif.chunks_exact_mut(interval + TUPLE_SIZE))
    {
        let (dd, tt) = blk.split_at_mut(interval);
        dd.copy_from_slice(d);
        tt.copy_from_slice(t);
    }
    Ok(())
}

/// DIF → DIX without checking (pass): split `dif` into `data` intervals and
/// packed `pi` tuples.
///
/// # Errors
/// [`PiErrorKind::Length`] when the three lengths disagree.
pub fn deinterleave(
    dif: &[u8],
    data: &mut [u8],
    pi: &mut [u8],
    interval: usize,
) -> Result<(), PiError> {
    let p = PiParams::for_type(PiType::Type1, interval, 0, 0);
    let n = blocks(&p, data.len(), Some(pi.len()))?;
    if dif.len() != n * (interval + TUPLE_SIZE) {
        return Err(length_error(n * (interval + TUPLE_SIZE), dif.len()));
    }
    for ((d, t), blk) in data
        .chunks_exact_mut(interval)
        .zip(pi.chunks_exact_mut(TUPLE_SIZE))
        .zip(dif.chunks_exact(interval + TUPLE_SIZE))
    {
        let (dd, tt) = blk.split_at(interval);
        d.copy_from_slice(dd);
        t.copy_from_slice(tt);
    }
    Ok(())
}

fn tuple_at(b: &[u8]) -> PiTuple {
    let mut t = [0u8; TUPLE_SIZE];
    t.copy_from_slice(&b[..TUPLE_SIZE]);
    PiTuple::decode(&t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bitwise(data: &[u8]) -> u16 {
        let mut crc = 0u16;
        for &b in data {
            crc ^= u16::from(b) << 8;
            for _ in 0..8 {
                crc = if crc & 0x8000 != 0 {
                    (crc << 1) ^ POLY
                } else {
                    crc << 1
                };
            }
        }
        crc
    }

    fn ramp(n: usize) -> Vec<u8> {
        (0..n).map(|i| i as u8).collect()
    }

    #[test]
    fn types_by_number_and_lba_seeds() {
        assert_eq!(PiType::from_number(2), Some(PiType::Type2));
        assert_eq!(PiType::from_number(0), None);
        assert_eq!(PiType::Type1.seed(0x1_0000_0007), 7);
        assert_eq!(PiType::Type3.seed(9), 0);
        let p = PiParams::for_lba(PiType::Type2, 512, 40, 3);
        assert_eq!((p.ref_tag, p.app_tag, p.ref_increment), (40, 3, true));
    }

    #[test]
    fn known_vectors_from_t10_pi_md() {
        assert_eq!(crc16_t10dif(0, b"123456789"), 0xD0DB);
        assert_eq!(crc16_t10dif(0, &[0; 512]), 0x0000);
        assert_eq!(crc16_t10dif(0, &[0xFF; 512]), 0xE6A1);
        assert_eq!(crc16_t10dif(0, &ramp(512)), 0x4F10);
        assert_eq!(crc16_t10dif(0, &ramp(256)), 0x563B);
        assert_eq!(crc16_t10dif(0, &[0xFF; 4096]), 0x8B5D);
        assert_eq!(crc16_t10dif(0, &ramp(4096)), 0x8F6D);
        assert_eq!(crc16_t10dif(0, &[0xA5; 512]), 0x9EC6);
        assert_eq!(crc16_t10dif(0, &[0x01]), 0x8BB7);
        assert_eq!(crc16_t10dif(0, b"abc"), 0x443B);
        // Incremental.
        assert_eq!(crc16_t10dif(0, b"1234"), 0x337A);
        assert_eq!(crc16_t10dif(0x337A, b"56789"), 0xD0DB);
    }

    #[test]
    fn table_matches_bitwise_on_pseudo_random_data() {
        let mut x = 0x1234_5678u32;
        let data: Vec<u8> = (0..10_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        for len in [0, 1, 7, 512, 4096, 10_000] {
            assert_eq!(crc16_t10dif(0, &data[..len]), bitwise(&data[..len]));
        }
    }

    #[test]
    fn worked_tuples() {
        let t = PiParams::for_type(PiType::Type1, 512, 5, 0).tuple_for(0, &[0xFF; 512]);
        assert_eq!(t.encode(), [0xE6, 0xA1, 0, 0, 0, 0, 0, 5]);
        let lba: u64 = 0x1_0000_0007;
        let t = PiParams::for_type(PiType::Type1, 512, lba as u32, 0).tuple_for(0, &ramp(512));
        assert_eq!(t.encode(), [0x4F, 0x10, 0, 0, 0, 0, 0, 7]);
        assert_eq!(PiTuple::decode(&t.encode()), t);
    }

    #[test]
    fn dif_and_dix_generate_verify_and_each_error_kind() {
        for interval in [512usize, 4096] {
            let p = PiParams::for_type(PiType::Type1, interval, 100, 0x42);
            let data: Vec<u8> = (0..4 * interval).map(|i| (i * 7 + 1) as u8).collect();
            let mut pi = vec![0u8; 4 * TUPLE_SIZE];
            generate(
                BuffersMut::Dix {
                    data: &data,
                    pi: &mut pi,
                },
                &p,
            )
            .unwrap();
            verify(
                Buffers::Dix {
                    data: &data,
                    pi: &pi,
                },
                &p,
            )
            .unwrap();
            // The same as DIF.
            let mut dif = Vec::new();
            for (d, t) in data.chunks(interval).zip(pi.chunks(8)) {
                dif.extend_from_slice(d);
                dif.extend_from_slice(t);
            }
            let mut dif2 = dif.clone();
            generate(BuffersMut::Dif(&mut dif2), &p).unwrap();
            assert_eq!(dif, dif2);
            verify(Buffers::Dif(&dif), &p).unwrap();
            let b = interval + 8;
            // Guard.
            let mut bad = dif.clone();
            bad[2 * b + 10] ^= 0x80;
            let e = verify(Buffers::Dif(&bad), &p).unwrap_err();
            assert_eq!(
                (e.kind, e.block, e.offset),
                (PiErrorKind::Guard, 2, 2 * b as u64)
            );
            // App tag.
            let mut bad = dif.clone();
            bad[b + interval + 3] ^= 1;
            let e = verify(Buffers::Dif(&bad), &p).unwrap_err();
            assert_eq!(
                (e.kind, e.block, e.expected, e.actual),
                (PiErrorKind::AppTag, 1, 0x42, 0x43)
            );
            // Ref tag (DIX).
            let mut badpi = pi.clone();
            badpi[3 * 8 + 7] ^= 1;
            let e = verify(
                Buffers::Dix {
                    data: &data,
                    pi: &badpi,
                },
                &p,
            )
            .unwrap_err();
            assert_eq!((e.kind, e.block, e.expected), (PiErrorKind::RefTag, 3, 103));
            assert_eq!(e.offset, 3 * interval as u64);
            // Masked app tag and disabled checks pass.
            let mut q = p;
            q.app_mask = 0xFE;
            let mut bad = dif.clone();
            bad[b + interval + 3] ^= 1;
            verify(Buffers::Dif(&bad), &q).unwrap();
        }
    }

    #[test]
    fn slice_by_8_matches_bitwise_at_every_length_and_seed() {
        let data: Vec<u8> = (0..300u32).map(|i| (i * 31 + 7) as u8).collect();
        for len in 0..data.len() {
            assert_eq!(
                crc16_t10dif(0, &data[..len]),
                bitwise(&data[..len]),
                "len {len}"
            );
        }
        // Continuation across any split.
        for cut in [0, 1, 5, 8, 9, 17, 299] {
            let a = crc16_t10dif(0, &data[..cut]);
            assert_eq!(crc16_t10dif(a, &data[cut..]), bitwise(&data));
        }
        assert_eq!(crc16_t10dif(0, &[0u8; 4096]), 0);
    }

    #[test]
    fn insert_strip_interleave_round_trips() {
        for interval in [512usize, 4096] {
            let p = PiParams::for_type(PiType::Type1, interval, 7, 0x1234);
            let data: Vec<u8> = (0..3 * interval).map(|i| (i % 253 + 1) as u8).collect();
            let mut dif = vec![0u8; 3 * (interval + 8)];
            insert(&data, &mut dif, &p).unwrap();
            verify(Buffers::Dif(&dif), &p).unwrap();
            let mut gen = dif.clone();
            generate(BuffersMut::Dif(&mut gen), &p).unwrap();
            assert_eq!(gen, dif);
            let mut back = vec![0u8; data.len()];
            strip(&dif, &mut back, &p).unwrap();
            assert_eq!(back, data);
            // DIF <-> DIX.
            let (mut d2, mut pi) = (vec![0u8; data.len()], vec![0u8; 24]);
            deinterleave(&dif, &mut d2, &mut pi, interval).unwrap();
            assert_eq!(d2, data);
            verify(Buffers::Dix { data: &d2, pi: &pi }, &p).unwrap();
            let mut dif2 = vec![0u8; dif.len()];
            interleave(&d2, &pi, &mut dif2, interval).unwrap();
            assert_eq!(dif2, dif);
            // In place.
            let mut buf = vec![0u8; dif.len()];
            buf[..data.len()].copy_from_slice(&data);
            assert_eq!(insert_in_place(&mut buf, &p).unwrap(), 3);
            assert_eq!(buf, dif);
            let mut bad = buf.clone();
            bad[interval + 8 + 5] ^= 1;
            let e = strip_in_place(&mut bad, &p).unwrap_err();
            assert_eq!((e.kind, e.block), (PiErrorKind::Guard, 1));
            assert_eq!(strip_in_place(&mut buf, &p).unwrap(), data.len());
            assert_eq!(&buf[..data.len()], &data[..]);
            // Strip reports the failing interval; lengths are checked.
            let mut bad = dif.clone();
            bad[2 * (interval + 8) + interval + 7] ^= 1;
            let e = strip(&bad, &mut back, &p).unwrap_err();
            assert_eq!((e.kind, e.block, e.expected), (PiErrorKind::RefTag, 2, 9));
            assert_eq!(
                insert(&data[1..], &mut dif, &p).unwrap_err().kind,
                PiErrorKind::Length
            );
        }
    }

    #[test]
    fn check_with_guard_matches_check() {
        let p = PiParams::for_type(PiType::Type2, 512, 40, 3);
        let d = [0x5Au8; 512];
        let t = p.tuple_for(2, &d);
        assert_eq!(p.tuple_with_guard(2, crc16_t10dif(0, &d)), t);
        p.check_with_guard(2, t.guard, &t, 0).unwrap();
        let e = p.check_with_guard(2, t.guard ^ 1, &t, 0).unwrap_err();
        assert_eq!(e.kind, PiErrorKind::Guard);
        assert!(!p.is_escape(&t));
    }

    #[test]
    fn escapes_type3_and_lengths() {
        let p1 = PiParams::for_type(PiType::Type1, 512, 0, 0);
        let mut blk = vec![0x11u8; 520];
        blk[512..].copy_from_slice(&[0, 0, 0xFF, 0xFF, 1, 2, 3, 4]);
        verify(Buffers::Dif(&blk), &p1).unwrap();
        let p3 = PiParams::for_type(PiType::Type3, 512, 9, 0);
        // Type 3: app escape alone is not enough, the guard is checked.
        assert_eq!(
            verify(Buffers::Dif(&blk), &p3).unwrap_err().kind,
            PiErrorKind::Guard
        );
        blk[516..].copy_from_slice(&[0xFF; 4]);
        verify(Buffers::Dif(&blk), &p3).unwrap();
        // Type 3 never checks (nor increments) the ref tag.
        let mut two = vec![0x33u8; 1040];
        generate(BuffersMut::Dif(&mut two), &p3).unwrap();
        assert_eq!(&two[1036..1040], &9u32.to_be_bytes());
        two[1039] ^= 0xFF;
        verify(Buffers::Dif(&two), &p3).unwrap();
        // Lengths.
        let e = verify(Buffers::Dif(&[0u8; 519]), &p1).unwrap_err();
        assert_eq!(
            (e.kind, e.expected, e.actual),
            (PiErrorKind::Length, 520, 519)
        );
        let e = verify(
            Buffers::Dix {
                data: &[0u8; 512],
                pi: &[0u8; 4],
            },
            &p1,
        )
        .unwrap_err();
        assert_eq!(e.kind, PiErrorKind::Length);
        // Ref tag wraps at 2^32.
        let pw = PiParams::for_type(PiType::Type1, 512, u32::MAX, 0);
        assert_eq!(pw.ref_tag_at(1), 0);
    }
}
