//! Skipping a test whose machine lacks something, without letting CI pass
//! having checked nothing.
//!
//! Some tests need what a developer's machine may not have: io_uring, a
//! file system that accepts `O_DIRECT`, two cores, root and the `ip` tool.
//! Such a test calls [`skip`] and returns. By default that prints a `SKIP`
//! line and the test passes; with `POLLUX_TESTS_STRICT=1` (set by
//! `.ci/run`) or `CI=true` it panics instead, so a strict run fails rather
//! than passing vacuously.

/// The variable that turns a skip into a failure when it is `1`.
const STRICT_VAR: &str = "POLLUX_TESTS_STRICT";

/// Say that the calling test cannot run here: `what` names what is missing
/// (and, ideally, why: the error seen), `how` how to provide it.
///
/// With `POLLUX_TESTS_STRICT=1` or `CI=true` in the environment this panics
/// with both (so the test fails, at the caller's location); otherwise it
/// prints `SKIP: <what> (<how>)` to stderr and returns, and the caller
/// returns without checking anything.
///
/// ```no_run
/// fn needs_two_cores() -> bool {
///     if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
///         pollux_reactor::test_env::skip("a second core", "run on a machine with 2 or more cores");
///         return false;
///     }
///     true
/// }
/// ```
#[track_caller]
pub fn skip(what: &str, how: &str) {
    let strict = std::env::var(STRICT_VAR).as_deref() == Ok("1")
        || std::env::var("CI").as_deref() == Ok("true");
    assert!(
        !strict,
        "test needs {what}, which this machine lacks: {how} \
         ({STRICT_VAR}=1 or CI=true turn skips into failures; unset both to skip)"
    );
    eprintln!("SKIP: needs {what} ({how})");
}
