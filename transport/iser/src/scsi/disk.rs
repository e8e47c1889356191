//! A SCSI direct-access block device over a bdev: what it advertises
//! ([`DiskInfo`]) and how each command is answered ([`Disk::exec`]).
//! Commands that touch the medium come back as a [`BlockIo`] plan that
//! the target core runs on the bdev `IoChannel`.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pollux_bdev::{BdevInfo, PiType};

use super::cdb::{Cdb, Rw};
use super::commands::{capacity, inquiry, mode_sense, opcodes};
use super::reservation::{conflicts, Access, Class, ItNexus, LunShared, PR_OUT_PARAM_LEN};
use super::sense::Sense;

/// Vendor identification (8 bytes, space padded).
pub const VENDOR: &[u8; 8] = b"POLLUX  ";

/// What a LUN advertises; built from the bdev on the control path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskInfo {
    /// Logical block size (512 or 4096).
    pub block_size: u32,
    /// Number of blocks.
    pub num_blocks: u64,
    /// PI type 0 (none), 1, 2 or 3.
    pub pi_type: u8,
    /// Bytes per block in the bdev's buffers (block + interleaved metadata).
    pub buf_block_size: u32,
    /// UNMAP and WRITE SAME(16) with UNMAP are advertised (LBPME).
    pub unmap: bool,
    /// Writes are allowed.
    pub writable: bool,
    /// Largest transfer in blocks (VPD B0 MAXIMUM TRANSFER LENGTH).
    pub max_transfer_blocks: u32,
    /// Product identification (16 bytes, space padded).
    pub product: [u8; 16],
    /// Unit serial number (VPD 80).
    pub serial: String,
    /// NAA type 6 designator (VPD 83): 16 bytes.
    pub naa: [u8; 16],
}

/// The IEEE OUI in NAA designators (a locally administered placeholder).
const OUI: u32 = 0x00_1A_2B;

impl DiskInfo {
    /// The description of `bdev` with `max_io_bytes` per command.
    /// PI is advertised when the bdev has Type 1, 2 or 3 PI in 8
    /// interleaved metadata bytes (Type 2 through READ(32)/WRITE(32)).
    pub fn from_bdev(info: &BdevInfo, writable: bool, unmap: bool, max_io_bytes: u32) -> DiskInfo {
        let pi_type = match info.pi_type() {
            PiType::Type1 if info.md_interleave() && info.md_size() == 8 => 1,
            PiType::Type2 if info.md_interleave() && info.md_size() == 8 => 2,
            PiType::Type3 if info.md_interleave() && info.md_size() == 8 => 3,
            _ => 0,
        };
        let mut product = [b' '; 16];
        let p = info.product().as_bytes();
        product[..p.len().min(16)].copy_from_slice(&p[..p.len().min(16)]);
        // A stable id from the name (FNV-1a).
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in info.name().bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        let mut naa = [0u8; 16];
        let hi = (6u64 << 60) | (u64::from(OUI) << 36) | (h >> 28);
        naa[..8].copy_from_slice(&hi.to_be_bytes());
        naa[8..].copy_from_slice(&h.rotate_left(17).to_be_bytes());
        DiskInfo {
            block_size: info.block_size(),
            num_blocks: info.num_blocks(),
            pi_type,
            buf_block_size: info.buf_block_size(),
            // Unmapped blocks read back as zeroes without valid PI.
            unmap: unmap && pi_type == 0,
            writable,
            max_transfer_blocks: (max_io_bytes / info.block_size()).max(1),
            product,
            serial: format!("{h:016x}"),
            naa,
        }
    }

    /// VPD B0 MAXIMUM UNMAP LBA COUNT: [`UNMAP_MAX_BYTES`] of blocks.
    pub fn max_unmap_blocks(&self) -> u32 {
        u32::try_from(UNMAP_MAX_BYTES / u64::from(self.block_size.max(1))).unwrap_or(u32::MAX)
    }

    /// Bytes of one block on the wire when PI travels with it.
    pub fn wire_block(&self, pi_on_wire: bool) -> u32 {
        self.block_size + if pi_on_wire { 8 } else { 0 }
    }
}

