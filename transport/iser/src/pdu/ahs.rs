//! Additional Header Segments: `[len u16][type u8][specific..]`, padded to
//! four bytes (RFC 7143 §11.2.2). `len` counts the bytes after the type
//! byte (the first of them is reserved in the standard types).

use super::bhs::{be16, be32, pad4};
use super::PduError;

/// AHS type: extended CDB (bytes 16.. of a CDB longer than 16).
pub const AHS_EXTENDED_CDB: u8 = 1;
/// AHS type: bidirectional read expected data transfer length.
pub const AHS_BIDI_READ_EDTL: u8 = 2;

/// One decoded AHS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ahs<'a> {
    /// CDB bytes beyond the first 16.
    ExtendedCdb(&'a [u8]),
    /// Expected read length of a bidirectional command.
    BidiReadEdtl(u32),
    /// A vendor-specific AHS (types 60-63).
    Vendor(u8, &'a [u8]),
}

/// Iterate over and validate the AHS area of a PDU.
///
/// # Errors
/// [`PduError::BadAhs`] for a truncated AHS, a reserved type, a wrong
/// length or a non-zero reserved byte.
pub fn parse_ahs(mut area: &[u8], mut f: impl FnMut(Ahs<'_>)) -> Result<(), PduError> {
    while !area.is_empty() {
        if area.len() < 4 {
            return Err(PduError::BadAhs("truncated AHS header"));
        }
        let len = usize::from(be16(area, 0));
        let ty = area[2];
        let total = pad4(3 + len);
        if len == 0 || total > area.len() {
            return Err(PduError::BadAhs("AHS length"));
        }
        let body = &area[3..3 + len];
        match ty {
            AHS_EXTENDED_CDB => {
                if body[0] != 0 {
                    return Err(PduError::BadAhs("extended CDB reserved byte"));
                }
                f(Ahs::ExtendedCdb(&body[1..]));
            }
            AHS_BIDI_READ_EDTL => {
                if len != 5 || body[0] != 0 {
                    return Err(PduError::BadAhs("bidi read EDTL length"));
                }
                f(Ahs::BidiReadEdtl(be32(body, 1)));
            }
            60..=63 => f(Ahs::Vendor(ty, body)),
            _ => return Err(PduError::BadAhs("reserved AHS type")),
        }
        if area[3 + len..total].iter().any(|&b| b != 0) {
            return Err(PduError::BadAhs("AHS padding"));
        }
        area = &area[total..];
    }
    Ok(())
}

/// Encode one AHS into `out` (appended, padded). Returns the bytes added.
pub fn encode_ahs(ty: u8, body: &[u8], out: &mut Vec<u8>) -> usize {
    let len = body.len() + 1;
    let start = out.len();
    out.extend_from_slice(&(len as u16).to_be_bytes());
    out.push(ty);
    out.push(0);
    out.extend_from_slice(body);
    while (out.len() - start) % 4 != 0 {
        out.push(0);
    }
    out.len() - start
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ahs_round_trip_and_errors() {
        let mut v = Vec::new();
        encode_ahs(AHS_EXTENDED_CDB, &[1, 2, 3, 4, 5], &mut v);
        encode_ahs(AHS_BIDI_READ_EDTL, &4096u32.to_be_bytes(), &mut v);
        assert_eq!(v.len() % 4, 0);
        let mut got = Vec::new();
        parse_ahs(&v, |a| got.push(format!("{a:?}"))).unwrap();
        assert_eq!(got.len(), 2);
        assert!(got[1].contains("4096"));
        assert!(parse_ahs(&v[..3], |_| {}).is_err());
        let mut bad = v.clone();
        bad[2] = 7;
        assert!(parse_ahs(&bad, |_| {}).is_err());
        let mut bad = v.clone();
        bad[1] = 200;
        assert!(parse_ahs(&bad, |_| {}).is_err());
    }
}
