//! FUA writes: the written range is flushed on the bdev before the SCSI
//! Response (the target advertises a write-back cache, WCE=1, and
//! DPOFUA=1, so initiators rely on FUA for durability).

use super::*;

#[test]
fn a_fua_write_is_flushed_before_good() {
    let mut fx = fixture(true);
    on_lun(0);
    fx.login(INI, "Normal");
    let flushes = |fx: &Fx| fx.conn.luns[0].ch.stats().flush_ops;
    let data = pattern(5, 1024);
    let mut w = rw10(0x2A, 0, 20, 2);
    let (rsp, s, _) = fx.cmd(&w, 1024, Some(&data), 0);
    assert_eq!((rsp.status, s, flushes(&fx)), (0, None, 0), "no FUA");
    w[1] = 0x08;
    let (rsp, s, _) = fx.cmd(&w, 1024, Some(&data), 0);
    assert_eq!((rsp.status, s, flushes(&fx)), (0, None, 1), "FUA");
    assert_eq!(fx.cmd(&rw10(0x28, 0, 20, 2), 1024, None, 0).2, data);
    // WRITE AND VERIFY with BYTCHK 0 verifies by writing through.
    let (rsp, _, _) = fx.cmd(&rw10(0x2E, 0, 20, 2), 1024, Some(&data), 0);
    assert_eq!((rsp.status, flushes(&fx)), (0, 2));
    // A READ with FUA does not flush.
    let mut r = rw10(0x28, 0, 20, 2);
    r[1] = 0x08;
    assert_eq!(fx.cmd(&r, 1024, None, 0).0.status, 0);
    assert_eq!(flushes(&fx), 2);
}

/// COMPARE AND WRITE with FUA: after an equal compare, the written block
/// is flushed before GOOD; a miscompare writes nothing and flushes
/// nothing. Both LUNs (plain and PI).
#[test]
fn a_fua_compare_and_write_is_flushed_before_good() {
    for lun in [0u8, 1] {
        let mut fx = fixture(true);
        on_lun(lun);
        fx.login(INI, "Normal");
        let flushes = |fx: &Fx| fx.conn.luns[usize::from(lun)].ch.stats().flush_ops;
        let (old, new) = (pattern(1, 512), pattern(2, 512));
        fx.cmd(&rw10(0x2A, 0, 33, 1), 512, Some(&old), 512);
        let mut caw = [0u8; 16];
        caw[0] = 0x89;
        caw[9] = 33;
        caw[13] = 1;
        let buf = [old.clone(), new.clone()].concat();
        assert_eq!(fx.cmd(&caw, 1024, Some(&buf), 1024).0.status, 0);
        assert_eq!(flushes(&fx), 0, "no FUA");
        caw[1] = 0x08;
        let buf = [new.clone(), old.clone()].concat();
        let (rsp, s, _) = fx.cmd(&caw, 1024, Some(&buf), 1024);
        assert_eq!((rsp.status, s, flushes(&fx)), (0, None, 1), "LUN {lun}");
        assert_eq!(fx.cmd(&rw10(0x28, 0, 33, 1), 512, None, 0).2, old);
        let (rsp, _, _) = fx.cmd(&caw, 1024, Some(&buf), 1024);
        assert_eq!((rsp.status, flushes(&fx)), (sense::CHECK_CONDITION, 1));
    }
}