/// How PI is handled for one READ or WRITE (`t10-pi.md` §4.1, §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PiMode {
    /// The LU has no PI.
    None,
    /// PROTECT 000b on a PI LU: the wire carries plain blocks; the target
    /// generates PI on write, and checks and strips it on read.
    Strip,
    /// PROTECT 001b-101b: the wire carries PI; the target checks the given
    /// fields (guard, app, ref).
    Pass {
        /// Check the guard.
        guard: bool,
        /// Check the application tag.
        app: bool,
        /// Check the reference tag.
        reftag: bool,
    },
}

impl PiMode {
    /// Whether PI tuples travel on the wire.
    pub fn on_wire(self) -> bool {
        matches!(self, PiMode::Pass { .. })
    }
}

/// The medium operation of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockOp {
    /// Read blocks to the initiator.
    Read,
    /// Write blocks from the initiator.
    Write,
    /// Flush.
    Flush,
    /// Discard (UNMAP; the ranges come in the parameter list).
    Unmap,
    /// Write zeroes.
    WriteZeroes,
    /// Read the blocks and check them (PI), without data-in: VERIFY with
    /// BYTCHK 0.
    VerifyMedium,
    /// Compare the data-out with the medium: VERIFY with BYTCHK 1.
    Compare,
    /// Write, then read back and compare: WRITE AND VERIFY with BYTCHK 1.
    WriteCompare,
    /// COMPARE AND WRITE: the data-out holds the verify blocks, then the
    /// write blocks; the write happens only when the medium matches.
    CompareAndWrite,
    /// WRITE SAME with a pattern: the data-out is one block, written to
    /// every block of the range.
    WriteSame {
        /// LBDATA: each block carries its LBA in its first 4 bytes.
        lbdata: bool,
    },
}

impl BlockOp {
    /// Whether the target runs it as several bdev operations on the task
    /// buffer (see `target::steps`).
    pub fn is_multi_step(self) -> bool {
        matches!(
            self,
            BlockOp::VerifyMedium
                | BlockOp::Compare
                | BlockOp::WriteCompare
                | BlockOp::CompareAndWrite
                | BlockOp::WriteSame { .. }
        )
    }

    /// Whether the command's blocks come from the initiator.
    pub fn has_data_out(self) -> bool {
        matches!(
            self,
            BlockOp::Write | BlockOp::Compare | BlockOp::WriteCompare | BlockOp::CompareAndWrite
        )
    }
}

/// A medium operation planned by [`Disk::exec`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockIo {
    /// What to do.
    pub op: BlockOp,
    /// First LBA.
    pub lba: u64,
    /// Blocks.
    pub blocks: u64,
    /// PI handling (reads and writes).
    pub pi: PiMode,
    /// READ(32)/WRITE(32)'s reference and application tags (PI Type 2).
    pub tags: Option<crate::scsi::PiTags>,
    /// FUA on a [`BlockOp::Write`] or [`BlockOp::CompareAndWrite`]: the
    /// blocks reach the medium before GOOD (a flush of the range follows
    /// the write), as the advertised DPOFUA and write-back cache (WCE)
    /// promise.
    pub fua: bool,
}

impl BlockIo {
    /// Bytes the initiator transfers (reads and writes).
    pub fn wire_len(&self, info: &DiskInfo) -> u64 {
        match self.op {
            BlockOp::Read | BlockOp::Write => {
                self.blocks * u64::from(info.wire_block(self.pi.on_wire()))
            }
            BlockOp::Compare | BlockOp::WriteCompare => self.blocks * u64::from(info.block_size),
            BlockOp::CompareAndWrite => 2 * self.blocks * u64::from(info.block_size),
            _ => 0,
        }
    }
}

/// What the core must do next for a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// GOOD status, no data.
    Good,
    /// GOOD status with `n` bytes of data-in written to the output buffer.
    DataIn(usize),
    /// Run a medium operation.
    Io(BlockIo),
    /// Fetch `len` bytes of data-out (a parameter list or the WRITE SAME
    /// block), then call [`Disk::exec_with_data`].
    NeedData(u32),
}

