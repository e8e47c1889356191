//! Send and receive work requests, posted as caller-owned slices (one
//! doorbell per batch, no allocation).

use crate::sig::SigAttrs;
use crate::types::{Access, RemoteAddr, SendFlags, Sge, WrId};

/// What a send work request does, with its per-opcode fields.
///
/// An explicit tag (`repr(u8)`): every `post_send` matches the opcode
/// several times, and a tag byte is one compare where the niche the
/// compiler would otherwise hide it in (inside the signature attributes)
/// takes several instructions per match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum SendOp<'a> {
    /// SEND: the payload is the gather list (or the inline bytes).
    Send,
    /// SEND_WITH_IMM: SEND plus 32-bit immediate data.
    SendWithImm {
        /// Immediate data (host order).
        imm: u32,
    },
    /// SEND_WITH_INV: SEND, and the responder invalidates `rkey` before
    /// completing the receive.
    SendWithInv {
        /// The responder's rkey to invalidate.
        rkey: u32,
    },
    /// RDMA WRITE of the gather list to `remote`.
    RdmaWrite {
        /// Destination.
        remote: RemoteAddr,
    },
    /// RDMA WRITE plus immediate data; consumes a receive at the peer.
    RdmaWriteWithImm {
        /// Destination.
        remote: RemoteAddr,
        /// Immediate data (host order).
        imm: u32,
    },
    /// RDMA READ from `remote` into the scatter list.
    RdmaRead {
        /// Source.
        remote: RemoteAddr,
    },
    /// Invalidate a local fast-reg key.
    LocalInv {
        /// The key to invalidate (the low byte must match).
        key: u32,
    },
    /// Fast registration: bind the fast-reg MR named by `key`'s index bits
    /// to the WR's scatter list (the "page list"), with the new key `key`.
    RegMr {
        /// The new key (index bits of a fast-reg MR + a new consumer byte).
        key: u32,
        /// The address the registration starts at (`iova`).
        iova: u64,
        /// Access rights of the registration.
        access: Access,
    },
    /// Integrity registration: like [`SendOp::RegMr`] over the data list
    /// (`sg_list`) plus a protection-information list, with signature
    /// attributes.
    RegMrIntegrity {
        /// The new key of an integrity MR.
        key: u32,
        /// The address the registration starts at.
        iova: u64,
        /// Access rights.
        access: Access,
        /// Signature attributes.
        sig: SigAttrs,
        /// PI buffers (memory domain DIX); empty if none.
        prot: &'a [Sge],
    },
}

/// A send-queue work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWr<'a> {
    /// Token returned in the completion.
    pub wr_id: WrId,
    /// Operation.
    pub op: SendOp<'a>,
    /// Gather list (SEND/WRITE), scatter list (READ), or page list (REG_MR).
    pub sg_list: &'a [Sge],
    /// Inline payload used instead of `sg_list` when `flags` has
    /// [`SendFlags::INLINE`] (copied at post time; no key check).
    pub inline: &'a [u8],
    /// Flags.
    pub flags: SendFlags,
}

impl<'a> SendWr<'a> {
    /// A WR with the given op and gather list, unsignaled, not inline.
    pub fn new(wr_id: WrId, op: SendOp<'a>, sg_list: &'a [Sge]) -> Self {
        SendWr {
            wr_id,
            op,
            sg_list,
            inline: &[],
            flags: SendFlags::NONE,
        }
    }

    /// The same WR with [`SendFlags::SIGNALED`] added.
    pub fn signaled(mut self) -> Self {
        self.flags |= SendFlags::SIGNALED;
        self
    }

    /// The same WR with [`SendFlags::FENCE`] added.
    pub fn fenced(mut self) -> Self {
        self.flags |= SendFlags::FENCE;
        self
    }

    /// The same WR sending `data` inline.
    pub fn with_inline(mut self, data: &'a [u8]) -> Self {
        self.flags |= SendFlags::INLINE;
        self.inline = data;
        self
    }

    /// Total payload length (inline bytes or the sum of the SGE lengths).
    pub fn payload_len(&self) -> u64 {
        if self.flags.contains(SendFlags::INLINE) {
            self.inline.len() as u64
        } else {
            self.sg_list.iter().map(|s| u64::from(s.length)).sum()
        }
    }
}

/// A receive work request (QP receive queue or SRQ).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvWr<'a> {
    /// Token returned in the completion.
    pub wr_id: WrId,
    /// Scatter list (needs LOCAL_WRITE).
    pub sg_list: &'a [Sge],
}
