//! PDU round trips and strictness.

use super::*;

fn all_pdus() -> Vec<Bhs> {
    let lun = Lun::from_index(3);
    vec![
        Bhs::NopOut(NopOut {
            immediate: true,
            lun,
            itt: 5,
            ttt: RESERVED_TAG,
            cmd_sn: 9,
            exp_stat_sn: 2,
        }),
        Bhs::ScsiCmd(ScsiCommand {
            immediate: false,
            final_: true,
            read: true,
            write: false,
            attr: TaskAttr::Simple,
            lun,
            itt: 0x1234,
            edtl: 4096,
            cmd_sn: 77,
            exp_stat_sn: 3,
            cdb: [0x28, 0, 0, 0, 0, 8, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0],
        }),
        Bhs::TmfReq(TmfRequest {
            immediate: true,
            function: TmfFunction::AbortTask,
            lun,
            itt: 8,
            ref_task_tag: 0x1234,
            cmd_sn: 78,
            exp_stat_sn: 4,
            ref_cmd_sn: 77,
            exp_data_sn: 0,
        }),
        Bhs::LoginReq(LoginRequest {
            flags: LoginFlags {
                transit: true,
                cont: false,
                csg: Stage::Operational,
                nsg: Stage::FullFeature,
            },
            version_max: 0,
            version_min: 0,
            isid: [0x80, 1, 2, 3, 4, 5],
            tsih: 0,
            itt: 1,
            cid: 0,
            cmd_sn: 1,
            exp_stat_sn: 0,
        }),
        Bhs::TextReq(TextPdu {
            immediate: false,
            final_: true,
            cont: false,
            lun: Lun::default(),
            itt: 2,
            ttt: RESERVED_TAG,
            sn: 2,
            exp_sn: 1,
            max_cmd_sn: 0,
        }),
        Bhs::DataOut(DataOut {
            final_: true,
            lun,
            itt: 0x1234,
            ttt: RESERVED_TAG,
            exp_stat_sn: 3,
            data_sn: 0,
            buffer_offset: 8192,
        }),
        Bhs::LogoutReq(LogoutRequest {
            immediate: true,
            reason: LogoutReason::CloseSession,
            itt: 9,
            cid: 0,
            cmd_sn: 80,
            exp_stat_sn: 5,
        }),
        Bhs::NopIn(NopIn {
            lun,
            itt: 5,
            ttt: RESERVED_TAG,
            stat_sn: 3,
            exp_cmd_sn: 10,
            max_cmd_sn: 41,
        }),
        Bhs::ScsiRsp(ScsiResponse {
            flags: scsi::RSP_UNDERFLOW,
            response: 0,
            status: 2,
            itt: 0x1234,
            snack_tag: 0,
            stat_sn: 4,
            exp_cmd_sn: 78,
            max_cmd_sn: 109,
            exp_data_sn: 0,
            bidi_residual: 0,
            residual: 512,
        }),
        Bhs::TmfRsp(TmfResponse {
            response: tmf_response::NO_TASK,
            itt: 8,
            stat_sn: 5,
            exp_cmd_sn: 79,
            max_cmd_sn: 110,
        }),
        Bhs::LoginRsp(LoginResponse {
            flags: LoginFlags {
                transit: true,
                cont: false,
                csg: Stage::Operational,
                nsg: Stage::FullFeature,
            },
            version_max: 0,
            version_active: 0,
            isid: [0x80, 1, 2, 3, 4, 5],
            tsih: 7,
            itt: 1,
            stat_sn: 0,
            exp_cmd_sn: 1,
            max_cmd_sn: 32,
            status_class: 0,
            status_detail: 0,
        }),
        Bhs::TextRsp(TextPdu {
            immediate: false,
            final_: true,
            cont: false,
            lun: Lun::default(),
            itt: 2,
            ttt: RESERVED_TAG,
            sn: 1,
            exp_sn: 3,
            max_cmd_sn: 34,
        }),
        Bhs::DataIn(DataIn {
            flags: 0x80 | data::DATA_IN_STATUS,
            status: 0,
            lun,
            itt: 0x1234,
            ttt: RESERVED_TAG,
            stat_sn: 6,
            exp_cmd_sn: 80,
            max_cmd_sn: 111,
            data_sn: 0,
            buffer_offset: 0,
            residual: 0,
        }),
        Bhs::LogoutRsp(LogoutResponse {
            response: 0,
            itt: 9,
            stat_sn: 7,
            exp_cmd_sn: 81,
            max_cmd_sn: 112,
            time2wait: 2,
            time2retain: 0,
        }),
        Bhs::R2t(R2t {
            lun,
            itt: 0x1234,
            ttt: 0x55,
            stat_sn: 7,
            exp_cmd_sn: 81,
            max_cmd_sn: 112,
            r2t_sn: 0,
            buffer_offset: 0,
            desired_len: 65536,
        }),
        Bhs::Async(AsyncMessage {
            lun,
            stat_sn: 8,
            exp_cmd_sn: 81,
            max_cmd_sn: 112,
            event: 1,
            vcode: 0,
            param1: 0,
            param2: 0,
            param3: 5,
        }),
        Bhs::Reject(Reject {
            reason: reject_reason::PROTOCOL_ERROR,
            stat_sn: 9,
            exp_cmd_sn: 81,
            max_cmd_sn: 112,
            data_sn: 0,
        }),
    ]
}

