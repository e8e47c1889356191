//! NVMe/RDMA connection manager private data: the REQ (host → target), REP
//! (target → host) and REJ records.

use super::{le16, need, put16, WireError};

/// Size of the REQ and REP private data.
pub const CM_PRIVATE_DATA_SIZE: usize = 32;
/// Size of the NVMe part of a REJ.
pub const CM_REJECT_SIZE: usize = 4;

const _: () = assert!(8 + 2 + 22 == CM_PRIVATE_DATA_SIZE);

/// CM REQ private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmRequest {
    /// Record format (0).
    pub recfmt: u16,
    /// Queue id (0 = admin).
    pub qid: u16,
    /// Host receive queue size, **1-based**.
    pub hrqsize: u16,
    /// Host send queue size, **0-based**.
    pub hsqsize: u16,
    /// Controller id (I/O queues on newer hosts; 0 otherwise).
    pub cntlid: u16,
}

impl CmRequest {
    /// Parse (the target minimum: at least 32 bytes).
    ///
    /// # Errors
    ///
    /// [`WireError::Short`] under 32 bytes (reject with
    /// [`CmRejectStatus::InvalidLength`]).
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        let b: &[u8; CM_PRIVATE_DATA_SIZE] = need(b, "CM REQ private data")?;
        Ok(CmRequest {
            recfmt: le16(b, 0),
            qid: le16(b, 2),
            hrqsize: le16(b, 4),
            hsqsize: le16(b, 6),
            cntlid: le16(b, 8),
        })
    }

    /// The 32 encoded bytes.
    pub fn encode(&self) -> [u8; CM_PRIVATE_DATA_SIZE] {
        let mut b = [0u8; CM_PRIVATE_DATA_SIZE];
        put16(&mut b, 0, self.recfmt);
        put16(&mut b, 2, self.qid);
        put16(&mut b, 4, self.hrqsize);
        put16(&mut b, 6, self.hsqsize);
        put16(&mut b, 8, self.cntlid);
        b
    }

    /// Check a REQ as a target must: RECFMT 0, HSQSIZE within
    /// `max_queue_depth` (admin: 32), HRQSIZE not zero.
    ///
    /// # Errors
    ///
    /// The reject status to send.
    pub fn validate(&self, max_io_queue_depth: u16) -> Result<(), CmRejectStatus> {
        if self.recfmt != 0 {
            return Err(CmRejectStatus::InvalidRecfmt);
        }
        let limit = if self.qid == 0 {
            ADMIN_QUEUE_MAX_DEPTH
        } else {
            max_io_queue_depth
        };
        if u32::from(self.hsqsize) + 1 > u32::from(limit) {
            return Err(CmRejectStatus::InvalidHsqsize);
        }
        if self.hrqsize == 0 {
            return Err(CmRejectStatus::InvalidHrqsize);
        }
        Ok(())
    }
}

/// Most entries of an admin queue (Linux `NVME_AQ_DEPTH`).
pub const ADMIN_QUEUE_MAX_DEPTH: u16 = 32;

/// CM REP private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmAccept {
    /// Record format (0).
    pub recfmt: u16,
    /// Controller receive queue size: command capsules the target holds.
    pub crqsize: u16,
}

impl CmAccept {
    /// Parse.
    ///
    /// # Errors
    ///
    /// [`WireError::Short`] under 4 bytes.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        let b: &[u8; 4] = need(b, "CM REP private data")?;
        Ok(CmAccept {
            recfmt: le16(b, 0),
            crqsize: le16(b, 2),
        })
    }

    /// The 32 encoded bytes.
    pub fn encode(&self) -> [u8; CM_PRIVATE_DATA_SIZE] {
        let mut b = [0u8; CM_PRIVATE_DATA_SIZE];
        put16(&mut b, 0, self.recfmt);
        put16(&mut b, 2, self.crqsize);
        b
    }
}

/// NVMe/RDMA CM reject status (REJ private data bytes 2-3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CmRejectStatus {
    /// 1: private data shorter than 32 bytes.
    InvalidLength,
    /// 2: RECFMT ≠ 0.
    InvalidRecfmt,
    /// 3: QID out of range.
    InvalidQid,
    /// 4: HSQSIZE too large.
    InvalidHsqsize,
    /// 5: HRQSIZE invalid.
    InvalidHrqsize,
    /// 6: out of resources.
    NoResources,
    /// 7: IRD invalid.
    InvalidIrd,
    /// 8: ORD invalid.
    InvalidOrd,
    /// 9: CNTLID does not match.
    InvalidCntlid,
    /// Any other value.
    Other(u16),
}

