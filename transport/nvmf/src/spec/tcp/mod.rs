//! NVMe/TCP PDUs (NVM Express TCP Transport Specification): the common
//! header, the framing of one PDU (header digest, padding up to PDO, data,
//! data digest), each PDU's specific header ([`pdu`]) and CRC32C digests.
//!
//! Bytes only, no I/O, no state beyond what a connection negotiated
//! ([`Digests`]). Every parse error is a [`TcpPduError`] that names the
//! fatal error status and the field offset a C2HTermReq/H2CTermReq carries
//! ([`TcpPduError::fes`], [`TcpPduError::fei`]).
//!
//! Layout of a PDU: `CH (8) | PSH (hlen - 8) | HDGST (4, when HDGSTF) |
//! PAD (up to PDO) | DATA | DDGST (4, when DDGSTF)`; `plen` counts it all.

pub mod pdu;

pub use pdu::{C2hData, CapsuleCmdHdr, CapsuleResp, H2cData, IcReq, IcResp, R2t, TermReq};

use super::{byte, le32, put32};

/// Size of the common header.
pub const CH_LEN: usize = 8;
/// Size of a header or data digest.
pub const DIGEST_LEN: usize = 4;
/// ICReq and ICResp are exactly this long.
pub const IC_PDU_LEN: usize = 128;
/// Header length of CapsuleCmd (CH + SQE).
pub const CMD_HLEN: usize = 72;
/// Header length of CapsuleResp, H2CData, C2HData, R2T and the TermReqs.
pub const SHORT_HLEN: usize = 24;
/// Most bytes of the offending PDU a TermReq carries.
pub const TERM_REQ_MAX_DATA: usize = 128;
/// Smallest MAXH2CDATA a controller may announce.
pub const MIN_MAXH2CDATA: u32 = 4096;
/// The in-capsule size hosts assume on the admin queue (8 KiB).
pub const ADMIN_ICD_SIZE: u32 = 8192;
/// The longest header with digest and padding this crate accepts
/// (`hlen` 128 + digest; PDO may add up to 128 bytes of padding).
pub const MAX_HEADER_LEN: usize = IC_PDU_LEN + DIGEST_LEN;

/// Common header flag: a header digest follows the header.
pub const FLAG_HDGST: u8 = 0x01;
/// Common header flag: a data digest follows the data.
pub const FLAG_DDGST: u8 = 0x02;
/// H2CData/C2HData: the last data PDU of a transfer.
pub const FLAG_LAST_PDU: u8 = 0x04;
/// C2HData: the command succeeded, no CapsuleResp follows.
pub const FLAG_SUCCESS: u8 = 0x08;

/// PDU types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PduType {
    /// 0x00: initialize connection request (host → controller).
    IcReq,
    /// 0x01: initialize connection response.
    IcResp,
    /// 0x02: host to controller termination request.
    H2cTermReq,
    /// 0x03: controller to host termination request.
    C2hTermReq,
    /// 0x04: command capsule.
    CapsuleCmd,
    /// 0x05: response capsule.
    CapsuleResp,
    /// 0x06: host to controller data.
    H2cData,
    /// 0x07: controller to host data.
    C2hData,
    /// 0x09: ready to transfer.
    R2t,
}

impl PduType {
    /// The wire value.
    #[inline]
    pub const fn code(self) -> u8 {
        match self {
            PduType::IcReq => 0x00,
            PduType::IcResp => 0x01,
            PduType::H2cTermReq => 0x02,
            PduType::C2hTermReq => 0x03,
            PduType::CapsuleCmd => 0x04,
            PduType::CapsuleResp => 0x05,
            PduType::H2cData => 0x06,
            PduType::C2hData => 0x07,
            PduType::R2t => 0x09,
        }
    }

