//! Identify (admin 0x06): the command fields and the 4096-byte data
//! structures (controller, namespace, active namespace list, namespace
//! identification descriptors).

use super::cmd::{AdminOpcode, NvmeCmd};
use super::{
    byte, bytes, get_str, le16, le32, le64, need, put, put16, put32, put64, put_str, WireError,
};

/// Size of every Identify data structure.
pub const IDENTIFY_DATA_SIZE: usize = 4096;
/// NSIDs in one active namespace list page.
pub const NS_LIST_MAX: usize = IDENTIFY_DATA_SIZE / 4;

/// CNS values.
pub mod cns {
    /// Identify Namespace.
    pub const NAMESPACE: u8 = 0x00;
    /// Identify Controller.
    pub const CONTROLLER: u8 = 0x01;
    /// Active namespace id list.
    pub const ACTIVE_NS_LIST: u8 = 0x02;
    /// Namespace identification descriptor list.
    pub const NS_ID_DESCRIPTORS: u8 = 0x03;
    /// I/O command set specific Identify Namespace.
    pub const CSI_NAMESPACE: u8 = 0x05;
    /// I/O command set specific Identify Controller.
    pub const CSI_CONTROLLER: u8 = 0x06;
}

/// Identify command fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdentifyCmd {
    /// Controller or namespace structure (CDW10 bits 0-7).
    pub cns: u8,
    /// Controller id (CDW10 bits 16-31).
    pub cntid: u16,
    /// Command set identifier (CDW11 bits 24-31).
    pub csi: u8,
    /// Namespace id of the SQE.
    pub nsid: u32,
}

impl IdentifyCmd {
    /// The fields of `cmd`.
    pub fn from_cmd(cmd: &NvmeCmd) -> Self {
        IdentifyCmd {
            cns: cmd.cdw10 as u8,
            cntid: (cmd.cdw10 >> 16) as u16,
            csi: (cmd.cdw11 >> 24) as u8,
            nsid: cmd.nsid,
        }
    }

    /// An Identify SQE.
    pub fn to_cmd(cns: u8, nsid: u32, cid: u16) -> NvmeCmd {
        let mut c = NvmeCmd::new(AdminOpcode::Identify.code(), cid);
        c.cdw10 = u32::from(cns);
        c.nsid = nsid;
        c
    }
}

/// Identify Controller byte offsets.
pub mod ctrl_off {
    /// PCI vendor id.
    pub const VID: usize = 0;
    /// Subsystem vendor id.
    pub const SSVID: usize = 2;
    /// Serial number (20 ASCII).
    pub const SN: usize = 4;
    /// Model number (40 ASCII).
    pub const MN: usize = 24;
    /// Firmware revision (8 ASCII).
    pub const FR: usize = 64;
    /// Recommended arbitration burst.
    pub const RAB: usize = 72;
    /// IEEE OUI (3 bytes).
    pub const IEEE: usize = 73;
    /// Multi-path I/O and namespace sharing capabilities.
    pub const CMIC: usize = 76;
    /// Maximum data transfer size (2^MDTS × 4 KiB).
    pub const MDTS: usize = 77;
    /// Controller id.
    pub const CNTLID: usize = 78;
    /// Version.
    pub const VER: usize = 80;
    /// Optional asynchronous events supported.
    pub const OAES: usize = 92;
    /// Controller attributes.
    pub const CTRATT: usize = 96;
    /// Controller type.
    pub const CNTRLTYPE: usize = 111;
    /// Optional admin command support.
    pub const OACS: usize = 256;
    /// Abort command limit, 0-based.
    pub const ACL: usize = 258;
    /// Asynchronous event request limit, 0-based.
    pub const AERL: usize = 259;
    /// Firmware updates.
    pub const FRMW: usize = 260;
    /// Log page attributes.
    pub const LPA: usize = 261;
    /// Error log page entries, 0-based.
    pub const ELPE: usize = 262;
    /// Number of power states support, 0-based.
    pub const NPSS: usize = 263;
    /// Warning composite temperature threshold (kelvin).
    pub const WCTEMP: usize = 266;
    /// Critical composite temperature threshold (kelvin).
    pub const CCTEMP: usize = 268;
    /// Keep-alive support (100 ms units).
    pub const KAS: usize = 320;
    /// Submission queue entry size.
    pub const SQES: usize = 512;
    /// Completion queue entry size.
    pub const CQES: usize = 513;
    /// Maximum outstanding commands.
    pub const MAXCMD: usize = 514;
    /// Number of namespaces.
    pub const NN: usize = 516;
    /// Optional NVM command support.
    pub const ONCS: usize = 520;
    /// Fused operation support.
    pub const FUSES: usize = 522;
    /// Volatile write cache.
    pub const VWC: usize = 525;
    /// SGL support.
    pub const SGLS: usize = 536;
    /// Maximum number of allowed namespaces.
    pub const MNAN: usize = 540;
    /// Subsystem NQN (256 bytes).
    pub const SUBNQN: usize = 768;
    /// I/O command capsule supported size (16-byte units).
    pub const IOCCSZ: usize = 1792;
    /// I/O response capsule supported size (16-byte units).
    pub const IORCSZ: usize = 1796;
    /// In-capsule data offset (16-byte units).
    pub const ICDOFF: usize = 1800;
    /// Fabrics controller attributes.
    pub const FCATT: usize = 1802;
    /// Maximum SGL data block descriptors.
    pub const MSDBD: usize = 1803;
    /// Optional fabrics commands support.
    pub const OFCS: usize = 1804;
    /// Power state descriptor 0 (32 bytes).
    pub const PSD0: usize = 2048;
}

