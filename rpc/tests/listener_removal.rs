//! `nvmf_subsystem_remove_listener` over a real target, for RDMA (soft
//! provider) and TCP: two subsystems, each on its own listener, a host
//! connected through each. Removing one listener disconnects the queues
//! that came in through it and no other: its host sees its queue closed
//! and cannot connect through it again (refused, nothing left behind),
//! while the other host keeps doing verified I/O without an error; and
//! every resource the closed queues took comes back (live queues, the
//! transport's destroyed count, the target's slot buffers, descriptors).

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pollux_bdev::BdevRegistry;
use pollux_nvmf::host::rdma::{RdmaHost, RdmaHostOptions};
use pollux_nvmf::host::tcp::{TcpHost, TcpHostOptions};
use pollux_nvmf::host::{
    Controller, CtrlOptions, HostIdentity, HostQueue, HostTransport, Qpair, DEFAULT_HOSTNQN,
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

const KEEP: &str = "nqn.2016-06.io.spdk:keep";
const GONE: &str = "nqn.2016-06.io.spdk:gone";
/// How long the target may take to finish tearing a queue down.
const SETTLE: Duration = Duration::from_secs(20);
/// Bytes of one verified I/O.
const IO: usize = 4096;

/// The two tests count this process's descriptors: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// A target on one reactor, managed through the dispatcher.
struct Rig {
    svc: RpcService,
    target: Arc<Target>,
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
    fn new(rdma: bool) -> Rig {
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
        for b in ["Malloc0", "Malloc1"] {
            common::ok(
                &svc,
                "bdev_malloc_create",
                json!({"name": b, "num_blocks": 2048, "block_size": 512}),
            );
        }
        Rig {
            svc,
            target,
            set: Some(set),
        }
    }

    fn call(&self, method: &str, params: Value) -> Value {
        common::ok(&self.svc, method, params)
    }

    /// Subsystem `nqn` with `bdev` as namespace 1 on `address`.
    fn subsystem(&self, nqn: &str, bdev: &str, address: &Value) {
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
    fn live(&self) -> u64 {
        let st = self.call("nvmf_get_stats", json!({}));
        st["poll_groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["current_io_qpairs"].as_u64().unwrap())
            .sum()
    }

    fn destroyed(&self) -> u64 {
        self.call("nvmf_get_stats", json!({}))["destroyed"]
            .as_u64()
            .unwrap()
    }

    /// Slot buffers on the target's shared pool (queues take theirs at
    /// creation and give them back when destroyed).
    fn slots_free(&self) -> usize {
        self.target.slot_pool().map_or(0, |p| p.available())
    }

    /// Wait until `live()` is `n`.
    fn wait_live(&self, n: u64) {
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

/// Entries of `/proc/self/fd`.
fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn who(subnqn: &str, id: u8) -> HostIdentity {
    let mut hostid = *b"pollux-lsnr-rm-0";
    hostid[15] = id;
    HostIdentity {
        hostnqn: format!("{DEFAULT_HOSTNQN}-{id}"),
        hostid,
        subnqn: subnqn.into(),
    }
}

/// A connected host: its controller and one I/O queue.
struct Host<T: HostTransport> {
    queue: Qpair<T::Queue>,
    _ctrl: Controller<T>,
    round: u64,
}

fn connect<T: HostTransport>(t: &T, subnqn: &str, id: u8) -> Result<Host<T>, String> {
    let opts = CtrlOptions {
        timeout: Duration::from_secs(10),
        ..CtrlOptions::default()
    };
    let ctrl = Controller::connect(t, who(subnqn, id), opts).map_err(|e| e.to_string())?;
    let queue = ctrl.connect_io(t, 1, 16, None).map_err(|e| e.to_string())?;
    Ok(Host {
        queue,
        _ctrl: ctrl,
        round: 0,
    })
}

/// Waits for the one completion on `qp`; `Err` when the queue closed.
fn complete<Q: HostQueue>(qp: &mut Qpair<Q>) -> Result<Option<Vec<u8>>, String> {
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
    fn verified_io(&mut self) -> Result<(), String> {
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

/// The flow both transports share; `host(address)` makes a host
/// transport to a listen address.
fn remove_one_listener<T: HostTransport>(
    rig: &Rig,
    keep_at: Value,
    gone_at: Value,
    host: impl Fn(&Value) -> T,
) {
    rig.subsystem(KEEP, "Malloc0", &keep_at);
    rig.subsystem(GONE, "Malloc1", &gone_at);
    let keep_t = host(&keep_at);
    let mut keep = connect(&keep_t, KEEP, 1).unwrap();
    keep.verified_io().unwrap();
    // What the target holds with only the host that stays.
    rig.wait_live(2);
    let (slots, fds_before, destroyed) = (rig.slots_free(), fds(), rig.destroyed());

    let gone_t = host(&gone_at);
    let mut gone = connect(&gone_t, GONE, 2).unwrap();
    gone.verified_io().unwrap();
    keep.verified_io().unwrap();
    rig.wait_live(4);
    assert!(rig.slots_free() < slots, "the new queues took slot buffers");

    rig.call(
        "nvmf_subsystem_remove_listener",
        json!({"nqn": GONE, "listen_address": gone_at}),
    );
    // The reply came after every core started closing them.
    let err = gone
        .verified_io()
        .expect_err("a queue of the removed listener still serves I/O");
    assert!(!gone.queue.is_alive(), "{err}: the queue is not closed");
    for _ in 0..20 {
        keep.verified_io().unwrap();
    }
    rig.wait_live(2);
    assert_eq!(
        rig.destroyed(),
        destroyed + 2,
        "admin and I/O queue destroyed"
    );
    assert_eq!(rig.slots_free(), slots, "every slot buffer came back");
    drop(gone);
    drop(gone_t);

    // No way back in through it: refused, and nothing taken for it.
    let again = host(&gone_at);
    assert!(
        connect(&again, GONE, 3).is_err(),
        "connected through a removed listener"
    );
    drop(again);
    rig.wait_live(2);
    assert_eq!(rig.slots_free(), slots);
    // The closed listener's descriptor is gone too.
    assert_eq!(fds(), fds_before - 1, "descriptors came back");
    let subs = rig.call("nvmf_get_subsystems", json!({}));
    let gone_sub = subs
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["nqn"] == GONE)
        .unwrap();
    assert_eq!(gone_sub["listen_addresses"], json!([]));

    // The other host never noticed.
    for _ in 0..20 {
        keep.verified_io().unwrap();
    }
    assert_eq!(rig.live(), 2);
}

fn address(trtype: &str, traddr: &str, port: u16) -> Value {
    json!({"trtype": trtype, "adrfam": "IPv4", "traddr": traddr, "trsvcid": port.to_string()})
}

/// `traddr:trsvcid` of a listen address.
fn host_addr(a: &Value) -> String {
    format!(
        "{}:{}",
        a["traddr"].as_str().unwrap(),
        a["trsvcid"].as_str().unwrap()
    )
}

#[test]
fn removing_an_rdma_listener_disconnects_its_queues_and_returns_their_resources() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let rig = Rig::new(true);
    rig.call("nvmf_create_transport", json!({"trtype": "RDMA"}));
    let host = |a: &Value| {
        let opts = RdmaHostOptions {
            connect_timeout: Duration::from_secs(10),
            ..RdmaHostOptions::default()
        };
        RdmaHost::<Soft>::open(None, CmAddr::new(host_addr(a)), opts).unwrap()
    };
    remove_one_listener(
        &rig,
        address("RDMA", "192.0.2.10", 4420),
        address("RDMA", "192.0.2.10", 4421),
        host,
    );
}

#[test]
fn removing_a_tcp_listener_disconnects_its_queues_and_returns_their_resources() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let rig = Rig::new(false);
    rig.call("nvmf_create_transport", json!({"trtype": "TCP"}));
    let host = |a: &Value| TcpHost::new(host_addr(a).parse().unwrap(), TcpHostOptions::default());
    let (p1, p2) = (common::free_port(), common::free_port());
    remove_one_listener(
        &rig,
        address("TCP", "127.0.0.1", p1),
        address("TCP", "127.0.0.1", p2),
        host,
    );
}
