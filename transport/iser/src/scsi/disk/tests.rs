//! Every command and sense code of the disk.

use super::*;
use pollux_bdev::BdevInfo;
use std::sync::Arc;

use crate::scsi::reservation::{ItNexus, LunShared};

fn disk(pi: PiType, unmap: bool, writable: bool) -> Disk {
    let mut info = BdevInfo::new("d0", "Malloc disk", 512, 1 << 20).unwrap();
    if pi != PiType::None {
        info = info.with_metadata(8, true, pi).unwrap();
    }
    Disk::new(DiskInfo::from_bdev(&info, writable, unmap, 128 * 1024))
}

fn run(d: &Disk, cdb: &[u8]) -> (Result<Action, Sense>, Vec<u8>) {
    let mut out = vec![0u8; 512];
    let r = d.exec(cdb, &mut out);
    let n = match r {
        Ok(Action::DataIn(n)) => n,
        _ => 0,
    };
    out.truncate(n);
    (r, out)
}

fn code(r: Result<Action, Sense>) -> (u8, u8, u8) {
    r.expect_err("sense").code()
}

#[test]
fn inquiry_standard_and_vpd() {
    let d = disk(PiType::Type1, false, true);
    let (_, b) = run(&d, &[0x12, 0, 0, 0, 36, 0]);
    assert_eq!(b.len(), 36);
    assert_eq!(
        (b[0], b[2], b[3] & 0x0F, b[4], b[5] & 1, b[7] & 2),
        (0, 6, 2, 91, 1, 2)
    );
    assert_eq!(&b[8..16], b"POLLUX  ");
    let (_, b) = run(&d, &[0x12, 1, 0x00, 0, 4, 0]);
    assert_eq!(b, [0, 0, 0, 6]);
    let (_, b) = run(&d, &[0x12, 1, 0x00, 0, 255, 0]);
    assert_eq!(&b[4..], &[0x00, 0x80, 0x83, 0xB0, 0xB1, 0xB2]);
    let (_, b) = run(&d, &[0x12, 1, 0x80, 0, 255, 0]);
    assert_eq!(b[1], 0x80);
    assert_eq!(b.len(), 4 + 16);
    let (_, b) = run(&d, &[0x12, 1, 0x83, 0, 255, 0]);
    assert_eq!((b[4], b[5], b[7], b[8] >> 4), (1, 3, 16, 6));
    let (_, b) = run(&d, &[0x12, 1, 0xB0, 0, 255, 0]);
    assert_eq!(b.len(), 64);
    assert_eq!(u32::from_be_bytes(b[8..12].try_into().unwrap()), 256);
    let (_, b) = run(&d, &[0x12, 1, 0xB1, 0, 255, 0]);
    assert_eq!(&b[4..6], &[0, 1]);
    let (_, b) = run(&d, &[0x12, 1, 0xB2, 0, 255, 0]);
    assert_eq!(b[5], 0, "no UNMAP on a PI disk");
    assert_eq!(code(run(&d, &[0x12, 1, 0x89, 0, 255, 0]).0), (5, 0x24, 0));
}

