//! Core identifiers and the core-set parser (SPDK's `-m` / `--cpumask`).
//!
//! A [`Cores`] set is parsed from a list (`"0,1"`), ranges (`"0-3"`, `"0,2-3"`,
//! optionally in brackets, `"[0,2-3]"`) or a hexadecimal mask (`"0x3"`). Parsing
//! only checks syntax; [`Cores::check_exist`] checks each core against the
//! machine.

use std::fmt;
use std::str::FromStr;

/// The number of a CPU core, as the operating system numbers it.
///
/// It is a plain `u32` alias (not a newtype) so that `r.send(1, ..)` reads
/// naturally; a reactor's core is the core its thread is pinned to.
pub type CoreId = u32;

/// The largest core number the parser accepts (a sanity bound, not a machine
/// limit; [`Cores::check_exist`] checks the machine).
pub const MAX_CORE_ID: CoreId = 4095;

/// Why a core-set string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CoresError {
    /// The string (or the mask) names no core at all.
    #[error("empty core set")]
    Empty,
    /// A list element is not a decimal core number.
    #[error("invalid core number {0:?}")]
    InvalidNumber(String),
    /// A range whose start is past its end, such as `"3-1"`.
    #[error("invalid core range {start}-{end}: start is past the end")]
    InvalidRange {
        /// First core of the range as written.
        start: CoreId,
        /// Last core of the range as written.
        end: CoreId,
    },
    /// A `0x` mask with a character that is not a hexadecimal digit.
    #[error("invalid core mask {0:?}")]
    InvalidMask(String),
    /// A core number above [`MAX_CORE_ID`].
    #[error("core {0} is above the supported maximum {MAX_CORE_ID}")]
    TooLarge(u64),
    /// A core that this machine does not have (see [`Cores::check_exist`]).
    #[error("core {core} does not exist (this machine has {available} cores)")]
    NoSuchCore {
        /// The core asked for.
        core: CoreId,
        /// How many cores the machine has (cores `0..available`).
        available: usize,
    },
}

/// A non-empty, sorted set of distinct cores.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Cores(Vec<CoreId>);

impl Cores {
    /// Parses a core list, range list or `0x` mask.
    ///
    /// # Errors
    ///
    /// [`CoresError`] for bad syntax, an inverted range, a core above
    /// [`MAX_CORE_ID`] or an empty set.
    pub fn parse(s: &str) -> Result<Self, CoresError> {
        let s = s.trim();
        let s = s
            .strip_prefix('[')
            .and_then(|t| t.strip_suffix(']'))
            .unwrap_or(s)
            .trim();
        let mut cores = if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
            parse_mask(hex)?
        } else {
            parse_list(s)?
        };
        cores.sort_unstable();
        cores.dedup();
        if cores.is_empty() {
            return Err(CoresError::Empty);
        }
        Ok(Self(cores))
    }

    /// Builds a set from explicit core numbers (sorted and deduplicated).
    ///
    /// # Errors
    ///
    /// [`CoresError::Empty`] for no cores, [`CoresError::TooLarge`] for a core
    /// above [`MAX_CORE_ID`].
    pub fn from_ids(ids: impl IntoIterator<Item = CoreId>) -> Result<Self, CoresError> {
        let mut cores: Vec<CoreId> = ids.into_iter().collect();
        if let Some(&big) = cores.iter().find(|&&c| c > MAX_CORE_ID) {
            return Err(CoresError::TooLarge(u64::from(big)));
        }
        cores.sort_unstable();
        cores.dedup();
        if cores.is_empty() {
            return Err(CoresError::Empty);
        }
        Ok(Self(cores))
    }

    /// The cores `0..n` (at least core 0).
    pub fn first(n: usize) -> Self {
        let n = n.clamp(1, MAX_CORE_ID as usize + 1) as CoreId;
        Self((0..n).collect())
    }

    /// Checks that every core exists on this machine (cores are numbered
    /// `0..affinity::get_core_num()`).
    ///
    /// # Errors
    ///
    /// [`CoresError::NoSuchCore`] naming the first missing core.
    pub fn check_exist(&self) -> Result<(), CoresError> {
        self.check_exist_in(affinity::get_core_num())
    }

    /// Like [`check_exist`](Self::check_exist) against a given core count.
    ///
    /// # Errors
    ///
    /// [`CoresError::NoSuchCore`] naming the first core `>= available`.
    pub fn check_exist_in(&self, available: usize) -> Result<(), CoresError> {
        match self.0.iter().find(|&&c| c as usize >= available) {
            Some(&core) => Err(CoresError::NoSuchCore { core, available }),
            None => Ok(()),
        }
    }

    /// The cores, ascending.
    pub fn as_slice(&self) -> &[CoreId] {
        &self.0
    }

    /// Iterates over the cores, ascending.
    pub fn iter(&self) -> impl Iterator<Item = CoreId> + '_ {
        self.0.iter().copied()
    }

    /// How many cores the set holds (never zero).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Always `false`: a parsed set is never empty (present for clippy's
    /// `len_without_is_empty`).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `core` is in the set.
    pub fn contains(&self, core: CoreId) -> bool {
        self.0.binary_search(&core).is_ok()
    }

    /// The lowest core of the set (SPDK's default main core).
    pub fn lowest(&self) -> CoreId {
        self.0.first().copied().unwrap_or(0)
    }
}

impl Default for Cores {
    /// Core 0 alone.
    fn default() -> Self {
        Self(vec![0])
    }
}

