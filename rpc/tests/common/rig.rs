//! A target on one reactor managed through the dispatcher, with hosts
//! doing verified I/O: shared by the listener tests (`#[path]` module).

#![allow(clippy::unwrap_used, dead_code)] // test helpers: each test file uses a subset

use std::sync::Arc;
use std::time::{Duration, Instant};

use pollux_bdev::BdevRegistry;
use pollux_nvmf::host::rdma::{RdmaHost, RdmaHostOptions};
use pollux_nvmf::host::tcp::{TcpHost, TcpHostOptions};
use pollux_nvmf::host::{
    Controller, CtrlOptions, HostError, HostIdentity, HostQueue, HostTransport, Qpair,
    DEFAULT_HOSTNQN,
};
use pollux_nvmf::target::rdma::{RdmaOptions, RdmaTransport};
use pollux_nvmf::target::{Target, TargetOptions};
use pollux_reactor::mem::{DmaBuf, SgList};
use pollux_reactor::{launch, Cores, LaunchConfig, ReactorSet};
use pollux_rpc::bdev::BdevSubsystem;
use pollux_rpc::nvmf::{CoreGroups, LocalGroups, NvmfSubsystem};
use pollux_rpc::{CoreBus, RpcService};
use pollux_verbs::soft::Soft;
use pollux_verbs::CmAddr;
use serde_json::{json, Value};

/// How long the target may take to finish tearing a queue down.
pub const SETTLE: Duration = Duration::from_secs(20);
/// Bytes of one verified I/O.
pub const IO: usize = 4096;

/// A target on one reactor, managed through the dispatcher.
pub struct Rig {
    /// The dispatcher.
    pub svc: RpcService,
    /// The target.
    pub target: Arc<Target>,
    set: Option<ReactorSet>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Some(set) = self.set.take() {
            let _ = self.svc.cores().on_each_core(|r| {
                LocalGroups.release(r, "rdma");
                LocalGroups.release(r, "tcp");
            });
            set.stop_all();
            let _ = set.join();
        }
    }
}

impl Rig {
    /// A target with `Malloc0` and `Malloc1`; `rdma`: with the soft RDMA
    /// transport made as the application makes it (started on the core).
    pub fn new(rdma: bool) -> Rig {
        let rig = Rig::bare(rdma);
        for b in ["Malloc0", "Malloc1"] {
            rig.call(
                "bdev_malloc_create",
                json!({"name": b, "num_blocks": 2048, "block_size": 512}),
            );
        }
        rig
    }

    /// As [`new`](Self::new) without the bdevs (a configuration loads them).
    pub fn bare(rdma: bool) -> Rig {
        let target = Target::new(TargetOptions {
            max_queue_depth: 32,
            num_slot_buffers: 1024,
            ..TargetOptions::for_tests()
        })
        .unwrap();
        if rdma {
            let t = RdmaTransport::<Soft>::new(&target, RdmaOptions::for_tests()).unwrap();
            target.add_transport(t).unwrap();
        }
        let set = launch(LaunchConfig::new(Cores::first(1)), |_| {}).unwrap();
        let reg = Arc::new(BdevRegistry::new());
        let mut svc = RpcService::new(CoreBus::new(set.messenger().clone()));
        svc.register(BdevSubsystem::new(Arc::clone(&reg))).unwrap();
        svc.register(NvmfSubsystem::new(
            Arc::clone(&target),
            reg,
            Arc::new(LocalGroups),
        ))
        .unwrap();
        let t = Arc::clone(&target);
        svc.cores()
            .on_each_core(move |r| {
                for g in t.start_poll_groups(r).unwrap() {
                    LocalGroups.keep(r, g);
                }
            })
            .unwrap();
        Rig {
            svc,
            target,
            set: Some(set),
        }
    }

    pub fn call(&self, method: &str, params: Value) -> Value {
        super::common::ok(&self.svc, method, params)
    }

    /// Subsystem `nqn` with `bdev` as namespace 1 on `address`.
    pub fn subsystem(&self, nqn: &str, bdev: &str, address: &Value) {
        self.call(
            "nvmf_create_subsystem",
            json!({"nqn": nqn, "allow_any_host": true}),
        );
        self.call(
            "nvmf_subsystem_add_ns",
            json!({"nqn": nqn, "namespace": {"bdev_name": bdev}}),
        );
        self.call(
            "nvmf_subsystem_add_listener",
            json!({"nqn": nqn, "listen_address": address}),
        );
    }

    /// Live queues on every core, from `nvmf_get_stats`.
    pub fn live(&self) -> u64 {
        pollux_rpc::nvmf::current_qpairs(&self.call("nvmf_get_stats", json!({}))).unwrap()
    }

