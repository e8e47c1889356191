//! Admin commands end to end over the loopback transport: Identify, Set/Get
//! Features, Get Log Page, AER, Abort and Keep Alive (with the manual clock).
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use pollux_nvmf::loopback_host::{HostData, HostQueue};
use pollux_nvmf::spec::cmd::{AbortCmd, AdminOpcode, NvmeCmd};
use pollux_nvmf::spec::cpl::NvmeStatus;
use pollux_nvmf::spec::features::{fid, AsyncEvent, FeatureCmd, AEN_NS_ATTR};
use pollux_nvmf::spec::identify::{
    cns, parse_ns_id_descriptors, parse_ns_list, IdentifyNamespace, NsIdDescriptor,
};
use pollux_nvmf::spec::log_page::{lid, ErrorLogEntry, GetLogPageCmd, SmartLog};
use pollux_nvmf::target::{NamespaceConfig, SubsystemConfig, Target, TargetOptions};

fn log(
    fx: &Fx,
    q: &mut HostQueue,
    id: u8,
    len: u64,
    rae: bool,
) -> pollux_nvmf::loopback_host::Completed {
    let cmd = GetLogPageCmd::to_cmd(id, 0xFFFF_FFFF, len, 0, rae, 0).unwrap();
    fx.exec(q, cmd, HostData::Read(len as u32))
}

#[test]
fn identify_namespaces() {
    let fx = Fx::new();
    let mut q = fx.admin();
    let m2 = fx
        .registry
        .create("malloc:size=64K,block=4096,name=m2")
        .unwrap();
    fx.sub1
        .add_namespace(NamespaceConfig::new(m2).with_nsid(5))
        .unwrap();

    let c = fx.identify(&mut q, cns::ACTIVE_NS_LIST, 0);
    assert_eq!(parse_ns_list(&c.data.unwrap()).unwrap(), vec![1, 5]);
    let c = fx.identify(&mut q, cns::ACTIVE_NS_LIST, 1);
    assert_eq!(parse_ns_list(&c.data.unwrap()).unwrap(), vec![5]);
    let c = fx.identify(&mut q, cns::ACTIVE_NS_LIST, 0xFFFF_FFFF);
    assert_eq!(c.cpl.status, NvmeStatus::INVALID_NAMESPACE);

    let c = fx.identify(&mut q, cns::NAMESPACE, 1);
    let ns = IdentifyNamespace::parse(&c.data.unwrap()).unwrap();
    assert_eq!((ns.nsze, ns.ncap, ns.nuse), (BLOCKS, BLOCKS, BLOCKS));
    assert_eq!(ns.block_size(), Some(512));
    assert_eq!(ns.nmic & 1, 1);
    let ns5 =
        IdentifyNamespace::parse(&fx.identify(&mut q, cns::NAMESPACE, 5).data.unwrap()).unwrap();
    assert_eq!((ns5.nsze, ns5.block_size()), (16, Some(4096)));
    // Inactive NSID: zeroes; NSID 0 / broadcast: Invalid Namespace.
    let c = fx.identify(&mut q, cns::NAMESPACE, 3);
    assert_eq!(c.cpl.status, NvmeStatus::SUCCESS);
    assert!(c.data.unwrap().iter().all(|&b| b == 0));
    assert_eq!(
        fx.identify(&mut q, cns::NAMESPACE, 0).cpl.status,
        NvmeStatus::INVALID_NAMESPACE
    );

    let c = fx.identify(&mut q, cns::NS_ID_DESCRIPTORS, 1);
    let d = parse_ns_id_descriptors(&c.data.unwrap()).unwrap();
    let ns1 = fx.sub1.namespace(1).unwrap();
    assert_eq!(
        d,
        vec![
            NsIdDescriptor::Eui64(ns1.eui64()),
            NsIdDescriptor::Nguid(ns1.nguid()),
            NsIdDescriptor::Uuid(ns1.uuid()),
            NsIdDescriptor::Csi(0),
        ]
    );
    assert_eq!(ns.nguid, ns1.nguid());
    assert_eq!(ns.eui64, ns1.eui64());
    assert_eq!(
        fx.identify(&mut q, cns::NS_ID_DESCRIPTORS, 2).cpl.status,
        NvmeStatus::INVALID_NAMESPACE
    );
    // CNS 6 (NVM command set controller) is all zero; unknown CNS is invalid.
    let c = fx.identify(&mut q, cns::CSI_CONTROLLER, 0);
    assert!(c.data.unwrap().iter().all(|&b| b == 0));
    assert_eq!(
        fx.identify(&mut q, 0x1F, 0).cpl.status,
        NvmeStatus::INVALID_FIELD
    );
    // Identify with a short buffer.
    let c = fx.exec(
        &mut q,
        pollux_nvmf::spec::identify::IdentifyCmd::to_cmd(1, 0, 0),
        HostData::Read(512),
    );
    assert_eq!(c.cpl.status, NvmeStatus::DATA_SGL_LENGTH_INVALID);
}

