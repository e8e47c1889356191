//! RDMA CM (librdmacm): listeners and connections, each on its own
//! non-blocking event channel, driven by polling.

use std::cell::{Cell, RefCell};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::BorrowedFd;
use std::ptr::{self, NonNull};
use std::rc::Rc;

use rdma_sys::*;

use super::device::{ctx_device_name, Ctx};
use super::pending::IbvPendingConn;
use super::qp::{IbvQp, QpInner};
use super::{last_err, set_nonblocking, Ibverbs};
use crate::cm::{
    CmAddr, CmEvent, ConnParam, ConnRequestInfo, DetachError, PrivateData, ACCEPT_PRIVATE_DATA_MAX,
    CONNECT_PRIVATE_DATA_MAX, REJECT_PRIVATE_DATA_MAX,
};
use crate::error::VerbsError;
use crate::provider::{CmId, CmListener};
use crate::types::QpState;

/// Address and route resolution timeout.
const RESOLVE_TIMEOUT_MS: i32 = 2000;

/// An event channel with a non-blocking fd.
struct Channel {
    // INVARIANT: from rdma_create_event_channel; destroyed in drop, after the
    // id using it (`RawId` drops its id before its channel).
    ch: NonNull<rdma_event_channel>,
}

impl Channel {
    fn new() -> Result<Channel, VerbsError> {
        // SAFETY: no arguments; returns an owned channel or NULL.
        let ch = unsafe { rdma_create_event_channel() };
        let ch = Channel {
            ch: NonNull::new(ch)
                .ok_or_else(|| VerbsError::sys("rdma_create_event_channel", last_err()))?,
        };
        // SAFETY: live channel; `fd` is its descriptor.
        set_nonblocking(unsafe { ch.ch.as_ref().fd })
            .map_err(|e| VerbsError::sys("rdma_cm channel O_NONBLOCK", e))?;
        Ok(ch)
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: its ids are destroyed (see the invariant).
        unsafe { rdma_destroy_event_channel(self.ch.as_ptr()) };
    }
}

/// An `rdma_cm_id` with its own channel.
pub(super) struct RawId {
    // INVARIANT: created on (or migrated to) `ch`; destroyed in drop only.
    pub(super) id: NonNull<rdma_cm_id>,
    ch: Channel,
}

impl Drop for RawId {
    fn drop(&mut self) {
        // SAFETY: live id. Every event is acked as soon as it is read, so
        // the destroy does not wait. The QP belongs to an `IbvQp`, not to
        // librdmacm: detach it first. `ch` drops after this body.
        unsafe {
            (*self.id.as_ptr()).qp = ptr::null_mut();
            rdma_destroy_id(self.id.as_ptr());
        }
    }
}

/// What we keep of one CM event (copied before it is acked).
struct Event {
    kind: u32,
    status: i32,
    id: *mut rdma_cm_id,
    private: [u8; ACCEPT_PRIVATE_DATA_MAX],
    private_len: usize,
    responder_resources: u8,
    initiator_depth: u8,
    rnr_retry_count: u8,
    qp_num: u32,
}

impl Event {
    fn private(&self, max: usize) -> PrivateData {
        let len = self.private_len.min(max);
        PrivateData::padded(&self.private[..len], max).unwrap_or(PrivateData::EMPTY)
    }
}

/// The next event of `ch`, copied and acked; `None` if there is none.
fn next_event(ch: &Channel) -> Result<Option<Event>, VerbsError> {
    let mut ev = ptr::null_mut();
    // SAFETY: live channel (non-blocking); `ev` is a valid out pointer.
    if unsafe { rdma_get_cm_event(ch.ch.as_ptr(), &mut ev) } != 0 {
        let e = last_err();
        if e.kind() == std::io::ErrorKind::WouldBlock {
            return Ok(None);
        }
        return Err(VerbsError::sys("rdma_get_cm_event", e));
    }
    // SAFETY: a delivered event is valid until acked below; `param.conn` is
    // the member used by connection events (all we read), and its private
    // data pointer covers `private_data_len` bytes.
    let out = unsafe {
        let e = &*ev;
        let conn = &e.param.conn;
        let mut out = Event {
            kind: e.event,
            status: e.status,
            id: e.id,
            private: [0; ACCEPT_PRIVATE_DATA_MAX],
            private_len: 0,
            responder_resources: conn.responder_resources,
            initiator_depth: conn.initiator_depth,
            rnr_retry_count: conn.rnr_retry_count,
            qp_num: conn.qp_num,
        };
        if !conn.private_data.is_null() {
            let len = usize::from(conn.private_data_len).min(ACCEPT_PRIVATE_DATA_MAX);
            let src = std::slice::from_raw_parts(conn.private_data.cast::<u8>(), len);
            out.private[..len].copy_from_slice(src);
            out.private_len = len;
        }
        out
    };
    // SAFETY: acked exactly once, after the copy.
    unsafe { rdma_ack_cm_event(ev) };
    Ok(Some(out))
}

