//! [`IserTransport`]: the shared (`Send + Sync`) half of the iSER target
//! transport: options, listeners (each owned by one poll group) and
//! connection counters. The per-core half is
//! [`IserPollGroup`](super::IserPollGroup).

use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pollux_reactor::Reactor;
use pollux_verbs::group::ListenTable;
use pollux_verbs::placement::{Placer, SeatLimits};
use pollux_verbs::{CmAddr, Provider};
use thiserror::Error;

use super::options::IserOptions;
use super::poll_group::IserPollGroup;
use crate::target::IscsiTarget;

/// A control-path error of the iSER transport.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum IserTransportError {
    /// A verbs object or buffers could not be created.
    #[error("no resources: {0}")]
    NoResources(String),
    /// The address is listened on already.
    #[error("already listening on {0}")]
    AlreadyListening(String),
    /// The address is not listened on.
    #[error("not listening on {0}")]
    NotListening(String),
    /// No portal group with that tag.
    #[error("unknown portal group {0}")]
    UnknownPortalGroup(u16),
}

#[derive(Debug, Default)]
pub(crate) struct SharedStats {
    pub(crate) accepted: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) destroyed: AtomicU64,
}

/// A snapshot of [`IserTransport::stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IserTransportStats {
    /// Connections accepted.
    pub accepted: u64,
    /// Connect requests rejected (bad iSER CM header, no resources, or
    /// refused on their way to another poll group).
    pub rejected: u64,
    /// Connections torn down and destroyed.
    pub destroyed: u64,
}

/// The iSER target transport, generic over the verbs provider.
pub struct IserTransport<P: Provider> {
    pub(crate) target: Arc<IscsiTarget>,
    pub(crate) opts: IserOptions,
    /// Listen addresses by portal group tag, each owned by one poll group.
    pub(crate) listens: Arc<ListenTable<u16>>,
    /// The poll groups' cores and connection counts, and their inboxes of
    /// handed-over connect requests (each carries its portal group tag).
    pub(crate) placer: Arc<Placer<P, u16>>,
    pub(crate) stats: SharedStats,
    _p: PhantomData<fn() -> P>,
}

impl<P: Provider> std::fmt::Debug for IserTransport<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IserTransport")
            .field("provider", &P::NAME)
            .field("opts", &self.opts)
            .finish()
    }
}

impl<P: Provider> IserTransport<P> {
    /// A transport serving `target` (control path). Then create one poll
    /// group per reactor ([`IserTransport::create_poll_group`]) and listen
    /// ([`IserTransport::listen`] or [`IserTransport::listen_portal_groups`]).
    pub fn new(target: &Arc<IscsiTarget>, opts: IserOptions) -> Arc<Self> {
        let placer = Placer::new("iser");
        placer.seats().set_limits(SeatLimits {
            per_group: opts.max_connections_per_core,
            total: opts.max_connections,
        });
        Arc::new(IserTransport {
            target: Arc::clone(target),
            opts,
            listens: Arc::new(ListenTable::new()),
            placer,
            stats: SharedStats::default(),
            _p: PhantomData,
        })
    }

    /// The options.
    pub fn options(&self) -> &IserOptions {
        &self.opts
    }

    /// The target served.
    pub fn target(&self) -> &Arc<IscsiTarget> {
        &self.target
    }

    /// Listen on `addr` (a verbs CM address: `@name` for the soft
    /// provider, `ip:port` for ibverbs) for portal group `tag` (control
    /// path; a poll group opens the CM listener at its next poll).
    ///
    /// # Errors
    /// [`IserTransportError::AlreadyListening`],
    /// [`IserTransportError::UnknownPortalGroup`].
    pub fn listen(&self, addr: &str, tag: u16) -> Result<(), IserTransportError> {
        if !self.target.portal_groups().iter().any(|g| g.tag == tag) {
            return Err(IserTransportError::UnknownPortalGroup(tag));
        }
        if !self.listens.add(CmAddr::new(addr), tag) {
            return Err(IserTransportError::AlreadyListening(addr.into()));
        }
        Ok(())
    }

    /// Listen on every address of every portal group of the target;
    /// returns how many listeners were added.
    ///
    /// # Errors
    /// As [`IserTransport::listen`] (addresses listened on already are skipped).
    pub fn listen_portal_groups(&self) -> Result<usize, IserTransportError> {
        let mut n = 0;
        for g in self.target.portal_groups() {
            for a in &g.addrs {
                match self.listen(a, g.tag) {
                    Ok(()) => n += 1,
                    Err(IserTransportError::AlreadyListening(_)) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(n)
    }

    /// Stop listening on `addr` (live connections stay).
    ///
    /// # Errors
    /// [`IserTransportError::NotListening`].
    pub fn stop_listen(&self, addr: &str) -> Result<(), IserTransportError> {
        if !self.listens.remove(|a, _| a.0 == addr) {
            return Err(IserTransportError::NotListening(addr.into()));
        }
        Ok(())
    }

    /// This core's poll group (control path): device, PD, CQ, SRQ,
    /// receive buffers, registration of the target's task buffers, and the
    /// poller. Keep the handle; dropping it stops the group.
    ///
    /// # Errors
    /// [`IserTransportError::NoResources`].
    pub fn create_poll_group(
        self: &Arc<Self>,
        reactor: &Reactor,
    ) -> Result<Rc<IserPollGroup<P>>, IserTransportError> {
        let index = self.listens.next_group();
        IserPollGroup::new(self, reactor, index)
    }

    /// Connections placed on each poll group (by creation order) and not
    /// yet destroyed: what [`PlacementPolicy::LeastConnections`](super::PlacementPolicy)
    /// balances (control path).
    pub fn connections_per_group(&self) -> Vec<usize> {
        self.placer.seats().loads()
    }

    /// Counters.
    pub fn stats(&self) -> IserTransportStats {
        IserTransportStats {
            accepted: self.stats.accepted.load(Ordering::Relaxed),
            rejected: self.stats.rejected.load(Ordering::Relaxed) + self.placer.refused(),
            destroyed: self.stats.destroyed.load(Ordering::Relaxed),
        }
    }
}
