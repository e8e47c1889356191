use super::*;

const BOTH: Digests = Digests {
    header: true,
    data: true,
};

#[test]
fn icreq_and_icresp_round_trip() {
    let req = IcReq {
        pfv: 0,
        hpda: 3,
        digests: BOTH,
        maxr2t: 7,
    };
    let b = req.encode();
    let f = Frame::check(&CommonHeader::parse(&b), true, Digests::default(), 0).expect("frame");
    assert_eq!((f.pdu_type, f.plen, f.data_len), (PduType::IcReq, 128, 0));
    assert_eq!(IcReq::parse(&b), Ok(req));
    let rsp = IcResp {
        pfv: 0,
        cpda: 0,
        digests: Digests {
            header: true,
            data: false,
        },
        maxh2cdata: 131072,
    };
    let b = rsp.encode();
    assert!(Frame::check(&CommonHeader::parse(&b), false, Digests::default(), 0).is_ok());
    assert_eq!(IcResp::parse(&b), Ok(rsp));
}

#[test]
fn icreq_with_unknown_version_names_pfv() {
    let mut b = IcReq {
        pfv: 0,
        hpda: 0,
        digests: Digests::default(),
        maxr2t: 0,
    }
    .encode();
    b[8] = 1;
    let e = IcReq::parse(&b).expect_err("pfv 1");
    assert_eq!((e.fes(), e.fei()), (Fes::UnsupportedParameter, 8));
    b[8] = 0;
    b[10] = 32;
    let e = IcReq::parse(&b).expect_err("hpda 32");
    assert_eq!((e.fes(), e.fei()), (Fes::UnsupportedParameter, 10));
}

#[test]
fn icresp_maxh2cdata_below_4k_is_refused() {
    let b = IcResp {
        pfv: 0,
        cpda: 0,
        digests: Digests::default(),
        maxh2cdata: 512,
    }
    .encode();
    assert_eq!(IcResp::parse(&b).map_err(|e| e.fei()), Err(12));
}

/// A whole PDU as a sender builds it: header, digest, padding, data, digest.
fn build(layout: SendLayout, t: PduType, hdr: &[u8], flags: u8, data: &[u8]) -> Vec<u8> {
    let mut h = [0u8; 512];
    h[..hdr.len()].copy_from_slice(hdr);
    let n = layout.finish_header(&mut h, t, flags, data.len());
    let mut out = h[..n].to_vec();
    out.extend_from_slice(data);
    if layout.ddgst_len(data.len()) > 0 {
        out.extend_from_slice(&crc32c(data).to_le_bytes());
    }
    out
}

#[test]
fn capsule_with_data_and_both_digests_frames_and_verifies() {
    let sqe = [0x5Au8; 64];
    let data: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
    let layout = SendLayout::new(BOTH, 0);
    let pdu = build(
        layout,
        PduType::CapsuleCmd,
        &CapsuleCmdHdr::encode(&sqe),
        0,
        &data,
    );
    let f = Frame::check(&CommonHeader::parse(&pdu), true, BOTH, 8192).expect("frame");
    assert!(f.hdgst && f.ddgst);
    assert_eq!(f.header_len(), 76);
    assert_eq!(f.data_offset, 76);
    assert_eq!(f.data_len, 1000);
    assert_eq!(f.plen, pdu.len());
    f.verify_hdgst(&pdu).expect("header digest");
    assert_eq!(CapsuleCmdHdr::sqe(&pdu), Some(&sqe));
    let d = &pdu[f.data_offset..f.data_offset + f.data_len];
    assert_eq!(d, &data[..]);
    let dd = u32::from_le_bytes(pdu[pdu.len() - 4..].try_into().expect("4"));
    assert_eq!(dd, crc32c(d));
}

#[test]
fn padding_follows_the_peer_alignment() {
    let layout = SendLayout::new(Digests::default(), 7); // 32-byte alignment
    let c2h = C2hData {
        cccid: 9,
        datao: 0,
        datal: 100,
    };
    let pdu = build(
        layout,
        PduType::C2hData,
        &c2h.encode(),
        FLAG_LAST_PDU,
        &[1u8; 100],
    );
    assert_eq!(pdu[3], 32);
    let f =
        Frame::check(&CommonHeader::parse(&pdu), false, Digests::default(), 4096).expect("frame");
    assert_eq!((f.data_offset, f.data_len), (32, 100));
    assert_eq!(C2hData::parse(&pdu, f.data_len), Ok(c2h));
    assert!(pdu[24..32].iter().all(|&b| b == 0));
}