#[test]
fn every_pdu_round_trips() {
    for bhs in all_pdus() {
        let dsl = match bhs {
            Bhs::Reject(_) => 48,
            Bhs::R2t(_) | Bhs::TmfReq(_) | Bhs::LogoutReq(_) => 0,
            Bhs::ScsiCmd(_) => 0,
            _ => 5,
        };
        let b = bhs.encode(0, dsl);
        let mut buf = b.to_vec();
        buf.extend(std::iter::repeat(0xAB).take(dsl as usize));
        // Unpadded and padded forms both parse.
        let p = Pdu::parse(&buf).unwrap_or_else(|e| panic!("{bhs:?}: {e}"));
        assert_eq!(p.bhs, bhs);
        assert_eq!(p.data.len(), dsl as usize);
        buf.resize(BHS_LEN + pad4(dsl as usize), 0);
        assert_eq!(Pdu::parse(&buf).unwrap().bhs, bhs);
    }
}

#[test]
fn byte_offsets_match_the_wire_table() {
    let all = all_pdus();
    // SCSI Command: EDTL at 20, CmdSN at 24, CDB at 32.
    let b = all[1].encode(0, 0);
    assert_eq!(b[0], 0x01);
    assert_eq!(b[1], 0x80 | 0x40 | 1);
    assert_eq!(&b[20..24], &4096u32.to_be_bytes());
    assert_eq!(&b[24..28], &77u32.to_be_bytes());
    assert_eq!(b[32], 0x28);
    assert_eq!(&b[8..16], &[0, 3, 0, 0, 0, 0, 0, 0]);
    // Login request: 0x43, T|CSG1|NSG3 = 0x87, ISID at 8, TSIH at 14.
    let b = all[3].encode(0, 10);
    assert_eq!(b[0], 0x43);
    assert_eq!(b[1], 0x87);
    assert_eq!(b[8], 0x80);
    assert_eq!(&b[5..8], &[0, 0, 10]);
    // Login response status at 36/37; TSIH.
    let b = all[10].encode(0, 0);
    assert_eq!(b[0], 0x23);
    assert_eq!(&b[14..16], &7u16.to_be_bytes());
    // SCSI Response residual at 44, status at 3.
    let b = all[8].encode(0, 0);
    assert_eq!(b[3], 2);
    assert_eq!(&b[44..48], &512u32.to_be_bytes());
    // Reject ITT reserved.
    let b = all[16].encode(0, 48);
    assert_eq!(&b[16..20], &[0xFF; 4]);
}

fn with(bhs: &Bhs, dsl: u32, f: impl FnOnce(&mut [u8; 48])) -> Result<Bhs, PduError> {
    let mut b = bhs.encode(0, dsl);
    f(&mut b);
    let mut v = b.to_vec();
    v.resize(BHS_LEN + dsl as usize, 0);
    Pdu::parse(&v).map(|p| p.bhs)
}

