//! T10 PI for the initiator: signature attributes of an integrity MR
//! (offload) and the software path through a bounce buffer
//! (`pollux-pi`), plus the sense an initiator-detected error maps to.
//!
//! Two layouts of the caller's memory ([`PiLayout`]):
//! - **insert**: the caller's buffers hold data only; the wire's tuples
//!   are generated on a write and checked and stripped on a read;
//! - **DIX**: the caller's `SgList` holds the data (`blocks × block`
//!   bytes) followed by one 8-byte tuple per block (its own buffer or not);
//!   a write's tuples are checked on the way out and interleaved into the
//!   wire's DIF, a read's wire tuples are checked and stored there.
//!
//! In both, Type 1 tuples carry the LBA as reference tag (checked), Type 3
//! an opaque 0 (never checked); the application tag is
//! `InitiatorOptions::app_tag`, compared under `app_tag_mask`.

use pollux_pi::{Checks, PiErrorKind, PiParams, PiTuple, PiType};
use pollux_reactor::mem::SgList;
use pollux_verbs::sig::check;
use pollux_verbs::{SigAttrs, SigDomain, SigErrKind, T10Dif};

use super::task::PiFailure;
use crate::scsi::sense::{key, Sense};

/// Bytes of a PI tuple.
pub(crate) const TUPLE: usize = 8;

/// Where a task's PI lives in the caller's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PiLayout {
    /// Nowhere: generated for the wire, stripped from it.
    Insert,
    /// In a separate run of tuples after the data (DIX).
    Dix,
}

/// Everything PI of one task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PiShape {
    /// First LBA (Type 1 reference tag seed).
    pub(crate) lba: u64,
    /// Logical block (protection interval) in bytes.
    pub(crate) block: u32,
    /// Blocks of the task.
    pub(crate) blocks: u32,
    /// Protection type: 1 or 3.
    pub(crate) pi_type: u8,
    /// Application tag written, and compared under `app_mask`.
    pub(crate) app_tag: u16,
    /// Bits of the application tag the initiator checks (0: none).
    pub(crate) app_mask: u16,
    /// Caller's layout.
    pub(crate) layout: PiLayout,
}

impl PiShape {
    /// The protection type (a LU reports 1-3; anything else reads as 1).
    fn ty(&self) -> PiType {
        PiType::from_number(self.pi_type).unwrap_or(PiType::Type1)
    }

    fn type3(&self) -> bool {
        self.ty() == PiType::Type3
    }

    /// Bytes of data.
    pub(crate) fn data_len(&self) -> usize {
        self.blocks as usize * self.block as usize
    }

    /// Bytes on the wire (data and tuples interleaved).
    pub(crate) fn wire_len(&self) -> usize {
        self.blocks as usize * (self.block as usize + TUPLE)
    }

    /// Bytes of the caller's tuples (DIX), else 0.
    pub(crate) fn pi_len(&self) -> usize {
        match self.layout {
            PiLayout::Dix => self.blocks as usize * TUPLE,
            PiLayout::Insert => 0,
        }
    }

    /// The domain of one side: T10 DIF with this task's tags.
    fn dif(&self) -> T10Dif {
        T10Dif {
            bg_type: pollux_verbs::sig::GuardType::Crc,
            pi_interval: self.block,
            bg: 0,
            app_tag: self.app_tag,
            ref_tag: self.ty().seed(self.lba),
            ref_remap: !self.type3(),
            app_escape: true,
            ref_escape: self.type3(),
            apptag_check_mask: self.app_mask,
        }
    }

    /// The checks this task asks for.
    fn check_mask(&self) -> u8 {
        let mut m = check::GUARD;
        if !self.type3() {
            m |= check::REFTAG;
        }
        if self.app_mask != 0 {
            m |= check::APPTAG;
        }
        m
    }

    /// Parameters of the software path (the same tags and checks).
    fn params(&self) -> PiParams {
        let mut p = PiParams::for_lba(self.ty(), self.block as usize, self.lba, self.app_tag);
        p.app_mask = self.app_mask;
        let mut c = Checks::GUARD;
        if !self.type3() {
            c = c.with(Checks::REF);
        }
        if self.app_mask != 0 {
            c = c.with(Checks::APP);
        }
        p.checks = c;
        p
    }
}

