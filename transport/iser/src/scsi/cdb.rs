//! Command descriptor blocks: decoding the commands a Linux initiator
//! sends to a disk (`iser-iscsi.md` §9.2) into [`Cdb`], with the sense to
//! answer for anything else.

use super::sense::Sense;

/// Operation codes.
pub mod op {
    /// TEST UNIT READY.
    pub const TEST_UNIT_READY: u8 = 0x00;
    /// REQUEST SENSE.
    pub const REQUEST_SENSE: u8 = 0x03;
    /// READ(6).
    pub const READ_6: u8 = 0x08;
    /// WRITE(6).
    pub const WRITE_6: u8 = 0x0A;
    /// INQUIRY.
    pub const INQUIRY: u8 = 0x12;
    /// RESERVE(6).
    pub const RESERVE_6: u8 = 0x16;
    /// RELEASE(6).
    pub const RELEASE_6: u8 = 0x17;
    /// MODE SENSE(6).
    pub const MODE_SENSE_6: u8 = 0x1A;
    /// START STOP UNIT.
    pub const START_STOP_UNIT: u8 = 0x1B;
    /// READ CAPACITY(10).
    pub const READ_CAPACITY_10: u8 = 0x25;
    /// READ(10).
    pub const READ_10: u8 = 0x28;
    /// WRITE(10).
    pub const WRITE_10: u8 = 0x2A;
    /// WRITE AND VERIFY(10).
    pub const WRITE_VERIFY_10: u8 = 0x2E;
    /// VERIFY(10).
    pub const VERIFY_10: u8 = 0x2F;
    /// SYNCHRONIZE CACHE(10).
    pub const SYNC_CACHE_10: u8 = 0x35;
    /// WRITE SAME(10).
    pub const WRITE_SAME_10: u8 = 0x41;
    /// UNMAP.
    pub const UNMAP: u8 = 0x42;
    /// MODE SENSE(10).
    pub const MODE_SENSE_10: u8 = 0x5A;
    /// PERSISTENT RESERVE IN.
    pub const PR_IN: u8 = 0x5E;
    /// PERSISTENT RESERVE OUT.
    pub const PR_OUT: u8 = 0x5F;
    /// READ(16).
    pub const READ_16: u8 = 0x88;
    /// VARIABLE LENGTH CDB (READ(32), WRITE(32)).
    pub const VARIABLE_LENGTH: u8 = 0x7F;
    /// COMPARE AND WRITE.
    pub const COMPARE_AND_WRITE: u8 = 0x89;
    /// WRITE(16).
    pub const WRITE_16: u8 = 0x8A;
    /// WRITE AND VERIFY(16).
    pub const WRITE_VERIFY_16: u8 = 0x8E;
    /// VERIFY(16).
    pub const VERIFY_16: u8 = 0x8F;
    /// SYNCHRONIZE CACHE(16).
    pub const SYNC_CACHE_16: u8 = 0x91;
    /// WRITE SAME(16).
    pub const WRITE_SAME_16: u8 = 0x93;
    /// SERVICE ACTION IN(16) (READ CAPACITY(16) is SA 0x10, GET LBA
    /// STATUS SA 0x12).
    pub const SERVICE_ACTION_IN_16: u8 = 0x9E;
    /// REPORT LUNS.
    pub const REPORT_LUNS: u8 = 0xA0;
    /// MAINTENANCE IN (REPORT SUPPORTED OPERATION CODES is SA 0x0C).
    pub const MAINTENANCE_IN: u8 = 0xA3;
    /// READ(12).
    pub const READ_12: u8 = 0xA8;
    /// WRITE(12).
    pub const WRITE_12: u8 = 0xAA;
    /// WRITE AND VERIFY(12).
    pub const WRITE_VERIFY_12: u8 = 0xAE;
    /// VERIFY(12).
    pub const VERIFY_12: u8 = 0xAF;
}