    /// The type of a wire value (`None`: not a PDU type).
    #[inline]
    pub const fn from_code(v: u8) -> Option<Self> {
        Some(match v {
            0x00 => PduType::IcReq,
            0x01 => PduType::IcResp,
            0x02 => PduType::H2cTermReq,
            0x03 => PduType::C2hTermReq,
            0x04 => PduType::CapsuleCmd,
            0x05 => PduType::CapsuleResp,
            0x06 => PduType::H2cData,
            0x07 => PduType::C2hData,
            0x09 => PduType::R2t,
            _ => return None,
        })
    }

    /// The header length (`hlen`) the specification fixes for this type.
    #[inline]
    pub const fn hlen(self) -> usize {
        match self {
            PduType::IcReq | PduType::IcResp => IC_PDU_LEN,
            PduType::CapsuleCmd => CMD_HLEN,
            _ => SHORT_HLEN,
        }
    }

    /// Sent by the host (the controller receives it).
    #[inline]
    pub const fn from_host(self) -> bool {
        matches!(
            self,
            PduType::IcReq | PduType::H2cTermReq | PduType::CapsuleCmd | PduType::H2cData
        )
    }

    /// May carry a header digest (every PDU but ICReq/ICResp and TermReqs).
    #[inline]
    pub const fn digestible(self) -> bool {
        !matches!(
            self,
            PduType::IcReq | PduType::IcResp | PduType::H2cTermReq | PduType::C2hTermReq
        )
    }

    /// May carry data (with a data digest when negotiated).
    #[inline]
    pub const fn has_data(self) -> bool {
        matches!(
            self,
            PduType::CapsuleCmd | PduType::H2cData | PduType::C2hData
        )
    }
}

/// Fatal error status of a TermReq (FES).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fes {
    /// 0x01: invalid PDU header field (FEI: the field's byte offset).
    InvalidHeaderField,
    /// 0x02: PDU sequence error.
    SequenceError,
    /// 0x03: header digest error.
    HeaderDigest,
    /// 0x04: data transfer out of range.
    DataOutOfRange,
    /// 0x05: R2T limit / data transfer limit exceeded.
    DataLimitExceeded,
    /// 0x06: unsupported parameter (FEI: the field's byte offset).
    UnsupportedParameter,
}

impl Fes {
    /// The wire value.
    pub const fn code(self) -> u16 {
        match self {
            Fes::InvalidHeaderField => 0x01,
            Fes::SequenceError => 0x02,
            Fes::HeaderDigest => 0x03,
            Fes::DataOutOfRange => 0x04,
            Fes::DataLimitExceeded => 0x05,
            Fes::UnsupportedParameter => 0x06,
        }
    }

    /// The status of a wire value.
    pub const fn from_code(v: u16) -> Option<Self> {
        Some(match v {
            0x01 => Fes::InvalidHeaderField,
            0x02 => Fes::SequenceError,
            0x03 => Fes::HeaderDigest,
            0x04 => Fes::DataOutOfRange,
            0x05 => Fes::DataLimitExceeded,
            0x06 => Fes::UnsupportedParameter,
            _ => return None,
        })
    }
}