#[test]
fn read_capacity_reports_protection() {
    let d = disk(PiType::Type1, false, true);
    let (_, b) = run(&d, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(b, [0, 0x0F, 0xFF, 0xFF, 0, 0, 2, 0]);
    let mut c = [0u8; 16];
    c[0] = 0x9E;
    c[1] = 0x10;
    c[13] = 32;
    let (_, b) = run(&d, &c);
    assert_eq!(b.len(), 32);
    assert_eq!(
        u64::from_be_bytes(b[..8].try_into().unwrap()),
        (1 << 20) - 1
    );
    assert_eq!(b[12], 0x01, "PROT_EN, P_TYPE 0 = Type 1");
    let d3 = disk(PiType::Type3, false, true);
    assert_eq!(run(&d3, &c).1[12], 0x01 | (2 << 1));
    let du = disk(PiType::None, true, true);
    let b = run(&du, &c).1;
    assert_eq!((b[12], b[14] & 0xC0), (0, 0xC0), "LBPME + LBPRZ");
}

#[test]
fn mode_sense_pages() {
    let d = disk(PiType::None, false, true);
    let (_, b) = run(&d, &[0x1A, 0, 0x3F, 0, 4, 0]);
    assert_eq!(b.len(), 4);
    assert_eq!(b[2] & 0x80, 0, "not write protected");
    let (_, b) = run(&d, &[0x1A, 0x08, 0x08, 0, 255, 0]);
    assert_eq!(
        (b[0] as usize + 1, b[3], b[4], b[6] & 4),
        (b.len(), 0, 0x08, 4)
    );
    let (_, b) = run(&d, &[0x5A, 0x08, 0x0A, 0, 0, 0, 0, 0, 36, 0]);
    assert_eq!((b[8], b[9]), (0x0A, 0x0A));
    let (_, b) = run(&d, &[0x1A, 0, 0x3F, 0, 255, 0]);
    assert_eq!(b[3], 8, "block descriptor");
    let ro = disk(PiType::None, false, false);
    assert_eq!(run(&ro, &[0x1A, 0, 0x3F, 0, 4, 0]).1[2] & 0x80, 0x80);
    assert_eq!(code(run(&d, &[0x1A, 0, 0x1C, 0, 255, 0]).0), (5, 0x24, 0));
    assert_eq!(
        code(run(&d, &[0x1A, 0, 0xC8, 0, 255, 0]).0),
        (5, 0x24, 0),
        "saved values"
    );
    assert_eq!(
        code(run(&d, &[0x5A, 0, 0x0A, 0x05, 0, 0, 0, 0, 36, 0]).0),
        (5, 0x24, 0)
    );
}

#[test]
fn reads_and_writes_plan_io_with_pi_modes() {
    let d = disk(PiType::Type1, false, true);
    let r = run(&d, &[0x28, 0x20, 0, 0, 0, 10, 0, 0, 8, 0]).0.unwrap();
    let Action::Io(io) = r else { panic!() };
    assert_eq!((io.op, io.lba, io.blocks), (BlockOp::Read, 10, 8));
    assert_eq!(
        io.pi,
        PiMode::Pass {
            guard: true,
            app: false,
            reftag: true
        }
    );
    assert_eq!(io.wire_len(&d.info), 8 * 520);
    let Action::Io(io) = run(&d, &[0x2A, 0, 0, 0, 0, 10, 0, 0, 8, 0]).0.unwrap() else {
        panic!()
    };
    assert_eq!(
        (io.op, io.pi, io.wire_len(&d.info)),
        (BlockOp::Write, PiMode::Strip, 8 * 512)
    );
    assert_eq!(
        code(run(&d, &[0x28, 0xC0, 0, 0, 0, 0, 0, 0, 1, 0]).0),
        (5, 0x24, 0),
        "RDPROTECT 110b"
    );
    let plain = disk(PiType::None, false, true);
    assert_eq!(
        code(run(&plain, &[0x28, 0x20, 0, 0, 0, 0, 0, 0, 1, 0]).0),
        (5, 0x24, 0)
    );
    assert_eq!(
        code(run(&plain, &[0x28, 0, 0, 0x10, 0, 0, 0, 0, 1, 0]).0),
        (5, 0x21, 0),
        "LBA out of range"
    );
    let mut r16 = [0u8; 16];
    r16[0] = 0x88;
    r16[2..10].copy_from_slice(&u64::MAX.to_be_bytes());
    r16[13] = 1;
    assert_eq!(code(run(&plain, &r16).0), (5, 0x21, 0), "LBA overflow");
    assert_eq!(
        code(run(&plain, &[0x28, 0, 0, 0, 0, 0, 0, 2, 1, 0]).0),
        (5, 0x24, 0),
        "too long"
    );
    assert_eq!(
        run(&plain, &[0x28, 0, 0, 0, 0, 0, 0, 0, 0, 0]).0,
        Ok(Action::Good)
    );
    let ro = disk(PiType::None, false, false);
    assert_eq!(
        code(run(&ro, &[0x2A, 0, 0, 0, 0, 0, 0, 0, 1, 0]).0),
        (7, 0x27, 0)
    );
}

#[test]
fn unmap_write_same_sync_and_misc() {
    let d = disk(PiType::None, true, true);
    assert_eq!(run(&d, &[0x00; 6]).0, Ok(Action::Good));
    assert_eq!(run(&d, &[0x1B, 0, 0, 0, 1, 0]).0, Ok(Action::Good));
    let Ok(Action::Io(io)) = run(&d, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0]).0 else {
        panic!()
    };
    assert_eq!((io.op, io.blocks), (BlockOp::Flush, 1 << 20));
    let unmap = [0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0];
    assert_eq!(run(&d, &unmap).0, Ok(Action::NeedData(24)));
    let mut pl = vec![0u8; 24];
    pl[1] = 22;
    pl[3] = 16;
    pl[15] = 5; // LBA 5
    pl[19] = 8; // 8 blocks
    let Ok(Action::Io(io)) = d.exec_with_data(&unmap, &pl) else {
        panic!()
    };
    assert_eq!((io.op, io.lba, io.blocks), (BlockOp::Unmap, 5, 8));
    pl[1] = 30;
    assert_eq!(
        d.exec_with_data(&unmap, &pl).unwrap_err().code(),
        (5, 0x26, 0)
    );
    assert_eq!(
        code(run(&d, &[0x42, 0, 0, 0, 0, 0, 0, 0, 4, 0]).0),
        (5, 0x1A, 0)
    );
    let mut ws = [0u8; 16];
    ws[0] = 0x93;
    ws[1] = 0x08 | 0x01;
    ws[13] = 16;
    let Ok(Action::Io(io)) = run(&d, &ws).0 else {
        panic!()
    };
    assert_eq!((io.op, io.blocks), (BlockOp::Unmap, 16));
    ws[1] = 0;
    assert_eq!(run(&d, &ws).0, Ok(Action::NeedData(512)));
    assert!(matches!(
        d.exec_with_data(&ws, &[0u8; 512]),
        Ok(Action::Io(BlockIo {
            op: BlockOp::WriteZeroes,
            ..
        }))
    ));
    assert!(matches!(
        d.exec_with_data(&ws, &[1u8; 512]),
        Ok(Action::Io(BlockIo {
            op: BlockOp::WriteSame { lbdata: false },
            ..
        }))
    ));
    let nou = disk(PiType::None, false, true);
    assert_eq!(
        code(run(&nou, &unmap).0),
        (5, 0x20, 0),
        "UNMAP not advertised"
    );
    assert_eq!(
        code(run(&d, &[0x04, 0, 0, 0, 0, 0]).0),
        (5, 0x20, 0),
        "invalid opcode"
    );
    let (r, b) = run(&d, &[0x03, 0, 0, 0, 18, 0]);
    assert_eq!((r, b[0]), (Ok(Action::DataIn(18)), 0x70));
}

