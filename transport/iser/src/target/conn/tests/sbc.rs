//! The SBC commands that take several bdev operations, end to end on
//! malloc bdevs (plain and T10-PI): WRITE SAME with a pattern, COMPARE AND
//! WRITE (match and miscompare), VERIFY and WRITE AND VERIFY with BYTCHK,
//! the 6- and 12-byte READ/WRITE forms, and reservations between two
//! sessions of the same LU (RESERVATION CONFLICT status).

use super::*;

use crate::scsi::cdb::build::write_same16 as ws16;

fn caw(lba: u64, blocks: u8) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x89;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[13] = blocks;
    c
}

impl Fx {
    /// Read `blocks` blocks at `lba` in 64 KiB commands.
    fn read_blocks(&mut self, lba: u32, blocks: u32) -> Vec<u8> {
        let mut out = Vec::new();
        let mut done = 0;
        while done < blocks {
            let k = (blocks - done).min(128);
            let (rsp, s, d) = self.cmd(&rw10(0x28, 0, lba + done, k as u16), k * 512, None, 0);
            assert_eq!((rsp.status, s), (0, None));
            out.extend_from_slice(&d);
            done += k;
        }
        out
    }
}

#[test]
fn write_same_writes_the_pattern_to_every_block() {
    for lun in [0u8, 1] {
        let mut fx = fixture(true);
        on_lun(lun);
        fx.login(INI, "Normal");
        let pat = pattern(7, 512);
        // 300 blocks: three chunks of the task buffer.
        let (rsp, s, _) = fx.cmd(&ws16(0, 100, 300), 512, Some(&pat), 512);
        assert_eq!((rsp.status, s), (0, None), "LUN {lun}");
        let d = fx.read_blocks(99, 302);
        assert!(d[..512].iter().all(|&b| b == 0), "block before untouched");
        assert!(
            d[301 * 512..].iter().all(|&b| b == 0),
            "block after untouched"
        );
        for blk in d[512..301 * 512].chunks(512) {
            assert_eq!(blk, &pat[..], "LUN {lun}");
        }
        // LBDATA: each block starts with its LBA.
        let (rsp, _, _) = fx.cmd(&ws16(0x02, 500, 3), 512, Some(&pat), 512);
        assert_eq!(rsp.status, 0);
        let d = fx.read_blocks(500, 3);
        for (i, blk) in d.chunks(512).enumerate() {
            assert_eq!(&blk[..4], &(500 + i as u32).to_be_bytes());
            assert_eq!(&blk[4..], &pat[4..]);
        }
        // 0 blocks: to the end of the medium (8192 blocks of 512 B).
        let (rsp, _, _) = fx.cmd(&ws16(0, 8190, 0), 512, Some(&pat), 0);
        assert_eq!(rsp.status, 0);
        assert_eq!(fx.read_blocks(8190, 2), [pat.clone(), pat.clone()].concat());
        let (rsp, s, _) = fx.cmd(&ws16(0, 8192, 0), 512, Some(&pat), 0);
        assert_eq!(rsp.status, sense::CHECK_CONDITION);
        assert_eq!(s.map(|s| s.code()), Some((5, 0x21, 0)));
        // ANCHOR: not advertised.
        let (_, s, _) = fx.cmd(&ws16(0x10, 0, 1), 512, Some(&pat), 512);
        assert_eq!(s.map(|s| s.code()), Some((5, 0x24, 0)));
        // WRITE SAME(10).
        let mut ws10 = [0x41, 0, 0, 0, 0x10, 0, 0, 0, 2, 0];
        ws10[1] = 0;
        let p2 = pattern(11, 512);
        assert_eq!(fx.cmd(&ws10, 512, Some(&p2), 512).0.status, 0);
        assert_eq!(fx.read_blocks(4096, 2), [p2.clone(), p2].concat());
    }
}

