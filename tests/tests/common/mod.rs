//! Shared set-up of the in-process NVMe-oF and iSER target tests (each
//! test binary uses only part of it).
#![allow(dead_code)]

pub mod churn;
pub mod churn_fabric;
pub mod churn_iser;
pub mod iser;
pub mod iser_io;
pub mod iser_loop;
pub mod rules;

use std::sync::Arc;

use pollux_bdev::BdevRegistry;
use pollux_nvmf::spec::transport_id::{AdrFam, TrType, TransportId};
use pollux_nvmf::target::rdma::{RdmaOptions, RdmaTransport};
use pollux_nvmf::target::tcp::{TcpOptions, TcpTransport};
use pollux_nvmf::target::{NamespaceConfig, SubsystemConfig, Target, TargetOptions};
use pollux_verbs::soft::Soft;

/// A target with one subsystem `nqn` (any host) whose namespace 1 is the
/// bdev `bdev_spec`, served by a soft-provider RDMA transport listening on
/// `traddr`. Poll groups are the caller's to create on its reactors.
pub fn soft_rdma_target(
    nqn: &str,
    bdev_spec: &str,
    traddr: &str,
) -> (Arc<Target>, Arc<RdmaTransport<Soft>>) {
    soft_rdma_target_with(
        nqn,
        bdev_spec,
        traddr,
        TargetOptions::for_tests(),
        RdmaOptions::for_tests(),
    )
}

/// [`soft_rdma_target`] with the target's and the transport's options.
pub fn soft_rdma_target_with(
    nqn: &str,
    bdev_spec: &str,
    traddr: &str,
    topts: TargetOptions,
    ropts: RdmaOptions,
) -> (Arc<Target>, Arc<RdmaTransport<Soft>>) {
    let target = target_with_subsystem(nqn, bdev_spec, topts);
    let transport = RdmaTransport::<Soft>::new(&target, ropts).expect("transport");
    target
        .add_transport(transport.clone())
        .expect("add transport");
    target
        .add_listener(TransportId {
            trtype: TrType::Rdma,
            adrfam: AdrFam::IntraHost,
            traddr: traddr.to_string(),
            trsvcid: String::new(),
        })
        .expect("listener");
    (target, transport)
}

/// A target with one subsystem `nqn` (any host) whose namespace 1 is the
/// bdev `bdev_spec`, and no transport yet.
pub fn target_with_subsystem(nqn: &str, bdev_spec: &str, topts: TargetOptions) -> Arc<Target> {
    let target = Target::new(topts).expect("target");
    let mut sc = SubsystemConfig::new(nqn);
    sc.allow_any_host = true;
    let sub = target.add_subsystem(sc).expect("subsystem");
    let bdev = BdevRegistry::new().create(bdev_spec).expect("bdev");
    sub.add_namespace(NamespaceConfig::new(bdev).with_nsid(1))
        .expect("namespace");
    target
}

/// [`target_with_subsystem`] served by an NVMe/TCP transport listening on
/// `addr` (an IPv4 address and port). Poll groups are the caller's to
/// create on its reactors.
pub fn tcp_target_with(
    nqn: &str,
    bdev_spec: &str,
    addr: std::net::SocketAddrV4,
    topts: TargetOptions,
    tcp: TcpOptions,
) -> (Arc<Target>, Arc<TcpTransport>) {
    let target = target_with_subsystem(nqn, bdev_spec, topts);
    let transport = TcpTransport::new(&target, tcp).expect("transport");
    target
        .add_transport(transport.clone())
        .expect("add transport");
    target
        .add_listener(TransportId::tcp_ipv4(
            addr.ip().to_string(),
            addr.port().to_string(),
        ))
        .expect("listener");
    (target, transport)
}

/// Launch pinned reactors on `cores` (e.g. `"0-1"`), each creating one
/// poll group with `create` and keeping it alive in a poller; returns once
/// every core has its group (10 s each at most).
pub fn launch_with_groups<G: 'static>(
    cores: &str,
    create: impl Fn(&pollux_reactor::Reactor) -> G + Send + Sync + 'static,
) -> pollux_reactor::ReactorSet {
    use pollux_reactor::{launch, Cores, LaunchConfig, PollStatus};
    let cores = Cores::parse(cores).expect("cores");
    let n = cores.len();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let set = launch(LaunchConfig::new(cores), move |r| {
        let pg = create(r);
        r.add_poller("keep", move || {
            let _ = &pg;
            PollStatus::Idle
        });
        let _ = tx.send(());
    })
    .expect("launch");
    for _ in 0..n {
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("every core creates its poll group");
    }
    set
}