/// A PDU the receiver must refuse: the connection ends with a TermReq
/// carrying [`fes`](Self::fes) and [`fei`](Self::fei).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TcpPduError {
    /// A header field holds a value the receiver cannot accept.
    #[error("PDU header field '{what}' at byte {offset} holds invalid value {value:#x}")]
    InvalidField {
        /// The field.
        what: &'static str,
        /// Its byte offset in the PDU.
        offset: u32,
        /// Its value.
        value: u64,
    },
    /// The PDU may not come now (before ICReq, a second ICReq, a type
    /// this side never receives).
    #[error("PDU type {pdu_type:#x} out of sequence: {why}")]
    Sequence {
        /// The PDU type.
        pdu_type: u8,
        /// Why.
        why: &'static str,
    },
    /// The header digest does not match.
    #[error("header digest {got:#010x}, expected {expected:#010x}")]
    HeaderDigest {
        /// Received.
        got: u32,
        /// Computed.
        expected: u32,
    },
    /// Data outside the range its command or R2T allows.
    #[error("data at offset {offset}+{len} outside the {limit} bytes allowed")]
    DataOutOfRange {
        /// Offset.
        offset: u32,
        /// Length.
        len: u32,
        /// The allowed length.
        limit: u32,
    },
    /// More data in one PDU than the receiver accepts (MAXH2CDATA, the
    /// in-capsule size).
    #[error("{len} bytes of data in one PDU, limit {limit}")]
    DataLimitExceeded {
        /// Data length.
        len: u32,
        /// The limit.
        limit: u32,
    },
    /// A termination request (H2CTermReq/C2HTermReq) whose PLEN lies
    /// outside 24..=152: the connection ends at once, with no termination
    /// request in answer ([`answered`](Self::answered)).
    #[error("termination request with PLEN {plen}, outside 24..=152")]
    TermReqLength {
        /// The PLEN received.
        plen: u32,
    },
    /// A parameter this side does not support.
    #[error("unsupported parameter '{what}' at byte {offset}: {value:#x}")]
    Unsupported {
        /// The field.
        what: &'static str,
        /// Its byte offset.
        offset: u32,
        /// Its value.
        value: u64,
    },
}

impl TcpPduError {
    /// The fatal error status of the TermReq.
    pub const fn fes(&self) -> Fes {
        match self {
            TcpPduError::InvalidField { .. } | TcpPduError::TermReqLength { .. } => {
                Fes::InvalidHeaderField
            }
            TcpPduError::Sequence { .. } => Fes::SequenceError,
            TcpPduError::HeaderDigest { .. } => Fes::HeaderDigest,
            TcpPduError::DataOutOfRange { .. } => Fes::DataOutOfRange,
            TcpPduError::DataLimitExceeded { .. } => Fes::DataLimitExceeded,
            TcpPduError::Unsupported { .. } => Fes::UnsupportedParameter,
        }
    }

    /// The fatal error information: the offending field's byte offset for
    /// header-field and unsupported-parameter errors, the PDU Header
    /// Digest (PHD: the digest the PDU carried) for a header digest error,
    /// else 0 (reserved).
    pub const fn fei(&self) -> u32 {
        match self {
            TcpPduError::InvalidField { offset, .. } | TcpPduError::Unsupported { offset, .. } => {
                *offset
            }
            TcpPduError::HeaderDigest { got, .. } => *got,
            TcpPduError::TermReqLength { .. } => 4,
            _ => 0,
        }
    }

    /// Whether the receiver answers this error with a termination request
    /// of its own before it closes: not for a termination request whose
    /// PLEN is invalid (the connection is closed at once).
    pub const fn answered(&self) -> bool {
        !matches!(self, TcpPduError::TermReqLength { .. })
    }

    fn field(what: &'static str, offset: u32, value: impl Into<u64>) -> Self {
        TcpPduError::InvalidField {
            what,
            offset,
            value: value.into(),
        }
    }
}

/// Digests a connection negotiated (ICReq DGST bits the controller granted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Digests {
    /// Header digest on every PDU after ICResp that may carry one.
    pub header: bool,
    /// Data digest on every PDU with data.
    pub data: bool,
}

impl Digests {
    /// The ICReq/ICResp DGST byte.
    pub const fn to_bits(self) -> u8 {
        (self.header as u8) | ((self.data as u8) << 1)
    }

    /// From the DGST byte (other bits ignored).
    pub const fn from_bits(v: u8) -> Self {
        Digests {
            header: v & 1 != 0,
            data: v & 2 != 0,
        }
    }

    /// Both sides' wishes: a digest is on when both want it.
    pub const fn and(self, other: Digests) -> Self {
        Digests {
            header: self.header && other.header,
            data: self.data && other.data,
        }
    }

    /// Bytes of header digest per PDU of `t`.
    pub const fn hdgst_len(self, t: PduType) -> usize {
        if self.header && t.digestible() {
            DIGEST_LEN
        } else {
            0
        }
    }
}

