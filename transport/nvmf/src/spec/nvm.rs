//! NVM command set I/O command fields: Read/Write/Write Zeroes, Flush and
//! Dataset Management.

use super::cmd::{IoOpcode, NvmeCmd};
use super::{le32, le64, need, put32, put64, WireError};

/// Read / Write / Write Zeroes fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RwCmd {
    /// Starting LBA (CDW10-11).
    pub slba: u64,
    /// Number of blocks, **1-based** here (the wire holds NLB-1 in CDW12 bits 0-15).
    pub nlb: u32,
    /// Write Zeroes: deallocate (CDW12 bit 25).
    pub deac: bool,
    /// PRINFO (CDW12 bits 26-29).
    pub prinfo: u8,
    /// Force unit access (CDW12 bit 30).
    pub fua: bool,
    /// Limited retry (CDW12 bit 31).
    pub lr: bool,
    /// Initial logical block reference tag (CDW14; Type 1: the low 32
    /// bits of SLBA).
    pub ilbrt: u32,
    /// Logical block application tag (CDW15 bits 0-15).
    pub lbat: u16,
    /// Logical block application tag mask (CDW15 bits 16-31).
    pub lbatm: u16,
}

/// The protection fields of a Read or Write ([`RwCmd::set_pi`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RwPi {
    /// PRINFO (see [`prinfo`]).
    pub prinfo: u8,
    /// Initial logical block reference tag (Type 1: the low 32 bits of
    /// SLBA).
    pub ilbrt: u32,
    /// Application tag.
    pub lbat: u16,
    /// Application tag mask.
    pub lbatm: u16,
}

/// PRINFO bits (of [`RwCmd::prinfo`], CDW12 bits 26-29 shifted down).
pub mod prinfo {
    /// Check the reference tag.
    pub const PRCHK_REF: u8 = 0x1;
    /// Check the application tag.
    pub const PRCHK_APP: u8 = 0x2;
    /// Check the guard.
    pub const PRCHK_GUARD: u8 = 0x4;
    /// Protection information action: the controller inserts PI on a
    /// write and strips it (after its checks) on a read.
    pub const PRACT: u8 = 0x8;
}

impl RwCmd {
    /// The fields of `cmd`.
    pub fn from_cmd(cmd: &NvmeCmd) -> Self {
        RwCmd {
            slba: u64::from(cmd.cdw10) | (u64::from(cmd.cdw11) << 32),
            nlb: (cmd.cdw12 & 0xFFFF) + 1,
            deac: (cmd.cdw12 >> 25) & 1 != 0,
            prinfo: ((cmd.cdw12 >> 26) & 0xF) as u8,
            fua: (cmd.cdw12 >> 30) & 1 != 0,
            lr: cmd.cdw12 >> 31 != 0,
            ilbrt: cmd.cdw14,
            lbat: cmd.cdw15 as u16,
            lbatm: (cmd.cdw15 >> 16) as u16,
        }
    }

    /// Set the protection fields of a Read or Write SQE.
    pub fn set_pi(cmd: &mut NvmeCmd, pi: &RwPi) {
        cmd.cdw12 = (cmd.cdw12 & !(0xF << 26)) | (u32::from(pi.prinfo & 0xF) << 26);
        cmd.cdw14 = pi.ilbrt;
        cmd.cdw15 = u32::from(pi.lbat) | (u32::from(pi.lbatm) << 16);
    }

    /// An SQE of `opcode` with `nsid`, `slba` and `nlb` (1..=65536) blocks.
    ///
    /// # Errors
    ///
    /// [`WireError::InvalidField`] when `nlb` is 0 or over 65536.
    pub fn to_cmd(
        opcode: IoOpcode,
        cid: u16,
        nsid: u32,
        slba: u64,
        nlb: u32,
    ) -> Result<NvmeCmd, WireError> {
        if nlb == 0 || nlb > 0x1_0000 {
            return Err(WireError::InvalidField {
                what: "NLB",
                value: u64::from(nlb),
            });
        }
        let mut c = NvmeCmd::new(opcode.code(), cid);
        c.nsid = nsid;
        c.cdw10 = slba as u32;
        c.cdw11 = (slba >> 32) as u32;
        c.cdw12 = nlb - 1;
        Ok(c)
    }
}

