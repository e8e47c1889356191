//! The NVMe-oF RDMA host transport, generic over a verbs
//! [`Provider`] (`soft` by default, `ibverbs` with
//! that feature of `pollux-verbs`).
//!
//! - [`RdmaHost`]: one per reactor: the device, one PD, the memory
//!   registrations of data arenas ([`MrCache`]) and the options.
//! - [`RdmaQueue`]: one NVMe queue: an RC QP with its own CQ, one command
//!   buffer (64 B) and one response buffer (16 B) per entry, and in
//!   `register-always` mode one fast-registration MR per entry.
//!
//! Memory modes ([`MemMode`]):
//! - `Pool`: data buffers live in arenas registered once with remote
//!   access; the keyed SGL carries that MR's rkey (SPDK's host model: no
//!   per-I/O registration, but the target may reach all registered memory).
//! - `RegisterAlways` (default; the kernel's model): every I/O's buffers are
//!   fast-registered (a `RegMr` WR chained before the command SEND) under a
//!   fresh key, invalidated after the response: remotely (SGL subtype
//!   "invalidate", the target answers with SEND_WITH_INVALIDATE and the host
//!   checks the invalidated key) or locally (a signaled `LocalInv` WR, the
//!   request completes when it does).
//!
//! Writes up to the in-capsule limit travel in the capsule (extra SGEs of
//! the command SEND; no registration). WRs are staged per queue and posted
//! once per flush; a request completes when both its send completion and
//! its response arrived (and its key is invalidated).

mod mr_cache;
mod queue;
mod wrid;

#[cfg(test)]
mod tests;

use std::rc::Rc;
use std::time::Duration;

use pollux_verbs::{CmAddr, Device, Provider};

pub use mr_cache::MrCache;
pub use queue::{RdmaQueue, RdmaQueueStats};

use super::transport::{HostTransport, QueueParams};
use super::HostError;
use crate::OptionValueError;

/// How I/O buffers are made reachable by the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemMode {
    /// Pre-registered memory, no per-I/O registration.
    Pool,
    /// Fast registration per I/O, key invalidated afterwards (default).
    RegisterAlways,
}

impl MemMode {
    /// Parse `pool` or `register-always`.
    ///
    /// # Errors
    /// [`OptionValueError::MemMode`] for anything else.
    pub fn parse(s: &str) -> Result<Self, OptionValueError> {
        match s {
            "pool" => Ok(MemMode::Pool),
            "register-always" | "always" | "frwr" => Ok(MemMode::RegisterAlways),
            _ => Err(OptionValueError::MemMode(s.to_owned())),
        }
    }
}

impl std::fmt::Display for MemMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MemMode::Pool => "pool",
            MemMode::RegisterAlways => "register-always",
        })
    }
}

/// Options of the RDMA host transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaHostOptions {
    /// Memory registration mode.
    pub mem_mode: MemMode,
    /// Ask the target to invalidate keys (`register-always` only).
    pub remote_invalidate: bool,
    /// How long a connection may take to be established.
    pub connect_timeout: Duration,
}

impl Default for RdmaHostOptions {
    fn default() -> Self {
        RdmaHostOptions {
            mem_mode: MemMode::RegisterAlways,
            remote_invalidate: true,
            connect_timeout: Duration::from_secs(5),
        }
    }
}

/// The RDMA host transport on one reactor (`!Send`).
pub struct RdmaHost<P: Provider> {
    dev: P::Device,
    pd: Rc<P::Pd>,
    mrs: Rc<MrCache<P>>,
    addr: CmAddr,
    opts: RdmaHostOptions,
}

impl<P: Provider> std::fmt::Debug for RdmaHost<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaHost")
            .field("provider", &P::NAME)
            .field("addr", &self.addr)
            .field("opts", &self.opts)
            .finish()
    }
}

impl<P: Provider> RdmaHost<P> {
    /// Open device `device` (the provider's first device when `None`) and
    /// a PD, for queues to `addr` (control path).
    ///
    /// # Errors
    /// [`HostError::Transport`] when the device cannot be opened, or lacks
    /// fast registration in `register-always` mode.
    pub fn open(
        device: Option<&str>,
        addr: CmAddr,
        opts: RdmaHostOptions,
    ) -> Result<Self, HostError> {
        let name = match device {
            Some(d) => d.to_string(),
            None => P::list_devices()
                .map_err(|e| HostError::Transport(e.to_string()))?
                .into_iter()
                .next()
                .map(|d| d.name)
                .ok_or_else(|| HostError::Transport(format!("no {} RDMA device", P::NAME)))?,
        };
        let dev =
            P::open_device(&name).map_err(|e| HostError::Transport(format!("open {name}: {e}")))?;
        if opts.mem_mode == MemMode::RegisterAlways && !dev.caps().mem_mgt_extensions {
            return Err(HostError::Transport(format!(
                "device {name} has no fast registration: use the pool memory mode"
            )));
        }
        let pd = Rc::new(
            dev.alloc_pd()
                .map_err(|e| HostError::Transport(e.to_string()))?,
        );
        let access = match opts.mem_mode {
            MemMode::Pool => {
                pollux_verbs::Access::LOCAL_WRITE
                    | pollux_verbs::Access::REMOTE_READ
                    | pollux_verbs::Access::REMOTE_WRITE
            }
            MemMode::RegisterAlways => pollux_verbs::Access::LOCAL_WRITE,
        };
        let mrs = Rc::new(MrCache::new(Rc::clone(&pd), access));
        Ok(RdmaHost {
            dev,
            pd,
            mrs,
            addr,
            opts,
        })
    }

    /// The options.
    pub fn options(&self) -> &RdmaHostOptions {
        &self.opts
    }

    /// The data-buffer registrations (register a pool's arenas up front
    /// with [`MrCache::register`] to keep registration off the data path).
    pub fn mr_cache(&self) -> &Rc<MrCache<P>> {
        &self.mrs
    }
}

impl<P: Provider> HostTransport for RdmaHost<P> {
    type Queue = RdmaQueue<P>;

    fn name(&self) -> &'static str {
        P::NAME
    }

    fn register_memory(
        &self,
        arena: &std::sync::Arc<pollux_reactor::mem::DmaArena>,
    ) -> Result<(), HostError> {
        self.mrs.register(arena)
    }

    fn open_queue(&self, params: &QueueParams) -> Result<RdmaQueue<P>, HostError> {
        RdmaQueue::connect(
            &self.dev, &self.pd, &self.mrs, &self.addr, &self.opts, params,
        )
    }
}
