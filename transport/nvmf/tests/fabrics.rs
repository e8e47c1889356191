//! Connect, Property Get/Set and the enable / shutdown sequence, end to end
//! over the loopback transport.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use pollux_nvmf::loopback_host::{HostData, HostQueue};
use pollux_nvmf::spec::cmd::{AdminOpcode, FabricsType, NvmeCmd};
use pollux_nvmf::spec::connect::{parse_invalid_param_dw0, ConnectCmd, CNTLID_DYNAMIC};
use pollux_nvmf::spec::cpl::NvmeStatus;
use pollux_nvmf::spec::identify::{cns, IdentifyController};
use pollux_nvmf::spec::property::{
    ofst, Cap, Cc, Csts, PropertyCmd, PropertySize, SHN_NORMAL, SHST_COMPLETE,
};
use pollux_nvmf::target::{LoopbackQueueOptions, SubsystemConfig, DISCOVERY_NQN};

#[test]
fn connect_enable_identify_controller() {
    let fx = Fx::new();
    let d = fx.drive();
    let r = fx.cluster.reactor(0);
    let mut q = fx
        .host
        .open(&r, &fx.trid, LoopbackQueueOptions::admin())
        .unwrap();
    let c = fx
        .host
        .connect(&mut q, SUB1, 0, 31, 0, CNTLID_DYNAMIC, &d)
        .unwrap();
    assert_eq!(c.cpl.status, NvmeStatus::SUCCESS);
    assert_eq!(c.cpl.sqid, 0);
    assert!(
        c.key_invalidated,
        "connect data SGL asked for remote invalidation"
    );
    let cntlid = c.cpl.dw0 as u16;
    assert!((1..0xFFF0).contains(&cntlid));
    assert_eq!(c.cpl.dw0 >> 16, 0, "no authentication flags");

    // Before CC.EN: admin commands are a sequence error.
    let early = fx.identify(&mut q, cns::CONTROLLER, 0);
    assert_eq!(early.cpl.status, NvmeStatus::COMMAND_SEQUENCE_ERROR);

    let cap = Cap::from_u64(q.property_get(ofst::CAP, PropertySize::Eight, &d).unwrap());
    assert_eq!(cap.mqes, 127);
    assert_eq!(cap.to, 15);
    assert_eq!(cap.css, 1, "NVM command set only: no 2.0 I/O command sets");
    assert!(cap.cqr, "NVMe over Fabrics requires contiguous queues");
    assert_eq!(cap.mpsmin, 0);
    assert_eq!(
        q.property_get(ofst::VS, PropertySize::Four, &d).unwrap(),
        0x0001_0400,
        "NVMe 1.4"
    );
    q.enable(&d).unwrap();
    let csts = Csts::from_u32(q.property_get(ofst::CSTS, PropertySize::Four, &d).unwrap() as u32);
    assert!(csts.rdy && !csts.cfs);

    let c = fx.identify(&mut q, cns::CONTROLLER, 0);
    assert_eq!(c.cpl.status, NvmeStatus::SUCCESS);
    let id = IdentifyController::parse(&c.data.unwrap()).unwrap();
    assert_eq!(id.cntlid, cntlid, "must match the Connect");
    assert_eq!(id.subnqn, SUB1);
    assert_eq!(id.cntrltype, 1);
    assert_eq!(id.ver, 0x0001_0400, "VER matches VS");
    assert_eq!(id.ctratt, 1, "128-bit host identifier");
    assert_eq!(id.oaes, 1 << 8, "namespace attribute notices");
    assert_eq!(id.lpa & 0x6, 0x6, "effects log and extended data");
    assert_eq!(
        id.vwc, 0x5,
        "cache present; no broadcast Flush (1.4 VWC 2:1 = 10b)"
    );
    assert_eq!(id.sqes, 0x66);
    assert_eq!(id.cqes, 0x44);
    assert_eq!(id.kas, 10);
    assert_eq!(id.ioccsz, (64 + 4096) / 16);
    assert_eq!(id.iorcsz, 1);
    assert_eq!(id.icdoff, 0);
    assert_eq!(id.msdbd, 1);
    assert_eq!(id.sgls, 0x1 | 0x4 | (1 << 20));
    assert_eq!(id.mdts, 5, "128 KiB");
    assert_eq!(id.maxcmd, 128);
    assert_eq!(id.aerl, 3);
    assert_eq!(id.vwc & 1, 1);
    assert_eq!(id.oaes, 1 << 8);
    assert!(id.psd0_max_power != 0);
    assert_eq!(id.sn, fx.sub1.serial());
    assert_eq!(fx.target.controller_count(), 1);
}

