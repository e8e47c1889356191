//! The JSON-RPC server: a Unix socket served by one control thread.
//!
//! `RpcServer::start` binds the socket (mode 0600, as SPDK's `-r`; a
//! stale socket file left by a dead process is replaced, a live one is
//! refused with [`ServerError::InUse`]) and starts the thread `pollux-rpc`,
//! which polls the listening socket and every connection and answers
//! requests one at a time, in arrival order per connection, through
//! [`RpcService::handle`]. Nothing runs on a reactor: a method that
//! touches a core sends it a message and waits for its answer.
//!
//! Limits, each leaving the server and the target unharmed:
//! - a request larger than [`ServerConfig::max_request`] bytes is answered
//!   with -32700 and its connection closed, as is one that is not JSON;
//! - a connection that sends nothing, or stops in the middle of a request,
//!   for [`ServerConfig::idle_timeout`] is closed;
//! - a client that disconnects mid-request loses only that request; one
//!   that does not read its answers is not read from until it does;
//! - at most [`ServerConfig::max_connections`] clients at once (SPDK's 64);
//!   more are accepted and closed at once.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pollux_reactor::AcceptPacer;
use rustix::event::{poll, PollFd, PollFlags, Timespec};

use crate::framing::{FrameBuffer, DEFAULT_MAX_REQUEST};
use crate::protocol::response;
use crate::service::RpcService;

/// Where `pollux-tgt` listens without `-r` (SPDK's is `/var/tmp/spdk.sock`).
pub const DEFAULT_SOCKET: &str = "/var/tmp/pollux.sock";
/// How long a silent connection is kept by default.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// The most clients at once by default (SPDK's).
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;
/// How often the thread looks at its stop flag and timeouts.
const TICK: Duration = Duration::from_millis(50);
/// Answers waiting to be sent past which a connection is not read from.
const MAX_PENDING_OUT: usize = 4 << 20;

/// How to serve.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The socket's path.
    pub path: PathBuf,
    /// The largest request, in bytes.
    pub max_request: usize,
    /// How long a connection may stay silent (no request, or half of one).
    pub idle_timeout: Duration,
    /// The most clients at once.
    pub max_connections: usize,
}

