//! T10 PI on the target: check tuples per the command's PROTECT field,
//! generate them for plain writes and strip them for plain reads, in place
//! in a task buffer, with the sense codes of `t10-pi.md` §9.

use pollux_pi::{Checks, PiErrorKind, PiParams, PiType, TUPLE_SIZE};

use super::disk::PiMode;
use super::sense::Sense;

fn params(pi_type: u8, block: usize, lba: u64, checks: Checks) -> PiParams {
    let ty = if pi_type == 3 {
        PiType::Type3
    } else {
        PiType::Type1
    };
    let mut p = PiParams::for_type(ty, block, lba as u32, 0);
    p.checks = checks;
    p
}

fn sense_of(e: pollux_pi::PiError, lba: u64) -> Sense {
    let s = match e.kind {
        PiErrorKind::Guard => Sense::PI_GUARD,
        PiErrorKind::AppTag => Sense::PI_APP_TAG,
        PiErrorKind::RefTag => Sense::PI_REF_TAG,
        PiErrorKind::Length => return Sense::INTERNAL_FAILURE,
    };
    s.with_info(lba + e.block)
}

/// The checks a mode asks for (Strip: everything the type allows, the app
/// tag excepted since ATO=0).
pub fn checks(mode: PiMode, pi_type: u8) -> Checks {
    match mode {
        PiMode::None => Checks::NONE,
        PiMode::Strip => {
            if pi_type == 3 {
                Checks::GUARD
            } else {
                Checks::GUARD.with(Checks::REF)
            }
        }
        PiMode::Pass { guard, app, reftag } => {
            let mut c = Checks::NONE;
            if guard {
                c = c.with(Checks::GUARD);
            }
            if app {
                c = c.with(Checks::APP);
            }
            if reftag && pi_type != 3 {
                c = c.with(Checks::REF);
            }
            c
        }
    }
}

/// Verify interleaved blocks (`block` data bytes + 8 each) starting at
/// `lba`.
///
/// # Errors
/// ABORTED COMMAND 10/01, 10/02 or 10/03 with the failing LBA.
pub fn verify(buf: &[u8], block: usize, lba: u64, pi_type: u8, mode: PiMode) -> Result<(), Sense> {
    let c = checks(mode, pi_type);
    if c == Checks::NONE {
        return Ok(());
    }
    let p = params(pi_type, block, lba, c);
    pollux_pi::verify(pollux_pi::Buffers::Dif(buf), &p).map_err(|e| sense_of(e, lba))
}

/// `buf[..n*block]` holds plain blocks; spread them to `block + 8`
/// strides and generate their tuples (app tag 0, ref tag = LBA), in place.
/// `buf` must hold `n * (block + 8)` bytes.
pub fn insert(buf: &mut [u8], block: usize, n: usize, lba: u64, pi_type: u8) {
    let stride = block + TUPLE_SIZE;
    let p = params(pi_type, block, lba, Checks::ALL);
    for i in (0..n).rev() {
        buf.copy_within(i * block..(i + 1) * block, i * stride);
        let (data, rest) = buf[i * stride..(i + 1) * stride].split_at_mut(block);
        let mut t = p.tuple_for(i as u64, data);
        if pi_type == 3 {
            t.ref_tag = 0;
        }
        rest.copy_from_slice(&t.encode());
    }
}

/// Drop the tuples of `n` interleaved blocks, packing the data to the
/// front of `buf`, in place.
pub fn strip(buf: &mut [u8], block: usize, n: usize) {
    let stride = block + TUPLE_SIZE;
    for i in 1..n {
        buf.copy_within(i * stride..i * stride + block, i * block);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_verify_strip_round_trip() {
        let n = 4;
        let mut buf = vec![0u8; n * 520];
        for (i, b) in buf[..n * 512].iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        let orig = buf[..n * 512].to_vec();
        insert(&mut buf, 512, n, 100, 1);
        assert_eq!(&buf[520 + 516..520 + 520], &101u32.to_be_bytes());
        verify(&buf, 512, 100, 1, PiMode::Strip).unwrap();
        assert_eq!(
            verify(&buf, 512, 99, 1, PiMode::Strip).unwrap_err().code(),
            (0xB, 0x10, 0x03)
        );
        // No ref check with PROTECT 011b.
        verify(
            &buf,
            512,
            99,
            1,
            PiMode::Pass {
                guard: false,
                app: false,
                reftag: false,
            },
        )
        .unwrap();
        let mut bad = buf.clone();
        bad[2 * 520 + 7] ^= 1;
        let e = verify(&bad, 512, 100, 1, PiMode::Strip).unwrap_err();
        assert_eq!((e.code(), e.info), ((0xB, 0x10, 0x01), Some(102)));
        strip(&mut buf, 512, n);
        assert_eq!(&buf[..n * 512], &orig[..]);
    }

    #[test]
    fn app_tag_errors_map_to_10_02() {
        let mut buf = vec![7u8; 520];
        insert(&mut buf, 512, 1, 0, 1);
        buf[515] = 5;
        let m = PiMode::Pass {
            guard: true,
            app: true,
            reftag: true,
        };
        assert_eq!(
            verify(&buf, 512, 0, 1, m).unwrap_err().code(),
            (0xB, 0x10, 0x02)
        );
        // Type 3 never checks the ref tag.
        let mut t3 = vec![7u8; 520];
        insert(&mut t3, 512, 1, 0, 3);
        verify(&t3, 512, 12345, 3, PiMode::Strip).unwrap();
    }
}
