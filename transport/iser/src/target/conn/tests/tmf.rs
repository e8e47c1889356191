//! Task management functions and the LU state they reset: a LOGICAL UNIT
//! RESET or TARGET WARM RESET releases the RESERVE(6) reservation (as
//! LIO's LUN reset does), ABORT TASK SET does not.

use super::*;
use crate::scsi::reservation::Access;

impl Fx {
    fn tmf(&mut self, function: TmfFunction, lun: u16) -> u8 {
        self.itt += 1;
        let tmf = TmfRequest {
            immediate: true,
            function,
            lun: Lun::from_index(lun),
            itt: self.itt,
            ref_task_tag: RESERVED_TAG,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: 0,
            ref_cmd_sn: 0,
            exp_data_sn: 0,
        };
        self.pdu(IserHeader::PLAIN, &Bhs::TmfReq(tmf).encode(0, 0));
        let Bhs::TmfRsp(r) = self.last().bhs else {
            panic!("no TMF response");
        };
        r.response
    }

    /// What another initiator may do on LUN slot `l`.
    fn others_access(&self, l: usize) -> Access {
        let other = ItNexus {
            initiator: "iqn.2024-01.io.pollux:other".into(),
            isid: [0x80, 0, 0, 0, 0, 9],
            tpgt: 1,
        };
        self.conn.luns[l].disk.lun().lock().access(&other)
    }
}

#[test]
fn a_logical_unit_reset_releases_the_reserve6_reservation() {
    let mut fx = fixture(true);
    on_lun(0);
    fx.login(INI, "Normal");
    let reserve = [0x16, 0, 0, 0, 0, 0];
    assert_eq!(fx.cmd(&reserve, 0, None, 0).0.status, 0);
    on_lun(1);
    assert_eq!(fx.cmd(&reserve, 0, None, 0).0.status, 0);
    assert_eq!(fx.others_access(0), Access::Reserved6);
    // ABORT TASK SET leaves it; a reset of LUN 1 leaves LUN 0's.
    assert_eq!(fx.tmf(TmfFunction::AbortTaskSet, 0), tmf_response::COMPLETE);
    assert_eq!(fx.others_access(0), Access::Reserved6);
    assert_eq!(
        fx.tmf(TmfFunction::LogicalUnitReset, 1),
        tmf_response::COMPLETE
    );
    assert_eq!(fx.others_access(1), Access::All);
    assert_eq!(fx.others_access(0), Access::Reserved6);
    assert_eq!(
        fx.tmf(TmfFunction::LogicalUnitReset, 0),
        tmf_response::COMPLETE
    );
    assert_eq!(fx.others_access(0), Access::All);
    // TARGET WARM RESET: every LU.
    on_lun(0);
    assert_eq!(fx.cmd(&reserve, 0, None, 0).0.status, 0);
    on_lun(1);
    assert_eq!(fx.cmd(&reserve, 0, None, 0).0.status, 0);
    assert_eq!(
        fx.tmf(TmfFunction::TargetWarmReset, 0),
        tmf_response::COMPLETE
    );
    assert_eq!(
        (fx.others_access(0), fx.others_access(1)),
        (Access::All, Access::All)
    );
}
