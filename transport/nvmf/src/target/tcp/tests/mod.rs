//! NVMe/TCP target and host end to end over 127.0.0.1 (ephemeral ports),
//! on a one-reactor `TestCluster`: the host's waits poll the reactor, so
//! target and host progress on one thread.
#![allow(clippy::unwrap_used)]

mod accept;
mod bad_input;
mod io;
mod limits;
mod netns;
mod placement;
mod quiet;
mod raw;
mod restart;
mod sock_buffers;
mod teardown;

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use pollux_bdev::BdevRegistry;
use pollux_reactor::TestCluster;

use super::{TcpOptions, TcpPollGroup, TcpTransport};
use crate::host::tcp::{TcpHost, TcpHostOptions};
use crate::host::{HostIdentity, DEFAULT_HOSTNQN};
use crate::spec::transport_id::TransportId;
use crate::target::{NamespaceConfig, SubsystemConfig, Target, TargetOptions};

pub(super) const NQN: &str = "nqn.2024-01.io.pollux:tcp";

pub(super) struct Fx {
    pub(super) cl: TestCluster,
    pub(super) target: Arc<Target>,
    pub(super) transport: Arc<TcpTransport>,
    /// Every core's poll group, by core.
    pub(super) pgs: Vec<Rc<TcpPollGroup>>,
    pub(super) addr: SocketAddr,
    pub(super) _reg: BdevRegistry,
}

/// A port nobody listens on right now, below the ephemeral range.
/// Poll (bounded) until the transport serves `n` connections.
pub(super) fn until_connections(f: &Fx, n: usize) {
    for _ in 0..200_000 {
        if f.transport.queues_per_group().iter().sum::<usize>() == n {
            return;
        }
        f.cl.poll_once_all();
    }
    panic!(
        "the target still serves {:?} connections (want {n})",
        f.transport.queues_per_group()
    );
}

pub(super) fn free_port(ip: &str) -> u16 {
    pollux_reactor::free_tcp_port(ip)
}

pub(super) fn target_options() -> TargetOptions {
    TargetOptions {
        in_capsule_data_size: 4096,
        max_io_size: 1 << 20,
        io_unit_size: 256 * 1024,
        num_data_buffers: 48,
        ..TargetOptions::for_tests()
    }
}

pub(super) fn fixture(opts: TcpOptions) -> Fx {
    fixture_at("127.0.0.1", opts)
}

pub(super) fn fixture_at(ip: &str, opts: TcpOptions) -> Fx {
    fixture_on(1, ip, opts)
}

/// A target with one TCP poll group on each of `cores` reactors.
pub(super) fn fixture_on(cores: usize, ip: &str, opts: TcpOptions) -> Fx {
    fixture_with(cores, ip, opts, target_options())
}

/// [`fixture_on`] with the target's options `topts`.
pub(super) fn fixture_with(cores: usize, ip: &str, opts: TcpOptions, topts: TargetOptions) -> Fx {
    let cl = TestCluster::new(cores);
    let target = Target::new(topts).unwrap();
    let mut sc = SubsystemConfig::new(NQN);
    sc.allow_any_host = true;
    let sub = target.add_subsystem(sc).unwrap();
    let reg = BdevRegistry::new();
    let bdev = reg.create("malloc:size=16M,block=512,name=t0").unwrap();
    sub.add_namespace(NamespaceConfig::new(bdev).with_nsid(1))
        .unwrap();
    let transport = TcpTransport::new(&target, opts).unwrap();
    target.add_transport(transport.clone()).unwrap();
    let pgs: Vec<_> = (0..cores as u32)
        .map(|c| cl.on(c, |r| transport.create_poll_group(r)).unwrap())
        .collect();
    let port = free_port(ip);
    target
        .add_listener(TransportId::tcp_ipv4(ip, port.to_string()))
        .unwrap();
    cl.poll_until_idle().unwrap();
    Fx {
        cl,
        target,
        transport,
        pgs,
        addr: SocketAddr::new(ip.parse().unwrap(), port),
        _reg: reg,
    }
}

impl Fx {
    pub(super) fn host(&self, header: bool, data: bool) -> TcpHost {
        TcpHost::new(
            self.addr,
            TcpHostOptions {
                header_digest: header,
                data_digest: data,
                connect_timeout: Duration::from_secs(5),
            },
        )
    }

    /// Poll until the target holds no connection (bounded).
    pub(super) fn settle(&self) {
        let left = || self.pgs.iter().map(|g| g.connections()).sum::<usize>();
        for _ in 0..200_000 {
            self.cl.poll_once_all();
            if left() == 0 {
                return;
            }
        }
        panic!("{} connections left", left());
    }

    /// Every data buffer is back in the target's pool.
    pub(super) fn assert_pool_full(&self) {
        let p = self.target.data_pool();
        // Buffers the cores' caches hold are free too.
        let cached: usize = (0..self.pgs.len() as u32)
            .map(|c| self.cl.on(c, |r| self.target.core_ctx(r).cached_buffers()))
            .sum();
        assert_eq!(p.available() + cached, p.count(), "data buffers leaked");
    }
}

pub(super) fn who() -> HostIdentity {
    HostIdentity {
        hostnqn: DEFAULT_HOSTNQN.into(),
        hostid: *b"tcp-host-test-01",
        subnqn: NQN.into(),
    }
}