/// Service actions.
pub mod sa {
    /// READ(32) (VARIABLE LENGTH CDB).
    pub const READ_32: u16 = 0x0009;
    /// WRITE(32) (VARIABLE LENGTH CDB).
    pub const WRITE_32: u16 = 0x000B;
    /// READ CAPACITY(16) (SERVICE ACTION IN(16)).
    pub const READ_CAPACITY_16: u16 = 0x10;
    /// GET LBA STATUS (SERVICE ACTION IN(16)).
    pub const GET_LBA_STATUS: u16 = 0x12;
    /// REPORT SUPPORTED OPERATION CODES (MAINTENANCE IN).
    pub const REPORT_OPCODES: u16 = 0x0C;
}

/// A decoded CDB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cdb {
    /// TEST UNIT READY.
    TestUnitReady,
    /// REQUEST SENSE.
    RequestSense {
        /// Allocation length.
        alloc: u32,
    },
    /// INQUIRY.
    Inquiry {
        /// EVPD: a VPD page is asked for.
        evpd: bool,
        /// Page code.
        page: u8,
        /// Allocation length.
        alloc: u32,
    },
    /// MODE SENSE(6) or (10).
    ModeSense {
        /// The 10-byte form.
        ten: bool,
        /// Disable block descriptors.
        dbd: bool,
        /// Page control (0 current, 1 changeable, 2 default, 3 saved).
        pc: u8,
        /// Page code.
        page: u8,
        /// Subpage code.
        subpage: u8,
        /// Allocation length.
        alloc: u32,
    },
    /// START STOP UNIT (accepted, no effect).
    StartStopUnit {
        /// START 1 with POWER CONDITION 0h: a plain start, which SBC-3
        /// allows under every persistent reservation.
        start: bool,
    },
    /// READ CAPACITY(10).
    ReadCapacity10,
    /// READ CAPACITY(16).
    ReadCapacity16 {
        /// Allocation length.
        alloc: u32,
    },
    /// READ(6/10/12/16).
    Read(Rw),
    /// WRITE(6/10/12/16).
    Write(Rw),
    /// VERIFY(10/12/16).
    Verify {
        /// LBA, blocks and VRPROTECT.
        rw: Rw,
        /// BYTCHK 01b: the data-out is compared with the medium.
        bytchk: bool,
    },
    /// WRITE AND VERIFY(10/12/16).
    WriteVerify {
        /// LBA, blocks and WRPROTECT.
        rw: Rw,
        /// BYTCHK 01b: the medium is read back and compared.
        bytchk: bool,
    },
    /// COMPARE AND WRITE.
    CompareAndWrite {
        /// LBA, blocks (NUMBER OF LOGICAL BLOCKS) and WRPROTECT.
        rw: Rw,
    },
    /// GET LBA STATUS.
    GetLbaStatus {
        /// Starting LBA.
        lba: u64,
        /// Allocation length.
        alloc: u32,
    },
    /// PERSISTENT RESERVE IN.
    PrIn {
        /// Service action.
        sa: u8,
        /// Allocation length.
        alloc: u32,
    },
    /// PERSISTENT RESERVE OUT.
    PrOut {
        /// Service action.
        sa: u8,
        /// SCOPE (high nibble) and TYPE (low nibble).
        scope_type: u8,
        /// Parameter list length.
        param_len: u32,
    },
    /// RESERVE(6).
    Reserve6,
    /// RELEASE(6).
    Release6,
    /// REPORT SUPPORTED OPERATION CODES.
    ReportOpcodes {
        /// REPORTING OPTIONS.
        options: u8,
        /// Requested operation code.
        opcode: u8,
        /// Requested service action.
        sa: u16,
        /// Allocation length.
        alloc: u32,
    },
    /// SYNCHRONIZE CACHE(10/16).
    SyncCache {
        /// First LBA.
        lba: u64,
        /// Blocks (0 = to the end).
        blocks: u32,
    },
    /// UNMAP.
    Unmap {
        /// Parameter list length.
        param_len: u32,
    },
    /// WRITE SAME(10/16).
    WriteSame {
        /// First LBA.
        lba: u64,
        /// NUMBER OF LOGICAL BLOCKS (0: to the end of the medium, WSNZ=0).
        blocks: u32,
        /// UNMAP bit.
        unmap: bool,
        /// NDOB: no data-out buffer (zeroes; WRITE SAME(16) only).
        ndob: bool,
        /// LBDATA: the low 4 bytes of each block's LBA replace the first
        /// 4 bytes of the pattern.
        lbdata: bool,
    },
    /// REPORT LUNS.
    ReportLuns {
        /// Allocation length.
        alloc: u32,
    },
}

