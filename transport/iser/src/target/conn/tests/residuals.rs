//! Residuals in the SCSI Response: data-in that EDTL has no room for is
//! a residual overflow (RFC 7143 §11.4.5.1, O bit, the bytes not
//! transferred), data-in short of EDTL an underflow.

use super::*;
use crate::pdu::scsi::{RSP_OVERFLOW, RSP_UNDERFLOW};

#[test]
fn data_in_beyond_edtl_is_a_residual_overflow() {
    let mut fx = fixture(true);
    on_lun(0);
    fx.login(INI, "Normal");
    // INQUIRY of 96 bytes into an EDTL of 36.
    let (rsp, s, d) = fx.cmd(&[0x12, 0, 0, 0, 96, 0], 36, None, 0);
    assert_eq!((rsp.status, s, d.len()), (0, None, 36));
    assert_eq!((rsp.flags, rsp.residual), (RSP_OVERFLOW, 60));
    assert_eq!(&d[8..14], b"POLLUX");
    // READ(10) of two blocks into an EDTL of one: the first one goes.
    let data = pattern(4, 1024);
    assert_eq!(
        fx.cmd(&rw10(0x2A, 0, 3, 2), 1024, Some(&data), 0).0.status,
        0
    );
    let (rsp, s, d) = fx.cmd(&rw10(0x28, 0, 3, 2), 512, None, 0);
    assert_eq!((rsp.status, s), (0, None));
    assert_eq!((rsp.flags, rsp.residual), (RSP_OVERFLOW, 512));
    assert_eq!(d, &data[..512]);
    // Exactly EDTL: no residual; less: an underflow.
    let (rsp, _, _) = fx.cmd(&[0x12, 0, 0, 0, 36, 0], 36, None, 0);
    assert_eq!((rsp.flags, rsp.residual), (0, 0));
    let (rsp, _, _) = fx.cmd(&[0x12, 0, 0, 0, 36, 0], 64, None, 0);
    assert_eq!((rsp.flags, rsp.residual), (RSP_UNDERFLOW, 28));
}

/// The overflow survives a Data-In whose RDMA WRITE completes later.
#[test]
fn a_deferred_data_in_keeps_its_overflow() {
    let mut fx = fixture(true);
    on_lun(0);
    fx.login(INI, "Normal");
    fx.ops.defer_writes = true;
    let mut c = [0u8; 16];
    c[..6].copy_from_slice(&[0x12, 0, 0, 0, 96, 0]);
    let cmd = ScsiCommand {
        immediate: false,
        final_: true,
        read: true,
        write: false,
        attr: TaskAttr::Simple,
        lun: Lun::from_index(0),
        itt: 7,
        edtl: 36,
        cmd_sn: fx.cmd_sn,
        exp_stat_sn: 0,
        cdb: c,
    };
    let hdr = IserHeader::Control {
        write: None,
        read: Some(Stag { stag: 1, va: 0 }),
    };
    assert!(fx.pdu(hdr, &Bhs::ScsiCmd(cmd).encode(0, 0)));
    assert_eq!(fx.ops.deferred.len(), 1);
    assert_eq!(fx.ops.mem[&1].len(), 36, "no more than EDTL written");
    let task = fx.ops.deferred[0];
    fx.conn.data_done(task, true, &mut fx.ops);
    let Bhs::ScsiRsp(r) = fx.last().bhs else {
        panic!("no response");
    };
    assert_eq!((r.itt, r.status), (7, 0));
    assert_eq!((r.flags, r.residual), (RSP_OVERFLOW, 60));
}
