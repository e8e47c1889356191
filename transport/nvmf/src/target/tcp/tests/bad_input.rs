//! Bad input from a raw socket: each fatal error gets its C2HTermReq
//! (status and field offset), the connection closes and nothing leaks; a
//! bad data digest fails only its command; 1,000 abrupt disconnects in
//! the middle of R2T transfers leave every pool as it started. A host
//! that overruns its queue gets a C2HTermReq; a write past the end and a
//! keyed SGL fail their command before any R2T.

use super::raw::{connect_cmd, Raw};
use super::*;
use crate::host::{Controller, CtrlOptions};
use crate::spec::cmd::{IoOpcode, NvmeCmd};
use crate::spec::connect::CNTLID_DYNAMIC;
use crate::spec::cpl::{NvmeCompletion, NvmeStatus};
use crate::spec::sgl::SglDescriptor;
use crate::spec::tcp::{Digests, Fes, H2cData, IcReq, PduType, R2t, TermReq};

fn after(f: &Fx, terminated: u64) {
    f.settle();
    f.assert_pool_full();
    assert_eq!(f.transport.stats().terminated, terminated);
}

#[test]
fn a_pdu_before_icreq_is_a_sequence_error() {
    let f = fixture(TcpOptions::default());
    let mut r = Raw::connect(&f);
    let (cmd, _) = connect_cmd(0, CNTLID_DYNAMIC, SglDescriptor::Transport { len: 0 });
    let p = r.capsule(&cmd, &[]);
    r.send(&p);
    r.expect_term(&f, Fes::SequenceError, None);
    after(&f, 1);
}

#[test]
fn a_length_that_lies_names_plen() {
    let f = fixture(TcpOptions::default());
    let mut r = Raw::handshake(&f, Digests::default());
    let mut p = r.admin_connect();
    // plen says less than the header.
    p[4..8].copy_from_slice(&40u32.to_le_bytes());
    r.send(&p);
    r.expect_term(&f, Fes::InvalidHeaderField, Some(4));
    after(&f, 1);
}

#[test]
fn in_capsule_data_over_the_limit_is_a_data_limit_error() {
    let f = fixture(TcpOptions::default());
    let mut r = Raw::handshake(&f, Digests::default());
    let (cmd, _) = connect_cmd(0, CNTLID_DYNAMIC, SglDescriptor::in_capsule(0, 1024));
    let p = r.capsule(&cmd, &vec![0u8; 12 * 1024]);
    r.send(&p);
    r.expect_term(&f, Fes::DataLimitExceeded, None);
    after(&f, 1);
}

/// A capsule whose data starts off the controller's alignment (CPDA 0:
/// 4 bytes; PDO 74) names PDO (byte 3), where the target took its data.
#[test]
fn a_pdo_off_the_controller_alignment_names_pdo() {
    let f = fixture(TcpOptions::default());
    let mut r = Raw::handshake(&f, Digests::default());
    let mut p = r.admin_connect();
    p.splice(72..72, [0u8; 2]);
    p[3] = 74;
    let plen = p.len() as u32;
    p[4..8].copy_from_slice(&plen.to_le_bytes());
    r.send(&p);
    r.expect_term(&f, Fes::InvalidHeaderField, Some(3));
    after(&f, 1);
}

/// An H2CTermReq whose PLEN lies outside 24..=152 ends the connection at
/// once: no C2HTermReq is sent in answer to a termination request.
#[test]
fn an_h2c_term_req_with_a_bad_plen_is_closed_without_an_answer() {
    let f = fixture(TcpOptions::default());
    let mut r = Raw::handshake(&f, Digests::default());
    let mut out = [0u8; 24 + 128];
    let n = TermReq {
        fes: Fes::SequenceError.code(),
        fei: 0,
    }
    .encode_into(false, &[], &mut out);
    out[4..8].copy_from_slice(&200u32.to_le_bytes());
    r.send(&out[..n]);
    assert!(r.try_recv(&f, 1).is_none(), "the target answered");
    after(&f, 1);
}