use crate::scsi::cdb::build::write_same16 as ws16;

#[test]
fn inquiry_claims_sam5_spc4_sbc3_iscsi() {
    let d = disk(PiType::None, true, true);
    let (_, b) = run(&d, &[0x12, 0, 0, 0, 96, 0]);
    let v: Vec<u16> = b[58..74]
        .chunks(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]))
        .collect();
    assert_eq!(v, [0x00A0, 0x0460, 0x04C0, 0x0960, 0, 0, 0, 0]);
}

#[test]
fn block_limits_values_initiators_accept() {
    let d = disk(PiType::None, true, true);
    let (_, b) = run(&d, &[0x12, 1, 0xB0, 0, 255, 0]);
    let be32 = |o: usize| u32::from_be_bytes(b[o..o + 4].try_into().unwrap());
    assert_eq!(b[4] & 1, 0, "WSNZ=0: 0 blocks means to the end");
    assert_eq!(b[5], 1, "MAXIMUM COMPARE AND WRITE LENGTH");
    assert_eq!(be32(20), 1 << 20, "MAXIMUM UNMAP LBA COUNT (512 MiB)");
    assert_eq!(be32(24), 1, "MAXIMUM UNMAP BLOCK DESCRIPTOR COUNT");
    let mut info = BdevInfo::new("d4k", "Malloc disk", 4096, 1 << 18).unwrap();
    info = info.clone();
    let d4 = Disk::new(DiskInfo::from_bdev(&info, true, true, 128 * 1024));
    let (_, b) = run(&d4, &[0x12, 1, 0xB0, 0, 255, 0]);
    assert_eq!(
        u32::from_be_bytes(b[20..24].try_into().unwrap()),
        1 << 17,
        "512 MiB of 4 KiB blocks"
    );
    // An UNMAP descriptor above the advertised count is refused.
    let mut pl = [0u8; 24];
    pl[1] = 22;
    pl[3] = 16;
    pl[16..20].copy_from_slice(&((1u32 << 20) + 1).to_be_bytes());
    let unmap = [0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0];
    assert_eq!(
        d.exec_with_data(&unmap, &pl).map_err(|s| s.code()),
        Err((5, 0x26, 0))
    );
}

