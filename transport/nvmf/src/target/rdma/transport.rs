//! [`RdmaTransport`]: the shared (`Send + Sync`) half of the RDMA
//! transport: options, listeners and connection counters. The per-core
//! half is [`RdmaPollGroup`](super::RdmaPollGroup).

use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use pollux_reactor::Reactor;
use pollux_verbs::group::ListenTable;
use pollux_verbs::placement::SeatLimits;
use pollux_verbs::{CmAddr, Provider};

use super::super::target::Target;
use super::super::transport::{
    TargetTransport, TransportError, TransportPollGroup, TransportStats,
};
use super::options::RdmaOptions;
use super::placement::QueuePlacer;
use super::poll_group::RdmaPollGroup;
use crate::spec::log_page::RdmaTsas;
use crate::spec::transport_id::{TrType, TransportId};

/// The verbs CM address of a transport id: `traddr` alone when `trsvcid`
/// is empty (the soft provider's socket name, e.g. `@pollux-tgt`), else
/// `traddr:trsvcid` (ibverbs `ip:port`).
pub fn cm_addr(trid: &TransportId) -> CmAddr {
    if trid.trsvcid.is_empty() {
        CmAddr::new(trid.traddr.clone())
    } else {
        CmAddr::new(format!("{}:{}", trid.traddr, trid.trsvcid))
    }
}

/// Connection counters of the whole transport (control path: updated on
/// connect and disconnect only).
#[derive(Debug, Default)]
pub(crate) struct SharedStats {
    pub(crate) accepted: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) rejected_no_resources: AtomicU64,
    pub(crate) destroyed: AtomicU64,
    pub(crate) recv_memory: AtomicU64,
}

/// A snapshot of [`RdmaTransport::stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RdmaTransportStats {
    /// Connections accepted.
    pub accepted: u64,
    /// Connect requests rejected (any reason).
    pub rejected: u64,
    /// Of those, rejected for lack of resources (CQ room, receive buffers, QP).
    pub rejected_no_resources: u64,
    /// Connections torn down and destroyed.
    pub destroyed: u64,
    /// Bytes of receive buffers allocated by all poll groups.
    pub recv_memory_bytes: u64,
}

/// The RDMA transport, generic over the verbs provider (`Soft`, or the
/// `ibverbs` provider with that feature).
///
/// It refers to its target weakly: the target holds its transports, so a
/// strong reference back would keep both (and the listening CM ids) alive
/// after the application drops the target.
pub struct RdmaTransport<P: Provider> {
    pub(crate) target: Weak<Target>,
    pub(crate) opts: RdmaOptions,
    /// Listen addresses by transport id, each owned by one poll group
    /// (spread round robin over the groups that exist). The owner
    /// validates each connect request and places its queue
    /// ([`RdmaOptions::placement`]), handing it to another core if need be.
    pub(crate) listens: Arc<ListenTable<TransportId>>,
    /// The poll groups' cores and queue counts (where new queues go) and
    /// each group's inbox of handed-over connect requests.
    pub(crate) placer: Arc<QueuePlacer<P>>,
    pub(crate) stats: SharedStats,
    _p: PhantomData<fn() -> P>,
}

impl<P: Provider> std::fmt::Debug for RdmaTransport<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaTransport")
            .field("provider", &P::NAME)
            .field("opts", &self.opts)
            .finish()
    }
}

impl<P: Provider> RdmaTransport<P> {
    /// A transport for `target` (control path). Add it with
    /// [`Target::add_transport`], then create one poll group per reactor
    /// with [`RdmaTransport::create_poll_group`].
    ///
    /// # Errors
    ///
    /// [`TransportError::Other`] when the options cannot work together
    /// with the target's (the message names them).
    pub fn new(target: &Arc<Target>, opts: RdmaOptions) -> Result<Arc<Self>, TransportError> {
        opts.validate(target.options())
            .map_err(|e| TransportError::Other(e.to_string()))?;
        let placer = QueuePlacer::new("nvmf rdma");
        placer.seats().set_limits(SeatLimits {
            per_group: opts.max_qpairs_per_core,
            total: opts.max_qpairs,
        });
        Ok(Arc::new(RdmaTransport {
            target: Arc::downgrade(target),
            opts,
            listens: Arc::new(ListenTable::new()),
            placer,
            stats: SharedStats::default(),
            _p: PhantomData,
        }))
    }

