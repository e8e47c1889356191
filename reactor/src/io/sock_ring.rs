//! `SockRing`: a per-core io_uring for stream sockets, the alternative to
//! one non-blocking `read` and one `writev` per socket per poll.
//! See [`SockRing`].

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::rc::Rc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::types::BufRingEntry;
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use slab::Slab;

use crate::mem::DmaBuf;

/// The buffer group id of the ring's provided buffers.
const BGID: u16 = 0;
/// User-data tag of a socket's receive.
const RECV: u64 = 1;
/// User-data tag of a socket's send.
const SEND: u64 = 2;
/// Most iovecs one `sendmsg` takes (`UIO_MAXIOV`); a longer list goes out
/// in several.
const MAX_IOV: usize = 1024;
/// Alignment of the provided-buffer ring and its buffers.
const PAGE: usize = 4096;
/// How long dropping the ring waits for the kernel to end its operations.
const DROP_WAIT: Duration = Duration::from_secs(2);

/// How the kernel runs the work it defers to the ring's thread (receives
/// woken by arriving data, send retries).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TaskRun {
    /// No setup flag: the kernel interrupts the thread to run it.
    Interrupt,
    /// `IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG`: no
    /// interrupt; it runs on the thread's next kernel entry, and
    /// [`SockRing::submit`] enters when the kernel flags pending work.
    Coop,
    /// `IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_SINGLE_ISSUER |
    /// IORING_SETUP_TASKRUN_FLAG` (Linux 6.1): it runs only inside
    /// [`SockRing::submit`], on the thread that made the ring.
    #[default]
    Defer,
}

/// The sizes of a [`SockRing`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SockRingConfig {
    /// Submission queue entries (a power of two; the completion queue has
    /// four times as many). Each socket needs up to two per poll.
    pub entries: u32,
    /// Provided receive buffers shared by the ring's sockets (a power of
    /// two, at most 32768).
    pub bufs: u16,
    /// Bytes per provided buffer (one completion carries at most this).
    pub buf_size: u32,
    /// How deferred kernel work runs.
    pub taskrun: TaskRun,
}

impl Default for SockRingConfig {
    /// 256 entries, 64 buffers of 16 KiB, [`TaskRun::Defer`].
    fn default() -> Self {
        SockRingConfig {
            entries: 256,
            bufs: 64,
            buf_size: 16 * 1024,
            taskrun: TaskRun::Defer,
        }
    }
}

impl SockRingConfig {
    fn validate(&self) -> Result<(), SockRingError> {
        if !self.entries.is_power_of_two() || self.entries > 32768 {
            return Err(SockRingError::InvalidConfig(
                "entries must be a power of two up to 32768",
            ));
        }
        if !self.bufs.is_power_of_two() || self.bufs > 32768 {
            return Err(SockRingError::InvalidConfig(
                "bufs must be a power of two up to 32768",
            ));
        }
        if self.buf_size == 0 || self.buf_size > (1 << 24) {
            return Err(SockRingError::InvalidConfig(
                "buf_size must be 1 byte to 16 MiB",
            ));
        }
        Ok(())
    }
}