impl ServerConfig {
    /// The defaults, at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            max_request: DEFAULT_MAX_REQUEST,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// Why the server did not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Another live process serves this path.
    #[error("RPC socket {0} is in use by another process (choose another path with -r)")]
    InUse(PathBuf),
    /// Something other than a socket is at this path.
    #[error("{0} exists and is not a socket; not replacing it")]
    NotASocket(PathBuf),
    /// A system call failed.
    #[error("RPC socket {path}: {what}: {source}")]
    Io {
        /// What was done.
        what: &'static str,
        /// The socket path.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// A running server; stopped (thread joined, socket file removed) by
/// [`RpcServer::stop`] or on drop.
#[derive(Debug)]
pub struct RpcServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    accept_failures: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl RpcServer {
    /// Binds `cfg.path` and starts serving `svc` on a new thread.
    ///
    /// # Errors
    ///
    /// [`ServerError`]: the path is in use or is not a socket, or a
    /// system call failed (directory missing, permissions).
    pub fn start(cfg: ServerConfig, svc: Arc<RpcService>) -> Result<RpcServer, ServerError> {
        let listener = bind(&cfg.path)?;
        let sock = cfg.path.clone();
        let io = |what| {
            let path = sock.clone();
            move |source| ServerError::Io { what, path, source }
        };
        listener
            .set_nonblocking(true)
            .map_err(io("set non-blocking"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let accept_failures = Arc::new(AtomicU64::new(0));
        let failures = Arc::clone(&accept_failures);
        let path = cfg.path.clone();
        let thread = std::thread::Builder::new()
            .name("pollux-rpc".into())
            .spawn(move || serve(&listener, &cfg, &svc, &flag, &failures))
            .map_err(io("spawn the server thread"))?;
        log::info!("rpc: listening on {}", path.display());
        Ok(RpcServer {
            path,
            stop,
            accept_failures,
            thread: Some(thread),
        })
    }

    /// `accept` calls that failed (out of descriptors, say: accepting then
    /// pauses for [`AcceptPacer::PAUSE`] and the clients wait in the
    /// backlog).
    pub fn accept_failures(&self) -> u64 {
        self.accept_failures.load(Ordering::Relaxed)
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops serving: open connections are closed, the socket file removed.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                log::error!("rpc: the server thread panicked");
            }
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Binds the socket, replacing a stale one, and makes it owner-only.
fn bind(path: &Path) -> Result<UnixListener, ServerError> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(ServerError::NotASocket(path.to_owned()));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(ServerError::InUse(path.to_owned()));
        }
        // Nobody answers: the file of a process that is gone.
        std::fs::remove_file(path).map_err(|source| ServerError::Io {
            what: "remove the stale socket",
            path: path.to_owned(),
            source,
        })?;
    }
    let listener = UnixListener::bind(path).map_err(|source| ServerError::Io {
        what: "bind",
        path: path.to_owned(),
        source,
    })?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|source| {
        ServerError::Io {
            what: "chmod 0600",
            path: path.to_owned(),
            source,
        }
    })?;
    Ok(listener)
}

/// One client.
struct Conn {
    stream: UnixStream,
    frames: FrameBuffer,
    /// Answers not yet written.
    out: Vec<u8>,
    last_activity: Instant,
    /// The peer closed its side: answer what came, then close.
    eof: bool,
    /// A fatal error was answered: close once the answer is out.
    closing: bool,
}

impl Conn {
    fn wants_read(&self) -> bool {
        !self.eof && !self.closing && self.frames.wants_more() && self.out.len() < MAX_PENDING_OUT
    }

