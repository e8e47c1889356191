//! The PDU-specific headers (bytes 8..hlen of each PDU). Encoders write a
//! whole header (common header included, no digest) into a fixed array;
//! parsers read a header whose frame [`Frame::check`](super::Frame::check)
//! accepted and check the fields only a type's own rules constrain.

use super::super::{byte, le16, le32, put16, put32};
use super::{CommonHeader, Digests, PduType, TcpPduError, CMD_HLEN, IC_PDU_LEN, SHORT_HLEN};
use crate::spec::cpl::CQE_SIZE;
use crate::spec::SQE_SIZE;

const _: () = assert!(CH_END + SQE_SIZE == CMD_HLEN);
const _: () = assert!(CH_END + CQE_SIZE == SHORT_HLEN);
const CH_END: usize = super::CH_LEN;

/// A header with only its common-header type and length set.
fn blank<const N: usize>(t: PduType) -> [u8; N] {
    let mut b = [0u8; N];
    CommonHeader {
        pdu_type: t.code(),
        flags: 0,
        hlen: t.hlen() as u8,
        pdo: 0,
        plen: t.hlen() as u32,
    }
    .encode_into(&mut b);
    b
}

/// ICReq: the host opens the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcReq {
    /// PDU format version (0).
    pub pfv: u16,
    /// Host PDU data alignment: data in C2H PDUs at multiples of `(hpda+1)*4`.
    pub hpda: u8,
    /// Digests the host wants.
    pub digests: Digests,
    /// Most outstanding R2Ts per command the host accepts (0's based).
    pub maxr2t: u32,
}

impl IcReq {
    /// The 128-byte PDU.
    pub fn encode(&self) -> [u8; IC_PDU_LEN] {
        let mut b = blank::<IC_PDU_LEN>(PduType::IcReq);
        put16(&mut b, 8, self.pfv);
        b[10] = self.hpda;
        b[11] = self.digests.to_bits();
        put32(&mut b, 12, self.maxr2t);
        b
    }

    /// Parse and check a received ICReq (PFV 0, HPDA at most 31).
    ///
    /// # Errors
    ///
    /// [`TcpPduError::Unsupported`] naming PFV or HPDA.
    pub fn parse(b: &[u8]) -> Result<Self, TcpPduError> {
        let r = IcReq {
            pfv: le16(b, 8),
            hpda: byte(b, 10),
            digests: Digests::from_bits(byte(b, 11)),
            maxr2t: le32(b, 12),
        };
        check_ic(r.pfv, r.hpda)?;
        Ok(r)
    }
}

fn check_ic(pfv: u16, pda: u8) -> Result<(), TcpPduError> {
    if pfv != 0 {
        return Err(TcpPduError::Unsupported {
            what: "PFV",
            offset: 8,
            value: u64::from(pfv),
        });
    }
    if pda > 31 {
        return Err(TcpPduError::Unsupported {
            what: "PDA",
            offset: 10,
            value: u64::from(pda),
        });
    }
    Ok(())
}

/// ICResp: the controller's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcResp {
    /// PDU format version (0).
    pub pfv: u16,
    /// Controller PDU data alignment: data in H2C PDUs at multiples of
    /// `(cpda+1)*4`.
    pub cpda: u8,
    /// The digests enabled.
    pub digests: Digests,
    /// Most data one H2CData PDU may carry (at least 4096).
    pub maxh2cdata: u32,
}

impl IcResp {
    /// The 128-byte PDU.
    pub fn encode(&self) -> [u8; IC_PDU_LEN] {
        let mut b = blank::<IC_PDU_LEN>(PduType::IcResp);
        put16(&mut b, 8, self.pfv);
        b[10] = self.cpda;
        b[11] = self.digests.to_bits();
        put32(&mut b, 12, self.maxh2cdata);
        b
    }

