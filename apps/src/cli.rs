//! Command-line pieces every Pollux app shares: the core selection (`--cores`
//! or an SPDK-style mask `-m`), the reactors' idle policy and I/O sizes.

use std::time::Duration;

use clap::Args;
use pollux_reactor::{Cores, IdleMode};

use crate::AppError;

/// Which cores run reactors, and how idle reactors behave.
#[derive(Args, Debug, Clone)]
pub struct ReactorArgs {
    /// Cores to run reactors on: a list such as `0,1` or `0-3`.
    #[arg(long, value_name = "LIST", conflicts_with = "mask")]
    pub cores: Option<String>,
    /// Cores as a hexadecimal mask, as SPDK's `-m` (e.g. `0x3`).
    #[arg(short = 'm', long = "mask", value_name = "MASK")]
    pub mask: Option<String>,
    /// Idle policy: `busy` (poll forever, the default), `adaptive[:US]`
    /// (sleep after US microseconds idle, default 1000, and wake on a
    /// message, a timer or a registered file descriptor) or `hybrid[:US]`
    /// (after each piece of work, sleep through half the usual time until
    /// the next, then poll; after US microseconds idle, default 10000,
    /// sleep as `adaptive` does).
    #[arg(long, default_value = "busy", value_name = "POLICY")]
    pub idle: String,
}

impl ReactorArgs {
    /// The selected cores (core 0 when none is given).
    ///
    /// # Errors
    ///
    /// [`AppError::Usage`] for a malformed list or mask.
    pub fn cores(&self) -> Result<Cores, AppError> {
        let text = self.cores.as_deref().or(self.mask.as_deref());
        match text {
            None => Ok(Cores::first(1)),
            Some(t) => Cores::parse(t).map_err(|e| AppError::Usage(format!("cores '{t}': {e}"))),
        }
    }

    /// The idle policy.
    ///
    /// # Errors
    ///
    /// [`AppError::Usage`] for an unknown policy.
    pub fn idle_mode(&self) -> Result<IdleMode, AppError> {
        parse_idle(&self.idle)
    }
}

/// Parses `busy`, `adaptive[:US]` or `hybrid[:US]` (US: microseconds idle
/// before the reactor sleeps until an event; defaults 1000 and 10000).
///
/// # Errors
///
/// [`AppError::Usage`] for anything else.
pub fn parse_idle(s: &str) -> Result<IdleMode, AppError> {
    let bad = || {
        AppError::Usage(format!(
            "idle policy '{s}': expected busy, adaptive[:US] or hybrid[:US]"
        ))
    };
    let (name, us) = match s.split_once(':') {
        None => (s, None),
        Some((name, us)) => (name, Some(us.parse::<u64>().map_err(|_| bad())?)),
    };
    match (name, us) {
        ("busy", None) => Ok(IdleMode::BusyPoll),
        ("adaptive", us) => Ok(IdleMode::Adaptive {
            sleep_after: Duration::from_micros(us.unwrap_or(1000)),
        }),
        ("hybrid", us) => Ok(IdleMode::Hybrid {
            sleep_after: Duration::from_micros(us.unwrap_or(10_000)),
        }),
        _ => Err(bad()),
    }
}

/// Parses an I/O size such as `4096`, `4k` or `128K` into bytes.
///
/// # Errors
///
/// [`AppError::Usage`] for a malformed or zero size.
pub fn parse_io_size(s: &str) -> Result<usize, AppError> {
    let n = pollux_bdev::parse_size("io size", s).map_err(|e| AppError::Usage(e.to_string()))?;
    match usize::try_from(n) {
        Ok(0) | Err(_) => Err(AppError::Usage(format!("io size '{s}' is out of range"))),
        Ok(n) => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_policies_parse() {
        assert_eq!(parse_idle("busy").unwrap(), IdleMode::BusyPoll);
        assert_eq!(
            parse_idle("adaptive:50").unwrap(),
            IdleMode::Adaptive {
                sleep_after: Duration::from_micros(50)
            }
        );
        assert!(matches!(
            parse_idle("adaptive").unwrap(),
            IdleMode::Adaptive { .. }
        ));
        assert_eq!(
            parse_idle("hybrid").unwrap(),
            IdleMode::Hybrid {
                sleep_after: Duration::from_millis(10)
            }
        );
        assert_eq!(
            parse_idle("hybrid:2000").unwrap(),
            IdleMode::Hybrid {
                sleep_after: Duration::from_millis(2)
            }
        );
        assert!(parse_idle("lazy").is_err());
        assert!(parse_idle("busy:5").is_err());
        assert!(parse_idle("hybrid:").is_err());
        assert!(parse_idle("adaptive:x").is_err());
    }

    #[test]
    fn io_sizes_parse() {
        assert_eq!(parse_io_size("4096").unwrap(), 4096);
        assert_eq!(parse_io_size("4k").unwrap(), 4096);
        assert_eq!(parse_io_size("128K").unwrap(), 131072);
        assert!(parse_io_size("0").is_err());
        assert!(parse_io_size("four").is_err());
    }

    #[test]
    fn cores_come_from_a_list_or_a_mask() {
        let a = ReactorArgs {
            cores: None,
            mask: Some("0x1".into()),
            idle: "busy".into(),
        };
        assert_eq!(a.cores().unwrap().as_slice(), &[0]);
        let a = ReactorArgs {
            cores: Some("zero".into()),
            mask: None,
            idle: "busy".into(),
        };
        assert!(a.cores().is_err());
    }
}
