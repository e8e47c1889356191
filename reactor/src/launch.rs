//! Launching reactors: one pinned OS thread per core (SPDK's event
//! framework), optionally with the caller's thread as one of them (SPDK's
//! main core). Control path throughout.

use std::any::Any;
use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::clock::Clock;
use crate::cores::{CoreId, Cores, CoresError};
use crate::current::CurrentGuard;
use crate::error::{ReactorError, SendError};
use crate::msg::{Inbox, Mailboxes, Messenger};
use crate::stats::ReactorStats;
use crate::wake::{IdleMode, WakeSignal};
use crate::Reactor;

/// The default inbox depth (messages queued per reactor).
pub const DEFAULT_INBOX_DEPTH: usize = 4096;

/// How long [`ReactorSet::stats`] waits for each core.
pub const STATS_TIMEOUT: Duration = Duration::from_secs(5);

/// What to launch.
#[derive(Debug, Clone)]
pub struct LaunchConfig {
    /// One reactor per core.
    pub cores: Cores,
    /// The idle policy of every reactor.
    pub idle: IdleMode,
    /// Messages each inbox holds before sends fail with
    /// [`SendError::Full`].
    pub inbox_depth: usize,
    /// A core whose reactor does not get a thread: the caller runs it with
    /// [`ReactorSet::run_on_current`].
    pub main_core: Option<CoreId>,
    /// Pin each thread to its core (a failure is a warning, not an error).
    pub pin: bool,
}

impl Default for LaunchConfig {
    /// Core 0, busy-poll, [`DEFAULT_INBOX_DEPTH`], no main core, pinned.
    fn default() -> Self {
        Self {
            cores: Cores::default(),
            idle: IdleMode::BusyPoll,
            inbox_depth: DEFAULT_INBOX_DEPTH,
            main_core: None,
            pin: true,
        }
    }
}

impl LaunchConfig {
    /// The default configuration on `cores`.
    pub fn new(cores: Cores) -> Self {
        Self {
            cores,
            ..Self::default()
        }
    }
}

/// Launching, running or joining reactors failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LaunchError {
    /// The core set is invalid for this machine.
    #[error("invalid core set")]
    Cores(#[from] CoresError),
    /// `main_core` is not one of `cores`.
    #[error("main core {0} is not in the core set")]
    MainCoreNotInSet(CoreId),
    /// A reactor could not be set up.
    #[error("reactor on core {core} failed to start")]
    Reactor {
        /// Its core.
        core: CoreId,
        /// Why.
        #[source]
        source: ReactorError,
    },
    /// A thread could not be spawned.
    #[error("cannot spawn the thread of core {core}")]
    Spawn {
        /// Its core.
        core: CoreId,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A reactor thread panicked (in `init`, a poller or a message).
    #[error("reactor on core {core} panicked: {message}")]
    Panicked {
        /// Its core.
        core: CoreId,
        /// The panic message, when it was a string.
        message: String,
    },
    /// A reactor thread ended without returning or unwinding: the kernel
    /// killed it (an oops in one of its system calls leaves the rest of the
    /// process running).
    #[error("reactor on core {core} was terminated by the system (see the kernel log)")]
    Vanished {
        /// Its core.
        core: CoreId,
    },
    /// [`ReactorSet::run_on_current`] without a main core left to run.
    #[error("no main core to run on this thread (none configured, or already run)")]
    NoMainCore,
    /// A blocking control call was made from a reactor thread, where it
    /// would deadlock.
    #[error("blocking call made on a reactor thread")]
    OnReactorThread,
    /// A message could not be sent.
    #[error("cannot reach a reactor")]
    Send(#[from] SendError),
    /// A reactor did not answer in time.
    #[error("reactor on core {0} did not answer")]
    Timeout(CoreId),
}

type Init = Arc<dyn Fn(&Reactor) + Send + Sync + 'static>;

/// What the caller's thread needs to become the main reactor.
struct MainSeed {
    core: CoreId,
    inbox: Inbox,
}

/// Launched reactors. Dropping the set stops and joins them.
pub struct ReactorSet {
    messenger: Messenger,
    threads: Vec<(CoreId, JoinHandle<Result<(), LaunchError>>)>,
    main: Option<MainSeed>,
    main_core: Option<CoreId>,
    idle: IdleMode,
    pin: bool,
    init: Init,
}

impl std::fmt::Debug for ReactorSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReactorSet")
            .field("cores", &self.messenger.cores())
            .field("main_core", &self.main_core)
            .finish()
    }
}