#[test]
fn property_rules() {
    let fx = Fx::new();
    let d = fx.drive();
    let mut q = fx.admin();
    let st = |q: &mut pollux_nvmf::loopback_host::HostQueue, cmd: NvmeCmd| {
        fx.exec(q, cmd, HostData::None).cpl.status
    };
    // CAP only as 8 bytes, VS/CC/CSTS only as 4.
    assert_eq!(
        st(&mut q, PropertyCmd::get(ofst::CAP, PropertySize::Four, 0)),
        NvmeStatus::INVALID_FIELD
    );
    assert_eq!(
        st(&mut q, PropertyCmd::get(ofst::VS, PropertySize::Eight, 0)),
        NvmeStatus::INVALID_FIELD
    );
    assert_eq!(
        st(&mut q, PropertyCmd::get(0x24, PropertySize::Four, 0)),
        NvmeStatus::INVALID_FIELD
    );
    // Only CC is writable.
    assert_eq!(
        st(&mut q, PropertyCmd::set(ofst::VS, PropertySize::Four, 1, 0)),
        NvmeStatus::INVALID_FIELD
    );
    assert_eq!(
        st(
            &mut q,
            PropertyCmd::set(ofst::CC, PropertySize::Eight, 1, 0)
        ),
        NvmeStatus::INVALID_FIELD
    );
    // Unknown fabrics type.
    let mut odd = NvmeCmd::fabrics(FabricsType::Disconnect, 0);
    odd.nsid = 0x33;
    assert_eq!(st(&mut q, odd), NvmeStatus::INVALID_OPCODE);
    // A second Connect on a connected queue.
    let cc = ConnectCmd {
        qid: 0,
        sqsize: 31,
        ..ConnectCmd::default()
    }
    .to_cmd(0);
    let data = fx.host.connect_data(SUB1, CNTLID_DYNAMIC);
    let c = fx.exec(&mut q, cc, HostData::Write(&data));
    assert_eq!(c.cpl.status, NvmeStatus::COMMAND_SEQUENCE_ERROR);

    // Normal shutdown: SHST complete, not ready; then admin commands fail.
    let mut cc = Cc::from_u32(q.property_get(ofst::CC, PropertySize::Four, &d).unwrap() as u32);
    assert!(cc.en);
    cc.shn = SHN_NORMAL;
    q.property_set(ofst::CC, cc.to_u32(), &d).unwrap();
    let csts = Csts::from_u32(q.property_get(ofst::CSTS, PropertySize::Four, &d).unwrap() as u32);
    assert_eq!(csts.shst, SHST_COMPLETE);
    assert!(!csts.rdy);
    let c = fx.identify(&mut q, cns::CONTROLLER, 0);
    assert_eq!(c.cpl.status, NvmeStatus::COMMAND_SEQUENCE_ERROR);
}

/// An admin queue on core 0 after a successful Connect, not enabled.
fn connected_admin(fx: &Fx) -> HostQueue {
    let d = fx.drive();
    let r = fx.cluster.reactor(0);
    let mut q = fx
        .host
        .open(&r, &fx.trid, LoopbackQueueOptions::admin())
        .unwrap();
    fx.host
        .connect(&mut q, SUB1, 0, 31, 0, CNTLID_DYNAMIC, &d)
        .unwrap()
        .ok()
        .unwrap();
    q
}

#[test]
fn bad_cc_sets_fatal_status() {
    let fx = Fx::new();
    let d = fx.drive();
    let mut q = connected_admin(&fx);
    let mut cc = Cc::linux_default(0);
    cc.iosqes = 7;
    cc.en = true;
    q.property_set(ofst::CC, cc.to_u32(), &d).unwrap();
    let csts = Csts::from_u32(q.property_get(ofst::CSTS, PropertySize::Four, &d).unwrap() as u32);
    assert!(csts.cfs && !csts.rdy);

    // CC.CSS = 110b needs CAP.CSS bit 6, which this 1.4 controller clears.
    let mut q = connected_admin(&fx);
    let mut cc = Cc::linux_default(6);
    cc.en = true;
    q.property_set(ofst::CC, cc.to_u32(), &d).unwrap();
    let csts = Csts::from_u32(q.property_get(ofst::CSTS, PropertySize::Four, &d).unwrap() as u32);
    assert!(csts.cfs && !csts.rdy, "CSS 6 refused");
}

