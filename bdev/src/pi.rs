//! T10 protection information in the bdev layer (`t10-pi.md`).
//!
//! A bdev formatted with metadata and a PI type ([`BdevInfo::pi_type`])
//! keeps one 8-byte tuple (guard CRC-16/T10-DIF, application tag, reference
//! tag, all big-endian) per block, in the **last** 8 bytes of the block's
//! metadata. The guard covers the block's data and the metadata bytes before
//! the tuple (all of them zero-length when `md = 8`). The metadata is either
//! interleaved with the data (DIF, "extended LBA": 520- or 4104-byte blocks
//! in the data buffers) or separate (DIX: the I/O's `md_bufs`, `md` bytes per
//! block).
//!
//! # Per-I/O action
//!
//! [`IoChannel::read_pi`](crate::IoChannel::read_pi),
//! [`write_pi`](crate::IoChannel::write_pi) and
//! [`submit_with_pi`](crate::IoChannel::submit_with_pi) take a [`PiAction`]:
//!
//! - write, `generate`: the generic layer fills in every block's tuple
//!   (write-generate, in the caller's buffers) before the backend sees it;
//! - write, not `generate`: it verifies the caller's tuples per `checks`
//!   before the backend sees them (a failure never reaches the medium);
//! - read: once the backend completes, it verifies per `checks`
//!   (read-verify).
//!
//! A failure completes the I/O with [`IoError::Pi`] (kind, failing LBA,
//! expected and actual value). I/Os without an action pass the metadata
//! through untouched. Reference tags: Type 1 expects the low 32 bits of each
//! block's LBA; Type 2 expects [`PiAction::ref_tag`] plus the block's index
//! in the I/O; Type 3 never checks it (generation writes `ref_tag` as is).
//! An application tag of 0xFFFF (Type 3: and a reference tag of
//! 0xFFFF_FFFF) escapes all checks of its block.
//!
//! # Library functions
//!
//! [`PiFormat`] does the same on any [`SgList`]s, with no allocation:
//! [`generate`](PiFormat::generate), [`verify`](PiFormat::verify),
//! [`strip`](PiFormat::strip) (copy the data out, without metadata, after
//! checking) and [`insert`](PiFormat::insert) (copy plain data in and
//! generate the metadata). Segments may split blocks and tuples anywhere.
//! The contiguous-buffer primitives (the CRC, [`PiTuple`], `pollux_pi`'s
//! `generate`/`verify`/`insert`/`strip`) are re-exported from `pollux-pi`.

pub use pollux_pi::{crc16_t10dif, Checks as PiChecks, PiErrorKind, PiParams, PiTuple};

use pollux_reactor::mem::DmaBuf;

use crate::info::{BdevInfo, PiType, PI_TUPLE_SIZE};
use crate::io::{IoError, SgList};

const TUPLE: usize = PI_TUPLE_SIZE as usize;

/// What the generic layer does about protection information for one I/O.
///
/// One action serves reads and writes alike (so a resubmitted slot may flip
/// between them): `generate` applies to writes, `checks` to reads and to
/// writes that do not generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PiAction {
    /// Fields to verify: on a read after the backend completes it, on a
    /// write (that does not generate) before the backend sees it.
    /// [`PiChecks::REF`] is ignored on Type 3.
    pub checks: PiChecks,
    /// On a write: generate every block's tuple into the buffers first.
    pub generate: bool,
    /// Type 2: the first block's reference tag (the command's initial
    /// reference tag; block `i` of the I/O gets `ref_tag + i`). Type 3: the
    /// opaque reference tag generation writes. Ignored on Type 1 (the LBA).
    pub ref_tag: u32,
    /// The application tag to generate, and to compare under `app_mask`
    /// when `checks` has [`PiChecks::APP`].
    pub app_tag: u16,
    /// Bits of the application tag that are compared.
    pub app_mask: u16,
}

impl PiAction {
    /// Do nothing (the metadata passes through untouched).
    pub const fn none() -> Self {
        Self {
            checks: PiChecks::NONE,
            generate: false,
            ref_tag: 0,
            app_tag: 0,
            app_mask: 0xFFFF,
        }
    }

    /// Write-generate only (Linux `write_generate`): tuples with app tag 0.
    pub const fn write_generate() -> Self {
        Self {
            generate: true,
            ..Self::none()
        }
    }

    /// Read-verify only (Linux `read_verify`): the guard and the reference tag.
    pub const fn read_verify() -> Self {
        Self {
            checks: PiChecks::GUARD.with(PiChecks::REF),
            ..Self::none()
        }
    }

    /// Write-generate and read-verify.
    pub const fn both() -> Self {
        Self {
            generate: true,
            ..Self::read_verify()
        }
    }

    /// Verify the caller's tuples on writes and reads per `checks`.
    pub const fn verify(checks: PiChecks) -> Self {
        Self {
            checks,
            ..Self::none()
        }
    }

    /// With these checks.
    pub const fn with_checks(mut self, checks: PiChecks) -> Self {
        self.checks = checks;
        self
    }

    /// With this reference tag (Type 2 seed, Type 3 opaque value).
    pub const fn with_ref_tag(mut self, ref_tag: u32) -> Self {
        self.ref_tag = ref_tag;
        self
    }

    /// With this application tag, compared under `mask` (adds [`PiChecks::APP`]).
    pub const fn with_app_tag(mut self, app_tag: u16, mask: u16) -> Self {
        self.app_tag = app_tag;
        self.app_mask = mask;
        self.checks = self.checks.with(PiChecks::APP);
        self
    }

    /// Whether this action does anything to an I/O of this direction.
    #[inline]
    pub fn acts_on(&self, write: bool) -> bool {
        (write && self.generate) || self.checks != PiChecks::NONE
    }
}

impl Default for PiAction {
    fn default() -> Self {
        Self::none()
    }
}

