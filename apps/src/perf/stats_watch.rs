//! [`StatsWatch`]: the target's busy % over the measured run, from a
//! `pollux-tgt --stats-file`.
//!
//! The target rewrites its stats file once a second. Two reads taken just
//! before and just after a run span the connection setup, the teardown and
//! up to a second of staleness at each end, all idle time for the target:
//! a saturated target read as 75 % busy after a 3 s run and 83 % after a
//! 5 s one. A watcher thread instead keeps every version of the file that
//! appears while the run goes on; the busy % is taken between the second
//! and the next-to-last of them, both written while I/O was flowing.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::spawn::busy_pct;

/// How often the watcher reads the file.
const READ_EVERY: Duration = Duration::from_millis(20);

/// `(busy_ns, idle_ns)` summed over the cores of a `pollux-tgt` stats file.
pub fn stats_file_load(path: &Path) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(path).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let sum =
        |k: &str| -> Option<u64> { v[k].as_array()?.iter().map(serde_json::Value::as_u64).sum() };
    Some((sum("busy_ns")?, sum("idle_ns")?))
}

/// The busy % between the second and the next-to-last of `samples` (the
/// file's versions in the order they appeared, the one present before the
/// run first): `None` with fewer than four versions.
pub fn busy_pct_inside(samples: &[(u64, u64)]) -> Option<f64> {
    if samples.len() < 4 {
        return None;
    }
    busy_pct(samples[1], samples[samples.len() - 2])
}

/// A thread collecting the versions of a stats file (control path).
#[derive(Debug)]
pub struct StatsWatch {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<(u64, u64)>>>,
}

impl StatsWatch {
    /// Start watching `path`.
    pub fn start(path: PathBuf) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("perf-stats-watch".into())
            .spawn(move || {
                let mut seen: Vec<(u64, u64)> = Vec::new();
                while !flag.load(Ordering::Relaxed) {
                    if let Some(s) = stats_file_load(&path) {
                        if seen.last() != Some(&s) {
                            seen.push(s);
                        }
                    }
                    std::thread::sleep(READ_EVERY);
                }
                seen
            })
            .ok();
        StatsWatch { stop, thread }
    }

    /// Stop and return the versions seen, oldest first.
    pub fn finish(mut self) -> Vec<(u64, u64)> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_is_taken_inside_the_run() {
        // Before the run (idle), setup, two seconds saturated, teardown.
        let s = [(0, 100), (10, 190), (1010, 190), (2010, 190), (2020, 280)];
        assert_eq!(busy_pct_inside(&s), Some(100.0));
        assert_eq!(busy_pct_inside(&s[..3]), None);
    }

    #[test]
    fn the_watcher_keeps_each_version_once() {
        let dir = std::env::temp_dir().join(format!("pollux-stats-watch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("stats.json");
        let write = |b: u64, i: u64| {
            let tmp = dir.join("tmp.json");
            std::fs::write(&tmp, format!("{{\"busy_ns\":[{b}],\"idle_ns\":[{i}]}}")).unwrap();
            std::fs::rename(&tmp, &p).unwrap();
        };
        write(1, 1);
        let w = StatsWatch::start(p.clone());
        for k in 2..5 {
            std::thread::sleep(READ_EVERY * 10);
            write(k, k);
        }
        std::thread::sleep(READ_EVERY * 10);
        let seen = w.finish();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(seen, vec![(1, 1), (2, 2), (3, 3), (4, 4)]);
    }
}
