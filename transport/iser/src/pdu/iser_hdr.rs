//! The 28-byte iSER header that precedes every BHS on an iSER connection
//! (RFC 7145), and the 4-byte iSER CM private data of IBTA Annex A12.

use super::bhs::{be16, be32, be64, put16, put32, put64};
use super::PduError;

/// Bytes of the iSER header.
pub const ISER_HDR_LEN: usize = 28;
/// iSER header + BHS: what precedes every data segment (`ISER_HEADERS_LEN`).
pub const ISER_HEADERS_LEN: usize = ISER_HDR_LEN + super::BHS_LEN;

/// iSER opcode (high nibble of byte 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IserOpcode {
    /// An iSCSI control-type PDU follows (0x1).
    Control,
    /// iSER Hello (0x2).
    Hello,
    /// iSER HelloReply (0x3).
    HelloReply,
}

/// Write STag valid.
pub const ISER_WSV: u8 = 0x08;
/// Read STag valid.
pub const ISER_RSV: u8 = 0x04;
/// HelloReply: reject flag (bit 0 of byte 0) **(layout unverified)**.
pub const ISER_HELLO_REJECT: u8 = 0x01;

/// A remote buffer advertised in the iSER header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stag {
    /// The STag (rkey).
    pub stag: u32,
    /// The virtual address (or base offset).
    pub va: u64,
}

/// A decoded iSER header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IserHeader {
    /// A control-type PDU header with the optional write/read STags.
    Control {
        /// Write STag/VA (the target RDMA-READs solicited data from it).
        write: Option<Stag>,
        /// Read STag/VA (the target RDMA-WRITEs read data into it).
        read: Option<Stag>,
    },
    /// Hello: version range and the sender's iSER-IRD.
    Hello {
        /// Highest version.
        max_ver: u8,
        /// Lowest version.
        min_ver: u8,
        /// Inbound RDMA READ depth.
        ird: u16,
    },
    /// HelloReply: reject flag, versions and iSER-ORD.
    HelloReply {
        /// The peer rejected the Hello.
        reject: bool,
        /// Highest version.
        max_ver: u8,
        /// Version in use.
        cur_ver: u8,
        /// Outbound RDMA READ depth.
        ord: u16,
    },
}

impl IserHeader {
    /// A control header with no STags.
    pub const PLAIN: IserHeader = IserHeader::Control {
        write: None,
        read: None,
    };

    /// Decode the first 28 bytes of `b`.
    ///
    /// # Errors
    /// [`PduError::Truncated`], [`PduError::BadIserOpcode`],
    /// [`PduError::Reserved`] for set reserved bits or bytes, or a zero
    /// STag that is flagged valid.
    pub fn parse(b: &[u8]) -> Result<IserHeader, PduError> {
        if b.len() < ISER_HDR_LEN {
            return Err(PduError::Truncated {
                need: ISER_HDR_LEN,
                got: b.len(),
            });
        }
        let f = b[0];
        match f >> 4 {
            1 => {
                if f & 0x03 != 0 {
                    return Err(PduError::Reserved("iSER header flag bits 0-1"));
                }
                super::bhs::reserved(b, 1, 4, "iSER header bytes 1-3")?;
                let stag = |off: usize| Stag {
                    stag: be32(b, off),
                    va: be64(b, off + 4),
                };
                let write = (f & ISER_WSV != 0).then(|| stag(4));
                let read = (f & ISER_RSV != 0).then(|| stag(16));
                Ok(IserHeader::Control { write, read })
            }
            2 => {
                if f & 0x0F != 0 {
                    return Err(PduError::Reserved("iSER Hello flags"));
                }
                Ok(IserHeader::Hello {
                    max_ver: b[1] >> 4,
                    min_ver: b[1] & 0x0F,
                    ird: be16(b, 2),
                })
            }
            3 => {
                if f & 0x0E != 0 {
                    return Err(PduError::Reserved("iSER HelloReply flags"));
                }
                Ok(IserHeader::HelloReply {
                    reject: f & ISER_HELLO_REJECT != 0,
                    max_ver: b[1] >> 4,
                    cur_ver: b[1] & 0x0F,
                    ord: be16(b, 2),
                })
            }
            v => Err(PduError::BadIserOpcode(v)),
        }
    }

    /// Encode into 28 bytes.
    pub fn encode(&self) -> [u8; ISER_HDR_LEN] {
        let mut b = [0u8; ISER_HDR_LEN];
        match *self {
            IserHeader::Control { write, read } => {
                b[0] = 0x10;
                if let Some(w) = write {
                    b[0] |= ISER_WSV;
                    put32(&mut b, 4, w.stag);
                    put64(&mut b, 8, w.va);
                }
                if let Some(r) = read {
                    b[0] |= ISER_RSV;
                    put32(&mut b, 16, r.stag);
                    put64(&mut b, 20, r.va);
                }
            }
            IserHeader::Hello {
                max_ver,
                min_ver,
                ird,
            } => {
                b[0] = 0x20;
                b[1] = (max_ver << 4) | (min_ver & 0x0F);
                put16(&mut b, 2, ird);
            }
            IserHeader::HelloReply {
                reject,
                max_ver,
                cur_ver,
                ord,
            } => {
                b[0] = 0x30 | if reject { ISER_HELLO_REJECT } else { 0 };
                b[1] = (max_ver << 4) | (cur_ver & 0x0F);
                put16(&mut b, 2, ord);
            }
        }
        b
    }
}