    /// Parse and check a received ICResp.
    ///
    /// # Errors
    ///
    /// [`TcpPduError::Unsupported`] for PFV or CPDA,
    /// [`TcpPduError::InvalidField`] for a MAXH2CDATA under 4096.
    pub fn parse(b: &[u8]) -> Result<Self, TcpPduError> {
        let r = IcResp {
            pfv: le16(b, 8),
            cpda: byte(b, 10),
            digests: Digests::from_bits(byte(b, 11)),
            maxh2cdata: le32(b, 12),
        };
        check_ic(r.pfv, r.cpda)?;
        if r.maxh2cdata < super::MIN_MAXH2CDATA {
            return Err(TcpPduError::InvalidField {
                what: "MAXH2CDATA",
                offset: 12,
                value: u64::from(r.maxh2cdata),
            });
        }
        Ok(r)
    }
}

/// The header of a CapsuleCmd: the SQE (in-capsule data follows at PDO).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapsuleCmdHdr;

impl CapsuleCmdHdr {
    /// The 72-byte header (common header lengths to be finished by
    /// [`SendLayout::finish_header`](super::SendLayout::finish_header)).
    pub fn encode(sqe: &[u8; SQE_SIZE]) -> [u8; CMD_HLEN] {
        let mut b = blank::<CMD_HLEN>(PduType::CapsuleCmd);
        b[CH_END..].copy_from_slice(sqe);
        b
    }

    /// The SQE of a received header.
    pub fn sqe(b: &[u8]) -> Option<&[u8; SQE_SIZE]> {
        b.get(CH_END..CMD_HLEN)?.try_into().ok()
    }
}

/// CapsuleResp: the CQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapsuleResp;

impl CapsuleResp {
    /// The 24-byte header.
    pub fn encode(cqe: &[u8; CQE_SIZE]) -> [u8; SHORT_HLEN] {
        let mut b = blank::<SHORT_HLEN>(PduType::CapsuleResp);
        b[CH_END..].copy_from_slice(cqe);
        b
    }

    /// The CQE of a received header.
    pub fn cqe(b: &[u8]) -> Option<&[u8; CQE_SIZE]> {
        b.get(CH_END..SHORT_HLEN)?.try_into().ok()
    }
}

/// H2CData: host data for an R2T.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct H2cData {
    /// Command id.
    pub cccid: u16,
    /// Transfer tag from the R2T.
    pub ttag: u16,
    /// Offset of the data in the command's data.
    pub datao: u32,
    /// Data length.
    pub datal: u32,
}

/// C2HData: controller data for a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct C2hData {
    /// Command id.
    pub cccid: u16,
    /// Offset of the data in the command's data.
    pub datao: u32,
    /// Data length.
    pub datal: u32,
}

/// R2T: the controller asks for host data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct R2t {
    /// Command id.
    pub cccid: u16,
    /// Transfer tag the H2CData PDUs return.
    pub ttag: u16,
    /// Offset of the requested data.
    pub r2to: u32,
    /// Length of the requested data.
    pub r2tl: u32,
}

/// Shared shape of the three: CCCID at 8, tag at 10, offset at 12, length at 16.
fn encode_xfer(t: PduType, cccid: u16, ttag: u16, off: u32, len: u32) -> [u8; SHORT_HLEN] {
    let mut b = blank::<SHORT_HLEN>(t);
    put16(&mut b, 8, cccid);
    put16(&mut b, 10, ttag);
    put32(&mut b, 12, off);
    put32(&mut b, 16, len);
    b
}

impl H2cData {
    /// The 24-byte header.
    pub fn encode(&self) -> [u8; SHORT_HLEN] {
        encode_xfer(
            PduType::H2cData,
            self.cccid,
            self.ttag,
            self.datao,
            self.datal,
        )
    }