const _: () = assert!(ctrl_off::SUBNQN + 256 <= ctrl_off::IOCCSZ);
const _: () = assert!(ctrl_off::OFCS + 2 <= ctrl_off::PSD0);
/// Vendor specific area (the last 1024 bytes).
const VENDOR_SPECIFIC: usize = 3072;
const _: () = assert!(ctrl_off::PSD0 + 32 * 32 == VENDOR_SPECIFIC);
const _: () = assert!(VENDOR_SPECIFIC + 1024 == IDENTIFY_DATA_SIZE);

/// CNTRLTYPE: I/O controller.
pub const CNTRLTYPE_IO: u8 = 1;
/// CNTRLTYPE: discovery controller.
pub const CNTRLTYPE_DISCOVERY: u8 = 2;

/// SGLS bits 0-1 = 01: SGLs supported, byte aligned.
pub const SGLS_SUPPORTED: u32 = 0x1;
/// SGLS bit 2: keyed SGL data block.
pub const SGLS_KEYED: u32 = 1 << 2;
/// SGLS bit 20: offset (in-capsule data) supported.
pub const SGLS_OFFSET: u32 = 1 << 20;

/// ONCS bit 2: Dataset Management.
pub const ONCS_DSM: u16 = 1 << 2;
/// ONCS bit 3: Write Zeroes.
pub const ONCS_WRITE_ZEROES: u16 = 1 << 3;

/// LPA bit 1: Commands Supported and Effects log page.
pub const LPA_CMD_EFFECTS: u8 = 1 << 1;
/// VWC bit 0: a volatile write cache is present.
pub const VWC_PRESENT: u8 = 1 << 0;
/// VWC bits 2:1 = 10b: Flush with NSID FFFFFFFFh is not supported (Invalid
/// Namespace), NVMe 1.4.
pub const VWC_NO_BROADCAST_FLUSH: u8 = 0b10 << 1;
/// LPA bit 2: extended data for Get Log Page (NUMDU, LPO).
pub const LPA_EXTENDED: u8 = 1 << 2;

/// CTRATT bit 0: 128-bit host identifier.
pub const CTRATT_HOSTID_128: u32 = 1 << 0;

/// CMIC bit 1: the subsystem may hold several controllers.
pub const CMIC_MULTI_CTRL: u8 = 1 << 1;

