//! `pollux-perf --spawn-target`: our NVMe-oF RDMA target (the same target
//! core and RDMA transport `pollux-tgt` runs) in this process, on its own
//! reactors, listening on a soft-provider address, with one subsystem on
//! one bdev. Its reactors' busy time is read straight from their stats.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use pollux_bdev::BdevRegistry;
use pollux_nvmf::spec::transport_id::{AdrFam, TrType, TransportId};
use pollux_nvmf::target::rdma::{RdmaOptions, RdmaTransport};
use pollux_nvmf::target::{NamespaceConfig, SubsystemConfig, Target, TargetOptions};
use pollux_reactor::{launch, Cores, LaunchConfig, PollStatus, ReactorSet};
use pollux_verbs::soft::Soft;

use crate::AppError;

/// The subsystem NQN of a spawned target.
pub const SPAWN_NQN: &str = "nqn.2024-01.io.pollux:spawned";

/// A target running in this process.
pub struct SpawnedTarget {
    set: Option<ReactorSet>,
    addr: String,
    _target: Arc<Target>,
    _registry: BdevRegistry,
}

impl std::fmt::Debug for SpawnedTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpawnedTarget")
            .field("addr", &self.addr)
            .finish()
    }
}

impl SpawnedTarget {
    /// Start a target on `cores` serving bdev `bdev_spec` (e.g.
    /// `null:size=1G,block=4096`) over the software RDMA provider.
    ///
    /// # Errors
    /// [`AppError::Bdev`], [`AppError::Setup`], [`AppError::Reactor`].
    pub fn start(bdev_spec: &str, cores: Cores) -> Result<Self, AppError> {
        static N: AtomicUsize = AtomicUsize::new(0);
        let setup = |e: String| AppError::Setup(format!("spawned target: {e}"));
        let target = Target::new(TargetOptions::default()).map_err(|e| setup(e.to_string()))?;
        let mut sc = SubsystemConfig::new(SPAWN_NQN);
        sc.allow_any_host = true;
        let sub = target.add_subsystem(sc).map_err(|e| setup(e.to_string()))?;
        let registry = BdevRegistry::new();
        let bdev = registry
            .create(bdev_spec)
            .map_err(|e| AppError::Bdev(e.to_string()))?;
        sub.add_namespace(NamespaceConfig::new(bdev).with_nsid(1))
            .map_err(|e| setup(e.to_string()))?;
        let transport = RdmaTransport::<Soft>::new(&target, RdmaOptions::default())
            .map_err(|e| setup(e.to_string()))?;
        target
            .add_transport(transport.clone())
            .map_err(|e| setup(e.to_string()))?;
        let addr = format!(
            "@pollux-perf-tgt-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        target
            .add_listener(TransportId {
                trtype: TrType::Rdma,
                adrfam: AdrFam::IntraHost,
                traddr: addr.clone(),
                trsvcid: String::new(),
            })
            .map_err(|e| setup(e.to_string()))?;
        let ncores = cores.len();
        let (tx, rx) = std::sync::mpsc::channel::<Result<(), String>>();
        let set = launch(LaunchConfig::new(cores), move |r| {
            let res = match transport.create_poll_group(r) {
                Ok(pg) => {
                    r.add_poller("perf-target-keep", move || {
                        let _ = &pg;
                        PollStatus::Idle
                    });
                    Ok(())
                }
                Err(e) => Err(e.to_string()),
            };
            let _ = tx.send(res);
        })
        .map_err(|e| AppError::Reactor(e.to_string()))?;
        // The listener is up once the poll groups exist: wait for them.
        for _ in 0..ncores {
            let res = match rx.recv_timeout(std::time::Duration::from_secs(10)) {
                Ok(r) => r,
                Err(_) => Err("the target reactors did not start".to_string()),
            };
            if let Err(e) = res {
                set.stop_all();
                let _ = set.join();
                return Err(setup(format!("poll group: {e}")));
            }
        }
        Ok(SpawnedTarget {
            set: Some(set),
            addr,
            _target: target,
            _registry: registry,
        })
    }

    /// The transport ID to give `pollux-perf -r`.
    pub fn trid(&self) -> String {
        format!("trtype:soft traddr:{} subnqn:{SPAWN_NQN}", self.addr)
    }

    /// `(busy_ns, idle_ns)` summed over the target's reactors.
    pub fn load(&self) -> Option<(u64, u64)> {
        let stats = self.set.as_ref()?.stats().ok()?;
        Some(
            stats
                .iter()
                .fold((0, 0), |(b, i), s| (b + s.busy_ns, i + s.idle_ns)),
        )
    }

    /// Stop the target's reactors and wait for them.
    pub fn stop(&mut self) {
        if let Some(s) = self.set.take() {
            s.stop_all();
            let _ = s.join();
        }
    }
}

impl Drop for SpawnedTarget {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Busy percentage between two `(busy_ns, idle_ns)` samples.
pub fn busy_pct(a: (u64, u64), b: (u64, u64)) -> Option<f64> {
    let busy = b.0.checked_sub(a.0)?;
    let idle = b.1.checked_sub(a.1)?;
    (busy + idle > 0).then(|| busy as f64 * 100.0 / (busy + idle) as f64)
}