/// The PI layout of a bdev: what [`PiFormat`]'s functions need to find and
/// compute each block's tuple.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PiFormat {
    block_size: usize,
    md_size: usize,
    interleave: bool,
    pi_type: PiType,
}

impl PiFormat {
    /// A format, or `None` when `pi_type` is [`PiType::None`], `md_size` is
    /// under 8 bytes or `block_size` is zero.
    pub fn new(block_size: u32, md_size: u32, interleave: bool, pi_type: PiType) -> Option<Self> {
        if pi_type == PiType::None || md_size < PI_TUPLE_SIZE || block_size == 0 {
            return None;
        }
        Some(Self {
            block_size: block_size as usize,
            md_size: md_size as usize,
            interleave,
            pi_type,
        })
    }

    /// The format of a bdev, or `None` when it has no PI.
    pub fn of(info: &BdevInfo) -> Option<Self> {
        Self::new(
            info.block_size(),
            info.md_size(),
            info.md_interleave(),
            info.pi_type(),
        )
    }

    /// The PI type.
    pub fn pi_type(&self) -> PiType {
        self.pi_type
    }

    /// Whether the metadata is interleaved with the data.
    pub fn interleave(&self) -> bool {
        self.interleave
    }

    /// Bytes of one block in the data buffers.
    pub fn buf_block_size(&self) -> usize {
        if self.interleave {
            self.block_size + self.md_size
        } else {
            self.block_size
        }
    }

    /// `pollux-pi` parameters for an I/O starting at `lba` (interval = the
    /// data block; the guard also covers the metadata before the tuple).
    pub fn params(&self, lba: u64, a: &PiAction) -> PiParams {
        let t3 = self.pi_type == PiType::Type3;
        PiParams {
            interval: self.block_size,
            guard_seed: 0,
            app_tag: a.app_tag,
            app_mask: a.app_mask,
            ref_tag: match self.pi_type {
                PiType::Type1 => lba as u32,
                _ => a.ref_tag,
            },
            ref_increment: !t3,
            app_escape: true,
            ref_escape: t3,
            checks: if t3 {
                a.checks.without(PiChecks::REF)
            } else {
                a.checks
            },
        }
    }

    /// Blocks in `bufs` (and `md` when separate), checking their lengths.
    fn blocks(&self, bufs: usize, md: usize) -> Result<u64, IoError> {
        let bb = self.buf_block_size();
        if bufs % bb != 0 {
            return Err(IoError::BadLength {
                expected: bufs.next_multiple_of(bb) as u64,
                actual: bufs as u64,
            });
        }
        let n = bufs / bb;
        let want_md = if self.interleave { 0 } else { n * self.md_size };
        if md != want_md {
            return Err(IoError::BadMdLength {
                expected: want_md as u64,
                actual: md as u64,
            });
        }
        Ok(n as u64)
    }

    fn err(lba: u64, e: pollux_pi::PiError) -> IoError {
        IoError::Pi {
            kind: e.kind,
            lba: lba.wrapping_add(e.block),
            expected: e.expected,
            actual: e.actual,
        }
    }

    /// Generate every block's tuple (write-generate) into `bufs`
    /// (interleaved) or `md` (separate; `md` must be empty when
    /// interleaved). The metadata bytes before each tuple are kept and
    /// covered by the guard.
    ///
    /// # Errors
    /// [`IoError::BadLength`] / [`IoError::BadMdLength`] when the buffers
    /// are not whole blocks of this format.
    pub fn generate(
        &self,
        lba: u64,
        a: &PiAction,
        bufs: &mut SgList,
        md: &mut SgList,
    ) -> Result<(), IoError> {
        let n = self.blocks(bufs.total_len(), md.total_len())?;
        let p = self.params(lba, a);
        let pre = self.md_size - TUPLE;
        let mut d = CurMut::new(bufs.as_mut_slice());
        if self.interleave {
            for i in 0..n {
                let g = d.crc(self.block_size + pre, 0);
                d.write(&p.tuple_with_guard(i, g).encode());
            }
        } else {
            let mut m = CurMut::new(md.as_mut_slice());
            for i in 0..n {
                let g = d.crc(self.block_size, 0);
                let g = m.crc(pre, g);
                m.write(&p.tuple_with_guard(i, g).encode());
            }
        }
        Ok(())
    }

    /// Verify every block per `a.checks` and the escapes.
    ///
    /// # Errors
    /// [`IoError::Pi`] for the first failing block (its LBA), or a length
    /// error as [`generate`](Self::generate).
    pub fn verify(
        &self,
        lba: u64,
        a: &PiAction,
        bufs: &SgList,
        md: &SgList,
    ) -> Result<(), IoError> {
        let n = self.blocks(bufs.total_len(), md.total_len())?;
        let p = self.params(lba, a);
        let guard = p.checks.contains(PiChecks::GUARD);
        let pre = self.md_size - TUPLE;
        let mut d = Cur::new(bufs.as_slice());
        let mut m = Cur::new(md.as_slice());
        let mut t = [0u8; TUPLE];
        for i in 0..n {
            let g = if guard {
                let g = d.crc(self.block_size, 0);
                if self.interleave {
                    d.crc(pre, g)
                } else {
                    m.crc(pre, g)
                }
            } else {
                d.skip(self.block_size);
                if self.interleave {
                    d.skip(pre);
                } else {
                    m.skip(pre);
                }
                0
            };
            if self.interleave {
                d.read(&mut t);
            } else {
                m.read(&mut t);
            }
            p.check_with_guard(i, g, &PiTuple::decode(&t), 0)
                .map_err(|e| Self::err(lba, e))?;
        }
        Ok(())
    }