#[test]
fn connect_errors() {
    let fx = Fx::new();
    let d = fx.drive();
    let r = fx.cluster.reactor(0);
    let open = || {
        fx.host
            .open(&r, &fx.trid, LoopbackQueueOptions::admin())
            .unwrap()
    };

    // Unknown subsystem: Invalid Parameters pointing at SUBNQN in the data.
    let mut q = open();
    let c = fx
        .host
        .connect(
            &mut q,
            "nqn.2024-01.io.pollux:nope",
            0,
            31,
            0,
            CNTLID_DYNAMIC,
            &d,
        )
        .unwrap();
    assert_eq!(c.cpl.status, NvmeStatus::CONNECT_INVALID_PARAMETERS);
    assert_eq!(parse_invalid_param_dw0(c.cpl.dw0), (256, true));

    // Host not allowed: Connect Invalid Host.
    fx.target
        .add_subsystem(SubsystemConfig::new(SUB2).allow_hosts([HOST2]))
        .unwrap();
    let mut q = open();
    let c = fx
        .host
        .connect(&mut q, SUB2, 0, 31, 0, CNTLID_DYNAMIC, &d)
        .unwrap();
    assert_eq!(c.cpl.status, NvmeStatus::CONNECT_INVALID_HOST);
    assert_eq!(parse_invalid_param_dw0(c.cpl.dw0), (512, true));

    // Admin Connect with a static CNTLID.
    let mut q = open();
    let c = fx.host.connect(&mut q, SUB1, 0, 31, 0, 5, &d).unwrap();
    assert_eq!(c.cpl.status, NvmeStatus::CONNECT_INVALID_PARAMETERS);
    assert_eq!(parse_invalid_param_dw0(c.cpl.dw0), (16, true));

    // SQSIZE 0 and SQSIZE beyond the queue's depth: offset 44 in the SQE.
    let mut q = open();
    let c = fx
        .host
        .connect(&mut q, SUB1, 0, 0, 0, CNTLID_DYNAMIC, &d)
        .unwrap();
    assert_eq!(parse_invalid_param_dw0(c.cpl.dw0), (44, false));
    let c = fx
        .host
        .connect(&mut q, SUB1, 0, 32, 0, CNTLID_DYNAMIC, &d)
        .unwrap();
    assert_eq!(c.cpl.status, NvmeStatus::CONNECT_INVALID_PARAMETERS);
    assert_eq!(parse_invalid_param_dw0(c.cpl.dw0), (44, false));

    // RECFMT != 0.
    let mut cmd = ConnectCmd {
        qid: 0,
        sqsize: 31,
        recfmt: 1,
        ..ConnectCmd::default()
    }
    .to_cmd(0);
    cmd.cid = 0;
    let data = fx.host.connect_data(SUB1, CNTLID_DYNAMIC);
    let c = fx.exec(&mut q, cmd, HostData::Write(&data));
    assert_eq!(c.cpl.status, NvmeStatus::CONNECT_INCOMPATIBLE_FORMAT);

    // Anything but Connect on an unconnected queue.
    let c = fx.exec(
        &mut q,
        NvmeCmd::new(AdminOpcode::KeepAlive.code(), 0),
        HostData::None,
    );
    assert_eq!(c.cpl.status, NvmeStatus::INVALID_OPCODE);

    // Connect data of the wrong length.
    let cmd = ConnectCmd {
        qid: 0,
        sqsize: 31,
        ..ConnectCmd::default()
    }
    .to_cmd(0);
    let c = fx.exec(&mut q, cmd, HostData::Write(&data[..512]));
    assert_eq!(c.cpl.status, NvmeStatus::DATA_SGL_LENGTH_INVALID);

    // Nothing leaked: no controller was created by any of these.
    assert_eq!(fx.target.controller_count(), 0);
    assert!(fx.target.subsystem(DISCOVERY_NQN).is_some());
}