/// The fields of a READ or WRITE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rw {
    /// First LBA.
    pub lba: u64,
    /// Blocks.
    pub blocks: u32,
    /// RDPROTECT / WRPROTECT (byte 1 bits 5-7; byte 10 of the 32-byte
    /// forms).
    pub protect: u8,
    /// FUA.
    pub fua: bool,
    /// The 32-byte forms' PI fields (PI Type 2), `None` for the others.
    pub tags: Option<PiTags>,
}

/// The PI fields of READ(32) and WRITE(32): the expected initial logical
/// block reference tag, and the (expected) logical block application tag
/// with its mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PiTags {
    /// EXPECTED INITIAL LOGICAL BLOCK REFERENCE TAG (bytes 20-23).
    pub ref_tag: u32,
    /// (EXPECTED) LOGICAL BLOCK APPLICATION TAG (bytes 24-25).
    pub app_tag: u16,
    /// LOGICAL BLOCK APPLICATION TAG MASK (bytes 26-27).
    pub app_mask: u16,
}

/// The 32-byte READ(32) / WRITE(32): VARIABLE LENGTH CDB (7Fh),
/// ADDITIONAL CDB LENGTH 18h, service action 0009h / 000Bh at bytes 8-9,
/// PROTECT, DPO and FUA at byte 10, the LBA at 12-19, the tags at 20-27,
/// the transfer length at 28-31.
pub fn rw32_cdb(write: bool, lba: u64, blocks: u32, protect: u8, tags: PiTags) -> [u8; 32] {
    let mut c = [0u8; 32];
    c[0] = op::VARIABLE_LENGTH;
    c[7] = 0x18;
    let sa = if write { sa::WRITE_32 } else { sa::READ_32 };
    c[8..10].copy_from_slice(&sa.to_be_bytes());
    c[10] = (protect & 7) << 5;
    c[12..20].copy_from_slice(&lba.to_be_bytes());
    c[20..24].copy_from_slice(&tags.ref_tag.to_be_bytes());
    c[24..26].copy_from_slice(&tags.app_tag.to_be_bytes());
    c[26..28].copy_from_slice(&tags.app_mask.to_be_bytes());
    c[28..32].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// Decode a VARIABLE LENGTH CDB (only READ(32) and WRITE(32)).
fn parse_variable(cdb: &[u8]) -> Result<Cdb, Sense> {
    let mut b = [0u8; 32];
    let n = cdb.len().min(32);
    b[..n].copy_from_slice(&cdb[..n]);
    let bad = |byte: u16| Sense::INVALID_FIELD_IN_CDB.at_cdb(byte, None);
    if b[1] & 0x05 != 0 {
        // Control byte: NACA/link are not supported.
        return Err(bad(1));
    }
    if b[7] != 0x18 || n < 32 {
        return Err(bad(7));
    }
    let sa = u16::from_be_bytes([b[8], b[9]]);
    if sa != sa::READ_32 && sa != sa::WRITE_32 {
        return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(8, None));
    }
    if b[10] & 0x07 != 0 {
        return Err(bad(10));
    }
    let rw = Rw {
        lba: be64(&b, 12),
        blocks: be32(&b, 28),
        protect: b[10] >> 5,
        fua: b[10] & 0x08 != 0,
        tags: Some(PiTags {
            ref_tag: be32(&b, 20),
            app_tag: be16(&b, 24) as u16,
            app_mask: be16(&b, 26) as u16,
        }),
    };
    Ok(if sa == sa::READ_32 {
        Cdb::Read(rw)
    } else {
        Cdb::Write(rw)
    })
}