#[test]
fn compare_and_write_matches_or_miscompares() {
    for lun in [0u8, 1] {
        let mut fx = fixture(true);
        on_lun(lun);
        fx.login(INI, "Normal");
        let old = pattern(1, 512);
        let new = pattern(2, 512);
        fx.cmd(&rw10(0x2A, 0, 33, 1), 512, Some(&old), 512);
        // Match: the new block is written.
        let buf = [old.clone(), new.clone()].concat();
        let (rsp, s, _) = fx.cmd(&caw(33, 1), 1024, Some(&buf), 1024);
        assert_eq!((rsp.status, s), (0, None), "LUN {lun}");
        assert_eq!(fx.read_blocks(33, 1), new);
        // Miscompare at byte 77: 0E/1D/00, INFORMATION 77, medium unchanged.
        let mut wrong = new.clone();
        wrong[77] ^= 0xFF;
        let buf = [wrong, old.clone()].concat();
        let (rsp, s, _) = fx.cmd(&caw(33, 1), 1024, Some(&buf), 512);
        assert_eq!(rsp.status, sense::CHECK_CONDITION);
        let s = s.expect("sense");
        assert_eq!((s.code(), s.info), ((0x0E, 0x1D, 0), Some(77)));
        assert_eq!(fx.read_blocks(33, 1), new);
        // The LU's gate is free again: another COMPARE AND WRITE runs.
        let buf = [new.clone(), old.clone()].concat();
        assert_eq!(fx.cmd(&caw(33, 1), 1024, Some(&buf), 0).0.status, 0);
        assert_eq!(fx.read_blocks(33, 1), old);
        // Two blocks are more than MAXIMUM COMPARE AND WRITE LENGTH.
        let (_, s, _) = fx.cmd(&caw(33, 2), 2048, Some(&[0; 2048]), 0);
        assert_eq!(s.map(|s| s.code()), Some((5, 0x24, 0)));
    }
}

#[test]
fn compare_and_write_waits_for_the_gate() {
    let mut fx = fixture(true);
    on_lun(0);
    fx.login(INI, "Normal");
    let lu = fx.conn.luns[0].disk.lun().clone();
    // Another session's COMPARE AND WRITE holds the gate.
    assert!(lu.try_caw());
    fx.itt += 1;
    let blk = pattern(4, 512);
    fx.ops.mem.insert(2, [vec![0; 512], blk.clone()].concat());
    let cmd = ScsiCommand {
        immediate: false,
        final_: true,
        read: false,
        write: true,
        attr: TaskAttr::Simple,
        lun: Lun::from_index(0),
        itt: fx.itt,
        edtl: 1024,
        cmd_sn: fx.cmd_sn,
        exp_stat_sn: 0,
        cdb: caw(9, 1),
    };
    fx.cmd_sn += 1;
    let v = Bhs::ScsiCmd(cmd).encode(0, 0).to_vec();
    let hdr = IserHeader::Control {
        write: Some(Stag { stag: 2, va: 0 }),
        read: None,
    };
    fx.pdu(hdr, &v);
    for _ in 0..50 {
        fx.cl.poll_once_all();
        fx.conn.poll(&mut fx.ops);
    }
    assert!(
        responses(&fx.ops).iter().all(|(itt, _)| *itt != fx.itt),
        "waits"
    );
    lu.end_caw();
    for _ in 0..200 {
        fx.cl.poll_once_all();
        fx.conn.poll(&mut fx.ops);
    }
    assert!(responses(&fx.ops).contains(&(fx.itt, 0)));
    assert_eq!(fx.read_blocks(9, 1), blk);
    // Answered: the gate is free.
    assert!(lu.try_caw());
}

