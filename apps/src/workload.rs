//! Workload generation for the perf apps: the access pattern (`-w`), the
//! read/write mix (`-M`), offsets and the data pattern that `verify` checks.
//! Everything here is allocation-free per I/O.

use std::fmt;
use std::str::FromStr;

/// The `-w` workloads, as in SPDK's bdevperf and `spdk_nvme_perf`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Random reads.
    RandRead,
    /// Random writes.
    RandWrite,
    /// Sequential mix of reads and writes (`-M` read percentage).
    Rw,
    /// Random mix of reads and writes (`-M` read percentage).
    RandRw,
    /// Write a pattern, read it back and compare (each slot owns its own blocks).
    Verify,
}

/// An unknown `-w` value.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown workload '{0}' (expected read, write, randread, randwrite, rw, randrw or verify)")]
pub struct UnknownWorkload(pub String);

impl FromStr for Workload {
    type Err = UnknownWorkload;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "read" => Workload::Read,
            "write" => Workload::Write,
            "randread" => Workload::RandRead,
            "randwrite" => Workload::RandWrite,
            "rw" => Workload::Rw,
            "randrw" => Workload::RandRw,
            "verify" => Workload::Verify,
            other => return Err(UnknownWorkload(other.to_string())),
        })
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Workload::Read => "read",
            Workload::Write => "write",
            Workload::RandRead => "randread",
            Workload::RandWrite => "randwrite",
            Workload::Rw => "rw",
            Workload::RandRw => "randrw",
            Workload::Verify => "verify",
        })
    }
}

impl Workload {
    /// Whether offsets are random.
    pub fn is_random(self) -> bool {
        matches!(
            self,
            Workload::RandRead | Workload::RandWrite | Workload::RandRw
        )
    }

    /// The read percentage this workload implies, given the `-M` value
    /// (used only by the mixed workloads).
    pub fn read_pct(self, mix: u8) -> u8 {
        match self {
            Workload::Read | Workload::RandRead => 100,
            Workload::Write | Workload::RandWrite => 0,
            Workload::Rw | Workload::RandRw => mix.min(100),
            Workload::Verify => 50,
        }
    }
}

