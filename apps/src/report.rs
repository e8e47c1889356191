//! Results of a perf run: per-core and total figures, printed as a human
//! table or as one JSON object. Shared by `pollux-bdevperf` and the later
//! `pollux-perf` so both print the same shape.

use std::fmt::Write as _;

use serde::Serialize;

use crate::latency::LatencyHistogram;

/// What one core (or the whole run) did.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// Completed I/Os (successful and failed).
    pub ios: u64,
    /// Bytes moved by successful I/Os.
    pub bytes: u64,
    /// I/Os that completed with an error.
    pub errors: u64,
    /// Data mismatches found by `verify`.
    pub miscompares: u64,
    /// Latency of every completed I/O.
    pub latency: LatencyHistogram,
}

impl Tally {
    /// Adds `other` into `self`.
    pub fn merge(&mut self, other: &Tally) {
        self.ios += other.ios;
        self.bytes += other.bytes;
        self.errors += other.errors;
        self.miscompares += other.miscompares;
        self.latency.merge(&other.latency);
    }
}

/// Figures for one core or for the total, as printed.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Figures {
    /// I/Os per second.
    pub iops: f64,
    /// MiB per second.
    pub mibps: f64,
    /// Mean latency, µs.
    pub lat_avg_us: f64,
    /// Minimum latency, µs.
    pub lat_min_us: f64,
    /// Maximum latency, µs.
    pub lat_max_us: f64,
    /// Median latency, µs.
    pub lat_p50_us: f64,
    /// 99th percentile latency, µs.
    pub lat_p99_us: f64,
    /// 99.9th percentile latency, µs.
    pub lat_p999_us: f64,
    /// Completed I/Os.
    pub ios: u64,
    /// Failed I/Os.
    pub errors: u64,
    /// Data mismatches found by verify.
    pub miscompares: u64,
}

impl Figures {
    /// Computes the figures of `tally` over `seconds` of measurement.
    pub fn from_tally(tally: &Tally, seconds: f64) -> Self {
        let secs = if seconds > 0.0 {
            seconds
        } else {
            f64::MIN_POSITIVE
        };
        let l = &tally.latency;
        Figures {
            iops: tally.ios as f64 / secs,
            mibps: tally.bytes as f64 / secs / (1024.0 * 1024.0),
            lat_avg_us: l.mean_us(),
            lat_min_us: l.min_us(),
            lat_max_us: l.max_us(),
            lat_p50_us: l.quantile_us(0.50),
            lat_p99_us: l.quantile_us(0.99),
            lat_p999_us: l.quantile_us(0.999),
            ios: tally.ios,
            errors: tally.errors,
            miscompares: tally.miscompares,
        }
    }
}

/// One core's line of the report.
#[derive(Clone, Debug, Serialize)]
pub struct CoreReport {
    /// The core's id.
    pub core: u32,
    /// Share of the reactor loop's time spent in busy polls, percent.
    pub busy_pct: f64,
    /// The core's figures.
    #[serde(flatten)]
    pub figures: Figures,
}

/// A whole run: the totals at the top level, per-core lines in `cores`.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Seconds measured (after warm-up).
    pub seconds: f64,
    /// The totals.
    #[serde(flatten)]
    pub total: Figures,
    /// One entry per core.
    pub cores: Vec<CoreReport>,
    /// The target's reactor busy percentage, when the target is ours.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_busy_pct: Option<f64>,
    /// Times the host reconnected to a lost controller (NVMe-oF runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reconnects: Option<u64>,
    /// The submission path (`pollux-bdevperf`: `"generic"` or `"in-place"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The clock of the per-I/O latency timestamps (`"tsc"` or
    /// `"monotonic"`; absent where latency uses the reactor's loop clock).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clock: Option<String>,
}

impl Report {
    /// Builds a report from per-core tallies and reactor busy percentages.
    pub fn new(seconds: f64, per_core: &[(u32, Tally, f64)]) -> Self {
        let mut total = Tally::default();
        let mut cores = Vec::with_capacity(per_core.len());
        for (core, tally, busy) in per_core {
            total.merge(tally);
            cores.push(CoreReport {
                core: *core,
                busy_pct: *busy,
                figures: Figures::from_tally(tally, seconds),
            });
        }
        Report {
            seconds,
            total: Figures::from_tally(&total, seconds),
            cores,
            target_busy_pct: None,
            reconnects: None,
            path: None,
            clock: None,
        }
    }

    /// The report as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The report as a human table.
    pub fn to_table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<8} {:>12} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>7} {:>7}",
            "core",
            "IOPS",
            "MiB/s",
            "avg(us)",
            "min(us)",
            "p50(us)",
            "p99(us)",
            "p99.9(us)",
            "max(us)",
            "busy%",
            "errors"
        );
        let row = |s: &mut String, name: &str, f: &Figures, busy: Option<f64>| {
            let busy = busy.map_or_else(|| "-".to_string(), |b| format!("{b:.1}"));
            let _ = writeln!(
                s,
                "{:<8} {:>12.0} {:>10.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>10.2} {:>7} {:>7}",
                name,
                f.iops,
                f.mibps,
                f.lat_avg_us,
                f.lat_min_us,
                f.lat_p50_us,
                f.lat_p99_us,
                f.lat_p999_us,
                f.lat_max_us,
                busy,
                f.errors + f.miscompares
            );
        };
        for c in &self.cores {
            row(&mut s, &format!("{}", c.core), &c.figures, Some(c.busy_pct));
        }
        row(&mut s, "total", &self.total, None);
        if let Some(t) = self.target_busy_pct {
            let _ = writeln!(s, "target reactor busy: {t:.1}%");
        }
        if let Some(n) = self.reconnects {
            let _ = writeln!(s, "reconnects: {n}, failed I/Os: {}", self.total.errors);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(ios: u64, lat_ns: u64) -> Tally {
        let mut t = Tally::default();
        for _ in 0..ios {
            t.latency.record(lat_ns);
        }
        t.ios = ios;
        t.bytes = ios * 4096;
        t
    }

    #[test]
    fn json_has_the_fields_our_checks_read() {
        let r = Report::new(
            2.0,
            &[(0, tally(1000, 5_000), 97.5), (1, tally(3000, 7_000), 50.0)],
        );
        let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(v["iops"].as_f64().unwrap(), 2000.0);
        let mibps = v["mibps"].as_f64().unwrap();
        assert!((mibps - 4000.0 * 4096.0 / 2.0 / 1048576.0).abs() < 1e-9);
        assert!(v["lat_avg_us"].as_f64().unwrap() > 5.0);
        assert!(v["lat_p99_us"].as_f64().unwrap() >= 6.99);
        let cores = v["cores"].as_array().unwrap();
        assert_eq!(cores.len(), 2);
        assert_eq!(cores[1]["core"], 1);
        assert_eq!(cores[0]["busy_pct"], 97.5);
        assert_eq!(cores[1]["iops"].as_f64().unwrap(), 1500.0);
        assert!(v.get("target_busy_pct").is_none());
    }

    #[test]
    fn table_has_a_row_per_core_and_a_total() {
        let r = Report::new(1.0, &[(3, tally(10, 1_000), 12.0)]);
        let t = r.to_table();
        assert_eq!(t.lines().count(), 3);
        assert!(t.lines().nth(1).unwrap().starts_with("3 "));
        assert!(t.lines().nth(2).unwrap().starts_with("total"));
    }
}