#[test]
fn a_bad_header_digest_is_fatal() {
    let f = fixture(TcpOptions::default());
    let both = Digests {
        header: true,
        data: true,
    };
    let mut r = Raw::handshake(&f, both);
    let mut p = r.admin_connect();
    p[72] ^= 0xFF; // the header digest
    r.send(&p);
    // FEI: the PDU Header Digest (PHD), the digest the capsule carried.
    let carried = crate::spec::le32(&p, 72);
    r.expect_term(&f, Fes::HeaderDigest, Some(carried));
    after(&f, 1);
}

#[test]
fn a_bad_data_digest_fails_only_its_command() {
    let f = fixture(TcpOptions::default());
    let ddgst = Digests {
        header: false,
        data: true,
    };
    let mut r = Raw::handshake(&f, ddgst);
    let mut p = r.admin_connect();
    let last = p.len() - 1;
    p[last] ^= 0xFF;
    r.send(&p);
    let rsp = r.pdu(&f);
    assert_eq!(rsp[0], PduType::CapsuleResp.code());
    let cpl = NvmeCompletion::parse(&rsp[8..24]).unwrap();
    assert_eq!(cpl.status, NvmeStatus::TRANSIENT_TRANSPORT_ERROR);
    // The same Connect with a good digest succeeds on the same connection.
    let p = r.admin_connect();
    r.send(&p);
    let rsp = r.pdu(&f);
    let cpl = NvmeCompletion::parse(&rsp[8..24]).unwrap();
    assert!(cpl.status.is_success(), "{cpl:?}");
    drop(r);
    after(&f, 0);
}

/// A bad data digest on H2CData fails its command the way a bad digest on
/// in-capsule data does, with Transient Transport Error (not Data Transfer
/// Error), and the queue goes on.
#[test]
fn a_bad_h2cdata_data_digest_fails_its_command_with_transient_transport_error() {
    let f = fixture(TcpOptions::default());
    let ddgst = Digests {
        header: false,
        data: true,
    };
    let mut r = Raw::handshake(&f, ddgst);
    let r2t = connect_by_r2t(&f, &mut r);
    let (_, data) = connect_cmd(0, CNTLID_DYNAMIC, SglDescriptor::Transport { len: 1024 });
    let h = H2cData {
        cccid: r2t.cccid,
        ttag: r2t.ttag,
        datao: 0,
        datal: 1024,
    };
    let mut p = r.h2c(&h, &data);
    let last = p.len() - 1;
    p[last] ^= 0xFF;
    r.send(&p);
    let cpl = response(&f, &mut r);
    assert_eq!(cpl.cid, 7);
    assert_eq!(cpl.status, NvmeStatus::TRANSIENT_TRANSPORT_ERROR, "{cpl:?}");
    // The same Connect with a good digest succeeds on the same connection.
    let p = r.admin_connect();
    r.send(&p);
    assert!(response(&f, &mut r).status.is_success());
    drop(r);
    after(&f, 0);
}

/// A capsule refused for a bad data digest still took its submission queue
/// entry: with SQ flow control on, its completion and every later one
/// carry the SQ head past it (else the host's view of the queue loses an
/// entry per digest error).
#[test]
fn a_capsule_refused_for_its_data_digest_moves_the_sq_head() {
    use crate::spec::property::{ofst, PropertyCmd, PropertySize};
    let f = fixture(TcpOptions::default());
    let ddgst = Digests {
        header: false,
        data: true,
    };
    let mut r = Raw::handshake(&f, ddgst);
    let p = r.admin_connect();
    r.send(&p);
    let cpl = response(&f, &mut r);
    assert!(cpl.status.is_success(), "{cpl:?}");
    let get = |r: &mut Raw, cid: u16| {
        let mut g = PropertyCmd::get(ofst::CC, PropertySize::Four, cid);
        g.set_sgl(&SglDescriptor::Transport { len: 0 });
        let p = r.capsule(&g, &[]);
        r.send(&p);
        let cpl = response(&f, r);
        assert!(cpl.status.is_success(), "{cpl:?}");
        cpl.sqhd
    };
    let head = get(&mut r, 8);
    // A capsule with 64 bytes of in-capsule data whose digest is wrong.
    let mut g = PropertyCmd::get(ofst::CC, PropertySize::Four, 9);
    g.set_sgl(&SglDescriptor::in_capsule(0, 64));
    let mut p = r.capsule(&g, &[0u8; 64]);
    let last = p.len() - 1;
    p[last] ^= 0xFF;
    r.send(&p);
    let cpl = response(&f, &mut r);
    assert_eq!(cpl.status, NvmeStatus::TRANSIENT_TRANSPORT_ERROR);
    assert_eq!(cpl.sqhd, head + 1, "the refused capsule's SQ head");
    assert_eq!(get(&mut r, 10), head + 2, "the next command's SQ head");
    drop(r);
    after(&f, 0);
}

