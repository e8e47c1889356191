//! Get Log Page (admin 0x02) and the logs: error information, SMART/health,
//! changed namespace list and the discovery log.

use super::cmd::{AdminOpcode, NvmeCmd};
use super::transport_id::{AdrFam, TrType};
use super::{
    byte, get_str, le128, le16, le64, need, put128, put16, put32, put64, put_str, WireError,
};

/// Log page identifiers.
pub mod lid {
    /// Error Information.
    pub const ERROR: u8 = 0x01;
    /// SMART / Health Information.
    pub const SMART: u8 = 0x02;
    /// Firmware Slot Information.
    pub const FW_SLOT: u8 = 0x03;
    /// Changed Namespace List.
    pub const CHANGED_NS_LIST: u8 = 0x04;
    /// Commands Supported and Effects.
    pub const CMD_EFFECTS: u8 = 0x05;
    /// Asymmetric Namespace Access (only with ANA reporting, CMIC bit 3).
    pub const ANA: u8 = 0x0C;
    /// Discovery.
    pub const DISCOVERY: u8 = 0x70;
}

/// Get Log Page fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetLogPageCmd {
    /// Log page id.
    pub lid: u8,
    /// Log specific field.
    pub lsp: u8,
    /// Retain asynchronous event.
    pub rae: bool,
    /// Number of dwords, **1-based** (wire: NUMDU:NUMDL, 0-based, so up
    /// to 2^32: wider than the wire field).
    pub numd: u64,
    /// Byte offset into the log (dword aligned).
    pub lpo: u64,
    /// Namespace id.
    pub nsid: u32,
}

impl GetLogPageCmd {
    /// The fields of `cmd`.
    pub fn from_cmd(cmd: &NvmeCmd) -> Self {
        let numdl = cmd.cdw10 >> 16;
        let numdu = cmd.cdw11 & 0xFFFF;
        GetLogPageCmd {
            lid: cmd.cdw10 as u8,
            lsp: ((cmd.cdw10 >> 8) & 0x7F) as u8,
            rae: (cmd.cdw10 >> 15) & 1 != 0,
            numd: u64::from((numdu << 16) | numdl) + 1,
            lpo: u64::from(cmd.cdw12) | (u64::from(cmd.cdw13) << 32),
            nsid: cmd.nsid,
        }
    }

    /// Bytes to transfer (NUMD × 4).
    pub fn len(&self) -> u64 {
        self.numd * 4
    }

    /// Whether the transfer length is zero (never: NUMD is 1-based).
    pub fn is_empty(&self) -> bool {
        self.numd == 0
    }

    /// A Get Log Page SQE reading `len` bytes (a multiple of 4, at least 4)
    /// at `lpo`.
    ///
    /// # Errors
    ///
    /// [`WireError::InvalidField`] when `len` is not a positive multiple of
    /// 4 or exceeds 2^32 dwords.
    pub fn to_cmd(
        lid: u8,
        nsid: u32,
        len: u64,
        lpo: u64,
        rae: bool,
        cid: u16,
    ) -> Result<NvmeCmd, WireError> {
        if len == 0 || len % 4 != 0 || len / 4 > 1 << 32 {
            return Err(WireError::InvalidField {
                what: "log length",
                value: len,
            });
        }
        let numd = (len / 4 - 1) as u32;
        let mut c = NvmeCmd::new(AdminOpcode::GetLogPage.code(), cid);
        c.nsid = nsid;
        c.cdw10 = u32::from(lid) | (u32::from(rae) << 15) | ((numd & 0xFFFF) << 16);
        c.cdw11 = numd >> 16;
        c.cdw12 = lpo as u32;
        c.cdw13 = (lpo >> 32) as u32;
        Ok(c)
    }
}

/// Size of one error log entry.
pub const ERROR_LOG_ENTRY_SIZE: usize = 64;