impl FromStr for Cores {
    type Err = CoresError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for Cores {
    /// Writes the set as a compact range list, e.g. `0,2-3`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut i = 0;
        let mut first = true;
        while i < self.0.len() {
            let start = self.0[i];
            let mut j = i;
            while j + 1 < self.0.len() && self.0[j + 1] == self.0[j] + 1 {
                j += 1;
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if j == i {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{}", self.0[j])?;
            }
            i = j + 1;
        }
        Ok(())
    }
}

fn parse_core(s: &str) -> Result<CoreId, CoresError> {
    let t = s.trim();
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(CoresError::InvalidNumber(t.to_owned()));
    }
    let v: u64 = t.parse().map_err(|_| CoresError::TooLarge(u64::MAX))?;
    if v > u64::from(MAX_CORE_ID) {
        return Err(CoresError::TooLarge(v));
    }
    Ok(v as CoreId)
}

fn parse_list(s: &str) -> Result<Vec<CoreId>, CoresError> {
    if s.is_empty() {
        return Err(CoresError::Empty);
    }
    let mut out = Vec::new();
    for part in s.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (start, end) = (parse_core(a)?, parse_core(b)?);
                if start > end {
                    return Err(CoresError::InvalidRange { start, end });
                }
                out.extend(start..=end);
            }
            None => out.push(parse_core(part)?),
        }
    }
    Ok(out)
}

fn parse_mask(hex: &str) -> Result<Vec<CoreId>, CoresError> {
    if hex.is_empty() {
        return Err(CoresError::InvalidMask(format!("0x{hex}")));
    }
    let mut out = Vec::new();
    // The last digit holds cores 0-3, the one before it 4-7, and so on.
    for (pos, ch) in hex.chars().rev().enumerate() {
        let nibble = ch
            .to_digit(16)
            .ok_or_else(|| CoresError::InvalidMask(format!("0x{hex}")))?;
        for bit in 0..4u64 {
            if nibble & (1 << bit) != 0 {
                let core = pos as u64 * 4 + bit;
                if core > u64::from(MAX_CORE_ID) {
                    return Err(CoresError::TooLarge(core));
                }
                out.push(core as CoreId);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(s: &str) -> Vec<CoreId> {
        Cores::parse(s).unwrap().as_slice().to_vec()
    }

    #[test]
    fn parses_lists_ranges_and_masks() {
        assert_eq!(ids("0,1"), [0, 1]);
        assert_eq!(ids("0-3"), [0, 1, 2, 3]);
        assert_eq!(ids("0,2-3"), [0, 2, 3]);
        assert_eq!(ids(" [3,1,1,0-1] "), [0, 1, 3]);
        assert_eq!(ids("0x3"), [0, 1]);
        assert_eq!(ids("0X5"), [0, 2]);
        assert_eq!(ids("0x100"), [8]);
        assert_eq!(ids("0xf0"), [4, 5, 6, 7]);
        assert_eq!(ids("7"), [7]);
    }

    #[test]
    fn refuses_bad_input() {
        assert_eq!(Cores::parse(""), Err(CoresError::Empty));
        assert_eq!(Cores::parse("0x0"), Err(CoresError::Empty));
        assert!(matches!(
            Cores::parse("a"),
            Err(CoresError::InvalidNumber(_))
        ));
        assert!(matches!(
            Cores::parse("1,,2"),
            Err(CoresError::InvalidNumber(_))
        ));
        assert!(matches!(
            Cores::parse("-1"),
            Err(CoresError::InvalidNumber(_))
        ));
        assert!(matches!(
            Cores::parse("0x"),
            Err(CoresError::InvalidMask(_))
        ));
        assert!(matches!(
            Cores::parse("0xg1"),
            Err(CoresError::InvalidMask(_))
        ));
        assert_eq!(
            Cores::parse("3-1"),
            Err(CoresError::InvalidRange { start: 3, end: 1 })
        );
        assert_eq!(Cores::parse("5000"), Err(CoresError::TooLarge(5000)));
        assert!(matches!(
            Cores::parse("99999999999999999999999"),
            Err(CoresError::TooLarge(_))
        ));
        assert!(matches!(
            Cores::parse(&format!("0x1{}", "0".repeat(1030))),
            Err(CoresError::TooLarge(_))
        ));
    }

    #[test]
    fn checks_existence() {
        let c = Cores::parse("0,2-3").unwrap();
        assert_eq!(c.check_exist_in(4), Ok(()));
        assert_eq!(
            c.check_exist_in(3),
            Err(CoresError::NoSuchCore {
                core: 3,
                available: 3
            })
        );
        assert!(Cores::parse("0").unwrap().check_exist().is_ok());
        let too_many = Cores::from_ids([affinity::get_core_num() as CoreId]).unwrap();
        assert!(too_many.check_exist().is_err());
    }

    #[test]
    fn displays_compactly_and_round_trips() {
        for s in ["0", "0,2-3", "0-7", "1,3,5-6,9"] {
            let c: Cores = s.parse().unwrap();
            assert_eq!(c.to_string(), s);
            assert_eq!(Cores::parse(&c.to_string()).unwrap(), c);
        }
        assert_eq!(Cores::first(3).to_string(), "0-2");
        assert!(Cores::first(2).contains(1));
        assert!(!Cores::first(2).contains(2));
        assert_eq!(Cores::parse("0x6").unwrap().lowest(), 1);
    }
}