fn be16(b: &[u8], o: usize) -> u32 {
    u32::from(u16::from_be_bytes([b[o], b[o + 1]]))
}
fn be32(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
fn be64(b: &[u8], o: usize) -> u64 {
    (u64::from(be32(b, o)) << 32) | u64::from(be32(b, o + 4))
}

/// The CDB length of an opcode's group (6, 10, 12, 16), `None` for the
/// variable-length and vendor groups.
pub fn cdb_len(opcode: u8) -> Option<usize> {
    match opcode >> 5 {
        0 => Some(6),
        1 | 2 => Some(10),
        4 => Some(16),
        5 => Some(12),
        _ => None,
    }
}

/// LBA, length, PROTECT and FUA of the 10-, 12- and 16-byte READ, WRITE,
/// VERIFY and WRITE AND VERIFY forms.
fn rw_fields(b: &[u8; 16], opcode: u8) -> Rw {
    let (lba, blocks) = match opcode >> 5 {
        // 16-byte group.
        4 => (be64(b, 2), be32(b, 10)),
        // 12-byte group.
        5 => (u64::from(be32(b, 2)), be32(b, 6)),
        _ => (u64::from(be32(b, 2)), be16(b, 7)),
    };
    Rw {
        lba,
        blocks,
        protect: b[1] >> 5,
        fua: b[1] & 0x08 != 0,
        tags: None,
    }
}

impl Cdb {
    /// Decode `cdb` (at least 16 bytes as carried in the BHS, 32 for the
    /// variable-length READ(32)/WRITE(32) whose bytes 16.. come in the
    /// extended CDB AHS; shorter slices are treated as zero-padded).
    ///
    /// # Errors
    /// ILLEGAL REQUEST 20/00 for an unsupported opcode or service action,
    /// 24/00 (with the field pointer) for a reserved or unsupported field.
    pub fn parse(cdb: &[u8]) -> Result<Cdb, Sense> {
        if cdb.first() == Some(&op::VARIABLE_LENGTH) {
            return parse_variable(cdb);
        }
        let mut b = [0u8; 16];
        let n = cdb.len().min(16);
        b[..n].copy_from_slice(&cdb[..n]);
        let opcode = b[0];
        let len = cdb_len(opcode).ok_or(Sense::INVALID_OPCODE)?;
        // Control byte: NACA/link are not supported.
        if b[len - 1] & 0x05 != 0 {
            return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb((len - 1) as u16, None));
        }
        let bad = |byte: u16| Sense::INVALID_FIELD_IN_CDB.at_cdb(byte, None);
        Ok(match opcode {
            op::TEST_UNIT_READY => Cdb::TestUnitReady,
            op::REQUEST_SENSE => {
                if b[1] & 0x01 != 0 {
                    // DESC: descriptor format sense data is not supported
                    // (SPC-4 REQUEST SENSE; LIO answers the same).
                    return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(1, Some(0)));
                }
                Cdb::RequestSense {
                    alloc: u32::from(b[4]),
                }
            }
            op::INQUIRY => {
                let evpd = b[1] & 1 != 0;
                if b[1] & 0xFE != 0 {
                    return Err(bad(1));
                }
                if !evpd && b[2] != 0 {
                    return Err(bad(2));
                }
                Cdb::Inquiry {
                    evpd,
                    page: b[2],
                    alloc: be16(&b, 3),
                }
            }
            op::MODE_SENSE_6 | op::MODE_SENSE_10 => {
                let ten = opcode == op::MODE_SENSE_10;
                Cdb::ModeSense {
                    ten,
                    dbd: b[1] & 0x08 != 0,
                    pc: b[2] >> 6,
                    page: b[2] & 0x3F,
                    subpage: b[3],
                    alloc: if ten { be16(&b, 7) } else { u32::from(b[4]) },
                }
            }
            op::START_STOP_UNIT => Cdb::StartStopUnit {
                start: b[4] & 0x01 != 0 && b[4] >> 4 == 0,
            },
            op::READ_CAPACITY_10 => {
                if b[8] & 1 != 0 {
                    // PMI: not supported.
                    return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(8, Some(0)));
                }
                if be32(&b, 2) != 0 {
                    // A LOGICAL BLOCK ADDRESS without PMI.
                    return Err(bad(2));
                }
                Cdb::ReadCapacity10
            }
            op::SERVICE_ACTION_IN_16 => match u16::from(b[1] & 0x1F) {
                sa::READ_CAPACITY_16 => Cdb::ReadCapacity16 {
                    alloc: be32(&b, 10),
                },
                sa::GET_LBA_STATUS => Cdb::GetLbaStatus {
                    lba: be64(&b, 2),
                    alloc: be32(&b, 10),
                },
                _ => return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(1, Some(4))),
            },
            op::MAINTENANCE_IN => {
                if u16::from(b[1] & 0x1F) != sa::REPORT_OPCODES {
                    return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(1, Some(4)));
                }
                if b[2] & 0x80 != 0 {
                    // RCTD: command timeouts descriptors are not kept.
                    return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(2, Some(7)));
                }
                Cdb::ReportOpcodes {
                    options: b[2] & 0x07,
                    opcode: b[3],
                    sa: be16(&b, 4) as u16,
                    alloc: be32(&b, 6),
                }
            }
            op::READ_6 | op::WRITE_6 => {
                let rw = Rw {
                    lba: u64::from(be32(&b, 0) & 0x001F_FFFF),
                    // 0 means 256 blocks in the 6-byte form.
                    blocks: if b[4] == 0 { 256 } else { u32::from(b[4]) },
                    protect: 0,
                    fua: false,
                    tags: None,
                };
                if opcode == op::READ_6 {
                    Cdb::Read(rw)
                } else {
                    Cdb::Write(rw)
                }
            }
            op::READ_10
            | op::WRITE_10
            | op::READ_12
            | op::WRITE_12
            | op::READ_16
            | op::WRITE_16 => {
                if b[1] & 0x03 != 0 {
                    return Err(bad(1));
                }
                let rw = rw_fields(&b, opcode);
                if matches!(opcode, op::READ_10 | op::READ_12 | op::READ_16) {
                    Cdb::Read(rw)
                } else {
                    Cdb::Write(rw)
                }
            }
            op::VERIFY_10
            | op::VERIFY_12
            | op::VERIFY_16
            | op::WRITE_VERIFY_10
            | op::WRITE_VERIFY_12
            | op::WRITE_VERIFY_16 => {
                // BYTCHK (bits 2-1): 00b verify the medium, 01b compare
                // with the data-out; 10b/11b are not supported.
                let bytchk = match (b[1] >> 1) & 0x03 {
                    0 => false,
                    1 => true,
                    _ => return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(1, Some(2))),
                };
                if b[1] & 0x01 != 0 {
                    return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(1, Some(0)));
                }
                let mut rw = rw_fields(&b, opcode);
                rw.fua = false;
                if matches!(opcode, op::VERIFY_10 | op::VERIFY_12 | op::VERIFY_16) {
                    Cdb::Verify { rw, bytchk }
                } else {
                    Cdb::WriteVerify { rw, bytchk }
                }
            }
            op::COMPARE_AND_WRITE => {
                if b[1] & 0x01 != 0 {
                    return Err(bad(1));
                }
                Cdb::CompareAndWrite {
                    rw: Rw {
                        lba: be64(&b, 2),
                        blocks: u32::from(b[13]),
                        protect: b[1] >> 5,
                        fua: b[1] & 0x08 != 0,
                        tags: None,
                    },
                }
            }
            op::SYNC_CACHE_10 => Cdb::SyncCache {
                lba: u64::from(be32(&b, 2)),
                blocks: be16(&b, 7),
            },
            op::SYNC_CACHE_16 => Cdb::SyncCache {
                lba: be64(&b, 2),
                blocks: be32(&b, 10),
            },
            op::UNMAP => {
                if b[1] & 0x01 != 0 {
                    // ANCHOR: anchoring is not advertised (ANC_SUP=0).
                    return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(1, Some(0)));
                }
                Cdb::Unmap {
                    param_len: be16(&b, 7),
                }
            }
            op::WRITE_SAME_10 | op::WRITE_SAME_16 => {
                let sixteen = opcode == op::WRITE_SAME_16;
                if b[1] & 0xE0 != 0 {
                    // WRPROTECT: the pattern carries no PI.
                    return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(1, Some(7)));
                }
                if b[1] & 0x10 != 0 {
                    // ANCHOR: anchoring is not advertised (ANC_SUP=0).
                    return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(1, Some(4)));
                }
                if b[1] & 0x04 != 0 {
                    // PBDATA: physical sector addresses are not inserted.
                    return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(1, Some(2)));
                }
                if !sixteen && b[1] & 0x01 != 0 {
                    // Obsolete in WRITE SAME(10).
                    return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(1, Some(0)));
                }
                let unmap = b[1] & 0x08 != 0;
                let lbdata = b[1] & 0x02 != 0;
                let ndob = sixteen && b[1] & 0x01 != 0;
                if lbdata && (unmap || ndob) {
                    // LBDATA changes the pattern per block: no unmapping,
                    // and there is no pattern without a data-out buffer.
                    return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(1, Some(1)));
                }
                Cdb::WriteSame {
                    lba: if sixteen {
                        be64(&b, 2)
                    } else {
                        u64::from(be32(&b, 2))
                    },
                    blocks: if sixteen { be32(&b, 10) } else { be16(&b, 7) },
                    unmap,
                    ndob,
                    lbdata,
                }
            }
            op::PR_IN => Cdb::PrIn {
                sa: b[1] & 0x1F,
                alloc: be16(&b, 7),
            },
            op::PR_OUT => Cdb::PrOut {
                sa: b[1] & 0x1F,
                scope_type: b[2],
                param_len: be32(&b, 5),
            },
            op::RESERVE_6 | op::RELEASE_6 => {
                if b[1] & 0x1F != 0 {
                    // Third-party and extent reservations (SPC-2) are not supported.
                    return Err(bad(1));
                }
                if opcode == op::RESERVE_6 {
                    Cdb::Reserve6
                } else {
                    Cdb::Release6
                }
            }
            op::REPORT_LUNS => {
                if b[2] > 2 {
                    return Err(bad(2));
                }
                let alloc = be32(&b, 6);
                if alloc < 16 {
                    return Err(bad(6));
                }
                Cdb::ReportLuns { alloc }
            }
            _ => return Err(Sense::INVALID_OPCODE),
        })
    }
}