/// Wait (bounded by `ms`) until `ch` has an event, and return it.
fn wait_event(ch: &Channel, ms: i32) -> Result<Option<Event>, VerbsError> {
    if let Some(ev) = next_event(ch)? {
        return Ok(Some(ev));
    }
    let mut pfd = libc::pollfd {
        // SAFETY: live channel.
        fd: unsafe { ch.ch.as_ref().fd },
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    if unsafe { libc::poll(&mut pfd, 1, ms) } < 0 {
        return Err(VerbsError::sys("poll(rdma_cm channel)", last_err()));
    }
    next_event(ch)
}

fn parse_addr(addr: &CmAddr) -> Result<SocketAddr, VerbsError> {
    addr.0
        .parse()
        .map_err(|_| VerbsError::InvalidArgument("CM address must be ip:port"))
}

/// `sa` as a `sockaddr_storage` for librdmacm.
fn sockaddr(sa: &SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match sa {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(v4.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { ptr::write(ptr::addr_of_mut!(ss).cast::<libc::sockaddr_in>(), sin) };
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { ptr::write(ptr::addr_of_mut!(ss).cast::<libc::sockaddr_in6>(), sin6) };
        }
    }
    ss
}

fn new_id(ch: Channel) -> Result<RawId, VerbsError> {
    let mut id = ptr::null_mut();
    // SAFETY: live channel; `id` is a valid out pointer; RC port space.
    let rc = unsafe {
        rdma_create_id(
            ch.ch.as_ptr(),
            &mut id,
            ptr::null_mut(),
            rdma_port_space::RDMA_PS_TCP,
        )
    };
    if rc != 0 {
        return Err(VerbsError::sys("rdma_create_id", last_err()));
    }
    let id = NonNull::new(id).ok_or(VerbsError::CmState("rdma_create_id returned NULL"))?;
    Ok(RawId { id, ch })
}

/// Whether `id` is bound to the device `ctx` (or not yet to any).
pub(super) fn on_device(id: &RawId, ctx: &Ctx) -> bool {
    // SAFETY: live id; `verbs` is NULL or an open context of librdmacm.
    let verbs = unsafe { id.id.as_ref().verbs };
    // SAFETY: a non-NULL `verbs` is an open context.
    verbs.is_null() || unsafe { ctx_device_name(verbs) } == ctx.name
}

fn conn_param(p: &PendingParam) -> rdma_conn_param {
    rdma_conn_param {
        private_data: if p.len == 0 {
            ptr::null()
        } else {
            p.data.as_ptr().cast()
        },
        private_data_len: p.len,
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        flow_control: 1,
        retry_count: p.retry_count.min(7),
        rnr_retry_count: p.rnr_retry_count.min(7),
        srq: 0,
        qp_num: 0,
    }
}

/// Connection parameters copied for a later `rdma_connect`/`rdma_accept`.
struct PendingParam {
    data: [u8; ACCEPT_PRIVATE_DATA_MAX],
    len: u8,
    responder_resources: u8,
    initiator_depth: u8,
    retry_count: u8,
    rnr_retry_count: u8,
}

impl PendingParam {
    fn new(p: &ConnParam<'_>, max: usize) -> Result<PendingParam, VerbsError> {
        if p.private_data.len() > max {
            return Err(VerbsError::PrivateDataTooLong {
                len: p.private_data.len(),
                max,
            });
        }
        let mut data = [0; ACCEPT_PRIVATE_DATA_MAX];
        data[..p.private_data.len()].copy_from_slice(p.private_data);
        Ok(PendingParam {
            data,
            // `max <= 196`, checked above.
            len: p.private_data.len() as u8,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            retry_count: p.retry_count,
            rnr_retry_count: p.rnr_retry_count,
        })
    }
}

/// A listening RDMA CM endpoint. Call [`CmListener::get_request`] from a
/// poller; [`IbvListener::fd`] becomes readable when a request is pending.
pub struct IbvListener {
    raw: RawId,
    addr: CmAddr,
    ctx: Rc<Ctx>,
}

impl std::fmt::Debug for IbvListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvListener")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl IbvListener {
    /// The event channel's descriptor (non-blocking; readable when an event
    /// is pending), for the reactor's adaptive idle mode.
    pub fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the channel lives as long as `self`.
        unsafe { BorrowedFd::borrow_raw(self.raw.ch.ch.as_ref().fd) }
    }
}