#[test]
fn verify_and_write_and_verify() {
    for lun in [0u8, 1] {
        let mut fx = fixture(true);
        on_lun(lun);
        fx.login(INI, "Normal");
        let data = pattern(5, 4096);
        // WRITE AND VERIFY(10) BYTCHK 1: written, read back, compared.
        let mut wv = rw10(0x2E, 0, 64, 8);
        wv[1] = 0x02;
        let (rsp, s, _) = fx.cmd(&wv, 4096, Some(&data), 1024);
        assert_eq!((rsp.status, s), (0, None), "LUN {lun}");
        assert_eq!(fx.read_blocks(64, 8), data);
        // VERIFY(10) BYTCHK 1: equal, then a miscompare in block 3.
        let mut v = rw10(0x2F, 0, 64, 8);
        v[1] = 0x02;
        assert_eq!(fx.cmd(&v, 4096, Some(&data), 0).0.status, 0);
        let mut bad = data.clone();
        bad[3 * 512 + 9] ^= 1;
        let (rsp, s, _) = fx.cmd(&v, 4096, Some(&bad), 0);
        assert_eq!(rsp.status, sense::CHECK_CONDITION);
        let s = s.expect("sense");
        assert_eq!((s.code(), s.info), ((0x0E, 0x1D, 0), Some(3 * 512 + 9)));
        // VERIFY(16) BYTCHK 0: the medium is read and checked, no data.
        let mut v16 = [0u8; 16];
        v16[0] = 0x8F;
        v16[9] = 64;
        v16[13] = 8;
        let (rsp, s, _) = fx.cmd(&v16, 0, None, 0);
        assert_eq!((rsp.status, s), (0, None));
        // WRITE AND VERIFY(16) BYTCHK 0 is a write.
        let mut wv16 = [0u8; 16];
        wv16[0] = 0x8E;
        wv16[9] = 80;
        wv16[13] = 8;
        assert_eq!(fx.cmd(&wv16, 4096, Some(&data), 4096).0.status, 0);
        assert_eq!(fx.read_blocks(80, 8), data);
    }
}

#[test]
fn six_and_twelve_byte_reads_and_writes() {
    let mut fx = fixture(true);
    on_lun(0);
    fx.login(INI, "Normal");
    let data = pattern(8, 2048);
    let w12 = [0xAA, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 4, 0, 0];
    assert_eq!(fx.cmd(&w12, 2048, Some(&data), 512).0.status, 0);
    let r12 = [0xA8, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 4, 0, 0];
    assert_eq!(fx.cmd(&r12, 2048, None, 0).2, data);
    let r6 = [0x08, 0, 0x01, 0x02, 4, 0];
    assert_eq!(fx.cmd(&r6, 2048, None, 0).2, data);
    let w6 = [0x0A, 0, 0, 9, 1, 0];
    assert_eq!(fx.cmd(&w6, 512, Some(&data[..512]), 512).0.status, 0);
    assert_eq!(fx.read_blocks(9, 1), &data[..512]);
}

