//! FirstBurstLength (RFC 7143 §4.2.5.2): the unsolicited data of one
//! command (immediate data and unsolicited Data-Out) must not exceed it.
//! A command carrying more immediate data is rejected (reason 0x09, as LIO
//! does) and uses up its CmdSN; unsolicited Data-Out beyond it ends the
//! task with CHECK CONDITION "incorrect amount of data" (0B/0C/0D). Either
//! way nothing reaches the medium, no task or buffer is kept, and the
//! session goes on.

use super::*;
use crate::pdu::{reject_reason, DataOut};

/// The negotiated FirstBurstLength: the initiator offers 64 KiB.
const FIRST_BURST: usize = 4096;

/// InitialR2T=No (unsolicited Data-Out allowed), FirstBurstLength 4 KiB.
fn small_first_burst() -> Fx {
    fixture_with(
        true,
        TargetOptions {
            limits: TargetLimits {
                queue_depth: 4,
                first_burst: FIRST_BURST as u32,
                initial_r2t: false,
                ..TargetLimits::default()
            },
            max_io_bytes: 64 * 1024,
            task_buffers: 16,
        },
    )
}

impl Fx {
    /// A WRITE(10) of `data` at `lba` of LUN 0 carrying `imm` bytes of
    /// immediate data, F set when `last`, the rest behind write STag 2 at
    /// VA `rest_at` (the first byte the target is to fetch). Only sent;
    /// returns its ITT.
    pub(super) fn send_write(
        &mut self,
        lba: u32,
        data: &[u8],
        imm: usize,
        last: bool,
        rest_at: u64,
    ) -> u32 {
        let mut c = [0u8; 16];
        c[..10].copy_from_slice(&rw10(0x2A, 0, lba, (data.len() / 512) as u16));
        self.itt += 1;
        let cmd = ScsiCommand {
            immediate: false,
            final_: last,
            read: false,
            write: true,
            attr: TaskAttr::Simple,
            lun: Lun::from_index(0),
            itt: self.itt,
            edtl: data.len() as u32,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: 0,
            cdb: c,
        };
        self.cmd_sn += 1;
        self.ops.mem.insert(2, data.to_vec());
        let hdr = IserHeader::Control {
            write: Some(Stag {
                stag: 2,
                va: rest_at,
            }),
            read: None,
        };
        let mut v = Bhs::ScsiCmd(cmd).encode(0, imm as u32).to_vec();
        v.extend_from_slice(&data[..imm]);
        assert!(self.pdu(hdr, &v), "the connection closed");
        self.itt
    }

    /// An unsolicited Data-Out of `data` at `offset` for task `itt`.
    pub(super) fn data_out(&mut self, itt: u32, offset: usize, data: &[u8], last: bool) {
        let d = DataOut {
            final_: last,
            lun: Lun::from_index(0),
            itt,
            ttt: RESERVED_TAG,
            exp_stat_sn: 0,
            data_sn: 0,
            buffer_offset: offset as u32,
        };
        let mut v = Bhs::DataOut(d).encode(0, data.len() as u32).to_vec();
        v.extend_from_slice(data);
        assert!(self.pdu(IserHeader::PLAIN, &v), "the connection closed");
    }

    /// Poll until the response to `itt` arrived: (status, sense).
    pub(super) fn response_to(&mut self, itt: u32) -> (u8, Option<Sense>) {
        for _ in 0..10_000 {
            for (p, _) in &self.ops.sent {
                let p = Pdu::parse(p).expect("valid PDU");
                if let Bhs::ScsiRsp(r) = p.bhs {
                    if r.itt == itt {
                        let sense = (p.data.len() > 2)
                            .then(|| Sense::parse(&p.data[2..]))
                            .flatten();
                        return (r.status, sense);
                    }
                }
            }
            self.cl.poll_once_all();
            self.conn.poll(&mut self.ops);
        }
        panic!("no response to ITT {itt:#x}");
    }

    /// Every task finished and every task buffer back in the pool or the
    /// core's cache.
    pub(super) fn assert_idle(&self) {
        let pool = self.target.pool();
        assert_eq!(self.conn.tasks_in_flight(), 0, "a task was kept");
        assert_eq!(
            pool.available() + self.conn.core_ctx().cached_buffers(),
            pool.count(),
            "a task buffer was kept"
        );
    }
}