/// CRC32C of `bytes` (Castagnoli; hardware-accelerated where the CPU has
/// SSE 4.2 or the ARMv8 CRC extension).
pub fn crc32c(bytes: &[u8]) -> u32 {
    ::crc32c::crc32c(bytes)
}

/// Extend a CRC32C over more bytes (`crc32c_append(crc32c(a), b) ==
/// crc32c(a ++ b)`).
pub fn crc32c_append(crc: u32, bytes: &[u8]) -> u32 {
    ::crc32c::crc32c_append(crc, bytes)
}

/// The 8-byte common header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommonHeader {
    /// PDU type (raw).
    pub pdu_type: u8,
    /// Flags.
    pub flags: u8,
    /// Header length (without digest).
    pub hlen: u8,
    /// Data offset (0: no data).
    pub pdo: u8,
    /// Length of the whole PDU.
    pub plen: u32,
}

impl CommonHeader {
    /// Parse the first 8 bytes of `b` (zeroes past its end).
    #[inline]
    pub fn parse(b: &[u8]) -> Self {
        CommonHeader {
            pdu_type: byte(b, 0),
            flags: byte(b, 1),
            hlen: byte(b, 2),
            pdo: byte(b, 3),
            plen: le32(b, 4),
        }
    }

    /// Write it into the first 8 bytes of `out`.
    #[inline]
    pub fn encode_into(&self, out: &mut [u8]) {
        if let Some(h) = out.get_mut(..CH_LEN) {
            h[0] = self.pdu_type;
            h[1] = self.flags;
            h[2] = self.hlen;
            h[3] = self.pdo;
        }
        put32(out, 4, self.plen);
    }
}

/// Where the parts of one PDU lie, from its common header: the result of
/// [`Frame::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    /// The PDU type.
    pub pdu_type: PduType,
    /// The flags.
    pub flags: u8,
    /// Header length without digest.
    pub hlen: usize,
    /// Header digest present.
    pub hdgst: bool,
    /// Offset of the data from the PDU start (the header, its digest and
    /// padding come before it).
    pub data_offset: usize,
    /// Data length (0: none).
    pub data_len: usize,
    /// Data digest present.
    pub ddgst: bool,
    /// Whole PDU length.
    pub plen: usize,
}

impl Frame {
    /// Bytes of header plus header digest.
    pub const fn header_len(&self) -> usize {
        self.hlen + if self.hdgst { DIGEST_LEN } else { 0 }
    }