/// The Identify Controller fields a fabrics target fills or a host reads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IdentifyController {
    /// PCI vendor id.
    pub vid: u16,
    /// Subsystem vendor id.
    pub ssvid: u16,
    /// Serial number.
    pub sn: String,
    /// Model number.
    pub mn: String,
    /// Firmware revision.
    pub fr: String,
    /// Recommended arbitration burst.
    pub rab: u8,
    /// IEEE OUI.
    pub ieee: [u8; 3],
    /// Multi-path I/O and namespace sharing capabilities.
    pub cmic: u8,
    /// Maximum data transfer size (2^MDTS × 4 KiB; 0 = no limit).
    pub mdts: u8,
    /// Controller id.
    pub cntlid: u16,
    /// Version.
    pub ver: u32,
    /// Optional asynchronous events supported.
    pub oaes: u32,
    /// Controller attributes.
    pub ctratt: u32,
    /// Controller type.
    pub cntrltype: u8,
    /// Optional admin command support.
    pub oacs: u16,
    /// Abort command limit, 0-based.
    pub acl: u8,
    /// Asynchronous event request limit, 0-based.
    pub aerl: u8,
    /// Firmware updates.
    pub frmw: u8,
    /// Log page attributes.
    pub lpa: u8,
    /// Error log page entries, 0-based.
    pub elpe: u8,
    /// Number of power states supported, 0-based.
    pub npss: u8,
    /// Warning composite temperature threshold in kelvin (non-zero from
    /// NVMe 1.2; the default over threshold of the composite sensor).
    pub wctemp: u16,
    /// Critical composite temperature threshold in kelvin (non-zero from
    /// NVMe 1.2).
    pub cctemp: u16,
    /// Keep-alive support, 100 ms units.
    pub kas: u16,
    /// SQ entry sizes (0x66).
    pub sqes: u8,
    /// CQ entry sizes (0x44).
    pub cqes: u8,
    /// Maximum outstanding commands per queue.
    pub maxcmd: u16,
    /// Number of namespaces (largest NSID).
    pub nn: u32,
    /// Optional NVM command support.
    pub oncs: u16,
    /// Fused operation support.
    pub fuses: u16,
    /// Volatile write cache.
    pub vwc: u8,
    /// SGL support.
    pub sgls: u32,
    /// Maximum number of allowed namespaces.
    pub mnan: u32,
    /// Subsystem NQN.
    pub subnqn: String,
    /// I/O command capsule size in 16-byte units.
    pub ioccsz: u32,
    /// I/O response capsule size in 16-byte units.
    pub iorcsz: u32,
    /// In-capsule data offset in 16-byte units.
    pub icdoff: u16,
    /// Fabrics controller attributes (bit 0: static model).
    pub fcatt: u8,
    /// Maximum SGL data block descriptors.
    pub msdbd: u8,
    /// Optional fabrics commands supported.
    pub ofcs: u16,
    /// Power state 0: maximum power in centiwatts.
    pub psd0_max_power: u16,
    /// Power state 0: entry latency in µs.
    pub psd0_entry_lat: u32,
    /// Power state 0: exit latency in µs.
    pub psd0_exit_lat: u32,
}

impl IdentifyController {
    /// Encode into a zeroed 4096-byte page.
    pub fn encode_into(&self, b: &mut [u8; IDENTIFY_DATA_SIZE]) {
        use ctrl_off as o;
        b.fill(0);
        put16(b, o::VID, self.vid);
        put16(b, o::SSVID, self.ssvid);
        put_str(b, o::SN, 20, &self.sn, b' ');
        put_str(b, o::MN, 40, &self.mn, b' ');
        put_str(b, o::FR, 8, &self.fr, b' ');
        b[o::RAB] = self.rab;
        put(b, o::IEEE, &self.ieee);
        b[o::CMIC] = self.cmic;
        b[o::MDTS] = self.mdts;
        put16(b, o::CNTLID, self.cntlid);
        put32(b, o::VER, self.ver);
        put32(b, o::OAES, self.oaes);
        put32(b, o::CTRATT, self.ctratt);
        b[o::CNTRLTYPE] = self.cntrltype;
        put16(b, o::OACS, self.oacs);
        b[o::ACL] = self.acl;
        b[o::AERL] = self.aerl;
        b[o::FRMW] = self.frmw;
        b[o::LPA] = self.lpa;
        b[o::ELPE] = self.elpe;
        b[o::NPSS] = self.npss;
        put16(b, o::WCTEMP, self.wctemp);
        put16(b, o::CCTEMP, self.cctemp);
        put16(b, o::KAS, self.kas);
        b[o::SQES] = self.sqes;
        b[o::CQES] = self.cqes;
        put16(b, o::MAXCMD, self.maxcmd);
        put32(b, o::NN, self.nn);
        put16(b, o::ONCS, self.oncs);
        put16(b, o::FUSES, self.fuses);
        b[o::VWC] = self.vwc;
        put32(b, o::SGLS, self.sgls);
        put32(b, o::MNAN, self.mnan);
        put_str(b, o::SUBNQN, 255, &self.subnqn, 0);
        put32(b, o::IOCCSZ, self.ioccsz);
        put32(b, o::IORCSZ, self.iorcsz);
        put16(b, o::ICDOFF, self.icdoff);
        b[o::FCATT] = self.fcatt;
        b[o::MSDBD] = self.msdbd;
        put16(b, o::OFCS, self.ofcs);
        put16(b, o::PSD0, self.psd0_max_power);
        put32(b, o::PSD0 + 4, self.psd0_entry_lat);
        put32(b, o::PSD0 + 8, self.psd0_exit_lat);
    }

