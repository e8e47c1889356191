//! SCSI status codes and fixed-format sense data (SPC, `iser-iscsi.md` §9.4).

/// SCSI status: GOOD.
pub const GOOD: u8 = 0x00;
/// SCSI status: CHECK CONDITION.
pub const CHECK_CONDITION: u8 = 0x02;
/// SCSI status: BUSY.
pub const BUSY: u8 = 0x08;
/// SCSI status: RESERVATION CONFLICT.
pub const RESERVATION_CONFLICT: u8 = 0x18;
/// SCSI status: TASK SET FULL.
pub const TASK_SET_FULL: u8 = 0x28;
/// SCSI status: TASK ABORTED.
pub const TASK_ABORTED: u8 = 0x40;

/// Sense keys.
pub mod key {
    /// NO SENSE.
    pub const NO_SENSE: u8 = 0x0;
    /// NOT READY.
    pub const NOT_READY: u8 = 0x2;
    /// MEDIUM ERROR.
    pub const MEDIUM_ERROR: u8 = 0x3;
    /// HARDWARE ERROR.
    pub const HARDWARE_ERROR: u8 = 0x4;
    /// ILLEGAL REQUEST.
    pub const ILLEGAL_REQUEST: u8 = 0x5;
    /// UNIT ATTENTION.
    pub const UNIT_ATTENTION: u8 = 0x6;
    /// DATA PROTECT.
    pub const DATA_PROTECT: u8 = 0x7;
    /// ABORTED COMMAND.
    pub const ABORTED_COMMAND: u8 = 0xB;
    /// MISCOMPARE.
    pub const MISCOMPARE: u8 = 0xE;
}

/// Bytes of fixed-format sense data.
pub const FIXED_SENSE_LEN: usize = 18;

/// One sense condition: key, ASC/ASCQ, and the optional INFORMATION
/// field (the failing LBA) and field pointer (sense-key specific).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sense {
    /// Sense key.
    pub key: u8,
    /// Additional sense code.
    pub asc: u8,
    /// Additional sense code qualifier.
    pub ascq: u8,
    /// INFORMATION (valid bit set when present; low 32 bits in fixed format).
    pub info: Option<u64>,
    /// Field pointer: (in CDB, byte, bit) for ILLEGAL REQUEST.
    pub field: Option<(bool, u16, Option<u8>)>,
}

impl Sense {
    const fn new(key: u8, asc: u8, ascq: u8) -> Sense {
        Sense {
            key,
            asc,
            ascq,
            info: None,
            field: None,
        }
    }

