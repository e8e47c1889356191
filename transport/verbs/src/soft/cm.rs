//! The soft connection manager: a Unix `SOCK_SEQPACKET` socket per
//! connection (a path or an abstract `@name` to listen on), private data,
//! accept/reject, and `SCM_RIGHTS` passing of the link memfd, the MR tables,
//! the CQ eventfds and every exposed arena.
//!
//! The socket is also the liveness link: a hung-up socket (peer crashed or
//! closed) moves the QP to ERR (its WRs flush) and yields
//! [`CmEvent::Disconnected`]. Drive [`SoftCmId::get_event`] from a poller.
//! Everything is non-blocking.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;

use pollux_reactor::mem::DmaArena;
use rustix::io::Errno;
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SocketAddrUnix, SocketFlags, SocketType,
};

use super::arena_slots::{slot_index, SlotArena};
use super::device::SoftDevice;
use super::link::{Link, PeerArenas};
use super::mr::{MR_ENTRY_SIZE, MR_TABLE_ENTRIES};
use super::pending::SoftPendingConn;
use super::qp::SoftQp;
use super::ring::LINK_LEN;
use super::shm::Shm;
use super::wire::{Hello, Msg, MSG_MAX};
use super::Soft;
use crate::cm::{
    CmAddr, CmEvent, ConnParam, ConnRequestInfo, DetachError, PrivateData, ACCEPT_PRIVATE_DATA_MAX,
    CONNECT_PRIVATE_DATA_MAX, REJECT_PRIVATE_DATA_MAX, REJECT_REASON_CONSUMER,
    REJECT_REASON_INVALID_SERVICE_ID,
};
use crate::error::VerbsError;
use crate::provider::{CmId, CmListener, QueuePair};
use crate::types::{QpAttr, QpState};

const TABLE_LEN: usize = MR_TABLE_ENTRIES as usize * MR_ENTRY_SIZE;
/// Highest arena slot a peer may announce.
const MAX_PEER_SLOTS: u64 = 65536;

fn sockaddr(addr: &CmAddr) -> Result<SocketAddrUnix, VerbsError> {
    let r = match addr.0.strip_prefix('@') {
        Some(name) => SocketAddrUnix::new_abstract_name(name.as_bytes()),
        None => SocketAddrUnix::new(addr.0.as_str()),
    };
    r.map_err(|e| VerbsError::sys("unix socket address", e))
}

fn seqpacket() -> Result<OwnedFd, VerbsError> {
    rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| VerbsError::sys("socket", e))
}

/// A received message, or why none came.
#[allow(clippy::large_enum_variant)]
enum Rx {
    Msg(Msg, Vec<OwnedFd>),
    Empty,
    Hup,
}

fn recv_msg(sock: &OwnedFd) -> Rx {
    let mut b = [0u8; MSG_MAX];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(8))];
    let mut cmsg = RecvAncillaryBuffer::new(&mut space);
    let mut iov = [IoSliceMut::new(&mut b)];
    let r = rustix::net::recvmsg(
        sock,
        &mut iov,
        &mut cmsg,
        RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC,
    );
    let n = match r {
        Err(Errno::AGAIN) | Err(Errno::INTR) => return Rx::Empty,
        Err(_) => return Rx::Hup,
        Ok(r) if r.bytes == 0 => return Rx::Hup,
        Ok(r) => r.bytes,
    };
    let mut fds = Vec::new();
    for m in cmsg.drain() {
        if let RecvAncillaryMessage::ScmRights(it) = m {
            fds.extend(it);
        }
    }
    match Msg::decode(&b[..n.min(MSG_MAX)]) {
        Some(m) => Rx::Msg(m, fds),
        None => Rx::Hup,
    }
}

/// Read and drop whatever the peer queued on `sock` (its arena
/// announcements, with their fds). Closing a Unix socket with unread data
/// resets the peer's end (`ECONNRESET` before it reads our last message),
/// so a socket is drained before it is closed after a final answer.
pub(super) fn drain(sock: &OwnedFd) {
    while let Rx::Msg(..) = recv_msg(sock) {}
}