#[test]
fn namespace_ids_survive_a_restart() {
    let ids = || {
        let t = Target::new(TargetOptions::for_tests()).unwrap();
        let s = t.add_subsystem(SubsystemConfig::new(SUB1)).unwrap();
        let reg = pollux_bdev::BdevRegistry::new();
        let b = reg.create("malloc:size=64K,block=512,name=x").unwrap();
        s.add_namespace(NamespaceConfig::new(b).with_nsid(3))
            .unwrap();
        let ns = s.namespace(3).unwrap();
        (ns.nguid(), ns.eui64(), ns.uuid(), s.serial().to_owned())
    };
    let a = ids();
    assert_eq!(a, ids());
    let uuid = a.2;
    assert_eq!(uuid[6] >> 4, 8, "RFC 9562 version 8");
    assert_eq!(uuid[8] >> 6, 2, "RFC 9562 variant");
}

#[test]
fn features() {
    let fx = Fx::new();
    let d = fx.drive();
    let mut q = fx.admin();
    let get = |q: &mut HostQueue, f: u8| fx.exec(q, FeatureCmd::get(f, 0), HostData::None).cpl;
    let set =
        |q: &mut HostQueue, f: u8, v: u32| fx.exec(q, FeatureCmd::set(f, v, 0), HostData::None).cpl;

    // Number of Queues: asks for 200, the subsystem allows 127.
    let c = set(&mut q, fid::NUMBER_OF_QUEUES, 0x00C7_00C7);
    assert_eq!(c.status, NvmeStatus::SUCCESS);
    assert_eq!(c.dw0, 0x007E_007E);
    assert_eq!(get(&mut q, fid::NUMBER_OF_QUEUES).dw0, 0x007E_007E);
    assert_eq!(
        set(&mut q, fid::NUMBER_OF_QUEUES, 0xFFFF_0000).status,
        NvmeStatus::INVALID_FIELD
    );
    assert_eq!(q.set_num_queues(3, &d).unwrap(), 3);

    // Keep-alive timer and async event configuration read back.
    assert_eq!(
        set(&mut q, fid::KEEP_ALIVE_TIMER, 30_000).status,
        NvmeStatus::SUCCESS
    );
    assert_eq!(get(&mut q, fid::KEEP_ALIVE_TIMER).dw0, 30_000);
    assert_eq!(
        set(&mut q, fid::ASYNC_EVENT_CONFIG, 0xFFFF_FFFF).status,
        NvmeStatus::SUCCESS
    );
    assert_eq!(
        get(&mut q, fid::ASYNC_EVENT_CONFIG).dw0,
        AEN_NS_ATTR,
        "only supported events stick"
    );
    assert_eq!(get(&mut q, fid::VOLATILE_WRITE_CACHE).dw0, 1);
    assert_eq!(get(&mut q, 0x7D).status, NvmeStatus::INVALID_FIELD);
    assert_eq!(set(&mut q, 0x7D, 0).status, NvmeStatus::INVALID_FIELD);

    // Host identifier: 16 bytes with EXHID, Set is a sequence error.
    let mut hid = FeatureCmd::get(fid::HOST_IDENTIFIER, 0);
    hid.cdw11 = 1;
    let c = fx.exec(&mut q, hid, HostData::Read(16));
    assert_eq!(c.cpl.status, NvmeStatus::SUCCESS);
    assert_eq!(c.data.unwrap(), fx.host.hostid.to_vec());
    hid.cdw11 = 0;
    assert_eq!(
        fx.exec(&mut q, hid, HostData::Read(16)).cpl.status,
        NvmeStatus::INVALID_FIELD
    );
    assert_eq!(
        set(&mut q, fid::HOST_IDENTIFIER, 1).status,
        NvmeStatus::COMMAND_SEQUENCE_ERROR
    );

    // Fabrics-invalid admin opcodes.
    for op in [0x00u8, 0x01, 0x04, 0x05, 0x80, 0xC0] {
        assert_eq!(
            fx.exec(&mut q, NvmeCmd::new(op, 0), HostData::None)
                .cpl
                .status,
            NvmeStatus::INVALID_OPCODE,
            "opcode {op:#x}"
        );
    }
}