#[test]
fn bad_header_digest_is_fatal_status_3() {
    let layout = SendLayout::new(BOTH, 0);
    let mut pdu = build(
        layout,
        PduType::CapsuleResp,
        &CapsuleResp::encode(&[7; 16]),
        0,
        &[],
    );
    let f = Frame::check(&CommonHeader::parse(&pdu), false, BOTH, 0).expect("frame");
    pdu[10] ^= 1;
    let e = f.verify_hdgst(&pdu).expect_err("corrupt");
    assert_eq!(e.fes(), Fes::HeaderDigest);
    // FEI of a header digest error is the PDU Header Digest (PHD): the
    // digest the PDU carried.
    let carried = u32::from_le_bytes(pdu[24..28].try_into().expect("4"));
    assert_eq!(e.fei(), carried);
    assert_ne!(carried, 0);
}

#[test]
fn lengths_that_lie_are_refused_with_the_field_offset() {
    let layout = SendLayout::new(Digests::default(), 0);
    let pdu = build(
        layout,
        PduType::CapsuleCmd,
        &CapsuleCmdHdr::encode(&[0; 64]),
        0,
        &[0; 16],
    );
    let mut ch = CommonHeader::parse(&pdu);
    let none = Digests::default();
    // plen shorter than the header.
    ch.plen = 40;
    assert_eq!(
        Frame::check(&ch, true, none, 8192).map_err(|e| e.fei()),
        Err(4)
    );
    // PDO inside the header.
    ch = CommonHeader::parse(&pdu);
    ch.pdo = 60;
    assert_eq!(
        Frame::check(&ch, true, none, 8192).map_err(|e| e.fei()),
        Err(3)
    );
    // Wrong hlen.
    ch = CommonHeader::parse(&pdu);
    ch.hlen = 24;
    assert_eq!(
        Frame::check(&ch, true, none, 8192).map_err(|e| e.fei()),
        Err(2)
    );
    // A digest flag that was not negotiated.
    ch = CommonHeader::parse(&pdu);
    ch.flags |= FLAG_HDGST;
    assert_eq!(
        Frame::check(&ch, true, none, 8192).map_err(|e| e.fei()),
        Err(1)
    );
    // More data than allowed.
    ch = CommonHeader::parse(&pdu);
    ch.plen = 72 + 9000;
    let e = Frame::check(&ch, true, none, 8192).expect_err("too long");
    assert_eq!(e.fes(), Fes::DataLimitExceeded);
    // Unknown type, and a type the controller never receives.
    ch = CommonHeader::parse(&pdu);
    ch.pdu_type = 0x08;
    assert_eq!(
        Frame::check(&ch, true, none, 8192).map_err(|e| e.fes()),
        Err(Fes::InvalidHeaderField)
    );
    ch.pdu_type = PduType::R2t.code();
    ch.hlen = 24;
    assert_eq!(
        Frame::check(&ch, true, none, 8192).map_err(|e| e.fes()),
        Err(Fes::SequenceError)
    );
}

#[test]
fn data_pdus_and_r2t_round_trip() {
    let h = H2cData {
        cccid: 3,
        ttag: 5,
        datao: 4096,
        datal: 8192,
    };
    let b = h.encode();
    assert_eq!(H2cData::parse(&b, 8192), Ok(h));
    assert_eq!(H2cData::parse(&b, 100).map_err(|e| e.fei()), Err(16));
    let r = R2t {
        cccid: 3,
        ttag: 5,
        r2to: 0,
        r2tl: 65536,
    };
    assert_eq!(R2t::parse(&r.encode()), Ok(r));
    let mut zero = r;
    zero.r2tl = 0;
    assert!(R2t::parse(&zero.encode()).is_err());
}

#[test]
fn termreq_carries_status_offset_and_the_offending_header() {
    let bad = [0xEEu8; 200];
    let mut out = [0u8; SHORT_HLEN + TERM_REQ_MAX_DATA];
    let n = TermReq {
        fes: Fes::InvalidHeaderField.code(),
        fei: 4,
    }
    .encode_into(true, &bad, &mut out);
    assert_eq!(n, 24 + 128);
    // PDO 0: the copied header is not PDU data.
    assert_eq!(CommonHeader::parse(&out).pdo, 0);
    let f = Frame::check(&CommonHeader::parse(&out), false, BOTH, 0).expect("frame");
    assert_eq!((f.pdu_type, f.data_len), (PduType::C2hTermReq, 128));
    let t = TermReq::parse(&out);
    assert_eq!(
        (Fes::from_code(t.fes), t.fei),
        (Some(Fes::InvalidHeaderField), 4)
    );
    assert!(out[24..n].iter().all(|&b| b == 0xEE));
}