    /// Strip: verify per `a.checks` (none with [`PiChecks::NONE`]) and copy
    /// the data of `src` (+ `src_md` when separate) to `dst`, which must
    /// hold `block_size` bytes per block (no metadata). On an error, `dst`
    /// holds the blocks before the failing one.
    ///
    /// # Errors
    /// [`IoError::Pi`] for the first failing block, [`IoError::BadLength`]
    /// when `dst` has the wrong size, or a length error on `src`/`src_md`.
    pub fn strip(
        &self,
        lba: u64,
        a: &PiAction,
        src: &SgList,
        src_md: &SgList,
        dst: &mut SgList,
    ) -> Result<(), IoError> {
        let n = self.blocks(src.total_len(), src_md.total_len())?;
        let want = n as usize * self.block_size;
        if dst.total_len() != want {
            return Err(IoError::BadLength {
                expected: want as u64,
                actual: dst.total_len() as u64,
            });
        }
        let p = self.params(lba, a);
        let pre = self.md_size - TUPLE;
        let check = p.checks != PiChecks::NONE;
        let mut s = Cur::new(src.as_slice());
        let mut sm = Cur::new(src_md.as_slice());
        let mut o = CurMut::new(dst.as_mut_slice());
        let mut t = [0u8; TUPLE];
        for i in 0..n {
            let g = o.copy_from(&mut s, self.block_size, check);
            let mc = if self.interleave { &mut s } else { &mut sm };
            let g = if check {
                mc.crc(pre, g)
            } else {
                mc.skip(pre);
                0
            };
            mc.read(&mut t);
            if check {
                p.check_with_guard(i, g, &PiTuple::decode(&t), 0)
                    .map_err(|e| Self::err(lba, e))?;
            }
        }
        Ok(())
    }

    /// Insert: copy the plain data of `src` (`block_size` bytes per block)
    /// into `dst` (+ `dst_md` when separate) and generate each block's
    /// metadata: zeroes, then the tuple per `a`.
    ///
    /// # Errors
    /// [`IoError::BadLength`] when `src` has the wrong size, or a length
    /// error on `dst`/`dst_md`.
    pub fn insert(
        &self,
        lba: u64,
        a: &PiAction,
        src: &SgList,
        dst: &mut SgList,
        dst_md: &mut SgList,
    ) -> Result<(), IoError> {
        let n = self.blocks(dst.total_len(), dst_md.total_len())?;
        let want = n as usize * self.block_size;
        if src.total_len() != want {
            return Err(IoError::BadLength {
                expected: want as u64,
                actual: src.total_len() as u64,
            });
        }
        let p = self.params(lba, a);
        let pre = self.md_size - TUPLE;
        let mut s = Cur::new(src.as_slice());
        let mut o = CurMut::new(dst.as_mut_slice());
        let mut om = CurMut::new(dst_md.as_mut_slice());
        for i in 0..n {
            let g = o.copy_from(&mut s, self.block_size, true);
            let mc = if self.interleave { &mut o } else { &mut om };
            let g = mc.zero(pre, g);
            mc.write(&p.tuple_with_guard(i, g).encode());
        }
        Ok(())
    }
}

/// A read cursor over a scatter-gather list.
struct Cur<'a> {
    segs: &'a [DmaBuf],
    i: usize,
    off: usize,
}

impl<'a> Cur<'a> {
    fn new(segs: &'a [DmaBuf]) -> Self {
        Self { segs, i: 0, off: 0 }
    }

    /// The next contiguous run of at most `n` bytes (empty at the end).
    #[inline]
    fn next(&mut self, n: usize) -> &'a [u8] {
        while let Some(seg) = self.segs.get(self.i) {
            let s = seg.as_slice();
            if self.off < s.len() {
                let k = n.min(s.len() - self.off);
                let r = &s[self.off..self.off + k];
                self.off += k;
                return r;
            }
            self.i += 1;
            self.off = 0;
        }
        &[]
    }

    /// Continue `crc` over the next `n` bytes.
    #[inline]
    fn crc(&mut self, mut n: usize, mut crc: u16) -> u16 {
        while n > 0 {
            let r = self.next(n);
            if r.is_empty() {
                break;
            }
            crc = crc16_t10dif(crc, r);
            n -= r.len();
        }
        crc
    }

    /// Skip `n` bytes.
    #[inline]
    fn skip(&mut self, mut n: usize) {
        while n > 0 {
            let r = self.next(n);
            if r.is_empty() {
                break;
            }
            n -= r.len();
        }
    }

    /// Fill `out` from the next bytes (zeroes past the end, which the
    /// length checks rule out).
    #[inline]
    fn read(&mut self, out: &mut [u8]) {
        let mut at = 0;
        while at < out.len() {
            let r = self.next(out.len() - at);
            if r.is_empty() {
                out[at..].fill(0);
                return;
            }
            out[at..at + r.len()].copy_from_slice(r);
            at += r.len();
        }
    }
}

/// A write cursor over a scatter-gather list.
struct CurMut<'a> {
    segs: &'a mut [DmaBuf],
    i: usize,
    off: usize,
}

impl<'a> CurMut<'a> {
    fn new(segs: &'a mut [DmaBuf]) -> Self {
        Self { segs, i: 0, off: 0 }
    }

    /// The next contiguous run of at most `n` bytes (empty at the end).
    #[inline]
    fn next(&mut self, n: usize) -> &mut [u8] {
        while self.i < self.segs.len() && self.off >= self.segs[self.i].len() {
            self.i += 1;
            self.off = 0;
        }
        match self.segs.get_mut(self.i) {
            Some(seg) => {
                let s = seg.as_mut_slice();
                let k = n.min(s.len() - self.off);
                let at = self.off;
                self.off += k;
                &mut s[at..at + k]
            }
            None => &mut [],
        }
    }

    #[inline]
    fn crc(&mut self, mut n: usize, mut crc: u16) -> u16 {
        while n > 0 {
            let r = self.next(n);
            if r.is_empty() {
                break;
            }
            crc = crc16_t10dif(crc, r);
            n -= r.len();
        }
        crc
    }