pub(super) fn listen(
    ctx: &Rc<Ctx>,
    addr: &CmAddr,
    backlog: u32,
) -> Result<IbvListener, VerbsError> {
    let sa = parse_addr(addr)?;
    let raw = new_id(Channel::new()?)?;
    let mut ss = sockaddr(&sa);
    // SAFETY: live id; `ss` holds a valid sockaddr of its family.
    if unsafe { rdma_bind_addr(raw.id.as_ptr(), ptr::addr_of_mut!(ss).cast()) } != 0 {
        return Err(VerbsError::sys("rdma_bind_addr", last_err()));
    }
    if !on_device(&raw, ctx) {
        return Err(VerbsError::InvalidArgument(
            "the listen address belongs to another RDMA device",
        ));
    }
    let backlog = i32::try_from(backlog).unwrap_or(i32::MAX);
    // SAFETY: live, bound id.
    if unsafe { rdma_listen(raw.id.as_ptr(), backlog) } != 0 {
        return Err(VerbsError::sys("rdma_listen", last_err()));
    }
    Ok(IbvListener {
        raw,
        addr: addr.clone(),
        ctx: ctx.clone(),
    })
}

impl CmListener<Ibverbs> for IbvListener {
    fn addr(&self) -> &CmAddr {
        &self.addr
    }

    fn wake_fd(&self) -> BorrowedFd<'_> {
        self.fd()
    }

    fn get_request(&self) -> Result<Option<IbvCmId>, VerbsError> {
        while let Some(ev) = next_event(&self.raw.ch)? {
            if ev.kind != rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST {
                continue; // listener events we do not act on (address change, ...)
            }
            let id = NonNull::new(ev.id).ok_or(VerbsError::Protocol("request without an id"))?;
            // Give the new connection its own channel. Its event was acked
            // already, so the migration does not wait.
            let ch = match Channel::new() {
                Ok(ch) => ch,
                Err(e) => {
                    // SAFETY: the new id is ours and not used again.
                    unsafe { rdma_destroy_id(id.as_ptr()) };
                    return Err(e);
                }
            };
            // SAFETY: live id and live channel.
            if unsafe { rdma_migrate_id(id.as_ptr(), ch.ch.as_ptr()) } != 0 {
                let e = last_err();
                // SAFETY: as above.
                unsafe { rdma_destroy_id(id.as_ptr()) };
                return Err(VerbsError::sys("rdma_migrate_id", e));
            }
            let request = ConnRequestInfo {
                private_data: ev.private(CONNECT_PRIVATE_DATA_MAX),
                responder_resources: ev.responder_resources,
                initiator_depth: ev.initiator_depth,
                rnr_retry_count: ev.rnr_retry_count,
                qp_num: ev.qp_num,
            };
            return Ok(Some(IbvCmId::passive(
                RawId { id, ch },
                self.ctx.clone(),
                request,
            )));
        }
        Ok(None)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConnState {
    /// Passive: a request waiting for accept/reject.
    Requested,
    /// Active: resolving the address.
    ResolvingAddr,
    /// Active: resolving the route.
    ResolvingRoute,
    /// Active: connect sent / passive: accepted, waiting for ESTABLISHED.
    Connecting,
    Connected,
    /// Rejected by us, disconnected, or failed.
    Closed,
}

/// One RDMA CM connection (active or passive) on its own non-blocking
/// event channel. Call [`CmId::get_event`] from a poller: on the active side
/// it also drives address and route resolution and the connect itself.
pub struct IbvCmId {
    raw: RawId,
    ctx: Rc<Ctx>,
    request: Option<ConnRequestInfo>,
    state: Cell<ConnState>,
    qp: RefCell<Option<Rc<QpInner>>>,
    pending: RefCell<Option<PendingParam>>,
    /// An outcome found during `connect`'s resolution, reported first.
    outcome: Cell<Option<CmEvent>>,
}

impl std::fmt::Debug for IbvCmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvCmId")
            .field("state", &self.state.get())
            .field("request", &self.request)
            .finish_non_exhaustive()
    }
}

