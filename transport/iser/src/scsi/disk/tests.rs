//! Every command and sense code of the disk.

use super::*;
use pollux_bdev::BdevInfo;

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
    assert_eq!(
        d.exec_with_data(&ws, &[1u8; 512]).unwrap_err().code(),
        (5, 0x26, 0)
    );
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