    #[inline]
    fn write(&mut self, mut src: &[u8]) {
        while !src.is_empty() {
            let r = self.next(src.len());
            if r.is_empty() {
                return;
            }
            let k = r.len();
            r.copy_from_slice(&src[..k]);
            src = &src[k..];
        }
    }

    /// Zero the next `n` bytes, continuing `crc` over them.
    #[inline]
    fn zero(&mut self, mut n: usize, mut crc: u16) -> u16 {
        while n > 0 {
            let r = self.next(n);
            if r.is_empty() {
                break;
            }
            r.fill(0);
            crc = crc16_t10dif(crc, r);
            n -= r.len();
        }
        crc
    }

    /// Copy the next `n` bytes of `src` here; with `crc`, return the CRC
    /// of the bytes copied (from 0), else 0.
    #[inline]
    fn copy_from(&mut self, src: &mut Cur<'_>, mut n: usize, crc: bool) -> u16 {
        let mut g = 0;
        while n > 0 {
            let r = self.next(n);
            if r.is_empty() {
                break;
            }
            src.read(r);
            if crc {
                g = crc16_t10dif(g, r);
            }
            n -= r.len();
        }
        g
    }
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;
    use std::sync::Arc;

    use pollux_reactor::TestCluster;

    use super::*;
    use crate::bdev::Bdev;
    use crate::channel::IoChannel;
    use crate::io::{CompletedIo, IoType, OwnedIo};
    use crate::malloc::MallocBackend;
    use crate::null::{NullBackend, NullOptions};
    use crate::testutil::{bytes_of, pattern, sg, sg_with, Recorder};

    fn fmt(bs: u32, md: u32, il: bool, ty: PiType) -> PiFormat {
        PiFormat::new(bs, md, il, ty).unwrap()
    }

    #[test]
    fn generate_matches_the_worked_tuples_of_t10_pi_md() {
        let f = fmt(512, 8, true, PiType::Type1);
        let mut b = sg_with(&[0xFF; 520], &[520]);
        f.generate(5, &PiAction::write_generate(), &mut b, &mut SgList::new())
            .unwrap();
        assert_eq!(&bytes_of(&b)[512..], &[0xE6, 0xA1, 0, 0, 0, 0, 0, 5]);
        let mut ramp: Vec<u8> = (0..520).map(|i| i as u8).collect();
        ramp[512..].fill(0);
        let mut b = sg_with(&ramp, &[100, 420]);
        f.generate(
            0x1_0000_0007,
            &PiAction::write_generate(),
            &mut b,
            &mut SgList::new(),
        )
        .unwrap();
        assert_eq!(&bytes_of(&b)[512..], &[0x4F, 0x10, 0, 0, 0, 0, 0, 7]);
        // Separate layout, 4096-byte blocks: the 4096 x 0xFF vector.
        let f = fmt(4096, 8, false, PiType::Type1);
        let mut d = sg_with(&[0xFF; 4096], &[4096]);
        let mut m = sg(&[8], 0);
        f.generate(9, &PiAction::write_generate(), &mut d, &mut m)
            .unwrap();
        assert_eq!(bytes_of(&m), [0x8B, 0x5D, 0, 0, 0, 0, 0, 9]);
        assert_eq!(crc16_t10dif(0, b"123456789"), 0xD0DB);
    }

    #[test]
    fn scatter_gather_splits_anywhere_and_match_the_contiguous_library() {
        let data = pattern(4 * 520, 11);
        let p = PiParams::for_type(pollux_pi::PiType::Type1, 512, 40, 0x77);
        let mut want = data.clone();
        pollux_pi::generate(pollux_pi::BuffersMut::Dif(&mut want), &p).unwrap();
        let f = fmt(512, 8, true, PiType::Type1);
        let a = PiAction::both().with_app_tag(0x77, 0xFFFF);
        for lens in [
            &[2080][..],
            &[1, 519, 3, 1557],
            &[516, 1, 1, 1, 1, 1560],
            &[1000, 1080],
        ] {
            let mut b = sg_with(&data, lens);
            f.generate(40, &a, &mut b, &mut SgList::new()).unwrap();
            assert_eq!(bytes_of(&b), want, "segments {lens:?}");
            f.verify(40, &a, &b, &SgList::new()).unwrap();
        }
        // md = 16: the tuple is the last 8 bytes; the guard covers the data
        // and the 8 metadata bytes before it.
        let f = fmt(512, 16, false, PiType::Type1);
        let d = sg_with(&data[..1024], &[700, 324]);
        let mut m = sg_with(&pattern(32, 3), &[5, 27]);
        let md_before = bytes_of(&m);
        let mut d2 = d;
        f.generate(0, &PiAction::write_generate(), &mut d2, &mut m)
            .unwrap();
        let md = bytes_of(&m);
        let g = crc16_t10dif(crc16_t10dif(0, &data[512..1024]), &md_before[16..24]);
        assert_eq!(&md[24..32], &[(g >> 8) as u8, g as u8, 0, 0, 0, 0, 0, 1]);
        assert_eq!(&md[16..24], &md_before[16..24], "the prefix is kept");
        assert_eq!(&md[..8], &md_before[..8]);
        f.verify(0, &PiAction::read_verify(), &d2, &m).unwrap();
    }