#[test]
fn strictness() {
    let all = all_pdus();
    let cmd = &all[1];
    // Lengths.
    assert!(matches!(
        Pdu::parse(&[0u8; 47]),
        Err(PduError::Truncated { .. })
    ));
    let mut v = cmd.encode(0, 0).to_vec();
    v.push(0);
    assert_eq!(Pdu::parse(&v), Err(PduError::Trailing(1)));
    let mut v = all[0].encode(0, 1).to_vec();
    v.extend([1, 0, 0, 9]);
    assert_eq!(Pdu::parse(&v), Err(PduError::Padding));
    let v = all[0].encode(0, 8).to_vec();
    assert!(matches!(Pdu::parse(&v), Err(PduError::Truncated { .. })));
    // Opcodes.
    assert_eq!(
        with(cmd, 0, |b| b[0] = 0x11),
        Err(PduError::BadOpcode(0x11))
    );
    assert_eq!(
        with(cmd, 0, |b| b[0] = 0x10),
        Err(PduError::Unsupported(Opcode::Snack))
    );
    assert!(with(cmd, 0, |b| b[0] |= 0x80).is_err());
    assert!(
        with(&all[8], 0, |b| b[0] |= 0x40).is_err(),
        "immediate on a target PDU"
    );
    // SCSI command fields.
    assert!(with(cmd, 0, |b| b[1] = 0x80 | 5).is_err(), "bad attr");
    assert!(with(cmd, 0, |b| b[1] = 0x80).is_err(), "EDTL without R/W");
    assert!(with(cmd, 0, |b| b[1] = 0x40).is_err(), "F=0 without W");
    assert!(
        with(cmd, 0, |b| b[16..20].fill(0xFF)).is_err(),
        "reserved ITT"
    );
    assert!(with(cmd, 8, |_| {}).is_err(), "immediate data on a read");
    assert!(with(cmd, 0, |b| b[2] = 1).is_err(), "reserved byte");
    // Login.
    let login = &all[3];
    assert!(with(login, 0, |b| b[0] = 0x03).is_err(), "not immediate");
    assert!(with(login, 0, |b| b[1] = 0xC7).is_err(), "T and C");
    assert!(
        with(login, 0, |b| b[1] = 0x80 | (2 << 2) | 3).is_err(),
        "CSG 2"
    );
    assert!(
        with(login, 0, |b| b[1] = 0x80 | (1 << 2) | 1).is_err(),
        "NSG = CSG"
    );
    assert!(
        with(login, 0, |b| b[1] = 0x80 | (1 << 2)).is_err(),
        "NSG before CSG"
    );
    assert!(with(login, 0, |b| b[3] = 1).is_err(), "version-min > max");
    // Others.
    assert!(with(&all[0], 0, |b| b[1] = 0).is_err(), "NOP-Out without F");
    assert!(
        with(&all[0], 0, |b| {
            b[0] = 0x00;
            b[16..20].fill(0xFF);
        })
        .is_err(),
        "NOP-Out reserved ITT not immediate"
    );
    assert!(
        with(&all[2], 0, |b| b[1] = 0x80 | 9).is_err(),
        "TMF function"
    );
    assert!(with(&all[6], 0, |b| b[1] = 0x83).is_err(), "logout reason");
    assert!(
        with(&all[14], 0, |b| b[44..48].fill(0)).is_err(),
        "R2T length 0"
    );
    assert!(with(&all[16], 4, |_| {}).is_err(), "reject without BHS");
    assert!(with(&all[8], 0, |b| b[1] |= 0x06).is_err(), "O and U");
    assert!(with(&all[4], 0, |b| b[1] = 0xC0).is_err(), "text F and C");
}

#[test]
fn ahs_is_validated_in_place() {
    let cmd = all_pdus()[1];
    let mut v = cmd.encode(2, 0).to_vec();
    v.extend([0, 5, 2, 0, 0, 0, 0x10, 0]);
    assert!(Pdu::parse(&v).is_ok());
    let n = v.len();
    v[n - 6] = 9; // type 9 is reserved
    assert!(matches!(Pdu::parse(&v), Err(PduError::BadAhs(_))));
}