    /// Reads what is there; false when the connection failed.
    fn read(&mut self, buf: &mut [u8]) -> bool {
        loop {
            match self.stream.read(buf) {
                Ok(0) => {
                    self.eof = true;
                    return true;
                }
                Ok(n) => {
                    self.frames.push(buf.get(..n).unwrap_or_default());
                    self.last_activity = Instant::now();
                    if !self.frames.wants_more() {
                        return true;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    log::debug!("rpc: read: {e}");
                    return false;
                }
            }
        }
    }

    /// Answers every complete request received.
    fn process(&mut self, svc: &RpcService) {
        while !self.closing {
            match self.frames.next_value() {
                None => break,
                Some(Ok(v)) => {
                    let duplicate = self.frames.take_duplicate();
                    if let Some(text) = svc.handle_checked(v, duplicate.as_ref()) {
                        self.out.extend_from_slice(text.as_bytes());
                        self.out.push(b'\n');
                    }
                }
                Some(Err(e)) => {
                    log::debug!("rpc: closing a connection: {e}");
                    if let Some(text) = response(None, Err(e)) {
                        self.out.extend_from_slice(text.as_bytes());
                        self.out.push(b'\n');
                    }
                    self.closing = true;
                }
            }
        }
    }

    /// Writes what it can; false when the connection failed.
    fn write(&mut self) -> bool {
        while !self.out.is_empty() {
            match self.stream.write(&self.out) {
                Ok(0) => return false,
                Ok(n) => {
                    self.out.drain(..n);
                    self.last_activity = Instant::now();
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    log::debug!("rpc: write: {e}");
                    return false;
                }
            }
        }
        true
    }

    fn done(&self) -> bool {
        (self.closing || self.eof) && self.out.is_empty()
    }
}

fn serve(
    listener: &UnixListener,
    cfg: &ServerConfig,
    svc: &RpcService,
    stop: &AtomicBool,
    failures: &AtomicU64,
) {
    let mut conns: Vec<Conn> = Vec::new();
    let mut pacer = AcceptPacer::new();
    let mut buf = vec![0u8; 64 << 10];
    let tick = Timespec {
        tv_sec: 0,
        tv_nsec: i64::from(TICK.subsec_nanos()),
    };
    while !stop.load(Ordering::SeqCst) {
        let ready: Vec<(bool, bool)> = {
            let mut fds = Vec::with_capacity(conns.len() + 1);
            // Not while accepting pauses (out of descriptors): the
            // listener would stay readable, and the loop spin.
            let listen = if pacer.ready(Instant::now()) {
                PollFlags::IN
            } else {
                PollFlags::empty()
            };
            fds.push(PollFd::new(listener, listen));
            for c in &conns {
                let mut f = PollFlags::empty();
                if c.wants_read() {
                    f |= PollFlags::IN;
                }
                if !c.out.is_empty() {
                    f |= PollFlags::OUT;
                }
                fds.push(PollFd::new(&c.stream, f));
            }
            if let Err(e) = poll(&mut fds, Some(&tick)) {
                if e != rustix::io::Errno::INTR {
                    log::error!("rpc: poll: {e}");
                    std::thread::sleep(TICK);
                }
                continue;
            }
            fds.iter()
                .map(|f| {
                    let r = f.revents();
                    (
                        r.intersects(PollFlags::IN | PollFlags::HUP | PollFlags::ERR),
                        r.contains(PollFlags::OUT),
                    )
                })
                .collect()
        };
        let listener_ready = ready.first().is_some_and(|r| r.0);
        let now = Instant::now();
        let mut keep = Vec::with_capacity(conns.len());
        for (mut c, (readable, writable)) in conns.drain(..).zip(ready.into_iter().skip(1)) {
            let mut alive = true;
            if readable && c.wants_read() {
                alive = c.read(&mut buf);
                c.process(svc);
            }
            if alive && (writable || !c.out.is_empty()) {
                alive = c.write();
            }
            if alive && now.duration_since(c.last_activity) > cfg.idle_timeout {
                log::info!(
                    "rpc: closing a connection silent for {:?}{}",
                    cfg.idle_timeout,
                    if c.frames.is_idle() {
                        ""
                    } else {
                        " in the middle of a request"
                    }
                );
                alive = false;
            }
            if alive && c.done() {
                if c.eof && !c.frames.is_idle() {
                    log::debug!(
                        "rpc: a client left in the middle of a request ({} bytes)",
                        c.frames.held()
                    );
                }
                alive = false;
            }
            if alive {
                keep.push(c);
            }
        }
        // Accept after the others are served: a client that left frees its
        // place for one that came after it.
        if listener_ready && pacer.ready(now) {
            accept(listener, cfg, &mut keep, &mut pacer, failures);
        }
        conns = keep;
    }
}

fn accept(
    listener: &UnixListener,
    cfg: &ServerConfig,
    conns: &mut Vec<Conn>,
    pacer: &mut AcceptPacer,
    failures: &AtomicU64,
) {
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                if conns.len() >= cfg.max_connections {
                    log::warn!(
                        "rpc: {} clients connected already; refusing another",
                        cfg.max_connections
                    );
                    // The others wait in the backlog until the open
                    // connections were polled again (some may have left).
                    return;
                }
                if let Err(e) = stream.set_nonblocking(true) {
                    log::warn!("rpc: accept: {e}");
                    continue;
                }
                conns.push(Conn {
                    stream,
                    frames: FrameBuffer::new(cfg.max_request),
                    out: Vec::new(),
                    last_activity: Instant::now(),
                    eof: false,
                    closing: false,
                });
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                failures.fetch_add(1, Ordering::Relaxed);
                if let Some(n) = pacer.failed(&e, Instant::now()) {
                    log::warn!("rpc: accept: {e} ({n} failures since the last report)");
                }
                return;
            }
        }
    }
}