    /// Parse a 4096-byte page.
    ///
    /// # Errors
    ///
    /// [`WireError::Short`] under 4096 bytes, [`WireError::BadString`] for a
    /// non-ASCII string field.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        use ctrl_off as o;
        let b: &[u8; IDENTIFY_DATA_SIZE] = need(b, "Identify Controller")?;
        Ok(IdentifyController {
            vid: le16(b, o::VID),
            ssvid: le16(b, o::SSVID),
            sn: get_str(b, o::SN, 20, "SN", true)?,
            mn: get_str(b, o::MN, 40, "MN", true)?,
            fr: get_str(b, o::FR, 8, "FR", true)?,
            rab: b[o::RAB],
            ieee: bytes(b, o::IEEE),
            cmic: b[o::CMIC],
            mdts: b[o::MDTS],
            cntlid: le16(b, o::CNTLID),
            ver: le32(b, o::VER),
            oaes: le32(b, o::OAES),
            ctratt: le32(b, o::CTRATT),
            cntrltype: b[o::CNTRLTYPE],
            oacs: le16(b, o::OACS),
            acl: b[o::ACL],
            aerl: b[o::AERL],
            frmw: b[o::FRMW],
            lpa: b[o::LPA],
            elpe: b[o::ELPE],
            npss: b[o::NPSS],
            wctemp: le16(b, o::WCTEMP),
            cctemp: le16(b, o::CCTEMP),
            kas: le16(b, o::KAS),
            sqes: b[o::SQES],
            cqes: b[o::CQES],
            maxcmd: le16(b, o::MAXCMD),
            nn: le32(b, o::NN),
            oncs: le16(b, o::ONCS),
            fuses: le16(b, o::FUSES),
            vwc: b[o::VWC],
            sgls: le32(b, o::SGLS),
            mnan: le32(b, o::MNAN),
            subnqn: get_str(b, o::SUBNQN, 256, "SUBNQN", false)?,
            ioccsz: le32(b, o::IOCCSZ),
            iorcsz: le32(b, o::IORCSZ),
            icdoff: le16(b, o::ICDOFF),
            fcatt: b[o::FCATT],
            msdbd: b[o::MSDBD],
            ofcs: le16(b, o::OFCS),
            psd0_max_power: le16(b, o::PSD0),
            psd0_entry_lat: le32(b, o::PSD0 + 4),
            psd0_exit_lat: le32(b, o::PSD0 + 8),
        })
    }
}

/// One LBA format (LBAF entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LbaFormat {
    /// Metadata bytes per block.
    pub ms: u16,
    /// log2 of the block size.
    pub lbads: u8,
    /// Relative performance (2 bits).
    pub rp: u8,
}

impl LbaFormat {
    /// The 32-bit encoding.
    pub fn to_u32(&self) -> u32 {
        u32::from(self.ms) | (u32::from(self.lbads) << 16) | (u32::from(self.rp & 3) << 24)
    }

