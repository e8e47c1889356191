//! [`TcpTransport`]: the shared (`Send + Sync`) half of the NVMe/TCP
//! transport: options, listening sockets, the placement seats and
//! connection counters. The per-core half is
//! [`TcpPollGroup`](super::TcpPollGroup).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use pollux_reactor::sync::{Mutex, MutexGuard};

use pollux_reactor::{IoDevice, Reactor};
use pollux_verbs::placement::{SeatLimits, Seats};

use super::super::target::Target;
use super::super::transport::{
    TargetTransport, TransportError, TransportPollGroup, TransportStats,
};
use super::options::TcpOptions;
use super::poll_group::TcpPollGroup;
use crate::spec::transport_id::{TrType, TransportId};

/// A listening socket and the poll group (by index) that accepts on it.
#[derive(Debug, Clone)]
pub(super) struct ListenEntry {
    pub(super) trid: TransportId,
    pub(super) sock: Arc<TcpListener>,
    pub(super) owner: usize,
}

/// Connection counters (updated on connect and disconnect only).
#[derive(Debug, Default)]
pub(super) struct SharedStats {
    pub(super) accepted: AtomicU64,
    pub(super) destroyed: AtomicU64,
    pub(super) terminated: AtomicU64,
    pub(super) refused: AtomicU64,
    pub(super) refused_at_limit: AtomicU64,
    /// Each poll group's `accept` rounds, on a line of its own (counted on
    /// idle polls: one shared counter would bounce between idle cores).
    pub(super) accept_rounds: super::group_counter::GroupCounters,
    pub(super) accept_errors: AtomicU64,
}

/// A snapshot of [`TcpTransport::stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TcpTransportStats {
    /// Connections accepted.
    pub accepted: u64,
    /// Connections torn down and dropped.
    pub destroyed: u64,
    /// Of those, ended by a fatal PDU error (a C2HTermReq was sent, unless
    /// the error was the PLEN of the host's own H2CTermReq).
    pub terminated: u64,
    /// Connections refused (no poll group, queue creation failed, a
    /// limit reached).
    pub refused: u64,
    /// Of those, refused because no poll group had a free seat
    /// ([`TcpOptions::max_qpairs`] or [`TcpOptions::max_qpairs_per_core`]
    /// reached, or no group takes connections); answered with Connect
    /// Controller Busy when the host got that far.
    pub refused_at_limit: u64,
    /// Rounds of `accept` the poll groups tried on their listeners (one
    /// per 1024 connection reads while a group serves connections, and
    /// on the next poll after a round that took one; every poll while it
    /// serves none).
    pub accept_rounds: u64,
    /// `accept` calls that failed (out of descriptors, say: accepting then
    /// pauses for [`AcceptPacer::PAUSE`](pollux_reactor::AcceptPacer::PAUSE)
    /// and the connections wait in the backlog).
    pub accept_errors: u64,
}

/// Accepted sockets handed to this core's poll group by another core.
#[derive(Debug, Default)]
pub struct TcpInbox(RefCell<VecDeque<(TcpStream, TransportId)>>);

impl TcpInbox {
    pub(super) fn push(&self, s: TcpStream, trid: TransportId) {
        self.0.borrow_mut().push_back((s, trid));
    }

    pub(super) fn pop(&self) -> Option<(TcpStream, TransportId)> {
        self.0.borrow_mut().pop_front()
    }
}

/// The NVMe/TCP target transport.
///
/// It refers to its target weakly: the target holds its transports, so a
/// strong reference back would keep both (and the listening sockets) alive
/// after the application drops the target.
pub struct TcpTransport {
    pub(super) target: Weak<Target>,
    pub(super) opts: TcpOptions,
    pub(super) listeners: Mutex<Vec<ListenEntry>>,
    /// Bumped on every listener change; poll groups compare it once per poll.
    pub(super) listen_gen: AtomicU64,
    pub(super) groups: AtomicUsize,
    pub(super) seats: Seats,
    pub(super) stats: SharedStats,
}

impl std::fmt::Debug for TcpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpTransport")
            .field("opts", &self.opts)
            .finish()
    }
}

/// The socket address of a TCP transport id (`traddr:trsvcid`).
///
/// # Errors
/// [`TransportError::Other`] when it is not an IP address and port.
pub fn socket_addr(trid: &TransportId) -> Result<SocketAddr, TransportError> {
    let ip: std::net::IpAddr = trid.traddr.parse().map_err(|_| {
        TransportError::Other(format!("traddr '{}' is not an IP address", trid.traddr))
    })?;
    let port: u16 = trid
        .trsvcid
        .parse()
        .map_err(|_| TransportError::Other(format!("trsvcid '{}' is not a port", trid.trsvcid)))?;
    Ok(SocketAddr::new(ip, port))
}

