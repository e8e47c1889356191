//! Shared set-up of the in-process NVMe-oF and iSER target tests (each
//! test binary uses only part of it).
#![allow(dead_code)]

pub mod iser;

use std::sync::Arc;

use pollux_bdev::BdevRegistry;
use pollux_nvmf::spec::transport_id::{AdrFam, TrType, TransportId};
use pollux_nvmf::target::rdma::{RdmaOptions, RdmaTransport};
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
    let target = Target::new(TargetOptions::for_tests()).expect("target");
    let mut sc = SubsystemConfig::new(nqn);
    sc.allow_any_host = true;
    let sub = target.add_subsystem(sc).expect("subsystem");
    let bdev = BdevRegistry::new().create(bdev_spec).expect("bdev");
    sub.add_namespace(NamespaceConfig::new(bdev).with_nsid(1))
        .expect("namespace");
    let transport =
        RdmaTransport::<Soft>::new(&target, RdmaOptions::for_tests()).expect("transport");
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
