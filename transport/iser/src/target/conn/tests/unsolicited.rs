//! ImmediateData and InitialR2T (RFC 7143 §13.10, §13.11), as negotiated
//! for the session: with ImmediateData=No a SCSI Command carrying data is
//! rejected (reason 0x04, as LIO does) and uses up its CmdSN; with
//! InitialR2T=Yes unsolicited Data-Out ends the task with CHECK CONDITION
//! "unexpected unsolicited data" (0B/0C/0C). Either way nothing reaches the
//! medium, no task or buffer is kept, and the session goes on. What the
//! negotiated values allow (immediate data, unsolicited Data-Out, the rest
//! fetched by RDMA READ, the iSER R2T) is served.

use super::*;
use crate::pdu::reject_reason;

/// A session where the target's limits give ImmediateData=`immediate` and
/// InitialR2T=`initial_r2t` (the initiator offers Yes and No).
fn negotiated(immediate: bool, initial_r2t: bool) -> Fx {
    let mut fx = fixture_with(
        true,
        TargetOptions {
            limits: TargetLimits {
                queue_depth: 4,
                immediate_data: immediate,
                initial_r2t,
                ..TargetLimits::default()
            },
            max_io_bytes: 64 * 1024,
            task_buffers: 16,
        },
    );
    on_lun(0);
    let r = fx.login(INI, "Normal").expect("login response");
    assert_eq!(r.status_class, 0);
    let keys = parse_text(fx.last().data).expect("text");
    let yes_no = |b| if b { "Yes" } else { "No" };
    assert!(
        keys.contains(&("ImmediateData", yes_no(immediate)))
            && keys.contains(&("InitialR2T", yes_no(initial_r2t))),
        "negotiated {keys:?}"
    );
    fx
}

/// ImmediateData=No: a WRITE with 4 KiB of immediate data (within
/// FirstBurstLength and the receive segment) is rejected with reason 0x04,
/// the BHS echoed; nothing is written, no task or buffer is kept, and the
/// next CmdSN is served. Without immediate data the write goes through,
/// its data fetched by RDMA READ.
#[test]
fn immediate_data_when_not_negotiated_is_rejected() {
    let mut fx = negotiated(false, true);
    let old = pattern(11, 8192);
    let reads = fx.ops.reads;
    let (rsp, s, _) = fx.cmd(&rw10(0x2A, 0, 96, 16), 8192, Some(&old), 0);
    assert_eq!((rsp.status, s), (sense::GOOD, None));
    assert_eq!(fx.ops.reads, reads + 1);
    let rejected = fx.conn.stats().rejected;
    let bad = pattern(12, 8192);
    let before = fx.ops.sent.len();
    let itt = fx.send_write(96, &bad, 4096, true, 4096);
    let sent: Vec<_> = fx.ops.sent[before..]
        .iter()
        .map(|(p, _)| Pdu::parse(p).expect("valid PDU").bhs)
        .collect();
    match sent.as_slice() {
        [Bhs::Reject(r)] => assert_eq!(r.reason, reject_reason::PROTOCOL_ERROR),
        other => panic!("expected one Reject, got {other:?}"),
    }
    // The rejected BHS comes back: a SCSI Command with the write's ITT and
    // its DataSegmentLength.
    let echoed = fx.last().data;
    assert_eq!(echoed.len(), BHS_LEN);
    assert_eq!(echoed[0] & 0x3F, 0x01);
    assert_eq!(echoed[5..8], [0, 0x10, 0]);
    assert_eq!(echoed[16..20], itt.to_be_bytes());
    assert_eq!(fx.conn.stats().rejected, rejected + 1);
    assert_eq!(fx.ops.reads, reads + 1, "the rest was fetched anyway");
    fx.assert_idle();
    let (rsp, _, d) = fx.cmd(&rw10(0x28, 0, 96, 16), 8192, None, 0);
    assert_eq!(rsp.status, sense::GOOD, "the next CmdSN was not served");
    assert_eq!(d, old, "the rejected write reached the medium");
    assert!(responses(&fx.ops).iter().all(|&(i, _)| i != itt));
    let good = pattern(13, 8192);
    let (rsp, s, _) = fx.cmd(&rw10(0x2A, 0, 96, 16), 8192, Some(&good), 0);
    assert_eq!((rsp.status, s), (sense::GOOD, None));
    assert_eq!(fx.cmd(&rw10(0x28, 0, 96, 16), 8192, None, 0).2, good);
    fx.assert_idle();
}

/// InitialR2T=Yes: unsolicited Data-Out (TTT 0xffffffff, within
/// FirstBurstLength) after 2 KiB of immediate data ends the task with
/// ABORTED COMMAND 0C/0C; no RDMA READ, nothing written, no task or buffer
/// kept. The same write with its data past the immediate data solicited
/// (the target's RDMA READ, iSER's R2T) is served.
#[test]
fn unsolicited_data_out_with_initial_r2t_fails_the_task() {
    let mut fx = negotiated(true, true);
    let old = pattern(14, 8192);
    let (rsp, _, _) = fx.cmd(&rw10(0x2A, 0, 128, 16), 8192, Some(&old), 0);
    assert_eq!(rsp.status, sense::GOOD);
    let reads = fx.ops.reads;
    let bad = pattern(15, 8192);
    let itt = fx.send_write(128, &bad, 2048, false, 4096);
    fx.data_out(itt, 2048, &bad[2048..4096], true);
    let (status, s) = fx.response_to(itt);
    assert_eq!(status, sense::CHECK_CONDITION);
    assert_eq!(s.expect("sense").code(), (0xB, 0x0C, 0x0C));
    assert_eq!(fx.ops.reads, reads, "the rest was fetched anyway");
    fx.assert_idle();
    let (rsp, _, d) = fx.cmd(&rw10(0x28, 0, 128, 16), 8192, None, 0);
    assert_eq!(rsp.status, sense::GOOD, "the session went on");
    assert_eq!(d, old, "the failed write reached the medium");
    // Immediate data, the rest solicited: served.
    let good = pattern(16, 8192);
    let itt = fx.send_write(128, &good, 2048, true, 2048);
    assert_eq!(fx.response_to(itt), (sense::GOOD, None));
    assert_eq!(fx.ops.reads, reads + 1);
    assert_eq!(fx.cmd(&rw10(0x28, 0, 128, 16), 8192, None, 0).2, good);
    fx.assert_idle();
}

/// InitialR2T=No (and ImmediateData=No): a command without data, then
/// unsolicited Data-Out within FirstBurstLength, the rest by RDMA READ, is
/// served: both checks follow the session's negotiated values.
#[test]
fn unsolicited_data_out_without_initial_r2t_is_served() {
    let mut fx = negotiated(false, false);
    let reads = fx.ops.reads;
    let data = pattern(17, 8192);
    let itt = fx.send_write(160, &data, 0, false, 4096);
    fx.data_out(itt, 0, &data[..2048], false);
    fx.data_out(itt, 2048, &data[2048..4096], true);
    assert_eq!(fx.response_to(itt), (sense::GOOD, None));
    assert_eq!(fx.ops.reads, reads + 1);
    assert_eq!(fx.cmd(&rw10(0x28, 0, 160, 16), 8192, None, 0).2, data);
    fx.assert_idle();
}
