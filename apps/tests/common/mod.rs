//! Test helpers shared by the `pollux-tgt` end-to-end tests: a running
//! target whose stdout is read line by line, killed on drop.

#![allow(clippy::unwrap_used, dead_code)] // each test file uses a subset

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rustix::process::{kill_process, Pid, Signal};

pub mod iser;
pub mod tcp_host;

/// How long any wait on the target may take before the test fails.
pub const WAIT: Duration = Duration::from_secs(20);

/// A per-process path under cargo's test temp dir.
pub fn tmp(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()))
}

/// `--json FILE -r SOCK --cores 0`.
fn json_args(json: &Path, sock: &Path) -> [String; 6] {
    [
        "--json".into(),
        json.display().to_string(),
        "-r".into(),
        sock.display().to_string(),
        "--cores".into(),
        "0".into(),
    ]
}

/// `pollux-tgt --json FILE -r SOCK --cores 0` that must not start (exit
/// status 2, no "ready", no socket left): its stderr.
pub fn json_refused(json: &Path, sock: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_pollux-tgt"))
        .args(json_args(json, sock))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("ready"));
    assert!(!sock.exists());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A running `pollux-tgt`: its stdout lines arrive on `lines`; killed on drop.
pub struct Tgt {
    /// The target process.
    pub child: Child,
    lines: mpsc::Receiver<String>,
    /// Every stdout line read so far.
    pub seen: Vec<String>,
}

impl Tgt {
    /// Starts `pollux-tgt -c config EXTRA...`.
    pub fn start(config: &PathBuf, extra: &[&str]) -> Tgt {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pollux-tgt"));
        cmd.arg("-c").arg(config).args(extra);
        Tgt::spawn(cmd)
    }

    /// Starts `pollux-tgt --json FILE -r SOCK --cores 0` (no TOML file).
    pub fn start_json(json: &Path, sock: &Path) -> Tgt {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pollux-tgt"));
        cmd.args(json_args(json, sock));
        Tgt::spawn(cmd)
    }

    /// Starts `pollux-tgt -c config` under a descriptor limit
    /// (`RLIMIT_NOFILE`) of `nofile`.
    pub fn start_with_nofile(config: &PathBuf, nofile: u64) -> Tgt {
        let mut cmd = Command::new("bash");
        cmd.arg("-c")
            .arg(format!("ulimit -n {nofile} && exec \"$0\" \"$@\""))
            .arg(env!("CARGO_BIN_EXE_pollux-tgt"))
            .arg("-c")
            .arg(config);
        Tgt::spawn(cmd)
    }

    fn spawn(mut cmd: Command) -> Tgt {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start pollux-tgt");
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Tgt {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Read stdout until a line contains `what`; every line is kept.
    pub fn wait_line(&mut self, what: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if l.contains(what) {
                        return l;
                    }
                }
                Err(_) => {
                    let _ = self.child.kill();
                    let mut err = String::new();
                    if let Some(mut e) = self.child.stderr.take() {
                        let _ = std::io::Read::read_to_string(&mut e, &mut err);
                    }
                    panic!(
                        "no line with {what:?}; stdout so far:\n{}\nstderr:\n{err}",
                        self.seen.join("\n")
                    );
                }
            }
        }
    }

    /// Sends `sig` to the target.
    pub fn signal(&self, sig: Signal) {
        kill_process(Pid::from_child(&self.child), sig).unwrap();
    }

    /// Wait (bounded) for the exit status.
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "pollux-tgt did not exit; stdout:\n{}",
                self.seen.join("\n")
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Tgt {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