#[test]
fn h2cdata_without_an_r2t_names_its_ttag() {
    let f = fixture(TcpOptions::default());
    let mut r = Raw::handshake(&f, Digests::default());
    r.h2c_without_r2t(&f);
    after(&f, 1);
}

/// A Connect whose data goes by R2T; returns the R2T.
fn connect_by_r2t(f: &Fx, r: &mut Raw) -> R2t {
    let (cmd, _) = connect_cmd(0, CNTLID_DYNAMIC, SglDescriptor::Transport { len: 1024 });
    let p = r.capsule(&cmd, &[]);
    r.send(&p);
    let pdu = r.pdu(f);
    assert_eq!(pdu[0], PduType::R2t.code());
    let r2t = R2t::parse(&pdu).unwrap();
    assert_eq!((r2t.cccid, r2t.r2to, r2t.r2tl), (7, 0, 1024));
    r2t
}

/// A new connection whose Connect waits for its data by R2T, answered
/// with an H2CData PDU at `datao` carrying `data`; returns the connection.
fn answer_r2t(f: &Fx, datao: u32, data: &[u8]) -> Raw {
    let mut r = Raw::handshake(f, Digests::default());
    let r2t = connect_by_r2t(f, &mut r);
    let h = H2cData {
        cccid: r2t.cccid,
        ttag: r2t.ttag,
        datao,
        datal: data.len() as u32,
    };
    let p = r.h2c(&h, data);
    r.send(&p);
    r
}

#[test]
fn h2cdata_outside_its_r2t_is_out_of_range() {
    let f = fixture(TcpOptions::default());
    // Not at the expected offset, then past the end of the R2T.
    answer_r2t(&f, 512, &[0u8; 512]).expect_term(&f, Fes::DataOutOfRange, None);
    answer_r2t(&f, 0, &[0u8; 2048]).expect_term(&f, Fes::DataOutOfRange, None);
    // The right data completes the Connect.
    let (_, data) = connect_cmd(0, CNTLID_DYNAMIC, SglDescriptor::Transport { len: 1024 });
    let mut r = answer_r2t(&f, 0, &data);
    let rsp = r.pdu(&f);
    assert_eq!(rsp[0], PduType::CapsuleResp.code());
    assert!(NvmeCompletion::parse(&rsp[8..24])
        .unwrap()
        .status
        .is_success());
    drop(r);
    after(&f, 2);
}

#[test]
fn a_second_icreq_is_a_sequence_error() {
    let f = fixture(TcpOptions::default());
    let mut r = Raw::handshake(&f, Digests::default());
    r.send(
        &IcReq {
            pfv: 0,
            hpda: 0,
            digests: Digests::default(),
            maxr2t: 0,
        }
        .encode(),
    );
    r.expect_term(&f, Fes::SequenceError, None);
    after(&f, 1);
}

