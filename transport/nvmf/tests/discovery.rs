//! The discovery subsystem end to end: log contents for 2 subsystems × 2
//! listeners, host filtering, offsets, the generation counter and the
//! discovery-change event.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::*;
use pollux_nvmf::loopback_host::{HostData, HostQueue, LoopbackHost};
use pollux_nvmf::spec::cmd::{AdminOpcode, NvmeCmd};
use pollux_nvmf::spec::cpl::NvmeStatus;
use pollux_nvmf::spec::features::{fid, AsyncEvent, FeatureCmd, AEN_DISCOVERY_CHANGE};
use pollux_nvmf::spec::identify::{cns, IdentifyController};
use pollux_nvmf::spec::log_page::{
    lid, DiscoveryLogEntry, DiscoveryLogHeader, GetLogPageCmd, RdmaTsas, SUBTYPE_CURRENT_DISCOVERY,
    SUBTYPE_NVME,
};
use pollux_nvmf::spec::transport_id::{AdrFam, TrType, TransportId};
use pollux_nvmf::target::{SubsystemConfig, DISCOVERY_NQN};

fn read_log(fx: &Fx, q: &mut HostQueue, lpo: u64, len: u64, rae: bool) -> Vec<u8> {
    let cmd = GetLogPageCmd::to_cmd(lid::DISCOVERY, 0, len, lpo, rae, 0).unwrap();
    let c = fx.exec(q, cmd, HostData::Read(len as u32));
    assert_eq!(c.cpl.status, NvmeStatus::SUCCESS);
    c.data.unwrap()
}

fn entries(log: &[u8]) -> Vec<DiscoveryLogEntry> {
    let h = DiscoveryLogHeader::parse(log).unwrap();
    (0..h.numrec as usize)
        .map(|i| DiscoveryLogEntry::parse(&log[1024 * (i + 1)..]).unwrap())
        .collect()
}

