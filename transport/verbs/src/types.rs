//! Provider-neutral value types: work-request tokens, scatter/gather entries,
//! access and send flags, QP states, completion status and opcodes.
//!
//! Numeric values follow user-space rdma-core `verbs.h` so that the `ibverbs`
//! provider converts them without a table (see `verbs-semantics.md`).

use std::fmt;
use std::ops::{BitAnd, BitOr, BitOrAssign};

/// The caller's token for a work request, returned unchanged in its
/// completion. A typed token (e.g. a slab index and a kind), never a pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WrId(pub u64);

/// One scatter/gather entry: `length` bytes at virtual address `addr`,
/// covered by the local memory region whose local key is `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    /// Start address (a local virtual address inside the MR, or an offset for
    /// zero-based MRs).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the MR that covers `addr..addr+length`.
    pub lkey: u32,
}

/// A remote buffer: an address in the peer's MR and the peer's rkey.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RemoteAddr {
    /// Remote virtual address (or offset for zero-based MRs).
    pub addr: u64,
    /// The remote key.
    pub rkey: u32,
}

macro_rules! flag_type {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $flag:ident = $v:expr;)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name(pub u32);
        impl $name {
            /// No flag set.
            pub const NONE: $name = $name(0);
            $($(#[$fm])* pub const $flag: $name = $name($v);)*
            /// Whether every flag of `other` is set in `self`.
            pub const fn contains(self, other: $name) -> bool { self.0 & other.0 == other.0 }
            /// Whether any flag of `other` is set in `self`.
            pub const fn intersects(self, other: $name) -> bool { self.0 & other.0 != 0 }
            /// The raw bits.
            pub const fn bits(self) -> u32 { self.0 }
        }
        impl BitOr for $name { type Output = $name; fn bitor(self, o: $name) -> $name { $name(self.0 | o.0) } }
        impl BitOrAssign for $name { fn bitor_assign(&mut self, o: $name) { self.0 |= o.0 } }
        impl BitAnd for $name { type Output = $name; fn bitand(self, o: $name) -> $name { $name(self.0 & o.0) } }
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}(", stringify!($name))?;
                let mut first = true;
                $(if self.contains($name::$flag) && $v != 0 {
                    if !first { write!(f, "|")?; }
                    first = false;
                    write!(f, "{}", stringify!($flag))?;
                })*
                let _ = first;
                write!(f, ")")
            }
        }
    };
}

flag_type! {
    /// Memory-region access flags (`IBV_ACCESS_*`). Local read is always allowed.
    Access {
        /// Local writes (receive buffers, READ targets). Required by REMOTE_WRITE.
        LOCAL_WRITE = 1;
        /// Inbound RDMA WRITE.
        REMOTE_WRITE = 2;
        /// Inbound RDMA READ.
        REMOTE_READ = 4;
        /// Inbound atomics (not implemented by the soft provider).
        REMOTE_ATOMIC = 8;
        /// Memory-window binding.
        MW_BIND = 16;
        /// Addresses are offsets from 0 rather than virtual addresses.
        ZERO_BASED = 32;
    }
}

impl Access {
    /// Any remote access bit.
    pub const REMOTE_ANY: Access = Access(2 | 4 | 8);

    /// Check the rule "REMOTE_WRITE or REMOTE_ATOMIC requires LOCAL_WRITE".
    pub const fn is_consistent(self) -> bool {
        !self.intersects(Access(2 | 8)) || self.contains(Access::LOCAL_WRITE)
    }
}

flag_type! {
    /// Send work-request flags (`IBV_SEND_*`).
    SendFlags {
        /// Wait for earlier READs (soft: all earlier WRs) before starting.
        FENCE = 1;
        /// Produce a completion on success.
        SIGNALED = 2;
        /// Solicited event at the responder.
        SOLICITED = 4;
        /// Payload taken from [`SendWr::inline`](crate::SendWr::inline) at post time.
        INLINE = 8;
    }
}

flag_type! {
    /// Completion flags (user-space `IBV_WC_*` values).
    WcFlags {
        /// `imm` holds immediate data.
        WITH_IMM = 2;
        /// `imm` holds the rkey the responder invalidated.
        WITH_INV = 8;
    }
}

/// QP states (`IBV_QPS_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum QpState {
    /// Fresh or reset: nothing accepted.
    Reset = 0,
    /// Receives may be posted (not consumed).
    Init = 1,
    /// Ready to receive.
    Rtr = 2,
    /// Ready to send.
    Rts = 3,
    /// Send queue drain.
    Sqd = 4,
    /// Send queue error (UC/UD only).
    Sqe = 5,
    /// Error: everything flushes.
    Err = 6,
}

