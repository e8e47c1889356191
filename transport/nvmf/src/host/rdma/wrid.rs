//! Work-request tokens of the RDMA host: `(kind, index)` packed in a
//! `wr_id`, never a pointer; an unknown kind decodes to `None`.

use pollux_verbs::WrId;

/// What a work request was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WrKind {
    /// A command capsule SEND (index = slot).
    Send = 1,
    /// A fast registration (index = slot).
    Reg = 2,
    /// A local invalidation (index = slot).
    Inv = 3,
    /// A response receive (index = receive buffer).
    Recv = 4,
}

pub(crate) fn encode(kind: WrKind, index: u16) -> WrId {
    WrId(((kind as u64) << 32) | u64::from(index))
}

pub(crate) fn decode(id: WrId) -> Option<(WrKind, u16)> {
    let index = (id.0 & 0xFFFF) as u16;
    let kind = match id.0 >> 32 {
        1 => WrKind::Send,
        2 => WrKind::Reg,
        3 => WrKind::Inv,
        4 => WrKind::Recv,
        _ => return None,
    };
    Some((kind, index))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_reject_garbage() {
        for k in [WrKind::Send, WrKind::Reg, WrKind::Inv, WrKind::Recv] {
            assert_eq!(decode(encode(k, 513)), Some((k, 513)));
        }
        assert_eq!(decode(WrId(0)), None);
        assert_eq!(decode(WrId(9 << 32)), None);
    }
}