#[test]
fn a_host_that_refuses_digests_is_turned_away_when_they_are_required() {
    let f = fixture(TcpOptions {
        digest: super::super::DigestPolicy::Require,
        ..TcpOptions::default()
    });
    let mut r = Raw::connect(&f);
    r.send(
        &IcReq {
            pfv: 0,
            hpda: 0,
            digests: Digests::default(),
            maxr2t: 0,
        }
        .encode(),
    );
    r.expect_term(&f, Fes::UnsupportedParameter, Some(11));
    after(&f, 1);
}

#[test]
fn a_thousand_abrupt_disconnects_leave_every_pool_full() {
    let f = fixture(TcpOptions::default());
    f.cl.on(0, |_| {
        let t = f.host(false, false);
        let c = Controller::connect(&t, who(), CtrlOptions::default()).unwrap();
        let cntlid = c.info().cntlid;
        for i in 0..1000u32 {
            let mut r = Raw::handshake(&f, Digests::default());
            let (cmd, data) = connect_cmd(1, cntlid, SglDescriptor::in_capsule(0, 1024));
            let p = r.capsule(&cmd, &data);
            r.send(&p);
            let rsp = r.pdu(&f);
            assert!(NvmeCompletion::parse(&rsp[8..24])
                .unwrap()
                .status
                .is_success());
            // A 64 KiB write by R2T (pool buffers), cut off half way.
            let mut w = NvmeCmd::new(IoOpcode::Write.code(), 9);
            w.nsid = 1;
            w.cdw10 = i % 1024;
            w.cdw12 = 127;
            w.set_sgl(&SglDescriptor::Transport { len: 65536 });
            let p = r.capsule(&w, &[]);
            r.send(&p);
            let r2t = R2t::parse(&r.pdu(&f)).unwrap();
            if i % 2 == 0 {
                let h = H2cData {
                    cccid: r2t.cccid,
                    ttag: r2t.ttag,
                    datao: 0,
                    datal: 8192,
                };
                let p = r.h2c(&h, &[0x5A; 8192]);
                r.send(&p);
            }
            drop(r);
            // The next Connect names queue 1 again: wait until the target
            // has seen this close (the kernel may deliver it a few
            // milliseconds late) so that it is not refused as a second
            // queue 1 (Command Sequence Error).
            let gone = u64::from(i) + 1;
            let mut polls = 0;
            while f.transport.stats().destroyed < gone {
                f.cl.poll_once_all();
                polls += 1;
                assert!(polls < 10_000_000, "{i}: the closed queue is still there");
            }
        }
        drop(c);
    });
    f.settle();
    f.assert_pool_full();
    let st = f.transport.stats();
    assert_eq!(st.accepted, 1001);
    assert_eq!(st.destroyed, 1001);
    assert_eq!(f.transport.queues_per_group(), vec![0]);
}

/// A raw I/O queue `qid` of controller `cntlid` whose Connect (SQSIZE
/// `sqsize`, 0's based) succeeded.
fn io_queue(f: &Fx, qid: u16, cntlid: u16, sqsize: u16) -> Raw {
    let mut r = Raw::handshake(f, Digests::default());
    let (mut cmd, data) = connect_cmd(qid, cntlid, SglDescriptor::in_capsule(0, 1024));
    cmd.cdw11 = (cmd.cdw11 & !0xFFFF) | u32::from(sqsize);
    let p = r.capsule(&cmd, &data);
    r.send(&p);
    let rsp = r.pdu(f);
    let cpl = NvmeCompletion::parse(&rsp[8..24]).unwrap();
    assert!(cpl.status.is_success(), "Connect QID {qid}: {cpl:?}");
    r
}

/// A 64 KiB write of `cid` at `slba` whose data goes by R2T.
fn write_by_r2t(cid: u16, slba: u32) -> NvmeCmd {
    let mut w = NvmeCmd::new(IoOpcode::Write.code(), cid);
    w.nsid = 1;
    w.cdw10 = slba;
    w.cdw12 = 127;
    w.set_sgl(&SglDescriptor::Transport { len: 65536 });
    w
}

