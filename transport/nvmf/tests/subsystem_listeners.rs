//! Listeners per subsystem (SPDK's model) in the target core, over the
//! loopback transport: a Connect to a subsystem through an address it does
//! not listen on is refused with SPDK's status (SCT 1, SC 0x84 Connect
//! Invalid Host); the discovery log lists each subsystem only at its own
//! listeners (and the target-wide ones); the transport listens on an
//! address while any subsystem uses it and stops with the last; a refused
//! add leaves nothing; the discovery subsystem takes listeners too.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use pollux_nvmf::loopback_host::{HostData, HostError, HostQueue, LoopbackHost};
use pollux_nvmf::spec::cpl::{NvmeStatus, StatusCodeType};
use pollux_nvmf::spec::log_page::{lid, DiscoveryLogEntry, DiscoveryLogHeader, GetLogPageCmd};
use pollux_nvmf::spec::transport_id::{TrType, TransportId};
use pollux_nvmf::target::{SubsystemConfig, TargetError, TransportError, DISCOVERY_NQN};

/// The fixture (SUB1 on the target-wide `lo0`) plus SUB2, and `lo-a`
/// shared by both, `lo-b` for SUB2 only.
fn two_subsystems() -> (Fx, TransportId, TransportId) {
    let fx = Fx::new();
    fx.target.add_subsystem(SubsystemConfig::new(SUB2)).unwrap();
    let shared = TransportId::loopback("lo-a");
    let only2 = TransportId::loopback("lo-b");
    fx.target
        .add_subsystem_listener(SUB1, shared.clone())
        .unwrap();
    fx.target
        .add_subsystem_listener(SUB2, shared.clone())
        .unwrap();
    fx.target
        .add_subsystem_listener(SUB2, only2.clone())
        .unwrap();
    (fx, shared, only2)
}

fn admin(fx: &Fx, trid: &TransportId, subnqn: &str) -> Result<HostQueue, HostError> {
    let r = fx.cluster.reactor(0);
    fx.host.connect_admin(&r, trid, subnqn, 0, &fx.drive())
}

fn log_entries(fx: &Fx, q: &mut HostQueue) -> Vec<DiscoveryLogEntry> {
    let cmd = GetLogPageCmd::to_cmd(lid::DISCOVERY, 0, 8192, 0, false, 0).unwrap();
    let data = fx.exec(q, cmd, HostData::Read(8192)).data.unwrap();
    let h = DiscoveryLogHeader::parse(&data).unwrap();
    (0..h.numrec as usize)
        .map(|i| DiscoveryLogEntry::parse(&data[1024 * (i + 1)..]).unwrap())
        .collect()
}

#[test]
fn a_connect_through_an_address_the_subsystem_does_not_listen_on_is_refused() {
    let (fx, shared, only2) = two_subsystems();
    match admin(&fx, &only2, SUB1) {
        Err(HostError::Failed(c)) => {
            assert_eq!(c.status, NvmeStatus::CONNECT_INVALID_HOST);
            assert_eq!(c.status.sct(), StatusCodeType::CommandSpecific);
            assert_eq!(c.status.sc(), 0x84);
        }
        other => panic!("SUB1 through SUB2's address: {other:?}"),
    }
    assert_eq!(fx.sub1.controller_count(), 0, "nothing was made for it");
    // Each through its own, both through the shared one and the
    // target-wide one.
    let _a = admin(&fx, &shared, SUB1).unwrap();
    let _b = admin(&fx, &shared, SUB2).unwrap();
    let _c = admin(&fx, &only2, SUB2).unwrap();
    let _d = admin(&fx, &fx.trid, SUB2).unwrap();
    // Discovery is served on any address the target listens on.
    let _e = admin(&fx, &only2, DISCOVERY_NQN).unwrap();
}

#[test]
fn an_io_queue_through_another_address_is_refused_too() {
    let (fx, shared, only2) = two_subsystems();
    let mut a = admin(&fx, &shared, SUB1).unwrap();
    let d = fx.drive();
    assert_eq!(a.set_num_queues(4, &d).unwrap(), 4);
    let r = fx.cluster.reactor(0);
    let e = fx
        .host
        .connect_io(&r, &only2, SUB1, a.cntlid.unwrap(), 1, 32, &d)
        .unwrap_err();
    assert!(
        matches!(e, HostError::Failed(c) if c.status == NvmeStatus::CONNECT_INVALID_HOST),
        "{e:?}"
    );
    fx.host
        .connect_io(&r, &shared, SUB1, a.cntlid.unwrap(), 1, 32, &d)
        .unwrap();
}

