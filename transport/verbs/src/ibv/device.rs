//! Device context and protection domain.

use std::ffi::CStr;
use std::mem::MaybeUninit;
use std::net::Ipv4Addr;
use std::ptr::{self, NonNull};
use std::rc::Rc;
use std::sync::Arc;

use pollux_reactor::mem::DmaArena;
use rdma_sys::*;

use super::cm::{self, IbvCmId, IbvListener};
use super::cq::IbvCq;
use super::mr::IbvMr;
use super::mw::{KeyTables, MW_MAX_SEGMENTS};
use super::qp::{IbvQp, IbvSrq};
use super::{last_err, rc_err, set_nonblocking, Ibverbs};
use crate::cm::{CmAddr, ConnParam};
use crate::error::VerbsError;
use crate::provider::{Device, DeviceInfo, ProtectionDomain, QpInit};
use crate::types::{Access, AsyncEvent, DeviceCaps, FastRegMode};

/// The port every object uses (soft-RoCE and most NICs have one per device).
pub(super) const PORT: u8 = 1;

/// An open `ibv_context`, closed when the last object of the device goes.
pub(super) struct Ctx {
    // INVARIANT: a context from `ibv_open_device`, open until `drop`.
    pub(super) ctx: NonNull<ibv_context>,
    pub(super) name: String,
    pub(super) caps: DeviceCaps,
    /// The IPv4 address of the port's first IPv4-mapped GID (RoCE v2), used
    /// as the source address of outgoing connections.
    pub(super) ipv4: Option<Ipv4Addr>,
    /// MRs and memory windows by key (fast registration by window).
    pub(super) keys: KeyTables,
    /// The `wc_flags` bits that mean "invalidated an rkey" in this device's
    /// receive completions (see [`with_inv_bits`]).
    pub(super) with_inv_bits: u32,
}

/// The vendor id of the kernel's soft-RoCE driver (rxe).
const RXE_VENDOR_ID: u32 = 0x00ff_ffff;

/// The `wc_flags` bits that mean "invalidated an rkey" for a device of
/// `vendor_id`. rxe writes the kernel's `IB_WC_WITH_INVALIDATE` (bit 2)
/// into user-space completions, where bit 2 is `IBV_WC_IP_CSUM_OK` and
/// `IBV_WC_WITH_INV` is bit 3 (Linux `rxe_resp.c`, `do_complete`); rxe sets
/// no checksum flag for user space, so on rxe both bits mean invalidation.
pub(super) fn with_inv_bits(vendor_id: u32) -> u32 {
    let user = ibv_wc_flags::IBV_WC_WITH_INV.0;
    if vendor_id == RXE_VENDOR_ID {
        user | ibv_wc_flags::IBV_WC_IP_CSUM_OK.0
    } else {
        user
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: every child object holds an `Rc<Ctx>`, so none is left.
        unsafe { ibv_close_device(self.ctx.as_ptr()) };
    }
}

/// An open RDMA device (`ibv_context`).
pub struct IbvDevice {
    pub(super) ctx: Rc<Ctx>,
}

impl std::fmt::Debug for IbvDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvDevice")
            .field("name", &self.ctx.name)
            .finish_non_exhaustive()
    }
}

/// The device name of a context (`ibv_get_device_name`).
///
/// # Safety
/// `ctx` must be an open context.
pub(super) unsafe fn ctx_device_name(ctx: *mut ibv_context) -> String {
    // SAFETY: an open context points to its device, whose name is a
    // NUL-terminated string owned by libibverbs for the process' life.
    unsafe { CStr::from_ptr(ibv_get_device_name((*ctx).device)) }
        .to_string_lossy()
        .into_owned()
}

/// The devices libibverbs sees.
pub(super) fn list_devices() -> Result<Vec<DeviceInfo>, VerbsError> {
    let mut n = 0;
    // SAFETY: `n` is a valid out pointer; the list is freed below.
    let list = unsafe { ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(VerbsError::sys("ibv_get_device_list", last_err()));
    }
    let count = usize::try_from(n).unwrap_or(0);
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        // SAFETY: the list holds `n` valid device pointers.
        let dev = unsafe { *list.add(i) };
        // SAFETY: a listed device has a NUL-terminated name.
        let name = unsafe { CStr::from_ptr(ibv_get_device_name(dev)) };
        out.push(DeviceInfo {
            name: name.to_string_lossy().into_owned(),
            provider: "ibverbs",
        });
    }
    // SAFETY: the list came from ibv_get_device_list and is not used again.
    unsafe { ibv_free_device_list(list) };
    Ok(out)
}

