//! REPORT SUPPORTED OPERATION CODES (SPC-4 §6.35): every command the
//! disk serves, with its CDB usage data.

use crate::scsi::sense::Sense;

/// One supported command: opcode, service action (for the commands whose
/// service action field selects the command) and the CDB usage data (its
/// first byte the opcode, then the bits the device server looks at).
struct Op {
    sa: Option<u16>,
    usage: &'static [u8],
}

const F: u8 = 0xFF;

/// The commands, ascending by opcode then service action. `UNMAP`-only
/// entries are filtered by [`listed`].
#[rustfmt::skip]
const OPS: &[Op] = &[
    Op { sa: None, usage: &[0x00, 0, 0, 0, 0, 0] },
    Op { sa: None, usage: &[0x03, 0, 0, 0, F, 0] },
    Op { sa: None, usage: &[0x08, 0x1F, F, F, F, 0] },
    Op { sa: None, usage: &[0x0A, 0x1F, F, F, F, 0] },
    Op { sa: None, usage: &[0x12, 0x01, F, F, F, 0] },
    Op { sa: None, usage: &[0x16, 0, 0, 0, 0, 0] },
    Op { sa: None, usage: &[0x17, 0, 0, 0, 0, 0] },
    Op { sa: None, usage: &[0x1A, 0x08, F, F, F, 0] },
    Op { sa: None, usage: &[0x1B, 0, 0, 0, 0, 0] },
    Op { sa: None, usage: &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0] },
    Op { sa: None, usage: &[0x28, 0xFC, F, F, F, F, 0x1F, F, F, 0] },
    Op { sa: None, usage: &[0x2A, 0xFC, F, F, F, F, 0x1F, F, F, 0] },
    Op { sa: None, usage: &[0x2E, 0xF6, F, F, F, F, 0x1F, F, F, 0] },
    Op { sa: None, usage: &[0x2F, 0xF6, F, F, F, F, 0x1F, F, F, 0] },
    Op { sa: None, usage: &[0x35, 0x02, F, F, F, F, 0x1F, F, F, 0] },
    Op { sa: None, usage: &[0x41, 0x0A, F, F, F, F, 0x1F, F, F, 0] },
    Op { sa: None, usage: &[0x42, 0, 0, 0, 0, 0, 0x1F, F, F, 0] },
    Op { sa: None, usage: &[0x5A, 0x18, F, F, 0, 0, 0, F, F, 0] },
    Op { sa: None, usage: &[0x5E, 0x1F, 0, 0, 0, 0, 0, F, F, 0] },
    Op { sa: None, usage: &[0x5F, 0x1F, F, 0, 0, F, F, F, F, 0] },
    Op { sa: None, usage: &[0x88, 0xFC, F, F, F, F, F, F, F, F, F, F, F, F, 0x1F, 0] },
    Op { sa: None, usage: &[0x89, 0xF8, F, F, F, F, F, F, F, F, 0, 0, 0, F, 0x1F, 0] },
    Op { sa: None, usage: &[0x8A, 0xFC, F, F, F, F, F, F, F, F, F, F, F, F, 0x1F, 0] },
    Op { sa: None, usage: &[0x8E, 0xF6, F, F, F, F, F, F, F, F, F, F, F, F, 0x1F, 0] },
    Op { sa: None, usage: &[0x8F, 0xF6, F, F, F, F, F, F, F, F, F, F, F, F, 0x1F, 0] },
    Op { sa: None, usage: &[0x91, 0x02, F, F, F, F, F, F, F, F, F, F, F, F, 0x1F, 0] },
    Op { sa: None, usage: &[0x93, 0x0B, F, F, F, F, F, F, F, F, F, F, F, F, 0x1F, 0] },
    Op { sa: Some(0x10), usage: &[0x9E, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, F, F, F, F, 0, 0] },
    Op { sa: Some(0x12), usage: &[0x9E, 0x12, F, F, F, F, F, F, F, F, F, F, F, F, 0, 0] },
    Op { sa: None, usage: &[0xA0, 0, F, 0, 0, 0, F, F, F, F, 0, 0] },
    Op { sa: Some(0x0C), usage: &[0xA3, 0x0C, 0x07, F, F, F, F, F, F, F, 0, 0] },
    Op { sa: None, usage: &[0xA8, 0xFC, F, F, F, F, F, F, F, F, 0x1F, 0] },
    Op { sa: None, usage: &[0xAA, 0xFC, F, F, F, F, F, F, F, F, 0x1F, 0] },
    Op { sa: None, usage: &[0xAE, 0xF6, F, F, F, F, F, F, F, F, 0x1F, 0] },
    Op { sa: None, usage: &[0xAF, 0xF6, F, F, F, F, F, F, F, F, 0x1F, 0] },
];