/// One Error Information log entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ErrorLogEntry {
    /// Error count (unique, increasing; 0 = empty entry).
    pub error_count: u64,
    /// Submission queue id.
    pub sqid: u16,
    /// Command id.
    pub cid: u16,
    /// Status field (bit 0 = phase).
    pub status: u16,
    /// Parameter error location.
    pub param_error_location: u16,
    /// LBA.
    pub lba: u64,
    /// Namespace.
    pub nsid: u32,
    /// Transport type.
    pub trtype: u8,
    /// Opcode.
    pub opcode: u8,
}

impl ErrorLogEntry {
    /// Encode.
    pub fn encode(&self) -> [u8; ERROR_LOG_ENTRY_SIZE] {
        let mut b = [0u8; ERROR_LOG_ENTRY_SIZE];
        put64(&mut b, 0, self.error_count);
        put16(&mut b, 8, self.sqid);
        put16(&mut b, 10, self.cid);
        put16(&mut b, 12, self.status);
        put16(&mut b, 14, self.param_error_location);
        put64(&mut b, 16, self.lba);
        put32(&mut b, 24, self.nsid);
        b[29] = self.trtype;
        b[31] = self.opcode;
        b
    }

    /// Parse.
    ///
    /// # Errors
    ///
    /// [`WireError::Short`] under 64 bytes.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        let b: &[u8; ERROR_LOG_ENTRY_SIZE] = need(b, "error log entry")?;
        Ok(ErrorLogEntry {
            error_count: le64(b, 0),
            sqid: le16(b, 8),
            cid: le16(b, 10),
            status: le16(b, 12),
            param_error_location: le16(b, 14),
            lba: le64(b, 16),
            nsid: super::le32(b, 24),
            trtype: b[29],
            opcode: b[31],
        })
    }
}

/// Size of the SMART / health log.
pub const SMART_LOG_SIZE: usize = 512;

/// The SMART / health log fields this target reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SmartLog {
    /// Critical warning bits.
    pub critical_warning: u8,
    /// Composite temperature in kelvin.
    pub temperature: u16,
    /// Available spare, percent.
    pub available_spare: u8,
    /// Spare threshold, percent.
    pub spare_threshold: u8,
    /// Percentage used.
    pub percent_used: u8,
    /// Data units read (1000 × 512 bytes).
    pub data_units_read: u128,
    /// Data units written.
    pub data_units_written: u128,
    /// Host read commands.
    pub host_reads: u128,
    /// Host write commands.
    pub host_writes: u128,
    /// Controller busy time, minutes.
    pub ctrl_busy_minutes: u128,
    /// Power-on hours.
    pub power_on_hours: u128,
    /// Unsafe shutdowns.
    pub unsafe_shutdowns: u128,
    /// Media errors.
    pub media_errors: u128,
    /// Error log entries ever created.
    pub num_err_log_entries: u128,
}

impl SmartLog {
    /// Encode.
    pub fn encode(&self) -> [u8; SMART_LOG_SIZE] {
        let mut b = [0u8; SMART_LOG_SIZE];
        b[0] = self.critical_warning;
        put16(&mut b, 1, self.temperature);
        b[3] = self.available_spare;
        b[4] = self.spare_threshold;
        b[5] = self.percent_used;
        put128(&mut b, 32, self.data_units_read);
        put128(&mut b, 48, self.data_units_written);
        put128(&mut b, 64, self.host_reads);
        put128(&mut b, 80, self.host_writes);
        put128(&mut b, 96, self.ctrl_busy_minutes);
        put128(&mut b, 128, self.power_on_hours);
        put128(&mut b, 144, self.unsafe_shutdowns);
        put128(&mut b, 160, self.media_errors);
        put128(&mut b, 176, self.num_err_log_entries);
        b
    }