/// Signature attributes of one task: wire domain T10 DIF; memory domain
/// none (insert: writes generate, nothing to check; reads check, then
/// strip) or T10 DIF in the separate PI buffer (DIX: both directions
/// check, the tuples pass through).
pub(crate) fn sig_attrs(write: bool, s: &PiShape) -> SigAttrs {
    let (mem, check_mask) = match s.layout {
        PiLayout::Insert => (SigDomain::None, if write { 0 } else { s.check_mask() }),
        PiLayout::Dix => (SigDomain::T10Dif(s.dif()), s.check_mask()),
    };
    SigAttrs {
        check_mask,
        mem,
        wire: SigDomain::T10Dif(s.dif()),
        meta_length: 0,
    }
}

/// Copy `len` bytes of `sg` starting at byte `off` into `dst`.
fn sg_read(sg: &SgList, mut off: usize, dst: &mut [u8]) {
    let mut done = 0;
    for b in sg.iter() {
        let s = b.as_slice();
        if off >= s.len() {
            off -= s.len();
            continue;
        }
        let n = (s.len() - off).min(dst.len() - done);
        dst[done..done + n].copy_from_slice(&s[off..off + n]);
        done += n;
        off = 0;
        if done == dst.len() {
            return;
        }
    }
}

/// Copy `src` into `sg` at byte `off`.
fn sg_write(sg: &mut SgList, mut off: usize, src: &[u8]) {
    let mut done = 0;
    for b in sg.iter_mut() {
        let s = b.as_mut_slice();
        if off >= s.len() {
            off -= s.len();
            continue;
        }
        let n = (s.len() - off).min(src.len() - done);
        s[off..off + n].copy_from_slice(&src[done..done + n]);
        done += n;
        off = 0;
        if done == src.len() {
            return;
        }
    }
}

fn failure(s: &PiShape, i: usize, e: &pollux_pi::PiError) -> PiFailure {
    PiFailure {
        kind: match e.kind {
            PiErrorKind::AppTag => SigErrKind::BadAppTag,
            PiErrorKind::RefTag => SigErrKind::BadRefTag,
            _ => SigErrKind::BadGuard,
        },
        lba: s.lba + i as u64,
        expected: e.expected,
        actual: e.actual,
    }
}

/// Software write path: the wire image of `sg` into `wire` (data ‖ tuple
/// per block). Insert: tuples generated. DIX: the caller's tuples checked
/// (the first failure is returned, as the offload reports it) and passed
/// on.
pub(crate) fn generate(sg: &SgList, wire: &mut [u8], s: &PiShape) -> Option<PiFailure> {
    let p = s.params();
    let (bs, wb) = (s.block as usize, s.block as usize + TUPLE);
    let data_len = s.data_len();
    let mut first = None;
    for i in 0..s.blocks as usize {
        let w = &mut wire[i * wb..(i + 1) * wb];
        sg_read(sg, i * bs, &mut w[..bs]);
        let t = match s.layout {
            PiLayout::Insert => p.tuple_for(i as u64, &w[..bs]),
            PiLayout::Dix => {
                let mut raw = [0u8; TUPLE];
                sg_read(sg, data_len + i * TUPLE, &mut raw);
                let t = PiTuple::decode(&raw);
                if first.is_none() {
                    if let Err(e) = p.check(i as u64, &w[..bs], &t, (i * wb) as u64) {
                        first = Some(failure(s, i, &e));
                    }
                }
                t
            }
        };
        w[bs..].copy_from_slice(&t.encode());
    }
    first
}

/// Software read path: check every tuple of `wire`, then strip the data
/// into `sg` (and, DIX, the tuples after it). The first failure is
/// returned (data are copied anyway).
pub(crate) fn verify_strip(wire: &[u8], sg: &mut SgList, s: &PiShape) -> Option<PiFailure> {
    let p = s.params();
    let (bs, wb) = (s.block as usize, s.block as usize + TUPLE);
    let data_len = s.data_len();
    let mut first = None;
    for i in 0..s.blocks as usize {
        let w = &wire[i * wb..(i + 1) * wb];
        let mut t = [0u8; TUPLE];
        t.copy_from_slice(&w[bs..]);
        if first.is_none() {
            if let Err(e) = p.check(i as u64, &w[..bs], &PiTuple::decode(&t), (i * wb) as u64) {
                first = Some(failure(s, i, &e));
            }
        }
        sg_write(sg, i * bs, &w[..bs]);
        if s.layout == PiLayout::Dix {
            sg_write(sg, data_len + i * TUPLE, &t);
        }
    }
    first
}

