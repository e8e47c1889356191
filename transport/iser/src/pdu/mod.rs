//! iSCSI PDUs (RFC 7143 §11) and the iSER header (RFC 7145).
//!
//! Parsing is strict and total: `&[u8] -> Result<Pdu, PduError>`, never a
//! panic, with every reserved field, flag combination and length checked.
//! Encoding writes a fixed 48-byte array (no allocation on the data path).

pub mod ahs;
pub mod bhs;
pub mod data;
pub mod iser_hdr;
pub mod login;
pub mod logout;
pub mod nop;
pub mod reject;
pub mod scsi;
pub mod text;
pub mod text_pdu;
pub mod tmf;

use thiserror::Error;

pub use bhs::{pad4, Common, Lun, Opcode, BHS_LEN, RESERVED_TAG};
pub use data::{DataIn, DataOut, R2t};
pub use iser_hdr::{IserCmHdr, IserHeader, Stag, ISER_HDR_LEN, ISER_HEADERS_LEN};
pub use login::{LoginFlags, LoginRequest, LoginResponse, Stage};
pub use logout::{logout_response, LogoutReason, LogoutRequest, LogoutResponse};
pub use nop::{NopIn, NopOut};
pub use reject::{reject_reason, AsyncMessage, Reject};
pub use scsi::{ScsiCommand, ScsiResponse, TaskAttr};
pub use text_pdu::TextPdu;
pub use tmf::{tmf_response, TmfFunction, TmfRequest, TmfResponse};

const _: () = assert!(BHS_LEN == 48);
const _: () = assert!(ISER_HDR_LEN == 28);
const _: () = assert!(ISER_HEADERS_LEN == 76);
const _: () = assert!(iser_hdr::ISER_CM_HDR_LEN == 4);