/// An error setting up or using a [`SockRing`] (other than a send's).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SockRingError {
    /// The configuration is out of range.
    #[error("invalid socket ring configuration: {0}")]
    InvalidConfig(&'static str),
    /// `io_uring_setup` failed (not supported, disabled by
    /// `/proc/sys/kernel/io_uring_disabled` or seccomp, an unknown setup
    /// flag on an old kernel).
    #[error("io_uring setup failed: {0}")]
    Setup(#[source] io::Error),
    /// Allocating the provided buffers failed.
    #[error("cannot allocate {0} bytes of provided buffers")]
    NoMemory(usize),
    /// Registering the provided-buffer ring failed (Linux < 5.19).
    #[error("registering the provided-buffer ring failed: {0}")]
    BufRing(#[source] io::Error),
    /// The submission queue stayed full: submitting to make room failed.
    #[error("io_uring submission queue full: {0}")]
    Submit(#[source] io::Error),
    /// No such socket, or it is closing.
    #[error("no such socket: {0:?}")]
    NoSocket(SockId),
}

/// Why [`SockRing::send`] refused a list; the list comes back with it.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum SendError<B> {
    /// A send is already in the kernel on this socket: wait for its
    /// [`SockEvent::Sent`] (the stream stays in order).
    #[error("a send is already in flight on this socket")]
    Busy(SendList<B>),
    /// No such socket, or it is closing.
    #[error("no such socket, or it is closing")]
    NoSocket(SendList<B>),
    /// The submission queue stayed full: submitting to make room failed.
    #[error("io_uring submission queue full: {1}")]
    Submit(SendList<B>, #[source] io::Error),
}

impl<B> SendError<B> {
    /// The refused list.
    pub fn into_list(self) -> SendList<B> {
        match self {
            SendError::Busy(l) | SendError::NoSocket(l) | SendError::Submit(l, _) => l,
        }
    }
}

impl<B> fmt::Debug for SendError<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::Busy(l) => write!(f, "Busy({} bytes)", l.len()),
            SendError::NoSocket(l) => write!(f, "NoSocket({} bytes)", l.len()),
            SendError::Submit(l, e) => write!(f, "Submit({} bytes, {e})", l.len()),
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A buffer whose bytes keep their address while it lives, even when the
/// value itself moves (a heap allocation it owns or shares), so the kernel
/// may read them after the value moved into a [`SendList`]. Implemented for
/// `Vec<u8>`, `Box<[u8]>`, `Rc<[u8]>`, `Arc<[u8]>` and [`DmaBuf`]; sealed.
pub trait StableBuf: sealed::Sealed {
    /// The bytes.
    fn stable_bytes(&self) -> &[u8];
}

impl sealed::Sealed for Vec<u8> {}
impl StableBuf for Vec<u8> {
    fn stable_bytes(&self) -> &[u8] {
        self
    }
}
impl sealed::Sealed for Box<[u8]> {}
impl StableBuf for Box<[u8]> {
    fn stable_bytes(&self) -> &[u8] {
        self
    }
}
impl sealed::Sealed for Rc<[u8]> {}
impl StableBuf for Rc<[u8]> {
    fn stable_bytes(&self) -> &[u8] {
        self
    }
}
impl sealed::Sealed for Arc<[u8]> {}
impl StableBuf for Arc<[u8]> {
    fn stable_bytes(&self) -> &[u8] {
        self
    }
}
impl sealed::Sealed for DmaBuf {}
impl StableBuf for DmaBuf {
    fn stable_bytes(&self) -> &[u8] {
        self.as_slice()
    }
}

/// One stretch of a [`SendList`]'s byte stream.
#[derive(Debug, Clone, Copy)]
enum Seg {
    /// `len` bytes of the list's own bytes from `off`.
    Bytes { off: usize, len: usize },
    /// `len` bytes of held buffer `idx` from `off`.
    Buf { idx: usize, off: usize, len: usize },
}

/// What one send writes, in order: bytes copied into the list (headers,
/// small payloads) and slices of buffers it holds (sent where they lie).
///
/// Reused: [`clear`](Self::clear) or [`drain_bufs`](Self::drain_bufs)
/// keep its capacity, so a connection that swaps two lists allocates
/// nothing per send once they reached their high-water marks.
pub struct SendList<B> {
    bytes: Vec<u8>,
    bufs: Vec<B>,
    segs: Vec<Seg>,
    /// Built by [`SockRing::send`] from `segs`; never touched while the
    /// list is in the kernel.
    iov: Vec<libc::iovec>,
    len: usize,
}

impl<B> Default for SendList<B> {
    fn default() -> Self {
        Self::new()
    }
}

impl<B> fmt::Debug for SendList<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendList")
            .field("len", &self.len)
            .field("segs", &self.segs.len())
            .field("bufs", &self.bufs.len())
            .finish()
    }
}

impl<B> SendList<B> {
    /// An empty list.
    pub fn new() -> Self {
        Self::with_capacity(0, 0)
    }

    /// An empty list with room for `bytes` copied bytes and `segs` stretches.
    pub fn with_capacity(bytes: usize, segs: usize) -> Self {
        SendList {
            bytes: Vec::with_capacity(bytes),
            bufs: Vec::with_capacity(segs),
            segs: Vec::with_capacity(segs),
            iov: Vec::with_capacity(segs),
            len: 0,
        }
    }

    /// Bytes the list sends.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the list sends nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends a copy of `b`.
    pub fn push_bytes(&mut self, b: &[u8]) {
        if b.is_empty() {
            return;
        }
        let off = self.bytes.len();
        self.bytes.extend_from_slice(b);
        self.len += b.len();
        if let Some(Seg::Bytes { off: o, len }) = self.segs.last_mut() {
            if *o + *len == off {
                *len += b.len();
                return;
            }
        }
        self.segs.push(Seg::Bytes { off, len: b.len() });
    }

    /// Empties the list, dropping its buffers (capacity kept).
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.bufs.clear();
        self.segs.clear();
        self.iov.clear();
        self.len = 0;
    }

    /// Empties the list and hands its buffers back (capacity kept).
    pub fn drain_bufs(&mut self) -> std::vec::Drain<'_, B> {
        self.bytes.clear();
        self.segs.clear();
        self.iov.clear();
        self.len = 0;
        self.bufs.drain(..)
    }
}