    #[test]
    fn strip_and_insert_round_trip_in_both_layouts_and_all_types() {
        for ty in [PiType::Type1, PiType::Type2, PiType::Type3] {
            for (bs, md, il) in [
                (512, 8, true),
                (4096, 8, false),
                (512, 16, true),
                (512, 32, false),
            ] {
                let f = fmt(bs, md, il, ty);
                let n = 3usize;
                let plain = pattern(n * bs as usize, u64::from(bs + md));
                let a = PiAction::both().with_ref_tag(77).with_app_tag(5, 0xFF);
                let bb = f.buf_block_size();
                let mut dif = sg(&[n * bb - 1, 1], 0xEE);
                let mut dmd = if il {
                    SgList::new()
                } else {
                    sg(&[n * md as usize], 0xEE)
                };
                f.insert(
                    100,
                    &a,
                    &sg_with(&plain, &[plain.len()]),
                    &mut dif,
                    &mut dmd,
                )
                .unwrap();
                f.verify(100, &a, &dif, &dmd).unwrap();
                let mut out = sg(&[7, plain.len() - 7], 0);
                f.strip(100, &a, &dif, &dmd, &mut out).unwrap();
                assert_eq!(bytes_of(&out), plain, "{ty:?} {bs}+{md} {il}");
                // Wrong sizes are length errors.
                let mut short = sg(&[plain.len() - 1], 0);
                assert!(matches!(
                    f.strip(100, &a, &dif, &dmd, &mut short),
                    Err(IoError::BadLength { .. })
                ));
            }
        }
    }

    // ---- through the bdev layer ----

    fn malloc(bs: u32, md: u32, il: bool, ty: PiType) -> Arc<Bdev> {
        let info = BdevInfo::new("m", MallocBackend::PRODUCT, bs, 64)
            .unwrap()
            .with_metadata(md, il, ty)
            .unwrap();
        Bdev::new(Arc::new(MallocBackend::new(info, Some(16)).unwrap()))
    }

    fn null(bs: u32, md: u32, il: bool, ty: PiType) -> Arc<Bdev> {
        let info = BdevInfo::new("n", NullBackend::PRODUCT, bs, 64)
            .unwrap()
            .with_metadata(md, il, ty)
            .unwrap();
        Bdev::new(Arc::new(NullBackend::new(info, NullOptions::default())))
    }

    /// Runs `f` on core 0 of a one-core cluster, then polls until idle and
    /// returns the completions in submit (ctx) order.
    fn run(cluster: &TestCluster, rec: &Recorder, f: impl FnOnce()) -> Vec<OwnedIo> {
        cluster.on(0, |_| f());
        cluster.poll_until_idle().unwrap();
        let mut v: Vec<OwnedIo> = rec.take().into_iter().map(|d| d.1).collect();
        v.sort_by_key(|d| d.ctx);
        v
    }

    fn setup(b: &Arc<Bdev>) -> (TestCluster, IoChannel) {
        let desc = b.open(true).unwrap();
        let cluster = TestCluster::new(1);
        let ch = cluster.on(0, |r| desc.channel(r).unwrap());
        (cluster, ch)
    }

    #[test]
    fn malloc_512_8_interleaved_generate_on_write_verify_on_read_and_each_error_kind() {
        let b = malloc(512, 8, true, PiType::Type1);
        let (cluster, ch) = setup(&b);
        let (rec, cb) = Recorder::new();
        let data = pattern(4 * 520, 5);
        let a = PiAction::both().with_app_tag(0x1234, 0xFFFF);
        let done = run(&cluster, &rec, || {
            ch.write_pi(
                10,
                4,
                sg_with(&data, &[1000, 1080]),
                SgList::new(),
                a,
                &cb,
                0,
            )
            .unwrap()
        });
        assert_eq!(done[0].status, Ok(()));
        let written = bytes_of(&done[0].bufs);
        // Data untouched, tuples generated in the caller's buffers.
        for i in 0..4 {
            assert_eq!(
                written[i * 520..i * 520 + 512],
                data[i * 520..i * 520 + 512]
            );
            assert_eq!(written[i * 520 + 514..i * 520 + 516], [0x12, 0x34]);
            assert_eq!(
                written[i * 520 + 516..i * 520 + 520],
                (10 + i as u32).to_be_bytes()
            );
        }
        let done = run(&cluster, &rec, || {
            ch.read_pi(10, 4, sg(&[520, 1560], 0), SgList::new(), a, &cb, 1)
                .unwrap()
        });
        assert_eq!(done[0].status, Ok(()));
        assert_eq!(bytes_of(&done[0].bufs), written);
        // Corrupt one field in one block each (written raw, no PI action),
        // then read-verify: the kind and the failing LBA.
        let cases: [(usize, PiErrorKind, u64); 3] = [
            (2 * 520 + 100, PiErrorKind::Guard, 12),
            (520 + 515, PiErrorKind::AppTag, 11),
            (3 * 520 + 519, PiErrorKind::RefTag, 13),
        ];
        for (k, (byte, kind, lba)) in cases.into_iter().enumerate() {
            let mut bad = written.clone();
            bad[byte] ^= 0x01;
            let k = k as u64;
            let done = run(&cluster, &rec, || {
                ch.write(10, 4, sg_with(&bad, &[2080]), &cb, 2 * k).unwrap();
                ch.read_pi(10, 4, sg(&[2080], 0), SgList::new(), a, &cb, 2 * k + 1)
                    .unwrap();
            });
            assert_eq!(done[0].status, Ok(()));
            match done[1].status {
                Err(IoError::Pi {
                    kind: kk, lba: l, ..
                }) => assert_eq!((kk, l), (kind, lba)),
                s => panic!("expected a {kind:?} error, got {s:?}"),
            }
            if kind == PiErrorKind::RefTag {
                assert_eq!(
                    done[1].status,
                    Err(IoError::Pi {
                        kind,
                        lba: 13,
                        expected: 13,
                        actual: 13 ^ 1
                    })
                );
            }
            // The buffers come back with the data even when the check fails.
            assert_eq!(bytes_of(&done[1].bufs), bad);
        }
        assert!(ch.stats().errors >= 3);
        // A plain read passes whatever is there.
        let done = run(&cluster, &rec, || {
            ch.read(10, 4, sg(&[2080], 0), &cb, 0).unwrap()
        });
        assert_eq!(done[0].status, Ok(()));
    }