impl IbvCmId {
    /// A passive id for a connect request (`raw` on its own channel), on
    /// the device `ctx`.
    pub(super) fn passive(raw: RawId, ctx: Rc<Ctx>, request: ConnRequestInfo) -> IbvCmId {
        IbvCmId {
            raw,
            ctx,
            request: Some(request),
            state: Cell::new(ConnState::Requested),
            qp: RefCell::new(None),
            pending: RefCell::new(None),
            outcome: Cell::new(None),
        }
    }

    /// The event channel's descriptor (non-blocking; readable when an event
    /// is pending).
    pub fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the channel lives as long as `self`.
        unsafe { BorrowedFd::borrow_raw(self.raw.ch.ch.as_ref().fd) }
    }

    fn qp_state(&self, s: QpState) {
        if let Some(qp) = self.qp.borrow().as_ref() {
            qp.state.set(s);
        }
    }

    /// Act on one event; returns what to report, if anything. On the active
    /// side this also drives route resolution and the connect itself.
    fn handle(&self, ev: &Event) -> Option<CmEvent> {
        use rdma_cm_event_type::*;
        match ev.kind {
            RDMA_CM_EVENT_ADDR_RESOLVED => {
                if !on_device(&self.raw, &self.ctx) {
                    log::warn!(
                        "rdma_cm: the address is not reached through {}",
                        self.ctx.name
                    );
                    self.state.set(ConnState::Closed);
                    return Some(CmEvent::ConnectError);
                }
                // SAFETY: live id with a resolved address.
                if unsafe { rdma_resolve_route(self.raw.id.as_ptr(), RESOLVE_TIMEOUT_MS) } != 0 {
                    log::warn!("rdma_resolve_route: {}", last_err());
                    self.state.set(ConnState::Closed);
                    return Some(CmEvent::ConnectError);
                }
                self.state.set(ConnState::ResolvingRoute);
                None
            }
            RDMA_CM_EVENT_ROUTE_RESOLVED => {
                if let Err(e) = self.send_connect() {
                    log::warn!("{e}");
                    self.state.set(ConnState::Closed);
                    return Some(CmEvent::ConnectError);
                }
                self.state.set(ConnState::Connecting);
                None
            }
            RDMA_CM_EVENT_ADDR_ERROR | RDMA_CM_EVENT_ROUTE_ERROR | RDMA_CM_EVENT_UNREACHABLE => {
                self.state.set(ConnState::Closed);
                Some(CmEvent::Unreachable)
            }
            RDMA_CM_EVENT_REJECTED => {
                self.state.set(ConnState::Closed);
                Some(CmEvent::Rejected {
                    reason: ev.status,
                    private_data: ev.private(REJECT_PRIVATE_DATA_MAX),
                })
            }
            RDMA_CM_EVENT_CONNECT_ERROR => {
                self.state.set(ConnState::Closed);
                Some(CmEvent::ConnectError)
            }
            RDMA_CM_EVENT_ESTABLISHED => {
                self.state.set(ConnState::Connected);
                self.qp_state(QpState::Rts);
                let private_data = if self.request.is_some() {
                    PrivateData::EMPTY
                } else {
                    ev.private(ACCEPT_PRIVATE_DATA_MAX)
                };
                Some(CmEvent::Established { private_data })
            }
            RDMA_CM_EVENT_DISCONNECTED | RDMA_CM_EVENT_DEVICE_REMOVAL => {
                if self.state.replace(ConnState::Closed) != ConnState::Closed {
                    // The peer disconnected: answer its DREQ (otherwise it
                    // hears of the end only when its DREQ times out).
                    // SAFETY: live id; failing here (e.g. already answered)
                    // changes nothing.
                    unsafe { rdma_disconnect(self.raw.id.as_ptr()) };
                }
                // Make sure our WRs flush.
                if let Some(qp) = self.qp.borrow().as_ref() {
                    qp.to_error();
                }
                Some(CmEvent::Disconnected)
            }
            _ => None, // TIMEWAIT_EXIT and others: nothing to report
        }
    }

    /// Active side, on ROUTE_RESOLVED: hand the QP to librdmacm and connect.
    fn send_connect(&self) -> Result<(), VerbsError> {
        let qp = self.qp.borrow();
        let pending = self.pending.borrow();
        let (Some(qp), Some(p)) = (qp.as_ref(), pending.as_ref()) else {
            return Err(VerbsError::CmState("no QP to connect"));
        };
        let mut param = conn_param(p);
        // SAFETY: live id; the QP outlives the id's use of it (we hold an
        // Rc to it and detach it in `RawId::drop`); `param` and its private
        // data live across the call.
        let rc = unsafe {
            (*self.raw.id.as_ptr()).qp = qp.qp.as_ptr();
            rdma_connect(self.raw.id.as_ptr(), &mut param)
        };
        if rc != 0 {
            return Err(VerbsError::sys("rdma_connect", last_err()));
        }
        Ok(())
    }
}