/// The sense of an initiator-detected PI error: ILLEGAL REQUEST 10/01
/// (guard), 10/02 (app tag), 10/03 (ref tag), INFORMATION = the LBA.
pub fn pi_sense(f: &PiFailure) -> Sense {
    Sense {
        key: key::ILLEGAL_REQUEST,
        asc: 0x10,
        ascq: match f.kind {
            SigErrKind::BadGuard => 1,
            SigErrKind::BadAppTag => 2,
            SigErrKind::BadRefTag => 3,
        },
        info: Some(f.lba),
        field: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pollux_reactor::mem::DmaBuf;

    fn shape(layout: PiLayout, pi_type: u8) -> PiShape {
        PiShape {
            lba: 0x1_0000_0010,
            block: 512,
            blocks: 3,
            pi_type,
            app_tag: 0x1234,
            app_mask: 0xFFFF,
            layout,
        }
    }

    fn sg(bytes: &[u8], split: usize) -> SgList {
        let mut l = SgList::new();
        for part in [&bytes[..split], &bytes[split..]] {
            let mut b = DmaBuf::alloc(part.len().max(1)).unwrap();
            b.as_mut_slice()[..part.len()].copy_from_slice(part);
            l.push(b);
        }
        l
    }

    #[test]
    fn dix_round_trip_keeps_data_and_tuples_and_finds_the_first_bad_field() {
        for ty in [1u8, 3] {
            let s = shape(PiLayout::Dix, ty);
            let data: Vec<u8> = (0..s.data_len()).map(|i| (i * 7) as u8).collect();
            let mut pi = vec![0u8; s.pi_len()];
            pollux_pi::generate(
                pollux_pi::BuffersMut::Dix {
                    data: &data,
                    pi: &mut pi,
                },
                &s.params(),
            )
            .unwrap();
            let mut all = data.clone();
            all.extend_from_slice(&pi);
            // Data and tuples in separate buffers, and split mid-data.
            for split in [s.data_len(), 700] {
                let src = sg(&all, split);
                let mut wire = vec![0u8; s.wire_len()];
                assert_eq!(generate(&src, &mut wire, &s), None, "type {ty}");
                let mut dst = sg(&vec![0u8; all.len()], split);
                assert_eq!(verify_strip(&wire, &mut dst, &s), None);
                let mut back = vec![0u8; all.len()];
                sg_read(&dst, 0, &mut back);
                assert_eq!(back, all);
            }
            // A bad app tag in block 1's tuple, a bad guard in block 2.
            let mut bad = all.clone();
            bad[s.data_len() + TUPLE + 2] ^= 1;
            bad[s.data_len() + 2 * TUPLE] ^= 1;
            let mut wire = vec![0u8; s.wire_len()];
            let f = generate(&sg(&bad, s.data_len()), &mut wire, &s).unwrap();
            assert_eq!((f.kind, f.lba), (SigErrKind::BadAppTag, s.lba + 1));
            wire[2 * 520 + 7] ^= 1; // block 2's ref tag (also its guard is bad)
            let f = verify_strip(&wire, &mut sg(&all, s.data_len()), &s).unwrap();
            assert_eq!((f.kind, f.lba), (SigErrKind::BadAppTag, s.lba + 1));
        }
    }

    #[test]
    fn type1_checks_the_ref_tag_and_type3_does_not() {
        for (ty, caught) in [(1u8, true), (3, false)] {
            let s = PiShape {
                app_mask: 0,
                ..shape(PiLayout::Insert, ty)
            };
            let data = sg(&vec![5u8; s.data_len()], 100);
            let mut wire = vec![0u8; s.wire_len()];
            assert_eq!(generate(&data, &mut wire, &s), None);
            wire[520 + 519] ^= 1; // block 1's ref tag
            wire[512 + 2] ^= 1; // block 0's app tag: not checked (mask 0)
            let f = verify_strip(&wire, &mut sg(&vec![0u8; s.data_len()], 1), &s);
            assert_eq!(
                f.map(|f| (f.kind, f.lba)),
                caught.then_some((SigErrKind::BadRefTag, s.lba + 1))
            );
        }
    }

    #[test]
    fn offload_attributes_follow_the_layout() {
        let s = shape(PiLayout::Insert, 1);
        assert_eq!(sig_attrs(true, &s).check_mask, 0);
        assert_eq!(sig_attrs(true, &s).mem, SigDomain::None);
        let r = sig_attrs(false, &s).check_mask;
        assert_eq!(r, check::GUARD | check::REFTAG | check::APPTAG);
        let d = sig_attrs(true, &shape(PiLayout::Dix, 3));
        assert!(matches!(d.mem, SigDomain::T10Dif(x) if !x.ref_remap && x.ref_escape));
        assert_eq!(d.check_mask, check::GUARD | check::APPTAG);
    }
}
