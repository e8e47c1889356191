//! A small stderr logger for the apps: the libraries log through the
//! `log` facade (connection rejects, work-request failures, queue
//! teardown reasons); without a logger those lines go nowhere.
//!
//! The level comes from `POLLUX_LOG` (or `RUST_LOG` when that is unset):
//! `off`, `error`, `warn` (default), `info`, `debug` or `trace`. Lines are
//! written with one `write` each, prefixed with the program name, the
//! level and the module, so they interleave cleanly between threads.
//! Logging is for the control path and for errors: the data path does not
//! log per I/O.

use std::io::Write;

use log::{LevelFilter, Log, Metadata, Record};

struct StderrLogger {
    prog: &'static str,
    level: LevelFilter,
}

impl Log for StderrLogger {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        m.level() <= self.level
    }

    fn log(&self, r: &Record<'_>) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let line = format!(
            "{}: {} {}: {}\n",
            self.prog,
            r.level(),
            r.module_path().unwrap_or("?"),
            r.args()
        );
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn flush(&self) {
        let _ = std::io::stderr().flush();
    }
}

/// The level a `POLLUX_LOG`/`RUST_LOG` value names; `None` for anything
/// else (the caller keeps the default and says so).
pub fn parse_level(v: &str) -> Option<LevelFilter> {
    match v.trim().to_ascii_lowercase().as_str() {
        "off" => Some(LevelFilter::Off),
        "error" => Some(LevelFilter::Error),
        "warn" | "warning" => Some(LevelFilter::Warn),
        "info" => Some(LevelFilter::Info),
        "debug" => Some(LevelFilter::Debug),
        "trace" => Some(LevelFilter::Trace),
        _ => None,
    }
}

/// Install the stderr logger for program `prog` (call once, first thing
/// in `main`; a second call is ignored).
pub fn init(prog: &'static str) {
    let var = std::env::var("POLLUX_LOG").or_else(|_| std::env::var("RUST_LOG"));
    let level = match var {
        Ok(v) => parse_level(&v).unwrap_or_else(|| {
            eprintln!("{prog}: log level `{v}` not understood (off|error|warn|info|debug|trace); using warn");
            LevelFilter::Warn
        }),
        Err(_) => LevelFilter::Warn,
    };
    // Leaked once: the logger lives as long as the process.
    let logger: &'static StderrLogger = Box::leak(Box::new(StderrLogger { prog, level }));
    if log::set_logger(logger).is_ok() {
        log::set_max_level(level);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_and_junk_does_not() {
        assert_eq!(parse_level("DEBUG"), Some(LevelFilter::Debug));
        assert_eq!(parse_level(" warn "), Some(LevelFilter::Warn));
        assert_eq!(parse_level("off"), Some(LevelFilter::Off));
        assert_eq!(parse_level("pollux=debug"), None);
        assert_eq!(parse_level(""), None);
    }
}
