//! Fabrics Connect: the SQE fields, the 1024-byte Connect data and the
//! response DW0.

use super::cmd::{FabricsType, NvmeCmd};
use super::{get_str, le16, need, put, put16, put_str, WireError};

/// Size of the Connect data.
pub const CONNECT_DATA_SIZE: usize = 1024;
/// Size of an NQN field (NUL-terminated; at most 223 bytes of name).
pub const NQN_FIELD_SIZE: usize = 256;
/// Longest NQN.
pub const NQN_MAX_LEN: usize = 223;
/// CNTLID of an admin Connect under the dynamic controller model.
pub const CNTLID_DYNAMIC: u16 = 0xFFFF;

/// Byte offsets in the Connect data (IPO values when IATTR bit 0 is set).
pub mod data_off {
    /// Host identifier (16 bytes).
    pub const HOSTID: usize = 0;
    /// Controller id (2 bytes).
    pub const CNTLID: usize = 16;
    /// Subsystem NQN (256 bytes).
    pub const SUBNQN: usize = 256;
    /// Host NQN (256 bytes).
    pub const HOSTNQN: usize = 512;
}

/// Byte offsets of the Connect fields in the SQE (IPO values when IATTR bit 0
/// is clear).
pub mod sqe_off {
    /// Record format (2 bytes).
    pub const RECFMT: usize = 40;
    /// Queue id (2 bytes).
    pub const QID: usize = 42;
    /// SQ size, 0-based (2 bytes).
    pub const SQSIZE: usize = 44;
    /// Connect attributes (1 byte).
    pub const CATTR: usize = 46;
    /// Keep-alive timeout in ms (4 bytes).
    pub const KATO: usize = 48;
}

const _: () = assert!(data_off::HOSTNQN + NQN_FIELD_SIZE + 256 == CONNECT_DATA_SIZE);
const _: () = assert!(data_off::SUBNQN + NQN_FIELD_SIZE == data_off::HOSTNQN);
const _: () = assert!(sqe_off::KATO + 4 <= super::cmd::SQE_SIZE);

/// CATTR bit 2: the host disables SQ flow control (SQHD = 0xFFFF).
pub const CATTR_DISABLE_SQ_FLOW: u8 = 1 << 2;

/// The Connect fields of the SQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConnectCmd {
    /// Record format (must be 0).
    pub recfmt: u16,
    /// Queue id (0 = admin).
    pub qid: u16,
    /// SQ size, 0-based.
    pub sqsize: u16,
    /// Connect attributes.
    pub cattr: u8,
    /// Keep-alive timeout in ms.
    pub kato: u32,
}

impl ConnectCmd {
    /// The Connect fields of `cmd` (which must be a Fabrics Connect).
    pub fn from_cmd(cmd: &NvmeCmd) -> Self {
        ConnectCmd {
            recfmt: cmd.cdw10 as u16,
            qid: (cmd.cdw10 >> 16) as u16,
            sqsize: cmd.cdw11 as u16,
            cattr: (cmd.cdw11 >> 16) as u8,
            kato: cmd.cdw12,
        }
    }

    /// A Connect SQE with these fields (the SGL is left null).
    pub fn to_cmd(&self, cid: u16) -> NvmeCmd {
        let mut c = NvmeCmd::fabrics(FabricsType::Connect, cid);
        c.cdw10 = u32::from(self.recfmt) | (u32::from(self.qid) << 16);
        c.cdw11 = u32::from(self.sqsize) | (u32::from(self.cattr) << 16);
        c.cdw12 = self.kato;
        c
    }

    /// Whether the host disabled SQ flow control.
    pub fn sq_flow_disabled(&self) -> bool {
        self.cattr & CATTR_DISABLE_SQ_FLOW != 0
    }
}

/// The 1024-byte Connect data.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnectData {
    /// Host identifier (a UUID).
    pub hostid: [u8; 16],
    /// Controller id: [`CNTLID_DYNAMIC`] on the admin queue.
    pub cntlid: u16,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Host NQN.
    pub hostnqn: String,
}

impl ConnectData {
    /// Parse.
    ///
    /// # Errors
    ///
    /// [`WireError::Short`] under 1024 bytes; [`WireError::BadString`] when an
    /// NQN is not NUL-terminated printable ASCII.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        let b: &[u8; CONNECT_DATA_SIZE] = need(b, "Connect data")?;
        let mut hostid = [0u8; 16];
        hostid.copy_from_slice(&b[..16]);
        Ok(ConnectData {
            hostid,
            cntlid: le16(b, data_off::CNTLID),
            subnqn: parse_nqn(b, data_off::SUBNQN, "SUBNQN")?,
            hostnqn: parse_nqn(b, data_off::HOSTNQN, "HOSTNQN")?,
        })
    }

    /// Encode into `out` (NQNs longer than 255 bytes are truncated).
    pub fn encode_into(&self, out: &mut [u8; CONNECT_DATA_SIZE]) {
        out.fill(0);
        put(out, data_off::HOSTID, &self.hostid);
        put16(out, data_off::CNTLID, self.cntlid);
        put_str(out, data_off::SUBNQN, NQN_FIELD_SIZE - 1, &self.subnqn, 0);
        put_str(out, data_off::HOSTNQN, NQN_FIELD_SIZE - 1, &self.hostnqn, 0);
    }

    /// The 1024 encoded bytes.
    pub fn encode(&self) -> [u8; CONNECT_DATA_SIZE] {
        let mut out = [0u8; CONNECT_DATA_SIZE];
        self.encode_into(&mut out);
        out
    }
}

