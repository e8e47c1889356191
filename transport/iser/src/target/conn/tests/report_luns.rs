//! REPORT LUNS through the connection: the whole LUN inventory up to the
//! allocation length (a node may have up to 16384 LUNs), not the first
//! 256.

use super::*;

#[test]
fn report_luns_lists_more_than_256_luns() {
    let reg = BdevRegistry::new();
    let bdev = reg
        .create("malloc:size=1M,block=512,name=shared")
        .expect("bdev");
    let luns = (0..300u16).map(|l| (l, bdev.clone())).collect();
    let mut fx = fixture_node(false, small_target(), None, luns, bdev);
    on_lun(0);
    fx.login(INI, "Normal");
    let mut rl = [0u8; 12];
    rl[0] = 0xA0;
    rl[6..10].copy_from_slice(&4096u32.to_be_bytes());
    let (rsp, s, d) = fx.cmd(&rl, 4096, None, 0);
    assert_eq!((rsp.status, s), (0, None));
    assert_eq!(&d[..4], &(300u32 * 8).to_be_bytes());
    assert_eq!(
        (rsp.flags, rsp.residual),
        (crate::pdu::scsi::RSP_UNDERFLOW, 4096 - 8 - 2400)
    );
    let luns: Vec<u16> = d[8..8 + 2400]
        .chunks(8)
        .filter_map(|c| Lun(c.try_into().unwrap()).index())
        .collect();
    assert_eq!(luns, (0..300).collect::<Vec<u16>>());
}
