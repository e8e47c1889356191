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

/// ABORT TASK of a task the target never received (RFC 7143 §11.6.1 b):
/// RefCmdSN within the window and before the request's own CmdSN is
/// "Function complete" and the CmdSN counts as received, so that the
/// initiator's next command is not dropped as a gap; a RefCmdSN outside
/// the window (a task that already finished) is "Task does not exist"
/// (c), as LIO answers both.
#[test]
fn abort_task_of_a_command_never_received_completes_and_fills_the_gap() {
    let mut fx = fixture(true);
    on_lun(0);
    fx.login(INI, "Normal");
    let tur = [0u8; 6];
    assert_eq!(fx.cmd(&tur, 0, None, 0).0.exp_cmd_sn, 2);
    let abort = |fx: &mut Fx, ref_cmd_sn: u32, cmd_sn: u32| {
        fx.itt += 1;
        let tmf = TmfRequest {
            immediate: true,
            function: TmfFunction::AbortTask,
            lun: Lun::from_index(0),
            itt: fx.itt,
            ref_task_tag: 0x4242,
            cmd_sn,
            exp_stat_sn: 0,
            ref_cmd_sn,
            exp_data_sn: 0,
        };
        fx.pdu(IserHeader::PLAIN, &Bhs::TmfReq(tmf).encode(0, 0));
        let Bhs::TmfRsp(r) = fx.last().bhs else {
            panic!("no TMF response");
        };
        r
    };
    // CmdSN 1 was answered: outside the window.
    assert_eq!(abort(&mut fx, 1, 2).response, tmf_response::NO_TASK);
    // CmdSN 2 never arrived; the initiator went on to CmdSN 3.
    let r = abort(&mut fx, 2, 3);
    assert_eq!(r.response, tmf_response::COMPLETE);
    assert_eq!(r.exp_cmd_sn, 3);
    fx.cmd_sn = 3;
    let (rsp, _, _) = fx.cmd(&tur, 0, None, 0);
    assert_eq!((rsp.status, rsp.exp_cmd_sn), (0, 4));
}

/// TASK REASSIGN on a session at ErrorRecoveryLevel 0 is "task allegiance
/// reassignment not supported" (RFC 7143 §11.6.1, response 4; LIO
/// answers ISCSI_TMF_RSP_NO_FAILOVER), not "function not supported".
#[test]
fn task_reassign_at_erl0_is_reassignment_not_supported() {
    let mut fx = fixture(true);
    on_lun(0);
    fx.login(INI, "Normal");
    assert_eq!(
        fx.tmf(TmfFunction::TaskReassign, 0),
        tmf_response::NO_REASSIGN
    );
    assert_eq!(
        fx.tmf(TmfFunction::ClearAca, 0),
        tmf_response::NOT_SUPPORTED
    );
}