#[test]
fn logs_smart_error_and_bad_requests() {
    let fx = Fx::new();
    let mut q = fx.admin();
    // Make an error, then read the error log.
    let bad = fx.exec(&mut q, NvmeCmd::new(0x7E, 0), HostData::None);
    assert_eq!(bad.cpl.status, NvmeStatus::INVALID_OPCODE);
    let c = log(&fx, &mut q, lid::ERROR, 64, false);
    let e = ErrorLogEntry::parse(&c.data.unwrap()).unwrap();
    assert_eq!(e.error_count, 1);
    assert_eq!((e.sqid, e.cid, e.opcode), (0, bad.cpl.cid, 0x7E));
    assert_eq!(e.status, NvmeStatus::INVALID_OPCODE.to_field());
    assert_eq!(e.trtype, 254);
    assert_eq!(e.param_error_location, 0, "the opcode byte");

    let c = log(&fx, &mut q, lid::SMART, 512, false);
    let s = SmartLog::parse(&c.data.unwrap()).unwrap();
    assert_eq!(s.available_spare, 100);
    assert!(
        (200..400).contains(&s.temperature),
        "a machine temperature in kelvin: {}",
        s.temperature
    );
    assert_eq!(s.critical_warning & 2, u8::from(s.temperature >= 343) << 1);
    assert_eq!(s.num_err_log_entries, 1);

    // Offsets: a slice at LPO 16 of the SMART log, unaligned LPO, past the end.
    let cmd = GetLogPageCmd::to_cmd(lid::SMART, 0xFFFF_FFFF, 16, 16, false, 0).unwrap();
    let c = fx.exec(&mut q, cmd, HostData::Read(16));
    assert_eq!(c.cpl.status, NvmeStatus::SUCCESS);
    let mut cmd = GetLogPageCmd::to_cmd(lid::SMART, 0xFFFF_FFFF, 16, 16, false, 0).unwrap();
    cmd.cdw12 = 2;
    assert_eq!(
        fx.exec(&mut q, cmd, HostData::Read(16)).cpl.status,
        NvmeStatus::INVALID_FIELD
    );
    let cmd = GetLogPageCmd::to_cmd(lid::SMART, 0xFFFF_FFFF, 16, 4096, false, 0).unwrap();
    assert_eq!(
        fx.exec(&mut q, cmd, HostData::Read(16)).cpl.status,
        NvmeStatus::INVALID_FIELD
    );
    // Unknown and discovery-only logs, and ANA without ANA reporting
    // (CMIC bit 3 clear): Invalid Log Page.
    for id in [0x55, lid::DISCOVERY, lid::ANA] {
        assert_eq!(
            log(&fx, &mut q, id, 1024, false).cpl.status,
            NvmeStatus::INVALID_LOG_PAGE,
            "log {id:#x}"
        );
    }
    // The error log points at the field in error: the LID (CDW10), the
    // unaligned offset (CDW12), the CNS (CDW10).
    let c = log(&fx, &mut q, lid::ERROR, 64 * 6, false);
    let d = c.data.unwrap();
    let e: Vec<ErrorLogEntry> = d
        .chunks(64)
        .map(|b| ErrorLogEntry::parse(b).unwrap())
        .collect();
    assert_eq!(e[0].status, NvmeStatus::INVALID_LOG_PAGE.to_field());
    assert_eq!(e[0].param_error_location, 40);
    assert_eq!(e[3].status, NvmeStatus::INVALID_FIELD.to_field());
    // Past the end and unaligned: the offset.
    assert_eq!(
        (e[3].param_error_location, e[4].param_error_location),
        (48, 48)
    );
    assert_eq!(e[5].status, NvmeStatus::INVALID_OPCODE.to_field());
    let bad_cns = fx.identify(&mut q, 0x42, 0);
    assert_eq!(bad_cns.cpl.status, NvmeStatus::INVALID_FIELD);
    let c = log(&fx, &mut q, lid::ERROR, 64, false);
    let e = ErrorLogEntry::parse(&c.data.unwrap()).unwrap();
    assert_eq!((e.cid, e.param_error_location), (bad_cns.cpl.cid, 40));
}

