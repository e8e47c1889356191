//! Connection-manager messages on the soft provider's Unix socket
//! (`SOCK_SEQPACKET`, one message per packet, fds as `SCM_RIGHTS`).
//!
//! Every message starts with a kind byte; integers are little-endian;
//! decoding checks lengths and never trusts a length field beyond its limit.

use crate::cm::{ACCEPT_PRIVATE_DATA_MAX, CONNECT_PRIVATE_DATA_MAX, REJECT_PRIVATE_DATA_MAX};

/// Largest message.
pub(crate) const MSG_MAX: usize = 256;

const K_REQ: u8 = 1;
const K_REP: u8 = 2;
const K_REJ: u8 = 3;
const K_RTU: u8 = 4;
const K_ARENA: u8 = 5;
const K_DREQ: u8 = 6;
const K_ARENA_GONE: u8 = 7;

/// Connection parameters carried by REQ and REP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hello {
    pub(crate) qp_num: u32,
    pub(crate) pd_tag: u8,
    pub(crate) responder_resources: u8,
    pub(crate) initiator_depth: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) pdata_len: u8,
    pub(crate) pdata: [u8; ACCEPT_PRIVATE_DATA_MAX],
}

/// A CM message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Msg {
    /// Connect request; fds: link memfd, MR table, recv-CQ eventfd, send-CQ eventfd.
    Req(Hello),
    /// Accept; fds: MR table, recv-CQ eventfd, send-CQ eventfd.
    Rep(Hello),
    /// Reject.
    Rej {
        reason: i32,
        pdata_len: u8,
        pdata: [u8; REJECT_PRIVATE_DATA_MAX],
    },
    /// Ready to use (active → passive after REP).
    Rtu,
    /// An exposed arena; fd: the arena memfd.
    Arena { slot: u64, len: u64 },
    /// Disconnect request.
    Dreq,
    /// The arena of `slot` (the full slot id, generation included) is no
    /// longer registered: unmap it.
    ArenaGone { slot: u64 },
}

impl Msg {
    /// Encode into `b`; returns the length.
    pub(crate) fn encode(&self, b: &mut [u8; MSG_MAX]) -> usize {
        match self {
            Msg::Req(h) | Msg::Rep(h) => {
                b[0] = if matches!(self, Msg::Req(_)) {
                    K_REQ
                } else {
                    K_REP
                };
                b[1..5].copy_from_slice(&h.qp_num.to_le_bytes());
                b[5] = h.pd_tag;
                b[6] = h.responder_resources;
                b[7] = h.initiator_depth;
                b[8] = h.rnr_retry;
                b[9] = h.pdata_len;
                let n = usize::from(h.pdata_len);
                b[10..10 + n].copy_from_slice(&h.pdata[..n]);
                10 + n
            }
            Msg::Rej {
                reason,
                pdata_len,
                pdata,
            } => {
                b[0] = K_REJ;
                b[1..5].copy_from_slice(&reason.to_le_bytes());
                b[5] = *pdata_len;
                let n = usize::from(*pdata_len);
                b[6..6 + n].copy_from_slice(&pdata[..n]);
                6 + n
            }
            Msg::Rtu => {
                b[0] = K_RTU;
                1
            }
            Msg::Arena { slot, len } => {
                b[0] = K_ARENA;
                b[1..9].copy_from_slice(&slot.to_le_bytes());
                b[9..17].copy_from_slice(&len.to_le_bytes());
                17
            }
            Msg::Dreq => {
                b[0] = K_DREQ;
                1
            }
            Msg::ArenaGone { slot } => {
                b[0] = K_ARENA_GONE;
                b[1..9].copy_from_slice(&slot.to_le_bytes());
                9
            }
        }
    }

    /// Decode, validating every length.
    pub(crate) fn decode(b: &[u8]) -> Option<Msg> {
        let u32_at = |i: usize| Some(u32::from_le_bytes(b.get(i..i + 4)?.try_into().ok()?));
        let u64_at = |i: usize| Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?));
        match *b.first()? {
            k @ (K_REQ | K_REP) => {
                let n = usize::from(*b.get(9)?);
                let max = if k == K_REQ {
                    CONNECT_PRIVATE_DATA_MAX
                } else {
                    ACCEPT_PRIVATE_DATA_MAX
                };
                if n > max || b.len() != 10 + n {
                    return None;
                }
                let mut pdata = [0; ACCEPT_PRIVATE_DATA_MAX];
                pdata[..n].copy_from_slice(&b[10..10 + n]);
                let h = Hello {
                    qp_num: u32_at(1)?,
                    pd_tag: b[5],
                    responder_resources: b[6],
                    initiator_depth: b[7],
                    rnr_retry: b[8],
                    pdata_len: n as u8,
                    pdata,
                };
                Some(if k == K_REQ { Msg::Req(h) } else { Msg::Rep(h) })
            }
            K_REJ => {
                let n = usize::from(*b.get(5)?);
                if n > REJECT_PRIVATE_DATA_MAX || b.len() != 6 + n {
                    return None;
                }
                let mut pdata = [0; REJECT_PRIVATE_DATA_MAX];
                pdata[..n].copy_from_slice(&b[6..6 + n]);
                Some(Msg::Rej {
                    reason: u32_at(1)? as i32,
                    pdata_len: n as u8,
                    pdata,
                })
            }
            K_RTU if b.len() == 1 => Some(Msg::Rtu),
            K_DREQ if b.len() == 1 => Some(Msg::Dreq),
            K_ARENA if b.len() == 17 => Some(Msg::Arena {
                slot: u64_at(1)?,
                len: u64_at(9)?,
            }),
            K_ARENA_GONE if b.len() == 9 => Some(Msg::ArenaGone { slot: u64_at(1)? }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_rejects_bad_lengths() {
        let mut pdata = [0; ACCEPT_PRIVATE_DATA_MAX];
        pdata[..3].copy_from_slice(b"abc");
        let h = Hello {
            qp_num: 7,
            pd_tag: 3,
            responder_resources: 4,
            initiator_depth: 5,
            rnr_retry: 6,
            pdata_len: 3,
            pdata,
        };
        let mut b = [0; MSG_MAX];
        for m in [
            Msg::Req(h),
            Msg::Rep(h),
            Msg::Rtu,
            Msg::Dreq,
            Msg::Arena { slot: 9, len: 4096 },
            Msg::ArenaGone {
                slot: 9 | (2 << 32),
            },
        ] {
            let n = m.encode(&mut b);
            assert_eq!(Msg::decode(&b[..n]), Some(m));
        }
        let n = Msg::Req(h).encode(&mut b);
        assert_eq!(Msg::decode(&b[..n - 1]), None);
        b[9] = 57;
        assert_eq!(Msg::decode(&b[..10 + 57]), None);
        assert_eq!(Msg::decode(&[]), None);
        assert_eq!(Msg::decode(&[99]), None);
    }
}