    /// Decode.
    pub fn from_u32(v: u32) -> Self {
        LbaFormat {
            ms: v as u16,
            lbads: (v >> 16) as u8,
            rp: ((v >> 24) & 3) as u8,
        }
    }
}

/// Identify Namespace byte offsets.
pub mod ns_off {
    /// Namespace size (blocks).
    pub const NSZE: usize = 0;
    /// Namespace capacity.
    pub const NCAP: usize = 8;
    /// Namespace utilization.
    pub const NUSE: usize = 16;
    /// Namespace features.
    pub const NSFEAT: usize = 24;
    /// Number of LBA formats, 0-based.
    pub const NLBAF: usize = 25;
    /// Formatted LBA size.
    pub const FLBAS: usize = 26;
    /// Metadata capabilities.
    pub const MC: usize = 27;
    /// End-to-end data protection capabilities.
    pub const DPC: usize = 28;
    /// End-to-end data protection type settings.
    pub const DPS: usize = 29;
    /// Multi-path I/O and namespace sharing.
    pub const NMIC: usize = 30;
    /// Deallocate logical block features.
    pub const DLFEAT: usize = 33;
    /// Namespace preferred write granularity (0-based blocks).
    pub const NPWG: usize = 64;
    /// Namespace preferred write alignment.
    pub const NPWA: usize = 66;
    /// Namespace preferred deallocate granularity.
    pub const NPDG: usize = 68;
    /// Namespace preferred deallocate alignment.
    pub const NPDA: usize = 70;
    /// Namespace optimal write size.
    pub const NOWS: usize = 72;
    /// Namespace globally unique identifier (16 bytes).
    pub const NGUID: usize = 104;
    /// IEEE extended unique identifier (8 bytes).
    pub const EUI64: usize = 120;
    /// LBA format 0 (4 bytes each, 64 of them).
    pub const LBAF0: usize = 128;
}

const _: () = assert!(ns_off::NGUID + 16 == ns_off::EUI64);
const _: () = assert!(ns_off::LBAF0 + 64 * 4 <= IDENTIFY_DATA_SIZE);

/// NSFEAT bit 4 (OPTPERF): NPWG, NPWA, NPDG, NPDA and NOWS are valid.
pub const NSFEAT_OPTPERF: u8 = 1 << 4;
/// FLBAS bit 4: metadata is transferred at the end of each block's data
/// (extended LBA), the only form fabrics carry.
pub const FLBAS_EXTENDED: u8 = 1 << 4;
/// DPC bit 4: PI may sit in the last 8 bytes of the metadata.
pub const DPC_PI_LAST: u8 = 1 << 4;

/// The optimal-I/O hints of a namespace, every one a 0-based count of
/// logical blocks (NVMe 1.4 Identify Namespace bytes 64-73).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OptimalIo {
    /// Preferred write granularity.
    pub npwg: u16,
    /// Preferred write alignment.
    pub npwa: u16,
    /// Preferred deallocate granularity.
    pub npdg: u16,
    /// Preferred deallocate alignment.
    pub npda: u16,
    /// Optimal write size.
    pub nows: u16,
}

/// The Identify Namespace fields this target fills.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IdentifyNamespace {
    /// Size in blocks.
    pub nsze: u64,
    /// Capacity in blocks.
    pub ncap: u64,
    /// Utilization in blocks.
    pub nuse: u64,
    /// Features.
    pub nsfeat: u8,
    /// Formatted LBA size.
    pub flbas: u8,
    /// Metadata capabilities.
    pub mc: u8,
    /// Protection capabilities.
    pub dpc: u8,
    /// Protection settings.
    pub dps: u8,
    /// Sharing (bit 0: may be attached to several controllers).
    pub nmic: u8,
    /// Deallocate features.
    pub dlfeat: u8,
    /// The optimal-I/O hints (valid with NSFEAT bit 4).
    pub opt_io: OptimalIo,
    /// NGUID.
    pub nguid: [u8; 16],
    /// EUI-64.
    pub eui64: [u8; 8],
    /// The LBA formats (NLBAF + 1 of them, at most 64).
    pub lbaf: Vec<LbaFormat>,
}

