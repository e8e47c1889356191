//! The Unix-socket server: SPDK's framing, the socket file, and bad input
//! (malformed JSON, oversized requests, silent clients, clients that leave
//! mid-request, several clients at once), each leaving the server serving.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pollux_bdev::BdevRegistry;
use pollux_rpc::bdev::BdevSubsystem;
use pollux_rpc::error::{INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR};
use pollux_rpc::{
    ClientError, CoreBus, RpcClient, RpcServer, RpcService, ServerConfig, ServerError,
};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(10);

fn sock(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}.sock", std::process::id()))
}

fn start(name: &str, tune: impl FnOnce(&mut ServerConfig)) -> (RpcServer, Arc<BdevRegistry>) {
    let reg = Arc::new(BdevRegistry::new());
    let mut svc = RpcService::new(CoreBus::none());
    svc.register(BdevSubsystem::new(Arc::clone(&reg))).unwrap();
    let mut cfg = ServerConfig::new(sock(name));
    tune(&mut cfg);
    (RpcServer::start(cfg, Arc::new(svc)).unwrap(), reg)
}

fn client(server: &RpcServer) -> RpcClient {
    RpcClient::connect(server.path(), WAIT).unwrap()
}

fn still_serves(server: &RpcServer) {
    let v = client(server).call("spdk_get_version", None).unwrap();
    assert!(v["version"].is_string());
}