    /// The options.
    pub fn options(&self) -> &RdmaOptions {
        &self.opts
    }

    /// This core's poll group (control path): opens the device, creates
    /// the CQ, the SRQ and the receive buffers, registers the target's
    /// data buffers, and adds the poller. Keep the returned handle; the
    /// group stops (and tears its connections down) when it is dropped.
    ///
    /// # Errors
    ///
    /// [`TransportError::NoResources`] when a verbs object or the receive
    /// buffers cannot be created.
    pub fn create_poll_group(
        self: &Arc<Self>,
        reactor: &Reactor,
    ) -> Result<Rc<RdmaPollGroup<P>>, TransportError> {
        let index = self.listens.next_group();
        RdmaPollGroup::new(self, reactor, index)
    }

    /// Queues placed on each poll group (by creation order) and not yet
    /// destroyed: what [`QueuePlacement::LeastConnections`](super::QueuePlacement)
    /// balances (control path).
    pub fn queues_per_group(&self) -> Vec<usize> {
        self.placer.seats().loads()
    }

    /// Counters.
    pub fn stats(&self) -> RdmaTransportStats {
        let s = &self.stats;
        RdmaTransportStats {
            accepted: s.accepted.load(Ordering::Relaxed),
            // Hand-offs refused on the way count as rejects.
            rejected: s.rejected.load(Ordering::Relaxed) + self.placer.refused(),
            rejected_no_resources: s.rejected_no_resources.load(Ordering::Relaxed),
            destroyed: s.destroyed.load(Ordering::Relaxed),
            recv_memory_bytes: s.recv_memory.load(Ordering::Relaxed),
        }
    }
}

impl<P: Provider> TargetTransport for RdmaTransport<P> {
    fn name(&self) -> &'static str {
        "rdma"
    }

    fn trtype(&self) -> TrType {
        TrType::Rdma
    }

    fn listen(&self, trid: &TransportId) -> Result<(), TransportError> {
        if !self.listens.add(cm_addr(trid), trid.clone()) {
            return Err(TransportError::AlreadyListening(trid.clone()));
        }
        Ok(())
    }

    fn stop_listen(&self, trid: &TransportId) -> Result<(), TransportError> {
        if !self.listens.remove(|_, t| t == trid) {
            return Err(TransportError::NotListening(trid.clone()));
        }
        Ok(())
    }

    fn rdma_tsas(&self, _trid: &TransportId) -> Option<RdmaTsas> {
        Some(RdmaTsas::rc_cm())
    }

    fn start_poll_group(
        self: Arc<Self>,
        reactor: &Reactor,
    ) -> Result<Option<Rc<dyn TransportPollGroup>>, TransportError> {
        let g: Rc<dyn TransportPollGroup> = self.create_poll_group(reactor)?;
        Ok(Some(g))
    }

    fn stats(&self) -> TransportStats {
        let s = RdmaTransport::stats(self);
        TransportStats {
            accepted: s.accepted,
            rejected: s.rejected,
            destroyed: s.destroyed,
        }
    }
}

impl<P: Provider> TransportPollGroup for RdmaPollGroup<P> {
    fn transport_name(&self) -> &'static str {
        "rdma"
    }

    fn connections(&self) -> usize {
        RdmaPollGroup::stats(self).connections
    }

    fn listeners(&self) -> usize {
        RdmaPollGroup::listeners(self)
    }

    fn shutdown(&self) {
        RdmaPollGroup::shutdown(self);
    }

    fn disconnect_listener(&self, trid: &TransportId, subnqn: Option<&str>) -> usize {
        RdmaPollGroup::disconnect_listener(self, trid, subnqn)
    }

    fn apply_listeners(&self) -> Result<(), TransportError> {
        RdmaPollGroup::apply_listeners(self)
    }
}