    pub fn destroyed(&self) -> u64 {
        self.call("nvmf_get_stats", json!({}))["destroyed"]
            .as_u64()
            .unwrap()
    }

    /// Slot buffers on the target's shared pool (queues take theirs at
    /// creation and give them back when destroyed).
    pub fn slots_free(&self) -> usize {
        self.target.slot_pool().map_or(0, |p| p.available())
    }

    /// Wait until `live()` is `n`.
    pub fn wait_live(&self, n: u64) {
        let start = Instant::now();
        while self.live() != n {
            assert!(
                start.elapsed() < SETTLE,
                "still {} live queue(s), want {n}",
                self.live()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Host `id`'s identity for `subnqn`.
pub fn who(subnqn: &str, id: u8) -> HostIdentity {
    let mut hostid = *b"pollux-lsnr-rm-0";
    hostid[15] = id;
    HostIdentity {
        hostnqn: format!("{DEFAULT_HOSTNQN}-{id}"),
        hostid,
        subnqn: subnqn.into(),
    }
}

/// A connected host: its controller and one I/O queue.
pub struct Host<T: HostTransport> {
    /// Its I/O queue.
    pub queue: Qpair<T::Queue>,
    _ctrl: Controller<T>,
    round: u64,
}

/// Host `id` connected to `subnqn` through `t`: a controller and I/O
/// queue 1.
pub fn connect<T: HostTransport>(t: &T, subnqn: &str, id: u8) -> Result<Host<T>, HostError> {
    let opts = CtrlOptions {
        timeout: Duration::from_secs(10),
        ..CtrlOptions::default()
    };
    let ctrl = Controller::connect(t, who(subnqn, id), opts)?;
    let queue = ctrl.connect_io(t, 1, 16, None)?;
    Ok(Host {
        queue,
        _ctrl: ctrl,
        round: 0,
    })
}

/// Waits for the one completion on `qp`; `Err` when the queue closed.
pub fn complete<Q: HostQueue>(qp: &mut Qpair<Q>) -> Result<Option<Vec<u8>>, String> {
    let start = Instant::now();
    let mut out = None;
    while out.is_none() {
        if !qp.is_alive() {
            return Err("the queue closed".into());
        }
        assert!(start.elapsed() < SETTLE, "no completion and no close");
        qp.poll(&mut |c| {
            out = Some(c.result.map(|_| {
                let mut have = vec![0u8; IO];
                c.data.copy_to_slice(&mut have);
                have
            }))
        });
    }
    match out {
        Some(Ok(d)) => Ok(Some(d)),
        Some(Err(e)) => Err(format!("{e:?}")),
        None => Ok(None),
    }
}

impl<T: HostTransport> Host<T> {
    /// Writes a pattern to a block, reads it back and compares.
    pub fn verified_io(&mut self) -> Result<(), String> {
        self.round += 1;
        let lba = (self.round % 256) * 8;
        let mut w = DmaBuf::alloc(IO).unwrap();
        for (i, x) in w.as_mut_slice().iter_mut().enumerate() {
            *x = (i as u64 * 13 + self.round) as u8;
        }
        let want = w.as_slice().to_vec();
        self.queue
            .write(1, lba, 8, SgList::from_buf(w), 1)
            .map_err(|e| format!("{e:?}"))?;
        complete(&mut self.queue)?;
        let r = DmaBuf::alloc(IO).unwrap();
        self.queue
            .read(1, lba, 8, SgList::from_buf(r), 2)
            .map_err(|e| format!("{e:?}"))?;
        let have = complete(&mut self.queue)?;
        if have.as_deref() != Some(&want[..]) {
            return Err(format!("round {}: read back differs", self.round));
        }
        Ok(())
    }
}

/// An IPv4 listen address, SPDK's shape.
pub fn address(trtype: &str, traddr: &str, port: u16) -> Value {
    json!({"trtype": trtype, "adrfam": "IPv4", "traddr": traddr, "trsvcid": port.to_string()})
}

/// A host transport over the soft RDMA provider to listen address `a`.
pub fn rdma_host(a: &Value) -> RdmaHost<Soft> {
    let opts = RdmaHostOptions {
        connect_timeout: Duration::from_secs(10),
        ..RdmaHostOptions::default()
    };
    RdmaHost::<Soft>::open(None, CmAddr::new(host_addr(a)), opts).unwrap()
}

/// A NVMe/TCP host transport to listen address `a`.
pub fn tcp_host(a: &Value) -> TcpHost {
    TcpHost::new(host_addr(a).parse().unwrap(), TcpHostOptions::default())
}

/// `traddr:trsvcid` of a listen address.
pub fn host_addr(a: &Value) -> String {
    format!(
        "{}:{}",
        a["traddr"].as_str().unwrap(),
        a["trsvcid"].as_str().unwrap()
    )
}