#[test]
fn socket_is_owner_only_and_stale_or_live_paths_are_handled() {
    let (server, _) = start("perm", |_| {});
    let path = server.path().to_owned();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    // A second server on a live path is refused.
    let svc = Arc::new(RpcService::new(CoreBus::none()));
    let e = RpcServer::start(ServerConfig::new(&path), Arc::clone(&svc)).unwrap_err();
    assert!(matches!(e, ServerError::InUse(_)), "{e}");
    still_serves(&server);
    server.stop();
    assert!(!path.exists(), "stop removes the socket file");
    // A stale socket file (nobody listening) is replaced.
    let stale = std::os::unix::net::UnixListener::bind(&path).unwrap();
    drop(stale);
    assert!(path.exists());
    let again = RpcServer::start(ServerConfig::new(&path), Arc::clone(&svc)).unwrap();
    again.stop();
    // A regular file is never replaced.
    std::fs::write(&path, b"mine").unwrap();
    let e = RpcServer::start(ServerConfig::new(&path), svc).unwrap_err();
    assert!(matches!(e, ServerError::NotASocket(_)), "{e}");
    assert_eq!(std::fs::read(&path).unwrap(), b"mine");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn requests_as_rpc_py_sends_them_pretty_and_in_pieces() {
    let (server, reg) = start("framing", |_| {});
    let mut c = client(&server);
    // rpc.py: json.dumps(req, indent=2), several joined by newlines.
    let one =
        serde_json::to_string_pretty(&json!({"jsonrpc": "2.0", "method": "bdev_malloc_create",
        "id": 1, "params": {"name": "A", "num_blocks": 8, "block_size": 512}}))
        .unwrap();
    let two = serde_json::to_string_pretty(
        &json!({"jsonrpc": "2.0", "method": "bdev_get_bdevs", "id": 2}),
    )
    .unwrap();
    let both = format!("{one}\n{two}");
    let (head, tail) = both.as_bytes().split_at(one.len() / 2);
    c.send_raw(head).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    c.send_raw(tail).unwrap();
    let a = c.read_value().unwrap();
    assert_eq!(
        (a["id"].clone(), a["result"].clone()),
        (json!(1), json!("A"))
    );
    let b = c.read_value().unwrap();
    assert_eq!(b["id"], 2);
    assert_eq!(b["result"][0]["name"], "A");
    // No separator at all, and a batch.
    c.send_raw(br#"{"method":"spdk_get_version","id":3}[{"method":"nope","id":4}]"#)
        .unwrap();
    assert_eq!(c.read_value().unwrap()["id"], 3);
    let batch = c.read_value().unwrap();
    assert_eq!(batch[0]["error"]["code"], METHOD_NOT_FOUND);
    // Typed errors arrive as such.
    let e = c
        .call("bdev_malloc_create", Some(json!({"num_blocks": "x"})))
        .unwrap_err();
    assert!(
        matches!(e, ClientError::Rpc(ref r) if r.code == INVALID_PARAMS),
        "{e}"
    );
    assert_eq!(reg.list().len(), 1);
}

#[test]
fn malformed_json_is_answered_and_the_connection_closed() {
    let (server, _) = start("garbage", |_| {});
    let mut c = client(&server);
    c.send_raw(b"{\"method\": \"spdk_get_version\", \"id\": 1}\n{\"method\": oops}")
        .unwrap();
    assert_eq!(
        c.read_value().unwrap()["id"],
        1,
        "the good request before it is answered"
    );
    let e = c.read_value().unwrap();
    assert_eq!(
        (e["id"].clone(), e["error"]["code"].clone()),
        (Value::Null, json!(PARSE_ERROR))
    );
    assert!(c.closed_within(WAIT).unwrap());
    still_serves(&server);
}

#[test]
fn garbage_without_a_closing_bracket_is_answered_at_once() {
    // SPDK's parser sees `{nope` is not JSON and answers -32700; it must
    // not wait for a `}` that never comes (or for the idle timeout).
    let (server, _) = start("garbage-open", |_| {});
    let mut c = client(&server);
    c.send_raw(b"{nope\n").unwrap();
    let e = c.read_value().unwrap();
    assert_eq!(
        (e["id"].clone(), e["error"]["code"].clone()),
        (Value::Null, json!(PARSE_ERROR))
    );
    assert!(c.closed_within(WAIT).unwrap());
    still_serves(&server);
}

#[test]
fn a_key_given_twice_is_refused_as_spdks_decoders_do() {
    // SPDK's object decoders refuse a repeated key: -32602 among the
    // parameters, -32600 among the request's members; nothing is made
    // and the connection stays open.
    let (server, reg) = start("dup", |_| {});
    let mut c = client(&server);
    c.send_raw(br#"{"method": "bdev_malloc_create", "id": 1, "params": {"name": "a", "block_size": 512, "num_blocks": 8, "name": "b"}}"#)
        .unwrap();
    let e = c.read_value().unwrap();
    assert_eq!(
        (e["id"].clone(), e["error"]["code"].clone()),
        (json!(1), json!(INVALID_PARAMS)),
        "{e}"
    );
    assert!(e["error"]["data"].as_str().unwrap().contains("name"), "{e}");
    c.send_raw(br#"{"method": "bdev_malloc_delete", "method": "spdk_get_version", "id": 2}"#)
        .unwrap();
    let e = c.read_value().unwrap();
    assert_eq!(e["error"]["code"], json!(INVALID_REQUEST), "{e}");
    // In a batch, only the element with the repeated key is refused.
    c.send_raw(br#"[{"method": "spdk_get_version", "id": 3}, {"method": "bdev_null_create", "id": 4, "params": {"name": "n", "block_size": 512, "block_size": 4096, "num_blocks": 8}}]"#)
        .unwrap();
    let a = c.read_value().unwrap();
    assert!(a[0]["result"]["version"].is_string(), "{a}");
    assert_eq!(
        (a[1]["id"].clone(), a[1]["error"]["code"].clone()),
        (json!(4), json!(INVALID_PARAMS)),
        "{a}"
    );
    // Repeated keys deeper in the parameters count too; keys repeated in
    // different objects do not.
    let v = c
        .call(
            "bdev_get_bdevs",
            Some(json!({"name": "nope", "timeout": 0})),
        )
        .unwrap_err();
    assert!(matches!(v, ClientError::Rpc(ref r) if r.code == -19), "{v}");
    c.send_raw(br#"{"method": "bdev_malloc_create", "id": 5, "params": {"name": "ok", "block_size": 512, "num_blocks": 8, "uuid": null}}"#)
        .unwrap();
    assert_eq!(c.read_value().unwrap()["result"], json!("ok"));
    assert_eq!(
        reg.list()
            .iter()
            .map(|b| b.name().to_owned())
            .collect::<Vec<_>>(),
        ["ok"]
    );
    still_serves(&server);
}

#[test]
fn an_oversized_request_is_refused_cleanly() {
    let (server, reg) = start("big", |c| c.max_request = 4096);
    let mut c = client(&server);
    let name = "x".repeat(10_000);
    let req = json!({"method": "bdev_null_create", "id": 1,
        "params": {"name": name, "num_blocks": 8, "block_size": 512}});
    // The server stops reading past the limit; the rest may not be taken.
    let _ = c.send_raw(req.to_string().as_bytes());
    let e = c.read_value().unwrap();
    assert_eq!(e["error"]["code"], PARSE_ERROR);
    assert!(
        e["error"]["data"].as_str().unwrap().contains("4096 bytes"),
        "{e}"
    );
    assert!(c.closed_within(WAIT).unwrap());
    assert!(reg.list().is_empty());
    still_serves(&server);
}

#[test]
fn a_silent_client_is_closed_and_harms_no_one() {
    let (server, _) = start("idle", |c| c.idle_timeout = Duration::from_millis(200));
    let mut silent = client(&server);
    let mut half = client(&server);
    half.send_raw(b"{\"method\": \"spdk_get_").unwrap();
    // Another client is served meanwhile.
    still_serves(&server);
    assert!(silent.closed_within(WAIT).unwrap(), "silent client closed");
    assert!(half.closed_within(WAIT).unwrap(), "stalled request closed");
    still_serves(&server);
}

#[test]
fn a_client_leaving_mid_request_loses_only_that_request() {
    let (server, reg) = start("leave", |_| {});
    {
        let mut s = UnixStream::connect(server.path()).unwrap();
        s.write_all(
            b"{\"method\": \"bdev_malloc_create\", \"id\": 1, \"params\": {\"name\": \"A\", ",
        )
        .unwrap();
    }
    {
        // Left right after a whole request: it still runs.
        let mut s = UnixStream::connect(server.path()).unwrap();
        s.write_all(br#"{"method": "bdev_malloc_create", "id": 1, "params": {"name": "B", "block_size": 512, "num_blocks": 8}}"#)
            .unwrap();
    }
    let mut c = client(&server);
    let b = c
        .call(
            "bdev_get_bdevs",
            Some(json!({"name": "B", "timeout": 5000})),
        )
        .unwrap();
    assert_eq!(b[0]["name"], "B");
    assert!(reg.get("A").is_none());
}

#[test]
fn several_clients_at_once() {
    let (server, reg) = start("many", |c| c.max_connections = 8);
    let path = server.path().to_owned();
    // Two connections open side by side, requests interleaved.
    let mut a = client(&server);
    let mut b = client(&server);
    a.send_raw(br#"{"method":"bdev_null_create","id":"a","params":{"name":"A","block_size":512,"num_blocks":8}}"#)
        .unwrap();
    b.send_raw(br#"{"method":"bdev_null_create","id":"b","params":{"name":"A","block_size":512,"num_blocks":8}}"#)
        .unwrap();
    let ra = a.read_value().unwrap();
    let rb = b.read_value().unwrap();
    assert_eq!(
        (ra["id"].clone(), rb["id"].clone()),
        (json!("a"), json!("b"))
    );
    let made = [&ra, &rb]
        .iter()
        .filter(|r| r.get("result").is_some())
        .count();
    assert_eq!(made, 1, "one name, made once: {ra} {rb}");
    // Threads racing to create and delete the same names.
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let path = path.clone();
            std::thread::spawn(move || {
                let mut c = RpcClient::connect(&path, WAIT).unwrap();
                let mut made = 0;
                for i in 0..20 {
                    let p =
                        json!({"name": format!("R{}", i % 5), "block_size": 512, "num_blocks": 8});
                    if c.call("bdev_malloc_create", Some(p)).is_ok() {
                        made += 1;
                    }
                    let _ = c.call(
                        "bdev_malloc_delete",
                        Some(json!({"name": format!("R{}", (i + t) % 5)})),
                    );
                }
                made
            })
        })
        .collect();
    let made: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(made > 0);
    let left = reg.list().len();
    assert!(left <= 6, "{left}");
    // Past the connection limit, a client is closed at once; the rest go on.
    let extra: Vec<RpcClient> = (0..6).map(|_| client(&server)).collect();
    let mut over = client(&server);
    assert!(
        over.closed_within(WAIT).unwrap(),
        "the ninth client is refused"
    );
    drop(extra);
    drop((a, b));
    still_serves(&server);
}

/// Counts the log lines that contain "rpc: accept".
struct AcceptLines(std::sync::atomic::AtomicUsize);

impl log::Log for AcceptLines {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, r: &log::Record<'_>) {
        if format!("{}", r.args()).contains("rpc: accept") {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn flush(&self) {}
}

static ACCEPT_LINES: AcceptLines = AcceptLines(std::sync::atomic::AtomicUsize::new(0));

/// Not a test on its own: the body of
/// [`out_of_descriptors_the_server_pauses_accepting_and_loses_no_client`],
/// in a child process of its own (the descriptor limit is the process's).
#[test]
#[ignore = "child process entry point, spawned by out_of_descriptors_the_server_pauses_accepting_and_loses_no_client"]
fn child_out_of_descriptors() {
    log::set_logger(&ACCEPT_LINES).unwrap();
    log::set_max_level(log::LevelFilter::Warn);
    let (server, _reg) = start("fd-limit", |_| {});
    // A client connects; the process's next descriptor is past its limit,
    // so the server's `accept` fails (EMFILE) and the client waits in the
    // backlog.
    let mut c = client(&server);
    let cap = pollux_reactor::test_env::cap_descriptors();
    std::thread::sleep(Duration::from_millis(500));
    let lines = ACCEPT_LINES.0.load(std::sync::atomic::Ordering::Relaxed);
    let failures = server.accept_failures();
    // A pause of 100 ms after each failure, one line per 10 s: not a spin
    // of the server's thread on the failing call, nor a line per call.
    assert!(
        (1..=7).contains(&failures),
        "{failures} failed accepts in 0.5 s"
    );
    assert_eq!(lines, 1, "log lines about accept in 0.5 s");
    drop(cap);
    let v = c.call("spdk_get_version", None).unwrap();
    assert!(v["version"].is_string());
    println!("POLLUX-RPC-FD-LIMIT-OK");
}

/// A server out of descriptors pauses `accept` after a failure instead of
/// spinning on it (one log line, not one per call); the client waits in
/// the backlog and is answered once descriptors are free again.
#[test]
fn out_of_descriptors_the_server_pauses_accepting_and_loses_no_client() {
    pollux_reactor::test_env::run_child_test("child_out_of_descriptors", "POLLUX-RPC-FD-LIMIT-OK");
}