/// Why bytes are not a valid PDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PduError {
    /// Fewer bytes than the header or the lengths it announces.
    #[error("truncated: need {need} bytes, got {got}")]
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        got: usize,
    },
    /// More bytes than header + AHS + padded data segment.
    #[error("{0} bytes after the padded data segment")]
    Trailing(usize),
    /// Unknown iSCSI opcode.
    #[error("unknown opcode {0:#04x}")]
    BadOpcode(u8),
    /// A known opcode this implementation does not accept (SNACK at ERL 0).
    #[error("unsupported opcode {0:?}")]
    Unsupported(Opcode),
    /// Unknown iSER opcode.
    #[error("unknown iSER opcode {0:#x}")]
    BadIserOpcode(u8),
    /// A reserved field or bit is not zero.
    #[error("reserved field set: {0}")]
    Reserved(&'static str),
    /// A field has a value the standard forbids.
    #[error("invalid field: {0}")]
    InvalidField(&'static str),
    /// The AHS area is malformed.
    #[error("bad AHS: {0}")]
    BadAhs(&'static str),
    /// Non-zero data-segment padding.
    #[error("non-zero padding")]
    Padding,
}

/// A decoded BHS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bhs {
    /// NOP-Out.
    NopOut(NopOut),
    /// SCSI Command.
    ScsiCmd(ScsiCommand),
    /// Task Management Function Request.
    TmfReq(TmfRequest),
    /// Login Request.
    LoginReq(LoginRequest),
    /// Text Request.
    TextReq(TextPdu),
    /// SCSI Data-Out.
    DataOut(DataOut),
    /// Logout Request.
    LogoutReq(LogoutRequest),
    /// NOP-In.
    NopIn(NopIn),
    /// SCSI Response.
    ScsiRsp(ScsiResponse),
    /// Task Management Function Response.
    TmfRsp(TmfResponse),
    /// Login Response.
    LoginRsp(LoginResponse),
    /// Text Response.
    TextRsp(TextPdu),
    /// SCSI Data-In.
    DataIn(DataIn),
    /// Logout Response.
    LogoutRsp(LogoutResponse),
    /// R2T.
    R2t(R2t),
    /// Asynchronous Message.
    Async(AsyncMessage),
    /// Reject.
    Reject(Reject),
}

impl Bhs {
    /// The opcode.
    pub fn opcode(&self) -> Opcode {
        match self {
            Bhs::NopOut(_) => Opcode::NopOut,
            Bhs::ScsiCmd(_) => Opcode::ScsiCmd,
            Bhs::TmfReq(_) => Opcode::TmfReq,
            Bhs::LoginReq(_) => Opcode::LoginReq,
            Bhs::TextReq(_) => Opcode::TextReq,
            Bhs::DataOut(_) => Opcode::DataOut,
            Bhs::LogoutReq(_) => Opcode::LogoutReq,
            Bhs::NopIn(_) => Opcode::NopIn,
            Bhs::ScsiRsp(_) => Opcode::ScsiRsp,
            Bhs::TmfRsp(_) => Opcode::TmfRsp,
            Bhs::LoginRsp(_) => Opcode::LoginRsp,
            Bhs::TextRsp(_) => Opcode::TextRsp,
            Bhs::DataIn(_) => Opcode::DataIn,
            Bhs::LogoutRsp(_) => Opcode::LogoutRsp,
            Bhs::R2t(_) => Opcode::R2t,
            Bhs::Async(_) => Opcode::Async,
            Bhs::Reject(_) => Opcode::Reject,
        }
    }

    fn immediate(&self) -> bool {
        match self {
            Bhs::NopOut(p) => p.immediate,
            Bhs::ScsiCmd(p) => p.immediate,
            Bhs::TmfReq(p) => p.immediate,
            Bhs::LoginReq(_) => true,
            Bhs::TextReq(p) => p.immediate,
            Bhs::LogoutReq(p) => p.immediate,
            _ => false,
        }
    }

    /// Decode and check a 48-byte BHS.
    ///
    /// # Errors
    /// [`PduError`] for anything the standard forbids.
    pub fn parse(b: &[u8; BHS_LEN]) -> Result<(Common, Bhs), PduError> {
        let c = Common::parse(b)?;
        let bhs = match c.opcode {
            Opcode::NopOut => Bhs::NopOut(NopOut::parse(&c, b)?),
            Opcode::ScsiCmd => Bhs::ScsiCmd(ScsiCommand::parse(&c, b)?),
            Opcode::TmfReq => Bhs::TmfReq(TmfRequest::parse(&c, b)?),
            Opcode::LoginReq => Bhs::LoginReq(LoginRequest::parse(&c, b)?),
            Opcode::TextReq => Bhs::TextReq(TextPdu::parse(&c, b, true)?),
            Opcode::DataOut => Bhs::DataOut(DataOut::parse(&c, b)?),
            Opcode::LogoutReq => Bhs::LogoutReq(LogoutRequest::parse(&c, b)?),
            Opcode::Snack => return Err(PduError::Unsupported(Opcode::Snack)),
            Opcode::NopIn => Bhs::NopIn(NopIn::parse(&c, b)?),
            Opcode::ScsiRsp => Bhs::ScsiRsp(ScsiResponse::parse(&c, b)?),
            Opcode::TmfRsp => Bhs::TmfRsp(TmfResponse::parse(&c, b)?),
            Opcode::LoginRsp => Bhs::LoginRsp(LoginResponse::parse(&c, b)?),
            Opcode::TextRsp => Bhs::TextRsp(TextPdu::parse(&c, b, false)?),
            Opcode::DataIn => Bhs::DataIn(DataIn::parse(&c, b)?),
            Opcode::LogoutRsp => Bhs::LogoutRsp(LogoutResponse::parse(&c, b)?),
            Opcode::R2t => Bhs::R2t(R2t::parse(&c, b)?),
            Opcode::Async => Bhs::Async(AsyncMessage::parse(&c, b)?),
            Opcode::Reject => Bhs::Reject(Reject::parse(&c, b)?),
        };
        Ok((c, bhs))
    }

    /// Encode with `ahs_words` 4-byte words of AHS and a data segment of
    /// `dsl` bytes (masked to 24 bits).
    pub fn encode(&self, ahs_words: u8, dsl: u32) -> [u8; BHS_LEN] {
        let mut b = [0u8; BHS_LEN];
        match self {
            Bhs::NopOut(p) => p.encode(&mut b),
            Bhs::ScsiCmd(p) => p.encode(&mut b),
            Bhs::TmfReq(p) => p.encode(&mut b),
            Bhs::LoginReq(p) => p.encode(&mut b),
            Bhs::TextReq(p) => p.encode(&mut b, true),
            Bhs::DataOut(p) => p.encode(&mut b),
            Bhs::LogoutReq(p) => p.encode(&mut b),
            Bhs::NopIn(p) => p.encode(&mut b),
            Bhs::ScsiRsp(p) => p.encode(&mut b),
            Bhs::TmfRsp(p) => p.encode(&mut b),
            Bhs::LoginRsp(p) => p.encode(&mut b),
            Bhs::TextRsp(p) => p.encode(&mut b, false),
            Bhs::DataIn(p) => p.encode(&mut b),
            Bhs::LogoutRsp(p) => p.encode(&mut b),
            Bhs::R2t(p) => p.encode(&mut b),
            Bhs::Async(p) => p.encode(&mut b),
            Bhs::Reject(p) => p.encode(&mut b),
        }
        bhs::put_common(&mut b, self.opcode(), self.immediate(), ahs_words, dsl);
        b
    }
}

/// A whole PDU borrowed from a receive buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pdu<'a> {
    /// The decoded header.
    pub bhs: Bhs,
    /// The raw 48 header bytes (for Reject).
    pub raw: &'a [u8; BHS_LEN],
    /// The AHS area (validated).
    pub ahs: &'a [u8],
    /// The data segment without padding.
    pub data: &'a [u8],
}

impl<'a> Pdu<'a> {
    /// Parse a PDU: BHS, AHS, data segment. The buffer may end right after
    /// the data segment or after its padding to 4 bytes (iSER accepts both);
    /// padding bytes must be zero.
    ///
    /// # Errors
    /// [`PduError`]; never panics.
    pub fn parse(buf: &'a [u8]) -> Result<Pdu<'a>, PduError> {
        let raw: &[u8; BHS_LEN] =
            buf.get(..BHS_LEN)
                .and_then(|s| s.try_into().ok())
                .ok_or(PduError::Truncated {
                    need: BHS_LEN,
                    got: buf.len(),
                })?;
        let (c, bhs) = Bhs::parse(raw)?;
        let ahs_end = BHS_LEN + c.ahs_len;
        let data_end = ahs_end + c.dsl;
        if buf.len() < data_end {
            return Err(PduError::Truncated {
                need: data_end,
                got: buf.len(),
            });
        }
        let padded = ahs_end + pad4(c.dsl);
        if buf.len() > padded {
            return Err(PduError::Trailing(buf.len() - padded));
        }
        if buf[data_end..].iter().any(|&b| b != 0) {
            return Err(PduError::Padding);
        }
        let ahs = &buf[BHS_LEN..ahs_end];
        ahs::parse_ahs(ahs, |_| {})?;
        Ok(Pdu {
            bhs,
            raw,
            ahs,
            data: &buf[ahs_end..data_end],
        })
    }
}

#[cfg(test)]
mod tests;
