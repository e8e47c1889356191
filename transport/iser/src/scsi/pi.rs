//! T10 PI on the target, through the bdev layer: the [`PiAction`] a READ
//! or WRITE's PROTECT field asks the bdev for (`t10-pi.md` §4.1, §6), the
//! sense of the bdev's [`IoError::Pi`] (§9), and the in-place layout moves
//! between plain wire blocks and the bdev's interleaved blocks. The target
//! computes no tuple itself: the bdev generates (write-generate), verifies
//! (write-verify before the medium, read-verify after it) and reports the
//! failing field and LBA.

use pollux_bdev::pi::{PiAction, PiChecks, PiErrorKind};
use pollux_bdev::IoError;
use pollux_pi::TUPLE_SIZE;

use super::cdb::PiTags;
use super::disk::PiMode;
use super::sense::Sense;

/// The checks a mode asks for (Strip: everything the type allows, the app
/// tag excepted since ATO=0).
pub fn checks(mode: PiMode, pi_type: u8) -> PiChecks {
    match mode {
        PiMode::None => PiChecks::NONE,
        PiMode::Strip => {
            if pi_type == 3 {
                PiChecks::GUARD
            } else {
                PiChecks::GUARD.with(PiChecks::REF)
            }
        }
        PiMode::Pass { guard, app, reftag } => {
            let mut c = PiChecks::NONE;
            if guard {
                c = c.with(PiChecks::GUARD);
            }
            if app {
                c = c.with(PiChecks::APP);
            }
            if reftag && pi_type != 3 {
                c = c.with(PiChecks::REF);
            }
            c
        }
    }
}

/// What the bdev does about PI for a READ (`write == false`) or WRITE at
/// `lba` under `mode`, or `None` when the LU has no PI.
///
/// - WRITE, PROTECT 000b ([`PiMode::Strip`]): the wire carries plain
///   blocks; the bdev generates each tuple (app tag 0; ref tag = LBA on
///   Type 1, 0 on Type 3) into the spread-out buffer ([`spread`]).
/// - WRITE, PROTECT 001b-101b: the bdev verifies the initiator's tuples per
///   the PROTECT field before the medium sees them.
/// - READ: the bdev verifies per the PROTECT field (000b: guard and ref
///   tag) after the medium; with 000b the target then [`strip`]s the tuples.
///
/// READ(32)/WRITE(32) (`tags`, PI Type 2) seed the reference tags with the
/// EXPECTED INITIAL LOGICAL BLOCK REFERENCE TAG and, with a non-zero mask
/// and PI on the wire, have the application tag checked against the
/// command's under that mask.
pub fn action(
    mode: PiMode,
    pi_type: u8,
    lba: u64,
    write: bool,
    tags: Option<PiTags>,
) -> Option<PiAction> {
    if mode == PiMode::None || pi_type == 0 {
        return None;
    }
    // Type 1 derives the ref tag from the LBA itself (Type 2 without a
    // 32-byte CDB too); Type 3 writes this opaque value and never checks it.
    let ref_tag = match (pi_type, tags) {
        (3, _) => 0,
        (_, Some(t)) => t.ref_tag,
        _ => lba as u32,
    };
    let mut a = if write && mode == PiMode::Strip {
        PiAction::write_generate()
    } else {
        PiAction::verify(checks(mode, pi_type))
    };
    if let Some(t) = tags {
        a.app_tag = t.app_tag;
        if mode.on_wire() && t.app_mask != 0 {
            a = a.with_app_tag(t.app_tag, t.app_mask);
        }
    }
    Some(a.with_ref_tag(ref_tag))
}

/// The sense of a bdev PI failure: ABORTED COMMAND 10/01 (guard), 10/02
/// (application tag) or 10/03 (reference tag) with the failing LBA in the
/// information field; `None` for any other error.
pub fn sense_of(e: &IoError) -> Option<Sense> {
    let IoError::Pi { kind, lba, .. } = *e else {
        return None;
    };
    Some(match kind {
        PiErrorKind::Guard => Sense::PI_GUARD.with_info(lba),
        PiErrorKind::AppTag => Sense::PI_APP_TAG.with_info(lba),
        PiErrorKind::RefTag => Sense::PI_REF_TAG.with_info(lba),
        PiErrorKind::Length => Sense::INTERNAL_FAILURE,
    })
}

/// `buf[..n*block]` holds plain blocks: move them to `block + 8` strides
/// (the tuple slots are left for the bdev to generate), in place. `buf`
/// must hold `n * (block + 8)` bytes; a shorter one is left untouched.
pub fn spread(buf: &mut [u8], block: usize, n: usize) {
    let stride = block + TUPLE_SIZE;
    if buf.len() < n * stride {
        return;
    }
    for i in (1..n).rev() {
        buf.copy_within(i * block..(i + 1) * block, i * stride);
    }
}

