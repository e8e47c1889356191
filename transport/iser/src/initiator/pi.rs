//! T10 PI for the initiator: signature attributes of an integrity MR
//! (offload) and the software path through a bounce buffer
//! (`pollux-pi`), plus the sense an initiator-detected error maps to.

use pollux_pi::{Checks, PiErrorKind, PiParams, PiTuple, PiType};
use pollux_reactor::mem::SgList;
use pollux_verbs::sig::check;
use pollux_verbs::{SigAttrs, SigDomain, SigErrKind, T10Dif};

use super::task::PiFailure;
use crate::scsi::sense::{key, Sense};

/// Bytes of a PI tuple.
pub(crate) const TUPLE: usize = 8;

/// Signature attributes of one task: memory domain none, wire domain T10
/// DIF Type 1 seeded with the LBA. Writes generate (nothing to check);
/// reads check guard and reference tag, then strip.
pub(crate) fn sig_attrs(write: bool, lba: u64, block: u32) -> SigAttrs {
    SigAttrs {
        check_mask: if write {
            0
        } else {
            check::GUARD | check::REFTAG
        },
        mem: SigDomain::None,
        wire: SigDomain::T10Dif(T10Dif {
            bg_type: pollux_verbs::sig::GuardType::Crc,
            pi_interval: block,
            bg: 0,
            app_tag: 0,
            ref_tag: lba as u32,
            ref_remap: true,
            app_escape: true,
            ref_escape: false,
            apptag_check_mask: 0,
        }),
        meta_length: 0,
    }
}

fn params(lba: u64, block: u32) -> PiParams {
    let mut p = PiParams::for_type(PiType::Type1, block as usize, lba as u32, 0);
    p.checks = Checks::GUARD.with(Checks::REF);
    p
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

/// Software write-generate: `blocks` blocks of `sg` into `wire`
/// (data ‖ tuple per block).
pub(crate) fn generate(sg: &SgList, wire: &mut [u8], lba: u64, block: u32, blocks: u32) {
    let p = params(lba, block);
    let (bs, wb) = (block as usize, block as usize + TUPLE);
    for i in 0..blocks as usize {
        let w = &mut wire[i * wb..(i + 1) * wb];
        sg_read(sg, i * bs, &mut w[..bs]);
        let t = p.tuple_for(i as u64, &w[..bs]).encode();
        w[bs..].copy_from_slice(&t);
    }
}

/// Software read-verify: check every tuple of `wire`, then strip the data
/// into `sg`. The first failure is returned (data is copied anyway).
pub(crate) fn verify_strip(
    wire: &[u8],
    sg: &mut SgList,
    lba: u64,
    block: u32,
    blocks: u32,
) -> Option<PiFailure> {
    let p = params(lba, block);
    let (bs, wb) = (block as usize, block as usize + TUPLE);
    let mut first = None;
    for i in 0..blocks as usize {
        let w = &wire[i * wb..(i + 1) * wb];
        let mut t = [0u8; TUPLE];
        t.copy_from_slice(&w[bs..]);
        if first.is_none() {
            if let Err(e) = p.check(i as u64, &w[..bs], &PiTuple::decode(&t), (i * wb) as u64) {
                first = Some(PiFailure {
                    kind: match e.kind {
                        PiErrorKind::AppTag => SigErrKind::BadAppTag,
                        PiErrorKind::RefTag => SigErrKind::BadRefTag,
                        _ => SigErrKind::BadGuard,
                    },
                    lba: lba + i as u64,
                    expected: e.expected,
                    actual: e.actual,
                });
            }
        }
        sg_write(sg, i * bs, &w[..bs]);
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