#[test]
fn discovery_log_lists_subsystems_times_listeners_per_host() {
    let fx = Fx::new();
    fx.target.add_transport(Arc::new(ListOnlyRdma)).unwrap();
    let rdma = TransportId::rdma_ipv4("192.168.1.10", "4420");
    fx.target.add_listener(rdma.clone()).unwrap();
    // SUB2 only for HOST2.
    fx.target
        .add_subsystem(SubsystemConfig::new(SUB2).allow_hosts([HOST2]))
        .unwrap();

    let mut q = fx.admin_to(DISCOVERY_NQN, 0);
    // A discovery controller: CNTRLTYPE 2, no namespaces, discovery AENs.
    let id =
        IdentifyController::parse(&fx.identify(&mut q, cns::CONTROLLER, 0).data.unwrap()).unwrap();
    assert_eq!(id.cntrltype, 2);
    assert_eq!(id.nn, 0);
    assert_eq!(id.subnqn, DISCOVERY_NQN);
    assert_eq!(id.oaes, AEN_DISCOVERY_CHANGE);
    assert_eq!(
        fx.identify(&mut q, cns::NAMESPACE, 1).cpl.status,
        NvmeStatus::INVALID_FIELD
    );

    // HOST1: current discovery entry + SUB1 × 2 listeners.
    let log = read_log(&fx, &mut q, 0, 4 * 1024, false);
    let h = DiscoveryLogHeader::parse(&log).unwrap();
    assert_eq!(h.numrec, 3);
    assert_eq!(h.genctr, fx.target.discovery_genctr());
    let e = entries(&log);
    assert_eq!(e[0].subtype, SUBTYPE_CURRENT_DISCOVERY);
    // TREQ as the Linux target: secure channel not specified, SQ flow
    // control disable supported (4, which nvme-cli decodes; 6 is not).
    assert!(
        e.iter().all(|x| x.treq == 4),
        "TREQ {:?}",
        e.iter().map(|x| x.treq).collect::<Vec<_>>()
    );
    assert_eq!(e[0].subnqn, DISCOVERY_NQN);
    assert_eq!(e[0].trtype, TrType::Loop);
    assert_eq!(e[0].traddr, "lo0");
    assert!(e[1..]
        .iter()
        .all(|x| x.subnqn == SUB1 && x.subtype == SUBTYPE_NVME));
    assert!(e.iter().all(|x| x.cntlid == 0xFFFF && x.asqsz == 32));
    let r = e.iter().find(|x| x.trtype == TrType::Rdma).unwrap();
    assert_eq!(
        (r.adrfam, r.traddr.as_str(), r.trsvcid.as_str()),
        (AdrFam::Ipv4, "192.168.1.10", "4420")
    );
    assert_eq!(r.rdma, Some(RdmaTsas::rc_cm()));
    assert_ne!(e[1].portid, e[2].portid);

    // HOST2 sees both subsystems: 1 + 2 × 2 entries.
    let h2 = LoopbackHost::new(&fx.lt, &fx.target, HOST2);
    let r0 = fx.cluster.reactor(0);
    let mut q2 = h2
        .connect_admin(&r0, &fx.trid, DISCOVERY_NQN, 0, &fx.drive())
        .unwrap();
    let log2 = read_log(&fx, &mut q2, 0, 8 * 1024, false);
    let e2 = entries(&log2);
    assert_eq!(e2.len(), 5);
    assert_eq!(e2.iter().filter(|x| x.subnqn == SUB2).count(), 2);

    // Reading the entries in slices (as nvme-cli does) gives the same bytes.
    let head = read_log(&fx, &mut q2, 0, 16, true);
    assert_eq!(&head[..], &log2[..16]);
    let tail = read_log(&fx, &mut q2, 1024, 5 * 1024, false);
    assert_eq!(&tail[..], &log2[1024..6 * 1024]);
    // Beyond the end: Invalid Field.
    let cmd = GetLogPageCmd::to_cmd(lid::DISCOVERY, 0, 1024, 1024 * 20, false, 0).unwrap();
    assert_eq!(
        fx.exec(&mut q2, cmd, HostData::Read(1024)).cpl.status,
        NvmeStatus::INVALID_FIELD
    );
    // Only the discovery log on a discovery controller: any other LID is
    // Invalid Log Page.
    let cmd = GetLogPageCmd::to_cmd(lid::SMART, 0, 512, 0, false, 0).unwrap();
    assert_eq!(
        fx.exec(&mut q2, cmd, HostData::Read(512)).cpl.status,
        NvmeStatus::INVALID_LOG_PAGE
    );
    // No I/O-controller features.
    let c = fx.exec(
        &mut q2,
        FeatureCmd::set(fid::NUMBER_OF_QUEUES, 0, 0),
        HostData::None,
    );
    assert_eq!(c.cpl.status, NvmeStatus::INVALID_FIELD);
    let c = fx.exec(
        &mut q2,
        NvmeCmd::new(AdminOpcode::Abort.code(), 0),
        HostData::None,
    );
    assert_eq!(c.cpl.status, NvmeStatus::INVALID_OPCODE);
}

#[test]
fn discovery_controllers_get_the_default_kato_and_change_events() {
    let fx = Fx::new();
    let mut q = fx.admin_to(DISCOVERY_NQN, 0);
    let c = fx.exec(
        &mut q,
        FeatureCmd::get(fid::KEEP_ALIVE_TIMER, 0),
        HostData::None,
    );
    assert_eq!(c.cpl.dw0, 120_000, "KATO 0 from the host → 120 s");

    let set = FeatureCmd::set(fid::ASYNC_EVENT_CONFIG, AEN_DISCOVERY_CHANGE, 0);
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
    assert!(q.take(aer).is_none());

    let before = fx.target.discovery_genctr();
    fx.target.add_subsystem(SubsystemConfig::new(SUB2)).unwrap();
    assert!(fx.target.discovery_genctr() > before);
    fx.drive()();
    q.poll();
    let c = q.take(aer).unwrap();
    assert_eq!(
        AsyncEvent::from_dw0(c.cpl.dw0),
        AsyncEvent::DISCOVERY_CHANGED
    );
    let log = read_log(&fx, &mut q, 0, 3 * 1024, false);
    assert_eq!(DiscoveryLogHeader::parse(&log).unwrap().numrec, 3);

    // The listener list is part of the log too.
    fx.target.remove_listener(&fx.trid).unwrap();
    let log = read_log(&fx, &mut q, 0, 1024, false);
    assert_eq!(DiscoveryLogHeader::parse(&log).unwrap().numrec, 0);
    assert!(fx
        .host
        .open(
            &fx.cluster.reactor(0),
            &fx.trid,
            pollux_nvmf::target::LoopbackQueueOptions::admin()
        )
        .is_err());
}
