//! `pollux-tgt` reloads its configuration on SIGHUP: a namespace added to
//! the file appears to a connected host without a reconnect (its
//! outstanding AER completes with a Namespace Attribute Changed notice,
//! the changed-namespace log and the active namespace list show it), a
//! namespace removed from the file goes away the same way, a broken file
//! changes nothing, and the stats file counts the Keep Alives and events;
//! subsystems, hosts and listeners follow the file too (through the
//! JSON-RPC methods), a reload whose listener cannot open leaves
//! nothing of its additions, and a listener that leaves the file
//! disconnects the queues that came in through it and no others; a
//! listener that leaves one subsystem (moved from the top-level
//! `[[listener]]` to the other subsystem's own `listeners`) disconnects
//! only that subsystem's queues there, and the address stays open.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

mod common;

use common::tcp_host::free_port;
use common::{tmp, Tgt, WAIT};

use std::net::TcpListener;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use pollux_nvmf::host::rdma::{RdmaHost, RdmaHostOptions};
use pollux_nvmf::host::{Controller, CtrlOptions, DataDir, HostIdentity, DEFAULT_HOSTNQN};
use pollux_nvmf::spec::features::{fid, AsyncEvent, FeatureCmd, AEN_NS_ATTR};
use pollux_nvmf::spec::identify::{cns, parse_ns_list, IdentifyCmd, IDENTIFY_DATA_SIZE};
use pollux_nvmf::spec::{AdminOpcode, NvmeCmd};
use pollux_reactor::mem::{DmaBuf, SgList};
use pollux_rpc::RpcClient;
use pollux_verbs::soft::Soft;
use pollux_verbs::CmAddr;
use rustix::process::Signal;
use serde_json::{json, Value};

const NQN: &str = "nqn.2016-06.io.pollux:tgt-reload-test";
const AER_CTX: u64 = 4242;

fn config(addr: &str, namespaces: &str) -> String {
    format!(
        r#"cores = "0"
provider = "soft"
[transport]
max_queue_depth = 64
num_shared_buffers = 64
buf_cache_size = 8
max_srq_depth = 256
num_cqe = 4096
hugepages = "never"

[[bdev]]
spec = "malloc:name=Malloc0,size=4M,block=512"

[[bdev]]
spec = "malloc:name=Malloc1,size=2M,block=512"

[[subsystem]]
nqn = "{NQN}"
serial = "POLLUXRELOAD"
allow_any_host = true
namespaces = [{namespaces}]

[[listener]]
traddr = "{addr}"
"#
    )
}

fn stats(path: &PathBuf) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn active_nsids(c: &mut Controller<RdmaHost<Soft>>) -> Vec<u32> {
    let buf = DmaBuf::alloc(IDENTIFY_DATA_SIZE).unwrap();
    let (_, data) = c
        .admin()
        .exec(
            "Identify",
            IdentifyCmd::to_cmd(cns::ACTIVE_NS_LIST, 0, 0),
            DataDir::FromCtrl,
            SgList::from_buf(buf),
            WAIT,
        )
        .unwrap();
    let mut b = vec![0u8; IDENTIFY_DATA_SIZE];
    data.copy_to_slice(&mut b);
    parse_ns_list(&b).unwrap()
}

fn submit_aer(c: &mut Controller<RdmaHost<Soft>>) {
    let aer = NvmeCmd::new(AdminOpcode::AsyncEventRequest.code(), 0);
    c.admin()
        .submit(aer, DataDir::None, SgList::new(), AER_CTX)
        .unwrap();
    c.admin().flush();
}