    /// Check a received common header against what this side receives
    /// (`from_host`: the controller's view), the negotiated digests (none
    /// before the ICReq/ICResp exchange) and the most data one PDU may
    /// carry (`max_data`). Every length is checked against every other:
    /// a PDU whose `plen` lies is refused here, before any byte of it is
    /// taken as data.
    ///
    /// # Errors
    ///
    /// A [`TcpPduError`] naming the field (the TermReq's FEI).
    #[inline]
    pub fn check(
        ch: &CommonHeader,
        from_host: bool,
        digests: Digests,
        max_data: u32,
    ) -> Result<Frame, TcpPduError> {
        let Some(t) = PduType::from_code(ch.pdu_type) else {
            return Err(TcpPduError::field("PDU-type", 0, ch.pdu_type));
        };
        let term = matches!(t, PduType::H2cTermReq | PduType::C2hTermReq);
        if t.from_host() != from_host {
            return Err(TcpPduError::Sequence {
                pdu_type: ch.pdu_type,
                why: "this side never receives that type",
            });
        }
        if usize::from(ch.hlen) != t.hlen() {
            return Err(TcpPduError::field("HLEN", 2, ch.hlen));
        }
        let hdgst = digests.hdgst_len(t) > 0;
        if (ch.flags & FLAG_HDGST != 0) != hdgst && !term {
            return Err(TcpPduError::field("FLAGS", 1, ch.flags));
        }
        // SUCCESS ends the command: only on its last C2HData PDU.
        if t == PduType::C2hData && ch.flags & (FLAG_SUCCESS | FLAG_LAST_PDU) == FLAG_SUCCESS {
            return Err(TcpPduError::field("FLAGS", 1, ch.flags));
        }
        let hlen = t.hlen();
        let header_len = hlen + digests.hdgst_len(t);
        let plen = ch.plen as usize;
        if term {
            // A TermReq carries a copy of the offending header as data.
            if plen < hlen || plen > hlen + TERM_REQ_MAX_DATA {
                return Err(TcpPduError::TermReqLength { plen: ch.plen });
            }
            return Ok(Frame {
                pdu_type: t,
                flags: ch.flags,
                hlen,
                hdgst: false,
                data_offset: hlen,
                data_len: plen - hlen,
                ddgst: false,
                plen,
            });
        }
        if ch.pdo == 0 || plen == header_len {
            // No data: nothing may follow the header.
            if ch.pdo != 0 && usize::from(ch.pdo) != header_len {
                return Err(TcpPduError::field("PDO", 3, ch.pdo));
            }
            if plen != header_len {
                return Err(TcpPduError::field("PLEN", 4, ch.plen));
            }
            if ch.flags & FLAG_DDGST != 0 {
                return Err(TcpPduError::field("FLAGS", 1, ch.flags));
            }
            return Ok(Frame {
                pdu_type: t,
                flags: ch.flags,
                hlen,
                hdgst,
                data_offset: header_len,
                data_len: 0,
                ddgst: false,
                plen,
            });
        }
        if !t.has_data() {
            return Err(TcpPduError::field("PDO", 3, ch.pdo));
        }
        let pdo = usize::from(ch.pdo);
        // Data starts at a multiple of the receiver's PDA, `(PDA + 1) * 4`
        // bytes: this crate asks for none beyond 4 (CPDA/HPDA 0), and
        // every alignment is a multiple of 4.
        if pdo < header_len || pdo % 4 != 0 {
            return Err(TcpPduError::field("PDO", 3, ch.pdo));
        }
        let ddgst = digests.data;
        if (ch.flags & FLAG_DDGST != 0) != ddgst {
            return Err(TcpPduError::field("FLAGS", 1, ch.flags));
        }
        let tail = if ddgst { DIGEST_LEN } else { 0 };
        let Some(data_len) = plen.checked_sub(pdo + tail).filter(|&n| n > 0) else {
            return Err(TcpPduError::field("PLEN", 4, ch.plen));
        };
        if data_len > max_data as usize {
            return Err(TcpPduError::DataLimitExceeded {
                len: u32::try_from(data_len).unwrap_or(u32::MAX),
                limit: max_data,
            });
        }
        Ok(Frame {
            pdu_type: t,
            flags: ch.flags,
            hlen,
            hdgst,
            data_offset: pdo,
            data_len,
            ddgst,
            plen,
        })
    }

    /// Verify the header digest of a received header (`header` holds at
    /// least [`header_len`](Self::header_len) bytes). No-op without one.
    ///
    /// # Errors
    ///
    /// [`TcpPduError::HeaderDigest`] on a mismatch.
    pub fn verify_hdgst(&self, header: &[u8]) -> Result<(), TcpPduError> {
        if !self.hdgst {
            return Ok(());
        }
        let expected = crc32c(header.get(..self.hlen).unwrap_or(&[]));
        let got = le32(header, self.hlen);
        if got != expected {
            return Err(TcpPduError::HeaderDigest { got, expected });
        }
        Ok(())
    }
}

/// Layout of a PDU this side sends: header digest and data offset from
/// the digests and the peer's data alignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendLayout {
    /// Header digest.
    pub hdgst: bool,
    /// Data digest (when there is data).
    pub ddgst: bool,
    /// The peer's required data alignment in bytes (`(HPDA or CPDA + 1) * 4`).
    pub align: usize,
}

impl SendLayout {
    /// A layout for `digests` and the peer's PDA field (0..=31).
    pub const fn new(digests: Digests, pda: u8) -> Self {
        SendLayout {
            hdgst: digests.header,
            ddgst: digests.data,
            align: (pda as usize + 1) * 4,
        }
    }

