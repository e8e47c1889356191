//! The provider-generic conformance suite: one set of checks, written once,
//! run against every provider through a small [`Fixture`].
//!
//! Each case is a `pub fn case_name<F: Fixture>(f: &F)` that panics on a
//! violation (test code); [`run_all`] runs them all. The `soft` provider
//! runs them from `tests/conformance_soft.rs`; the `ibverbs` provider from
//! `tests/conformance_ibverbs.rs` (in a VM with rxe). No case depends on
//! timing to pass: waits end when their condition holds and fail only
//! after a generous deadline ([`WAIT_LIMIT`]); statuses that legitimately
//! differ between providers are listed once, in [`Expected`].

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cases;
mod fast_reg;
mod handoff;
mod harness;
mod soft_fixture;

pub use cases::*;
pub use fast_reg::*;
pub use handoff::{accept_on_another_thread, dropped_detached_request_is_rejected};
pub use harness::{
    for_a_while, spin, CqOverflowReport, Endpoint, Expected, Fixture, Pair, WAIT_LIMIT,
};
pub use soft_fixture::SoftFixture;

/// Run every case against the fixture's provider.
pub fn run_all<F: Fixture>(f: &F) {
    for (name, case) in cases::all::<F>().into_iter().chain(handoff::all::<F>()) {
        eprintln!("conformance: {name}");
        case(f);
    }
}
