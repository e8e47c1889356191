//! Bad input from a raw socket: each fatal error gets its C2HTermReq
//! (status and field offset), the connection closes and nothing leaks; a
//! bad data digest fails only its command; 1,000 abrupt disconnects in
//! the middle of R2T transfers leave every pool as it started.

use super::raw::{connect_cmd, Raw};
use super::*;
use crate::host::{Controller, CtrlOptions};
use crate::spec::cmd::{IoOpcode, NvmeCmd};
use crate::spec::connect::CNTLID_DYNAMIC;
use crate::spec::cpl::{NvmeCompletion, NvmeStatus};
use crate::spec::sgl::SglDescriptor;
use crate::spec::tcp::{Digests, Fes, H2cData, IcReq, PduType, R2t};

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
    r.expect_term(&f, Fes::HeaderDigest, None);
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