/// Poll the admin queue (keep-alives included) until the AER completes.
fn wait_event(c: &mut Controller<RdmaHost<Soft>>) -> AsyncEvent {
    let deadline = Instant::now() + WAIT;
    let mut ev = None;
    while ev.is_none() {
        assert!(Instant::now() < deadline, "no asynchronous event");
        c.admin().poll(&mut |cpl| {
            if cpl.ctx == AER_CTX {
                let cqe = cpl.result.unwrap();
                ev = Some(AsyncEvent::from_dw0(cqe.dw0));
            }
        });
        c.poll().unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    ev.unwrap()
}

fn changed_ns_log(c: &mut Controller<RdmaHost<Soft>>) -> Vec<u32> {
    let b = c.get_log_page(0x04, 0xFFFF_FFFF, 64, 0).unwrap();
    b.chunks(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .filter(|&n| n != 0)
        .collect()
}

#[test]
fn sighup_adds_and_removes_namespaces_under_a_connected_host() {
    let addr = format!("@pollux-tgt-reload-test-{}", std::process::id());
    let cfg = tmp("tgt-reload.toml");
    std::fs::write(&cfg, config(&addr, r#"{ bdev = "Malloc0", nsid = 1 }"#)).unwrap();
    let st = tmp("tgt-reload-stats.json");
    let _ = std::fs::remove_file(&st);
    let mut tgt = Tgt::start(&cfg, &["--stats-file", st.to_str().unwrap()]);
    tgt.wait_line("pollux-tgt: ready");

    let t = RdmaHost::<Soft>::open(None, CmAddr::new(addr.clone()), RdmaHostOptions::default())
        .unwrap();
    let who = HostIdentity {
        hostnqn: DEFAULT_HOSTNQN.into(),
        hostid: *b"pollux-reload-01",
        subnqn: NQN.into(),
    };
    let opts = CtrlOptions {
        // Keep Alives every 500 ms, each answered within 500 ms: a loaded
        // machine (a VM beside a build) delays the target's answer past
        // the 200 ms a 400 ms KATO allows.
        kato: Duration::from_millis(1000),
        ..CtrlOptions::default()
    };
    let mut c = Controller::connect(&t, who, opts).unwrap();
    assert_eq!(active_nsids(&mut c), vec![1]);
    // Ask for namespace notices, as Linux does, and leave an AER out.
    c.admin()
        .exec(
            "Set Features",
            FeatureCmd::set(fid::ASYNC_EVENT_CONFIG, AEN_NS_ATTR, 0),
            DataDir::None,
            SgList::new(),
            WAIT,
        )
        .unwrap();
    submit_aer(&mut c);

    // Namespace 2 appears in the file: SIGHUP.
    std::fs::write(
        &cfg,
        config(
            &addr,
            r#"{ bdev = "Malloc0", nsid = 1 }, { bdev = "Malloc1", nsid = 2 }"#,
        ),
    )
    .unwrap();
    tgt.signal(Signal::HUP);
    let line = tgt.wait_line("pollux-tgt: reloaded");
    assert!(line.contains("1 namespace(s) added, 0 removed"), "{line}");
    assert_eq!(wait_event(&mut c), AsyncEvent::NS_CHANGED);
    assert_eq!(changed_ns_log(&mut c), vec![2]);
    assert_eq!(active_nsids(&mut c), vec![1, 2]);
    assert!(c.is_alive(), "the host stayed connected");

    // A file that does not load changes nothing.
    std::fs::write(&cfg, "this is = not [valid").unwrap();
    tgt.signal(Signal::HUP);
    let line = tgt.wait_line("pollux-tgt: reload of");
    assert!(line.contains("failed"), "{line}");
    assert_eq!(active_nsids(&mut c), vec![1, 2]);

    // Namespace 1 leaves the file.
    submit_aer(&mut c);
    std::fs::write(&cfg, config(&addr, r#"{ bdev = "Malloc1", nsid = 2 }"#)).unwrap();
    tgt.signal(Signal::HUP);
    let line = tgt.wait_line("pollux-tgt: reloaded");
    assert!(line.contains("0 namespace(s) added, 1 removed"), "{line}");
    assert_eq!(wait_event(&mut c), AsyncEvent::NS_CHANGED);
    assert_eq!(changed_ns_log(&mut c), vec![1]);
    assert_eq!(active_nsids(&mut c), vec![2]);

    // The stats file counts the two events and the Keep Alives (every
    // 500 ms here).
    let deadline = Instant::now() + WAIT;
    loop {
        c.poll().unwrap();
        let s = stats(&st);
        let ka = s["keep_alives"].as_u64().unwrap_or(0);
        if s["async_events"].as_u64() == Some(2) && ka >= 3 {
            assert_eq!(s["keep_alive_timeouts"], 0, "{s}");
            assert_eq!(s["controllers"], 1, "{s}");
            break;
        }
        assert!(Instant::now() < deadline, "stats: {s}");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(c);
    tgt.signal(Signal::TERM);
    assert!(tgt.wait_exit().success());
}

const SECOND: &str = "nqn.2016-06.io.pollux:tgt-reload-second";
const HOST_A: &str = "nqn.2014-08.org.nvmexpress:uuid:reload-a";
const HOST_B: &str = "nqn.2014-08.org.nvmexpress:uuid:reload-b";

/// `config` plus a second subsystem with `hosts` and a TCP listener on
/// `port` (when given).
fn config_plus(addr: &str, hosts: &str, port: Option<u16>) -> String {
    let mut c = config(addr, r#"{ bdev = "Malloc0", nsid = 1 }"#);
    c.push_str(&format!(
        "\n[[subsystem]]\nnqn = \"{SECOND}\"\nallow_any_host = false\nhosts = [{hosts}]\nnamespaces = [{{ bdev = \"Malloc1\", nsid = 3 }}]\n"
    ));
    if let Some(p) = port {
        c.push_str(&format!(
            "\n[[listener]]\ntrtype = \"tcp\"\ntraddr = \"127.0.0.1\"\ntrsvcid = \"{p}\"\n"
        ));
    }
    c
}

fn subsystems(c: &mut RpcClient) -> Vec<Value> {
    c.call("nvmf_get_subsystems", Some(json!({})))
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn sighup_applies_subsystems_hosts_and_listeners_all_or_nothing() {
    let addr = format!("@pollux-tgt-reload-subsys-{}", std::process::id());
    let cfg = tmp("tgt-reload-subsys.toml");
    let sock = tmp("tgt-reload-subsys.sock");
    std::fs::write(&cfg, config(&addr, r#"{ bdev = "Malloc0", nsid = 1 }"#)).unwrap();
    let mut tgt = Tgt::start(&cfg, &["-r", sock.to_str().unwrap()]);
    tgt.wait_line("pollux-tgt: ready");
    let mut c = RpcClient::connect(&sock, WAIT).unwrap();
    assert_eq!(subsystems(&mut c).len(), 2);

    // A second subsystem with a host and a TCP listener appears.
    let port = free_port();
    std::fs::write(
        &cfg,
        config_plus(&addr, &format!("\"{HOST_A}\""), Some(port)),
    )
    .unwrap();
    tgt.signal(Signal::HUP);
    let line = tgt.wait_line("pollux-tgt: reload");
    assert!(line.contains("1 subsystem(s) added"), "{line}");
    assert!(line.contains("1 listener(s) added"), "{line}");
    assert!(!line.contains("not applied"), "{line}");
    let subs = subsystems(&mut c);
    assert_eq!(subs.len(), 3);
    let second = subs.iter().find(|s| s["nqn"] == SECOND).unwrap();
    assert_eq!(second["hosts"], json!([{"nqn": HOST_A}]));
    assert_eq!(second["allow_any_host"], false);
    assert_eq!(second["namespaces"][0]["nsid"], 3);
    assert_eq!(second["listen_addresses"].as_array().unwrap().len(), 2);
    let first = subs.iter().find(|s| s["nqn"] == NQN).unwrap();
    assert_eq!(
        first["listen_addresses"].as_array().unwrap().len(),
        2,
        "the new listener serves the running subsystem too"
    );
    assert!(
        TcpListener::bind(("127.0.0.1", port)).is_err(),
        "TCP is open"
    );

    // Hosts change, and two transport options and the cores, which need a
    // restart: the report names them and leaves them alone.
    std::fs::write(
        &cfg,
        config_plus(&addr, &format!("\"{HOST_B}\""), Some(port))
            .replacen("max_queue_depth = 64", "max_queue_depth = 32", 1)
            .replacen("num_cqe = 4096", "num_cqe = 8192", 1)
            .replacen("cores = \"0\"", "cores = \"0,1\"", 1),
    )
    .unwrap();
    tgt.signal(Signal::HUP);
    let line = tgt.wait_line("pollux-tgt: reload");
    assert!(line.contains("2 host change(s)"), "{line}");
    assert!(
        line.contains("not applied (restart needed): transport.max_queue_depth; not applied (restart needed): transport.num_cqe; not applied (restart needed): cores"),
        "{line}"
    );
    let subs = subsystems(&mut c);
    let second = subs.iter().find(|s| s["nqn"] == SECOND).unwrap();
    assert_eq!(second["hosts"], json!([{"nqn": HOST_B}]));

    // A reload whose new listener cannot open: nothing of it stays.
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = taken.local_addr().unwrap().port();
    let mut text = config_plus(&addr, &format!("\"{HOST_B}\""), Some(port));
    text = text.replace(SECOND, "nqn.2016-06.io.pollux:tgt-reload-third");
    text.push_str(&format!(
        "\n[[listener]]\ntrtype = \"tcp\"\ntraddr = \"127.0.0.1\"\ntrsvcid = \"{busy}\"\n"
    ));
    std::fs::write(&cfg, text).unwrap();
    let before = subsystems(&mut c);
    tgt.signal(Signal::HUP);
    let line = tgt.wait_line("pollux-tgt: reload");
    assert!(line.contains("failed"), "{line}");
    assert_eq!(subsystems(&mut c), before, "all or nothing");
    drop(taken);

    // The second subsystem and the TCP listener leave the file.
    std::fs::write(&cfg, config(&addr, r#"{ bdev = "Malloc0", nsid = 1 }"#)).unwrap();
    tgt.signal(Signal::HUP);
    let line = tgt.wait_line("pollux-tgt: reload");
    assert!(
        line.contains("1 removed, 0 host change(s), 0 listener(s) added, 1 removed"),
        "{line}"
    );
    assert_eq!(subsystems(&mut c).len(), 2);
    TcpListener::bind(("127.0.0.1", port)).expect("the TCP port is free again");
    drop(c);
    tgt.signal(Signal::TERM);
    assert!(tgt.wait_exit().success());
}

/// The one completion on `qp` (its data); `Err` when it fails or the
/// queue closes.
fn wait_one<Q: pollux_nvmf::host::HostQueue>(
    qp: &mut pollux_nvmf::host::Qpair<Q>,
) -> Result<Vec<u8>, String> {
    let deadline = Instant::now() + WAIT;
    let mut got = None;
    while got.is_none() {
        if !qp.is_alive() {
            return Err("the queue closed".into());
        }
        assert!(Instant::now() < deadline, "no completion and no close");
        qp.poll(&mut |c| {
            got = Some(c.result.map_err(|e| format!("{e:?}")).map(|_| {
                let mut have = vec![0u8; 4096];
                c.data.copy_to_slice(&mut have);
                have
            }))
        });
    }
    got.unwrap_or_else(|| Err("no completion".into()))
}

/// One 4 KiB write of a pattern to `lba` of namespace 1 and its read-back;
/// `Err` when the queue fails or closes.
fn write_read<Q: pollux_nvmf::host::HostQueue>(
    qp: &mut pollux_nvmf::host::Qpair<Q>,
    lba: u64,
) -> Result<(), String> {
    let mut w = DmaBuf::alloc(4096).unwrap();
    w.as_mut_slice()
        .iter_mut()
        .enumerate()
        .for_each(|(i, x)| *x = (i as u64 ^ lba) as u8);
    let want = w.as_slice().to_vec();
    qp.write(1, lba, 8, SgList::from_buf(w), 1)
        .map_err(|e| format!("{e:?}"))?;
    wait_one(qp)?;
    qp.read(1, lba, 8, SgList::from_buf(DmaBuf::alloc(4096).unwrap()), 2)
        .map_err(|e| format!("{e:?}"))?;
    if wait_one(qp)? == want {
        Ok(())
    } else {
        Err(format!("lba {lba}: read back differs"))
    }
}

fn live_queues(c: &mut RpcClient) -> u64 {
    pollux_rpc::nvmf::current_qpairs(&c.call("nvmf_get_stats", Some(json!({}))).unwrap()).unwrap()
}

fn rdma_host(addr: &str, id: u8) -> (RdmaHost<Soft>, Result<Controller<RdmaHost<Soft>>, String>) {
    rdma_host_to(addr, NQN, id)
}

/// Host `id` connected to `subnqn` through the soft RDMA address `addr`.
fn rdma_host_to(
    addr: &str,
    subnqn: &str,
    id: u8,
) -> (RdmaHost<Soft>, Result<Controller<RdmaHost<Soft>>, String>) {
    let opts = RdmaHostOptions {
        connect_timeout: Duration::from_secs(5),
        ..RdmaHostOptions::default()
    };
    let t = RdmaHost::<Soft>::open(None, CmAddr::new(addr.to_owned()), opts).unwrap();
    let mut hostid = *b"pollux-reload-l0";
    hostid[15] = id;
    let who = HostIdentity {
        hostnqn: format!("{DEFAULT_HOSTNQN}-{id}"),
        hostid,
        subnqn: subnqn.into(),
    };
    let c = Controller::connect(&t, who, CtrlOptions::default()).map_err(|e| e.to_string());
    (t, c)
}

#[test]
fn sighup_removing_a_listener_disconnects_its_queues_and_no_others() {
    let addr = format!("@pollux-tgt-reload-lsnr-{}", std::process::id());
    let other = format!("{addr}-2");
    let cfg = tmp("tgt-reload-lsnr.toml");
    let sock = tmp("tgt-reload-lsnr.sock");
    let base = config(&addr, r#"{ bdev = "Malloc0", nsid = 1 }"#);
    std::fs::write(
        &cfg,
        format!("{base}\n[[listener]]\ntraddr = \"{other}\"\n"),
    )
    .unwrap();
    let mut tgt = Tgt::start(&cfg, &["-r", sock.to_str().unwrap()]);
    tgt.wait_line("pollux-tgt: ready");
    let mut rpc = RpcClient::connect(&sock, WAIT).unwrap();

    let (kt, kc) = rdma_host(&addr, 1);
    let kc = kc.unwrap();
    let mut keep = kc.connect_io(&kt, 1, 16, None).unwrap();
    let (gt, gc) = rdma_host(&other, 2);
    let gc = gc.unwrap();
    let mut gone = gc.connect_io(&gt, 1, 16, None).unwrap();
    write_read(&mut keep, 0).unwrap();
    write_read(&mut gone, 8).unwrap();
    assert_eq!(live_queues(&mut rpc), 4);
    let destroyed = rpc.call("nvmf_get_stats", Some(json!({}))).unwrap()["destroyed"]
        .as_u64()
        .unwrap();

    // The second listener leaves the file.
    let reload = Reload {
        tgt: &mut tgt,
        cfg: &cfg,
        rpc: &mut rpc,
    };
    reload.closes(
        &base,
        "0 listener(s) added, 1 removed",
        &mut keep,
        &mut gone,
    );
    let st = rpc.call("nvmf_get_stats", Some(json!({}))).unwrap();
    assert_eq!(st["destroyed"].as_u64().unwrap(), destroyed + 2);
    drop((gone, gc, gt));
    let (_t, refused) = rdma_host(&other, 3);
    assert!(refused.is_err(), "connected through a removed listener");
    write_read(&mut keep, 0).unwrap();
    assert_eq!(live_queues(&mut rpc), 2);
    drop(rpc);
    tgt.signal(Signal::TERM);
    assert!(tgt.wait_exit().success());
}

#[test]
fn sighup_moving_a_listener_to_one_subsystem_disconnects_only_the_others_queues() {
    let addr = format!("@pollux-tgt-reload-own-{}", std::process::id());
    let own = format!("{addr}-second");
    let cfg = tmp("tgt-reload-own.toml");
    let sock = tmp("tgt-reload-own.sock");
    let second = format!(
        "\n[[subsystem]]\nnqn = \"{SECOND}\"\nallow_any_host = true\nnamespaces = [{{ bdev = \"Malloc1\", nsid = 1 }}]\nlisteners = [{{ traddr = \"{own}\" }}]\n"
    );
    // Both subsystems on the top-level address, SECOND on its own too.
    let before = format!(
        "{}{second}",
        config(&addr, r#"{ bdev = "Malloc0", nsid = 1 }"#)
    );
    std::fs::write(&cfg, &before).unwrap();
    let mut tgt = Tgt::start(&cfg, &["-r", sock.to_str().unwrap()]);
    tgt.wait_line("pollux-tgt: ready");
    let mut rpc = RpcClient::connect(&sock, WAIT).unwrap();
    let (kt, kc) = rdma_host_to(&addr, NQN, 1);
    let kc = kc.unwrap();
    let mut keep = kc.connect_io(&kt, 1, 16, None).unwrap();
    let (gt, gc) = rdma_host_to(&addr, SECOND, 2);
    let gc = gc.unwrap();
    let mut gone = gc.connect_io(&gt, 1, 16, None).unwrap();
    write_read(&mut keep, 0).unwrap();
    write_read(&mut gone, 8).unwrap();
    assert_eq!(live_queues(&mut rpc), 4);

    // The address becomes NQN's own: SECOND lets go of it.
    let after = before
        .replace(
            &format!("[[listener]]\ntraddr = \"{addr}\"\n"),
            "",
        )
        .replace(
            "namespaces = [{ bdev = \"Malloc0\", nsid = 1 }]",
            &format!(
                "namespaces = [{{ bdev = \"Malloc0\", nsid = 1 }}]\nlisteners = [{{ traddr = \"{addr}\" }}]"
            ),
        );
    assert_ne!(after, before);
    let reload = Reload {
        tgt: &mut tgt,
        cfg: &cfg,
        rpc: &mut rpc,
    };
    reload.closes(
        &after,
        "0 listener(s) added, 0 removed",
        &mut keep,
        &mut gone,
    );
    drop((gone, gc, gt));
    let (_t, refused) = rdma_host_to(&addr, SECOND, 3);
    let e = refused.expect_err("SECOND connected through an address it left");
    assert!(e.contains("host not allowed"), "{e}");
    let (ot, oc) = rdma_host_to(&own, SECOND, 4);
    oc.expect("SECOND through its own address");
    drop(ot);
    assert_eq!(rpc_listeners(&mut rpc, NQN), vec![addr.clone()]);
    assert_eq!(rpc_listeners(&mut rpc, SECOND), vec![own.clone()]);
    write_read(&mut keep, 0).unwrap();
    drop(rpc);
    tgt.signal(Signal::TERM);
    assert!(tgt.wait_exit().success());
}

/// A running target, its configuration file and its RPC client.
struct Reload<'a> {
    tgt: &'a mut Tgt,
    cfg: &'a PathBuf,
    rpc: &'a mut RpcClient,
}

impl Reload<'_> {
    /// Writes `text` and reloads it: the report says `report`, `gone`'s
    /// queue is closed, `keep`'s keeps serving I/O, and only `keep`'s two
    /// queues are left.
    fn closes<Q: pollux_nvmf::host::HostQueue>(
        self,
        text: &str,
        report: &str,
        keep: &mut pollux_nvmf::host::Qpair<Q>,
        gone: &mut pollux_nvmf::host::Qpair<Q>,
    ) {
        std::fs::write(self.cfg, text).unwrap();
        self.tgt.signal(Signal::HUP);
        let line = self.tgt.wait_line("pollux-tgt: reload");
        assert!(line.contains(report), "{line}");
        assert!(
            write_read(gone, 8).is_err(),
            "a queue of the listener that went still serves I/O"
        );
        for round in 0..20 {
            write_read(keep, 16 * round).unwrap();
        }
        let deadline = Instant::now() + WAIT;
        while live_queues(self.rpc) != 2 {
            assert!(Instant::now() < deadline, "the queues of the listener stay");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// `traddr` of each listener of `nqn` (`nvmf_subsystem_get_listeners`).
fn rpc_listeners(c: &mut RpcClient, nqn: &str) -> Vec<String> {
    c.call("nvmf_subsystem_get_listeners", Some(json!({"nqn": nqn})))
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["address"]["traddr"].as_str().unwrap().to_owned())
        .collect()
}
