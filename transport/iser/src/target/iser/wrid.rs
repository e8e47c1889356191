//! Typed work-request tokens of the iSER target: `(kind, connection slot,
//! connection generation, index)` packed into a `wr_id`. Never a pointer;
//! a stale or unknown token names nothing and is ignored.

use pollux_verbs::WrId;

/// What a work request was posted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WrKind {
    /// A receive (index: receive buffer id).
    Recv = 0,
    /// A PDU SEND (index: send slot).
    Send = 1,
    /// An RDMA READ of solicited Data-Out (index: task).
    Read = 2,
    /// An unsignaled RDMA WRITE of Data-In (index: task).
    Data = 3,
}

/// A decoded token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Token {
    pub(crate) kind: WrKind,
    pub(crate) conn: u16,
    pub(crate) gen: u16,
    pub(crate) index: u32,
}

impl Token {
    pub(crate) fn new(kind: WrKind, conn: u16, gen: u16, index: u32) -> Self {
        Token {
            kind,
            conn,
            gen: gen & 0x3FFF,
            index,
        }
    }

    pub(crate) fn encode(self) -> WrId {
        WrId(
            (self.kind as u64) << 62
                | u64::from(self.gen & 0x3FFF) << 48
                | u64::from(self.conn) << 32
                | u64::from(self.index),
        )
    }

    pub(crate) fn decode(id: WrId) -> Self {
        let kind = match id.0 >> 62 {
            0 => WrKind::Recv,
            1 => WrKind::Send,
            2 => WrKind::Read,
            _ => WrKind::Data,
        };
        Token {
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
    fn round_trip() {
        for kind in [WrKind::Recv, WrKind::Send, WrKind::Read, WrKind::Data] {
            let t = Token::new(kind, 513, 0x3FFF, 0xDEAD_BEEF);
            assert_eq!(Token::decode(t.encode()), t);
        }
    }
}