impl IdentifyNamespace {
    /// Encode into a zeroed 4096-byte page.
    pub fn encode_into(&self, b: &mut [u8; IDENTIFY_DATA_SIZE]) {
        use ns_off as o;
        b.fill(0);
        put64(b, o::NSZE, self.nsze);
        put64(b, o::NCAP, self.ncap);
        put64(b, o::NUSE, self.nuse);
        b[o::NSFEAT] = self.nsfeat;
        b[o::NLBAF] = self.lbaf.len().clamp(1, 64).saturating_sub(1) as u8;
        b[o::FLBAS] = self.flbas;
        b[o::MC] = self.mc;
        b[o::DPC] = self.dpc;
        b[o::DPS] = self.dps;
        b[o::NMIC] = self.nmic;
        b[o::DLFEAT] = self.dlfeat;
        put16(b, o::NPWG, self.opt_io.npwg);
        put16(b, o::NPWA, self.opt_io.npwa);
        put16(b, o::NPDG, self.opt_io.npdg);
        put16(b, o::NPDA, self.opt_io.npda);
        put16(b, o::NOWS, self.opt_io.nows);
        put(b, o::NGUID, &self.nguid);
        put(b, o::EUI64, &self.eui64);
        for (i, f) in self.lbaf.iter().take(64).enumerate() {
            put32(b, o::LBAF0 + 4 * i, f.to_u32());
        }
    }

    /// Parse a 4096-byte page.
    ///
    /// # Errors
    ///
    /// [`WireError::Short`] under 4096 bytes.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        use ns_off as o;
        let b: &[u8; IDENTIFY_DATA_SIZE] = need(b, "Identify Namespace")?;
        let n = usize::from(byte(b, o::NLBAF)).min(63) + 1;
        Ok(IdentifyNamespace {
            nsze: le64(b, o::NSZE),
            ncap: le64(b, o::NCAP),
            nuse: le64(b, o::NUSE),
            nsfeat: b[o::NSFEAT],
            flbas: b[o::FLBAS],
            mc: b[o::MC],
            dpc: b[o::DPC],
            dps: b[o::DPS],
            nmic: b[o::NMIC],
            dlfeat: b[o::DLFEAT],
            opt_io: OptimalIo {
                npwg: le16(b, o::NPWG),
                npwa: le16(b, o::NPWA),
                npdg: le16(b, o::NPDG),
                npda: le16(b, o::NPDA),
                nows: le16(b, o::NOWS),
            },
            nguid: bytes(b, o::NGUID),
            eui64: bytes(b, o::EUI64),
            lbaf: (0..n)
                .map(|i| LbaFormat::from_u32(le32(b, o::LBAF0 + 4 * i)))
                .collect(),
        })
    }

    /// The current format (FLBAS bits 0-3 and 5-6).
    fn format(&self) -> Option<&LbaFormat> {
        let idx = usize::from(self.flbas & 0xF) | (usize::from((self.flbas >> 5) & 3) << 4);
        self.lbaf.get(idx)
    }

    /// The block size of the current format.
    pub fn block_size(&self) -> Option<u64> {
        1u64.checked_shl(u32::from(self.format()?.lbads))
    }

    /// The metadata of the current format as a fabric carries it:
    /// `(metadata bytes per block, PI type 0-3, PI in the first 8 bytes)`;
    /// `None` for metadata that is not extended-LBA (FLBAS bit 4 clear),
    /// which cannot cross a fabric (the namespace is unusable, as Linux's
    /// host treats it).
    pub fn metadata(&self) -> Option<(u32, u8, bool)> {
        let ms = self.format().map_or(0, |f| u32::from(f.ms));
        if ms == 0 {
            return Some((0, 0, false));
        }
        if self.flbas & FLBAS_EXTENDED == 0 {
            return None;
        }
        Some((ms, self.dps & 7, self.dps & 8 != 0))
    }
}

/// Encode an active namespace list (ascending NSIDs, at most 1024, the rest zero).
pub fn encode_ns_list(nsids: impl IntoIterator<Item = u32>, b: &mut [u8; IDENTIFY_DATA_SIZE]) {
    b.fill(0);
    for (i, id) in nsids.into_iter().take(NS_LIST_MAX).enumerate() {
        put32(b, 4 * i, id);
    }
}