impl<B: StableBuf> SendList<B> {
    /// Appends all of `buf`, sent from where it lies; the list holds it.
    pub fn push_buf(&mut self, buf: B) {
        let len = buf.stable_bytes().len();
        self.push_hold(buf, 0, len);
    }

    /// Appends bytes `off..off + len` of `buf` (clamped to its length),
    /// sent from where they lie; the list holds `buf`.
    pub fn push_buf_range(&mut self, buf: B, off: usize, len: usize) {
        let have = buf.stable_bytes().len();
        let off = off.min(have);
        let len = len.min(have - off);
        self.push_hold(buf, off, len);
    }

    fn push_hold(&mut self, buf: B, off: usize, len: usize) {
        let idx = self.bufs.len();
        self.bufs.push(buf);
        if len > 0 {
            self.segs.push(Seg::Buf { idx, off, len });
            self.len += len;
        }
    }

    /// Describes the list's bytes in `iov` (left untouched until the list
    /// leaves the kernel).
    fn build_iov(&mut self) {
        self.iov.clear();
        for seg in &self.segs {
            let s: &[u8] = match *seg {
                Seg::Bytes { off, len } => &self.bytes[off..off + len],
                Seg::Buf { idx, off, len } => &self.bufs[idx].stable_bytes()[off..off + len],
            };
            self.iov.push(libc::iovec {
                iov_base: s.as_ptr().cast_mut().cast(),
                iov_len: s.len(),
            });
        }
    }
}

/// A socket attached to a [`SockRing`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SockId(u32);

impl SockId {
    /// The socket's index in its ring (small, reused after
    /// [`SockEvent::Closed`]).
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// What [`SockRing::reap`] reports.
#[derive(Debug)]
pub enum SockEvent<'a, B> {
    /// Bytes arrived on `sock`, in stream order. `data` lies in a provided
    /// buffer that goes back to the kernel when the callback returns: copy
    /// what must outlive it.
    Recv {
        /// The socket.
        sock: SockId,
        /// The bytes.
        data: &'a [u8],
    },
    /// `sock`'s receive ended and is not armed again: `None` at end of
    /// stream (the peer shut its side down), else the error.
    RecvEnd {
        /// The socket.
        sock: SockId,
        /// `None` at end of stream, else why the receive failed.
        error: Option<io::Error>,
    },
    /// `sock`'s send finished: every byte of `list` is out (`Ok` with its
    /// length) or the socket failed. The list and its buffers come back.
    Sent {
        /// The socket.
        sock: SockId,
        /// The list given to [`SockRing::send`].
        list: SendList<B>,
        /// Bytes written (the list's length), or the socket's error.
        result: io::Result<usize>,
    },
    /// `sock`, [`close`](SockRing::close)d, is gone: the kernel holds
    /// nothing of it and its fd is closed.
    Closed {
        /// The socket (its id may be reused from now on).
        sock: SockId,
    },
}

/// Counters of a [`SockRing`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SockRingStats {
    /// `io_uring_enter` calls made by [`SockRing::submit`].
    pub enters: u64,
    /// Receive completions carrying bytes.
    pub recvs: u64,
    /// Receives armed again after the kernel ended them (no provided
    /// buffer left, or a multishot limit).
    pub recv_rearms: u64,
    /// Sends handed to the kernel ([`SockRing::send`]).
    pub sends: u64,
    /// Short send completions continued from where they stopped.
    pub send_continues: u64,
}

/// The provided-buffer ring: `count` entries followed by `count` buffers
/// of `buf_size` bytes, in one page-aligned allocation.
struct BufRing {
    // INVARIANT: `base` is a live allocation of `layout` (page aligned,
    // `count * size_of::<BufRingEntry>()` entry bytes rounded up to a page,
    // then `count * buf_size` buffer bytes) until drop. The kernel reads
    // the entries between its head and the published tail and writes into
    // the buffers they name; a buffer handed to user space by a completion
    // is not in the ring until `push` puts it back, so user space may read
    // it and rewrite its entry slot.
    base: NonNull<u8>,
    layout: Layout,
    entries_len: usize,
    count: u16,
    buf_size: u32,
    /// The next tail to publish.
    tail: u16,
    /// Set when the kernel might still use the memory: never freed.
    leak: bool,
}