pub(super) fn connect(
    ctx: &Rc<Ctx>,
    addr: &CmAddr,
    qp: &IbvQp,
    param: &ConnParam<'_>,
) -> Result<IbvCmId, VerbsError> {
    let pending = PendingParam::new(param, CONNECT_PRIVATE_DATA_MAX)?;
    if !matches!(qp.inner.state.get(), QpState::Reset | QpState::Init) {
        return Err(VerbsError::CmState("the QP must be in RESET or INIT"));
    }
    if qp.inner.pd.ctx.ctx != ctx.ctx {
        return Err(VerbsError::InvalidArgument("QP of another device"));
    }
    let dst = parse_addr(addr)?;
    let raw = new_id(Channel::new()?)?;
    let mut dss = sockaddr(&dst);
    // Leave through this device: bind the source to its own address.
    let mut src = match (dst.ip(), ctx.ipv4) {
        (IpAddr::V4(_), Some(me)) => Some(sockaddr(&SocketAddr::new(IpAddr::V4(me), 0))),
        _ => None,
    };
    let src_ptr = src
        .as_mut()
        .map_or(ptr::null_mut(), |s| ptr::addr_of_mut!(*s).cast());
    // SAFETY: live id; both addresses are valid sockaddrs of their family
    // (or NULL for the source); the call copies them.
    let rc = unsafe {
        rdma_resolve_addr(
            raw.id.as_ptr(),
            src_ptr,
            ptr::addr_of_mut!(dss).cast(),
            RESOLVE_TIMEOUT_MS,
        )
    };
    if rc != 0 {
        return Err(VerbsError::sys("rdma_resolve_addr", last_err()));
    }
    let id = IbvCmId {
        raw,
        ctx: ctx.clone(),
        request: None,
        state: Cell::new(ConnState::ResolvingAddr),
        qp: RefCell::new(Some(qp.inner.clone())),
        pending: RefCell::new(Some(pending)),
        outcome: Cell::new(None),
    };
    // Address and route resolution are local (neighbour and route lookup):
    // wait for them here, so that the request is on the wire when `connect`
    // returns, as with every provider. Bounded by twice the resolve timeout.
    for _ in 0..2 {
        let ev = wait_event(&id.raw.ch, 2 * RESOLVE_TIMEOUT_MS + 500)?
            .ok_or(VerbsError::CmState("address/route resolution timed out"))?;
        if let Some(out) = id.handle(&ev) {
            id.outcome.set(Some(out));
            break;
        }
        if id.state.get() == ConnState::Connecting {
            break;
        }
    }
    Ok(id)
}