#[test]
fn aer_completes_on_namespace_change_with_the_changed_list() {
    let fx = Fx::new();
    let mut q = fx.admin();
    let set = FeatureCmd::set(fid::ASYNC_EVENT_CONFIG, AEN_NS_ATTR, 0);
    assert_eq!(
        fx.exec(&mut q, set, HostData::None).cpl.status,
        NvmeStatus::SUCCESS
    );
    let aer = q
        .submit(
            NvmeCmd::new(AdminOpcode::AsyncEventRequest.code(), 0),
            HostData::None,
        )
        .unwrap();
    fx.drive()();
    q.poll();
    assert!(q.take(aer).is_none(), "an AER waits for an event");

    let m2 = fx
        .registry
        .create("malloc:size=64K,block=512,name=m2")
        .unwrap();
    let nsid = fx.sub1.add_namespace(NamespaceConfig::new(m2)).unwrap();
    assert_eq!(nsid, 2);
    fx.drive()();
    q.poll();
    let c = q.take(aer).unwrap();
    assert_eq!(c.cpl.status, NvmeStatus::SUCCESS);
    assert_eq!(AsyncEvent::from_dw0(c.cpl.dw0), AsyncEvent::NS_CHANGED);

    // More changes while the notice is masked: no new event until the log is read.
    fx.sub1.remove_namespace(1).unwrap();
    let aer2 = q
        .submit(
            NvmeCmd::new(AdminOpcode::AsyncEventRequest.code(), 0),
            HostData::None,
        )
        .unwrap();
    fx.drive()();
    q.poll();
    assert!(q.take(aer2).is_none());

    // RAE keeps the list; a read without RAE clears it and unmasks.
    let c = log(&fx, &mut q, lid::CHANGED_NS_LIST, 4096, true);
    let list = pollux_nvmf::spec::identify::parse_ns_list(&c.data.unwrap()).unwrap();
    assert_eq!(list, vec![1, 2]);
    let c = log(&fx, &mut q, lid::CHANGED_NS_LIST, 4096, false);
    assert_eq!(
        pollux_nvmf::spec::identify::parse_ns_list(&c.data.unwrap()).unwrap(),
        vec![1, 2]
    );
    let c = log(&fx, &mut q, lid::CHANGED_NS_LIST, 4096, false);
    assert!(c.data.unwrap().iter().all(|&b| b == 0));
    let m3 = fx
        .registry
        .create("malloc:size=64K,block=512,name=m3")
        .unwrap();
    fx.sub1
        .add_namespace(NamespaceConfig::new(m3).with_nsid(7))
        .unwrap();
    fx.drive()();
    q.poll();
    assert_eq!(
        AsyncEvent::from_dw0(q.take(aer2).unwrap().cpl.dw0),
        AsyncEvent::NS_CHANGED
    );

    // Removed namespace: I/O to it is Invalid Namespace, the new one works.
    let mut admin = q;
    let mut io = fx.io_on(&mut admin, 0);
    assert_eq!(
        fx.read(&mut io, 1, 0, 1).cpl.status,
        NvmeStatus::INVALID_NAMESPACE
    );
    assert_eq!(
        fx.write(&mut io, 7, 0, &pattern(512, 1)),
        NvmeStatus::SUCCESS
    );
    assert_eq!(fx.read(&mut io, 7, 0, 1).data.unwrap(), pattern(512, 1));
}

#[test]
fn aer_limit_and_abort() {
    let fx = Fx::new();
    let mut q = fx.admin();
    let aer = || NvmeCmd::new(AdminOpcode::AsyncEventRequest.code(), 0);
    let cids: Vec<u16> = (0..4)
        .map(|_| q.submit(aer(), HostData::None).unwrap())
        .collect();
    let c = fx.exec(&mut q, aer(), HostData::None);
    assert_eq!(c.cpl.status, NvmeStatus::AER_LIMIT_EXCEEDED);

    // Abort the second AER: it completes with Abort Requested, DW0 = 0.
    let mut abort = NvmeCmd::new(AdminOpcode::Abort.code(), 0);
    abort.cdw10 = AbortCmd {
        sqid: 0,
        cid: cids[1],
    }
    .cdw10();
    let c = fx.exec(&mut q, abort, HostData::None);
    assert_eq!((c.cpl.status, c.cpl.dw0), (NvmeStatus::SUCCESS, 0));
    let aborted = q.take(cids[1]).unwrap();
    assert_eq!(aborted.cpl.status, NvmeStatus::ABORT_REQUESTED);
    // Aborting an unknown command: "not aborted".
    abort.cdw10 = AbortCmd { sqid: 1, cid: 77 }.cdw10();
    let c = fx.exec(&mut q, abort, HostData::None);
    assert_eq!((c.cpl.status, c.cpl.dw0), (NvmeStatus::SUCCESS, 1));
    // Room for one more AER now.
    let more = q.submit(aer(), HostData::None).unwrap();
    fx.drive()();
    q.poll();
    assert!(q.take(more).is_none());
}

#[test]
fn keep_alive_expiry_tears_the_controller_down() {
    let fx = Fx::new();
    let d = fx.drive();
    let mut admin = fx.admin_to(SUB1, 10_000);
    let mut io = fx.io_on(&mut admin, 0);
    let cntlid = admin.cntlid.unwrap();
    let ka = || NvmeCmd::new(AdminOpcode::KeepAlive.code(), 0);

    // Keep-alives every 6 s keep it alive well past the 10 s timeout.
    for _ in 0..5 {
        fx.cluster.advance(Duration::from_secs(6));
        d();
        assert_eq!(
            fx.exec(&mut admin, ka(), HostData::None).cpl.status,
            NvmeStatus::SUCCESS
        );
    }
    assert!(fx.sub1.controller(cntlid).is_some());

    // Silence: after the timeout the controller is gone, its queues closed.
    fx.cluster.advance(Duration::from_secs(6));
    d();
    assert!(fx.sub1.controller(cntlid).is_some(), "6 s < 10 s");
    fx.cluster.advance(Duration::from_secs(6));
    d();
    assert!(fx.sub1.controller(cntlid).is_none());
    assert_eq!(fx.target.controller_count(), 0);
    assert!(!admin.is_connected() && admin.endpoint().closed_by_target());
    assert!(!io.is_connected());
    assert!(io.submit(ka(), HostData::None).is_err());
    // Its cntlid is free again and a new association works.
    let again = fx.admin();
    assert!(again.cntlid.is_some());
}