/// CDBs the tests of several modules build.
#[cfg(test)]
pub(crate) mod build {
    /// WRITE SAME(16) with byte 1 `flags`.
    pub(crate) fn write_same16(flags: u8, lba: u64, blocks: u32) -> [u8; 16] {
        let mut c = [0u8; 16];
        c[0] = super::op::WRITE_SAME_16;
        c[1] = flags;
        c[2..10].copy_from_slice(&lba.to_be_bytes());
        c[10..14].copy_from_slice(&blocks.to_be_bytes());
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_linux_commands() {
        let c = |b: &[u8]| Cdb::parse(b);
        assert_eq!(c(&[0; 6]), Ok(Cdb::TestUnitReady));
        assert_eq!(
            c(&[0x12, 1, 0x83, 0, 0xFF, 0]),
            Ok(Cdb::Inquiry {
                evpd: true,
                page: 0x83,
                alloc: 255
            })
        );
        assert_eq!(
            c(&[0x28, 0x20, 0, 0, 1, 0, 0, 0, 8, 0]),
            Ok(Cdb::Read(Rw {
                lba: 256,
                blocks: 8,
                protect: 1,
                fua: false,
                tags: None
            }))
        );
        let mut w16 = [0u8; 16];
        w16[0] = 0x8A;
        w16[1] = 0x08;
        w16[2..10].copy_from_slice(&0x1_0000_0000u64.to_be_bytes());
        w16[10..14].copy_from_slice(&16u32.to_be_bytes());
        assert_eq!(
            c(&w16),
            Ok(Cdb::Write(Rw {
                lba: 1 << 32,
                blocks: 16,
                protect: 0,
                fua: true,
                tags: None
            }))
        );
        let tags = PiTags {
            ref_tag: 0xC0FF_EE00,
            app_tag: 0x1234,
            app_mask: 0xFF00,
        };
        let r32 = rw32_cdb(false, 77, 9, 1, tags);
        assert_eq!(
            c(&r32),
            Ok(Cdb::Read(Rw {
                lba: 77,
                blocks: 9,
                protect: 1,
                fua: false,
                tags: Some(tags)
            }))
        );
        assert!(matches!(c(&rw32_cdb(true, 1, 1, 3, tags)), Ok(Cdb::Write(w)) if w.protect == 3));
        let mut rc16 = [0u8; 16];
        rc16[0] = 0x9E;
        rc16[1] = 0x10;
        rc16[13] = 32;
        assert_eq!(c(&rc16), Ok(Cdb::ReadCapacity16 { alloc: 32 }));
        assert_eq!(
            c(&[0x1A, 0x08, 0x3F, 0, 4, 0]),
            Ok(Cdb::ModeSense {
                ten: false,
                dbd: true,
                pc: 0,
                page: 0x3F,
                subpage: 0,
                alloc: 4
            })
        );
    }

    #[test]
    fn errors_have_the_right_sense() {
        let c = |b: &[u8]| Cdb::parse(b).map_err(|s| s.code());
        assert_eq!(c(&[0xC0; 16]), Err((5, 0x20, 0)), "vendor group");
        assert_eq!(c(&[0x7F; 16]), Err((5, 0x24, 0)), "variable length, bad");
        let mut v = [0u8; 32];
        v[0] = 0x7F;
        v[7] = 0x18;
        v[9] = 0x0A; // VERIFY(32): not supported
        assert_eq!(c(&v), Err((5, 0x24, 0)), "other service action");
        assert_eq!(c(&v[..16]), Err((5, 0x24, 0)), "no extended CDB");
        assert_eq!(c(&[0x04, 0, 0, 0, 0, 0]), Err((5, 0x20, 0)), "FORMAT UNIT");
        assert_eq!(
            c(&[0x12, 0, 0x80, 0, 36, 0]),
            Err((5, 0x24, 0)),
            "page without EVPD"
        );
        assert_eq!(c(&[0x12, 2, 0, 0, 36, 0]), Err((5, 0x24, 0)), "CmdDt");
        assert_eq!(c(&[0x00, 0, 0, 0, 0, 4]), Err((5, 0x24, 0)), "NACA");
        assert_eq!(
            Cdb::parse(&[0x03, 0x01, 0, 0, 18, 0]),
            Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(1, Some(0))),
            "REQUEST SENSE DESC: only fixed format is returned"
        );
        assert_eq!(
            c(&[0x03, 0, 0, 0, 18, 0]),
            Ok(Cdb::RequestSense { alloc: 18 })
        );
        let mut sai = [0u8; 16];
        sai[0] = 0x9E;
        sai[1] = 0x11;
        assert_eq!(c(&sai), Err((5, 0x24, 0)), "unknown service action");
        let mut rl = [0u8; 12];
        rl[0] = 0xA0;
        rl[9] = 8;
        assert_eq!(c(&rl), Err((5, 0x24, 0)), "REPORT LUNS alloc < 16");
        assert_eq!(c(&[0x28, 0x01, 0, 0, 0, 0, 0, 0, 1, 0]), Err((5, 0x24, 0)));
        // READ CAPACITY(10): the pointer names the field in error.
        let f = |b: &[u8]| Cdb::parse(b).err().and_then(|s| s.field);
        assert_eq!(
            f(&[0x25, 0, 0, 0, 0, 1, 0, 0, 0, 0]),
            Some((true, 2, None)),
            "LBA without PMI"
        );
        assert_eq!(
            f(&[0x25, 0, 0, 0, 0, 0, 0, 0, 1, 0]),
            Some((true, 8, Some(0))),
            "PMI"
        );
        assert_eq!(
            c(&[0x42, 0x01, 0, 0, 0, 0, 0, 0, 24, 0]),
            Err((5, 0x24, 0)),
            "UNMAP ANCHOR"
        );
    }
}