impl IbvDevice {
    /// Open the device called `name`, query its capabilities and its IPv4
    /// address. Control path.
    ///
    /// # Errors
    /// [`VerbsError::NoDevice`], [`VerbsError::Sys`].
    pub fn open(name: &str) -> Result<IbvDevice, VerbsError> {
        let mut n = 0;
        // SAFETY: `n` is a valid out pointer; the list is freed below.
        let list = unsafe { ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(VerbsError::sys("ibv_get_device_list", last_err()));
        }
        let mut raw = ptr::null_mut();
        for i in 0..usize::try_from(n).unwrap_or(0) {
            // SAFETY: the list holds `n` valid device pointers.
            let dev = unsafe { *list.add(i) };
            // SAFETY: a listed device has a NUL-terminated name.
            let dname = unsafe { CStr::from_ptr(ibv_get_device_name(dev)) };
            if dname.to_bytes() == name.as_bytes() {
                // SAFETY: `dev` is a listed device; opening it while the
                // list is alive is the documented use.
                raw = unsafe { ibv_open_device(dev) };
                if raw.is_null() {
                    let e = last_err();
                    // SAFETY: list from ibv_get_device_list, not used again.
                    unsafe { ibv_free_device_list(list) };
                    return Err(VerbsError::sys("ibv_open_device", e));
                }
                break;
            }
        }
        // SAFETY: as above; an open context stays valid after the free.
        unsafe { ibv_free_device_list(list) };
        let ctx = NonNull::new(raw).ok_or_else(|| VerbsError::NoDevice(name.to_string()))?;
        // From here on `Ctx::drop` closes the context on every error path.
        let mut dev = Ctx {
            ctx,
            name: name.to_string(),
            caps: empty_caps(),
            ipv4: None,
            keys: KeyTables::default(),
            with_inv_bits: ibv_wc_flags::IBV_WC_WITH_INV.0,
        };
        let (caps, vendor_id) = query_caps(ctx)?;
        dev.caps = caps;
        dev.with_inv_bits = with_inv_bits(vendor_id);
        dev.ipv4 = find_ipv4(ctx);
        // SAFETY: the context is open; async_fd is its async event fd.
        let async_fd = unsafe { (*ctx.as_ptr()).async_fd };
        set_nonblocking(async_fd).map_err(|e| VerbsError::sys("async fd O_NONBLOCK", e))?;
        Ok(IbvDevice { ctx: Rc::new(dev) })
    }

    /// The IPv4 address of the device's port (from its GID table), if any.
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        self.ctx.ipv4
    }
}

fn empty_caps() -> DeviceCaps {
    DeviceCaps {
        max_qp: 0,
        max_qp_wr: 0,
        max_sge: 0,
        max_cqe: 0,
        max_srq_wr: 0,
        max_srq_sge: 0,
        max_inline_data: 0,
        max_mr_size: 0,
        max_msg_size: 0,
        max_qp_rd_atom: 0,
        max_qp_init_rd_atom: 0,
        max_fast_reg_pages: 0,
        mem_mgt_extensions: false,
        integrity: false,
        fast_reg: FastRegMode::None,
    }
}

fn to_u32(v: i32) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

/// The device's capabilities and its vendor id.
fn query_caps(ctx: NonNull<ibv_context>) -> Result<(DeviceCaps, u32), VerbsError> {
    let mut attr = MaybeUninit::<ibv_device_attr>::zeroed();
    // SAFETY: open context, `attr` is a writable ibv_device_attr.
    let rc = unsafe { ibv_query_device(ctx.as_ptr(), attr.as_mut_ptr()) };
    if rc != 0 {
        return Err(VerbsError::sys("ibv_query_device", rc_err(rc)));
    }
    // SAFETY: all-zero is a valid ibv_device_attr, and the call filled it.
    let attr = unsafe { attr.assume_init() };
    let mut port = MaybeUninit::<ibv_port_attr>::zeroed();
    // SAFETY: open context, `port` is a writable ibv_port_attr.
    let rc = unsafe { ___ibv_query_port(ctx.as_ptr(), PORT, port.as_mut_ptr()) };
    if rc != 0 {
        return Err(VerbsError::sys("ibv_query_port", rc_err(rc)));
    }
    // SAFETY: zero-initialised and filled by the call.
    let port = unsafe { port.assume_init() };
    let windows = probe_type2_window(ctx);
    let fast_reg = if windows {
        FastRegMode::MemoryWindow {
            max_windows: to_u32(attr.max_mw),
            // rxe_req.c (Linux 6.1): `req_retry` rewinds the requester to
            // the oldest unacknowledged WR and `rxe_requester` carries out
            // every local operation it meets again (`rxe_do_local_ops`).
            binds_replayed_on_retry: attr.vendor_id == RXE_VENDOR_ID,
        }
    } else {
        FastRegMode::None
    };
    let caps = DeviceCaps {
        max_qp: to_u32(attr.max_qp),
        max_qp_wr: to_u32(attr.max_qp_wr),
        max_sge: to_u32(attr.max_sge),
        max_cqe: to_u32(attr.max_cqe),
        max_srq_wr: to_u32(attr.max_srq_wr),
        max_srq_sge: to_u32(attr.max_srq_sge),
        max_inline_data: probe_inline(ctx),
        max_mr_size: attr.max_mr_size,
        max_msg_size: port.max_msg_sz,
        max_qp_rd_atom: to_u32(attr.max_qp_rd_atom),
        max_qp_init_rd_atom: to_u32(attr.max_qp_init_rd_atom),
        // User-space verbs have no REG_MR work request: fast registration
        // binds type-2 memory windows where the device has them. No
        // signature offload: the upper layers use their software PI path.
        max_fast_reg_pages: if windows { MW_MAX_SEGMENTS } else { 0 },
        mem_mgt_extensions: windows,
        integrity: false,
        fast_reg,
    };
    Ok((caps, attr.vendor_id))
}