#[test]
fn keep_alive_without_kato_is_invalid() {
    let fx = Fx::new();
    let mut q = fx.admin();
    let c = fx.exec(
        &mut q,
        NvmeCmd::new(AdminOpcode::KeepAlive.code(), 0),
        HostData::None,
    );
    assert_eq!(c.cpl.status, NvmeStatus::KEEP_ALIVE_INVALID);
    // Setting KATO later arms the timer.
    fx.exec(
        &mut q,
        FeatureCmd::set(fid::KEEP_ALIVE_TIMER, 1000, 0),
        HostData::None,
    );
    let cntlid = q.cntlid.unwrap();
    fx.cluster.advance(Duration::from_millis(1500));
    fx.drive()();
    assert!(fx.sub1.controller(cntlid).is_none());
}

#[test]
fn effects_log_lists_exactly_what_executes() {
    use pollux_nvmf::spec::log_page::{cmd_effects_of, effects};
    let fx = Fx::new();
    let mut q = fx.admin();
    let mut io = fx.io_on(&mut q, 0);
    let c = log(&fx, &mut q, lid::CMD_EFFECTS, 4096, false);
    assert_eq!(c.cpl.status, NvmeStatus::SUCCESS);
    let b = c.data.unwrap();
    assert_eq!(
        cmd_effects_of(&b, false, 0x01).unwrap(),
        effects::CSUPP | effects::LBCC,
        "Write changes block content"
    );
    for op in 0..=255u8 {
        // Fabrics commands are not in the log; an AER would wait.
        if op == 0x7F || op == AdminOpcode::AsyncEventRequest.code() {
            continue;
        }
        let supported = cmd_effects_of(&b, true, op).unwrap() & effects::CSUPP != 0;
        let st = fx
            .exec(&mut q, NvmeCmd::new(op, 0), HostData::None)
            .cpl
            .status;
        assert_eq!(
            st != NvmeStatus::INVALID_OPCODE,
            supported,
            "admin {op:#x}: {st:?}"
        );
        let supported = cmd_effects_of(&b, false, op).unwrap() & effects::CSUPP != 0;
        let mut cmd = NvmeCmd::new(op, 0);
        cmd.nsid = 1;
        let st = fx.exec(&mut io, cmd, HostData::None).cpl.status;
        assert_eq!(
            st != NvmeStatus::INVALID_OPCODE,
            supported,
            "I/O {op:#x}: {st:?}"
        );
    }
}

#[test]
fn identify_namespace_optimal_io_hints() {
    use pollux_nvmf::spec::identify::NSFEAT_OPTPERF;
    let fx = Fx::new();
    let mut q = fx.admin();
    let ns =
        IdentifyNamespace::parse(&fx.identify(&mut q, cns::NAMESPACE, 1).data.unwrap()).unwrap();
    assert_eq!(ns.nsfeat & NSFEAT_OPTPERF, NSFEAT_OPTPERF);
    let o = ns.opt_io;
    // 4 KiB units of 512-byte blocks (0-based), NOWS = MDTS (128 KiB).
    assert_eq!((o.npwg, o.npwa, o.npdg, o.npda), (7, 7, 7, 7));
    assert_eq!(o.nows, 255);
    let m2 = fx
        .registry
        .create("malloc:size=64K,block=4096,name=m2")
        .unwrap();
    fx.sub1
        .add_namespace(NamespaceConfig::new(m2).with_nsid(2))
        .unwrap();
    let ns =
        IdentifyNamespace::parse(&fx.identify(&mut q, cns::NAMESPACE, 2).data.unwrap()).unwrap();
    assert_eq!((ns.opt_io.npwg, ns.opt_io.nows), (0, 31));
}

#[test]
fn temperature_threshold_and_unsafe_shutdowns() {
    use pollux_nvmf::spec::property::{ofst, Cc, PropertySize};
    let fx = Fx::new();
    let d = fx.drive();
    let mut q = fx.admin();
    let smart = |q: &mut HostQueue| {
        SmartLog::parse(&log(&fx, q, lid::SMART, 512, false).data.unwrap()).unwrap()
    };
    let get = |q: &mut HostQueue, cdw11: u32| {
        let mut c = FeatureCmd::get(fid::TEMPERATURE_THRESHOLD, 0);
        c.cdw11 = cdw11;
        fx.exec(q, c, HostData::None).cpl
    };
    assert_eq!(get(&mut q, 0).dw0, 343, "over: 70 °C by default");
    assert_eq!(get(&mut q, 1 << 20).dw0, 0, "under: none");
    let s = smart(&mut q);
    assert_eq!(s.critical_warning & 2, u8::from(s.temperature >= 343) << 1);
    // An over threshold at or below the temperature raises the warning.
    let set = FeatureCmd::set(fid::TEMPERATURE_THRESHOLD, 1, 0);
    assert_eq!(
        fx.exec(&mut q, set, HostData::None).cpl.status,
        NvmeStatus::SUCCESS
    );
    assert_eq!(get(&mut q, 0).dw0, 1);
    assert_eq!(smart(&mut q).critical_warning & 2, 2);
    // Sensor 1 is not implemented; a longer Get Features buffer is fine.
    let bad = FeatureCmd::set(fid::TEMPERATURE_THRESHOLD, 1 << 16, 0);
    assert_eq!(
        fx.exec(&mut q, bad, HostData::None).cpl.status,
        NvmeStatus::INVALID_FIELD
    );
    let c = fx.exec(
        &mut q,
        FeatureCmd::get(fid::TEMPERATURE_THRESHOLD, 0),
        HostData::Read(4096),
    );
    assert_eq!(c.cpl.status, NvmeStatus::SUCCESS);
    assert_eq!(smart(&mut q).unsafe_shutdowns, 0);

    // Gone without a shutdown notification: one unsafe shutdown.
    q.endpoint().disconnect();
    d();
    let mut q = fx.admin();
    assert_eq!(smart(&mut q).unsafe_shutdowns, 1);
    // Shut down (CC.SHN) first: not unsafe.
    let mut cc = Cc::linux_default(0);
    cc.en = true;
    cc.shn = 1;
    q.property_set(ofst::CC, cc.to_u32(), &d).unwrap();
    assert_eq!(
        q.property_get(ofst::CSTS, PropertySize::Four, &d).unwrap() >> 2 & 3,
        2
    );
    q.endpoint().disconnect();
    d();
    let mut q = fx.admin();
    assert_eq!(smart(&mut q).unsafe_shutdowns, 1);
}

