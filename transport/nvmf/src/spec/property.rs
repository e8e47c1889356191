//! Controller properties (registers) and the Property Get/Set commands.

use super::cmd::{FabricsType, NvmeCmd};

/// Property offsets.
pub mod ofst {
    /// Controller Capabilities (8 bytes).
    pub const CAP: u32 = 0x00;
    /// Version (4 bytes).
    pub const VS: u32 = 0x08;
    /// Interrupt mask set (unused on fabrics).
    pub const INTMS: u32 = 0x0C;
    /// Interrupt mask clear (unused on fabrics).
    pub const INTMC: u32 = 0x10;
    /// Controller Configuration (4 bytes).
    pub const CC: u32 = 0x14;
    /// Controller Status (4 bytes).
    pub const CSTS: u32 = 0x1C;
    /// NVM Subsystem Reset (4 bytes).
    pub const NSSR: u32 = 0x20;
    /// Admin Queue Attributes (unused on fabrics).
    pub const AQA: u32 = 0x24;
    /// Controller Ready Timeouts (4 bytes).
    pub const CRTO: u32 = 0x68;
}

/// Property Get/Set size: 4 or 8 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PropertySize {
    /// ATTRIB.SIZE = 0.
    Four,
    /// ATTRIB.SIZE = 1.
    Eight,
}

/// Property Get / Set fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PropertyCmd {
    /// Size, or `None` for a reserved ATTRIB value.
    pub size: Option<PropertySize>,
    /// Register offset.
    pub offset: u32,
    /// Value (Set only).
    pub value: u64,
}

impl PropertyCmd {
    /// The fields of `cmd` (ATTRIB byte 40, OFST byte 44, VALUE byte 48).
    pub fn from_cmd(cmd: &NvmeCmd) -> Self {
        PropertyCmd {
            size: match cmd.cdw10 & 0x7 {
                0 => Some(PropertySize::Four),
                1 => Some(PropertySize::Eight),
                _ => None,
            },
            offset: cmd.cdw11,
            value: u64::from(cmd.cdw12) | (u64::from(cmd.cdw13) << 32),
        }
    }

    /// A Property Get SQE.
    pub fn get(offset: u32, size: PropertySize, cid: u16) -> NvmeCmd {
        let mut c = NvmeCmd::fabrics(FabricsType::PropertyGet, cid);
        c.cdw10 = u32::from(size == PropertySize::Eight);
        c.cdw11 = offset;
        c
    }

    /// A Property Set SQE.
    pub fn set(offset: u32, size: PropertySize, value: u64, cid: u16) -> NvmeCmd {
        let mut c = NvmeCmd::fabrics(FabricsType::PropertySet, cid);
        c.cdw10 = u32::from(size == PropertySize::Eight);
        c.cdw11 = offset;
        c.cdw12 = value as u32;
        c.cdw13 = (value >> 32) as u32;
        c
    }
}

/// Controller Capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cap {
    /// Maximum queue entries supported, 0-based.
    pub mqes: u16,
    /// Contiguous queues required.
    pub cqr: bool,
    /// Arbitration mechanisms supported (2 bits).
    pub ams: u8,
    /// Ready timeout in 500 ms units.
    pub to: u8,
    /// Doorbell stride (4 bits).
    pub dstrd: u8,
    /// NVM subsystem reset supported.
    pub nssrs: bool,
    /// Command sets supported (8 bits: bit 0 NVM, bit 6 I/O command sets, bit 7 no I/O).
    pub css: u8,
    /// Memory page size minimum, 2^(12+MPSMIN).
    pub mpsmin: u8,
    /// Memory page size maximum.
    pub mpsmax: u8,
    /// Controller ready with media support (CRWMS).
    pub crwms: bool,
    /// Controller ready independent of media support (CRIMS).
    pub crims: bool,
}

impl Cap {
    /// Encode.
    pub fn to_u64(&self) -> u64 {
        u64::from(self.mqes)
            | (u64::from(self.cqr) << 16)
            | (u64::from(self.ams & 3) << 17)
            | (u64::from(self.to) << 24)
            | (u64::from(self.dstrd & 0xF) << 32)
            | (u64::from(self.nssrs) << 36)
            | (u64::from(self.css) << 37)
            | (u64::from(self.mpsmin & 0xF) << 48)
            | (u64::from(self.mpsmax & 0xF) << 52)
            | (u64::from(self.crwms) << 59)
            | (u64::from(self.crims) << 60)
    }

    /// Decode.
    pub fn from_u64(v: u64) -> Self {
        Cap {
            mqes: v as u16,
            cqr: (v >> 16) & 1 != 0,
            ams: ((v >> 17) & 3) as u8,
            to: (v >> 24) as u8,
            dstrd: ((v >> 32) & 0xF) as u8,
            nssrs: (v >> 36) & 1 != 0,
            css: (v >> 37) as u8,
            mpsmin: ((v >> 48) & 0xF) as u8,
            mpsmax: ((v >> 52) & 0xF) as u8,
            crwms: (v >> 59) & 1 != 0,
            crims: (v >> 60) & 1 != 0,
        }
    }
}

/// CAP.CSS bit 0: NVM command set.
pub const CAP_CSS_NVM: u8 = 1 << 0;
/// CAP.CSS bit 6: I/O command sets (CC.CSS = 6 allowed).
pub const CAP_CSS_IOCS: u8 = 1 << 6;

/// A version (VS register and Identify VER): major << 16 | minor << 8 | tertiary.
pub const fn version(major: u16, minor: u8, tertiary: u8) -> u32 {
    ((major as u32) << 16) | ((minor as u32) << 8) | tertiary as u32
}

