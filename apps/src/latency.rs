//! Latency recording for the perf apps: one histogram per job, merged per core
//! and in total. Recording is a bucket increment (no allocation, no lock).

use hdrhistogram::Histogram;

/// Highest latency recorded exactly, in nanoseconds (60 s); longer ones are
/// clamped to it.
const MAX_TRACKABLE_NS: u64 = 60_000_000_000;

/// A latency histogram in nanoseconds with 3 significant digits.
#[derive(Clone, Debug)]
pub struct LatencyHistogram {
    hist: Histogram<u64>,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyHistogram {
    /// An empty histogram. Allocates its buckets once, here.
    pub fn new() -> Self {
        // The bounds are constants that hdrhistogram accepts (low 1, high well
        // above 2 * low, 3 significant figures), so this cannot fail.
        let hist = match Histogram::new_with_bounds(1, MAX_TRACKABLE_NS, 3) {
            Ok(h) => h,
            Err(_) => unreachable!("constant histogram bounds are valid"),
        };
        Self { hist }
    }

    /// Records one latency sample in nanoseconds.
    #[inline]
    pub fn record(&mut self, ns: u64) {
        self.hist.saturating_record(ns.clamp(1, MAX_TRACKABLE_NS));
    }

    /// Adds every sample of `other` to this histogram.
    pub fn merge(&mut self, other: &LatencyHistogram) {
        // Both histograms have identical bounds, so `add` cannot fail.
        let _ = self.hist.add(&other.hist);
    }

    /// Number of samples.
    pub fn count(&self) -> u64 {
        self.hist.len()
    }

    /// Mean in microseconds (0 when empty).
    pub fn mean_us(&self) -> f64 {
        if self.hist.is_empty() {
            0.0
        } else {
            self.hist.mean() / 1000.0
        }
    }

    /// Smallest sample in microseconds (0 when empty).
    pub fn min_us(&self) -> f64 {
        if self.hist.is_empty() {
            0.0
        } else {
            self.hist.min() as f64 / 1000.0
        }
    }

    /// Largest sample in microseconds (0 when empty).
    pub fn max_us(&self) -> f64 {
        self.hist.max() as f64 / 1000.0
    }

    /// The value at `quantile` (0.0 ..= 1.0) in microseconds (0 when empty).
    pub fn quantile_us(&self, quantile: f64) -> f64 {
        if self.hist.is_empty() {
            0.0
        } else {
            self.hist.value_at_quantile(quantile) as f64 / 1000.0
        }
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
    }
}