    /// Parse.
    ///
    /// # Errors
    ///
    /// [`WireError::Short`] under 512 bytes.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        let b: &[u8; SMART_LOG_SIZE] = need(b, "SMART log")?;
        Ok(SmartLog {
            critical_warning: b[0],
            temperature: le16(b, 1),
            available_spare: b[3],
            spare_threshold: b[4],
            percent_used: b[5],
            data_units_read: le128(b, 32),
            data_units_written: le128(b, 48),
            host_reads: le128(b, 64),
            host_writes: le128(b, 80),
            ctrl_busy_minutes: le128(b, 96),
            power_on_hours: le128(b, 128),
            unsafe_shutdowns: le128(b, 144),
            media_errors: le128(b, 160),
            num_err_log_entries: le128(b, 176),
        })
    }
}

/// Size of the Commands Supported and Effects log: 256 admin and 256 I/O
/// command entries of 4 bytes.
pub const CMD_EFFECTS_LOG_SIZE: usize = 4096;
/// Byte offset of the I/O command entries in the effects log.
pub const CMD_EFFECTS_IO_OFFSET: usize = 1024;

/// Commands Supported and Effects entry bits.
pub mod effects {
    /// CSUPP: the command is supported.
    pub const CSUPP: u32 = 1 << 0;
    /// LBCC: the command may change logical block content.
    pub const LBCC: u32 = 1 << 1;
    /// NCC: the command may change namespace capabilities.
    pub const NCC: u32 = 1 << 2;
    /// NIC: the command may change the namespace inventory.
    pub const NIC: u32 = 1 << 3;
    /// CCC: the command may change controller capabilities.
    pub const CCC: u32 = 1 << 4;
}

/// Encode a Commands Supported and Effects log from `(opcode, effects)`
/// pairs of admin and of I/O commands (opcodes not listed: not supported).
pub fn encode_cmd_effects(admin: &[(u8, u32)], io: &[(u8, u32)]) -> [u8; CMD_EFFECTS_LOG_SIZE] {
    let mut b = [0u8; CMD_EFFECTS_LOG_SIZE];
    for &(op, e) in admin {
        put32(&mut b, 4 * usize::from(op), e);
    }
    for &(op, e) in io {
        put32(&mut b, CMD_EFFECTS_IO_OFFSET + 4 * usize::from(op), e);
    }
    b
}

/// The effects of admin opcode `op` (`admin`) or I/O opcode `op` in an
/// effects log.
///
/// # Errors
///
/// [`WireError::Short`] under 4096 bytes.
pub fn cmd_effects_of(b: &[u8], admin: bool, op: u8) -> Result<u32, WireError> {
    let b: &[u8; CMD_EFFECTS_LOG_SIZE] = need(b, "commands supported and effects log")?;
    let base = if admin { 0 } else { CMD_EFFECTS_IO_OFFSET };
    Ok(super::le32(b, base + 4 * usize::from(op)))
}

/// Size of the changed namespace list log.
pub const CHANGED_NS_LIST_SIZE: usize = 4096;
/// Most NSIDs the changed namespace list holds.
pub const CHANGED_NS_MAX: usize = 1024;
/// First entry meaning "more than 1024 namespaces changed".
pub const CHANGED_NS_OVERFLOW: u32 = 0xFFFF_FFFF;

/// Encode a changed namespace list: the NSIDs, or the overflow marker when
/// there are more than 1024 (or `overflow` is set).
pub fn encode_changed_ns_list(nsids: &[u32], overflow: bool, b: &mut [u8; CHANGED_NS_LIST_SIZE]) {
    b.fill(0);
    if overflow || nsids.len() > CHANGED_NS_MAX {
        put32(b, 0, CHANGED_NS_OVERFLOW);
        return;
    }
    for (i, id) in nsids.iter().enumerate() {
        put32(b, 4 * i, *id);
    }
}

/// Size of the discovery log header and of each entry.
pub const DISCOVERY_RECORD_SIZE: usize = 1024;

/// The discovery log header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DiscoveryLogHeader {
    /// Generation counter (changes with any change of the log).
    pub genctr: u64,
    /// Number of entries.
    pub numrec: u64,
    /// Record format (0).
    pub recfmt: u16,
}

