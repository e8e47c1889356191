//! Shared code of the Pollux applications (`pollux-bdevperf`, `pollux-tgt`
//! and `pollux-perf`): command-line and configuration parsing,
//! the workload generator, latency histograms, the results report (human
//! table or JSON), and the bdevperf engine.

pub mod bdevperf;
pub mod cli;
pub mod config;
mod error;
pub mod latency;
pub mod logging;
pub mod perf;
pub mod report;
pub mod tgt;
pub mod workload;

pub use error::AppError;