/// Completion status (`IBV_WC_*`, same order in the kernel).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
#[allow(missing_docs)]
pub enum WcStatus {
    #[default]
    Success = 0,
    LocLenErr = 1,
    LocQpOpErr = 2,
    LocEecOpErr = 3,
    LocProtErr = 4,
    WrFlushErr = 5,
    MwBindErr = 6,
    BadRespErr = 7,
    LocAccessErr = 8,
    RemInvReqErr = 9,
    RemAccessErr = 10,
    RemOpErr = 11,
    RetryExcErr = 12,
    RnrRetryExcErr = 13,
    LocRddViolErr = 14,
    RemInvRdReqErr = 15,
    RemAbortErr = 16,
    InvEecnErr = 17,
    InvEecStateErr = 18,
    FatalErr = 19,
    RespTimeoutErr = 20,
    GeneralErr = 21,
}

impl WcStatus {
    /// The status for a raw value; unknown values map to `GeneralErr`.
    pub fn from_u8(v: u8) -> WcStatus {
        use WcStatus::*;
        const ALL: [WcStatus; 22] = [
            Success,
            LocLenErr,
            LocQpOpErr,
            LocEecOpErr,
            LocProtErr,
            WrFlushErr,
            MwBindErr,
            BadRespErr,
            LocAccessErr,
            RemInvReqErr,
            RemAccessErr,
            RemOpErr,
            RetryExcErr,
            RnrRetryExcErr,
            LocRddViolErr,
            RemInvRdReqErr,
            RemAbortErr,
            InvEecnErr,
            InvEecStateErr,
            FatalErr,
            RespTimeoutErr,
            GeneralErr,
        ];
        ALL.get(usize::from(v)).copied().unwrap_or(GeneralErr)
    }
}

/// Completion opcode. Send-side values follow user space (`IBV_WC_*`);
/// `RegMr`/`RegMrIntegrity` are the kernel-only fast-registration kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum WcOpcode {
    /// SEND, SEND_WITH_IMM or SEND_WITH_INV.
    #[default]
    Send = 0,
    /// RDMA WRITE (with or without immediate).
    RdmaWrite = 1,
    /// RDMA READ.
    RdmaRead = 2,
    /// LOCAL_INV.
    LocalInv = 6,
    /// Fast registration.
    RegMr = 16,
    /// Integrity (signature) registration.
    RegMrIntegrity = 17,
    /// An inbound SEND consumed a receive.
    Recv = 128,
    /// An inbound WRITE_WITH_IMM consumed a receive.
    RecvRdmaWithImm = 129,
}

/// One completion. If `status != Success`, only `wr_id`, `status`,
/// `qp_num` and `vendor_err` are meaningful (verbs rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Wc {
    /// The work request's token.
    pub wr_id: WrId,
    /// Outcome.
    pub status: WcStatus,
    /// What completed.
    pub opcode: WcOpcode,
    /// Bytes received (receive side); the WR length on the send side.
    pub byte_len: u32,
    /// Immediate data (host order) or the invalidated rkey, per `flags`.
    pub imm: u32,
    /// `WITH_IMM` / `WITH_INV`.
    pub flags: WcFlags,
    /// The QP the WR belongs to (the receiving QP for SRQ receives).
    pub qp_num: u32,
    /// Provider-specific detail of an error (0 if none).
    pub vendor_err: u32,
}

/// Asynchronous (affiliated) events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AsyncEvent {
    /// The QP entered ERR on its own (requester or responder error).
    QpFatal {
        /// The QP.
        qp_num: u32,
    },
    /// The responder saw a remote access violation.
    QpAccessErr {
        /// The QP.
        qp_num: u32,
    },
    /// A QP on an SRQ in ERR will take no more SRQ receives.
    QpLastWqeReached {
        /// The QP.
        qp_num: u32,
    },
    /// An SRQ fell below its armed limit (one-shot).
    SrqLimitReached {
        /// The SRQ's number.
        srq_num: u32,
    },
    /// A CQ overflowed and is dead.
    CqErr {
        /// The CQ's number.
        cq_num: u32,
    },
}