impl BufRing {
    fn new(count: u16, buf_size: u32) -> Result<BufRing, SockRingError> {
        let entries_len =
            (usize::from(count) * std::mem::size_of::<BufRingEntry>()).next_multiple_of(PAGE);
        let total = entries_len + usize::from(count) * buf_size as usize;
        let layout = Layout::from_size_align(total, PAGE)
            .map_err(|_| SockRingError::InvalidConfig("provided buffers too large"))?;
        // SAFETY: `layout` has a non-zero size (at least one page of entries).
        let ptr = unsafe { alloc_zeroed(layout) };
        let base = NonNull::new(ptr).ok_or(SockRingError::NoMemory(total))?;
        let mut ring = BufRing {
            base,
            layout,
            entries_len,
            count,
            buf_size,
            tail: 0,
            leak: false,
        };
        for bid in 0..count {
            ring.push(bid);
        }
        ring.publish();
        Ok(ring)
    }

    fn entries(&self) -> *mut BufRingEntry {
        self.base.as_ptr().cast()
    }

    fn buf_ptr(&self, bid: u16) -> *mut u8 {
        let off = self.entries_len + usize::from(bid) * self.buf_size as usize;
        // The offset stays inside the allocation for `bid < count`.
        self.base.as_ptr().wrapping_add(off)
    }

    /// Queues buffer `bid` at the tail (seen by the kernel once published).
    fn push(&mut self, bid: u16) {
        if bid >= self.count {
            log::error!("io_uring socket ring: provided buffer id {bid} out of range");
            return;
        }
        let slot = usize::from(self.tail & (self.count - 1));
        // SAFETY: `slot < count`, inside the entry area (INVARIANT). The
        // entry is free: at most `count` buffers exist, `bid` is not in the
        // ring, so the kernel has consumed this slot and does not read it
        // until the tail is published past it. The setters leave the
        // `resv` field (the tail, in entry 0) alone.
        let e = unsafe { &mut *self.entries().add(slot) };
        e.set_addr(self.buf_ptr(bid) as u64);
        e.set_len(self.buf_size);
        e.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    /// Publishes the entries pushed so far to the kernel.
    fn publish(&self) {
        // SAFETY: `entries()` is the first entry of the ring (INVARIANT), so
        // `tail` is the ring's shared tail field: a `u16`, 2-aligned (the
        // entry area is page aligned), written by no one but us and read by
        // the kernel, hence accessed atomically.
        let tail = unsafe { AtomicU16::from_ptr(BufRingEntry::tail(self.entries()).cast_mut()) };
        tail.store(self.tail, Ordering::Release);
    }

    /// The first `len` bytes of buffer `bid`, which a completion just
    /// handed to user space.
    fn data(&self, bid: u16, len: usize) -> &[u8] {
        if bid >= self.count {
            return &[];
        }
        let len = len.min(self.buf_size as usize);
        // SAFETY: buffer `bid` lies inside the allocation (INVARIANT); the
        // kernel filled `len` bytes and does not write it again until
        // `push(bid)`, which needs `&mut self` (so not while this borrow lives).
        unsafe { std::slice::from_raw_parts(self.buf_ptr(bid), len) }
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        if !self.leak {
            // SAFETY: allocated in `new` with `layout`; the ring unregistered
            // it (or never registered it), so the kernel no longer uses it.
            unsafe { dealloc(self.base.as_ptr(), self.layout) };
        }
    }
}

/// The send state of one socket, boxed so `msg` keeps its address.
struct SendSlot<B> {
    /// The list in the kernel, if any.
    list: Option<SendList<B>>,
    msg: libc::msghdr,
    /// First iovec not fully written.
    next: usize,
    /// Bytes written so far.
    sent: usize,
    /// A `SENDMSG` for it is in the submission or completion path (not
    /// waiting for a queue slot).
    in_kernel: bool,
}

impl<B> SendSlot<B> {
    fn new() -> Box<SendSlot<B>> {
        Box::new(SendSlot {
            list: None,
            // SAFETY: an all-zero `msghdr` is valid: null pointers, zero lengths.
            msg: unsafe { std::mem::zeroed() },
            next: 0,
            sent: 0,
            in_kernel: false,
        })
    }