    /// ILLEGAL REQUEST 20/00: invalid command operation code.
    pub const INVALID_OPCODE: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x20, 0x00);
    /// ILLEGAL REQUEST 21/00: LBA out of range.
    pub const LBA_OUT_OF_RANGE: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x21, 0x00);
    /// ILLEGAL REQUEST 24/00: invalid field in CDB.
    pub const INVALID_FIELD_IN_CDB: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x24, 0x00);
    /// ILLEGAL REQUEST 25/00: LUN not supported.
    pub const LUN_NOT_SUPPORTED: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x25, 0x00);
    /// ILLEGAL REQUEST 26/00: invalid field in parameter list.
    pub const INVALID_FIELD_IN_PARAM: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x00);
    /// ILLEGAL REQUEST 1A/00: parameter list length error.
    pub const PARAM_LIST_LENGTH: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x1A, 0x00);
    /// DATA PROTECT 27/00: write protected.
    pub const WRITE_PROTECTED: Sense = Sense::new(key::DATA_PROTECT, 0x27, 0x00);
    /// MEDIUM ERROR 11/00: unrecovered read error.
    pub const READ_ERROR: Sense = Sense::new(key::MEDIUM_ERROR, 0x11, 0x00);
    /// MEDIUM ERROR 0C/00: write error.
    pub const WRITE_ERROR: Sense = Sense::new(key::MEDIUM_ERROR, 0x0C, 0x00);
    /// HARDWARE ERROR 44/00: internal target failure.
    pub const INTERNAL_FAILURE: Sense = Sense::new(key::HARDWARE_ERROR, 0x44, 0x00);
    /// ABORTED COMMAND 10/01: logical block guard check failed.
    pub const PI_GUARD: Sense = Sense::new(key::ABORTED_COMMAND, 0x10, 0x01);
    /// ABORTED COMMAND 10/02: logical block application tag check failed.
    pub const PI_APP_TAG: Sense = Sense::new(key::ABORTED_COMMAND, 0x10, 0x02);
    /// ABORTED COMMAND 10/03: logical block reference tag check failed.
    pub const PI_REF_TAG: Sense = Sense::new(key::ABORTED_COMMAND, 0x10, 0x03);
    /// ABORTED COMMAND 0C/0D: write error, not enough unsolicited data.
    pub const NOT_ENOUGH_UNSOLICITED: Sense = Sense::new(key::ABORTED_COMMAND, 0x0C, 0x0D);
    /// ABORTED COMMAND 0C/0C: write error, unexpected unsolicited data
    /// (unsolicited Data-Out although InitialR2T=Yes was negotiated).
    pub const UNEXPECTED_UNSOLICITED: Sense = Sense::new(key::ABORTED_COMMAND, 0x0C, 0x0C);
    /// ABORTED COMMAND 47/05: protocol service CRC error / data transfer failed.
    pub const TRANSFER_FAILED: Sense = Sense::new(key::ABORTED_COMMAND, 0x47, 0x05);
    /// UNIT ATTENTION 29/00: power on, reset.
    pub const POWER_ON: Sense = Sense::new(key::UNIT_ATTENTION, 0x29, 0x00);
    /// MISCOMPARE 1D/00: miscompare during verify operation (INFORMATION:
    /// the offset of the first differing byte in the data-out buffer).
    pub const MISCOMPARE: Sense = Sense::new(key::MISCOMPARE, 0x1D, 0x00);
    /// ILLEGAL REQUEST 26/04: invalid release of persistent reservation.
    pub const INVALID_RELEASE: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x04);
    /// Not a sense condition: the RESERVATION CONFLICT status (0x18),
    /// answered without sense data. Carried where a command's error goes
    /// so that every command path can return it; [`Sense::status`] tells.
    pub const RESERVATION_CONFLICT: Sense = Sense::new(0xFF, 0, 0);

    /// The SCSI status this condition is answered with: CHECK CONDITION
    /// (with sense data), or RESERVATION CONFLICT (without).
    pub fn status(&self) -> u8 {
        if *self == Sense::RESERVATION_CONFLICT {
            RESERVATION_CONFLICT
        } else {
            CHECK_CONDITION
        }
    }

    /// The same condition with the INFORMATION field set.
    pub const fn with_info(mut self, info: u64) -> Sense {
        self.info = Some(info);
        self
    }

    /// The same condition with a field pointer into the CDB (byte, bit).
    pub const fn at_cdb(mut self, byte: u16, bit: Option<u8>) -> Sense {
        self.field = Some((true, byte, bit));
        self
    }

    /// The 18 bytes of fixed-format (0x70) sense data. An INFORMATION
    /// value above 32 bits (an LBA of a large disk) does not fit the
    /// 4-byte field: VALID stays 0 then, as Linux's
    /// `scsi_set_sense_information` does, so that no truncated LBA is
    /// reported as the failing one.
    pub fn fixed(&self) -> [u8; FIXED_SENSE_LEN] {
        let mut b = [0u8; FIXED_SENSE_LEN];
        b[0] = 0x70;
        b[2] = self.key & 0x0F;
        if let Some(i) = self.info.and_then(|i| u32::try_from(i).ok()) {
            b[0] |= 0x80;
            b[3..7].copy_from_slice(&i.to_be_bytes());
        }
        b[7] = 10;
        b[12] = self.asc;
        b[13] = self.ascq;
        if let Some((cd, byte, bit)) = self.field {
            b[15] = 0x80 | if cd { 0x40 } else { 0 } | bit.map_or(0, |x| 0x08 | (x & 7));
            b[16..18].copy_from_slice(&byte.to_be_bytes());
        }
        b
    }

    /// Parse fixed (0x70/0x71) or descriptor (0x72/0x73) sense data into
    /// key/ASC/ASCQ and INFORMATION; `None` if too short or unknown.
    pub fn parse(b: &[u8]) -> Option<Sense> {
        match b.first()? & 0x7F {
            0x70 | 0x71 => {
                if b.len() < 14 {
                    return None;
                }
                let info = (b[0] & 0x80 != 0)
                    .then(|| u64::from(u32::from_be_bytes([b[3], b[4], b[5], b[6]])));
                Some(Sense {
                    key: b[2] & 0x0F,
                    asc: b[12],
                    ascq: b[13],
                    info,
                    field: None,
                })
            }
            0x72 | 0x73 => {
                if b.len() < 4 {
                    return None;
                }
                Some(Sense::new(b[1] & 0x0F, b[2], b[3]))
            }
            _ => None,
        }
    }

    /// Key, ASC and ASCQ, for comparisons that ignore INFORMATION.
    pub fn code(&self) -> (u8, u8, u8) {
        (self.key, self.asc, self.ascq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_format_layout() {
        let s = Sense::PI_GUARD.with_info(0x1234).fixed();
        assert_eq!(s[0], 0xF0);
        assert_eq!(s[2], 0x0B);
        assert_eq!(&s[3..7], &[0, 0, 0x12, 0x34]);
        assert_eq!(s[7], 10);
        assert_eq!((s[12], s[13]), (0x10, 0x01));
        let s = Sense::INVALID_FIELD_IN_CDB.at_cdb(2, Some(5)).fixed();
        assert_eq!(s[0], 0x70);
        assert_eq!((s[15], s[16], s[17]), (0x80 | 0x40 | 0x08 | 5, 0, 2));
        let p = Sense::parse(&Sense::PI_REF_TAG.with_info(9).fixed()).unwrap();
        assert_eq!(p.code(), (0xB, 0x10, 0x03));
        assert_eq!(p.info, Some(9));
        assert_eq!(
            Sense::parse(&[0x72, 0x05, 0x20, 0x00]).unwrap().code(),
            (5, 0x20, 0)
        );
        assert_eq!(Sense::parse(&[0x70, 0]), None);
        assert_eq!(Sense::parse(&[]), None);
    }

    /// An LBA above 32 bits cannot be carried by fixed-format sense: VALID
    /// is 0 rather than the low 32 bits passed off as the failing LBA.
    #[test]
    fn information_above_32_bits_is_not_valid_in_fixed_format() {
        let s = Sense::LBA_OUT_OF_RANGE.with_info((1 << 32) | 5).fixed();
        assert_eq!(s[0], 0x70, "VALID clear");
        assert_eq!(&s[3..7], &[0, 0, 0, 0]);
        assert_eq!((s[2], s[12], s[13]), (5, 0x21, 0));
        assert_eq!(Sense::parse(&s).map(|p| p.info), Some(None));
        let s = Sense::LBA_OUT_OF_RANGE
            .with_info(u64::from(u32::MAX))
            .fixed();
        assert_eq!((s[0], &s[3..7]), (0xF0, &[0xFF; 4][..]), "32 bits fit");
    }
}