#[test]
fn the_keep_alive_timer_is_one_poller_replaced_on_rearm_and_gone_with_its_queue() {
    let fx = Fx::new();
    let d = fx.drive();
    let r = fx.cluster.reactor(0);
    // A queue without KATO: the loopback poll group's poller, no timer.
    let plain = fx.admin();
    d();
    let base = r.poller_count();
    let mut admin = fx.admin_to(SUB1, 10_000);
    d();
    assert_eq!(r.poller_count(), base + 1, "one keep-alive timer");
    // Set Features KATO re-arms it: the old timer goes, a new one comes.
    let kato = |ms| FeatureCmd::set(fid::KEEP_ALIVE_TIMER, ms, 0);
    for ms in [5_000, 20_000] {
        let c = fx.exec(&mut admin, kato(ms), HostData::None);
        assert_eq!(c.cpl.status, NvmeStatus::SUCCESS);
        assert_eq!(r.poller_count(), base + 1, "re-armed to {ms} ms");
    }
    // KATO 0 stops it, a new value starts it again.
    fx.exec(&mut admin, kato(0), HostData::None);
    assert_eq!(r.poller_count(), base);
    fx.exec(&mut admin, kato(1_000), HostData::None);
    assert_eq!(r.poller_count(), base + 1);
    // The timer goes with its queue.
    drop(admin);
    d();
    assert_eq!(r.poller_count(), base);
    drop(plain);
    d();
}

#[test]
fn set_features_refuses_save() {
    let fx = Fx::new();
    let mut q = fx.admin();
    let id = pollux_nvmf::spec::identify::IdentifyController::parse(
        &fx.identify(&mut q, cns::CONTROLLER, 0).data.unwrap(),
    )
    .unwrap();
    // ONCS bit 4 clear: no feature is saveable. SV (CDW10 bit 31) set is
    // Feature Identifier Not Saveable (SCT 1, SC 0Dh), and nothing changes.
    assert_eq!(id.oncs & (1 << 4), 0);
    let mut save = FeatureCmd::set(fid::KEEP_ALIVE_TIMER, 30_000, 0);
    save.cdw10 |= 1 << 31;
    let c = fx.exec(&mut q, save, HostData::None);
    assert_eq!(c.cpl.status, NvmeStatus::FEATURE_NOT_SAVEABLE);
    assert_eq!(c.cpl.status.parts(), (1, 0x0D, true));
    let get = fx.exec(
        &mut q,
        FeatureCmd::get(fid::KEEP_ALIVE_TIMER, 0),
        HostData::None,
    );
    assert_eq!(get.cpl.dw0, 0, "the refused Set changed nothing");
    // The error log points at SV: CDW10 byte 3 (SQE byte 43), bit 7.
    let e = ErrorLogEntry::parse(&log(&fx, &mut q, lid::ERROR, 64, false).data.unwrap()).unwrap();
    assert_eq!(e.status, NvmeStatus::FEATURE_NOT_SAVEABLE.to_field());
    assert_eq!(e.param_error_location, 43 | (7 << 8));
}

#[test]
fn set_features_refuses_power_states_beyond_npss() {
    let fx = Fx::new();
    let mut q = fx.admin();
    let id = pollux_nvmf::spec::identify::IdentifyController::parse(
        &fx.identify(&mut q, cns::CONTROLLER, 0).data.unwrap(),
    )
    .unwrap();
    // NPSS 0: power state 0 only; any other is Invalid Field.
    assert_eq!(id.npss, 0);
    let pm = |ps: u32| FeatureCmd::set(fid::POWER_MANAGEMENT, ps, 0);
    assert_eq!(
        fx.exec(&mut q, pm(0), HostData::None).cpl.status,
        NvmeStatus::SUCCESS
    );
    for ps in [1, 2, 31] {
        assert_eq!(
            fx.exec(&mut q, pm(ps), HostData::None).cpl.status,
            NvmeStatus::INVALID_FIELD,
            "power state {ps}"
        );
    }
}

