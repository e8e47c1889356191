//! Typed work-request tokens for transports built on the verbs layer:
//! `(kind, connection slot, connection generation, index)` packed into a
//! [`WrId`]. Never a pointer; a stale or unknown token names nothing, and the
//! transport ignores its completion (style: typed completion tokens).
//!
//! Layout: kind in bits 62–63, generation (14 bits) in 48–61, connection
//! slot in 32–47, index in 0–31.

use crate::types::WrId;

/// What a work request was posted for; each transport documents what the
/// index means for its kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WrKind {
    /// A receive (index: receive buffer id).
    Recv = 0,
    /// A SEND (index: the request, task or send slot it answers).
    Send = 1,
    /// A signaled RDMA READ (index: the request or task it fetches data for).
    Read = 2,
    /// An unsignaled data work request (completes only on error).
    Data = 3,
}

/// A decoded token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WrToken {
    /// What the work request was for.
    pub kind: WrKind,
    /// The connection's slot in its poll group.
    pub conn: u16,
    /// The connection's generation (14 bits): a token of a connection that
    /// has since been replaced in the slot does not match.
    pub gen: u16,
    /// Kind-specific index.
    pub index: u32,
}

impl WrToken {
    /// A token; `gen` is truncated to 14 bits.
    pub fn new(kind: WrKind, conn: u16, gen: u16, index: u32) -> Self {
        WrToken {
            kind,
            conn,
            gen: gen & 0x3FFF,
            index,
        }
    }

    /// The token as a work-request id.
    pub fn encode(self) -> WrId {
        WrId(
            (self.kind as u64) << 62
                | u64::from(self.gen & 0x3FFF) << 48
                | u64::from(self.conn) << 32
                | u64::from(self.index),
        )
    }

    /// Any work-request id as a token (every bit pattern decodes; the
    /// transport checks the slot and generation before trusting it).
    pub fn decode(id: WrId) -> Self {
        let kind = match id.0 >> 62 {
            0 => WrKind::Recv,
            1 => WrKind::Send,
            2 => WrKind::Read,
            _ => WrKind::Data,
        };
        WrToken {
            kind,
            gen: ((id.0 >> 48) & 0x3FFF) as u16,
            conn: ((id.0 >> 32) & 0xFFFF) as u16,
            index: id.0 as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_truncated_generation() {
        for kind in [WrKind::Recv, WrKind::Send, WrKind::Read, WrKind::Data] {
            let t = WrToken::new(kind, 513, 0x3FFF, 0xDEAD_BEEF);
            assert_eq!(WrToken::decode(t.encode()), t);
        }
        let t = WrToken::new(WrKind::Send, 1, 0x4001, 7);
        assert_eq!(t.gen, 1);
        assert_ne!(WrToken::decode(WrId(u64::MAX)).index, 0);
    }
}