#[test]
fn crc32c_matches_the_rfc3720_check_value() {
    // RFC 3720 B.4: 32 bytes of zeroes.
    assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
    assert_eq!(
        crc32c_append(crc32c(b"1234"), b"56789"),
        crc32c(b"123456789")
    );
    assert_eq!(crc32c(b"123456789"), 0xE306_9283);
}

#[test]
fn c2hdata_with_success_but_not_last_pdu_names_flags() {
    let layout = SendLayout::new(Digests::default(), 0);
    let c2h = C2hData {
        cccid: 1,
        datao: 0,
        datal: 512,
    };
    let none = Digests::default();
    for (flags, ok) in [
        (FLAG_SUCCESS, false),
        (FLAG_LAST_PDU | FLAG_SUCCESS, true),
        (FLAG_LAST_PDU, true),
        (0, true),
    ] {
        let pdu = build(layout, PduType::C2hData, &c2h.encode(), flags, &[0; 512]);
        let got = Frame::check(&CommonHeader::parse(&pdu), false, none, 4096);
        if ok {
            assert!(got.is_ok(), "flags {flags:#x}: {got:?}");
        } else {
            let e = got.expect_err("SUCCESS without LAST_PDU");
            assert_eq!((e.fes(), e.fei()), (Fes::InvalidHeaderField, 1));
        }
    }
}

#[test]
fn data_at_a_pdo_off_the_4_byte_alignment_names_pdo() {
    let layout = SendLayout::new(Digests::default(), 0);
    let mut pdu = build(
        layout,
        PduType::CapsuleCmd,
        &CapsuleCmdHdr::encode(&[0; 64]),
        0,
        &[0; 16],
    );
    let none = Digests::default();
    // Two bytes of padding: data at 74, not a multiple of (CPDA 0 + 1) * 4.
    pdu.splice(72..72, [0u8; 2]);
    pdu[3] = 74;
    let plen = pdu.len() as u32;
    pdu[4..8].copy_from_slice(&plen.to_le_bytes());
    let e = Frame::check(&CommonHeader::parse(&pdu), true, none, 8192).expect_err("pdo 74");
    assert_eq!((e.fes(), e.fei()), (Fes::InvalidHeaderField, 3));
    // Four bytes of padding (data at 76) is aligned.
    pdu.splice(72..72, [0u8; 2]);
    pdu[3] = 76;
    let plen = pdu.len() as u32;
    pdu[4..8].copy_from_slice(&plen.to_le_bytes());
    let f = Frame::check(&CommonHeader::parse(&pdu), true, none, 8192).expect("pdo 76");
    assert_eq!((f.data_offset, f.data_len), (76, 16));
}

#[test]
fn a_termreq_with_a_bad_plen_is_not_answered() {
    let mut out = [0u8; SHORT_HLEN + TERM_REQ_MAX_DATA];
    TermReq {
        fes: Fes::SequenceError.code(),
        fei: 0,
    }
    .encode_into(false, &[], &mut out);
    for plen in [24u32, 152] {
        out[4..8].copy_from_slice(&plen.to_le_bytes());
        assert!(Frame::check(&CommonHeader::parse(&out), true, BOTH, 0).is_ok());
    }
    for plen in [8u32, 23, 153, 4096] {
        out[4..8].copy_from_slice(&plen.to_le_bytes());
        let e = Frame::check(&CommonHeader::parse(&out), true, BOTH, 0).expect_err("plen");
        assert_eq!((e.fes(), e.fei()), (Fes::InvalidHeaderField, 4), "{plen}");
        assert!(!e.answered(), "{plen}");
    }
    // Any other error is answered with a termination request.
    out[4..8].copy_from_slice(&24u32.to_le_bytes());
    out[2] = 72;
    let e = Frame::check(&CommonHeader::parse(&out), true, BOTH, 0).expect_err("hlen");
    assert!(e.answered());
}