#[test]
fn identify_namespace_past_nn_is_an_invalid_nsid() {
    let fx = Fx::new();
    let mut q = fx.admin();
    let id = pollux_nvmf::spec::identify::IdentifyController::parse(
        &fx.identify(&mut q, cns::CONTROLLER, 0).data.unwrap(),
    )
    .unwrap();
    // 1..=NN are valid NSIDs: an inactive one reads as zeroes ...
    let c = fx.identify(&mut q, cns::NAMESPACE, id.nn);
    assert_eq!(c.cpl.status, NvmeStatus::SUCCESS);
    assert!(c.data.unwrap().iter().all(|&b| b == 0));
    // ... past NN (and short of the broadcast value) it is not an NSID.
    for nsid in [id.nn + 1, 0xFFFF_FFFE] {
        assert_eq!(
            fx.identify(&mut q, cns::NAMESPACE, nsid).cpl.status,
            NvmeStatus::INVALID_NAMESPACE,
            "NSID {nsid:#x}"
        );
    }
}

#[test]
fn identify_controller_reports_the_temperature_thresholds() {
    let fx = Fx::new();
    let mut q = fx.admin();
    let id = pollux_nvmf::spec::identify::IdentifyController::parse(
        &fx.identify(&mut q, cns::CONTROLLER, 0).data.unwrap(),
    )
    .unwrap();
    // NVMe 1.2 and later: WCTEMP and CCTEMP non-zero; the over threshold
    // of the composite temperature defaults to WCTEMP.
    let over = fx
        .exec(
            &mut q,
            FeatureCmd::get(fid::TEMPERATURE_THRESHOLD, 0),
            HostData::None,
        )
        .cpl
        .dw0;
    assert_eq!(u32::from(id.wctemp), over);
    assert!(id.cctemp > id.wctemp, "{} > {}", id.cctemp, id.wctemp);
}

#[test]
fn temperature_threshold_set_for_all_sensors_sets_the_composite_one() {
    let fx = Fx::new();
    let mut q = fx.admin();
    let get = |q: &mut HostQueue, cdw11: u32| {
        let mut c = FeatureCmd::get(fid::TEMPERATURE_THRESHOLD, 0);
        c.cdw11 = cdw11;
        fx.exec(q, c, HostData::None).cpl
    };
    let set = |q: &mut HostQueue, cdw11: u32| {
        fx.exec(
            q,
            FeatureCmd::set(fid::TEMPERATURE_THRESHOLD, cdw11, 0),
            HostData::None,
        )
        .cpl
        .status
    };
    // Set Features TMPSEL 1111b: every implemented sensor (here the
    // composite one only), over and under.
    assert_eq!(set(&mut q, (0xF << 16) | 350), NvmeStatus::SUCCESS);
    assert_eq!(get(&mut q, 0).dw0, 350);
    assert_eq!(
        set(&mut q, (0xF << 16) | (1 << 20) | 250),
        NvmeStatus::SUCCESS
    );
    assert_eq!(get(&mut q, 1 << 20).dw0, 250);
    // Get Features has no "all sensors" (1111b is reserved there), and
    // 1001b..1110b are reserved for both.
    assert_eq!(get(&mut q, 0xF << 16).status, NvmeStatus::INVALID_FIELD);
    assert_eq!(set(&mut q, (0x9 << 16) | 300), NvmeStatus::INVALID_FIELD);
    assert_eq!(get(&mut q, 0).dw0, 350);
}

#[test]
fn a_feature_set_reads_back_or_the_set_is_refused() {
    let fx = Fx::new();
    let mut q = fx.admin();
    let get = |q: &mut HostQueue, f: u8| fx.exec(q, FeatureCmd::get(f, 0), HostData::None).cpl;
    let set =
        |q: &mut HostQueue, f: u8, v: u32| fx.exec(q, FeatureCmd::set(f, v, 0), HostData::None).cpl;

    // Arbitration: what was set is what Get Features (current) returns
    // (reserved bits 7:3 dropped).
    assert_eq!(get(&mut q, fid::ARBITRATION).dw0, 0);
    let arb = 0x0403_0207 | (0x1F << 3);
    assert_eq!(
        set(&mut q, fid::ARBITRATION, arb).status,
        NvmeStatus::SUCCESS
    );
    assert_eq!(get(&mut q, fid::ARBITRATION).dw0, 0x0403_0207);

    // The volatile write cache cannot be turned off: a Set that clears WCE
    // is Feature Not Changeable (SCT 1, SC 0Eh), not a success the next
    // Get (WCE 1) contradicts. Setting WCE (what it is) succeeds.
    let c = set(&mut q, fid::VOLATILE_WRITE_CACHE, 0);
    assert_eq!(c.status, NvmeStatus::FEATURE_NOT_CHANGEABLE);
    assert_eq!(c.status.parts(), (1, 0x0E, true));
    assert_eq!(get(&mut q, fid::VOLATILE_WRITE_CACHE).dw0, 1);
    assert_eq!(
        set(&mut q, fid::VOLATILE_WRITE_CACHE, 1).status,
        NvmeStatus::SUCCESS
    );
    assert_eq!(get(&mut q, fid::VOLATILE_WRITE_CACHE).dw0, 1);
}