/// Whether the device allocates type-2 memory windows (allocate and free
/// one on a throw-away PD, once): the capability flags alone are not
/// reported alike by every kernel and provider.
fn probe_type2_window(ctx: NonNull<ibv_context>) -> bool {
    // SAFETY: open context.
    let pd = unsafe { ibv_alloc_pd(ctx.as_ptr()) };
    if pd.is_null() {
        return false;
    }
    // SAFETY: live PD of the context.
    let mw = unsafe { ibv_alloc_mw(pd, ibv_mw_type::IBV_MW_TYPE_2) };
    let ok = match mw {
        Some(mw) if !mw.is_null() => {
            // SAFETY: just allocated, never bound, not used again.
            unsafe { ibv_dealloc_mw(mw) };
            true
        }
        _ => false,
    };
    // SAFETY: its only child (the window) is gone.
    unsafe { ibv_dealloc_pd(pd) };
    ok
}

/// `ibv_query_device` does not report the inline limit: find the largest
/// power of two a throw-away QP accepts (a few system calls, once).
fn probe_inline(ctx: NonNull<ibv_context>) -> u32 {
    // SAFETY: open context.
    let pd = unsafe { ibv_alloc_pd(ctx.as_ptr()) };
    if pd.is_null() {
        return 0;
    }
    // SAFETY: open context; no channel, vector 0.
    let cq = unsafe { ibv_create_cq(ctx.as_ptr(), 1, ptr::null_mut(), ptr::null_mut(), 0) };
    let mut best = 0;
    if !cq.is_null() {
        for want in [1024u32, 512, 256, 128, 64] {
            // SAFETY: all-zero is a valid ibv_qp_init_attr.
            let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
            init.send_cq = cq;
            init.recv_cq = cq;
            init.qp_type = ibv_qp_type::IBV_QPT_RC;
            init.cap = ibv_qp_cap {
                max_send_wr: 1,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: want,
            };
            // SAFETY: `pd` and `cq` are live objects of this context.
            let qp = unsafe { ibv_create_qp(pd, &mut init) };
            if !qp.is_null() {
                best = init.cap.max_inline_data.max(want);
                // SAFETY: the QP was just created and is not used again.
                unsafe { ibv_destroy_qp(qp) };
                break;
            }
        }
        // SAFETY: its only QP is destroyed.
        unsafe { ibv_destroy_cq(cq) };
    }
    // SAFETY: its children are destroyed.
    unsafe { ibv_dealloc_pd(pd) };
    best
}

/// The first IPv4-mapped GID (`::ffff:a.b.c.d`) of the port.
fn find_ipv4(ctx: NonNull<ibv_context>) -> Option<Ipv4Addr> {
    for index in 0..16 {
        let mut gid = MaybeUninit::<ibv_gid>::zeroed();
        // SAFETY: open context, `gid` is a writable ibv_gid.
        let rc = unsafe { ibv_query_gid(ctx.as_ptr(), PORT, index, gid.as_mut_ptr()) };
        if rc != 0 {
            break;
        }
        // SAFETY: zero-initialised and filled; `raw` covers the whole union.
        let raw = unsafe { gid.assume_init().raw };
        if raw[..10].iter().all(|&b| b == 0) && raw[10] == 0xff && raw[11] == 0xff {
            return Some(Ipv4Addr::new(raw[12], raw[13], raw[14], raw[15]));
        }
    }
    None
}

impl Device<Ibverbs> for IbvDevice {
    fn name(&self) -> &str {
        &self.ctx.name
    }

    fn caps(&self) -> &DeviceCaps {
        &self.ctx.caps
    }

    fn alloc_pd(&self) -> Result<IbvPd, VerbsError> {
        // SAFETY: open context.
        let pd = unsafe { ibv_alloc_pd(self.ctx.ctx.as_ptr()) };
        let pd = NonNull::new(pd).ok_or_else(|| VerbsError::sys("ibv_alloc_pd", last_err()))?;
        Ok(IbvPd {
            inner: Rc::new(PdInner {
                pd,
                ctx: self.ctx.clone(),
            }),
        })
    }