#[test]
fn the_discovery_log_lists_each_subsystem_at_its_own_listeners() {
    let (fx, shared, only2) = two_subsystems();
    let mut q = admin(&fx, &fx.trid, DISCOVERY_NQN).unwrap();
    let at = |nqn: &str| -> Vec<String> {
        let mut q2 = admin(&fx, &fx.trid, DISCOVERY_NQN).unwrap();
        log_entries(&fx, &mut q2)
            .into_iter()
            .filter(|e| e.subnqn == nqn)
            .map(|e| e.traddr)
            .collect()
    };
    // Own listeners first, then the target-wide one.
    assert_eq!(
        at(SUB1),
        vec![shared.traddr.clone(), fx.trid.traddr.clone()]
    );
    assert_eq!(
        at(SUB2),
        vec![
            shared.traddr.clone(),
            only2.traddr.clone(),
            fx.trid.traddr.clone()
        ]
    );
    // One port id per address, whichever subsystem it is listed for.
    let all = log_entries(&fx, &mut q);
    for e in &all {
        let same: Vec<u16> = all
            .iter()
            .filter(|x| x.traddr == e.traddr)
            .map(|x| x.portid)
            .collect();
        assert!(same.iter().all(|&p| p == e.portid), "{all:?}");
    }
    fx.target.remove_subsystem_listener(SUB2, &only2).unwrap();
    assert_eq!(
        at(SUB2),
        vec![shared.traddr.clone(), fx.trid.traddr.clone()]
    );
}

#[test]
fn an_address_is_listened_on_while_a_subsystem_uses_it() {
    let (fx, shared, only2) = two_subsystems();
    let open = |t: &TransportId| fx.target.listeners().iter().any(|l| &l.trid == t);
    assert!(!fx.target.remove_subsystem_listener(SUB1, &shared).unwrap());
    assert!(open(&shared), "SUB2 still listens there");
    assert!(!fx.sub1.listens_on(&shared));
    assert!(admin(&fx, &shared, SUB1).is_err());
    let _b = admin(&fx, &shared, SUB2).unwrap();
    assert!(fx.target.remove_subsystem_listener(SUB2, &shared).unwrap());
    assert!(!open(&shared));
    let r = fx.cluster.reactor(0);
    let e = LoopbackHost::new(&fx.lt, &fx.target, HOST1)
        .connect_admin(&r, &shared, SUB2, 0, &fx.drive())
        .unwrap_err();
    assert!(
        matches!(e, HostError::Transport(TransportError::NotListening(_))),
        "{e:?}"
    );
    // Removing a subsystem closes what only it used.
    let sub3 = "nqn.2024-01.io.pollux:sub3";
    fx.target.add_subsystem(SubsystemConfig::new(sub3)).unwrap();
    let only3 = TransportId::loopback("lo-c");
    fx.target
        .add_subsystem_listener(sub3, only3.clone())
        .unwrap();
    fx.target
        .add_subsystem_listener(sub3, only2.clone())
        .unwrap();
    assert_eq!(
        fx.target.remove_subsystem(sub3).unwrap(),
        vec![only3.clone()]
    );
    assert!(!open(&only3));
    assert!(open(&only2), "SUB2 still listens there");
    assert!(open(&fx.trid), "the target-wide listener stays");
}

#[test]
fn a_refused_add_leaves_nothing() {
    let (fx, shared, _) = two_subsystems();
    let before = fx.target.listeners();
    let tcp = TransportId::tcp_ipv4("127.0.0.1", "4420");
    assert!(matches!(
        fx.target.add_subsystem_listener(SUB1, tcp.clone()),
        Err(TargetError::NoTransport(TrType::Tcp))
    ));
    assert!(matches!(
        fx.target
            .add_subsystem_listener("nqn.2024-01.io.pollux:none", TransportId::loopback("lo-x")),
        Err(TargetError::NoSuchSubsystem(_))
    ));
    assert!(matches!(
        fx.target.add_subsystem_listener(SUB1, shared.clone()),
        Err(TargetError::ListenerExists(_))
    ));
    assert!(matches!(
        fx.target.add_subsystem_listener(SUB1, fx.trid.clone()),
        Err(TargetError::ListenerExists(_))
    ));
    assert!(matches!(
        fx.target.remove_subsystem_listener(SUB1, &tcp),
        Err(TargetError::NoSuchListener(_))
    ));
    assert_eq!(fx.target.listeners(), before);
    assert_eq!(fx.sub1.listeners(), vec![shared]);
}

#[test]
fn the_discovery_subsystem_takes_listeners() {
    let fx = Fx::new();
    let disc = TransportId::loopback("lo-disc");
    fx.target
        .add_subsystem_listener(DISCOVERY_NQN, disc.clone())
        .unwrap();
    assert_eq!(
        fx.target.discovery_subsystem().listeners(),
        vec![disc.clone()]
    );
    let mut q = admin(&fx, &disc, DISCOVERY_NQN).unwrap();
    // SUB1 is not reachable there, and the log says where it is.
    assert!(admin(&fx, &disc, SUB1).is_err());
    let e = log_entries(&fx, &mut q);
    assert_eq!(e[0].subnqn, DISCOVERY_NQN, "the current discovery entry");
    assert_eq!(e[0].traddr, disc.traddr);
    let sub1: Vec<_> = e.iter().filter(|x| x.subnqn == SUB1).collect();
    assert_eq!(sub1.len(), 1);
    assert_eq!(sub1[0].traddr, fx.trid.traddr);
    drop(q);
    assert!(fx
        .target
        .remove_subsystem_listener(DISCOVERY_NQN, &disc)
        .unwrap());
}