/// The SCSI side of one LUN as one I_T nexus sees it.
#[derive(Debug, Clone)]
pub struct Disk {
    /// What it advertises.
    pub info: DiskInfo,
    /// What the sessions of the LU share (reservations, COMPARE AND WRITE).
    shared: Arc<LunShared>,
    /// This session's I_T nexus.
    nexus: ItNexus,
    /// This session, among the sessions of its nexus over time (for its
    /// RESERVE(6) reservation: [`Reservations::nexus_lost`]).
    ///
    /// [`Reservations::nexus_lost`]: crate::scsi::reservation::Reservations::nexus_lost
    session: u64,
    /// This nexus's access and the reservation epoch it was computed at.
    access: Cell<(u64, Access)>,
}

fn check_range(info: &DiskInfo, lba: u64, blocks: u64) -> Result<(), Sense> {
    match lba.checked_add(blocks) {
        Some(end) if end <= info.num_blocks => Ok(()),
        _ => Err(Sense::LBA_OUT_OF_RANGE.with_info(lba)),
    }
}

/// The CDB byte where the TRANSFER LENGTH (VERIFICATION LENGTH, NUMBER OF
/// LOGICAL BLOCKS) field of a medium command starts: the field pointer of
/// the INVALID FIELD IN CDB that a too long transfer gets.
fn transfer_len_byte(opcode: u8) -> u16 {
    match opcode {
        super::cdb::op::VARIABLE_LENGTH => 28,
        super::cdb::op::COMPARE_AND_WRITE => 13,
        o => match o >> 5 {
            0 => 4,
            4 => 10,
            5 => 6,
            _ => 7,
        },
    }
}

/// How a command meets a reservation (SPC-4 §5.13.1, table of commands
/// allowed in the presence of reservations).
fn class_of(cmd: &Cdb) -> Class {
    match cmd {
        Cdb::Inquiry { .. }
        | Cdb::ReportLuns { .. }
        | Cdb::RequestSense { .. }
        | Cdb::ReportOpcodes { .. }
        | Cdb::Release6 => Class::Exempt,
        Cdb::TestUnitReady
        | Cdb::ReadCapacity10
        | Cdb::ReadCapacity16 { .. }
        | Cdb::ModeSense { .. }
        | Cdb::PrIn { .. }
        | Cdb::PrOut { .. }
        | Cdb::StartStopUnit { start: true }
        | Cdb::Reserve6 => Class::Status,
        Cdb::Read(_) | Cdb::Verify { .. } | Cdb::GetLbaStatus { .. } => Class::Read,
        Cdb::Write(_)
        | Cdb::WriteVerify { .. }
        | Cdb::CompareAndWrite { .. }
        | Cdb::WriteSame { .. }
        | Cdb::Unmap { .. }
        | Cdb::SyncCache { .. }
        | Cdb::StartStopUnit { start: false } => Class::Write,
    }
}

/// Blocks a WRITE SAME covers: NUMBER OF LOGICAL BLOCKS, or with 0
/// (WSNZ=0) every block from `lba` to the end of the medium.
fn write_same_blocks(info: &DiskInfo, lba: u64, blocks: u32) -> Result<u64, Sense> {
    if lba >= info.num_blocks {
        return Err(Sense::LBA_OUT_OF_RANGE.with_info(lba));
    }
    if blocks == 0 {
        return Ok(info.num_blocks - lba);
    }
    if blocks > WRITE_SAME_MAX_BLOCKS {
        return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(10, None));
    }
    check_range(info, lba, u64::from(blocks))?;
    Ok(u64::from(blocks))
}

impl Disk {
    /// A disk advertising `info`, alone on its LU (its own reservations).
    pub fn new(info: DiskInfo) -> Disk {
        Disk::shared(info, Arc::new(LunShared::default()), ItNexus::default())
    }

    /// A disk advertising `info` to I_T nexus `nexus`, on the LU whose
    /// sessions share `shared`.
    pub fn shared(info: DiskInfo, shared: Arc<LunShared>, nexus: ItNexus) -> Disk {
        /// Session numbers, one per `Disk` (control path: at login).
        static NEXT_SESSION: AtomicU64 = AtomicU64::new(0);
        Disk {
            info,
            shared,
            nexus,
            session: NEXT_SESSION.fetch_add(1, Ordering::Relaxed),
            access: Cell::new((u64::MAX, Access::All)),
        }
    }