/// Immediate data beyond FirstBurstLength: the command is rejected with
/// reason 0x09 (the rejected BHS echoed), nothing is written, no task or
/// buffer is kept, and the next command (the next CmdSN) is served; at
/// exactly FirstBurstLength the write goes through.
#[test]
fn immediate_data_beyond_first_burst_is_rejected() {
    let mut fx = small_first_burst();
    on_lun(0);
    let r = fx.login(INI, "Normal").expect("login response");
    assert_eq!(r.status_class, 0);
    let keys = parse_text(fx.last().data).expect("text");
    assert!(
        keys.contains(&("FirstBurstLength", "4096")),
        "negotiated {keys:?}"
    );
    let old = pattern(1, 8192);
    let (rsp, s, _) = fx.cmd(&rw10(0x2A, 0, 64, 16), 8192, Some(&old), 0);
    assert_eq!((rsp.status, s), (sense::GOOD, None));
    let rejected = fx.conn.stats().rejected;
    // 8 KiB of immediate data (the receive segment allows it) over a 4 KiB
    // first burst.
    let bad = pattern(2, 8192);
    let before = fx.ops.sent.len();
    let itt = fx.send_write(64, &bad, 8192, true, 8192);
    let sent: Vec<_> = fx.ops.sent[before..]
        .iter()
        .map(|(p, _)| Pdu::parse(p).expect("valid PDU").bhs)
        .collect();
    match sent.as_slice() {
        [Bhs::Reject(r)] => assert_eq!(r.reason, reject_reason::INVALID_PDU_FIELD),
        other => panic!("expected one Reject, got {other:?}"),
    }
    // The rejected BHS comes back: a SCSI Command with the write's ITT.
    let echoed = fx.last().data;
    assert_eq!(echoed.len(), BHS_LEN);
    assert_eq!(echoed[0] & 0x3F, 0x01);
    assert_eq!(echoed[16..20], itt.to_be_bytes());
    assert_eq!(fx.conn.stats().rejected, rejected + 1);
    fx.assert_idle();
    // Nothing of it reached the medium; the session goes on.
    let (rsp, _, d) = fx.cmd(&rw10(0x28, 0, 64, 16), 8192, None, 0);
    assert_eq!(rsp.status, sense::GOOD, "the next CmdSN was not served");
    assert_eq!(d, old, "the rejected write reached the medium");
    assert!(responses(&fx.ops).iter().all(|&(i, _)| i != itt));
    // At exactly FirstBurstLength: served, the rest fetched by RDMA READ.
    let good = pattern(3, 8192);
    let (rsp, s, _) = fx.cmd(&rw10(0x2A, 0, 64, 16), 8192, Some(&good), FIRST_BURST);
    assert_eq!((rsp.status, s), (sense::GOOD, None));
    assert_eq!(fx.cmd(&rw10(0x28, 0, 64, 16), 8192, None, 0).2, good);
    fx.assert_idle();
}

/// Unsolicited Data-Out that takes the command's unsolicited data beyond
/// FirstBurstLength: CHECK CONDITION ABORTED COMMAND 0C/0D, no RDMA READ,
/// nothing written, no task or buffer kept; up to exactly FirstBurstLength
/// the same sequence is served.
#[test]
fn unsolicited_data_out_beyond_first_burst_fails_the_task() {
    let mut fx = small_first_burst();
    on_lun(0);
    fx.login(INI, "Normal").expect("login response");
    let old = pattern(4, 8192);
    let (rsp, _, _) = fx.cmd(&rw10(0x2A, 0, 32, 16), 8192, Some(&old), 0);
    assert_eq!(rsp.status, sense::GOOD);
    let reads = fx.ops.reads;
    // 2 KiB immediate, then 4 KiB of Data-Out: 6 KiB unsolicited.
    let bad = pattern(5, 8192);
    let itt = fx.send_write(32, &bad, 2048, false, 6144);
    fx.data_out(itt, 2048, &bad[2048..6144], true);
    let (status, s) = fx.response_to(itt);
    assert_eq!(status, sense::CHECK_CONDITION);
    assert_eq!(s.expect("sense").code(), (0xB, 0x0C, 0x0D));
    assert_eq!(fx.ops.reads, reads, "the rest was fetched anyway");
    fx.assert_idle();
    let (rsp, _, d) = fx.cmd(&rw10(0x28, 0, 32, 16), 8192, None, 0);
    assert_eq!(rsp.status, sense::GOOD, "the session went on");
    assert_eq!(d, old, "the failed write reached the medium");
    // 2 KiB immediate + 2 KiB Data-Out = FirstBurstLength, the rest by
    // RDMA READ.
    let good = pattern(6, 8192);
    let itt = fx.send_write(32, &good, 2048, false, FIRST_BURST as u64);
    fx.data_out(itt, 2048, &good[2048..FIRST_BURST], true);
    assert_eq!(fx.response_to(itt), (sense::GOOD, None));
    assert_eq!(fx.ops.reads, reads + 1);
    assert_eq!(fx.cmd(&rw10(0x28, 0, 32, 16), 8192, None, 0).2, good);
    fx.assert_idle();
}