/// Drop the tuples of `n` interleaved blocks, packing the data to the
/// front of `buf`, in place (the inverse of [`spread`]).
pub fn strip(buf: &mut [u8], block: usize, n: usize) {
    let stride = block + TUPLE_SIZE;
    if buf.len() < n * stride {
        return;
    }
    for i in 1..n {
        buf.copy_within(i * stride..i * stride + block, i * block);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_then_strip_round_trip() {
        let n = 4;
        let mut buf = vec![0u8; n * 520];
        for (i, b) in buf[..n * 512].iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        let orig = buf[..n * 512].to_vec();
        spread(&mut buf, 512, n);
        for i in 0..n {
            assert_eq!(&buf[i * 520..i * 520 + 512], &orig[i * 512..(i + 1) * 512]);
        }
        strip(&mut buf, 512, n);
        assert_eq!(&buf[..n * 512], &orig[..]);
        // Too short: untouched.
        let mut short = vec![1u8; 1000];
        spread(&mut short, 512, 2);
        assert!(short.iter().all(|&b| b == 1));
    }

    #[test]
    fn protect_field_to_bdev_action() {
        let strip = PiMode::Strip;
        assert_eq!(action(PiMode::None, 1, 5, true, None), None);
        assert_eq!(action(strip, 0, 5, true, None), None);
        // WRPROTECT 000b: generate; ref tag = LBA (Type 1), 0 (Type 3).
        let w = action(strip, 1, 77, true, None).unwrap();
        assert!(w.generate && w.ref_tag == 77 && w.app_tag == 0);
        assert_eq!(action(strip, 3, 77, true, None).unwrap().ref_tag, 0);
        // RDPROTECT 000b: guard + ref (Type 1), guard only (Type 3).
        let r = action(strip, 1, 9, false, None).unwrap();
        assert!(!r.generate);
        assert_eq!(r.checks, PiChecks::GUARD.with(PiChecks::REF));
        assert_eq!(
            action(strip, 3, 9, false, None).unwrap().checks,
            PiChecks::GUARD
        );
        // PROTECT 011b: nothing checked, nothing generated.
        let none = PiMode::Pass {
            guard: false,
            app: false,
            reftag: false,
        };
        let p = action(none, 1, 9, true, None).unwrap();
        assert!(!p.generate && !p.acts_on(true) && !p.acts_on(false));
        let g = PiMode::Pass {
            guard: true,
            app: true,
            reftag: true,
        };
        assert_eq!(checks(g, 1), PiChecks::ALL);
        assert_eq!(checks(g, 3), PiChecks::GUARD.with(PiChecks::APP));
    }

    #[test]
    fn type2_tags_seed_the_ref_tag_and_check_the_app_tag_under_its_mask() {
        let pass = PiMode::Pass {
            guard: true,
            app: false,
            reftag: true,
        };
        let tags = PiTags {
            ref_tag: 0x1000,
            app_tag: 0xAB,
            app_mask: 0xFF,
        };
        let a = action(pass, 2, 9, false, Some(tags)).unwrap();
        assert_eq!((a.ref_tag, a.app_tag, a.app_mask), (0x1000, 0xAB, 0xFF));
        assert!(a.checks.contains(PiChecks::APP) && a.checks.contains(PiChecks::REF));
        // No mask: the app tag is not compared; without tags, the LBA.
        let a = action(
            pass,
            2,
            9,
            false,
            Some(PiTags {
                app_mask: 0,
                ..tags
            }),
        )
        .unwrap();
        assert!(!a.checks.contains(PiChecks::APP));
        assert_eq!(action(pass, 2, 9, false, None).unwrap().ref_tag, 9);
        // Generation (000b) writes the command's tags.
        let g = action(PiMode::Strip, 2, 9, true, Some(tags)).unwrap();
        assert!(g.generate);
        assert_eq!((g.ref_tag, g.app_tag), (0x1000, 0xAB));
    }

    #[test]
    fn bdev_pi_errors_map_to_10_0x_with_the_lba() {
        let e = |kind| IoError::Pi {
            kind,
            lba: 4242,
            expected: 1,
            actual: 2,
        };
        for (kind, ascq) in [
            (PiErrorKind::Guard, 1),
            (PiErrorKind::AppTag, 2),
            (PiErrorKind::RefTag, 3),
        ] {
            let s = sense_of(&e(kind)).unwrap();
            assert_eq!((s.code(), s.info), ((0xB, 0x10, ascq), Some(4242)));
        }
        assert_eq!(sense_of(&IoError::NoPi), None, "not a PI check failure");
    }
}