impl TcpTransport {
    /// A transport for `target` (control path). Add it with
    /// [`Target::add_transport`], then create one poll group per reactor
    /// with [`TcpTransport::create_poll_group`].
    ///
    /// # Errors
    /// [`TransportError::Other`] naming an option that cannot work.
    pub fn new(target: &Arc<Target>, opts: TcpOptions) -> Result<Arc<Self>, TransportError> {
        opts.validate(target.options())
            .map_err(|e| TransportError::Other(e.to_string()))?;
        let seats = Seats::default();
        seats.set_limits(SeatLimits {
            per_group: opts.max_qpairs_per_core,
            total: opts.max_qpairs,
        });
        Ok(Arc::new(TcpTransport {
            target: Arc::downgrade(target),
            opts,
            listeners: Mutex::new(Vec::new()),
            listen_gen: AtomicU64::new(1),
            groups: AtomicUsize::new(0),
            seats,
            stats: SharedStats::default(),
        }))
    }

    /// The options.
    pub fn options(&self) -> &TcpOptions {
        &self.opts
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Vec<ListenEntry>> {
        self.listeners.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This core's poll group (control path). Keep the returned handle;
    /// the group stops (and closes its connections) when it is dropped.
    ///
    /// # Errors
    /// [`TransportError::NoResources`] when the group cannot be made.
    pub fn create_poll_group(
        self: &Arc<Self>,
        reactor: &Reactor,
    ) -> Result<Rc<TcpPollGroup>, TransportError> {
        let index = self.groups.fetch_add(1, Ordering::Relaxed);
        Ok(TcpPollGroup::new(self, reactor, index))
    }

    /// Connections placed on each poll group and not yet destroyed.
    pub fn queues_per_group(&self) -> Vec<usize> {
        self.seats.loads()
    }

    /// Counters.
    pub fn stats(&self) -> TcpTransportStats {
        let s = &self.stats;
        TcpTransportStats {
            accepted: s.accepted.load(Ordering::Relaxed),
            destroyed: s.destroyed.load(Ordering::Relaxed),
            terminated: s.terminated.load(Ordering::Relaxed),
            refused: s.refused.load(Ordering::Relaxed),
            refused_at_limit: s.refused_at_limit.load(Ordering::Relaxed),
            accept_rounds: s.accept_rounds.sum(),
            accept_errors: s.accept_errors.load(Ordering::Relaxed),
        }
    }
}

impl TargetTransport for TcpTransport {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn trtype(&self) -> TrType {
        TrType::Tcp
    }

    /// Binds the socket now (so a taken address fails here), non-blocking;
    /// the poll group that owns it accepts from its poller.
    fn listen(&self, trid: &TransportId) -> Result<(), TransportError> {
        let addr = socket_addr(trid)?;
        let mut l = self.lock();
        if l.iter().any(|e| &e.trid == trid) {
            return Err(TransportError::AlreadyListening(trid.clone()));
        }
        let sock = TcpListener::bind(addr)
            .map_err(|e| TransportError::Other(format!("cannot listen on {addr}: {e}")))?;
        sock.set_nonblocking(true)
            .map_err(|e| TransportError::Other(format!("{addr}: {e}")))?;
        let groups = self.groups.load(Ordering::Relaxed).max(1);
        let owner = l.len() % groups;
        l.push(ListenEntry {
            trid: trid.clone(),
            sock: Arc::new(sock),
            owner,
        });
        self.listen_gen.fetch_add(1, Ordering::Release);
        Ok(())
    }

    fn start_poll_group(
        self: Arc<Self>,
        reactor: &Reactor,
    ) -> Result<Option<Rc<dyn TransportPollGroup>>, TransportError> {
        let g: Rc<dyn TransportPollGroup> = self.create_poll_group(reactor)?;
        Ok(Some(g))
    }

    fn stats(&self) -> TransportStats {
        let s = TcpTransport::stats(self);
        TransportStats {
            accepted: s.accepted,
            rejected: s.refused,
            destroyed: s.destroyed,
        }
    }

    fn stop_listen(&self, trid: &TransportId) -> Result<(), TransportError> {
        let mut l = self.lock();
        let i = l
            .iter()
            .position(|e| &e.trid == trid)
            .ok_or_else(|| TransportError::NotListening(trid.clone()))?;
        l.remove(i);
        self.listen_gen.fetch_add(1, Ordering::Release);
        Ok(())
    }
}

/// Each core's inbox of handed-over sockets is the transport's io_device
/// channel.
impl IoDevice for TcpTransport {
    type Channel = TcpInbox;
    type Error = std::convert::Infallible;

    fn create_channel(&self, _r: &Reactor) -> Result<TcpInbox, Self::Error> {
        Ok(TcpInbox::default())
    }
}
