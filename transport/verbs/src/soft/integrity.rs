//! Integrity (signature) MRs in the soft provider: the T10-PI transform
//! applied when a copy goes through an integrity MR (`t10-pi.md` §7).
//!
//! The MR's address space is the wire domain. Whoever copies (the requester
//! of a READ/WRITE, the sender gathering a SEND, the receiver scattering
//! one) converts interval by interval:
//! - out of the MR (memory → wire): memory DIF/DIX tuples are checked per
//!   the check mask and passed on (ref tag remapped to the wire domain's),
//!   or generated when the memory domain has none; dropped if the wire
//!   domain has none (strip);
//! - into the MR (wire → memory): wire tuples are checked and stored (DIX
//!   buffer or interleaved), generated when the wire has none (insert), or
//!   dropped when memory has none.
//!
//! A mismatch never fails the work request: the first error is kept for
//! `check_sig_status` (the owner's MR, reported across the link when the
//! copier is the peer). Transfers must cover whole wire intervals, and one
//! side only may be an integrity MR (an integrity SGE must be the WR's only
//! one).

use pollux_pi::{Checks, PiErrorKind, PiParams, PiTuple};

use super::mr::SigSide;
use super::shm::{Cursor, SpanList};
use crate::sig::{check, SigErrKind, SigError, T10Dif, PI_TUPLE_SIZE};

/// One side of a copy.
pub(crate) enum Side<'a> {
    /// Ordinary memory (or a ring payload) holding wire-domain bytes.
    Plain(&'a SpanList),
    /// An integrity MR.
    Sig(&'a SigSide),
}

/// The copy does not fit the integrity MR's geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout;

fn params(d: &T10Dif, check_mask: u8, first_block: u64) -> PiParams {
    let mut checks = Checks::NONE;
    if check_mask & check::GUARD != 0 {
        checks = checks.with(Checks::GUARD);
    }
    if check_mask & check::APPTAG != 0 {
        checks = checks.with(Checks::APP);
    }
    if check_mask & check::REFTAG != 0 {
        checks = checks.with(Checks::REF);
    }
    PiParams {
        interval: d.pi_interval as usize,
        guard_seed: d.bg,
        app_tag: d.app_tag,
        app_mask: d.apptag_check_mask,
        ref_tag: if d.ref_remap {
            d.ref_tag.wrapping_add(first_block as u32)
        } else {
            d.ref_tag
        },
        ref_increment: d.ref_remap,
        app_escape: d.app_escape,
        ref_escape: d.ref_escape,
        checks,
    }
}

/// The tuple as seen by the other domain (the ref tag follows its seed).
fn remap(mut t: PiTuple, from: &PiParams, to: &PiParams, i: u64) -> PiTuple {
    if t.ref_tag == from.ref_tag_at(i) {
        t.ref_tag = to.ref_tag_at(i);
    }
    t
}

/// Copy `wire_len` wire-domain bytes between `dst` and `src` (exactly one
/// of them an integrity MR), applying the PI transform. Returns the first
/// PI error found (for the integrity MR's owner).
///
/// # Errors
/// [`Layout`] when the length is not whole intervals or the memory runs
/// out (nothing sensible was copied).
pub(crate) fn copy(
    dst: Side<'_>,
    src: Side<'_>,
    wire_len: u64,
) -> Result<Option<SigError>, Layout> {
    let (sig, plain, outbound) = match (dst, src) {
        (Side::Plain(p), Side::Sig(s)) => (s, p, true),
        (Side::Sig(s), Side::Plain(p)) => (s, p, false),
        _ => return Err(Layout),
    };
    let g = sig.geom;
    if wire_len % g.wire_block != 0
        || wire_len / g.wire_block > sig.blocks
        || (plain.total() as u64) < wire_len
    {
        return Err(Layout);
    }
    let memp = g.mem.map(|d| params(&d, sig.check_mask, sig.first_block));
    let wirep = g.wire.map(|d| params(&d, sig.check_mask, sig.first_block));
    let (mut pc, mut dc, mut tc) = (
        Cursor::new(plain),
        Cursor::new(&sig.data),
        Cursor::new(&sig.prot),
    );
    let mut bounce = [0u8; super::mr::SIG_MAX_INTERVAL as usize];
    let data = &mut bounce[..g.interval as usize];
    let mut first: Option<SigError> = None;
    let mut note = |e: pollux_pi::PiError| {
        if first.is_none() {
            first = Some(SigError {
                kind: match e.kind {
                    PiErrorKind::AppTag => SigErrKind::BadAppTag,
                    PiErrorKind::RefTag => SigErrKind::BadRefTag,
                    PiErrorKind::Guard | PiErrorKind::Length => SigErrKind::BadGuard,
                },
                expected: e.expected,
                actual: e.actual,
                offset: e.offset,
                key: sig.key,
            });
        }
    };
    let mut t = [0u8; PI_TUPLE_SIZE];
    for i in 0..wire_len / g.wire_block {
        let off = sig.wire_off + i * g.wire_block;
        if outbound {
            if !dc.read(data) {
                return Err(Layout);
            }
            let mem_t = match &memp {
                Some(mp) => {
                    let ok = if g.dix {
                        tc.read(&mut t)
                    } else {
                        dc.read(&mut t)
                    };
                    if !ok {
                        return Err(Layout);
                    }
                    let tuple = PiTuple::decode(&t);
                    if let Err(e) = mp.check(i, data, &tuple, off) {
                        note(e);
                    }
                    Some(tuple)
                }
                None => None,
            };
            if !pc.write(data) {
                return Err(Layout);
            }
            if let Some(wp) = &wirep {
                let out = match (mem_t, &memp) {
                    (Some(mt), Some(mp)) => remap(mt, mp, wp, i),
                    _ => wp.tuple_for(i, data),
                };
                if !pc.write(&out.encode()) {
                    return Err(Layout);
                }
            }
        } else {
            if !pc.read(data) {
                return Err(Layout);
            }
            let wire_t = match &wirep {
                Some(wp) => {
                    if !pc.read(&mut t) {
                        return Err(Layout);
                    }
                    let tuple = PiTuple::decode(&t);
                    if let Err(e) = wp.check(i, data, &tuple, off) {
                        note(e);
                    }
                    Some(tuple)
                }
                None => None,
            };
            if !dc.write(data) {
                return Err(Layout);
            }
            if let Some(mp) = &memp {
                let out = match (wire_t, &wirep) {
                    (Some(wt), Some(wp)) => remap(wt, wp, mp, i),
                    _ => mp.tuple_for(i, data),
                };
                let ok = if g.dix {
                    tc.write(&out.encode())
                } else {
                    dc.write(&out.encode())
                };
                if !ok {
                    return Err(Layout);
                }
            }
        }
    }
    Ok(first)
}