    /// No digests and no padding (the peer's alignment is the default 4
    /// bytes): a PDU's data follows its header at `hlen`, and the common
    /// header alone describes it ([`plain_header`](Self::plain_header)).
    #[inline]
    pub const fn is_plain(&self) -> bool {
        !self.hdgst && !self.ddgst && self.align <= 4
    }

    /// The common header of a `t` PDU with `data_len` bytes of data under
    /// a [plain](Self::is_plain) layout (what
    /// [`finish_header`](Self::finish_header) writes there).
    #[inline]
    pub const fn plain_header(t: PduType, extra_flags: u8, data_len: usize) -> CommonHeader {
        let hlen = t.hlen();
        let plen = hlen + data_len;
        CommonHeader {
            pdu_type: t.code(),
            flags: extra_flags & !(FLAG_HDGST | FLAG_DDGST),
            hlen: hlen as u8,
            pdo: if data_len > 0 { hlen as u8 } else { 0 },
            plen: if plen > u32::MAX as usize {
                u32::MAX
            } else {
                plen as u32
            },
        }
    }

    /// Bytes of header digest a `t` PDU carries.
    #[inline]
    const fn hdgst_len(&self, t: PduType) -> usize {
        if self.hdgst && t.digestible() {
            DIGEST_LEN
        } else {
            0
        }
    }

    /// Header bytes of a `t` PDU with `data_len` bytes of data: header,
    /// header digest and padding up to the data offset (PDO).
    #[inline]
    pub const fn header_bytes(&self, t: PduType, data_len: usize) -> usize {
        let end = t.hlen() + self.hdgst_len(t);
        // Every header (with or without its digest) ends at a multiple of
        // 4: the default alignment needs no padding (and no division).
        if data_len == 0 || self.align <= 4 {
            end
        } else {
            end.div_ceil(self.align) * self.align
        }
    }

    /// Write the common header and header digest of a `t` PDU whose
    /// specific header is already in `hdr[8..hlen]`, for `data_len` bytes
    /// of data; returns how many header bytes to send (header, digest and
    /// padding: the data follows, then [`ddgst_len`](Self::ddgst_len)
    /// digest bytes). `hdr` must hold at least that many bytes
    /// ([`header_bytes`](Self::header_bytes); [`MAX_HEADER_LEN`] + the
    /// alignment always do).
    pub fn finish_header(
        &self,
        hdr: &mut [u8],
        t: PduType,
        extra_flags: u8,
        data_len: usize,
    ) -> usize {
        let hlen = t.hlen();
        let hd = self.hdgst_len(t);
        let mut flags = extra_flags & !(FLAG_HDGST | FLAG_DDGST);
        if hd > 0 {
            flags |= FLAG_HDGST;
        }
        let header_bytes = self.header_bytes(t, data_len);
        let (pdo, tail) = if data_len > 0 {
            if self.ddgst {
                flags |= FLAG_DDGST;
            }
            (header_bytes, if self.ddgst { DIGEST_LEN } else { 0 })
        } else {
            (0, 0)
        };
        let ch = CommonHeader {
            pdu_type: t.code(),
            flags,
            hlen: hlen as u8,
            pdo: pdo as u8,
            plen: u32::try_from(header_bytes + data_len + tail).unwrap_or(u32::MAX),
        };
        ch.encode_into(hdr);
        if hd > 0 {
            let d = crc32c(hdr.get(..hlen).unwrap_or(&[]));
            put32(hdr, hlen, d);
        }
        if header_bytes > hlen + hd {
            if let Some(pad) = hdr.get_mut(hlen + hd..header_bytes) {
                pad.fill(0);
            }
        }
        header_bytes
    }

    /// Bytes of data digest after `data_len` bytes of data.
    pub const fn ddgst_len(&self, data_len: usize) -> usize {
        if self.ddgst && data_len > 0 {
            DIGEST_LEN
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests;