/// Size of one Dataset Management range.
pub const DSM_RANGE_SIZE: usize = 16;
/// Most ranges in one Dataset Management command.
pub const DSM_MAX_RANGES: usize = 256;

/// Dataset Management fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DsmCmd {
    /// Number of ranges, **1-based** (the wire holds NR-1 in CDW10 bits 0-7).
    pub nr: u16,
    /// Integral dataset for read (CDW11 bit 0).
    pub idr: bool,
    /// Integral dataset for write (CDW11 bit 1).
    pub idw: bool,
    /// Deallocate (CDW11 bit 2).
    pub ad: bool,
}

impl DsmCmd {
    /// The fields of `cmd`.
    pub fn from_cmd(cmd: &NvmeCmd) -> Self {
        DsmCmd {
            nr: (cmd.cdw10 & 0xFF) as u16 + 1,
            idr: cmd.cdw11 & 1 != 0,
            idw: cmd.cdw11 & 2 != 0,
            ad: cmd.cdw11 & 4 != 0,
        }
    }

    /// Bytes of range data the command carries.
    pub fn data_len(&self) -> usize {
        usize::from(self.nr) * DSM_RANGE_SIZE
    }

    /// CDW10 and CDW11 of this command (`nr` clamped to 1..=256).
    pub fn cdw10_11(&self) -> (u32, u32) {
        let nr = u32::from(self.nr.clamp(1, 256)) - 1;
        let cdw11 = u32::from(self.idr) | (u32::from(self.idw) << 1) | (u32::from(self.ad) << 2);
        (nr, cdw11)
    }
}

/// One Dataset Management range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DsmRange {
    /// Context attributes.
    pub attributes: u32,
    /// Length in blocks (**1-based**; 0 = empty range).
    pub nlb: u32,
    /// Starting LBA.
    pub slba: u64,
}

impl DsmRange {
    /// Parse 16 bytes.
    ///
    /// # Errors
    ///
    /// [`WireError::Short`] under 16 bytes.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        let b: &[u8; DSM_RANGE_SIZE] = need(b, "DSM range")?;
        Ok(DsmRange {
            attributes: le32(b, 0),
            nlb: le32(b, 4),
            slba: le64(b, 8),
        })
    }

    /// The 16 encoded bytes.
    pub fn encode(&self) -> [u8; DSM_RANGE_SIZE] {
        let mut b = [0u8; DSM_RANGE_SIZE];
        put32(&mut b, 0, self.attributes);
        put32(&mut b, 4, self.nlb);
        put64(&mut b, 8, self.slba);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rw_fields() {
        let c = RwCmd::to_cmd(IoOpcode::Write, 1, 1, 0x1_0000_0002, 8).unwrap();
        let b = c.encode();
        assert_eq!(&b[40..48], &0x1_0000_0002u64.to_le_bytes());
        assert_eq!(&b[48..50], &[7, 0], "NLB is 0-based");
        let r = RwCmd::from_cmd(&c);
        assert_eq!((r.slba, r.nlb), (0x1_0000_0002, 8));
        assert!(RwCmd::to_cmd(IoOpcode::Read, 1, 1, 0, 0).is_err());
        assert!(RwCmd::to_cmd(IoOpcode::Read, 1, 1, 0, 0x1_0001).is_err());
        let mut c2 = c;
        c2.cdw12 |= (1 << 30) | (1 << 31) | (1 << 25);
        let r2 = RwCmd::from_cmd(&c2);
        assert!(r2.fua && r2.lr && r2.deac);
    }

    #[test]
    fn dsm_fields_and_ranges() {
        let d = DsmCmd {
            nr: 3,
            idr: false,
            idw: false,
            ad: true,
        };
        let (c10, c11) = d.cdw10_11();
        assert_eq!((c10, c11), (2, 4));
        let mut c = NvmeCmd::new(IoOpcode::DatasetManagement.code(), 1);
        c.cdw10 = c10;
        c.cdw11 = c11;
        assert_eq!(DsmCmd::from_cmd(&c), d);
        assert_eq!(d.data_len(), 48);
        let r = DsmRange {
            attributes: 0,
            nlb: 16,
            slba: 100,
        };
        let b = r.encode();
        assert_eq!(&b[4..8], &16u32.to_le_bytes());
        assert_eq!(DsmRange::parse(&b).unwrap(), r);
    }
}
