//! Shared code of the Pollux applications (`pollux-bdevperf`, and later
//! `pollux-tgt` and `pollux-perf`): the workload generator, latency
//! histograms and the results report (human table or JSON).

pub mod latency;
pub mod report;
pub mod workload;
