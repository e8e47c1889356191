//! The `key=value\0` text of Login and Text PDUs (RFC 7143 §6), parsed
//! under strict limits. Control path: parsing returns a `Vec` of borrowed
//! pairs.

use thiserror::Error;

/// Longest key name (RFC 7143: 63 bytes).
pub const MAX_KEY_LEN: usize = 63;
/// Longest ordinary value (RFC 7143: 255 bytes; longer only for binary
/// CHAP values, which this crate does not negotiate).
pub const MAX_VALUE_LEN: usize = 255;
/// Most pairs accepted in one login/text exchange.
pub const MAX_PAIRS: usize = 128;
/// Most text bytes accepted across one exchange's continued PDUs.
pub const MAX_TEXT_LEN: usize = 64 * 1024;

/// Why key=value text was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum TextError {
    /// The text does not end with a NUL.
    #[error("text is not NUL-terminated")]
    Unterminated,
    /// A pair has no `=`.
    #[error("pair {0} has no '='")]
    NoEquals(usize),
    /// A key is empty, too long or has a character outside `[A-Za-z0-9.-+@_]`.
    #[error("pair {0} has an invalid key")]
    BadKey(usize),
    /// A value is too long or not UTF-8.
    #[error("pair {0} has an invalid value")]
    BadValue(usize),
    /// More than [`MAX_PAIRS`] pairs or [`MAX_TEXT_LEN`] bytes.
    #[error("too much text")]
    TooLong,
    /// A key appears twice.
    #[error("key {0} given twice")]
    Duplicate(String),
}

fn key_ok(k: &[u8]) -> bool {
    !k.is_empty()
        && k.len() <= MAX_KEY_LEN
        && k.iter()
            .all(|&c| c.is_ascii_alphanumeric() || b".-+@_".contains(&c))
}

/// Parse `data` (the data segment, padding removed) into pairs.
///
/// # Errors
/// [`TextError`] for anything outside the format or the limits, including
/// duplicate keys.
pub fn parse_text(data: &[u8]) -> Result<Vec<(&str, &str)>, TextError> {
    if data.is_empty() {
        return Ok(Vec::new());
    }
    if data.len() > MAX_TEXT_LEN {
        return Err(TextError::TooLong);
    }
    if data.last() != Some(&0) {
        return Err(TextError::Unterminated);
    }
    let mut out: Vec<(&str, &str)> = Vec::new();
    for (i, pair) in data[..data.len() - 1].split(|&b| b == 0).enumerate() {
        if out.len() == MAX_PAIRS {
            return Err(TextError::TooLong);
        }
        let eq = pair
            .iter()
            .position(|&b| b == b'=')
            .ok_or(TextError::NoEquals(i))?;
        let (k, v) = (&pair[..eq], &pair[eq + 1..]);
        if !key_ok(k) {
            return Err(TextError::BadKey(i));
        }
        if v.len() > MAX_VALUE_LEN {
            return Err(TextError::BadValue(i));
        }
        let k = std::str::from_utf8(k).map_err(|_| TextError::BadKey(i))?;
        let v = std::str::from_utf8(v).map_err(|_| TextError::BadValue(i))?;
        if out.iter().any(|(ok, _)| *ok == k) {
            return Err(TextError::Duplicate(k.to_owned()));
        }
        out.push((k, v));
    }
    Ok(out)
}

/// Append `key=value\0` to `out`.
pub fn push_pair(out: &mut Vec<u8>, key: &str, value: &str) {
    out.extend_from_slice(key.as_bytes());
    out.push(b'=');
    out.extend_from_slice(value.as_bytes());
    out.push(0);
}

/// A numeric value: decimal, or hex with `0x`/`0X`.
pub fn parse_number(v: &str) -> Option<u64> {
    if let Some(h) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        if h.is_empty() || h.len() > 16 {
            return None;
        }
        u64::from_str_radix(h, 16).ok()
    } else {
        if v.is_empty() || v.len() > 20 || !v.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        v.parse().ok()
    }
}

/// A boolean value: `Yes` or `No`.
pub fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "Yes" => Some(true),
        "No" => Some(false),
        _ => None,
    }
}

/// `Yes`/`No` for a boolean.
pub fn bool_str(b: bool) -> &'static str {
    if b {
        "Yes"
    } else {
        "No"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pairs() {
        let t = b"InitiatorName=iqn.2024-01.io.pollux:i\0SessionType=Normal\0Empty=\0";
        let p = parse_text(t).unwrap();
        assert_eq!(p[0], ("InitiatorName", "iqn.2024-01.io.pollux:i"));
        assert_eq!(p[2], ("Empty", ""));
        assert_eq!(parse_text(b"").unwrap(), vec![]);
    }

    #[test]
    fn refuses_bad_text() {
        assert_eq!(parse_text(b"A=1"), Err(TextError::Unterminated));
        assert_eq!(parse_text(b"A\0"), Err(TextError::NoEquals(0)));
        assert_eq!(parse_text(b"=1\0"), Err(TextError::BadKey(0)));
        assert_eq!(parse_text(b"A B=1\0"), Err(TextError::BadKey(0)));
        assert_eq!(parse_text(b"A=1\0\0"), Err(TextError::NoEquals(1)));
        assert!(matches!(
            parse_text(b"A=1\0A=2\0"),
            Err(TextError::Duplicate(_))
        ));
        let long = format!("{}=1\0", "K".repeat(64));
        assert_eq!(parse_text(long.as_bytes()), Err(TextError::BadKey(0)));
        let long = format!("K={}\0", "v".repeat(256));
        assert_eq!(parse_text(long.as_bytes()), Err(TextError::BadValue(0)));
        assert_eq!(parse_text(b"K=\xff\0"), Err(TextError::BadValue(0)));
        let many: Vec<u8> = (0..=MAX_PAIRS)
            .flat_map(|i| format!("K{i}=1\0").into_bytes())
            .collect();
        assert_eq!(parse_text(&many), Err(TextError::TooLong));
    }

    #[test]
    fn numbers_and_bools() {
        assert_eq!(parse_number("262144"), Some(262144));
        assert_eq!(parse_number("0x10"), Some(16));
        assert_eq!(parse_number("-1"), None);
        assert_eq!(parse_number(""), None);
        assert_eq!(parse_number("0x"), None);
        assert_eq!(parse_number("99999999999999999999999"), None);
        assert_eq!(parse_bool("Yes"), Some(true));
        assert_eq!(parse_bool("yes"), None);
    }
}
