//! Pollux reactors: one run-to-completion event loop per core.
//!
//! (Crate docs are completed by the reactor module owners; see `docs/architecture.md`.)

pub mod io;
pub mod mem;