impl DiscoveryLogHeader {
    /// Encode.
    pub fn encode(&self) -> [u8; DISCOVERY_RECORD_SIZE] {
        let mut b = [0u8; DISCOVERY_RECORD_SIZE];
        put64(&mut b, 0, self.genctr);
        put64(&mut b, 8, self.numrec);
        put16(&mut b, 16, self.recfmt);
        b
    }

    /// Parse (the first 18 bytes are enough: hosts read a short header first).
    ///
    /// # Errors
    ///
    /// [`WireError::Short`] under 18 bytes.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        let b: &[u8; 18] = need(b, "discovery log header")?;
        Ok(DiscoveryLogHeader {
            genctr: le64(b, 0),
            numrec: le64(b, 8),
            recfmt: le16(b, 16),
        })
    }
}

/// Discovery entry SUBTYPE: referral to another discovery service.
pub const SUBTYPE_REFERRAL: u8 = 1;
/// Discovery entry SUBTYPE: NVM subsystem.
pub const SUBTYPE_NVME: u8 = 2;
/// Discovery entry SUBTYPE: the current discovery subsystem.
pub const SUBTYPE_CURRENT_DISCOVERY: u8 = 3;
/// TREQ: secure channel not required.
pub const TREQ_SECURE_CHANNEL_NOT_REQUIRED: u8 = 2;
/// TREQ bit 2: SQ flow control disable supported.
pub const TREQ_SQFLOW_DISABLE: u8 = 1 << 2;
/// The TREQ of this target's entries: secure channel "not specified"
/// (bits 1:0 = 0) with SQ flow control disable supported (bit 2), the
/// Linux target's default (`NVMF_TREQ_DISABLE_SQFLOW`). nvme-cli decodes
/// only 0, 1, 2 and 4 (6, "not required" with bit 2, prints as
/// "unrecognized"), and a host enables `disable_sqflow` from bit 2.
pub const TREQ_DEFAULT: u8 = TREQ_SQFLOW_DISABLE;

/// RDMA transport specific address subtype (TSAS) of a discovery entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RdmaTsas {
    /// QP service type (1 = reliable connected).
    pub qptype: u8,
    /// Provider type (1 none, 2 IB, 3 RoCE v1, 4 RoCE v2, 5 iWARP).
    pub prtype: u8,
    /// Connection management service (1 = RDMA CM).
    pub cms: u8,
    /// Partition key.
    pub pkey: u16,
}

impl RdmaTsas {
    /// RC, no provider type, RDMA CM: what Linux and SPDK targets send.
    pub const fn rc_cm() -> Self {
        RdmaTsas {
            qptype: 1,
            prtype: 1,
            cms: 1,
            pkey: 0,
        }
    }
}

/// One discovery log entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryLogEntry {
    /// Transport type.
    pub trtype: TrType,
    /// Address family.
    pub adrfam: AdrFam,
    /// Subsystem type.
    pub subtype: u8,
    /// Transport requirements.
    pub treq: u8,
    /// Port id.
    pub portid: u16,
    /// Controller id (0xFFFF: dynamic).
    pub cntlid: u16,
    /// Admin max SQ size.
    pub asqsz: u16,
    /// Entry flags.
    pub eflags: u16,
    /// Service id (32 bytes on the wire, space padded).
    pub trsvcid: String,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Address (256 bytes on the wire, space padded).
    pub traddr: String,
    /// RDMA TSAS (only for trtype RDMA; zero otherwise).
    pub rdma: Option<RdmaTsas>,
}

/// Discovery entry byte offsets.
pub mod disc_off {
    /// TRTYPE.
    pub const TRTYPE: usize = 0;
    /// ADRFAM.
    pub const ADRFAM: usize = 1;
    /// SUBTYPE.
    pub const SUBTYPE: usize = 2;
    /// TREQ.
    pub const TREQ: usize = 3;
    /// PORTID.
    pub const PORTID: usize = 4;
    /// CNTLID.
    pub const CNTLID: usize = 6;
    /// ASQSZ.
    pub const ASQSZ: usize = 8;
    /// EFLAGS.
    pub const EFLAGS: usize = 10;
    /// TRSVCID (32 bytes).
    pub const TRSVCID: usize = 32;
    /// SUBNQN (256 bytes).
    pub const SUBNQN: usize = 256;
    /// TRADDR (256 bytes).
    pub const TRADDR: usize = 512;
    /// TSAS (256 bytes).
    pub const TSAS: usize = 768;
}