    #[test]
    fn malloc_4096_8_separate_round_trip_and_md_rules() {
        let b = malloc(4096, 8, false, PiType::Type1);
        let (cluster, ch) = setup(&b);
        let (rec, cb) = Recorder::new();
        let data = pattern(2 * 4096, 8);
        let a = PiAction::both();
        let done = run(&cluster, &rec, || {
            ch.write_pi(3, 2, sg_with(&data, &[8192]), sg(&[16], 0), a, &cb, 0)
                .unwrap();
        });
        assert_eq!(done[0].status, Ok(()));
        let md = bytes_of(&done[0].md_bufs);
        assert_eq!(&md[4..8], &3u32.to_be_bytes());
        assert_eq!(&md[12..16], &4u32.to_be_bytes());
        let done = run(&cluster, &rec, || {
            ch.read_pi(3, 2, sg(&[4096, 4096], 0), sg(&[3, 13], 0), a, &cb, 1)
                .unwrap();
            // A plain write without metadata keeps the stored metadata.
            ch.write(3, 1, sg_with(&data[..4096], &[4096]), &cb, 2)
                .unwrap();
        });
        assert_eq!(done[0].status, Ok(()));
        assert_eq!(bytes_of(&done[0].bufs), data);
        assert_eq!(bytes_of(&done[0].md_bufs), md, "the metadata is stored");
        // Corrupt the stored guard of block 4 through a raw DIX write.
        let mut bad = md.clone();
        bad[8] ^= 0x40;
        let done = run(&cluster, &rec, || {
            ch.submit_with_pi(
                IoType::Write,
                3,
                2,
                sg_with(&data, &[8192]),
                sg_with(&bad, &[16]),
                None,
                &cb,
                0,
            )
            .unwrap();
            ch.read_pi(3, 2, sg(&[8192], 0), sg(&[16], 0), a, &cb, 1)
                .unwrap();
        });
        assert!(matches!(
            done[1].status,
            Err(IoError::Pi {
                kind: PiErrorKind::Guard,
                lba: 4,
                ..
            })
        ));
        // Metadata rules.
        let plain = malloc(512, 0, false, PiType::None);
        let (c2, pch) = setup(&plain);
        let il = malloc(512, 8, true, PiType::Type1);
        let (c3, ich) = setup(&il);
        let done = run(&cluster, &rec, || {
            ch.read_pi(3, 2, sg(&[8192], 0), SgList::new(), a, &cb, 0)
                .unwrap();
            ch.read_pi(3, 2, sg(&[8192], 0), sg(&[8], 0), a, &cb, 1)
                .unwrap();
            ch.submit_with_pi(
                IoType::Flush,
                0,
                1,
                SgList::new(),
                sg(&[8], 0),
                None,
                &cb,
                2,
            )
            .unwrap();
            // Without an action, no metadata is fine.
            ch.read(3, 2, sg(&[8192], 0), &cb, 3).unwrap();
        });
        let st: Vec<_> = done.iter().map(|d| d.status).collect();
        assert_eq!(
            st,
            vec![
                Err(IoError::BadMdLength {
                    expected: 16,
                    actual: 0
                }),
                Err(IoError::BadMdLength {
                    expected: 16,
                    actual: 8
                }),
                Err(IoError::UnexpectedBuffers(IoType::Flush)),
                Ok(()),
            ]
        );
        c2.on(0, |_| {
            pch.read_pi(0, 1, sg(&[512], 0), SgList::new(), a, &cb, 0)
                .unwrap();
            // An action that does nothing is allowed anywhere.
            pch.read_pi(0, 1, sg(&[512], 0), SgList::new(), PiAction::none(), &cb, 1)
                .unwrap();
        });
        c2.poll_until_idle().unwrap();
        c3.on(0, |_| {
            ich.read_pi(0, 1, sg(&[520], 0), sg(&[8], 0), a, &cb, 2)
                .unwrap()
        });
        c3.poll_until_idle().unwrap();
        let mut v: Vec<_> = rec.take().into_iter().map(|d| d.1).collect();
        v.sort_by_key(|d| d.ctx);
        let st: Vec<_> = v.iter().map(|d| d.status).collect();
        assert_eq!(
            st,
            vec![Err(IoError::NoPi), Ok(()), Err(IoError::UnexpectedMetadata)]
        );
    }

    #[test]
    fn write_verify_stops_bad_pi_before_the_medium() {
        let b = malloc(512, 8, true, PiType::Type1);
        let (cluster, ch) = setup(&b);
        let (rec, cb) = Recorder::new();
        let f = PiFormat::of(b.info()).unwrap();
        let mut good = sg_with(&pattern(1040, 2), &[1040]);
        f.generate(
            7,
            &PiAction::write_generate(),
            &mut good,
            &mut SgList::new(),
        )
        .unwrap();
        let mut bad = bytes_of(&good);
        bad[1039] ^= 2; // ref tag of LBA 8
        let v = PiAction::verify(PiChecks::ALL);
        let done = run(&cluster, &rec, || {
            ch.write_pi(7, 2, sg_with(&bad, &[1040]), SgList::new(), v, &cb, 0)
                .unwrap();
            // A new malloc bdev is formatted: it reads back verified zeroes.
            ch.read_pi(7, 2, sg(&[1040], 0xAA), SgList::new(), v, &cb, 1)
                .unwrap();
            ch.write_pi(7, 2, good, SgList::new(), v, &cb, 2).unwrap();
        });
        assert!(matches!(
            done[0].status,
            Err(IoError::Pi {
                kind: PiErrorKind::RefTag,
                lba: 8,
                ..
            })
        ));
        assert_eq!(done[1].status, Ok(()), "nothing was written");
        let got = bytes_of(&done[1].bufs);
        assert!(got[..512].iter().chain(&got[520..1032]).all(|x| *x == 0));
        assert_eq!(&got[1032..], &[0, 0, 0, 0, 0, 0, 0, 8]);
        assert_eq!(done[2].status, Ok(()));
    }