    /// Skips the first `n` bytes of the iovecs not yet written.
    fn advance(&mut self, mut n: usize) {
        let Some(list) = self.list.as_mut() else {
            return;
        };
        while n > 0 && self.next < list.iov.len() {
            let v = &mut list.iov[self.next];
            if n >= v.iov_len {
                n -= v.iov_len;
                self.next += 1;
            } else {
                v.iov_base = v.iov_base.cast::<u8>().wrapping_add(n).cast();
                v.iov_len -= n;
                n = 0;
            }
        }
    }
}

struct Sock<B> {
    fd: OwnedFd,
    /// A multishot receive is in the kernel.
    recv_armed: bool,
    /// End of stream or an error was reported: never armed again.
    recv_ended: bool,
    closing: bool,
    send: Box<SendSlot<B>>,
}

impl<B> Sock<B> {
    fn idle(&self) -> bool {
        !self.recv_armed && self.send.list.is_none()
    }
}

/// A per-core io_uring for stream sockets (`!Send`): attach sockets, queue
/// one [`SendList`] per socket at a time, [`submit`](Self::submit) once
/// per poll, [`reap`](Self::reap) completions without blocking.
///
/// - **Receive**: every attached socket has one multishot receive
///   (`IORING_OP_RECV` with `IORING_RECV_MULTISHOT`) armed into a ring of
///   provided buffers (`IORING_REGISTER_PBUF_RING`) shared by all sockets
///   of the ring. Each completion names the buffer the bytes landed in;
///   [`reap`](SockRing::reap) hands them to the caller as a borrowed
///   slice and gives the buffer back to the kernel when the callback
///   returns. A receive the kernel ends (no buffer left, `ENOBUFS`) is
///   armed again; end of stream or an error is reported once
///   ([`SockEvent::RecvEnd`]).
/// - **Send**: at most one send per socket is in the kernel: a
///   [`SendList`] (bytes copied into it, and owned buffers sent where they
///   lie) goes out as one `IORING_OP_SENDMSG` with its iovecs. A short
///   send is continued from where it stopped, so the caller hears of the
///   list only when every byte is out or the socket failed
///   ([`SockEvent::Sent`], handing the list and its buffers back).
/// - **Submission**: the caller queues work, then calls
///   [`submit`](SockRing::submit) once per poll: one `io_uring_enter` when
///   something is queued or the kernel has deferred work to run, none
///   otherwise. With [`TaskRun::Defer`] (the default) the kernel runs a
///   socket's receive only inside that call, so an idle poll makes no
///   system call at all.
///
/// The ring owns its sockets ([`attach`](SockRing::attach) takes an
/// [`OwnedFd`]); [`close`](SockRing::close) shuts one down and reports
/// [`SockEvent::Closed`] once the kernel holds nothing of it. Dropping the
/// ring shuts every socket down and waits (a bounded time) for the kernel
/// to let go of the buffers; memory it may still touch is leaked, never
/// freed under it.
///
/// ```no_run
/// use std::net::{TcpListener, TcpStream};
/// use pollux_reactor::io::{SendList, SockEvent, SockRing, SockRingConfig};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let l = TcpListener::bind("127.0.0.1:0")?;
/// let _client = TcpStream::connect(l.local_addr()?)?;
/// let mut ring: SockRing<Vec<u8>> = SockRing::new(SockRingConfig::default())?;
/// let id = ring.attach(l.accept()?.0.into())?;
/// let mut list = SendList::new();
/// list.push_bytes(b"hello");
/// ring.send(id, list).map_err(|e| e.to_string())?;
/// loop {
///     ring.submit()?;
///     ring.reap(64, |ev| match ev {
///         SockEvent::Recv { data, .. } => println!("{} bytes", data.len()),
///         SockEvent::Sent { result, .. } => println!("sent {result:?}"),
///         _ => {}
///     });
/// #   break;
/// }
/// # Ok(())
/// # }
/// ```
pub struct SockRing<B: StableBuf> {
    // INVARIANT: every SQE pushed to `ring` references only (a) the
    // provided buffers of `bufs`, registered as group `BGID`, alive until
    // the ring unregisters them in drop, after every receive ended, or
    // leaked; (b) the boxed `SendSlot` of a socket in `socks` whose `list`
    // is `Some`: its `msg`, the list's iovecs and the bytes they describe
    // (the list's own bytes and held buffers), none of which is moved,
    // modified or dropped until the send's final completion takes the
    // list out. A socket stays in `socks` while any of its SQEs may be in
    // the kernel (`!idle()`). `ring` is declared first so it is closed
    // before `bufs` and `socks` are dropped.
    ring: IoUring,
    bufs: BufRing,
    socks: Slab<Sock<B>>,
    /// Receives to arm and sends to (re)push, waiting for a queue slot.
    todo: Vec<(usize, u64)>,
    /// Sockets closed with nothing in flight, reported by the next reap.
    closed: Vec<SockId>,
    stats: SockRingStats,
    _not_send: PhantomData<Rc<()>>,
}

impl<B: StableBuf> fmt::Debug for SockRing<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SockRing")
            .field("sockets", &self.socks.len())
            .field("bufs", &self.bufs.count)
            .field("buf_size", &self.bufs.buf_size)
            .field("stats", &self.stats)
            .finish()
    }
}