impl CmId<Ibverbs> for IbvCmId {
    fn request(&self) -> Option<&ConnRequestInfo> {
        self.request.as_ref()
    }

    fn accept(&self, qp: &IbvQp, param: &ConnParam<'_>) -> Result<(), VerbsError> {
        let p = PendingParam::new(param, ACCEPT_PRIVATE_DATA_MAX)?;
        if self.state.get() != ConnState::Requested {
            return Err(VerbsError::CmState("not a pending connect request"));
        }
        if !matches!(qp.inner.state.get(), QpState::Reset | QpState::Init) {
            return Err(VerbsError::CmState("the QP must be in RESET or INIT"));
        }
        if qp.inner.pd.ctx.ctx != self.ctx.ctx || !on_device(&self.raw, &self.ctx) {
            return Err(VerbsError::InvalidArgument(
                "the request arrived on another RDMA device",
            ));
        }
        let mut cp = conn_param(&p);
        // SAFETY: live id; the QP outlives the id's use of it (Rc kept
        // below, detached in `RawId::drop`); `cp` and `p` live across the
        // call. librdmacm moves the QP to RTR and RTS before answering.
        let rc = unsafe {
            (*self.raw.id.as_ptr()).qp = qp.inner.qp.as_ptr();
            rdma_accept(self.raw.id.as_ptr(), &mut cp)
        };
        if rc != 0 {
            let e = last_err();
            // SAFETY: live id; the QP is not attached after a failed accept.
            unsafe { (*self.raw.id.as_ptr()).qp = ptr::null_mut() };
            return Err(VerbsError::sys("rdma_accept", e));
        }
        qp.inner.state.set(QpState::Rts);
        *self.qp.borrow_mut() = Some(qp.inner.clone());
        self.state.set(ConnState::Connecting);
        Ok(())
    }

    fn reject(&self, private_data: &[u8]) -> Result<(), VerbsError> {
        if private_data.len() > REJECT_PRIVATE_DATA_MAX {
            return Err(VerbsError::PrivateDataTooLong {
                len: private_data.len(),
                max: REJECT_PRIVATE_DATA_MAX,
            });
        }
        if self.state.get() != ConnState::Requested {
            return Err(VerbsError::CmState("not a pending connect request"));
        }
        let data = if private_data.is_empty() {
            ptr::null()
        } else {
            private_data.as_ptr().cast()
        };
        // SAFETY: live id; `private_data` lives across the call (<= 148 bytes).
        let rc = unsafe { rdma_reject(self.raw.id.as_ptr(), data, private_data.len() as u8) };
        if rc != 0 {
            return Err(VerbsError::sys("rdma_reject", last_err()));
        }
        self.state.set(ConnState::Closed);
        Ok(())
    }

    fn disconnect(&self) -> Result<(), VerbsError> {
        if !matches!(
            self.state.get(),
            ConnState::Connected | ConnState::Connecting
        ) || self.qp.borrow().is_none()
        {
            return Err(VerbsError::CmState("not connected"));
        }
        // SAFETY: live, connected id (librdmacm moves its QP to ERR).
        if unsafe { rdma_disconnect(self.raw.id.as_ptr()) } != 0 {
            return Err(VerbsError::sys("rdma_disconnect", last_err()));
        }
        self.qp_state(QpState::Err);
        self.state.set(ConnState::Closed);
        Ok(())
    }

    fn detach(self) -> Result<IbvPendingConn, DetachError<Self>> {
        let pending = self.state.get() == ConnState::Requested
            && self.qp.borrow().is_none()
            && self.outcome.get().is_none();
        let Some(request) = self.request.filter(|_| pending) else {
            return Err(DetachError {
                id: self,
                error: VerbsError::CmState("not an unanswered connect request"),
            });
        };
        // The id and its channel leave; this core's context handle (`ctx`)
        // is dropped here, on its own core.
        Ok(IbvPendingConn::new(self.raw, request))
    }

    fn get_event(&self) -> Result<Option<CmEvent>, VerbsError> {
        if let Some(out) = self.outcome.take() {
            return Ok(Some(out));
        }
        while let Some(ev) = next_event(&self.raw.ch)? {
            if let Some(out) = self.handle(&ev) {
                return Ok(Some(out));
            }
        }
        Ok(None)
    }
}