    #[test]
    fn type2_takes_the_ref_tag_from_the_action_and_type3_never_checks_it() {
        let b = malloc(512, 8, true, PiType::Type2);
        let (cluster, ch) = setup(&b);
        let (rec, cb) = Recorder::new();
        let data = pattern(1040, 9);
        let a = PiAction::both().with_ref_tag(1000);
        let done = run(&cluster, &rec, || {
            ch.write_pi(20, 2, sg_with(&data, &[1040]), SgList::new(), a, &cb, 0)
                .unwrap();
            ch.read_pi(20, 2, sg(&[1040], 0), SgList::new(), a, &cb, 1)
                .unwrap();
            ch.read_pi(
                20,
                2,
                sg(&[1040], 0),
                SgList::new(),
                a.with_ref_tag(999),
                &cb,
                2,
            )
            .unwrap();
        });
        assert_eq!(&bytes_of(&done[0].bufs)[1036..], &1001u32.to_be_bytes());
        assert_eq!(done[1].status, Ok(()));
        assert_eq!(
            done[2].status,
            Err(IoError::Pi {
                kind: PiErrorKind::RefTag,
                lba: 20,
                expected: 999,
                actual: 1000
            })
        );

        let b = malloc(512, 8, true, PiType::Type3);
        let (cluster, ch) = setup(&b);
        let a = PiAction::both()
            .with_checks(PiChecks::ALL)
            .with_ref_tag(0xABCD);
        let done = run(&cluster, &rec, || {
            ch.write_pi(0, 2, sg_with(&data, &[1040]), SgList::new(), a, &cb, 0)
                .unwrap();
        });
        let mut w = bytes_of(&done[0].bufs);
        assert_eq!(
            &w[516..520],
            &0xABCDu32.to_be_bytes(),
            "opaque, not incremented"
        );
        assert_eq!(&w[1036..1040], &0xABCDu32.to_be_bytes());
        w[1037] ^= 0xFF; // ref tag: ignored
        let mut g = w.clone();
        g[0] ^= 1; // data of block 0: the guard is still checked
        let done = run(&cluster, &rec, || {
            ch.write(0, 2, sg_with(&w, &[1040]), &cb, 0).unwrap();
            ch.read_pi(
                0,
                2,
                sg(&[1040], 0),
                SgList::new(),
                a.with_ref_tag(5),
                &cb,
                1,
            )
            .unwrap();
            ch.write(0, 2, sg_with(&g, &[1040]), &cb, 2).unwrap();
            ch.read_pi(0, 2, sg(&[1040], 0), SgList::new(), a, &cb, 3)
                .unwrap();
        });
        assert_eq!(done[1].status, Ok(()));
        assert!(matches!(
            done[3].status,
            Err(IoError::Pi {
                kind: PiErrorKind::Guard,
                lba: 0,
                ..
            })
        ));
    }

    #[test]
    fn escapes_skip_checks() {
        let b = malloc(512, 8, true, PiType::Type1);
        let (cluster, ch) = setup(&b);
        let (rec, cb) = Recorder::new();
        let mut blk = pattern(520, 4);
        blk[512..].copy_from_slice(&[0, 0, 0xFF, 0xFF, 9, 9, 9, 9]);
        let done = run(&cluster, &rec, || {
            ch.write(0, 1, sg_with(&blk, &[520]), &cb, 0).unwrap();
            ch.read_pi(
                0,
                1,
                sg(&[520], 0),
                SgList::new(),
                PiAction::verify(PiChecks::ALL),
                &cb,
                1,
            )
            .unwrap();
        });
        assert_eq!(done[1].status, Ok(()));
    }

    #[test]
    fn null_generates_pi_on_read_so_read_verify_passes() {
        for (bs, il) in [(512, true), (4096, false)] {
            let b = null(bs, 8, il, PiType::Type1);
            let (cluster, ch) = setup(&b);
            let (rec, cb) = Recorder::new();
            let bb = b.info().buf_block_size() as usize;
            let a = PiAction::read_verify().with_app_tag(0x42, 0xFFFF);
            let md = |n: usize| if il { SgList::new() } else { sg(&[n * 8], 0) };
            let done = run(&cluster, &rec, || {
                ch.read_pi(
                    5,
                    3,
                    sg_with(&pattern(3 * bb, 1), &[bb, 2 * bb]),
                    md(3),
                    a,
                    &cb,
                    0,
                )
                .unwrap();
                // Writes (with metadata when separate) are discarded.
                ch.write_pi(5, 3, sg(&[3 * bb], 1), md(3), PiAction::both(), &cb, 1)
                    .unwrap();
                // A plain read gets app tag 0 and ref tag = LBA.
                ch.read(9, 1, sg(&[bb], 0x33), &cb, 2).unwrap();
            });
            assert!(done.iter().all(|d| d.status.is_ok()), "{bs}: {done:?}");
            if il {
                let got = bytes_of(&done[2].bufs);
                assert!(got[..512].iter().all(|x| *x == 0x33), "data untouched");
                let g = crc16_t10dif(0, &[0x33; 512]).to_be_bytes();
                assert_eq!(&got[512..], &[g[0], g[1], 0, 0, 0, 0, 0, 9]);
            }
        }
    }