pub(super) fn send_msg(
    sock: &OwnedFd,
    msg: &Msg,
    fds: &[BorrowedFd<'_>],
) -> Result<(), VerbsError> {
    let mut b = [0u8; MSG_MAX];
    let n = msg.encode(&mut b);
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(8))];
    let mut cmsg = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !cmsg.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(VerbsError::InvalidArgument("too many fds"));
    }
    rustix::net::sendmsg(
        sock,
        &[IoSlice::new(&b[..n])],
        &mut cmsg,
        rustix::net::SendFlags::NOSIGNAL | rustix::net::SendFlags::DONTWAIT,
    )
    .map_err(|e| VerbsError::sys("sendmsg", e))?;
    Ok(())
}

/// A listening soft CM endpoint. Unlinks its socket path on drop.
pub struct SoftListener {
    dev: SoftDevice,
    addr: CmAddr,
    sock: OwnedFd,
    path: Option<PathBuf>,
    pending: RefCell<Vec<OwnedFd>>,
}

impl SoftListener {
    pub(crate) fn bind(dev: &SoftDevice, addr: &CmAddr, backlog: u32) -> Result<Self, VerbsError> {
        let sa = sockaddr(addr)?;
        let sock = seqpacket()?;
        rustix::net::bind(&sock, &sa).map_err(|e| VerbsError::sys("bind", e))?;
        rustix::net::listen(&sock, backlog.clamp(1, 4096) as i32)
            .map_err(|e| VerbsError::sys("listen", e))?;
        Ok(SoftListener {
            dev: dev.clone(),
            addr: addr.clone(),
            sock,
            path: (!addr.0.starts_with('@')).then(|| PathBuf::from(&addr.0)),
            pending: RefCell::new(Vec::new()),
        })
    }
}