#[test]
fn the_error_log_blames_the_feature_value_or_the_feature_id() {
    let fx = Fx::new();
    let mut q = fx.admin();
    let last_error = |q: &mut HostQueue| {
        ErrorLogEntry::parse(&log(&fx, q, lid::ERROR, 64, false).data.unwrap()).unwrap()
    };
    // A supported feature with a bad value: CDW11 (SQE byte 44).
    let cases = [
        FeatureCmd::set(fid::NUMBER_OF_QUEUES, 0xFFFF_0000, 0),
        FeatureCmd::set(fid::TEMPERATURE_THRESHOLD, 3 << 20, 0),
        FeatureCmd::set(fid::POWER_MANAGEMENT, 1, 0),
        FeatureCmd::get(fid::HOST_IDENTIFIER, 0),
    ];
    for cmd in cases {
        let data = if cmd.cdw10 as u8 == fid::HOST_IDENTIFIER {
            HostData::Read(16)
        } else {
            HostData::None
        };
        let c = fx.exec(&mut q, cmd, data);
        assert_eq!(c.cpl.status, NvmeStatus::INVALID_FIELD);
        let e = last_error(&mut q);
        assert_eq!(
            (e.cid, e.param_error_location),
            (c.cpl.cid, 44),
            "FID {:#x}",
            cmd.cdw10 as u8
        );
    }
    // An unsupported feature: the FID (CDW10, byte 40).
    let c = fx.exec(&mut q, FeatureCmd::set(0x7D, 0, 0), HostData::None);
    assert_eq!(c.cpl.status, NvmeStatus::INVALID_FIELD);
    assert_eq!(last_error(&mut q).param_error_location, 40);
}

#[test]
fn a_tcp_controller_claims_no_keyed_sgls() {
    use pollux_nvmf::host::tcp::{TcpHost, TcpHostOptions};
    use pollux_nvmf::host::{Controller, CtrlOptions, HostIdentity, DEFAULT_HOSTNQN};
    use pollux_nvmf::spec::identify::{SGLS_KEYED, SGLS_OFFSET, SGLS_SUPPORTED};
    use pollux_nvmf::spec::transport_id::TransportId;
    use pollux_nvmf::target::tcp::{TcpOptions, TcpTransport};

    let cl = pollux_reactor::TestCluster::new(1);
    let target = Target::new(TargetOptions::for_tests()).unwrap();
    let sub = target.add_subsystem(SubsystemConfig::new(SUB1)).unwrap();
    let reg = pollux_bdev::BdevRegistry::new();
    let bdev = reg.create("malloc:size=1M,block=512,name=t0").unwrap();
    sub.add_namespace(NamespaceConfig::new(bdev).with_nsid(1))
        .unwrap();
    let transport = TcpTransport::new(&target, TcpOptions::default()).unwrap();
    target.add_transport(transport.clone()).unwrap();
    let _pg = cl.on(0, |r| transport.create_poll_group(r)).unwrap();
    let port = pollux_reactor::free_tcp_port("127.0.0.1");
    target
        .add_listener(TransportId::tcp_ipv4("127.0.0.1", port.to_string()))
        .unwrap();
    cl.poll_until_idle().unwrap();
    let sgls = cl.on(0, |_| {
        let t = TcpHost::new(
            std::net::SocketAddr::new([127, 0, 0, 1].into(), port),
            TcpHostOptions {
                connect_timeout: Duration::from_secs(5),
                ..TcpHostOptions::default()
            },
        );
        let who = HostIdentity {
            hostnqn: DEFAULT_HOSTNQN.into(),
            hostid: *b"admin-test-tcp-1",
            subnqn: SUB1.into(),
        };
        let c = Controller::connect(&t, who, CtrlOptions::default()).unwrap();
        let sgls = c.info().ident.sgls;
        drop(c);
        sgls
    });
    // NVMe/TCP moves data in PDUs: SGLs and in-capsule offsets, but no
    // keyed SGL data block (the target refuses one with SGL Descriptor
    // Type Invalid), as the Linux target reports for TCP.
    assert_eq!(sgls & SGLS_SUPPORTED, SGLS_SUPPORTED);
    assert_eq!(sgls & SGLS_OFFSET, SGLS_OFFSET);
    assert_eq!(sgls & SGLS_KEYED, 0, "SGLS {sgls:#x}");
    for _ in 0..1000 {
        cl.poll_once_all();
    }
}