/// Device capabilities (`ibv_query_device` subset).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceCaps {
    /// Maximum QPs.
    pub max_qp: u32,
    /// Maximum WRs per send or receive queue.
    pub max_qp_wr: u32,
    /// Maximum SGEs per WR.
    pub max_sge: u32,
    /// Maximum CQ entries.
    pub max_cqe: u32,
    /// Maximum SRQ WRs.
    pub max_srq_wr: u32,
    /// Maximum SGEs per SRQ WR.
    pub max_srq_sge: u32,
    /// Maximum inline data per send WR.
    pub max_inline_data: u32,
    /// Maximum MR size in bytes.
    pub max_mr_size: u64,
    /// Maximum message size of a SEND.
    pub max_msg_size: u32,
    /// Inbound READs per QP (responder resources).
    pub max_qp_rd_atom: u32,
    /// Outbound READs per QP (initiator depth).
    pub max_qp_init_rd_atom: u32,
    /// Maximum pages/segments of one fast registration.
    pub max_fast_reg_pages: u32,
    /// Fast registration and invalidation (memory-management extensions).
    pub mem_mgt_extensions: bool,
    /// T10-PI signature offload (REG_MR_INTEGRITY).
    pub integrity: bool,
    /// How `RegMr` work requests are carried out (what they can express).
    pub fast_reg: FastRegMode,
}

/// How a device carries out fast registration ([`SendOp::RegMr`]).
///
/// [`SendOp::RegMr`]: crate::SendOp::RegMr
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FastRegMode {
    /// No fast registration (`alloc_fast_reg_mr` fails, `RegMr` is refused).
    None,
    /// Page-list registration (kernel FRMR; the soft provider): any gather
    /// list of up to `max_fast_reg_pages` segments of registered memory,
    /// under any `iova`, zero-based or not.
    PageList,
    /// Type-2 memory windows (user-space verbs): a fast-reg MR is a window,
    /// and a `RegMr` binds it over one virtually contiguous range of one
    /// registered MR of the same PD, with `iova` = the range's start address
    /// (no zero-based windows). The window must be free (new, or
    /// invalidated by LOCAL_INV or a peer's SEND_WITH_INV) before it is
    /// bound again. Anything else is refused at post time.
    MemoryWindow {
        /// Windows the device can allocate.
        max_windows: u32,
        /// The device may carry a bind out **again** when it retransmits
        /// WRs posted before it (Linux soft-RoCE: a retransmission restarts
        /// the requester at the oldest unacknowledged WR, and local
        /// operations already done after it run once more, so a window the
        /// peer has invalidated since is bound again under its old key).
        /// The fence does not help there (it waits only for READs and
        /// atomics). A user that lets peers invalidate windows must then
        /// post a bind only when every WR before it has completed.
        binds_replayed_on_retry: bool,
    },
}

impl FastRegMode {
    /// Whether the device may carry a bind out again on retransmission
    /// (see [`FastRegMode::MemoryWindow`]): its users must then post a
    /// registration only when no SEND before it is in flight.
    pub fn binds_replayed_on_retry(&self) -> bool {
        matches!(
            self,
            FastRegMode::MemoryWindow {
                binds_replayed_on_retry: true,
                ..
            }
        )
    }
}

/// QP capacities asked for at creation (and the real values reported back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth (ignored with an SRQ).
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Inline bytes per send WR.
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
        }
    }
}

/// Attributes for [`QueuePair::modify`](crate::QueuePair::modify). Fields
/// that do not apply to the transition are ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttr {
    /// Target state.
    pub state: QpState,
    /// Inbound access enabled (→INIT): REMOTE_READ/REMOTE_WRITE.
    pub access: Access,
    /// Destination QP number (→RTR).
    pub dest_qp_num: u32,
    /// Minimum RNR NAK timer code (→RTR), IB encoding (0 = 655.36 ms).
    pub min_rnr_timer: u8,
    /// RNR retries (→RTS), 7 = forever.
    pub rnr_retry: u8,
    /// Transport retries (→RTS).
    pub retry_cnt: u8,
    /// Local ACK timeout code (→RTS).
    pub timeout: u8,
    /// Outbound READ depth (→RTS).
    pub max_rd_atomic: u8,
    /// Inbound READ depth (→RTR).
    pub max_dest_rd_atomic: u8,
}

impl QpAttr {
    /// Attributes for `state` with the defaults that Pollux transports use
    /// (remote read/write enabled, RNR retry forever, timer code 1).
    pub fn to(state: QpState) -> QpAttr {
        QpAttr {
            state,
            access: Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
            dest_qp_num: 0,
            min_rnr_timer: 1,
            rnr_retry: 7,
            retry_cnt: 7,
            timeout: 14,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
        }
    }
}

/// The RNR timer in microseconds for an IB `min_rnr_timer` code (0-31).
pub fn rnr_timer_us(code: u8) -> u32 {
    const T: [u32; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840,
        5120, 7680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
        245_760, 327_680, 491_520,
    ];
    T[usize::from(code & 31)]
}