const _: () = assert!(disc_off::TSAS + 256 == DISCOVERY_RECORD_SIZE);
const _: () = assert!(disc_off::TRSVCID + 32 <= disc_off::SUBNQN);

impl DiscoveryLogEntry {
    /// Encode.
    pub fn encode(&self) -> [u8; DISCOVERY_RECORD_SIZE] {
        use disc_off as o;
        let mut b = [0u8; DISCOVERY_RECORD_SIZE];
        b[o::TRTYPE] = self.trtype.code();
        b[o::ADRFAM] = self.adrfam.code();
        b[o::SUBTYPE] = self.subtype;
        b[o::TREQ] = self.treq;
        put16(&mut b, o::PORTID, self.portid);
        put16(&mut b, o::CNTLID, self.cntlid);
        put16(&mut b, o::ASQSZ, self.asqsz);
        put16(&mut b, o::EFLAGS, self.eflags);
        put_str(&mut b, o::TRSVCID, 32, &self.trsvcid, b' ');
        put_str(&mut b, o::SUBNQN, 255, &self.subnqn, 0);
        put_str(&mut b, o::TRADDR, 256, &self.traddr, b' ');
        if let Some(t) = self.rdma {
            b[o::TSAS] = t.qptype;
            b[o::TSAS + 1] = t.prtype;
            b[o::TSAS + 2] = t.cms;
            put16(&mut b, o::TSAS + 8, t.pkey);
        }
        b
    }

