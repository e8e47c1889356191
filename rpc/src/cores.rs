//! Reaching the reactors from the control thread.
//!
//! Methods run on the RPC server's control thread, never on a reactor.
//! What lives on a core (a bdev's per-core channel and its counters, the
//! reactor's own statistics) is read or changed by a message to that core;
//! [`CoreBus::on_each_core`] sends one to every core and returns when all
//! have answered, so a reply built from it reflects every core.

use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use pollux_reactor::{CoreId, Messenger, Reactor};

use crate::error::RpcError;

/// How long a core may take to answer before the method fails.
pub const DEFAULT_CORE_TIMEOUT: Duration = Duration::from_secs(5);

/// The reactors a service reaches (none in tests without reactors).
#[derive(Clone)]
pub struct CoreBus {
    messenger: Option<Messenger>,
    timeout: Duration,
}

impl std::fmt::Debug for CoreBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoreBus")
            .field("cores", &self.cores())
            .finish()
    }
}

impl CoreBus {
    /// The cores `messenger` reaches.
    pub fn new(messenger: Messenger) -> Self {
        Self {
            messenger: Some(messenger),
            timeout: DEFAULT_CORE_TIMEOUT,
        }
    }

    /// No reactors (a service used before, or without, reactors).
    pub fn none() -> Self {
        Self {
            messenger: None,
            timeout: DEFAULT_CORE_TIMEOUT,
        }
    }

    /// The cores, ascending.
    pub fn cores(&self) -> Vec<CoreId> {
        self.messenger
            .as_ref()
            .map(|m| m.cores().to_vec())
            .unwrap_or_default()
    }

    /// Runs `f` on every core and returns its answers in core order, once
    /// all have answered.
    ///
    /// # Errors
    ///
    /// -32603 when a core has stopped or does not answer within the timeout.
    pub fn on_each_core<T: Send + 'static>(
        &self,
        f: impl Fn(&Reactor) -> T + Send + Sync + 'static,
    ) -> Result<Vec<(CoreId, T)>, RpcError> {
        let Some(m) = &self.messenger else {
            return Ok(Vec::new());
        };
        let f = Arc::new(f);
        let (tx, rx) = mpsc::channel();
        let cores = m.cores().to_vec();
        for &core in &cores {
            let (f, tx) = (Arc::clone(&f), tx.clone());
            m.send_blocking(core, move |r| {
                let _ = tx.send((r.core(), f(r)));
            })
            .map_err(|e| RpcError::internal(format!("core {core}: {e}")))?;
        }
        drop(tx);
        let deadline = Instant::now() + self.timeout;
        let mut out = Vec::with_capacity(cores.len());
        while out.len() < cores.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            let got = rx.recv_timeout(left).map_err(|_| {
                RpcError::internal(format!(
                    "{} of {} core(s) did not answer within {:?}",
                    cores.len() - out.len(),
                    cores.len(),
                    self.timeout
                ))
            })?;
            out.push(got);
        }
        out.sort_by_key(|(c, _)| *c);
        Ok(out)
    }
}