    fn create_cq(&self, depth: u32) -> Result<IbvCq, VerbsError> {
        IbvCq::create(&self.ctx, depth)
    }

    fn listen(&self, addr: &CmAddr, backlog: u32) -> Result<IbvListener, VerbsError> {
        cm::listen(&self.ctx, addr, backlog)
    }

    fn connect(
        &self,
        addr: &CmAddr,
        qp: &IbvQp,
        param: &ConnParam<'_>,
    ) -> Result<IbvCmId, VerbsError> {
        cm::connect(&self.ctx, addr, qp, param)
    }

    fn poll_async_event(&self) -> Option<AsyncEvent> {
        let ctx = self.ctx.ctx.as_ptr();
        loop {
            let mut ev = MaybeUninit::<ibv_async_event>::zeroed();
            // SAFETY: open context whose async fd is non-blocking; `ev` is a
            // writable ibv_async_event.
            if unsafe { ibv_get_async_event(ctx, ev.as_mut_ptr()) } != 0 {
                return None; // EAGAIN: nothing pending
            }
            let p = ev.as_mut_ptr();
            // Read the type as a raw integer: a value unknown to our bindings
            // must not become an invalid Rust enum.
            // SAFETY: `event_type` is a C enum (4 bytes) filled by the call.
            let kind = unsafe { ptr::addr_of!((*p).event_type).cast::<u32>().read() };
            // SAFETY: the element union holds the object the event is about;
            // the object cannot be destroyed before the event is acked below.
            let out = unsafe {
                let el = ptr::addr_of!((*p).element);
                let qp_num = || (*(*el).qp).qp_num;
                match kind {
                    0 => Some(AsyncEvent::CqErr {
                        cq_num: (*(*el).cq).handle,
                    }),
                    1 | 2 => Some(AsyncEvent::QpFatal { qp_num: qp_num() }),
                    3 => Some(AsyncEvent::QpAccessErr { qp_num: qp_num() }),
                    15 => Some(AsyncEvent::SrqLimitReached {
                        srq_num: (*(*el).srq).handle,
                    }),
                    16 => Some(AsyncEvent::QpLastWqeReached { qp_num: qp_num() }),
                    _ => None,
                }
            };
            // SAFETY: the event came from ibv_get_async_event, acked once.
            unsafe { ibv_ack_async_event(p) };
            if out.is_some() {
                return out;
            }
        }
    }
}

/// A protection domain, freed when its last MR/SRQ/QP is gone.
pub(super) struct PdInner {
    // INVARIANT: allocated on `ctx`, deallocated in `drop` only.
    pub(super) pd: NonNull<ibv_pd>,
    pub(super) ctx: Rc<Ctx>,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: children hold an `Rc<PdInner>`, so none is left.
        unsafe { ibv_dealloc_pd(self.pd.as_ptr()) };
    }
}

/// A protection domain (`ibv_pd`).
pub struct IbvPd {
    pub(super) inner: Rc<PdInner>,
}

impl std::fmt::Debug for IbvPd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvPd")
            .field("device", &self.inner.ctx.name)
            .finish_non_exhaustive()
    }
}

impl ProtectionDomain<Ibverbs> for IbvPd {
    fn reg_mr(
        &self,
        arena: &Arc<DmaArena>,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<IbvMr, VerbsError> {
        IbvMr::register(&self.inner, arena, offset, len, access)
    }

    fn alloc_fast_reg_mr(&self, max_segments: u32) -> Result<IbvMr, VerbsError> {
        match self.inner.ctx.caps.fast_reg {
            FastRegMode::MemoryWindow { .. } => {
                if max_segments == 0 || max_segments > MW_MAX_SEGMENTS {
                    return Err(VerbsError::InvalidArgument(
                        "fast-reg segments 0 or above max_fast_reg_pages",
                    ));
                }
                IbvMr::alloc_window(&self.inner)
            }
            _ => Err(VerbsError::Unsupported(
                "fast registration: the device has no type-2 memory windows",
            )),
        }
    }

    fn alloc_integrity_mr(&self, _max_segments: u32) -> Result<IbvMr, VerbsError> {
        Err(VerbsError::Unsupported(
            "signature (T10-PI integrity) offload is not available on this device",
        ))
    }

    fn create_srq(&self, max_wr: u32, max_sge: u32) -> Result<IbvSrq, VerbsError> {
        IbvSrq::create(&self.inner, max_wr, max_sge)
    }

    fn create_qp(&self, init: &QpInit<'_, Ibverbs>) -> Result<IbvQp, VerbsError> {
        IbvQp::create(&self.inner, init)
    }
}