    /// Parse.
    ///
    /// # Errors
    ///
    /// [`WireError::Short`] under 1024 bytes, [`WireError::BadString`] for a
    /// non-ASCII string.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        use disc_off as o;
        let b: &[u8; DISCOVERY_RECORD_SIZE] = need(b, "discovery log entry")?;
        let trtype = TrType::from_code(b[o::TRTYPE]);
        Ok(DiscoveryLogEntry {
            trtype,
            adrfam: AdrFam::from_code(b[o::ADRFAM]),
            subtype: b[o::SUBTYPE],
            treq: b[o::TREQ],
            portid: le16(b, o::PORTID),
            cntlid: le16(b, o::CNTLID),
            asqsz: le16(b, o::ASQSZ),
            eflags: le16(b, o::EFLAGS),
            trsvcid: get_str(b, o::TRSVCID, 32, "TRSVCID", true)?,
            subnqn: get_str(b, o::SUBNQN, 256, "SUBNQN", false)?,
            traddr: get_str(b, o::TRADDR, 256, "TRADDR", true)?,
            rdma: (trtype == TrType::Rdma).then(|| RdmaTsas {
                qptype: byte(b, o::TSAS),
                prtype: byte(b, o::TSAS + 1),
                cms: byte(b, o::TSAS + 2),
                pkey: le16(b, o::TSAS + 8),
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_log_page_fields() {
        let c = GetLogPageCmd::to_cmd(lid::DISCOVERY, 0, 0x4_0000 + 4, 1024, true, 3).unwrap();
        let f = GetLogPageCmd::from_cmd(&c);
        assert_eq!(f.lid, 0x70);
        assert!(f.rae);
        assert_eq!(f.len(), 0x4_0004);
        assert_eq!(f.lpo, 1024);
        assert_eq!(c.cdw11, 1, "NUMDU carries the high bits");
        assert!(GetLogPageCmd::to_cmd(2, 0, 6, 0, false, 1).is_err());
        assert!(GetLogPageCmd::to_cmd(2, 0, 0, 0, false, 1).is_err());
    }

    #[test]
    fn largest_numd_on_the_wire_does_not_overflow() {
        // NUMDU:NUMDL all ones is 2^32 dwords (found by the nvmf_admin fuzzer:
        // the 1-based count overflowed a u32).
        let mut c = GetLogPageCmd::to_cmd(lid::ERROR, 0, 4, 0, false, 1).unwrap();
        c.cdw10 |= 0xFFFF << 16;
        c.cdw11 = 0xFFFF;
        let f = GetLogPageCmd::from_cmd(&c);
        assert_eq!(f.numd, 1 << 32);
        assert_eq!(f.len(), 1 << 34);
        let back = GetLogPageCmd::to_cmd(lid::ERROR, 0, f.len(), 0, false, 1).unwrap();
        assert_eq!((back.cdw10 >> 16, back.cdw11), (0xFFFF, 0xFFFF));
    }

    #[test]
    fn discovery_entry_layout() {
        let e = DiscoveryLogEntry {
            trtype: TrType::Rdma,
            adrfam: AdrFam::Ipv4,
            subtype: SUBTYPE_NVME,
            treq: TREQ_SECURE_CHANNEL_NOT_REQUIRED,
            portid: 1,
            cntlid: 0xFFFF,
            asqsz: 32,
            eflags: 0,
            trsvcid: "4420".into(),
            subnqn: "nqn.2024-01.io.pollux:a".into(),
            traddr: "192.168.1.10".into(),
            rdma: Some(RdmaTsas::rc_cm()),
        };
        let b = e.encode();
        assert_eq!(&b[..4], &[1, 1, 2, 2]);
        assert_eq!(&b[6..10], &[0xFF, 0xFF, 32, 0]);
        assert_eq!(&b[32..37], b"4420 ");
        assert_eq!(&b[512..524], b"192.168.1.10");
        assert_eq!(&b[768..771], &[1, 1, 1]);
        assert_eq!(DiscoveryLogEntry::parse(&b).unwrap(), e);
        let h = DiscoveryLogHeader {
            genctr: 5,
            numrec: 2,
            recfmt: 0,
        };
        assert_eq!(DiscoveryLogHeader::parse(&h.encode()).unwrap(), h);
    }

    #[test]
    fn other_logs() {
        let e = ErrorLogEntry {
            error_count: 3,
            sqid: 1,
            cid: 9,
            status: 0x8002,
            opcode: 0x42,
            ..ErrorLogEntry::default()
        };
        assert_eq!(ErrorLogEntry::parse(&e.encode()).unwrap(), e);
        let s = SmartLog {
            temperature: 300,
            available_spare: 100,
            host_reads: 7,
            ..SmartLog::default()
        };
        let b = s.encode();
        assert_eq!(&b[1..3], &300u16.to_le_bytes());
        assert_eq!(SmartLog::parse(&b).unwrap(), s);
        let mut c = [0u8; CHANGED_NS_LIST_SIZE];
        encode_changed_ns_list(&[3, 1], false, &mut c);
        assert_eq!(&c[..8], &[3, 0, 0, 0, 1, 0, 0, 0]);
        encode_changed_ns_list(&[], true, &mut c);
        assert_eq!(&c[..4], &[0xFF; 4]);
    }

    #[test]
    fn cmd_effects_layout() {
        let b = encode_cmd_effects(
            &[(0x06, effects::CSUPP)],
            &[(0x01, effects::CSUPP | effects::LBCC)],
        );
        assert_eq!(&b[24..28], &[1, 0, 0, 0]);
        assert_eq!(&b[1028..1032], &[3, 0, 0, 0]);
        assert_eq!(cmd_effects_of(&b, true, 0x06).unwrap(), 1);
        assert_eq!(cmd_effects_of(&b, false, 0x01).unwrap(), 3);
        assert_eq!(cmd_effects_of(&b, false, 0x06).unwrap(), 0);
        assert!(cmd_effects_of(&b[..100], true, 0).is_err());
    }
}
