//! Skipping a test whose machine lacks something, without letting CI pass
//! having checked nothing; running part of a test in a child process.
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

/// This test binary, run again to execute only its `#[ignore]`d entry
/// point `entry` (exact name, one thread, output not captured): for a test
/// whose body changes what is the process's (a resource limit, a signal's
/// disposition) or must die on its own.
///
/// # Panics
/// When the running executable's path cannot be had.
pub fn child_test(entry: &str) -> std::process::Command {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut c = std::process::Command::new(exe);
    c.args([
        "--ignored",
        "--exact",
        entry,
        "--nocapture",
        "--test-threads",
        "1",
    ]);
    c
}

/// Run [`child_test`]`(entry)` to its end and require that it succeeded
/// and printed `marker` (so that an entry that was filtered out, and ran
/// nothing, fails too).
///
/// # Panics
/// When the child failed or did not print `marker` (with its output).
#[track_caller]
pub fn run_child_test(entry: &str, marker: &str) {
    let out = child_test(entry).output().expect("spawn the child test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(marker),
        "child test {entry}: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// This process's descriptor limit, lowered by [`cap_descriptors`]; put
/// back when dropped.
#[derive(Debug)]
pub struct DescriptorCap {
    old: rustix::process::Rlimit,
}

/// Lower this process's soft descriptor limit (`RLIMIT_NOFILE`) to the
/// lowest descriptor number free now, so that the next descriptor it asks
/// for (a socket `accept`, say) fails with `EMFILE`; the descriptors open
/// now stay. For a test run in a child process of its own
/// ([`child_test`]): the limit is the whole process's.
///
/// # Panics
/// When the limit cannot be read or set.
pub fn cap_descriptors() -> DescriptorCap {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let old = getrlimit(Resource::Nofile);
    let probe = std::fs::File::open("/dev/null").expect("open /dev/null");
    let lowest = std::os::fd::AsRawFd::as_raw_fd(&probe);
    drop(probe);
    let current = u64::try_from(lowest).expect("a descriptor number");
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(current),
            maximum: old.maximum,
        },
    )
    .expect("lower RLIMIT_NOFILE");
    DescriptorCap { old }
}

impl Drop for DescriptorCap {
    fn drop(&mut self) {
        if let Err(e) = rustix::process::setrlimit(rustix::process::Resource::Nofile, self.old) {
            eprintln!("could not restore RLIMIT_NOFILE: {e}");
        }
    }
}