#[test]
fn io_queue_connect_rules() {
    let fx = Fx::new();
    let d = fx.drive();
    let r = fx.cluster.reactor(0);
    let mut admin = fx.admin();
    let cntlid = admin.cntlid.unwrap();
    assert_eq!(admin.set_num_queues(2, &d).unwrap(), 2);
    let open = || {
        fx.host
            .open(&r, &fx.trid, LoopbackQueueOptions::io(32))
            .unwrap()
    };

    // Unknown controller id: Invalid Parameters at CNTLID in the data.
    let mut q = open();
    let c = fx
        .host
        .connect(&mut q, SUB1, 1, 31, 0, cntlid + 1, &d)
        .unwrap();
    assert_eq!(c.cpl.status, NvmeStatus::CONNECT_INVALID_PARAMETERS);
    assert_eq!(parse_invalid_param_dw0(c.cpl.dw0), (16, true));

    // Another host may not attach queues to this controller.
    let other = pollux_nvmf::loopback_host::LoopbackHost::new(&fx.lt, &fx.target, HOST2);
    let mut q = open();
    let c = other.connect(&mut q, SUB1, 1, 31, 0, cntlid, &d).unwrap();
    assert_eq!(parse_invalid_param_dw0(c.cpl.dw0), (16, true));

    // QID above the granted count: offset 42 in the SQE.
    let c = fx.host.connect(&mut q, SUB1, 3, 31, 0, cntlid, &d).unwrap();
    assert_eq!(c.cpl.status, NvmeStatus::CONNECT_INVALID_PARAMETERS);
    assert_eq!(parse_invalid_param_dw0(c.cpl.dw0), (42, false));

    // A good one, then the same QID again: Command Sequence Error.
    let c = fx.host.connect(&mut q, SUB1, 2, 31, 0, cntlid, &d).unwrap();
    assert_eq!(c.cpl.status, NvmeStatus::SUCCESS);
    assert_eq!(c.cpl.sqid, 2);
    assert_eq!(c.cpl.dw0 as u16, cntlid);
    let mut q2 = open();
    let c = fx
        .host
        .connect(&mut q2, SUB1, 2, 31, 0, cntlid, &d)
        .unwrap();
    assert_eq!(c.cpl.status, NvmeStatus::COMMAND_SEQUENCE_ERROR);

    // Number of Queues cannot change once I/O queues exist.
    let c = fx.exec(
        &mut admin,
        pollux_nvmf::spec::features::FeatureCmd::set(0x07, 0x0003_0003, 0),
        HostData::None,
    );
    assert_eq!(c.cpl.status, NvmeStatus::COMMAND_SEQUENCE_ERROR);

    let ctrl = fx.sub1.controller(cntlid).unwrap();
    assert_eq!(ctrl.io_qids(), vec![2]);
    // Dropping the host end of the I/O queue releases its QID.
    drop(q);
    d();
    assert!(ctrl.io_qids().is_empty());

    // The discovery subsystem has no I/O queues.
    let mut dq = fx.admin_to(DISCOVERY_NQN, 0);
    let dcnt = dq.cntlid.unwrap();
    let mut q = open();
    let c = fx
        .host
        .connect(&mut q, DISCOVERY_NQN, 1, 31, 0, dcnt, &d)
        .unwrap();
    assert_eq!(parse_invalid_param_dw0(c.cpl.dw0), (42, false));
    let _ = &mut dq;
}

#[test]
fn disconnecting_the_admin_queue_frees_the_controller_and_its_cntlid_range() {
    let fx = Fx::new();
    let d = fx.drive();
    let mut admin = fx.admin();
    let mut io = fx.io_on(&mut admin, 0);
    let cntlid = admin.cntlid.unwrap();
    assert_eq!(fx.sub1.controller_count(), 1);
    drop(admin);
    d();
    assert_eq!(fx.sub1.controller_count(), 0);
    assert!(fx.sub1.controller(cntlid).is_none());
    // Its I/O queue was torn down by the target.
    assert!(!io.is_connected());
    assert!(io.endpoint().closed_by_target());
    let e = io.submit(NvmeCmd::new(0, 0), HostData::None);
    assert!(e.is_err());
    // A new association gets a fresh cntlid.
    let again = fx.admin();
    assert_ne!(again.cntlid, Some(cntlid));
}

#[test]
fn a_reset_after_a_refused_enable_brings_the_controller_up() {
    let fx = Fx::new();
    let d = fx.drive();
    let mut q = connected_admin(&fx);
    let csts = |q: &mut HostQueue| {
        Csts::from_u32(q.property_get(ofst::CSTS, PropertySize::Four, &d).unwrap() as u32)
    };
    // An unsupported configuration: CSTS.CFS, not ready.
    let mut bad = Cc::linux_default(0);
    bad.iosqes = 7;
    bad.en = true;
    q.property_set(ofst::CC, bad.to_u32(), &d).unwrap();
    let s = csts(&mut q);
    assert!(s.cfs && !s.rdy);
    // Reset (CC.EN 1 → 0), then enable with a good configuration: the
    // controller starts (as the Linux target's nvmet_start_ctrl), and
    // never reports RDY while it refuses every command.
    q.property_set(ofst::CC, 0, &d).unwrap();
    q.enable(&d).unwrap();
    let s = csts(&mut q);
    assert!(s.rdy && !s.cfs, "{s:?}");
    let c = fx.identify(&mut q, cns::CONTROLLER, 0);
    assert_eq!(c.cpl.status, NvmeStatus::SUCCESS);
}