#[test]
fn write_same_pattern_zero_length_and_refusals() {
    let d = disk(PiType::None, true, true);
    let last = (1u64 << 20) - 1;
    // Any pattern is accepted and planned as a pattern write.
    assert_eq!(run(&d, &ws16(0, 8, 4)).0, Ok(Action::NeedData(512)));
    let pat = [0x5Au8; 512];
    assert_eq!(
        d.exec_with_data(&ws16(0, 8, 4), &pat),
        Ok(Action::Io(BlockIo {
            op: BlockOp::WriteSame { lbdata: false },
            lba: 8,
            blocks: 4,
            pi: PiMode::None,
            tags: None,
            fua: false
        }))
    );
    // A zero pattern becomes write zeroes, with UNMAP an unmap.
    let zero = [0u8; 512];
    let op = |r: Result<Action, Sense>| match r {
        Ok(Action::Io(io)) => (io.op, io.lba, io.blocks),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        op(d.exec_with_data(&ws16(0, 8, 4), &zero)),
        (BlockOp::WriteZeroes, 8, 4)
    );
    assert_eq!(
        op(d.exec_with_data(&ws16(0x08, 8, 4), &zero)),
        (BlockOp::Unmap, 8, 4)
    );
    // UNMAP with another pattern writes it.
    assert_eq!(
        op(d.exec_with_data(&ws16(0x08, 8, 4), &pat)).0,
        BlockOp::WriteSame { lbdata: false }
    );
    // LBDATA: the pattern with the LBA in it.
    assert_eq!(
        op(d.exec_with_data(&ws16(0x02, 8, 4), &zero)).0,
        BlockOp::WriteSame { lbdata: true }
    );
    // NUMBER OF LOGICAL BLOCKS 0: to the end of the medium (WSNZ=0).
    assert_eq!(run(&d, &ws16(0, last - 1, 0)).0, Ok(Action::NeedData(512)));
    assert_eq!(op(d.exec_with_data(&ws16(0, last - 1, 0), &pat)).2, 2);
    assert_eq!(
        op(run(&d, &ws16(0x01, 10, 0)).0),
        (BlockOp::WriteZeroes, 10, last - 9)
    );
    // Out of range, 0 blocks included: 21/00 with the LBA.
    let e = run(&d, &ws16(0, last + 1, 0)).0.unwrap_err();
    assert_eq!((e.code(), e.info), ((5, 0x21, 0), Some(last + 1)));
    assert_eq!(code(run(&d, &ws16(0, last, 2)).0), (5, 0x21, 0));
    // ANCHOR (not advertised), PBDATA, WRPROTECT, LBDATA with UNMAP: 24/00.
    for flags in [0x10, 0x04, 0x20, 0x0A, 0x03] {
        assert_eq!(
            code(run(&d, &ws16(flags, 0, 1)).0),
            (5, 0x24, 0),
            "{flags:#x}"
        );
    }
    // WRITE SAME(10).
    let ws10 = [0x41, 0x00, 0, 0, 0, 8, 0, 0, 4, 0];
    assert_eq!(run(&d, &ws10).0, Ok(Action::NeedData(512)));
    assert_eq!(
        op(d.exec_with_data(&ws10, &pat)),
        (BlockOp::WriteSame { lbdata: false }, 8, 4)
    );
    assert_eq!(
        code(run(&d, &[0x41, 0x10, 0, 0, 0, 8, 0, 0, 4, 0]).0),
        (5, 0x24, 0),
        "WRITE SAME(10) ANCHOR"
    );
}

#[test]
fn new_block_commands_plan_their_io() {
    let d = disk(PiType::None, true, true);
    let io = |r: Result<Action, Sense>| match r {
        Ok(Action::Io(io)) => (io.op, io.lba, io.blocks),
        other => panic!("{other:?}"),
    };
    // READ(6) with 0 = 256 blocks, READ(12), WRITE(12), WRITE(6).
    assert_eq!(
        io(run(&d, &[0x08, 0x01, 0x00, 0x10, 0, 0]).0),
        (BlockOp::Read, 0x10010, 256)
    );
    assert_eq!(
        io(run(&d, &[0xA8, 0, 0, 0, 1, 0, 0, 0, 0, 8, 0, 0]).0),
        (BlockOp::Read, 256, 8)
    );
    assert_eq!(
        io(run(&d, &[0xAA, 0, 0, 0, 1, 0, 0, 0, 0, 8, 0, 0]).0),
        (BlockOp::Write, 256, 8)
    );
    assert_eq!(
        io(run(&d, &[0x0A, 0, 0, 5, 2, 0]).0),
        (BlockOp::Write, 5, 2)
    );
    // VERIFY(10/12/16) with BYTCHK 0 and 1, WRITE AND VERIFY.
    assert_eq!(
        io(run(&d, &[0x2F, 0, 0, 0, 0, 9, 0, 0, 3, 0]).0),
        (BlockOp::VerifyMedium, 9, 3)
    );
    assert_eq!(
        io(run(&d, &[0x2F, 0x02, 0, 0, 0, 9, 0, 0, 3, 0]).0),
        (BlockOp::Compare, 9, 3)
    );
    assert_eq!(
        io(run(&d, &[0xAF, 0x02, 0, 0, 0, 9, 0, 0, 0, 3, 0, 0]).0),
        (BlockOp::Compare, 9, 3)
    );
    let mut v16 = [0u8; 16];
    v16[0] = 0x8F;
    v16[9] = 9;
    v16[13] = 3;
    assert_eq!(io(run(&d, &v16).0), (BlockOp::VerifyMedium, 9, 3));
    assert_eq!(
        code(run(&d, &[0x2F, 0x04, 0, 0, 0, 9, 0, 0, 3, 0]).0),
        (5, 0x24, 0),
        "BYTCHK 10b"
    );
    assert_eq!(
        run(&d, &[0x2F, 0, 0, 0, 0, 9, 0, 0, 0, 0]).0,
        Ok(Action::Good)
    );
    assert_eq!(
        io(run(&d, &[0x2E, 0x02, 0, 0, 0, 9, 0, 0, 3, 0]).0),
        (BlockOp::WriteCompare, 9, 3)
    );
    assert_eq!(
        io(run(&d, &[0x2E, 0, 0, 0, 0, 9, 0, 0, 3, 0]).0),
        (BlockOp::Write, 9, 3)
    );
    // COMPARE AND WRITE: one block at most, 0 is a no-op.
    let mut caw = [0u8; 16];
    caw[0] = 0x89;
    caw[9] = 7;
    caw[13] = 1;
    let r = run(&d, &caw).0;
    assert_eq!(io(r), (BlockOp::CompareAndWrite, 7, 1));
    if let Ok(Action::Io(b)) = r {
        assert_eq!(b.wire_len(&d.info), 1024, "verify block + write block");
    }
    caw[13] = 2;
    assert_eq!(code(run(&d, &caw).0), (5, 0x24, 0));
    caw[13] = 0;
    assert_eq!(run(&d, &caw).0, Ok(Action::Good));
    let ro = disk(PiType::None, true, false);
    caw[13] = 1;
    assert_eq!(code(run(&ro, &caw).0), (7, 0x27, 0));
}