/// An NQN field: NUL-terminated inside its 256 bytes.
fn parse_nqn(b: &[u8], off: usize, what: &'static str) -> Result<String, WireError> {
    let field = b.get(off..off + NQN_FIELD_SIZE).ok_or(WireError::Short {
        what,
        need: off + NQN_FIELD_SIZE,
        got: b.len(),
    })?;
    if !field.contains(&0) {
        return Err(WireError::BadString { what });
    }
    get_str(b, off, NQN_FIELD_SIZE, what, false)
}

/// Connect response DW0 on success: bits 0-15 CNTLID; bits 17 (ATR) and 18
/// (ASCR) clear (no authentication).
pub fn success_dw0(cntlid: u16) -> u32 {
    u32::from(cntlid)
}

/// Connect response DW0 for Connect Invalid Parameters: IPO (byte offset of
/// the bad field) in bits 0-15, IATTR in bits 16-23 (bit 0 set = the offset
/// is in the Connect data, clear = in the SQE).
pub fn invalid_param_dw0(ipo: u16, in_data: bool) -> u32 {
    u32::from(ipo) | (u32::from(in_data) << 16)
}

/// `(IPO, in_data)` of a Connect Invalid Parameters DW0.
pub fn parse_invalid_param_dw0(dw0: u32) -> (u16, bool) {
    (dw0 as u16, (dw0 >> 16) & 1 != 0)
}

/// Whether `nqn` is a well-formed NQN: 1..=223 bytes of printable ASCII,
/// starting with `nqn.` (`nqn.yyyy-mm.reverse.domain:name`) or the UUID
/// form `nqn.2014-08.org.nvmexpress:uuid:`.
pub fn is_valid_nqn(nqn: &str) -> bool {
    if nqn.is_empty() || nqn.len() > NQN_MAX_LEN {
        return false;
    }
    if !nqn.bytes().all(|c| (0x21..0x7f).contains(&c)) {
        return false;
    }
    let Some(rest) = nqn.strip_prefix("nqn.") else {
        return false;
    };
    // "yyyy-mm." date, then a reverse domain name.
    let date = rest.as_bytes();
    date.len() > 8
        && date[..4].iter().all(u8::is_ascii_digit)
        && date[4] == b'-'
        && date[5..7].iter().all(u8::is_ascii_digit)
        && date[7] == b'.'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_data_round_trip_and_layout() {
        let d = ConnectData {
            hostid: [7; 16],
            cntlid: CNTLID_DYNAMIC,
            subnqn: "nqn.2024-01.io.pollux:sub1".into(),
            hostnqn: "nqn.2014-08.org.nvmexpress:uuid:1234".into(),
        };
        let b = d.encode();
        assert_eq!(&b[16..18], &[0xFF, 0xFF]);
        assert_eq!(&b[256..260], b"nqn.");
        assert_eq!(b[256 + d.subnqn.len()], 0);
        assert_eq!(&b[512..516], b"nqn.");
        assert_eq!(ConnectData::parse(&b).unwrap(), d);
        assert!(ConnectData::parse(&b[..1023]).is_err());
    }

    #[test]
    fn unterminated_nqn_is_rejected() {
        let mut b = [0u8; CONNECT_DATA_SIZE];
        b[256..512].fill(b'a');
        assert!(matches!(
            ConnectData::parse(&b),
            Err(WireError::BadString { what: "SUBNQN" })
        ));
    }

    #[test]
    fn connect_cmd_fields() {
        let c = ConnectCmd {
            recfmt: 0,
            qid: 3,
            sqsize: 127,
            cattr: CATTR_DISABLE_SQ_FLOW,
            kato: 15_000,
        };
        let sqe = c.to_cmd(9);
        let b = sqe.encode();
        assert_eq!(b[4], 0x01, "FCTYPE connect");
        assert_eq!(&b[42..44], &[3, 0]);
        assert_eq!(&b[44..46], &[127, 0]);
        assert_eq!(b[46], 4);
        assert_eq!(&b[48..52], &15_000u32.to_le_bytes());
        assert_eq!(ConnectCmd::from_cmd(&NvmeCmd::parse(&b).unwrap()), c);
        assert!(c.sq_flow_disabled());
    }

    #[test]
    fn dw0_helpers() {
        assert_eq!(invalid_param_dw0(256, true), 0x1_0100);
        assert_eq!(parse_invalid_param_dw0(0x1_0100), (256, true));
        assert_eq!(success_dw0(5), 5);
    }

    #[test]
    fn nqn_validation() {
        assert!(is_valid_nqn("nqn.2014-08.org.nvmexpress.discovery"));
        assert!(is_valid_nqn("nqn.2024-01.io.pollux:a"));
        assert!(!is_valid_nqn("iqn.2024-01.io.pollux:a"));
        assert!(!is_valid_nqn("nqn.24-01.io"));
        assert!(!is_valid_nqn("nqn.2024-01.io pollux"));
        assert!(!is_valid_nqn(&format!("nqn.2024-01.{}", "a".repeat(220))));
    }
}