/// Starts one reactor per core of `cfg.cores`, each on its own pinned
/// thread (except `cfg.main_core`), and runs `init` on each reactor, on its
/// own thread, before its first loop.
///
/// ```
/// use pollux_reactor::{launch, Cores, LaunchConfig};
/// let set = launch(LaunchConfig::new(Cores::parse("0").unwrap()), |r| {
///     r.stop_all();
/// })
/// .unwrap();
/// set.join().unwrap();
/// ```
///
/// # Errors
///
/// [`LaunchError::Cores`] for a core this machine lacks,
/// [`LaunchError::MainCoreNotInSet`], [`LaunchError::Reactor`] when an
/// eventfd cannot be created, [`LaunchError::Spawn`]; reactors already
/// started are stopped and joined first.
pub fn launch(
    cfg: LaunchConfig,
    init: impl Fn(&Reactor) + Send + Sync + 'static,
) -> Result<ReactorSet, LaunchError> {
    cfg.cores.check_exist()?;
    if let Some(m) = cfg.main_core {
        if !cfg.cores.contains(m) {
            return Err(LaunchError::MainCoreNotInSet(m));
        }
    }
    let mut signals = Vec::with_capacity(cfg.cores.len());
    for core in cfg.cores.iter() {
        let s =
            WakeSignal::new(cfg.idle).map_err(|source| LaunchError::Reactor { core, source })?;
        signals.push((core, Arc::new(s)));
    }
    let (boxes, inboxes) = Mailboxes::build(signals, cfg.inbox_depth);
    let mut set = ReactorSet {
        messenger: Messenger::new(boxes),
        threads: Vec::new(),
        main: None,
        main_core: cfg.main_core,
        idle: cfg.idle,
        pin: cfg.pin,
        init: Arc::new(init),
    };
    for (core, inbox) in inboxes {
        if Some(core) == cfg.main_core {
            set.main = Some(MainSeed { core, inbox });
            continue;
        }
        let (messenger, init, idle, pin) =
            (set.messenger.clone(), set.init.clone(), cfg.idle, cfg.pin);
        let spawned = std::thread::Builder::new()
            .name(format!("pollux-r{core}"))
            .spawn(move || run_reactor(core, inbox, messenger, idle, pin, &init));
        match spawned {
            Ok(h) => set.threads.push((core, h)),
            Err(source) => {
                // `set` is dropped: the started reactors are stopped and joined.
                return Err(LaunchError::Spawn { core, source });
            }
        }
    }
    Ok(set)
}

/// The body of a reactor thread (or of the main core's caller thread).
fn run_reactor(
    core: CoreId,
    inbox: Inbox,
    messenger: Messenger,
    idle: IdleMode,
    pin: bool,
    init: &Init,
) -> Result<(), LaunchError> {
    if pin {
        if let Err(e) = affinity::set_thread_affinity([core as usize]) {
            log::warn!("reactor {core}: cannot pin the thread to its core: {e}");
        }
    }
    let r = match Reactor::new(core, inbox, messenger.clone(), idle, Clock::Real) {
        Ok(r) => r,
        Err(source) => {
            messenger.mark_stopped(core);
            return Err(LaunchError::Reactor { core, source });
        }
    };
    {
        let _current = CurrentGuard::enter(&r);
        init(&r);
    }
    r.run();
    Ok(())
}

