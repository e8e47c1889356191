//! UUIDs of bdevs, as SPDK shows and takes them (`8-4-4-4-12` hex).

use std::io::Read;

/// Why a string is not a UUID ([`Uuid::parse`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UuidError {
    /// Not 36 characters with dashes at 8, 13, 18 and 23.
    #[error("`{0}` is not a UUID (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")]
    Format(String),
    /// A character between the dashes is not a hex digit.
    #[error("`{0}` is not a UUID (bad hex digit)")]
    HexDigit(String),
}

/// A 128-bit UUID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Uuid([u8; 16]);

impl Uuid {
    /// A random (version 4) UUID from the kernel's random source.
    ///
    /// # Errors
    ///
    /// When `/dev/urandom` cannot be read.
    pub fn random() -> std::io::Result<Uuid> {
        let mut b = [0u8; 16];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
        b[6] = (b[6] & 0x0f) | 0x40;
        b[8] = (b[8] & 0x3f) | 0x80;
        Ok(Uuid(b))
    }

    /// Parses `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (either case).
    ///
    /// # Errors
    ///
    /// [`UuidError`] saying what is wrong.
    pub fn parse(s: &str) -> Result<Uuid, UuidError> {
        let bytes = s.as_bytes();
        if bytes.len() != 36 || [8, 13, 18, 23].iter().any(|&i| bytes[i] != b'-') {
            return Err(UuidError::Format(s.to_owned()));
        }
        let hex: Vec<u8> = bytes.iter().copied().filter(|&c| c != b'-').collect();
        let mut out = [0u8; 16];
        for (i, pair) in hex.chunks(2).enumerate() {
            let digit = |c: u8| (c as char).to_digit(16);
            match (
                pair.first().copied().and_then(digit),
                pair.get(1).copied().and_then(digit),
                out.get_mut(i),
            ) {
                (Some(h), Some(l), Some(o)) => *o = (h * 16 + l) as u8,
                _ => return Err(UuidError::HexDigit(s.to_owned())),
            }
        }
        Ok(Uuid(out))
    }

    /// The UUID of these 16 bytes.
    pub fn from_bytes(b: [u8; 16]) -> Uuid {
        Uuid(b)
    }

    /// Its 16 bytes.
    pub fn bytes(&self) -> [u8; 16] {
        self.0
    }
}

impl std::fmt::Display for Uuid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_format_round_trip() {
        let s = "913fc008-79a7-447f-b2c4-c73543638c31";
        assert_eq!(Uuid::parse(s).unwrap().to_string(), s);
        assert_eq!(
            Uuid::parse(&s.to_uppercase()).unwrap(),
            Uuid::parse(s).unwrap()
        );
        for bad in [
            "",
            "913fc008",
            "913fc008-79a7-447f-b2c4-c73543638c3g",
            "913fc00879a7-447f-b2c4-c73543638c31x",
        ] {
            assert!(Uuid::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn random_ones_are_version_4_and_differ() {
        let a = Uuid::random().unwrap();
        let b = Uuid::random().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.bytes()[6] >> 4, 4);
        assert_eq!(a.bytes()[8] >> 6, 2);
        assert_eq!(Uuid::parse(&a.to_string()).unwrap(), a);
    }
}