impl<B: StableBuf> SockRing<B> {
    /// Sets up a ring and registers its provided buffers (control path).
    ///
    /// # Errors
    /// [`SockRingError::InvalidConfig`], [`SockRingError::Setup`] when
    /// `io_uring_setup` fails, [`SockRingError::NoMemory`],
    /// [`SockRingError::BufRing`] when the kernel has no provided-buffer
    /// rings (Linux < 5.19).
    pub fn new(cfg: SockRingConfig) -> Result<SockRing<B>, SockRingError> {
        cfg.validate()?;
        let mut b = IoUring::builder();
        b.setup_cqsize(cfg.entries.saturating_mul(4));
        match cfg.taskrun {
            TaskRun::Interrupt => {}
            TaskRun::Coop => {
                b.setup_coop_taskrun().setup_taskrun_flag();
            }
            TaskRun::Defer => {
                b.setup_defer_taskrun()
                    .setup_single_issuer()
                    .setup_taskrun_flag();
            }
        }
        let ring = b.build(cfg.entries).map_err(SockRingError::Setup)?;
        let bufs = BufRing::new(cfg.bufs, cfg.buf_size)?;
        // SAFETY: `bufs` holds `cfg.bufs` page-aligned entries that stay
        // allocated until the ring unregisters them (drop) or forever.
        unsafe {
            ring.submitter()
                .register_buf_ring_with_flags(bufs.entries() as u64, cfg.bufs, BGID, 0)
        }
        .map_err(SockRingError::BufRing)?;
        Ok(SockRing {
            ring,
            bufs,
            socks: Slab::new(),
            todo: Vec::new(),
            closed: Vec::new(),
            stats: SockRingStats::default(),
            _not_send: PhantomData,
        })
    }

    /// The counters.
    pub fn stats(&self) -> SockRingStats {
        self.stats
    }

    /// Attached sockets (closing ones included).
    pub fn sockets(&self) -> usize {
        self.socks.len()
    }

    /// Takes `sock` (a connected stream socket, blocking or not) and arms
    /// its receive (submitted by the next [`submit`](Self::submit)).
    ///
    /// # Errors
    /// [`SockRingError::Submit`] when the submission queue is full and
    /// submitting failed (the socket is dropped).
    pub fn attach(&mut self, sock: OwnedFd) -> Result<SockId, SockRingError> {
        let key = self.socks.insert(Sock {
            fd: sock,
            recv_armed: false,
            recv_ended: false,
            closing: false,
            send: SendSlot::new(),
        });
        if let Err(e) = self.push_recv(key) {
            self.socks.remove(key);
            return Err(SockRingError::Submit(e));
        }
        Ok(SockId(key as u32))
    }