/// Parse an active namespace list (up to the first zero).
///
/// # Errors
///
/// [`WireError::Short`] under 4096 bytes.
pub fn parse_ns_list(b: &[u8]) -> Result<Vec<u32>, WireError> {
    let b: &[u8; IDENTIFY_DATA_SIZE] = need(b, "namespace list")?;
    Ok((0..NS_LIST_MAX)
        .map(|i| le32(b, 4 * i))
        .take_while(|&id| id != 0)
        .collect())
}

/// A namespace identification descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NsIdDescriptor {
    /// NIDT 1: IEEE EUI-64.
    Eui64([u8; 8]),
    /// NIDT 2: NGUID.
    Nguid([u8; 16]),
    /// NIDT 3: UUID.
    Uuid([u8; 16]),
    /// NIDT 4: command set identifier.
    Csi(u8),
}

impl NsIdDescriptor {
    fn nidt(&self) -> u8 {
        match self {
            NsIdDescriptor::Eui64(_) => 1,
            NsIdDescriptor::Nguid(_) => 2,
            NsIdDescriptor::Uuid(_) => 3,
            NsIdDescriptor::Csi(_) => 4,
        }
    }

    fn id(&self) -> &[u8] {
        match self {
            NsIdDescriptor::Eui64(v) => v,
            NsIdDescriptor::Nguid(v) | NsIdDescriptor::Uuid(v) => v,
            NsIdDescriptor::Csi(v) => std::slice::from_ref(v),
        }
    }
}

/// Encode a descriptor list (NIDT, NIDL, 2 reserved, ID; a zero NIDT ends it).
pub fn encode_ns_id_descriptors(descs: &[NsIdDescriptor], b: &mut [u8; IDENTIFY_DATA_SIZE]) {
    b.fill(0);
    let mut at = 0;
    for d in descs {
        let id = d.id();
        if at + 4 + id.len() > IDENTIFY_DATA_SIZE {
            break;
        }
        b[at] = d.nidt();
        b[at + 1] = id.len() as u8;
        put(b, at + 4, id);
        at += 4 + id.len();
    }
}