fn panic_message(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

impl ReactorSet {
    /// A `Send` handle that reaches every reactor.
    pub fn messenger(&self) -> &Messenger {
        &self.messenger
    }

    /// The cores, ascending.
    pub fn cores(&self) -> &[CoreId] {
        self.messenger.cores()
    }

    /// The core configured to run on the caller's thread.
    pub fn main_core(&self) -> Option<CoreId> {
        self.main_core
    }

    /// Runs the main core's reactor on this thread (pinned, `init` first)
    /// until it stops, then tears it down here. Blocks.
    ///
    /// # Errors
    ///
    /// [`LaunchError::NoMainCore`] when no main core was configured or it
    /// already ran; [`LaunchError::Reactor`] if it cannot be set up.
    pub fn run_on_current(&mut self) -> Result<(), LaunchError> {
        let seed = self.main.take().ok_or(LaunchError::NoMainCore)?;
        run_reactor(
            seed.core,
            seed.inbox,
            self.messenger.clone(),
            self.idle,
            self.pin,
            &self.init,
        )
    }

    /// Asks every reactor to stop (each one tears down its own pollers and
    /// channels on its own thread, after the messages queued before the
    /// request). Waits for inbox room if needed. Returns at once; use
    /// [`join`](Self::join) to wait.
    pub fn stop_all(&self) {
        for &core in self.messenger.cores() {
            if let Err(e) = self.messenger.send_blocking(core, |r| r.stop()) {
                log::debug!("stop_all: core {core}: {e}");
            }
        }
        if let Some(seed) = &self.main {
            // Never run: nothing to tear down, but refuse new messages.
            self.messenger.mark_stopped(seed.core);
        }
    }

    /// Waits for every reactor thread to exit (after [`stop_all`](Self::stop_all)
    /// or [`Reactor::stop_all`]). A main core that was never run is dropped.
    ///
    /// # Errors
    ///
    /// The first failure: [`LaunchError::Panicked`] for a thread that
    /// panicked, or the error a reactor thread returned. Every thread is
    /// joined either way.
    pub fn join(mut self) -> Result<(), LaunchError> {
        self.join_all()
    }

    fn join_all(&mut self) -> Result<(), LaunchError> {
        self.main = None;
        let mut first = Ok(());
        for (core, h) in std::mem::take(&mut self.threads) {
            // `JoinHandle::join` itself panics when the thread ended without
            // handing back its result (killed by a kernel oops): report that
            // as an error of that core, not a panic of the caller.
            let joined = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| h.join()));
            let res = match joined {
                Ok(Ok(r)) => r,
                Ok(Err(p)) => Err(LaunchError::Panicked {
                    core,
                    message: panic_message(p.as_ref()),
                }),
                Err(_) => Err(LaunchError::Vanished { core }),
            };
            if let (Err(e), true) = (res, first.is_ok()) {
                first = Err(e);
            }
        }
        first
    }

    /// Every reactor's statistics, in core order (control path: one message
    /// per core, waiting up to [`STATS_TIMEOUT`] for each answer).
    ///
    /// # Errors
    ///
    /// [`LaunchError::OnReactorThread`] when called on a reactor thread,
    /// [`LaunchError::Send`] for a stopped reactor, [`LaunchError::Timeout`]
    /// when one does not answer (e.g. a main core not yet running).
    pub fn stats(&self) -> Result<Vec<ReactorStats>, LaunchError> {
        if Reactor::current().is_some() {
            return Err(LaunchError::OnReactorThread);
        }
        let mut out = Vec::with_capacity(self.cores().len());
        for &core in self.cores() {
            let (tx, rx) = crossbeam_channel::bounded(1);
            self.messenger.send_blocking(core, move |r| {
                let _ = tx.send(r.stats());
            })?;
            let s = rx
                .recv_timeout(STATS_TIMEOUT)
                .map_err(|_| LaunchError::Timeout(core))?;
            out.push(s);
        }
        Ok(out)
    }
}

impl Drop for ReactorSet {
    /// Stops and joins whatever still runs, so no thread outlives the set.
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.stop_all();
            if let Err(e) = self.join_all() {
                log::warn!("reactor set dropped: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests;