    /// `sock`'s fd (for socket options), `None` when it is unknown.
    pub fn fd(&self, sock: SockId) -> Option<BorrowedFd<'_>> {
        self.socks.get(sock.index()).map(|s| s.fd.as_fd())
    }

    /// Whether a send is in the kernel on `sock`.
    pub fn is_sending(&self, sock: SockId) -> bool {
        self.socks
            .get(sock.index())
            .is_some_and(|s| s.send.list.is_some())
    }

    /// Queues `list` on `sock` (submitted by the next
    /// [`submit`](Self::submit)); [`SockEvent::Sent`] hands it back.
    ///
    /// # Errors
    /// [`SendError::Busy`] while a send is in flight on `sock`,
    /// [`SendError::NoSocket`], [`SendError::Submit`]; each with the list.
    pub fn send(&mut self, sock: SockId, mut list: SendList<B>) -> Result<(), SendError<B>> {
        let key = sock.index();
        let Some(s) = self.socks.get_mut(key) else {
            return Err(SendError::NoSocket(list));
        };
        if s.closing {
            return Err(SendError::NoSocket(list));
        }
        if s.send.list.is_some() {
            return Err(SendError::Busy(list));
        }
        list.build_iov();
        let st = &mut s.send;
        st.list = Some(list);
        st.next = 0;
        st.sent = 0;
        st.in_kernel = false;
        if let Err(e) = self.push_send(key) {
            let list = self
                .socks
                .get_mut(key)
                .and_then(|s| s.send.list.take())
                .unwrap_or_default();
            return Err(SendError::Submit(list, e));
        }
        self.stats.sends += 1;
        Ok(())
    }

    /// Shuts `sock` down (both directions) and, once the kernel holds
    /// nothing of it, closes it and reports [`SockEvent::Closed`] (an
    /// in-flight send reports [`SockEvent::Sent`] with an error first).
    ///
    /// # Errors
    /// [`SockRingError::NoSocket`] when `sock` is unknown or already closing.
    pub fn close(&mut self, sock: SockId) -> Result<(), SockRingError> {
        let key = sock.index();
        let Some(s) = self.socks.get_mut(key) else {
            return Err(SockRingError::NoSocket(sock));
        };
        if s.closing {
            return Err(SockRingError::NoSocket(sock));
        }
        s.closing = true;
        // Ends the receive (end of stream) and any send waiting for room.
        // ENOTCONN (never connected, or reset) leaves nothing to wake.
        let _ = rustix::net::shutdown(&s.fd, rustix::net::Shutdown::Both);
        if s.idle() {
            self.socks.remove(key);
            self.closed.push(sock);
        }
        Ok(())
    }

    /// Submits what was queued since the last call, and runs the kernel's
    /// deferred work: one `io_uring_enter` when there is either, no system
    /// call otherwise. Call once per poll. Returns the entries submitted.
    ///
    /// # Errors
    /// What `io_uring_enter` returns (`EINTR` is retried; `EBUSY` and
    /// `EAGAIN`, the kernel short of room, count as nothing submitted).
    pub fn submit(&mut self) -> io::Result<usize> {
        self.retry_todo();
        let (queued, taskrun) = {
            let sq = self.ring.submission();
            (sq.len(), sq.taskrun())
        };
        if queued == 0 && !taskrun {
            return Ok(0);
        }
        loop {
            self.stats.enters += 1;
            match self.ring.submit() {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY) | Some(libc::EAGAIN)) => {
                    return Ok(0)
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Handles up to `max` completions (and the sockets closed with nothing
    /// in flight), calling `on` for each event, without blocking. Receive
    /// buffers go back to the kernel as each callback returns; receives and
    /// continued sends are queued for the next [`submit`](Self::submit).
    /// Returns the completions and closes handled.
    pub fn reap(&mut self, max: usize, mut on: impl FnMut(SockEvent<'_, B>)) -> usize {
        let mut n = 0;
        while n < max {
            let Some(sock) = self.closed.pop() else {
                break;
            };
            on(SockEvent::Closed { sock });
            n += 1;
        }
        let SockRing {
            ring,
            bufs,
            socks,
            todo,
            stats,
            ..
        } = self;
        let mut cq = ring.completion();
        while n < max {
            let Some(cqe) = cq.next() else {
                break;
            };
            n += 1;
            let ud = cqe.user_data();
            let key = (ud >> 2) as usize;
            let Some(s) = socks.get_mut(key) else {
                log::error!("io_uring socket ring: completion for unknown socket {ud:#x}");
                continue;
            };
            let sock = SockId(key as u32);
            let res = cqe.result();
            let flags = cqe.flags();
            match ud & 3 {
                RECV => {
                    let more = cqueue::more(flags);
                    if !more {
                        s.recv_armed = false;
                    }
                    let bid = cqueue::buffer_select(flags);
                    if res > 0 {
                        stats.recvs += 1;
                        match bid {
                            Some(bid) => {
                                on(SockEvent::Recv {
                                    sock,
                                    data: bufs.data(bid, res as usize),
                                });
                                bufs.push(bid);
                            }
                            None => log::error!(
                                "io_uring socket ring: receive of {res} bytes without a buffer"
                            ),
                        }
                        if !more && !s.closing {
                            stats.recv_rearms += 1;
                            todo.push((key, RECV));
                        }
                    } else {
                        if let Some(bid) = bid {
                            bufs.push(bid);
                        }
                        if res == -libc::ENOBUFS && !more && !s.closing {
                            stats.recv_rearms += 1;
                            todo.push((key, RECV));
                        } else if !more && !s.recv_ended {
                            s.recv_ended = true;
                            let error = (res < 0).then(|| io::Error::from_raw_os_error(-res));
                            on(SockEvent::RecvEnd { sock, error });
                        }
                    }
                }
                SEND => {
                    let st = &mut s.send;
                    st.in_kernel = false;
                    let total = st.list.as_ref().map_or(0, SendList::len);
                    let result = if res < 0 {
                        Err(io::Error::from_raw_os_error(-res))
                    } else {
                        st.sent += res as usize;
                        if st.sent >= total {
                            Ok(st.sent)
                        } else if res == 0 || s.closing {
                            Err(io::ErrorKind::WriteZero.into())
                        } else {
                            st.advance(res as usize);
                            stats.send_continues += 1;
                            todo.push((key, SEND));
                            continue;
                        }
                    };
                    if let Some(list) = st.list.take() {
                        on(SockEvent::Sent { sock, list, result });
                    }
                }
                _ => log::error!("io_uring socket ring: unknown completion tag {ud:#x}"),
            }
            if s.closing && s.idle() {
                socks.remove(key);
                on(SockEvent::Closed { sock });
            }
        }
        drop(cq);
        bufs.publish();
        n
    }

    /// Pushes the receives and sends that waited for a queue slot.
    fn retry_todo(&mut self) {
        while let Some(&(key, what)) = self.todo.last() {
            let res = if what == RECV {
                self.push_recv(key)
            } else {
                self.push_send(key)
            };
            match res {
                Ok(()) => {
                    self.todo.pop();
                }
                Err(e) => {
                    log::warn!("io_uring socket ring: queue full: {e}");
                    return;
                }
            }
        }
    }

    /// Arms `key`'s multishot receive (nothing when it is armed, ended or
    /// closing).
    fn push_recv(&mut self, key: usize) -> io::Result<()> {
        let Some(s) = self.socks.get(key) else {
            return Ok(());
        };
        if s.recv_armed || s.recv_ended || s.closing {
            return Ok(());
        }
        let entry = opcode::RecvMulti::new(types::Fd(s.fd.as_raw_fd()), BGID)
            .build()
            .user_data(((key as u64) << 2) | RECV);
        self.push(&entry)?;
        if let Some(s) = self.socks.get_mut(key) {
            s.recv_armed = true;
        }
        Ok(())
    }

    /// Pushes a `SENDMSG` for the unwritten rest of `key`'s list.
    fn push_send(&mut self, key: usize) -> io::Result<()> {
        let Some(s) = self.socks.get_mut(key) else {
            return Ok(());
        };
        let st = &mut *s.send;
        let Some(list) = st.list.as_ref() else {
            return Ok(());
        };
        if st.in_kernel {
            return Ok(());
        }
        let rest = &list.iov[st.next.min(list.iov.len())..];
        st.msg.msg_iov = rest.as_ptr().cast_mut();
        st.msg.msg_iovlen = rest.len().min(MAX_IOV) as _;
        let entry = opcode::SendMsg::new(types::Fd(s.fd.as_raw_fd()), &st.msg)
            .flags(libc::MSG_NOSIGNAL as u32)
            .build()
            .user_data(((key as u64) << 2) | SEND);
        self.push(&entry)?;
        if let Some(s) = self.socks.get_mut(key) {
            s.send.in_kernel = true;
        }
        Ok(())
    }

    /// Pushes one entry, submitting first when the queue is full.
    fn push(&mut self, entry: &squeue::Entry) -> io::Result<()> {
        for _ in 0..2 {
            // SAFETY: the entry references only memory the INVARIANT keeps
            // alive and in place until its final completion: the provided
            // buffers, or the socket's boxed send slot and its list.
            if unsafe { self.ring.submission().push(entry) }.is_ok() {
                return Ok(());
            }
            self.stats.enters += 1;
            self.ring.submit()?;
        }
        Err(io::Error::from_raw_os_error(libc::EBUSY))
    }

    /// Waits up to `left` for one completion (drop path).
    fn wait_one(&mut self, left: Duration) -> io::Result<()> {
        let ts = types::Timespec::from(left);
        let args = types::SubmitArgs::new().timespec(&ts);
        match self.ring.submitter().submit_with_args(1, &args) {
            Ok(_) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::ETIME) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl<B: StableBuf> Drop for SockRing<B> {
    fn drop(&mut self) {
        for (_, s) in &mut self.socks {
            if !s.closing {
                s.closing = true;
                let _ = rustix::net::shutdown(&s.fd, rustix::net::Shutdown::Both);
            }
        }
        // Entries waiting for a slot never reached the kernel.
        for (key, what) in std::mem::take(&mut self.todo) {
            if let Some(s) = self.socks.get_mut(key) {
                if what == SEND && !s.send.in_kernel {
                    s.send.list = None;
                }
            }
        }
        let deadline = Instant::now() + DROP_WAIT;
        loop {
            self.socks.retain(|_, s| !s.idle());
            if self.socks.is_empty() {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.wait_one(left).is_err() {
                break;
            }
            self.reap(usize::MAX, |_| {});
        }
        let clean =
            self.socks.is_empty() && self.ring.submitter().unregister_buf_ring(BGID).is_ok();
        if !clean {
            log::error!(
                "io_uring socket ring: {} sockets still in the kernel at drop; leaking their buffers",
                self.socks.len()
            );
            self.bufs.leak = true;
            for (_, s) in std::mem::take(&mut self.socks) {
                std::mem::forget(s.send);
            }
        }
    }
}

#[cfg(test)]
mod tests;