/// Parse a descriptor list; unknown types are skipped.
///
/// # Errors
///
/// [`WireError::Short`] under 4096 bytes; [`WireError::InvalidField`] when a
/// known type has the wrong length or a descriptor runs past the page.
pub fn parse_ns_id_descriptors(b: &[u8]) -> Result<Vec<NsIdDescriptor>, WireError> {
    let b: &[u8; IDENTIFY_DATA_SIZE] = need(b, "NS id descriptors")?;
    let mut out = Vec::new();
    let mut at = 0usize;
    while at + 4 <= IDENTIFY_DATA_SIZE {
        let (nidt, nidl) = (b[at], usize::from(b[at + 1]));
        if nidt == 0 {
            break;
        }
        let id = b
            .get(at + 4..at + 4 + nidl)
            .ok_or(WireError::InvalidField {
                what: "NIDL",
                value: nidl as u64,
            })?;
        let bad = WireError::InvalidField {
            what: "NIDL",
            value: nidl as u64,
        };
        match nidt {
            1 => out.push(NsIdDescriptor::Eui64(id.try_into().map_err(|_| bad)?)),
            2 => out.push(NsIdDescriptor::Nguid(id.try_into().map_err(|_| bad)?)),
            3 => out.push(NsIdDescriptor::Uuid(id.try_into().map_err(|_| bad)?)),
            4 => out.push(NsIdDescriptor::Csi(*id.first().ok_or(bad)?)),
            _ => {}
        }
        at += 4 + nidl;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_ctrl() -> IdentifyController {
        IdentifyController {
            sn: "POLLUX0001".into(),
            mn: "Pollux NVMe-oF target".into(),
            fr: "0.1.0".into(),
            rab: 6,
            mdts: 5,
            cntlid: 7,
            ver: 0x0001_0300,
            oaes: 1 << 8,
            cntrltype: CNTRLTYPE_IO,
            aerl: 3,
            kas: 10,
            sqes: 0x66,
            cqes: 0x44,
            maxcmd: 128,
            nn: 32,
            oncs: ONCS_DSM | ONCS_WRITE_ZEROES,
            vwc: 1,
            sgls: SGLS_SUPPORTED | SGLS_KEYED | SGLS_OFFSET,
            subnqn: "nqn.2024-01.io.pollux:a".into(),
            ioccsz: 260,
            iorcsz: 1,
            msdbd: 1,
            psd0_max_power: 0x9C4,
            npss: 2,
            wctemp: 343,
            cctemp: 373,
            ..IdentifyController::default()
        }
    }

    #[test]
    fn controller_layout() {
        let c = sample_ctrl();
        let mut b = [0u8; IDENTIFY_DATA_SIZE];
        c.encode_into(&mut b);
        assert_eq!(&b[4..14], b"POLLUX0001");
        assert_eq!(b[23], b' ', "SN space padded");
        assert_eq!(&b[78..80], &[7, 0]);
        assert_eq!(&b[80..84], &[0, 3, 1, 0]);
        assert_eq!(b[111], 1);
        assert_eq!(b[512], 0x66);
        assert_eq!(b[513], 0x44);
        assert_eq!(&b[536..540], &(0x1u32 | 4 | (1 << 20)).to_le_bytes());
        assert_eq!(&b[768..772], b"nqn.");
        assert_eq!(&b[1792..1796], &260u32.to_le_bytes());
        assert_eq!(b[1803], 1);
        assert_eq!(b[263], 2);
        assert_eq!(&b[266..270], &[0x57, 0x01, 0x75, 0x01]);
        assert_eq!(IdentifyController::parse(&b).unwrap(), c);
    }

    #[test]
    fn namespace_layout() {
        let ns = IdentifyNamespace {
            nsze: 2048,
            ncap: 2048,
            nuse: 2048,
            nmic: 1,
            nguid: [0xAB; 16],
            eui64: [0xCD; 8],
            lbaf: vec![LbaFormat {
                ms: 0,
                lbads: 9,
                rp: 0,
            }],
            ..IdentifyNamespace::default()
        };
        let mut b = [0u8; IDENTIFY_DATA_SIZE];
        ns.encode_into(&mut b);
        assert_eq!(&b[0..8], &2048u64.to_le_bytes());
        assert_eq!(b[25], 0);
        assert_eq!(&b[128..132], &[0, 0, 9, 0]);
        assert_eq!(&b[104..120], &[0xAB; 16]);
        let p = IdentifyNamespace::parse(&b).unwrap();
        assert_eq!(p, ns);
        assert_eq!(p.block_size(), Some(512));
    }

    #[test]
    fn lists_and_descriptors() {
        let mut b = [0u8; IDENTIFY_DATA_SIZE];
        encode_ns_list([1, 2, 9], &mut b);
        assert_eq!(parse_ns_list(&b).unwrap(), vec![1, 2, 9]);
        let d = [
            NsIdDescriptor::Eui64([1; 8]),
            NsIdDescriptor::Nguid([2; 16]),
            NsIdDescriptor::Uuid([3; 16]),
            NsIdDescriptor::Csi(0),
        ];
        encode_ns_id_descriptors(&d, &mut b);
        assert_eq!(&b[..4], &[1, 8, 0, 0]);
        assert_eq!(&b[12..16], &[2, 16, 0, 0]);
        assert_eq!(parse_ns_id_descriptors(&b).unwrap(), d.to_vec());
        // A descriptor running past the page is an error, not a panic.
        let mut bad = [0u8; IDENTIFY_DATA_SIZE];
        for k in 0..16 {
            bad[k * 259] = 9; // unknown type, skipped
            bad[k * 259 + 1] = 255;
        }
        assert!(parse_ns_id_descriptors(&bad).is_err());
        // A known type with the wrong length too.
        let mut bad = [0u8; IDENTIFY_DATA_SIZE];
        bad[0] = 2;
        bad[1] = 8;
        assert!(parse_ns_id_descriptors(&bad).is_err());
        let cmd = IdentifyCmd::to_cmd(cns::ACTIVE_NS_LIST, 5, 1);
        let f = IdentifyCmd::from_cmd(&cmd);
        assert_eq!((f.cns, f.nsid), (2, 5));
    }
}
