//! Which fabric the churn tests run over: NVMe-oF over the soft RDMA
//! provider, NVMe/TCP on loopback, or iSCSI over iSER on the soft provider.
//! The target child and the host children learn it from [`FABRIC_ENV`];
//! the in-process NVMe-oF host opens its transport through [`ChurnHost`].

use std::net::SocketAddr;
use std::time::Duration;

use pollux_nvmf::host::rdma::{MemMode, RdmaHost, RdmaHostOptions};
use pollux_nvmf::host::tcp::{TcpHost, TcpHostOptions};
use pollux_nvmf::host::HostTransport;
use pollux_verbs::soft::Soft;
use pollux_verbs::CmAddr;

/// Environment variable naming the fabric of a child (`rdma` or `tcp`).
pub const FABRIC_ENV: &str = "POLLUX_CHURN_FABRIC";

/// The fabric of a churn run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fabric {
    /// NVMe-oF over the soft RDMA provider (an intra-host address).
    Rdma,
    /// NVMe/TCP over 127.0.0.1.
    Tcp,
    /// iSCSI over iSER on the soft provider (an intra-host address).
    Iser,
}

impl Fabric {
    /// Its name in [`FABRIC_ENV`].
    pub fn name(self) -> &'static str {
        match self {
            Fabric::Rdma => "rdma",
            Fabric::Tcp => "tcp",
            Fabric::Iser => "iser",
        }
    }

    /// Queues (NVMe-oF: admin and one I/O queue) or connections (iSER)
    /// the target serves for one host.
    pub fn queues_per_host(self) -> usize {
        match self {
            Fabric::Rdma | Fabric::Tcp => 2,
            Fabric::Iser => 1,
        }
    }

    /// The fabric a child was started for (RDMA unless [`FABRIC_ENV`]
    /// says `tcp` or `iser`).
    pub fn from_env() -> Fabric {
        match std::env::var(FABRIC_ENV).as_deref() {
            Ok("tcp") => Fabric::Tcp,
            Ok("iser") => Fabric::Iser,
            _ => Fabric::Rdma,
        }
    }

    /// A fresh listen address for a target child (`tag` names the test):
    /// an abstract soft-provider name, or 127.0.0.1 and a port the OS
    /// just handed out.
    pub fn fresh_addr(self, tag: &str) -> String {
        match self {
            Fabric::Rdma | Fabric::Iser => {
                format!("@pollux-churn-{}-{tag}-{}", self.name(), std::process::id())
            }
            Fabric::Tcp => {
                format!("127.0.0.1:{}", pollux_reactor::free_tcp_port("127.0.0.1"))
            }
        }
    }
}

/// A host transport the churn cycles run over.
pub trait ChurnHost: HostTransport + Sized {
    /// One to the target at `addr`; `n` (the cycle) varies its options
    /// from cycle to cycle.
    ///
    /// # Errors
    /// Why it cannot be opened.
    fn open(addr: &str, n: u64) -> Result<Self, String>;
}

/// `register-always` memory for even `n`, `pool` for odd.
impl ChurnHost for RdmaHost<Soft> {
    fn open(addr: &str, n: u64) -> Result<Self, String> {
        let opts = RdmaHostOptions {
            mem_mode: if n % 2 == 0 {
                MemMode::RegisterAlways
            } else {
                MemMode::Pool
            },
            connect_timeout: Duration::from_secs(120),
            ..RdmaHostOptions::default()
        };
        RdmaHost::<Soft>::open(None, CmAddr::new(addr.to_string()), opts)
            .map_err(|e| format!("open: {e}"))
    }
}

/// Header digests on every second cycle, data digests on every fourth.
impl ChurnHost for TcpHost {
    fn open(addr: &str, n: u64) -> Result<Self, String> {
        let a: SocketAddr = addr
            .parse()
            .map_err(|e| format!("'{addr}' is not a socket address: {e}"))?;
        Ok(TcpHost::new(
            a,
            TcpHostOptions {
                header_digest: n % 2 == 1,
                data_digest: n % 4 == 1,
                connect_timeout: Duration::from_secs(120),
            },
        ))
    }
}