#[test]
fn reservations_between_two_sessions() {
    let mut fx = fixture(true);
    on_lun(0);
    fx.login(INI, "Normal");
    // Session B: another ISID of the same initiator.
    let mut b = fx.cl.on(0, |r| {
        Connection::new(
            &fx.target,
            r,
            ConnParams {
                portal_tag: 1,
                send_with_inv: true,
                nop: NopPing::default(),
            },
        )
    });
    let mut ops_b = Fake::default();
    let lb = login_req_as(&login_text(INI, "Normal"), [0x80, 0, 0, 0, 0, 9], 0);
    b.on_pdu(&IserHeader::PLAIN, &lb, &mut ops_b);
    assert!(b.is_full_feature());
    // Each session has its own CmdSN window.
    let mut sn_b = fx.cmd_sn;
    let swap = |fx: &mut Fx, b: &mut Connection, ops_b: &mut Fake, sn_b: &mut u32| {
        std::mem::swap(&mut fx.conn, b);
        std::mem::swap(&mut fx.ops, ops_b);
        std::mem::swap(&mut fx.cmd_sn, sn_b);
    };
    let pr_out = |sa: u8, ty: u8| [0x5F, sa, ty, 0, 0, 0, 0, 0, 24, 0];
    let param = |key: u64, sa_key: u64| {
        let mut p = vec![0u8; 24];
        p[..8].copy_from_slice(&key.to_be_bytes());
        p[8..16].copy_from_slice(&sa_key.to_be_bytes());
        p
    };
    // A registers and takes a Write Exclusive reservation.
    assert_eq!(
        fx.cmd(&pr_out(0, 0), 24, Some(&param(0, 0xA)), 24).0.status,
        0
    );
    assert_eq!(
        fx.cmd(&pr_out(1, 1), 24, Some(&param(0xA, 0)), 0).0.status,
        0
    );
    let data = pattern(6, 512);
    // B: reads are allowed, writes get RESERVATION CONFLICT (no sense).
    swap(&mut fx, &mut b, &mut ops_b, &mut sn_b);
    let (rsp, s, _) = fx.cmd(&rw10(0x2A, 0, 3, 1), 512, Some(&data), 512);
    assert_eq!((rsp.status, s), (sense::RESERVATION_CONFLICT, None));
    assert_eq!(fx.cmd(&rw10(0x28, 0, 3, 1), 512, None, 0).0.status, 0);
    // B reads the reservation: A's key, type 1.
    let (rsp, _, d) = fx.cmd(&[0x5E, 1, 0, 0, 0, 0, 0, 0, 24, 0], 24, None, 0);
    assert_eq!(rsp.status, 0);
    assert_eq!((&d[8..16], d[21]), (&0xAu64.to_be_bytes()[..], 1));
    // B registers and preempts A with Exclusive Access.
    assert_eq!(
        fx.cmd(&pr_out(0, 0), 24, Some(&param(0, 0xB)), 24).0.status,
        0
    );
    assert_eq!(
        fx.cmd(&pr_out(4, 3), 24, Some(&param(0xB, 0xA)), 24)
            .0
            .status,
        0
    );
    assert_eq!(
        fx.cmd(&rw10(0x2A, 0, 3, 1), 512, Some(&data), 512).0.status,
        0
    );
    // A, preempted: even reads conflict now.
    swap(&mut fx, &mut b, &mut ops_b, &mut sn_b);
    assert_eq!(
        fx.cmd(&rw10(0x28, 0, 3, 1), 512, None, 0).0.status,
        sense::RESERVATION_CONFLICT
    );
    // B releases; A reads again.
    swap(&mut fx, &mut b, &mut ops_b, &mut sn_b);
    assert_eq!(
        fx.cmd(&pr_out(2, 3), 24, Some(&param(0xB, 0)), 24).0.status,
        0
    );
    assert_eq!(
        fx.cmd(&pr_out(3, 0), 24, Some(&param(0xB, 0)), 24).0.status,
        0
    );
    swap(&mut fx, &mut b, &mut ops_b, &mut sn_b);
    assert_eq!(fx.cmd(&rw10(0x28, 0, 3, 1), 512, None, 0).2, data);
    // RESERVE(6) by A: B's write conflicts until A releases.
    assert_eq!(fx.cmd(&[0x16, 0, 0, 0, 0, 0], 0, None, 0).0.status, 0);
    swap(&mut fx, &mut b, &mut ops_b, &mut sn_b);
    assert_eq!(
        fx.cmd(&rw10(0x2A, 0, 3, 1), 512, Some(&data), 512).0.status,
        sense::RESERVATION_CONFLICT
    );
    swap(&mut fx, &mut b, &mut ops_b, &mut sn_b);
    assert_eq!(fx.cmd(&[0x17, 0, 0, 0, 0, 0], 0, None, 0).0.status, 0);
    swap(&mut fx, &mut b, &mut ops_b, &mut sn_b);
    assert_eq!(
        fx.cmd(&rw10(0x2A, 0, 3, 1), 512, Some(&data), 512).0.status,
        0
    );
    // A RESERVE(6) ends with its session: B reserves and goes; A writes.
    assert_eq!(fx.cmd(&[0x16, 0, 0, 0, 0, 0], 0, None, 0).0.status, 0);
    swap(&mut fx, &mut b, &mut ops_b, &mut sn_b);
    assert_eq!(
        fx.cmd(&rw10(0x2A, 0, 3, 1), 512, Some(&data), 512).0.status,
        sense::RESERVATION_CONFLICT
    );
    drop(b);
    assert_eq!(
        fx.cmd(&rw10(0x2A, 0, 3, 1), 512, Some(&data), 512).0.status,
        0
    );
}