/// The next PDU must be a CapsuleResp: its completion.
fn response(f: &Fx, r: &mut Raw) -> NvmeCompletion {
    let p = r.pdu(f);
    assert_eq!(
        p[0],
        PduType::CapsuleResp.code(),
        "not a CapsuleResp: {p:?}"
    );
    NvmeCompletion::parse(&p[8..24]).unwrap()
}

/// A raw admin queue of a new, enabled controller whose Connect asked
/// for SQSIZE `sqsize` (0's based); its controller id.
fn raw_controller(f: &Fx, sqsize: u16) -> (Raw, u16) {
    use crate::spec::property::{ofst, Cc, PropertyCmd, PropertySize};
    let mut r = Raw::handshake(f, Digests::default());
    let (mut cmd, data) = connect_cmd(0, CNTLID_DYNAMIC, SglDescriptor::in_capsule(0, 1024));
    cmd.cdw11 = (cmd.cdw11 & !0xFFFF) | u32::from(sqsize);
    let p = r.capsule(&cmd, &data);
    r.send(&p);
    let cpl = response(f, &mut r);
    assert!(cpl.status.is_success(), "admin Connect: {cpl:?}");
    let cntlid = cpl.dw0 as u16;
    let cc = Cc {
        en: true,
        ..Cc::linux_default(0)
    };
    let mut set = PropertyCmd::set(ofst::CC, PropertySize::Four, cc.to_u32().into(), 8);
    set.set_sgl(&SglDescriptor::Transport { len: 0 });
    let p = r.capsule(&set, &[]);
    r.send(&p);
    let cpl = response(f, &mut r);
    assert!(cpl.status.is_success(), "CC.EN: {cpl:?}");
    (r, cntlid)
}

/// A host that overruns its I/O queue (SQSIZE 3: 4 commands; 8 writes by
/// R2T sent at once, none answered) on a target whose queues hold
/// `max_queue_depth` commands gets the R2Ts of the 4 that fit, then a
/// C2HTermReq (PDU Sequence Error) whose copy of the offending header is
/// the 5th capsule's; the target closes within a bound, keeps the admin
/// queue, and every buffer the writes took is back.
fn overrun_by_eight_writes(max_queue_depth: u16) {
    let f = fixture(TcpOptions {
        max_queue_depth,
        ..TcpOptions::default()
    });
    let (admin, cntlid) = raw_controller(&f, 3);
    let mut r = io_queue(&f, 1, cntlid, 3);
    let mut all = Vec::new();
    for cid in 0..8u16 {
        all.extend(r.capsule(&write_by_r2t(cid, u32::from(cid) * 128), &[]));
    }
    r.send(&all);
    for cid in 0..4u16 {
        let p = r.pdu(&f);
        assert_eq!(p[0], PduType::R2t.code(), "not an R2T: {p:?}");
        assert_eq!(R2t::parse(&p).unwrap().cccid, cid);
    }
    let p = r.pdu(&f);
    assert_eq!(p[0], PduType::C2hTermReq.code(), "not a C2HTermReq: {p:?}");
    let term = TermReq::parse(&p);
    assert_eq!(Fes::from_code(term.fes), Some(Fes::SequenceError));
    // The offending header: a CapsuleCmd, CID 4 (SQE byte 2).
    assert_eq!(p[24], PduType::CapsuleCmd.code());
    assert_eq!(crate::spec::le16(&p, 24 + 8 + 2), 4);
    assert!(
        r.closed_within(&f, std::time::Duration::from_secs(10)),
        "the overrun queue stays open"
    );
    until_connections(&f, 1);
    assert_eq!(f.transport.queues_per_group(), [1], "the admin queue");
    f.assert_pool_full();
    drop(admin);
    after(&f, 1);
}

/// More commands than the target's queue holds (4, the host's SQSIZE too).
#[test]
fn more_commands_than_the_queue_holds_is_a_sequence_error() {
    overrun_by_eight_writes(4);
}

/// More commands than the host's SQSIZE allows, while the target's queue
/// (128 commands) has room: the host overran the queue it asked for.
#[test]
fn more_commands_than_the_host_sqsize_is_a_sequence_error() {
    overrun_by_eight_writes(128);
}