/// Opcodes served only when the disk advertises UNMAP.
const UNMAP_ONLY: [u8; 1] = [0x42];

/// Opcodes whose service action selects the command.
const WITH_SA: [u8; 2] = [0x9E, 0xA3];

fn listed(op: &Op, unmap: bool) -> bool {
    unmap || !UNMAP_ONLY.contains(&op.usage[0])
}

/// The answer for REPORTING OPTIONS `options`, requested `opcode` and
/// service action `sa`, into `out` (≥ 512 bytes); returns its length.
/// `unmap`: the disk serves UNMAP.
///
/// # Errors
/// ILLEGAL REQUEST 24/00 for a reserved reporting option, a service
/// action asked of a command without one (option 2) or none asked of a
/// command that has them (option 1).
pub fn report(
    options: u8,
    opcode: u8,
    sa: u16,
    unmap: bool,
    out: &mut [u8],
) -> Result<usize, Sense> {
    out.fill(0);
    match options {
        0 => {
            let mut n = 4;
            for op in OPS.iter().filter(|o| listed(o, unmap)) {
                if n + 8 > out.len() {
                    break;
                }
                out[n] = op.usage[0];
                out[n + 2..n + 4].copy_from_slice(&op.sa.unwrap_or(0).to_be_bytes());
                out[n + 5] = u8::from(op.sa.is_some()); // SERVACTV
                out[n + 6..n + 8].copy_from_slice(&(op.usage.len() as u16).to_be_bytes());
                n += 8;
            }
            out[..4].copy_from_slice(&((n - 4) as u32).to_be_bytes());
            Ok(n)
        }
        1..=3 => {
            let has_sa = WITH_SA.contains(&opcode);
            let want_sa = match options {
                1 if has_sa => return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(2, Some(2))),
                2 if !has_sa => return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(2, Some(2))),
                1 => None,
                2 => Some(sa),
                _ => has_sa.then_some(sa),
            };
            let found = OPS
                .iter()
                .filter(|o| listed(o, unmap))
                .find(|o| o.usage[0] == opcode && o.sa == want_sa);
            match found {
                Some(op) => {
                    out[1] = 0x03; // SUPPORT: supported as the standard says
                    out[2..4].copy_from_slice(&(op.usage.len() as u16).to_be_bytes());
                    out[4..4 + op.usage.len()].copy_from_slice(op.usage);
                    Ok(4 + op.usage.len())
                }
                None => {
                    out[1] = 0x01; // SUPPORT: not supported
                    Ok(4)
                }
            }
        }
        _ => Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(2, Some(2))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_every_command_once_ascending() {
        let mut out = [0u8; 512];
        let n = report(0, 0, 0, true, &mut out).unwrap();
        assert_eq!(n, 4 + 8 * OPS.len());
        let keys: Vec<(u8, u16)> = (4..n)
            .step_by(8)
            .map(|i| (out[i], u16::from_be_bytes([out[i + 2], out[i + 3]])))
            .collect();
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(keys, sorted);
        for op in OPS {
            // The CDB length agrees with the opcode's group.
            assert_eq!(
                Some(op.usage.len()),
                crate::scsi::cdb::cdb_len(op.usage[0]),
                "{:#x}",
                op.usage[0]
            );
        }
        let n2 = report(0, 0, 0, false, &mut out).unwrap();
        assert_eq!(n2, n - 8, "UNMAP not listed without thin provisioning");
    }

    #[test]
    fn one_command() {
        let mut out = [0u8; 512];
        let n = report(1, 0x89, 0, true, &mut out).unwrap();
        assert_eq!(
            (out[1], u16::from_be_bytes([out[2], out[3]]), n),
            (3, 16, 20)
        );
        assert_eq!(out[4], 0x89);
        assert_eq!(report(1, 0x04, 0, true, &mut out), Ok(4));
        assert_eq!(out[1], 1, "FORMAT UNIT not supported");
        assert_eq!(
            report(1, 0x9E, 0x10, true, &mut out).map_err(|s| s.code()),
            Err((5, 0x24, 0))
        );
        assert_eq!(report(2, 0x9E, 0x12, true, &mut out), Ok(20));
        assert_eq!(&out[4..6], &[0x9E, 0x12]);
        assert_eq!(
            report(2, 0x28, 0, true, &mut out).map_err(|s| s.code()),
            Err((5, 0x24, 0))
        );
        assert_eq!(report(3, 0x28, 7, true, &mut out), Ok(14));
        assert_eq!(
            report(5, 0, 0, true, &mut out).map_err(|s| s.code()),
            Err((5, 0x24, 0))
        );
    }
}
