//! Commands to a LUN the session does not map (SAM-5 incorrect logical
//! unit selection): INQUIRY answers "not connected", REQUEST SENSE
//! answers GOOD with the sense data LOGICAL UNIT NOT SUPPORTED, any other
//! command CHECK CONDITION with it.

use super::*;

#[test]
fn request_sense_to_an_unmapped_lun_returns_lun_not_supported_with_good() {
    let mut fx = fixture(false);
    on_lun(9);
    fx.login(INI, "Normal");
    let (rsp, s, d) = fx.cmd(&[0x03, 0, 0, 0, 18, 0], 18, None, 0);
    assert_eq!((rsp.status, s), (0, None));
    assert_eq!(Sense::parse(&d).map(|p| p.code()), Some((5, 0x25, 0)));
    assert_eq!((d[0], d[7]), (0x70, 10));
    // Cut to the allocation length; a bad CDB is still refused.
    let (rsp, _, d) = fx.cmd(&[0x03, 0, 0, 0, 8, 0], 18, None, 0);
    assert_eq!(
        (rsp.status, rsp.residual, &d[..3]),
        (0, 10, &[0x70, 0, 5][..])
    );
    let (rsp, s, _) = fx.cmd(&[0x03, 1, 0, 0, 18, 0], 18, None, 0);
    assert_eq!(rsp.status, sense::CHECK_CONDITION);
    assert_eq!(s.map(|s| s.code()), Some((5, 0x24, 0)));
    // Other commands: CHECK CONDITION 25/00.
    let (rsp, s, _) = fx.cmd(&[0x00, 0, 0, 0, 0, 0], 0, None, 0);
    assert_eq!(rsp.status, sense::CHECK_CONDITION);
    assert_eq!(s.map(|s| s.code()), Some((5, 0x25, 0)));
}