/// NVMe 1.3.
pub const VS_1_3: u32 = version(1, 3, 0);
/// NVMe 1.4.
pub const VS_1_4: u32 = version(1, 4, 0);

/// Controller Configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cc {
    /// Enable.
    pub en: bool,
    /// I/O command set selected (3 bits).
    pub css: u8,
    /// Memory page size, 2^(12+MPS).
    pub mps: u8,
    /// Arbitration mechanism (3 bits).
    pub ams: u8,
    /// Shutdown notification (2 bits: 01 normal, 10 abrupt).
    pub shn: u8,
    /// I/O SQ entry size, log2 (6 = 64 bytes).
    pub iosqes: u8,
    /// I/O CQ entry size, log2 (4 = 16 bytes).
    pub iocqes: u8,
    /// Controller ready independent of media enable.
    pub crime: bool,
}

impl Cc {
    /// Encode.
    pub fn to_u32(&self) -> u32 {
        u32::from(self.en)
            | (u32::from(self.css & 7) << 4)
            | (u32::from(self.mps & 0xF) << 7)
            | (u32::from(self.ams & 7) << 11)
            | (u32::from(self.shn & 3) << 14)
            | (u32::from(self.iosqes & 0xF) << 16)
            | (u32::from(self.iocqes & 0xF) << 20)
            | (u32::from(self.crime) << 24)
    }

    /// Decode.
    pub fn from_u32(v: u32) -> Self {
        Cc {
            en: v & 1 != 0,
            css: ((v >> 4) & 7) as u8,
            mps: ((v >> 7) & 0xF) as u8,
            ams: ((v >> 11) & 7) as u8,
            shn: ((v >> 14) & 3) as u8,
            iosqes: ((v >> 16) & 0xF) as u8,
            iocqes: ((v >> 20) & 0xF) as u8,
            crime: (v >> 24) & 1 != 0,
        }
    }

    /// What the Linux host writes before enabling: CSS `css`, MPS 0 (4 KiB),
    /// AMS 0, IOSQES 6, IOCQES 4.
    pub fn linux_default(css: u8) -> Self {
        Cc {
            css,
            iosqes: 6,
            iocqes: 4,
            ..Cc::default()
        }
    }
}

/// Controller Status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Csts {
    /// Ready.
    pub rdy: bool,
    /// Controller fatal status.
    pub cfs: bool,
    /// Shutdown status (2 bits: 00 normal, 01 in progress, 10 complete).
    pub shst: u8,
    /// NVM subsystem reset occurred.
    pub nssro: bool,
    /// Processing paused.
    pub pp: bool,
}

/// CC.SHN / CSTS.SHST value: normal shutdown notification.
pub const SHN_NORMAL: u8 = 0b01;
/// CC.SHN value: abrupt shutdown notification.
pub const SHN_ABRUPT: u8 = 0b10;
/// CSTS.SHST value: shutdown processing complete.
pub const SHST_COMPLETE: u8 = 0b10;

impl Csts {
    /// Encode.
    pub fn to_u32(&self) -> u32 {
        u32::from(self.rdy)
            | (u32::from(self.cfs) << 1)
            | (u32::from(self.shst & 3) << 2)
            | (u32::from(self.nssro) << 4)
            | (u32::from(self.pp) << 5)
    }

    /// Decode.
    pub fn from_u32(v: u32) -> Self {
        Csts {
            rdy: v & 1 != 0,
            cfs: (v >> 1) & 1 != 0,
            shst: ((v >> 2) & 3) as u8,
            nssro: (v >> 4) & 1 != 0,
            pp: (v >> 5) & 1 != 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_bits() {
        let cap = Cap {
            mqes: 127,
            to: 15,
            css: CAP_CSS_NVM | CAP_CSS_IOCS,
            ..Cap::default()
        };
        let v = cap.to_u64();
        assert_eq!(v & 0xFFFF, 127);
        assert_eq!((v >> 24) & 0xFF, 15);
        assert!(v & (1 << 37) != 0 && v & (1 << 43) != 0);
        assert_eq!(Cap::from_u64(v), cap);
        let all = Cap::from_u64(u64::MAX);
        assert_eq!(Cap::from_u64(all.to_u64()), all);
    }

    #[test]
    fn cc_csts_bits() {
        let cc = Cc {
            en: true,
            shn: SHN_NORMAL,
            ..Cc::linux_default(0)
        };
        assert_eq!(cc.to_u32(), 1 | (1 << 14) | (6 << 16) | (4 << 20));
        assert_eq!(Cc::from_u32(cc.to_u32()), cc);
        let st = Csts {
            rdy: true,
            shst: SHST_COMPLETE,
            ..Csts::default()
        };
        assert_eq!(st.to_u32(), 0b1001);
        assert_eq!(Csts::from_u32(st.to_u32()), st);
        assert_eq!(VS_1_3, 0x0001_0300);
        assert_eq!(VS_1_4, 0x0001_0400);
    }

    #[test]
    fn property_cmd_fields() {
        let c = PropertyCmd::set(ofst::CC, PropertySize::Four, 0x46_0001, 3);
        let b = c.encode();
        assert_eq!(b[4], 0x00, "FCTYPE property set");
        assert_eq!(b[40], 0);
        assert_eq!(&b[44..48], &0x14u32.to_le_bytes());
        assert_eq!(&b[48..56], &0x46_0001u64.to_le_bytes());
        let p = PropertyCmd::from_cmd(&c);
        assert_eq!(p.size, Some(PropertySize::Four));
        assert_eq!(p.value, 0x46_0001);
        let g = PropertyCmd::get(ofst::CAP, PropertySize::Eight, 4);
        assert_eq!(g.encode()[4], 0x04);
        assert_eq!(PropertyCmd::from_cmd(&g).size, Some(PropertySize::Eight));
    }
}