impl Drop for SoftListener {
    fn drop(&mut self) {
        if let Some(p) = &self.path {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl CmListener<Soft> for SoftListener {
    fn addr(&self) -> &CmAddr {
        &self.addr
    }

    fn wake_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    fn has_partial(&self) -> bool {
        !self.pending.borrow().is_empty()
    }

    fn get_request(&self) -> Result<Option<SoftCmId>, VerbsError> {
        loop {
            match rustix::net::accept_with(&self.sock, SocketFlags::NONBLOCK | SocketFlags::CLOEXEC)
            {
                Ok(s) => self.pending.borrow_mut().push(s),
                Err(Errno::AGAIN) | Err(Errno::INTR) | Err(Errno::CONNABORTED) => break,
                Err(e) => return Err(VerbsError::sys("accept", e)),
            }
        }
        let mut pending = self.pending.borrow_mut();
        let mut i = 0;
        while i < pending.len() {
            match recv_msg(&pending[i]) {
                Rx::Empty => i += 1,
                Rx::Msg(Msg::Req(h), fds) if fds.len() == 4 => {
                    let sock = pending.swap_remove(i);
                    return Ok(Some(SoftCmId(Conn::passive(&self.dev, sock, h, fds))));
                }
                // A malformed request or a vanished peer: drop it.
                Rx::Msg(..) | Rx::Hup => {
                    pending.swap_remove(i);
                }
            }
        }
        Ok(None)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    Connecting,
    ReqReceived,
    Accepted,
    Established,
    Rejected,
    Disconnected,
}

/// A pending passive request taken apart for the trip to another core
/// (all `Send`: fds, plain data, shared arenas).
pub(super) struct RequestParts {
    /// The CM socket; messages the peer sent after its REQ (arenas) are
    /// still queued on it and are read on the new core.
    pub(super) sock: OwnedFd,
    /// The REQ.
    pub(super) hello: Hello,
    /// The REQ's fds (link memfd, MR table, CQ eventfds).
    pub(super) fds: Vec<OwnedFd>,
    /// Peer arenas already mapped (if the id was polled before it left).
    pub(super) peer_arenas: Vec<Option<SlotArena>>,
}

/// One connection (both sides).
pub(crate) struct Conn {
    dev: SoftDevice,
    sock: OwnedFd,
    state: Cell<St>,
    events: RefCell<VecDeque<CmEvent>>,
    qp: RefCell<Option<SoftQp>>,
    request: Option<ConnRequestInfo>,
    hello: Option<Hello>,
    req_fds: RefCell<Vec<OwnedFd>>,
    link_shm: RefCell<Option<Shm>>,
    peer_arenas: PeerArenas,
    deferred: RefCell<VecDeque<(Msg, Vec<OwnedFd>)>>,
    hup: Cell<bool>,
}

impl Conn {
    fn new(dev: &SoftDevice, sock: OwnedFd, st: St, hello: Option<Hello>) -> Conn {
        let request = hello.map(|h| ConnRequestInfo {
            private_data: PrivateData::padded(
                &h.pdata[..usize::from(h.pdata_len).min(CONNECT_PRIVATE_DATA_MAX)],
                CONNECT_PRIVATE_DATA_MAX,
            )
            .unwrap_or(PrivateData::EMPTY),
            responder_resources: h.initiator_depth,
            initiator_depth: h.responder_resources,
            rnr_retry_count: h.rnr_retry,
            qp_num: h.qp_num,
        });
        Conn {
            dev: dev.clone(),
            sock,
            state: Cell::new(st),
            events: RefCell::new(VecDeque::new()),
            qp: RefCell::new(None),
            request,
            hello,
            req_fds: RefCell::new(Vec::new()),
            link_shm: RefCell::new(None),
            peer_arenas: Rc::new(RefCell::new(Vec::new())),
            deferred: RefCell::new(VecDeque::new()),
            hup: Cell::new(false),
        }
    }

    pub(super) fn passive(
        dev: &SoftDevice,
        sock: OwnedFd,
        h: Hello,
        fds: Vec<OwnedFd>,
    ) -> Rc<Conn> {
        let c = Conn::new(dev, sock, St::ReqReceived, Some(h));
        *c.req_fds.borrow_mut() = fds;
        Rc::new(c)
    }

    /// Take a pending request apart into what may travel to another core:
    /// its socket (with the messages still queued on it), the request, its
    /// fds and the peer arenas mapped so far. `None` (and the connection
    /// back) unless it is an unanswered passive request.
    pub(super) fn into_parts(this: Rc<Conn>) -> Result<RequestParts, Rc<Conn>> {
        let Some(hello) = this.hello.filter(|_| this.state.get() == St::ReqReceived) else {
            return Err(this);
        };
        let c = Rc::try_unwrap(this)?;
        let peer_arenas = std::mem::take(&mut *c.peer_arenas.borrow_mut());
        Ok(RequestParts {
            sock: c.sock,
            hello,
            fds: c.req_fds.into_inner(),
            peer_arenas,
        })
    }

    /// Put a travelled request back together on `dev`'s core.
    pub(super) fn from_parts(dev: &SoftDevice, p: RequestParts) -> Rc<Conn> {
        let c = Conn::passive(dev, p.sock, p.hello, p.fds);
        *c.peer_arenas.borrow_mut() = p.peer_arenas;
        c
    }

    /// The QP's link, once connected.
    pub(crate) fn link(&self) -> Option<Rc<Link>> {
        self.qp
            .borrow()
            .as_ref()
            .and_then(|q| q.0.link.borrow().clone())
    }

    /// Ship one arena to the peer (control path).
    pub(crate) fn send_arena(&self, slot: u64, arena: &Arc<DmaArena>) {
        let m = Msg::Arena {
            slot,
            len: arena.len() as u64,
        };
        if let Err(e) = send_msg(&self.sock, &m, &[arena.fd()]) {
            log::warn!("soft verbs: could not ship arena slot {slot}: {e}");
        }
    }

    /// Ship the exposed arenas of the QP's device (the device its MR keys
    /// and arena slots belong to; a request attached on another core has
    /// that core's device) and register for the ones exposed later.
    fn ship_exposed(self: &Rc<Self>) {
        let dev = self
            .qp
            .borrow()
            .as_ref()
            .map_or_else(|| self.dev.clone(), |q| q.0.pd.0.dev.clone());
        for (slot, a) in dev.0.exposed_slots() {
            self.send_arena(slot, &a);
        }
        dev.0.add_conn(self);
    }

    /// Tell the peer that the arena of slot `id` is gone (control path).
    pub(crate) fn send_arena_gone(&self, id: u64) {
        if self.hup.get() {
            return;
        }
        if let Err(e) = send_msg(&self.sock, &Msg::ArenaGone { slot: id }, &[]) {
            log::debug!("soft verbs: could not announce the end of arena slot {id:#x}: {e}");
        }
    }

    fn install_arena(&self, slot: u64, len: u64, mut fds: Vec<OwnedFd>) {
        let Some(fd) = fds.pop() else { return };
        let idx = slot_index(slot);
        if idx as u64 >= MAX_PEER_SLOTS {
            return;
        }
        match DmaArena::map_foreign(fd, len as usize) {
            Ok(a) => {
                let mut v = self.peer_arenas.borrow_mut();
                if v.len() <= idx {
                    v.resize(idx + 1, None);
                }
                v[idx] = Some(SlotArena { id: slot, arena: a });
            }
            Err(e) => log::warn!("soft verbs: cannot map peer arena slot {slot:#x}: {e}"),
        }
    }

    /// The peer let go of the arena of slot `id`: unmap ours (unless the
    /// index already holds a newer arena).
    fn drop_arena(&self, id: u64) {
        if let Some(link) = self.link() {
            link.rkeys.forget_slot(id);
        }
        let mut v = self.peer_arenas.borrow_mut();
        if let Some(e) = v.get_mut(slot_index(id)) {
            if e.as_ref().is_some_and(|s| s.id == id) {
                *e = None;
            }
        }
    }

    /// Data-path helper: map arenas already announced; defer other messages.
    pub(crate) fn pump_arenas(&self) {
        loop {
            match recv_msg(&self.sock) {
                Rx::Msg(Msg::Arena { slot, len }, fds) => self.install_arena(slot, len, fds),
                Rx::Msg(Msg::ArenaGone { slot }, _) => self.drop_arena(slot),
                Rx::Msg(m, fds) => self.deferred.borrow_mut().push_back((m, fds)),
                Rx::Empty => break,
                Rx::Hup => {
                    self.hup.set(true);
                    break;
                }
            }
        }
    }

    fn go_disconnected(&self) {
        if let Some(qp) = self.qp.borrow().as_ref() {
            qp.0.to_err(None, None);
        }
        if matches!(self.state.get(), St::Established | St::Accepted) {
            self.events.borrow_mut().push_back(CmEvent::Disconnected);
        }
        self.state.set(St::Disconnected);
    }

    fn hangup(&self) {
        match self.state.get() {
            St::Connecting => {
                self.events.borrow_mut().push_back(CmEvent::Unreachable);
                self.state.set(St::Rejected);
            }
            St::Established | St::Accepted => self.go_disconnected(),
            _ => {}
        }
    }

    fn handle(self: &Rc<Self>, m: Msg, fds: Vec<OwnedFd>) -> Result<(), VerbsError> {
        match (m, self.state.get()) {
            (Msg::Arena { slot, len }, _) => self.install_arena(slot, len, fds),
            (Msg::ArenaGone { slot }, _) => self.drop_arena(slot),
            (Msg::Rep(h), St::Connecting) => self.establish_active(h, fds)?,
            (
                Msg::Rej {
                    reason,
                    pdata_len,
                    pdata,
                },
                St::Connecting,
            ) => {
                let n = usize::from(pdata_len).min(REJECT_PRIVATE_DATA_MAX);
                self.events.borrow_mut().push_back(CmEvent::Rejected {
                    reason,
                    private_data: PrivateData::padded(&pdata[..n], REJECT_PRIVATE_DATA_MAX)?,
                });
                self.state.set(St::Rejected);
            }
            (Msg::Rtu, St::Accepted) => {
                self.state.set(St::Established);
                self.events.borrow_mut().push_back(CmEvent::Established {
                    private_data: PrivateData::EMPTY,
                });
            }
            (Msg::Dreq, St::Established | St::Accepted) => self.go_disconnected(),
            _ => {}
        }
        Ok(())
    }

    fn make_link(
        self: &Rc<Self>,
        shm: Shm,
        active: bool,
        peer_tag: u8,
        table: OwnedFd,
        recv_efd: OwnedFd,
        send_efd: OwnedFd,
    ) -> Result<Rc<Link>, VerbsError> {
        Ok(Rc::new(Link {
            shm,
            out_d: if active { 0 } else { 1 },
            in_d: if active { 1 } else { 0 },
            out_tail: Cell::new(0),
            published: Cell::new(0),
            head_cache: Cell::new(0),
            in_head: Cell::new(0),
            nak_done: Cell::new(false),
            peer_table: Shm::map(table, TABLE_LEN, false)?,
            peer_tag,
            peer_arenas: self.peer_arenas.clone(),
            rkeys: Default::default(),
            peer_recv_efd: recv_efd,
            peer_send_efd: send_efd,
            recv_armed_seen: Cell::new(0),
            send_armed_seen: Cell::new(0),
            conn: Rc::downgrade(self),
        }))
    }

    fn establish_active(self: &Rc<Self>, h: Hello, fds: Vec<OwnedFd>) -> Result<(), VerbsError> {
        let [table, recv_efd, send_efd]: [OwnedFd; 3] = fds
            .try_into()
            .map_err(|_| VerbsError::Protocol("REP carries the wrong fds"))?;
        let shm = self
            .link_shm
            .borrow_mut()
            .take()
            .ok_or(VerbsError::CmState("no link"))?;
        let link = self.make_link(shm, true, h.pd_tag, table, recv_efd, send_efd)?;
        let qp = self
            .qp
            .borrow()
            .clone()
            .ok_or(VerbsError::CmState("no QP"))?;
        qp.0.attach(link);
        qp.modify(&QpAttr::to(QpState::Rtr))?;
        let mut rts = QpAttr::to(QpState::Rts);
        rts.rnr_retry = h.rnr_retry;
        qp.modify(&rts)?;
        send_msg(&self.sock, &Msg::Rtu, &[])?;
        self.state.set(St::Established);
        let n = usize::from(h.pdata_len).min(ACCEPT_PRIVATE_DATA_MAX);
        self.events.borrow_mut().push_back(CmEvent::Established {
            private_data: PrivateData::padded(&h.pdata[..n], ACCEPT_PRIVATE_DATA_MAX)?,
        });
        Ok(())
    }

    fn pump(self: &Rc<Self>) -> Result<(), VerbsError> {
        loop {
            let d = self.deferred.borrow_mut().pop_front();
            match d {
                Some((m, fds)) => self.handle(m, fds)?,
                None => break,
            }
        }
        loop {
            match recv_msg(&self.sock) {
                Rx::Msg(m, fds) => self.handle(m, fds)?,
                Rx::Empty => break,
                Rx::Hup => {
                    self.hup.set(true);
                    break;
                }
            }
        }
        if self.hup.replace(false) {
            self.hangup();
        }
        Ok(())
    }

    /// Fault injection: drop the connection as if the peer vanished.
    pub(crate) fn kill(&self) {
        let _ = rustix::net::shutdown(&self.sock, rustix::net::Shutdown::Both);
        self.go_disconnected();
    }
}

/// A soft connection id.
#[derive(Clone)]
pub struct SoftCmId(pub(crate) Rc<Conn>);

impl SoftCmId {
    pub(crate) fn connect(
        dev: &SoftDevice,
        addr: &CmAddr,
        qp: &SoftQp,
        param: &ConnParam<'_>,
    ) -> Result<SoftCmId, VerbsError> {
        if param.private_data.len() > CONNECT_PRIVATE_DATA_MAX {
            return Err(VerbsError::PrivateDataTooLong {
                len: param.private_data.len(),
                max: CONNECT_PRIVATE_DATA_MAX,
            });
        }
        match qp.state() {
            QpState::Reset => qp.modify(&QpAttr::to(QpState::Init))?,
            QpState::Init => {}
            _ => {
                return Err(VerbsError::CmState(
                    "QP must be in RESET or INIT to connect",
                ))
            }
        }
        let sa = sockaddr(addr)?;
        let sock = seqpacket()?;
        let conn = Rc::new(Conn::new(dev, sock, St::Connecting, None));
        *conn.qp.borrow_mut() = Some(qp.clone());
        match rustix::net::connect(&conn.sock, &sa) {
            Ok(()) => {}
            Err(Errno::CONNREFUSED) | Err(Errno::NOENT) => {
                conn.events.borrow_mut().push_back(CmEvent::Rejected {
                    reason: REJECT_REASON_INVALID_SERVICE_ID,
                    private_data: PrivateData::padded(&[], REJECT_PRIVATE_DATA_MAX)?,
                });
                conn.state.set(St::Rejected);
                return Ok(SoftCmId(conn));
            }
            Err(Errno::AGAIN) => {
                conn.events.borrow_mut().push_back(CmEvent::Unreachable);
                conn.state.set(St::Rejected);
                return Ok(SoftCmId(conn));
            }
            Err(e) => return Err(VerbsError::sys("connect", e)),
        }
        let shm = Shm::create("pollux-soft-link", LINK_LEN)?;
        let mut pdata = [0; ACCEPT_PRIVATE_DATA_MAX];
        pdata[..param.private_data.len()].copy_from_slice(param.private_data);
        let h = Hello {
            qp_num: qp.0.num,
            pd_tag: qp.0.pd.0.tag,
            responder_resources: param.responder_resources,
            initiator_depth: param.initiator_depth,
            rnr_retry: param.rnr_retry_count.min(7),
            pdata_len: param.private_data.len() as u8,
            pdata,
        };
        send_msg(
            &conn.sock,
            &Msg::Req(h),
            &[
                shm.fd(),
                qp.0.pd.0.table.fd(),
                qp.0.recv_cq.0.efd.as_fd(),
                qp.0.send_cq.0.efd.as_fd(),
            ],
        )?;
        *conn.link_shm.borrow_mut() = Some(shm);
        conn.ship_exposed();
        Ok(SoftCmId(conn))
    }

    /// Fault injection: break the connection locally (as if the peer had
    /// crashed): the QP goes to ERR and `Disconnected` is reported; the peer
    /// sees a hang-up.
    pub fn kill(&self) {
        self.0.kill();
    }
}

impl CmId<Soft> for SoftCmId {
    fn request(&self) -> Option<&ConnRequestInfo> {
        self.0.request.as_ref()
    }

    fn accept(&self, qp: &SoftQp, param: &ConnParam<'_>) -> Result<(), VerbsError> {
        let c = &self.0;
        if param.private_data.len() > ACCEPT_PRIVATE_DATA_MAX {
            return Err(VerbsError::PrivateDataTooLong {
                len: param.private_data.len(),
                max: ACCEPT_PRIVATE_DATA_MAX,
            });
        }
        let h = match (c.state.get(), c.hello) {
            (St::ReqReceived, Some(h)) => h,
            _ => return Err(VerbsError::CmState("no connect request to accept")),
        };
        if !matches!(qp.state(), QpState::Reset | QpState::Init) {
            return Err(VerbsError::CmState("QP must be in RESET or INIT to accept"));
        }
        let fds = std::mem::take(&mut *c.req_fds.borrow_mut());
        let [link_fd, table, recv_efd, send_efd]: [OwnedFd; 4] = fds
            .try_into()
            .map_err(|_| VerbsError::Protocol("REQ carries the wrong fds"))?;
        let shm = Shm::map(link_fd, LINK_LEN, true)?;
        let link = c.make_link(shm, false, h.pd_tag, table, recv_efd, send_efd)?;
        qp.0.attach(link);
        if qp.state() == QpState::Reset {
            qp.modify(&QpAttr::to(QpState::Init))?;
        }
        qp.modify(&QpAttr::to(QpState::Rtr))?;
        let mut rts = QpAttr::to(QpState::Rts);
        rts.rnr_retry = h.rnr_retry;
        qp.modify(&rts)?;
        *c.qp.borrow_mut() = Some(qp.clone());
        let mut pdata = [0; ACCEPT_PRIVATE_DATA_MAX];
        pdata[..param.private_data.len()].copy_from_slice(param.private_data);
        let rep = Hello {
            qp_num: qp.0.num,
            pd_tag: qp.0.pd.0.tag,
            responder_resources: param.responder_resources,
            initiator_depth: param.initiator_depth,
            rnr_retry: param.rnr_retry_count.min(7),
            pdata_len: param.private_data.len() as u8,
            pdata,
        };
        send_msg(
            &c.sock,
            &Msg::Rep(rep),
            &[
                qp.0.pd.0.table.fd(),
                qp.0.recv_cq.0.efd.as_fd(),
                qp.0.send_cq.0.efd.as_fd(),
            ],
        )?;
        c.state.set(St::Accepted);
        c.ship_exposed();
        Ok(())
    }

    fn reject(&self, private_data: &[u8]) -> Result<(), VerbsError> {
        let c = &self.0;
        if private_data.len() > REJECT_PRIVATE_DATA_MAX {
            return Err(VerbsError::PrivateDataTooLong {
                len: private_data.len(),
                max: REJECT_PRIVATE_DATA_MAX,
            });
        }
        if c.state.get() != St::ReqReceived {
            return Err(VerbsError::CmState("no connect request to reject"));
        }
        let mut pdata = [0; REJECT_PRIVATE_DATA_MAX];
        pdata[..private_data.len()].copy_from_slice(private_data);
        let m = Msg::Rej {
            reason: REJECT_REASON_CONSUMER,
            pdata_len: private_data.len() as u8,
            pdata,
        };
        c.state.set(St::Rejected);
        c.req_fds.borrow_mut().clear();
        send_msg(&c.sock, &m, &[])
    }

    fn disconnect(&self) -> Result<(), VerbsError> {
        let c = &self.0;
        if !matches!(c.state.get(), St::Established | St::Accepted) {
            return Err(VerbsError::CmState("not connected"));
        }
        let _ = send_msg(&c.sock, &Msg::Dreq, &[]);
        c.go_disconnected();
        Ok(())
    }

    fn detach(self) -> Result<SoftPendingConn, DetachError<Self>> {
        match Conn::into_parts(self.0) {
            Ok(parts) => Ok(SoftPendingConn::new(parts)),
            Err(c) => {
                let error = if c.state.get() == St::ReqReceived && c.hello.is_some() {
                    VerbsError::CmState("the connect request is shared by clones of its id")
                } else {
                    VerbsError::CmState("not an unanswered connect request")
                };
                Err(DetachError {
                    id: SoftCmId(c),
                    error,
                })
            }
        }
    }

    fn get_event(&self) -> Result<Option<CmEvent>, VerbsError> {
        if let Some(e) = self.0.events.borrow_mut().pop_front() {
            return Ok(Some(e));
        }
        if !matches!(self.0.state.get(), St::Rejected | St::Disconnected) {
            self.0.pump()?;
        }
        Ok(self.0.events.borrow_mut().pop_front())
    }
}
