//! PERSISTENT RESERVE IN through the connection: its answer is cut to the
//! allocation length only, not to a fixed 512 bytes.

use super::*;
use crate::scsi::reservation::out_sa;

#[test]
fn read_keys_of_many_registrations_comes_back_whole() {
    let mut fx = fixture(true);
    on_lun(0);
    fx.login(INI, "Normal");
    // 100 other I_T nexuses registered on the LU.
    let lu = fx.conn.luns[0].disk.lun().clone();
    for i in 0..100u8 {
        let n = ItNexus {
            initiator: format!("iqn.2024-01.io.pollux:other{i}"),
            isid: [0x80, 0, 0, 0, 0, i],
            tpgt: 1,
        };
        let mut p = [0u8; 24];
        p[8..16].copy_from_slice(&(0x100 + u64::from(i)).to_be_bytes());
        assert_eq!(lu.change(|r| r.out(&n, out_sa::REGISTER, 0, &p)), Ok(()));
    }
    let (rsp, s, d) = fx.cmd(&[0x5E, 0, 0, 0, 0, 0, 0, 0x04, 0, 0], 1024, None, 0);
    assert_eq!((rsp.status, s), (0, None));
    assert_eq!(&d[4..8], &800u32.to_be_bytes());
    assert_eq!(
        (rsp.flags, rsp.residual),
        (crate::pdu::scsi::RSP_UNDERFLOW, 1024 - 808)
    );
    assert_eq!(&d[8 + 99 * 8..808], &0x163u64.to_be_bytes());
}