    #[test]
    fn write_zeroes_and_unmap_leave_valid_pi() {
        for il in [true, false] {
            let b = malloc(512, 8, il, PiType::Type1);
            let (cluster, ch) = setup(&b);
            let (rec, cb) = Recorder::new();
            let bb = b.info().buf_block_size() as usize;
            let md = |n: usize| {
                if il {
                    SgList::new()
                } else {
                    sg(&[n * 8], 0xEE)
                }
            };
            let a = PiAction::both();
            let done = run(&cluster, &rec, || {
                ch.write_pi(
                    0,
                    8,
                    sg_with(&pattern(8 * bb, 3), &[8 * bb]),
                    md(8),
                    a,
                    &cb,
                    0,
                )
                .unwrap();
                ch.write_zeroes(1, 2, &cb, 1).unwrap();
                ch.unmap(6, 1, &cb, 2).unwrap();
                ch.read_pi(0, 8, sg(&[8 * bb], 0xEE), md(8), a, &cb, 3)
                    .unwrap();
            });
            assert!(done.iter().all(|d| d.status.is_ok()), "{done:?}");
            let got = bytes_of(&done[3].bufs);
            assert!(got[bb..bb + 512].iter().all(|x| *x == 0));
            let t = if il {
                got[bb + 512..2 * bb].to_vec()
            } else {
                bytes_of(&done[3].md_bufs)[8..16].to_vec()
            };
            assert_eq!(t, [0, 0, 0, 0, 0, 0, 0, 1]);
        }
    }

    #[test]
    fn in_place_resubmits_keep_the_action_and_a_full_channel_returns_the_metadata() {
        use crate::io::InPlaceIo;
        use std::cell::Cell;
        struct Flip(Cell<u32>, Cell<u32>);
        impl crate::io::IoCompletion for Flip {
            fn complete(&self, _io: CompletedIo<'_>) {}
            fn complete_in_place(&self, mut io: InPlaceIo<'_>) {
                assert_eq!(io.status(), Ok(()), "{:?}", io.io_type());
                assert_eq!(io.pi_action(), Some(PiAction::both()));
                assert_eq!(io.md_bufs().total_len(), 16);
                self.1.set(self.1.get() + 1);
                if self.0.get() > 0 {
                    self.0.set(self.0.get() - 1);
                    let t = if io.io_type() == IoType::Write {
                        IoType::Read
                    } else {
                        IoType::Write
                    };
                    // Scribble on the data before a write: generation redoes the guard.
                    if t == IoType::Write {
                        io.bufs_mut().as_mut_slice()[0].as_mut_slice()[0] ^= 0x5A;
                    }
                    io.resubmit(t, io.offset_blocks(), 2, io.ctx());
                }
            }
        }
        let b = malloc(4096, 8, false, PiType::Type1);
        let desc = b.open(true).unwrap();
        let info = BdevInfo::new("d1", MallocBackend::PRODUCT, 4096, 8)
            .unwrap()
            .with_metadata(8, false, PiType::Type1)
            .unwrap();
        let one = Bdev::new(Arc::new(MallocBackend::new(info, Some(1)).unwrap()));
        let d1 = one.open(true).unwrap();
        let cluster = TestCluster::new(1);
        let flip = Rc::new(Flip(Cell::new(6), Cell::new(0)));
        let cb: Rc<dyn crate::io::IoCompletion> = flip.clone();
        cluster.on(0, |r| {
            let ch = desc.channel(r).unwrap();
            ch.submit_in_place_with_pi(
                IoType::Write,
                2,
                2,
                sg(&[8192], 1),
                sg(&[16], 0),
                Some(PiAction::both()),
                &cb,
                0,
            )
            .unwrap();
            let c1 = d1.channel(r).unwrap();
            c1.read(0, 1, sg(&[4096], 0), &cb, 1).unwrap();
            let rej = c1
                .read_pi(0, 1, sg(&[4096], 0), sg(&[8], 0), PiAction::both(), &cb, 2)
                .unwrap_err();
            assert_eq!(rej.error, IoError::ChannelFull);
            assert_eq!((rej.bufs.total_len(), rej.md_bufs.total_len()), (4096, 8));
        });
        cluster.poll_until_idle().unwrap();
        assert_eq!(flip.1.get(), 7, "one write and six resubmits");
    }
}

/// The CPU cost of PI per 4 KiB of data, for `docs/benchmarks.md`:
/// `cargo test --release -p pollux-bdev pi_cost -- --ignored --nocapture`.
#[cfg(test)]
mod cost {
    use std::time::Instant;

    use super::*;
    use crate::testutil::{pattern, sg_with};

    fn time(label: &str, iters: u32, mut f: impl FnMut()) {
        for _ in 0..iters / 10 {
            f();
        }
        let t = Instant::now();
        for _ in 0..iters {
            f();
        }
        let ns = t.elapsed().as_nanos() as f64 / f64::from(iters);
        println!(
            "{label:<44} {ns:>8.0} ns per 4 KiB of data ({:.2} GB/s)",
            4096.0 / ns
        );
    }

    #[test]
    #[ignore = "timing, run by hand in release"]
    fn pi_cost() {
        let n = 1_000_000 / 8;
        let data = pattern(4096, 1);
        time("crc16_t10dif (slice-by-8), 4096 B", n, || {
            std::hint::black_box(crc16_t10dif(0, std::hint::black_box(&data)));
        });
        let f = PiFormat::new(512, 8, true, PiType::Type1).unwrap();
        let mut dif = sg_with(&pattern(8 * 520, 2), &[8 * 520]);
        let mut none = SgList::new();
        let a = PiAction::both();
        time("generate 8 x 512+8 interleaved", n, || {
            f.generate(8, &a, &mut dif, &mut none).unwrap();
        });
        time("verify 8 x 512+8 interleaved", n, || {
            f.verify(8, &a, &dif, &none).unwrap();
        });
        let f = PiFormat::new(4096, 8, false, PiType::Type1).unwrap();
        let mut d = sg_with(&data, &[4096]);
        let mut m = sg_with(&[0; 8], &[8]);
        time("generate 1 x 4096 + 8 separate", n, || {
            f.generate(8, &a, &mut d, &mut m).unwrap();
        });
        time("verify 1 x 4096 + 8 separate", n, || {
            f.verify(8, &a, &d, &m).unwrap();
        });
    }
}