    /// Parse a received header whose frame carries `frame_data` bytes.
    ///
    /// # Errors
    ///
    /// [`TcpPduError::InvalidField`] when DATAL is not the frame's data length.
    pub fn parse(b: &[u8], frame_data: usize) -> Result<Self, TcpPduError> {
        let h = H2cData {
            cccid: le16(b, 8),
            ttag: le16(b, 10),
            datao: le32(b, 12),
            datal: le32(b, 16),
        };
        check_datal(h.datal, frame_data)?;
        Ok(h)
    }
}

fn check_datal(datal: u32, frame_data: usize) -> Result<(), TcpPduError> {
    if datal as usize != frame_data {
        return Err(TcpPduError::InvalidField {
            what: "DATAL",
            offset: 16,
            value: u64::from(datal),
        });
    }
    Ok(())
}

impl C2hData {
    /// The 24-byte header.
    pub fn encode(&self) -> [u8; SHORT_HLEN] {
        encode_xfer(PduType::C2hData, self.cccid, 0, self.datao, self.datal)
    }

    /// Parse a received header whose frame carries `frame_data` bytes.
    ///
    /// # Errors
    ///
    /// [`TcpPduError::InvalidField`] when DATAL is not the frame's data length.
    pub fn parse(b: &[u8], frame_data: usize) -> Result<Self, TcpPduError> {
        let h = C2hData {
            cccid: le16(b, 8),
            datao: le32(b, 12),
            datal: le32(b, 16),
        };
        check_datal(h.datal, frame_data)?;
        Ok(h)
    }
}

impl R2t {
    /// The 24-byte header.
    pub fn encode(&self) -> [u8; SHORT_HLEN] {
        encode_xfer(PduType::R2t, self.cccid, self.ttag, self.r2to, self.r2tl)
    }

    /// Parse a received header.
    ///
    /// # Errors
    ///
    /// [`TcpPduError::InvalidField`] for an R2TL of 0.
    pub fn parse(b: &[u8]) -> Result<Self, TcpPduError> {
        let h = R2t {
            cccid: le16(b, 8),
            ttag: le16(b, 10),
            r2to: le32(b, 12),
            r2tl: le32(b, 16),
        };
        if h.r2tl == 0 {
            return Err(TcpPduError::InvalidField {
                what: "R2TL",
                offset: 16,
                value: 0,
            });
        }
        Ok(h)
    }
}

/// H2CTermReq / C2HTermReq: fatal error status and information; the
/// offending PDU header follows as data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TermReq {
    /// Fatal error status (raw; see [`Fes`](super::Fes)).
    pub fes: u16,
    /// Fatal error information (field offset).
    pub fei: u32,
}

impl TermReq {
    /// The whole PDU into `out` (24-byte header plus up to 128 bytes of
    /// `offending`); returns its length. `c2h`: controller to host.
    pub fn encode_into(
        &self,
        c2h: bool,
        offending: &[u8],
        out: &mut [u8; SHORT_HLEN + super::TERM_REQ_MAX_DATA],
    ) -> usize {
        let t = if c2h {
            PduType::C2hTermReq
        } else {
            PduType::H2cTermReq
        };
        let n = offending.len().min(super::TERM_REQ_MAX_DATA);
        let mut h = blank::<SHORT_HLEN>(t);
        put16(&mut h, 8, self.fes);
        put32(&mut h, 10, self.fei);
        let plen = SHORT_HLEN + n;
        // PDO 0: the copy of the offending header is not PDU data (as
        // SPDK and FreeBSD send it; FreeBSD refuses any other PDO).
        CommonHeader {
            pdu_type: t.code(),
            flags: 0,
            hlen: SHORT_HLEN as u8,
            pdo: 0,
            plen: plen as u32,
        }
        .encode_into(&mut h);
        out[..SHORT_HLEN].copy_from_slice(&h);
        out[SHORT_HLEN..plen].copy_from_slice(&offending[..n]);
        plen
    }

    /// Parse a received header.
    pub fn parse(b: &[u8]) -> Self {
        TermReq {
            fes: le16(b, 8),
            fei: le32(b, 10),
        }
    }
}