#[test]
fn get_lba_status_reports_the_rest_mapped() {
    let d = disk(PiType::None, true, true);
    let mut c = [0u8; 16];
    c[0] = 0x9E;
    c[1] = 0x12;
    c[2..10].copy_from_slice(&1000u64.to_be_bytes());
    c[13] = 32;
    let (_, b) = run(&d, &c);
    assert_eq!(b.len(), 24);
    assert_eq!(&b[..4], &20u32.to_be_bytes());
    assert_eq!(u64::from_be_bytes(b[8..16].try_into().unwrap()), 1000);
    assert_eq!(
        u32::from_be_bytes(b[16..20].try_into().unwrap()),
        (1 << 20) - 1000
    );
    assert_eq!(b[20] & 0x0F, 0, "mapped or unknown");
    c[2..10].copy_from_slice(&(1u64 << 20).to_be_bytes());
    assert_eq!(code(run(&d, &c).0), (5, 0x21, 0));
}

/// Initiator port `i` of one initiator, through portal group 1.
fn nx(i: u8) -> ItNexus {
    ItNexus {
        initiator: "iqn.2024-01.io.pollux:host".into(),
        isid: [0x80, 0, 0, 0, 0, i],
        tpgt: 1,
    }
}

#[test]
fn reservations_conflict_on_media_commands() {
    let info = disk(PiType::None, true, true).info;
    let lu = Arc::new(LunShared::default());
    let a = Disk::shared(info.clone(), lu.clone(), nx(1));
    let b = Disk::shared(info, lu, nx(2));
    let read = [0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    let write = [0x2A, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    assert!(matches!(run(&b, &write).0, Ok(Action::Io(_))));
    // A: REGISTER key 0xA, RESERVE Exclusive Access.
    let pr_out = |sa: u8, ty: u8| [0x5F, sa, ty, 0, 0, 0, 0, 0, 24, 0];
    let mut p = [0u8; 24];
    p[8..16].copy_from_slice(&0xAu64.to_be_bytes());
    assert_eq!(run(&a, &pr_out(0, 0)).0, Ok(Action::NeedData(24)));
    assert_eq!(a.exec_with_data(&pr_out(0, 0), &p), Ok(Action::Good));
    let mut p = [0u8; 24];
    p[..8].copy_from_slice(&0xAu64.to_be_bytes());
    assert_eq!(a.exec_with_data(&pr_out(1, 3), &p), Ok(Action::Good));
    // B: reads and writes conflict; INQUIRY, TEST UNIT READY and PR IN do not.
    assert_eq!(run(&b, &read).0, Err(Sense::RESERVATION_CONFLICT));
    assert_eq!(run(&b, &write).0, Err(Sense::RESERVATION_CONFLICT));
    assert_eq!(Sense::RESERVATION_CONFLICT.status(), 0x18);
    assert!(matches!(
        run(&b, &[0x12, 0, 0, 0, 36, 0]).0,
        Ok(Action::DataIn(_))
    ));
    assert_eq!(run(&b, &[0, 0, 0, 0, 0, 0]).0, Ok(Action::Good));
    let (r, keys) = run(&b, &[0x5E, 0, 0, 0, 0, 0, 0, 0, 64, 0]);
    assert_eq!(r, Ok(Action::DataIn(16)));
    assert_eq!(&keys[8..16], &0xAu64.to_be_bytes());
    // A itself is unaffected; after RELEASE B writes again.
    assert!(matches!(run(&a, &write).0, Ok(Action::Io(_))));
    assert_eq!(a.exec_with_data(&pr_out(2, 3), &p), Ok(Action::Good));
    assert!(matches!(run(&b, &write).0, Ok(Action::Io(_))));
    // PR OUT: bad length, unsupported service action (PREEMPT AND ABORT).
    assert_eq!(
        code(run(&a, &[0x5F, 0, 0, 0, 0, 0, 0, 0, 20, 0]).0),
        (5, 0x1A, 0)
    );
    assert_eq!(code(run(&a, &pr_out(5, 3)).0), (5, 0x24, 0));
    // RESERVE(6) by A: B's TEST UNIT READY conflicts, its INQUIRY not;
    // A persistent registration exists, so first CLEAR it.
    assert_eq!(a.exec_with_data(&pr_out(3, 0), &p), Ok(Action::Good));
    assert_eq!(run(&a, &[0x16, 0, 0, 0, 0, 0]).0, Ok(Action::Good));
    assert_eq!(
        run(&b, &[0, 0, 0, 0, 0, 0]).0,
        Err(Sense::RESERVATION_CONFLICT)
    );
    assert_eq!(
        run(&b, &[0x16, 0, 0, 0, 0, 0]).0,
        Err(Sense::RESERVATION_CONFLICT)
    );
    assert!(matches!(
        run(&b, &[0x12, 0, 0, 0, 36, 0]).0,
        Ok(Action::DataIn(_))
    ));
    assert_eq!(run(&b, &[0x17, 0, 0, 0, 0, 0]).0, Ok(Action::Good));
    assert_eq!(
        run(&b, &[0, 0, 0, 0, 0, 0]).0,
        Err(Sense::RESERVATION_CONFLICT)
    );
    // A's session ends: its RESERVE(6) goes.
    a.end_nexus();
    assert_eq!(run(&b, &[0, 0, 0, 0, 0, 0]).0, Ok(Action::Good));
}

/// A session of a nexus that ends after a later session of the same nexus
/// took RESERVE(6) (a reinstatement, or a logged-out connection still
/// waiting for its initiator to disconnect) leaves that reservation alone.
#[test]
fn an_earlier_session_of_the_nexus_ending_keeps_a_later_ones_reserve6() {
    let info = disk(PiType::None, true, true).info;
    let lu = Arc::new(LunShared::default());
    let old = Disk::shared(info.clone(), lu.clone(), nx(1));
    let new = Disk::shared(info.clone(), lu.clone(), nx(1));
    let other = Disk::shared(info, lu, nx(2));
    let (tur, reserve) = ([0u8, 0, 0, 0, 0, 0], [0x16u8, 0, 0, 0, 0, 0]);
    assert_eq!(run(&old, &reserve).0, Ok(Action::Good));
    assert_eq!(run(&new, &reserve).0, Ok(Action::Good));
    old.end_nexus();
    assert_eq!(run(&other, &tur).0, Err(Sense::RESERVATION_CONFLICT));
    assert_eq!(run(&new, &tur).0, Ok(Action::Good));
    new.end_nexus();
    assert_eq!(run(&other, &tur).0, Ok(Action::Good));
}

/// A transfer longer than MAXIMUM TRANSFER LENGTH gets INVALID FIELD IN
/// CDB whose field pointer names the CDB's own length field: byte 4 of a
/// 6-byte CDB, 7 of a 10-byte, 6 of a 12-byte, 10 of a 16-byte and 28 of
/// READ(32), not byte 7 whatever the form.
#[test]
fn too_long_transfers_point_at_their_length_field() {
    let d = disk(PiType::None, true, true);
    let field = |r: Result<Action, Sense>| {
        let s = r.expect_err("sense");
        assert_eq!(s.code(), (5, 0x24, 0));
        s.field
    };
    let at = |byte: u16| Some((true, byte, None));
    assert_eq!(field(run(&d, &[0x28, 0, 0, 0, 0, 0, 0, 2, 1, 0]).0), at(7));
    let mut r12 = [0u8; 12];
    r12[0] = 0xA8;
    r12[6..10].copy_from_slice(&257u32.to_be_bytes());
    assert_eq!(field(run(&d, &r12).0), at(6));
    let mut r16 = [0u8; 16];
    r16[0] = 0x88;
    r16[10..14].copy_from_slice(&257u32.to_be_bytes());
    assert_eq!(field(run(&d, &r16).0), at(10));
    // VERIFY(16) BYTCHK 1 and 0, WRITE AND VERIFY(16) BYTCHK 0.
    let mut v16 = r16;
    v16[0] = 0x8F;
    v16[1] = 0x02;
    v16[10..14].copy_from_slice(&100_000u32.to_be_bytes());
    assert_eq!(field(run(&d, &v16).0), at(10));
    v16[1] = 0;
    assert_eq!(field(run(&d, &v16).0), at(10));
    v16[0] = 0x8E;
    assert_eq!(field(run(&d, &v16).0), at(10));
    // READ(6) of 0 (256 blocks) on 4 KiB blocks: 32 blocks at most.
    let info = BdevInfo::new("d4k", "Malloc disk", 4096, 1 << 18).unwrap();
    let d4 = Disk::new(DiskInfo::from_bdev(&info, true, true, 128 * 1024));
    assert_eq!(field(run(&d4, &[0x08, 0, 0, 0, 0, 0]).0), at(4));
    // READ(32) on a Type 2 LU.
    let d2 = disk(PiType::Type2, false, true);
    let tags = crate::scsi::PiTags {
        ref_tag: 0,
        app_tag: 0,
        app_mask: 0,
    };
    let r32 = crate::scsi::cdb::rw32_cdb(false, 0, 257, 1, tags);
    assert_eq!(field(run(&d2, &r32).0), at(28));
    // COMPARE AND WRITE: NUMBER OF LOGICAL BLOCKS at byte 13.
    let mut caw = [0u8; 16];
    caw[0] = 0x89;
    caw[13] = 2;
    assert_eq!(field(run(&d, &caw).0), at(13));
}

/// READ KEYS lists every registration that the allocation length has
/// room for: more than 63 keys do not fit in 512 bytes, and are not cut
/// there.
#[test]
fn read_keys_is_not_cut_at_512_bytes() {
    let info = disk(PiType::None, true, true).info;
    let lu = Arc::new(LunShared::default());
    let mut p = [0u8; 24];
    for i in 0..100u8 {
        let d = Disk::shared(info.clone(), lu.clone(), nx(i));
        p[8..16].copy_from_slice(&(0x100 + u64::from(i)).to_be_bytes());
        let reg = [0x5F, 0, 0, 0, 0, 0, 0, 0, 24, 0];
        assert_eq!(d.exec_with_data(&reg, &p), Ok(Action::Good));
    }
    let d = Disk::shared(info, lu, nx(200));
    let mut out = vec![0u8; 4096];
    let r = d.exec(&[0x5E, 0, 0, 0, 0, 0, 0, 0x04, 0, 0], &mut out);
    assert_eq!(r, Ok(Action::DataIn(8 + 800)));
    assert_eq!(&out[4..8], &800u32.to_be_bytes());
    assert_eq!(&out[8 + 99 * 8..8 + 100 * 8], &0x163u64.to_be_bytes());
    // Still cut to the allocation length.
    let r = d.exec(&[0x5E, 0, 0, 0, 0, 0, 0, 0x02, 0, 0], &mut out);
    assert_eq!(r, Ok(Action::DataIn(512)));
}

/// FUA on a write (and WRITE AND VERIFY with BYTCHK 0) plans the flush
/// that puts the blocks on the medium before GOOD; reads and plain writes
/// do not flush.
#[test]
fn fua_writes_are_planned_with_fua() {
    let d = disk(PiType::None, true, true);
    let fua = |cdb: &[u8]| match d.exec(cdb, &mut [0u8; 512]) {
        Ok(Action::Io(io)) => io.fua,
        other => panic!("{other:?}"),
    };
    assert!(fua(&[0x2A, 0x08, 0, 0, 0, 1, 0, 0, 1, 0]), "WRITE(10) FUA");
    assert!(!fua(&[0x2A, 0, 0, 0, 0, 1, 0, 0, 1, 0]), "WRITE(10)");
    assert!(!fua(&[0x28, 0x08, 0, 0, 0, 1, 0, 0, 1, 0]), "READ(10) FUA");
    assert!(fua(&[0x2E, 0, 0, 0, 0, 1, 0, 0, 1, 0]), "WRITE AND VERIFY");
    let mut w16 = [0u8; 16];
    w16[0] = 0x8A;
    w16[1] = 0x08;
    w16[13] = 1;
    assert!(fua(&w16), "WRITE(16) FUA");
}

/// The holder of a RESERVE(6) reservation gets RESERVATION CONFLICT for
/// PERSISTENT RESERVE IN and OUT too (SPC-3), not only the other nexuses.
#[test]
fn persistent_reserve_in_and_out_conflict_for_the_reserve6_holder() {
    let d = disk(PiType::None, true, true);
    assert_eq!(run(&d, &[0x16, 0, 0, 0, 0, 0]).0, Ok(Action::Good));
    let pr_in = [0x5E, 0, 0, 0, 0, 0, 0, 0, 64, 0];
    assert_eq!(run(&d, &pr_in).0, Err(Sense::RESERVATION_CONFLICT));
    let reg = [0x5F, 0, 0, 0, 0, 0, 0, 0, 24, 0];
    let mut p = [0u8; 24];
    p[8..16].copy_from_slice(&0xAu64.to_be_bytes());
    assert_eq!(d.exec_with_data(&reg, &p), Err(Sense::RESERVATION_CONFLICT));
    assert_eq!(run(&d, &[0x17, 0, 0, 0, 0, 0]).0, Ok(Action::Good));
    assert_eq!(d.exec_with_data(&reg, &p), Ok(Action::Good));
    assert_eq!(run(&d, &pr_in).0, Ok(Action::DataIn(16)));
}

/// SBC-3 (commands allowed in the presence of reservations): START STOP
/// UNIT with START 1 and POWER CONDITION 0h is allowed under a persistent
/// reservation another nexus holds; a stop or a power condition change
/// conflicts.
#[test]
fn a_plain_start_is_allowed_under_another_nexus_reservation() {
    let info = disk(PiType::None, true, true).info;
    let lu = Arc::new(LunShared::default());
    let a = Disk::shared(info.clone(), lu.clone(), nx(1));
    let b = Disk::shared(info, lu, nx(2));
    let pr_out = |sa: u8, ty: u8| [0x5F, sa, ty, 0, 0, 0, 0, 0, 24, 0];
    let mut p = [0u8; 24];
    p[8..16].copy_from_slice(&0xAu64.to_be_bytes());
    assert_eq!(a.exec_with_data(&pr_out(0, 0), &p), Ok(Action::Good));
    let mut p = [0u8; 24];
    p[..8].copy_from_slice(&0xAu64.to_be_bytes());
    for ty in [1u8, 3] {
        assert_eq!(a.exec_with_data(&pr_out(1, ty), &p), Ok(Action::Good));
        assert_eq!(run(&b, &[0x1B, 0, 0, 0, 0x01, 0]).0, Ok(Action::Good));
        for stop in [[0x1B, 0, 0, 0, 0x00, 0], [0x1B, 0, 0, 0, 0x11, 0]] {
            assert_eq!(run(&b, &stop).0, Err(Sense::RESERVATION_CONFLICT));
        }
        assert_eq!(a.exec_with_data(&pr_out(2, ty), &p), Ok(Action::Good));
    }
}

/// VPD B2 advertises unmapping by WRITE SAME(10) (LBPWS10) as it does by
/// UNMAP and WRITE SAME(16): WRITE SAME(10) with UNMAP and a zero block
/// unmaps.
#[test]
fn write_same_10_unmap_is_advertised() {
    let d = disk(PiType::None, true, true);
    let (_, b) = run(&d, &[0x12, 1, 0xB2, 0, 255, 0]);
    assert_eq!(b[5] & 0xE0, 0x80 | 0x40 | 0x20, "LBPU, LBPWS, LBPWS10");
    let ws10 = [0x41, 0x08, 0, 0, 0, 8, 0, 0, 4, 0];
    assert_eq!(run(&d, &ws10).0, Ok(Action::NeedData(512)));
    assert!(matches!(
        d.exec_with_data(&ws10, &[0u8; 512]),
        Ok(Action::Io(BlockIo {
            op: BlockOp::Unmap,
            lba: 8,
            blocks: 4,
            ..
        }))
    ));
}

/// An UNMAP descriptor of 0 blocks unmaps nothing, but an LBA past the
/// capacity in it is still LBA OUT OF RANGE (SBC-3: LBA plus the number
/// of blocks exceeds the capacity), as LIO answers.
#[test]
fn unmap_of_zero_blocks_still_checks_its_lba() {
    let d = disk(PiType::None, true, true);
    let unmap = [0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0];
    let mut pl = [0u8; 24];
    pl[1] = 22;
    pl[3] = 16;
    pl[8..16].copy_from_slice(&(1u64 << 20).to_be_bytes());
    assert_eq!(
        d.exec_with_data(&unmap, &pl),
        Ok(Action::Good),
        "at the end"
    );
    pl[8..16].copy_from_slice(&((1u64 << 20) + 1).to_be_bytes());
    let e = d.exec_with_data(&unmap, &pl).unwrap_err();
    assert_eq!((e.code(), e.info), ((5, 0x21, 0), Some((1 << 20) + 1)));
    pl[8..16].copy_from_slice(&5u64.to_be_bytes());
    assert_eq!(d.exec_with_data(&unmap, &pl), Ok(Action::Good));
}

/// An unsupported RDPROTECT/WRPROTECT is pointed at where the CDB holds
/// it: byte 1 bit 7 of READ(10), byte 10 bit 7 of READ(32)/WRITE(32).
#[test]
fn a_bad_protect_field_is_pointed_at_in_its_own_byte() {
    let d2 = disk(PiType::Type2, false, true);
    let tags = crate::scsi::PiTags {
        ref_tag: 0,
        app_tag: 0,
        app_mask: 0,
    };
    for write in [false, true] {
        let c = crate::scsi::cdb::rw32_cdb(write, 0, 1, 6, tags);
        let s = d2.exec(&c, &mut [0u8; 512]).unwrap_err();
        assert_eq!(
            (s.code(), s.field),
            ((5, 0x24, 0), Some((true, 10, Some(7))))
        );
    }
    let d1 = disk(PiType::Type1, false, true);
    let s = d1
        .exec(&[0x28, 0xC0, 0, 0, 0, 0, 0, 0, 1, 0], &mut [0u8; 512])
        .unwrap_err();
    assert_eq!(s.field, Some((true, 1, Some(7))));
}