/// A small, fast pseudo-random generator (xorshift64*), one per job: no
/// shared state, no allocation, a few instructions per draw.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (0 is replaced by a fixed odd constant).
    pub fn new(seed: u64) -> Self {
        Rng(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value in `0..n` (`n` > 0), by multiply-shift (no division).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

/// Chooses the next I/O's offset (in units of the I/O size) within a job's
/// range and whether it reads or writes.
#[derive(Clone, Debug)]
pub struct OffsetGen {
    random: bool,
    read_pct: u8,
    /// Number of I/O-sized units in the range.
    units: u64,
    next_seq: u64,
    rng: Rng,
}

impl OffsetGen {
    /// A generator over `units` I/O-sized units (must be > 0).
    pub fn new(workload: Workload, mix: u8, units: u64, seed: u64) -> Self {
        OffsetGen {
            random: workload.is_random(),
            read_pct: workload.read_pct(mix),
            units: units.max(1),
            next_seq: 0,
            rng: Rng::new(seed),
        }
    }

    /// The next unit index.
    #[inline]
    pub fn next_unit(&mut self) -> u64 {
        if self.random {
            self.rng.below(self.units)
        } else {
            let u = self.next_seq;
            self.next_seq += 1;
            if self.next_seq == self.units {
                self.next_seq = 0;
            }
            u
        }
    }

    /// Whether the next I/O is a read.
    #[inline]
    pub fn next_is_read(&mut self) -> bool {
        match self.read_pct {
            100 => true,
            0 => false,
            p => self.rng.below(100) < u64::from(p),
        }
    }
}

/// Fills `buf` with the verify pattern of the data at byte `offset` of the
/// device, written for the `generation`-th time.
pub fn fill_pattern(buf: &mut [u8], offset: u64, generation: u64) {
    for (i, chunk) in buf.chunks_mut(8).enumerate() {
        let word = pattern_word(offset, i as u64, generation).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
}

/// Checks `buf` against [`fill_pattern`]; returns the first mismatching byte
/// index.
pub fn check_pattern(buf: &[u8], offset: u64, generation: u64) -> Result<(), usize> {
    for (i, chunk) in buf.chunks(8).enumerate() {
        let word = pattern_word(offset, i as u64, generation).to_le_bytes();
        if chunk != &word[..chunk.len()] {
            let at = chunk
                .iter()
                .zip(word.iter())
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            return Err(i * 8 + at);
        }
    }
    Ok(())
}

/// The generation-0 pattern of the bytes at `offset..offset + buf.len()`
/// of a device (`offset` a multiple of 8): what a pure-read `--verify`
/// expects. Every 8-byte little-endian word holds its own byte offset XOR
/// `0xA5A5_0000_0000_5A5A`, whatever the I/O size.
pub fn known_pattern(buf: &mut [u8], offset: u64) {
    fill_pattern(buf, offset, 0);
}

#[inline]
fn pattern_word(offset: u64, index: u64, generation: u64) -> u64 {
    (offset + index * 8) ^ generation.rotate_left(32) ^ 0xA5A5_0000_0000_5A5A
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_parse_and_print() {
        for w in [
            "read",
            "write",
            "randread",
            "randwrite",
            "rw",
            "randrw",
            "verify",
        ] {
            assert_eq!(w.parse::<Workload>().unwrap().to_string(), w);
        }
        assert_eq!(
            "bogus".parse::<Workload>(),
            Err(UnknownWorkload("bogus".into()))
        );
    }

    #[test]
    fn sequential_offsets_wrap_and_random_ones_stay_in_range() {
        let mut g = OffsetGen::new(Workload::Read, 0, 3, 1);
        let seq: Vec<u64> = (0..7).map(|_| g.next_unit()).collect();
        assert_eq!(seq, vec![0, 1, 2, 0, 1, 2, 0]);
        let mut g = OffsetGen::new(Workload::RandRead, 0, 10, 7);
        let mut seen = [false; 10];
        for _ in 0..1000 {
            let u = g.next_unit();
            assert!(u < 10);
            seen[u as usize] = true;
        }
        assert!(
            seen.iter().all(|s| *s),
            "random offsets should cover a small range"
        );
    }

    #[test]
    fn mix_follows_the_read_percentage() {
        let mut g = OffsetGen::new(Workload::RandRw, 70, 100, 3);
        let reads = (0..10_000).filter(|_| g.next_is_read()).count();
        assert!((6500..7500).contains(&reads), "{reads}");
        let mut g = OffsetGen::new(Workload::RandWrite, 70, 100, 3);
        assert!((0..100).all(|_| !g.next_is_read()));
    }

    #[test]
    fn pattern_detects_a_flipped_byte_and_a_stale_generation() {
        let mut b = vec![0u8; 4096];
        fill_pattern(&mut b, 8192, 5);
        assert_eq!(check_pattern(&b, 8192, 5), Ok(()));
        assert!(check_pattern(&b, 8192, 6).is_err());
        assert!(check_pattern(&b, 4096, 5).is_err());
        b[1234] ^= 1;
        assert_eq!(check_pattern(&b, 8192, 5), Err(1234));
    }

    #[test]
    fn known_pattern_does_not_depend_on_the_io_size() {
        let mut big = vec![0u8; 128 * 1024];
        known_pattern(&mut big, 1 << 20);
        for (k, chunk) in big.chunks(4096).enumerate() {
            assert_eq!(check_pattern(chunk, (1 << 20) + k as u64 * 4096, 0), Ok(()));
        }
        // Word at byte offset B holds B ^ 0xA5A5_0000_0000_5A5A, little-endian.
        let w = u64::from_le_bytes(big[8..16].try_into().unwrap());
        assert_eq!(w, ((1u64 << 20) + 8) ^ 0xA5A5_0000_0000_5A5A);
    }
}