/// A write past the namespace's end (16 MiB of 512 B blocks: 32768) whose
/// data would come by R2T fails with LBA Out of Range before any R2T goes
/// out or any buffer is taken; the queue goes on, and the same write in
/// range does get its R2T and completes.
#[test]
fn a_write_past_the_end_fails_before_any_r2t() {
    let f = fixture(TcpOptions::default());
    f.cl.on(0, |_| {
        let t = f.host(false, false);
        let c = Controller::connect(&t, who(), CtrlOptions::default()).unwrap();
        let mut r = io_queue(&f, 1, c.info().cntlid, 31);
        // Blocks 32760..32888: the last 120 are past the end.
        let p = r.capsule(&write_by_r2t(9, 32768 - 8), &[]);
        r.send(&p);
        let cpl = response(&f, &mut r);
        assert_eq!(cpl.cid, 9);
        assert_eq!(cpl.status, NvmeStatus::LBA_OUT_OF_RANGE, "{cpl:?}");
        f.assert_pool_full();
        // In range: an R2T, the data, success.
        let p = r.capsule(&write_by_r2t(10, 32768 - 128), &[]);
        r.send(&p);
        let p = r.pdu(&f);
        assert_eq!(p[0], PduType::R2t.code(), "not an R2T: {p:?}");
        let r2t = R2t::parse(&p).unwrap();
        assert_eq!((r2t.cccid, r2t.r2to, r2t.r2tl), (10, 0, 65536));
        let h = H2cData {
            cccid: 10,
            ttag: r2t.ttag,
            datao: 0,
            datal: 65536,
        };
        let p = r.h2c(&h, &[0xA5; 65536]);
        r.send(&p);
        let cpl = response(&f, &mut r);
        assert!(cpl.status.is_success(), "{cpl:?}");
        drop(r);
        c.shutdown().unwrap();
    });
    after(&f, 0);
}

/// A keyed SGL descriptor (type 0x4x: an RDMA address and key) is not
/// valid over NVMe/TCP: a write and a read naming one fail with SGL
/// Descriptor Type Invalid, with no R2T and no C2HData, and take nothing;
/// the all-zero keyed "no data" descriptor on a Flush is let by, and the
/// queue goes on.
#[test]
fn a_keyed_sgl_over_tcp_is_a_descriptor_type_error() {
    let f = fixture(TcpOptions::default());
    f.cl.on(0, |_| {
        let t = f.host(false, false);
        let c = Controller::connect(&t, who(), CtrlOptions::default()).unwrap();
        let mut r = io_queue(&f, 1, c.info().cntlid, 31);
        let keyed = SglDescriptor::keyed(0x1000_0000, 65536, 0x1234, false).unwrap();
        for (cid, op) in [(20u16, IoOpcode::Write), (21, IoOpcode::Read)] {
            let mut cmd = NvmeCmd::new(op.code(), cid);
            cmd.nsid = 1;
            cmd.cdw12 = 127;
            cmd.set_sgl(&keyed);
            let p = r.capsule(&cmd, &[]);
            r.send(&p);
            let cpl = response(&f, &mut r);
            assert_eq!(cpl.cid, cid);
            assert_eq!(
                cpl.status,
                NvmeStatus::SGL_DESCRIPTOR_TYPE_INVALID,
                "{op:?}: {cpl:?}"
            );
            f.assert_pool_full();
        }
        let mut flush = NvmeCmd::new(IoOpcode::Flush.code(), 22);
        flush.nsid = 1;
        assert!(matches!(
            flush.sgl(),
            Ok(SglDescriptor::Keyed { len: 0, .. })
        ));
        let p = r.capsule(&flush, &[]);
        r.send(&p);
        let cpl = response(&f, &mut r);
        assert!(cpl.status.is_success(), "{cpl:?}");
        drop(r);
        c.shutdown().unwrap();
    });
    after(&f, 0);
}