/// Bytes of the iSER CM private data.
pub const ISER_CM_HDR_LEN: usize = 4;
/// REQ: the initiator cannot accept zero-based VAs; REP: the target will
/// not use them.
pub const ISER_ZBVA_NOT_SUP: u8 = 0x80;
/// REQ: the initiator cannot handle remote invalidation; REP: the target
/// will not invalidate remotely.
pub const ISER_SEND_W_INV_NOT_SUP: u8 = 0x40;

/// The iSER CM header carried in the REQ and REP private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IserCmHdr {
    /// Zero-based virtual addresses not supported / not used.
    pub zbva_not_sup: bool,
    /// Send-with-invalidate not supported / not used.
    pub send_w_inv_not_sup: bool,
}

impl IserCmHdr {
    /// Decode private data (which the CM reports zero-padded). An empty
    /// buffer means "no iSER header": both flags clear is **not** assumed;
    /// the caller decides.
    ///
    /// # Errors
    /// [`PduError::Truncated`] below 4 bytes, [`PduError::Reserved`] for
    /// unknown flag bits or non-zero reserved bytes.
    pub fn parse(b: &[u8]) -> Result<IserCmHdr, PduError> {
        if b.len() < ISER_CM_HDR_LEN {
            return Err(PduError::Truncated {
                need: ISER_CM_HDR_LEN,
                got: b.len(),
            });
        }
        if b[0] & 0x3F != 0 {
            return Err(PduError::Reserved("iSER CM header flags"));
        }
        super::bhs::reserved(b, 1, 4, "iSER CM header bytes 1-3")?;
        Ok(IserCmHdr {
            zbva_not_sup: b[0] & ISER_ZBVA_NOT_SUP != 0,
            send_w_inv_not_sup: b[0] & ISER_SEND_W_INV_NOT_SUP != 0,
        })
    }

    /// Encode the 4 bytes.
    pub fn encode(&self) -> [u8; ISER_CM_HDR_LEN] {
        let f = (if self.zbva_not_sup {
            ISER_ZBVA_NOT_SUP
        } else {
            0
        }) | if self.send_w_inv_not_sup {
            ISER_SEND_W_INV_NOT_SUP
        } else {
            0
        };
        [f, 0, 0, 0]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_header_round_trips() {
        let h = IserHeader::Control {
            write: Some(Stag {
                stag: 0x1234,
                va: 0xdead_beef_0000,
            }),
            read: Some(Stag { stag: 7, va: 9 }),
        };
        let b = h.encode();
        assert_eq!(b[0], 0x10 | ISER_WSV | ISER_RSV);
        assert_eq!(IserHeader::parse(&b).unwrap(), h);
        assert_eq!(
            IserHeader::parse(&IserHeader::PLAIN.encode()).unwrap(),
            IserHeader::PLAIN
        );
        // Read STag only: bytes 16-27.
        let r = IserHeader::Control {
            write: None,
            read: Some(Stag {
                stag: 0xAABBCCDD,
                va: 0x1122,
            }),
        }
        .encode();
        assert_eq!(&r[16..20], &[0xAA, 0xBB, 0xCC, 0xDD]);
        assert_eq!(&r[4..16], &[0u8; 12]);
    }

    #[test]
    fn header_errors() {
        assert!(matches!(
            IserHeader::parse(&[0x10; 10]),
            Err(PduError::Truncated { .. })
        ));
        let mut b = IserHeader::PLAIN.encode();
        b[0] = 0x50;
        assert_eq!(IserHeader::parse(&b), Err(PduError::BadIserOpcode(5)));
        b[0] = 0x11;
        assert!(IserHeader::parse(&b).is_err());
        b[0] = 0x10;
        b[2] = 1;
        assert!(IserHeader::parse(&b).is_err());
    }

    #[test]
    fn hello_round_trips() {
        for h in [
            IserHeader::Hello {
                max_ver: 1,
                min_ver: 1,
                ird: 16,
            },
            IserHeader::HelloReply {
                reject: true,
                max_ver: 1,
                cur_ver: 1,
                ord: 4,
            },
        ] {
            assert_eq!(IserHeader::parse(&h.encode()).unwrap(), h);
        }
    }

    #[test]
    fn cm_header_matches_linux() {
        let linux_req = IserCmHdr {
            zbva_not_sup: true,
            send_w_inv_not_sup: false,
        };
        assert_eq!(linux_req.encode(), [0x80, 0, 0, 0]);
        let libiscsi = IserCmHdr::parse(&[0xC0, 0, 0, 0, 0, 0]).unwrap();
        assert!(libiscsi.zbva_not_sup && libiscsi.send_w_inv_not_sup);
        assert!(IserCmHdr::parse(&[0x80, 0]).is_err());
        assert!(IserCmHdr::parse(&[0x81, 0, 0, 0]).is_err());
    }
}