impl CmRejectStatus {
    /// The wire value.
    pub const fn code(self) -> u16 {
        match self {
            CmRejectStatus::InvalidLength => 1,
            CmRejectStatus::InvalidRecfmt => 2,
            CmRejectStatus::InvalidQid => 3,
            CmRejectStatus::InvalidHsqsize => 4,
            CmRejectStatus::InvalidHrqsize => 5,
            CmRejectStatus::NoResources => 6,
            CmRejectStatus::InvalidIrd => 7,
            CmRejectStatus::InvalidOrd => 8,
            CmRejectStatus::InvalidCntlid => 9,
            CmRejectStatus::Other(v) => v,
        }
    }

    /// The status of a wire value.
    pub const fn from_code(v: u16) -> Self {
        match v {
            1 => CmRejectStatus::InvalidLength,
            2 => CmRejectStatus::InvalidRecfmt,
            3 => CmRejectStatus::InvalidQid,
            4 => CmRejectStatus::InvalidHsqsize,
            5 => CmRejectStatus::InvalidHrqsize,
            6 => CmRejectStatus::NoResources,
            7 => CmRejectStatus::InvalidIrd,
            8 => CmRejectStatus::InvalidOrd,
            9 => CmRejectStatus::InvalidCntlid,
            v => CmRejectStatus::Other(v),
        }
    }
}

/// CM REJ private data (NVMe part).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmReject {
    /// Record format (0).
    pub recfmt: u16,
    /// Why.
    pub status: CmRejectStatus,
}

impl CmReject {
    /// A reject with `status`.
    pub const fn new(status: CmRejectStatus) -> Self {
        CmReject { recfmt: 0, status }
    }

    /// Parse (the transport may deliver more bytes, zero padded).
    ///
    /// # Errors
    ///
    /// [`WireError::Short`] under 4 bytes.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        let b: &[u8; CM_REJECT_SIZE] = need(b, "CM REJ private data")?;
        Ok(CmReject {
            recfmt: le16(b, 0),
            status: CmRejectStatus::from_code(le16(b, 2)),
        })
    }

    /// The 4 encoded bytes.
    pub fn encode(&self) -> [u8; CM_REJECT_SIZE] {
        let mut b = [0u8; CM_REJECT_SIZE];
        put16(&mut b, 0, self.recfmt);
        put16(&mut b, 2, self.status.code());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn req_layout_and_validation() {
        let r = CmRequest {
            recfmt: 0,
            qid: 2,
            hrqsize: 128,
            hsqsize: 127,
            cntlid: 5,
        };
        let b = r.encode();
        assert_eq!(&b[..10], &[0, 0, 2, 0, 128, 0, 127, 0, 5, 0]);
        assert!(b[10..].iter().all(|&x| x == 0));
        assert_eq!(CmRequest::parse(&b).unwrap(), r);
        assert!(CmRequest::parse(&b[..31]).is_err());
        assert_eq!(r.validate(128), Ok(()));
        assert_eq!(r.validate(64), Err(CmRejectStatus::InvalidHsqsize));
        let admin = CmRequest {
            qid: 0,
            hsqsize: 32,
            ..r
        };
        assert_eq!(admin.validate(128), Err(CmRejectStatus::InvalidHsqsize));
        let fmt = CmRequest { recfmt: 1, ..r };
        assert_eq!(fmt.validate(128), Err(CmRejectStatus::InvalidRecfmt));
    }

    #[test]
    fn rep_and_rej() {
        let a = CmAccept {
            recfmt: 0,
            crqsize: 128,
        };
        let b = a.encode();
        assert_eq!(&b[..4], &[0, 0, 128, 0]);
        assert_eq!(CmAccept::parse(&b).unwrap(), a);
        let j = CmReject::new(CmRejectStatus::InvalidCntlid);
        assert_eq!(j.encode(), [0, 0, 9, 0]);
        let mut padded = [0u8; 148];
        padded[..4].copy_from_slice(&j.encode());
        assert_eq!(CmReject::parse(&padded).unwrap(), j);
        for v in 0..12 {
            assert_eq!(CmRejectStatus::from_code(v).code(), v);
        }
    }
}
