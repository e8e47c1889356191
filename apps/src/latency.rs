//! Latency recording for the perf apps: one histogram per job, merged per core
//! and in total. Recording is a bucket increment (no allocation, no lock, a
//! handful of instructions): a log-linear array of 256 buckets per power of
//! two, exact below 512 ns, so every bucket is narrower than 0.4 % of its
//! values and a reported percentile (the bucket's midpoint) is within 0.2 %.
//! Mean, minimum and maximum are exact.

/// Highest latency recorded exactly, in nanoseconds (60 s); longer ones are
/// clamped to it.
const MAX_TRACKABLE_NS: u64 = 60_000_000_000;

/// log2 of the buckets per power of two.
const SUB_BITS: u32 = 8;

/// Bucket count: values up to 2^36 ns (> 60 s) have a bucket.
const BUCKETS: usize = ((36 - SUB_BITS as usize) << SUB_BITS) + (1 << (SUB_BITS + 1));

/// The bucket of `v` (`1 <= v < 2^36`): `v` itself below `2^(SUB_BITS+1)`,
/// then `2^SUB_BITS` buckets per power of two.
#[inline(always)]
fn bucket(v: u64) -> usize {
    let e = 63 - (v | 1).leading_zeros();
    let shift = e.saturating_sub(SUB_BITS);
    ((shift as usize) << SUB_BITS) + (v >> shift) as usize
}

/// The midpoint of bucket `idx`'s value range.
fn bucket_mid(idx: usize) -> u64 {
    if idx < (1 << (SUB_BITS + 1)) {
        return idx as u64;
    }
    let shift = (idx >> SUB_BITS) - 1;
    let low = ((idx - (shift << SUB_BITS)) as u64) << shift;
    low + ((1u64 << shift) >> 1)
}

/// A latency histogram in nanoseconds (percentiles within 0.2 %).
#[derive(Clone, Debug)]
pub struct LatencyHistogram {
    counts: Box<[u64; BUCKETS]>,
    count: u64,
    sum: u64,
    min: u64,
    max: u64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyHistogram {
    /// An empty histogram. Allocates its buckets once, here.
    pub fn new() -> Self {
        let counts: Box<[u64; BUCKETS]> = match vec![0u64; BUCKETS].into_boxed_slice().try_into() {
            Ok(b) => b,
            Err(_) => unreachable!("the vector has BUCKETS elements"),
        };
        Self {
            counts,
            count: 0,
            sum: 0,
            min: u64::MAX,
            max: 0,
        }
    }

    /// Records one latency sample in nanoseconds.
    #[inline]
    pub fn record(&mut self, ns: u64) {
        let v = ns.clamp(1, MAX_TRACKABLE_NS);
        if let Some(c) = self.counts.get_mut(bucket(v)) {
            *c += 1;
        }
        self.count += 1;
        self.sum = self.sum.wrapping_add(v);
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    /// Adds every sample of `other` to this histogram.
    pub fn merge(&mut self, other: &LatencyHistogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += *b;
        }
        self.count += other.count;
        self.sum = self.sum.wrapping_add(other.sum);
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    /// Number of samples.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Mean in microseconds (0 when empty).
    pub fn mean_us(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum as f64 / self.count as f64 / 1000.0
        }
    }

    /// Smallest sample in microseconds (0 when empty).
    pub fn min_us(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.min as f64 / 1000.0
        }
    }

    /// Largest sample in microseconds (0 when empty).
    pub fn max_us(&self) -> f64 {
        self.max as f64 / 1000.0
    }

    /// The value at `quantile` (0.0 ..= 1.0) in microseconds (0 when empty):
    /// the midpoint of the bucket holding the `ceil(quantile * count)`-th
    /// smallest sample, kept within the exact minimum and maximum.
    pub fn quantile_us(&self, quantile: f64) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        let q = quantile.clamp(0.0, 1.0);
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0u64;
        for (idx, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return bucket_mid(idx).clamp(self.min, self.max) as f64 / 1000.0;
            }
        }
        self.max as f64 / 1000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_follow_the_samples() {
        let mut h = LatencyHistogram::new();
        for ns in 1..=1000u64 {
            h.record(ns * 1000); // 1 us .. 1000 us
        }
        assert_eq!(h.count(), 1000);
        assert!(
            (h.quantile_us(0.5) - 500.0).abs() < 1.0,
            "{}",
            h.quantile_us(0.5)
        );
        assert!((h.quantile_us(0.99) - 990.0).abs() < 2.0);
        assert!((h.min_us() - 1.0).abs() < 0.01);
        assert!((h.max_us() - 1000.0).abs() < 1.0);
        assert!((h.mean_us() - 500.5).abs() < 1.0);
    }

    #[test]
    fn merge_adds_counts_and_empty_is_zero() {
        let mut a = LatencyHistogram::new();
        let mut b = LatencyHistogram::new();
        assert_eq!(a.mean_us(), 0.0);
        assert_eq!(a.quantile_us(0.99), 0.0);
        a.record(2_000);
        b.record(4_000);
        b.record(0); // clamped to 1 ns, not lost
        a.merge(&b);
        assert_eq!(a.count(), 3);
        assert!(a.max_us() >= 3.99);
        assert!((a.min_us() - 0.001).abs() < 1e-9);
    }

    #[test]
    fn buckets_are_contiguous_and_narrow() {
        assert_eq!(bucket(1), 1);
        assert_eq!(bucket(511), 511);
        assert_eq!(bucket(512), 512);
        assert!(bucket(MAX_TRACKABLE_NS) < BUCKETS);
        let mut last = 0;
        for v in 1..(1u64 << 20) {
            let b = bucket(v);
            assert!(b == last || b == last + 1, "gap at {v}");
            last = b;
        }
        let mut v = 1u64;
        while v < MAX_TRACKABLE_NS {
            let mid = bucket_mid(bucket(v));
            assert!(
                mid.abs_diff(v) as f64 <= v as f64 * 0.002 + 0.5,
                "{v} -> {mid}"
            );
            v += 1 + v / 300;
        }
    }

    #[test]
    fn percentiles_are_within_a_percent_of_exact() {
        let mut h = LatencyHistogram::new();
        let mut x = 0x0123_4567_89AB_CDEF_u64;
        let mut all = Vec::new();
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = 100 + x % 5_000_000;
            all.push(v);
            h.record(v);
        }
        all.sort_unstable();
        for q in [0.5, 0.9, 0.99, 0.999] {
            let exact = all[(q * all.len() as f64).ceil() as usize - 1] as f64 / 1000.0;
            let got = h.quantile_us(q);
            assert!(
                (got - exact).abs() <= exact * 0.01,
                "q{q}: {got} vs {exact}"
            );
        }
    }
}