    /// What the sessions of this LU share.
    pub fn lun(&self) -> &Arc<LunShared> {
        &self.shared
    }

    /// This session ends: the RESERVE(6) reservation it took goes, not one
    /// a later session of the same nexus took (control path; again is a
    /// no-op).
    pub fn end_nexus(&self) {
        self.shared
            .change(|r| r.nexus_lost(&self.nexus, self.session));
    }

    /// This nexus's access: one atomic load while no reservation changed;
    /// the shared state is read (under its mutex) only after a change.
    fn access(&self) -> Access {
        let epoch = self.shared.epoch();
        let (seen, a) = self.access.get();
        if seen == epoch {
            return a;
        }
        let a = self.shared.lock().access(&self.nexus);
        self.access.set((epoch, a));
        a
    }

    /// The PI handling of a command that moves plain blocks only (VERIFY
    /// with BYTCHK, WRITE AND VERIFY with BYTCHK, COMPARE AND WRITE):
    /// PROTECT must be 000b.
    fn plain_pi(&self, protect: u8) -> Result<PiMode, Sense> {
        if protect != 0 {
            return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(1, Some(7)));
        }
        Ok(if self.info.pi_type == 0 {
            PiMode::None
        } else {
            PiMode::Strip
        })
    }

    /// Blocks of one compare step: the data-out and the read-back both fit
    /// in a task buffer (VPD B0 MAXIMUM TRANSFER LENGTH bytes of 520-byte
    /// blocks).
    pub fn max_compare_blocks(&self) -> u32 {
        let cap =
            u64::from(self.info.max_transfer_blocks) * u64::from(self.info.block_size) / 512 * 520;
        let per = u64::from(self.info.block_size) + u64::from(self.info.buf_block_size);
        u32::try_from(cap / per).unwrap_or(u32::MAX).max(1)
    }

    fn compare_io(
        &self,
        rw: &Rw,
        op: BlockOp,
        write: bool,
        len_byte: u16,
    ) -> Result<Action, Sense> {
        if write && !self.info.writable {
            return Err(Sense::WRITE_PROTECTED);
        }
        let pi = self.plain_pi(rw.protect)?;
        if rw.blocks > self.max_compare_blocks() {
            return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(len_byte, None));
        }
        check_range(&self.info, rw.lba, u64::from(rw.blocks))?;
        if rw.blocks == 0 {
            return Ok(Action::Good);
        }
        Ok(Action::Io(BlockIo {
            op,
            lba: rw.lba,
            blocks: u64::from(rw.blocks),
            pi,
            tags: None,
            // The FUA of COMPARE AND WRITE (VERIFY and WRITE AND VERIFY
            // have none: their `rw.fua` is false).
            fua: write && rw.fua,
        }))
    }

    fn pi_mode(&self, protect: u8) -> Result<PiMode, Sense> {
        if self.info.pi_type == 0 {
            return if protect == 0 {
                Ok(PiMode::None)
            } else {
                Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(1, Some(7)))
            };
        }
        let t3 = self.info.pi_type == 3;
        Ok(match protect {
            0 => PiMode::Strip,
            1 | 5 => PiMode::Pass {
                guard: true,
                app: false,
                reftag: !t3,
            },
            2 => PiMode::Pass {
                guard: false,
                app: false,
                reftag: !t3,
            },
            3 => PiMode::Pass {
                guard: false,
                app: false,
                reftag: false,
            },
            4 => PiMode::Pass {
                guard: true,
                app: false,
                reftag: false,
            },
            _ => return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(1, Some(7))),
        })
    }

    fn rw(&self, rw: &Rw, write: bool, len_byte: u16) -> Result<Action, Sense> {
        if write && !self.info.writable {
            return Err(Sense::WRITE_PROTECTED);
        }
        // READ(32)/WRITE(32) exist for PI Type 2, whose PI the 10-, 12-
        // and 16-byte forms cannot name (SBC: INVALID COMMAND OPERATION
        // CODE for either mismatch).
        let type2 = self.info.pi_type == 2;
        if rw.tags.is_some() != type2 && (rw.tags.is_some() || rw.protect != 0) {
            return Err(Sense::INVALID_OPCODE);
        }
        // PROTECT sits in byte 10 of READ(32)/WRITE(32) (the forms with
        // tags), in byte 1 of the others.
        let pi = self.pi_mode(rw.protect).map_err(|s| match rw.tags {
            Some(_) => s.at_cdb(10, Some(7)),
            None => s,
        })?;
        if rw.blocks > self.info.max_transfer_blocks {
            return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(len_byte, None));
        }
        check_range(&self.info, rw.lba, u64::from(rw.blocks))?;
        if rw.blocks == 0 {
            return Ok(Action::Good);
        }
        Ok(Action::Io(BlockIo {
            op: if write { BlockOp::Write } else { BlockOp::Read },
            lba: rw.lba,
            blocks: u64::from(rw.blocks),
            pi,
            tags: rw.tags,
            fua: write && rw.fua,
        }))
    }

    /// Decode and answer `cdb`: data-in commands write into `out` (which
    /// should hold at least 512 bytes, and up to 64 KiB for a PERSISTENT
    /// RESERVE IN of many registrations; answers are cut to the allocation
    /// length and to `out`), medium commands return a plan.
    ///
    /// # Errors
    /// The sense to report with CHECK CONDITION.
    pub fn exec(&self, cdb: &[u8], out: &mut [u8]) -> Result<Action, Sense> {
        let cmd = Cdb::parse(cdb)?;
        if conflicts(self.access(), class_of(&cmd)) {
            return Err(Sense::RESERVATION_CONFLICT);
        }
        let info = &self.info;
        let len_byte = transfer_len_byte(cdb.first().copied().unwrap_or(0));
        let fit = |n: usize, alloc: u32| n.min(alloc as usize).min(out.len());
        match cmd {
            Cdb::TestUnitReady | Cdb::StartStopUnit { .. } => Ok(Action::Good),
            Cdb::RequestSense { alloc } => {
                let s = Sense {
                    key: 0,
                    asc: 0,
                    ascq: 0,
                    info: None,
                    field: None,
                }
                .fixed();
                let n = fit(s.len(), alloc);
                out[..n].copy_from_slice(&s[..n]);
                Ok(Action::DataIn(n))
            }
            Cdb::Inquiry { evpd, page, alloc } => {
                let mut buf = [0u8; 512];
                let n = if evpd {
                    inquiry::vpd(info, page, &mut buf)?
                } else {
                    inquiry::standard(info, &mut buf)
                };
                let n2 = fit(n, alloc);
                out[..n2].copy_from_slice(&buf[..n2]);
                Ok(Action::DataIn(n2))
            }
            Cdb::ModeSense {
                ten,
                dbd,
                pc,
                page,
                subpage,
                alloc,
            } => {
                let mut buf = [0u8; 512];
                let n = mode_sense::mode_sense(info, ten, dbd, pc, page, subpage, &mut buf)?;
                let n2 = fit(n, alloc);
                out[..n2].copy_from_slice(&buf[..n2]);
                Ok(Action::DataIn(n2))
            }
            Cdb::ReadCapacity10 => {
                let b = capacity::rc10(info);
                let n = fit(b.len(), 8);
                out[..n].copy_from_slice(&b[..n]);
                Ok(Action::DataIn(n))
            }
            Cdb::ReadCapacity16 { alloc } => {
                let b = capacity::rc16(info);
                let n = fit(b.len(), alloc);
                out[..n].copy_from_slice(&b[..n]);
                Ok(Action::DataIn(n))
            }
            Cdb::Read(rw) => self.rw(&rw, false, len_byte),
            Cdb::Write(rw) => self.rw(&rw, true, len_byte),
            Cdb::SyncCache { lba, blocks } => {
                let n = if blocks == 0 {
                    info.num_blocks.saturating_sub(lba)
                } else {
                    u64::from(blocks)
                };
                check_range(info, lba, n)?;
                if n == 0 {
                    return Ok(Action::Good);
                }
                Ok(Action::Io(BlockIo {
                    op: BlockOp::Flush,
                    lba,
                    blocks: n,
                    pi: PiMode::None,
                    tags: None,
                    fua: false,
                }))
            }
            Cdb::Unmap { param_len } => {
                if !info.unmap {
                    return Err(Sense::INVALID_OPCODE);
                }
                if !info.writable {
                    return Err(Sense::WRITE_PROTECTED);
                }
                match param_len {
                    0 => Ok(Action::Good),
                    1..=7 => Err(Sense::PARAM_LIST_LENGTH),
                    n => Ok(Action::NeedData(n.min(8 + 16 * UNMAP_MAX_DESCRIPTORS))),
                }
            }
            Cdb::WriteSame {
                lba,
                blocks,
                unmap,
                ndob,
                ..
            } => {
                if !info.writable {
                    return Err(Sense::WRITE_PROTECTED);
                }
                if unmap && !info.unmap {
                    return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(1, Some(3)));
                }
                let n = write_same_blocks(info, lba, blocks)?;
                if ndob {
                    Ok(Action::Io(BlockIo {
                        op: if unmap {
                            BlockOp::Unmap
                        } else {
                            BlockOp::WriteZeroes
                        },
                        lba,
                        blocks: n,
                        pi: PiMode::None,
                        tags: None,
                        fua: false,
                    }))
                } else {
                    Ok(Action::NeedData(info.block_size))
                }
            }
            Cdb::Verify { rw, bytchk: true } => {
                self.compare_io(&rw, BlockOp::Compare, false, len_byte)
            }
            Cdb::Verify { rw, bytchk: false } => {
                let pi = self.plain_pi(rw.protect)?;
                if rw.blocks > info.max_transfer_blocks {
                    return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(len_byte, None));
                }
                check_range(info, rw.lba, u64::from(rw.blocks))?;
                if rw.blocks == 0 {
                    return Ok(Action::Good);
                }
                Ok(Action::Io(BlockIo {
                    op: BlockOp::VerifyMedium,
                    lba: rw.lba,
                    blocks: u64::from(rw.blocks),
                    pi,
                    tags: None,
                    fua: false,
                }))
            }
            Cdb::WriteVerify { rw, bytchk: true } => {
                self.compare_io(&rw, BlockOp::WriteCompare, true, len_byte)
            }
            // The write completes on the medium (FUA) before GOOD: the
            // medium verification BYTCHK 0 asks for.
            Cdb::WriteVerify { rw, bytchk: false } => {
                self.rw(&Rw { fua: true, ..rw }, true, len_byte)
            }
            Cdb::CompareAndWrite { rw } => {
                if rw.blocks > COMPARE_AND_WRITE_MAX_BLOCKS {
                    return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(len_byte, None));
                }
                self.compare_io(&rw, BlockOp::CompareAndWrite, true, len_byte)
            }
            Cdb::GetLbaStatus { lba, alloc } => {
                if lba >= info.num_blocks {
                    return Err(Sense::LBA_OUT_OF_RANGE.with_info(lba));
                }
                // One descriptor: the blocks from `lba` on are mapped or
                // of unknown state (provisioning status 0h): the bdevs do
                // not report what they have deallocated.
                let mut b = [0u8; 24];
                b[..4].copy_from_slice(&20u32.to_be_bytes());
                b[8..16].copy_from_slice(&lba.to_be_bytes());
                let n = u32::try_from(info.num_blocks - lba).unwrap_or(u32::MAX);
                b[16..20].copy_from_slice(&n.to_be_bytes());
                let n2 = fit(b.len(), alloc);
                out[..n2].copy_from_slice(&b[..n2]);
                Ok(Action::DataIn(n2))
            }
            Cdb::PrIn { sa, alloc } => {
                // Straight into `out`: READ KEYS grows with the
                // registrations (8 bytes each), past any fixed buffer.
                let n = self.shared.lock().read(sa, out)?;
                Ok(Action::DataIn(n.min(alloc as usize).min(out.len())))
            }
            Cdb::PrOut { sa, param_len, .. } => {
                use super::reservation::out_sa;
                if !matches!(
                    sa,
                    out_sa::REGISTER
                        | out_sa::RESERVE
                        | out_sa::RELEASE
                        | out_sa::CLEAR
                        | out_sa::PREEMPT
                        | out_sa::REGISTER_AND_IGNORE
                ) {
                    return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(1, Some(4)));
                }
                if param_len != PR_OUT_PARAM_LEN {
                    return Err(Sense::PARAM_LIST_LENGTH);
                }
                Ok(Action::NeedData(param_len))
            }
            Cdb::Reserve6 => {
                self.shared
                    .change(|r| r.reserve6(&self.nexus, self.session))?;
                Ok(Action::Good)
            }
            Cdb::Release6 => {
                self.shared.change(|r| r.release6(&self.nexus))?;
                Ok(Action::Good)
            }
            Cdb::ReportOpcodes {
                options,
                opcode,
                sa,
                alloc,
            } => {
                let mut buf = [0u8; 512];
                let n = opcodes::report(options, opcode, sa, info.unmap, &mut buf)?;
                let n2 = fit(n, alloc);
                out[..n2].copy_from_slice(&buf[..n2]);
                Ok(Action::DataIn(n2))
            }
            Cdb::ReportLuns { .. } => Err(Sense::INVALID_OPCODE), // answered by the target, which knows the LUNs
        }
    }

    /// Finish a command that needed data-out ([`Action::NeedData`]).
    ///
    /// # Errors
    /// The sense to report (parameter list errors, unsupported WRITE SAME
    /// pattern).
    pub fn exec_with_data(&self, cdb: &[u8], data: &[u8]) -> Result<Action, Sense> {
        match Cdb::parse(cdb)? {
            Cdb::Unmap { .. } => {
                let Some((lba, blocks)) =
                    super::commands::unmap::parse(data, self.info.max_unmap_blocks())?
                else {
                    return Ok(Action::Good);
                };
                check_range(&self.info, lba, blocks)?;
                if blocks == 0 {
                    return Ok(Action::Good);
                }
                Ok(Action::Io(BlockIo {
                    op: BlockOp::Unmap,
                    lba,
                    blocks,
                    pi: PiMode::None,
                    tags: None,
                    fua: false,
                }))
            }
            Cdb::WriteSame {
                lba,
                blocks,
                unmap,
                lbdata,
                ..
            } => {
                let n = write_same_blocks(&self.info, lba, blocks)?;
                if data.len() < self.info.block_size as usize {
                    return Err(Sense::PARAM_LIST_LENGTH);
                }
                let zero = !lbdata && data.iter().all(|&b| b == 0);
                let op = match (zero, unmap) {
                    // Unmapped blocks read back as zeroes (LBPRZ).
                    (true, true) => BlockOp::Unmap,
                    (true, false) => BlockOp::WriteZeroes,
                    // Any other pattern is written, UNMAP or not.
                    (false, _) => BlockOp::WriteSame { lbdata },
                };
                let pi = if matches!(op, BlockOp::WriteSame { .. }) && self.info.pi_type != 0 {
                    PiMode::Strip
                } else {
                    PiMode::None
                };
                Ok(Action::Io(BlockIo {
                    op,
                    lba,
                    blocks: n,
                    pi,
                    tags: None,
                    fua: false,
                }))
            }
            Cdb::PrOut { sa, scope_type, .. } => {
                self.shared
                    .change(|r| r.out(&self.nexus, sa, scope_type, data))?;
                Ok(Action::Good)
            }
            _ => Err(Sense::INVALID_OPCODE),
        }
    }
}

/// UNMAP block descriptors accepted per command (VPD B0).
pub const UNMAP_MAX_DESCRIPTORS: u32 = 1;
/// Largest UNMAP in bytes: VPD B0 MAXIMUM UNMAP LBA COUNT is this many
/// bytes of blocks (1,048,576 blocks of 512 B, 131,072 of 4 KiB). Linux
/// keeps a discard in one bio whose size is a 32-bit byte count, so a
/// count above 4 GiB of blocks (the former 4,194,304 blocks of 4 KiB)
/// cannot be used as advertised; 512 MiB is what LIO's default
/// (`max_unmap_lba_count` of its file backend, 2^20 blocks of 512 B) lets
/// initiators send, and Linux, ESXi and Windows accept it.
pub const UNMAP_MAX_BYTES: u64 = 512 << 20;
/// Largest WRITE SAME range in blocks (VPD B0).
pub const WRITE_SAME_MAX_BLOCKS: u32 = 1 << 22;
/// Largest COMPARE AND WRITE in blocks (VPD B0, as Linux's LIO: one).
pub const COMPARE_AND_WRITE_MAX_BLOCKS: u32 = 1;

#[cfg(test)]
mod tests;
