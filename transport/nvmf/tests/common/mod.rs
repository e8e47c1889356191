//! Shared fixture: a target with a loopback transport, one listener and one
//! subsystem on a 1 MiB malloc bdev (512-byte blocks), driven by a
//! `TestCluster`.
#![allow(clippy::unwrap_used, dead_code)]

use std::sync::Arc;

use pollux_bdev::BdevRegistry;
use pollux_nvmf::loopback_host::{Completed, HostData, HostQueue, LoopbackHost};
use pollux_nvmf::spec::cmd::{IoOpcode, NvmeCmd};
use pollux_nvmf::spec::cpl::NvmeStatus;
use pollux_nvmf::spec::identify::IdentifyCmd;
use pollux_nvmf::spec::log_page::RdmaTsas;
use pollux_nvmf::spec::nvm::RwCmd;
use pollux_nvmf::spec::transport_id::{TrType, TransportId};
use pollux_nvmf::target::{
    LoopbackTransport, NamespaceConfig, Subsystem, SubsystemConfig, Target, TargetOptions,
    TargetTransport, TransportError,
};
use pollux_reactor::TestCluster;

pub const SUB1: &str = "nqn.2024-01.io.pollux:sub1";
pub const SUB2: &str = "nqn.2024-01.io.pollux:sub2";
pub const HOST1: &str = "nqn.2024-01.io.pollux:host1";
pub const HOST2: &str = "nqn.2024-01.io.pollux:host2";
pub const BLOCK: u32 = 512;
pub const BLOCKS: u64 = 2048;

pub struct Fx {
    pub cluster: TestCluster,
    pub target: Arc<Target>,
    pub lt: Arc<LoopbackTransport>,
    pub trid: TransportId,
    pub host: LoopbackHost,
    pub registry: BdevRegistry,
    pub sub1: Arc<Subsystem>,
}

impl Fx {
    pub fn new() -> Fx {
        Fx::with(TargetOptions::for_tests(), 1)
    }

    pub fn with(opts: TargetOptions, cores: usize) -> Fx {
        let cluster = TestCluster::new(cores);
        let target = Target::new(opts).unwrap();
        let lt = LoopbackTransport::new();
        target.add_transport(lt.clone()).unwrap();
        let trid = TransportId::loopback("lo0");
        target.add_listener(trid.clone()).unwrap();
        let registry = BdevRegistry::new();
        let sub1 = target.add_subsystem(SubsystemConfig::new(SUB1)).unwrap();
        let bdev = registry
            .create(&format!(
                "malloc:size={},block={BLOCK},name=m1",
                BLOCKS * u64::from(BLOCK)
            ))
            .unwrap();
        sub1.add_namespace(NamespaceConfig::new(bdev).with_nsid(1))
            .unwrap();
        let host = LoopbackHost::new(&lt, &target, HOST1);
        Fx {
            cluster,
            target,
            lt,
            trid,
            host,
            registry,
            sub1,
        }
    }

    pub fn drive(&self) -> impl Fn() + '_ {
        move || {
            self.cluster.poll_until_idle().unwrap();
        }
    }

    pub fn admin(&self) -> HostQueue {
        self.admin_to(SUB1, 0)
    }

    pub fn admin_to(&self, subnqn: &str, kato: u32) -> HostQueue {
        let r = self.cluster.reactor(0);
        self.host
            .connect_admin(&r, &self.trid, subnqn, kato, &self.drive())
            .unwrap()
    }

    /// Admin queue, Number of Queues = 4, I/O queue 1 (depth 32) on `core`.
    pub fn io_on(&self, admin: &mut HostQueue, core: u32) -> HostQueue {
        let d = self.drive();
        assert_eq!(admin.set_num_queues(4, &d).unwrap(), 4);
        let r = self.cluster.reactor(core);
        self.host
            .connect_io(&r, &self.trid, SUB1, admin.cntlid.unwrap(), 1, 32, &d)
            .unwrap()
    }

    pub fn exec(&self, q: &mut HostQueue, cmd: NvmeCmd, data: HostData<'_>) -> Completed {
        q.exec(cmd, data, &self.drive()).unwrap()
    }

    pub fn identify(&self, q: &mut HostQueue, cns: u8, nsid: u32) -> Completed {
        self.exec(q, IdentifyCmd::to_cmd(cns, nsid, 0), HostData::Read(4096))
    }

    pub fn write(&self, q: &mut HostQueue, nsid: u32, slba: u64, data: &[u8]) -> NvmeStatus {
        let nlb = (data.len() / BLOCK as usize) as u32;
        let cmd = RwCmd::to_cmd(IoOpcode::Write, 0, nsid, slba, nlb).unwrap();
        self.exec(q, cmd, HostData::Write(data)).cpl.status
    }

    pub fn read(&self, q: &mut HostQueue, nsid: u32, slba: u64, nlb: u32) -> Completed {
        let cmd = RwCmd::to_cmd(IoOpcode::Read, 0, nsid, slba, nlb).unwrap();
        self.exec(q, cmd, HostData::Read(nlb * BLOCK))
    }
}

/// A transport that only lists RDMA listeners (no connections).
pub struct ListOnlyRdma;

impl TargetTransport for ListOnlyRdma {
    fn name(&self) -> &'static str {
        "rdma-stub"
    }
    fn trtype(&self) -> TrType {
        TrType::Rdma
    }
    fn listen(&self, _trid: &TransportId) -> Result<(), TransportError> {
        Ok(())
    }
    fn stop_listen(&self, _trid: &TransportId) -> Result<(), TransportError> {
        Ok(())
    }
    fn rdma_tsas(&self, _trid: &TransportId) -> Option<RdmaTsas> {
        Some(RdmaTsas::rc_cm())
    }
}

/// A recognisable pattern.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}
