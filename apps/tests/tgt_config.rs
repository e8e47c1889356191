//! `pollux-tgt` configuration: the example configs parse and build, and
//! every kind of mistake is an error naming its line and its field.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

use pollux_apps::tgt::{self, ProviderKind, TgtPlan};
use pollux_nvmf::spec::transport_id::TrType;
use pollux_verbs::soft::Soft;

const GOOD: &str = r#"cores = "0"
[transport]
max_queue_depth = 64
max_io_size = "128k"
num_shared_buffers = 64
max_srq_depth = 256
num_cqe = 4096
hugepages = "never"
connect_timeout_ms = 5000

[[bdev]]
spec = "null:name=Null0,size=64M,block=4096"

[[bdev]]
type = "malloc"
size = "4M"
block = 512

[[subsystem]]
nqn = "nqn.2016-06.io.pollux:null0"
allow_any_host = true
namespaces = [{ bdev = "Null0", nsid = 3 }, { bdev = "malloc0" }]

[[listener]]
traddr = "@pollux-tgt-config-test"
"#;

/// `GOOD` with the first occurrence of `from` replaced by `to`.
fn edit(from: &str, to: &str) -> String {
    assert!(GOOD.contains(from), "{from}");
    GOOD.replacen(from, to, 1)
}

/// Parse `text`, expect an error, return its message.
fn error(text: &str) -> String {
    TgtPlan::parse(text).unwrap_err().to_string()
}

/// The 1-based line of the first line of `text` containing `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines().position(|l| l.contains(needle)).unwrap() + 1
}

fn assert_names(e: &str, line: usize, field: &str) {
    assert!(
        e.contains(&format!("line {line}")) && e.contains(field),
        "expected line {line} and `{field}` in: {e}"
    );
}

#[test]
fn a_good_config_is_planned_as_written() {
    let p = TgtPlan::parse(GOOD).unwrap();
    assert_eq!(p.provider, ProviderKind::Soft);
    assert_eq!(p.cores.as_ref().unwrap().as_slice(), &[0]);
    assert_eq!(p.target.max_queue_depth, 64);
    assert_eq!(p.target.max_io_size, 128 * 1024);
    assert_eq!(p.rdma.max_srq_depth, 256);
    assert_eq!(p.target.connect_timeout_ms, 5000);
    let names: Vec<&str> = p.bdevs.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["Null0", "malloc0"]);
    let ns: Vec<(u32, &str)> = p.subsystems[0]
        .namespaces
        .iter()
        .map(|n| (n.nsid, n.bdev.as_str()))
        .collect();
    // The fixed NSID stays, the other takes the lowest free one.
    assert_eq!(ns, [(3, "Null0"), (1, "malloc0")]);
    assert!(p.subsystems[0].config.allow_any_host);
    assert_eq!(p.listeners[0].trid.traddr, "@pollux-tgt-config-test");
}

#[test]
fn a_good_config_builds_a_target() {
    let p = TgtPlan::parse(GOOD).unwrap();
    let b = tgt::build::<Soft>(&p).unwrap();
    let sub = b.target.subsystem("nqn.2016-06.io.pollux:null0").unwrap();
    let mut ns: Vec<(u32, String)> = sub
        .namespaces()
        .iter()
        .map(|n| (n.nsid(), n.bdev().name().to_string()))
        .collect();
    ns.sort();
    assert_eq!(ns, [(1, "malloc0".to_string()), (3, "Null0".to_string())]);
    assert_eq!(b.target.listeners().len(), 1);
    assert_eq!(b.target.options().max_queue_depth, 64);
    assert_eq!(b.target.options().connect_timeout_ms, 5000);
}

/// `GOOD` with a second subsystem that listens on its own address too.
fn with_own_listener(own: &str) -> String {
    format!(
        "{GOOD}\n[[subsystem]]\nnqn = \"nqn.2016-06.io.pollux:own\"\nallow_any_host = true\nnamespaces = [{{ bdev = \"Null1\" }}]\nlisteners = [{own}]\n\n[[bdev]]\nspec = \"null:name=Null1,size=4M,block=4096\"\n"
    )
}

#[test]
fn a_subsystem_listens_on_the_top_level_listeners_and_its_own() {
    let text = with_own_listener(r#"{ traddr = "@pollux-tgt-config-own" }"#);
    let p = TgtPlan::parse(&text).unwrap();
    let own: Vec<&str> = p.subsystems[1]
        .listeners
        .iter()
        .map(|l| l.trid.traddr.as_str())
        .collect();
    assert_eq!(own, ["@pollux-tgt-config-own"]);
    assert!(p.subsystems[0].listeners.is_empty());
    let b = tgt::build::<Soft>(&p).unwrap();
    let addrs = |nqn: &str| -> Vec<String> {
        b.target
            .subsystem(nqn)
            .unwrap()
            .listeners()
            .into_iter()
            .map(|t| t.traddr)
            .collect()
    };
    // The top-level [[listener]]: every subsystem of the file, and discovery.
    assert_eq!(
        addrs("nqn.2016-06.io.pollux:null0"),
        ["@pollux-tgt-config-test"]
    );
    assert_eq!(
        addrs("nqn.2016-06.io.pollux:own"),
        ["@pollux-tgt-config-test", "@pollux-tgt-config-own"]
    );
    assert_eq!(
        addrs(pollux_nvmf::target::DISCOVERY_NQN),
        ["@pollux-tgt-config-test"]
    );
    assert_eq!(b.target.listeners().len(), 2);
}

#[test]
fn a_subsystem_listener_is_checked_like_a_top_level_one() {
    let text = with_own_listener(r#"{ traddr = "10.0.0.1" }"#);
    let e = error(&text);
    assert_names(
        &e,
        line_of(&text, "listeners = ["),
        "subsystem[1].listeners[0].traddr",
    );
    // An address every subsystem listens on already.
    let text = with_own_listener(r#"{ traddr = "@pollux-tgt-config-test" }"#);
    let e = error(&text);
    assert!(e.contains("every subsystem listens there already"), "{e}");
    assert_names(
        &e,
        line_of(&text, "listeners = ["),
        "subsystem[1].listeners[0]",
    );
    let text = with_own_listener(r#"{ traddr = "@a" }, { traddr = "@a" }"#);
    assert!(error(&text).contains("the same address as"), "{text}");
    // Own listeners only: no top-level one is needed.
    let text = with_own_listener(r#"{ traddr = "@pollux-tgt-config-own" }"#).replacen(
        "[[listener]]\ntraddr = \"@pollux-tgt-config-test\"\n",
        "",
        1,
    );
    let e = error(&text);
    assert!(e.contains("no [[listener]]"), "subsystem 0 has none: {e}");
    let text = text.replacen(
        "namespaces = [{ bdev = \"Null0\", nsid = 3 }, { bdev = \"malloc0\" }]",
        "namespaces = [{ bdev = \"Null0\", nsid = 3 }, { bdev = \"malloc0\" }]\nlisteners = [{ traddr = \"@pollux-tgt-config-zero\" }]",
        1,
    );
    let p = TgtPlan::parse(&text).unwrap();
    assert!(p.listeners.is_empty());
    assert_eq!(p.all_listeners().len(), 2);
}

#[test]
fn the_shipped_examples_parse() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/config");
    let null = std::fs::read_to_string(format!("{dir}/tgt-null.toml")).unwrap();
    let p = TgtPlan::parse(&null).unwrap();
    assert_eq!(p.subsystems[0].config.nqn, "nqn.2016-06.io.pollux:null0");
    assert_eq!(p.listeners[0].trid.traddr, "@pollux-tgt");
    assert_eq!(p.bdevs[0].name, "Null0");
    assert_eq!(p.cores.as_ref().unwrap().as_slice(), &[0]);
    // Builds too (the null bdev allocates nothing; the data pool is small).
    tgt::build::<Soft>(&p).unwrap();
    // NVMe/TCP beside soft RDMA (parsed only: building binds port 4420).
    let tcp = std::fs::read_to_string(format!("{dir}/tgt-tcp.toml")).unwrap();
    let p = TgtPlan::parse(&tcp).unwrap();
    let t = &p.listeners[1].trid;
    assert_eq!(
        (t.trtype, t.traddr.as_str(), t.trsvcid.as_str()),
        (TrType::Tcp, "127.0.0.1", "4420")
    );
    let o = p.tcp.as_ref().unwrap();
    assert!(o.c2h_success && o.max_io_qpairs_per_ctrlr == 127);
    let ib = std::fs::read_to_string(format!("{dir}/tgt-ibverbs.toml")).unwrap();
    if cfg!(feature = "ibverbs") {
        let p = TgtPlan::parse(&ib).unwrap();
        assert_eq!(p.listeners[0].trid.trsvcid, "4420");
    } else {
        assert_names(&error(&ib), line_of(&ib, "provider ="), "provider");
    }
}

#[test]
fn unknown_keys_and_wrong_types_name_line_and_key() {
    let t = edit("max_srq_depth = 256", "max_srq_depht = 256");
    assert_names(&error(&t), line_of(&t, "max_srq_depht"), "max_srq_depht");
    let t = edit("allow_any_host = true", "allow_any_host = true\nhots = []");
    assert_names(&error(&t), line_of(&t, "hots"), "hots");
    let t = edit("max_queue_depth = 64", "max_queue_depth = \"deep\"");
    assert_names(
        &error(&t),
        line_of(&t, "max_queue_depth"),
        "max_queue_depth",
    );
    let t = edit("max_queue_depth = 64", "max_queue_depth = 70000");
    assert_names(
        &error(&t),
        line_of(&t, "max_queue_depth"),
        "max_queue_depth",
    );
    let t = edit("hugepages = \"never\"", "hugepages = \"sometimes\"");
    assert_names(&error(&t), line_of(&t, "hugepages"), "hugepages");
    let t = edit("cores = \"0\"", "cores = \"zero\"");
    assert_names(&error(&t), 1, "cores");
}

#[test]
fn semantic_errors_name_line_and_field() {
    // A namespace on a bdev that does not exist.
    let t = edit("bdev = \"Null0\"", "bdev = \"Nul0\"");
    let e = error(&t);
    assert_names(&e, line_of(&t, "Nul0\""), "subsystem[0].namespaces[0].bdev");
    assert!(e.contains("Nul0") && e.contains("Null0"), "{e}");
    // A malformed NQN.
    let t = edit("nqn.2016-06.io.pollux:null0", "iqn.2016-06.io.pollux:null0");
    assert_names(&error(&t), line_of(&t, "iqn."), "subsystem[0].nqn");
    // Duplicate NSIDs.
    let t = edit("{ bdev = \"malloc0\" }", "{ bdev = \"malloc0\", nsid = 3 }");
    let e = error(&t);
    assert_names(
        &e,
        line_of(&t, "namespaces ="),
        "subsystem[0].namespaces[1].nsid",
    );
    assert!(e.contains("duplicate NSID 3"), "{e}");
    // A bad bdev spec key (the bdev layer names the key).
    let t = edit("block = 512", "blok = 512");
    let e = error(&t);
    assert!(e.contains("bdev[1]") && e.contains("blok"), "{e}");
    // Two namespaces on one bdev.
    let t = edit("{ bdev = \"malloc0\" }", "{ bdev = \"Null0\" }");
    assert_names(
        &error(&t),
        line_of(&t, "namespaces ="),
        "namespaces[1].bdev",
    );
    // Access: nobody could connect, or both ways at once.
    let t = edit("allow_any_host = true", "allow_any_host = false");
    assert_names(&error(&t), line_of(&t, "allow_any_host"), "allow_any_host");
    let t = edit(
        "allow_any_host = true",
        "allow_any_host = true\nhosts = [\"nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-11d2-883f-0016d3cca427\"]",
    );
    assert_names(&error(&t), line_of(&t, "allow_any_host"), "allow_any_host");
    let t = edit("allow_any_host = true", "hosts = [\"host-one\"]");
    assert_names(&error(&t), line_of(&t, "hosts"), "subsystem[0].hosts[0]");
    // A soft-provider listener that is not a socket name.
    let t = edit(
        "traddr = \"@pollux-tgt-config-test\"",
        "traddr = \"10.0.0.1\"",
    );
    assert_names(&error(&t), line_of(&t, "traddr"), "listener[0].traddr");
    // Serial too long.
    let t = edit(
        "allow_any_host",
        "serial = \"ABCDEFGHIJKLMNOPQRSTUVWXYZ\"\nallow_any_host",
    );
    assert_names(&error(&t), line_of(&t, "serial"), "subsystem[0].serial");
}

#[test]
fn option_combinations_that_cannot_work_name_the_option() {
    // The SRQ cannot hold one queue's receives.
    let t = edit("max_srq_depth = 256", "max_srq_depth = 32");
    assert_names(&error(&t), line_of(&t, "max_srq_depth"), "max_srq_depth");
    // The target core refuses a max_io_size that is not a power of two.
    let t = edit("max_io_size = \"128k\"", "max_io_size = 5000");
    assert_names(&error(&t), line_of(&t, "max_io_size"), "max_io_size");
    // Too few shared buffers for one I/O.
    let t = edit("num_shared_buffers = 64", "num_shared_buffers = 2");
    assert_names(
        &error(&t),
        line_of(&t, "num_shared_buffers"),
        "num_shared_buffers",
    );
    // Nothing to serve, nowhere to listen.
    let no_listener = GOOD.split("[[listener]]").next().unwrap();
    assert!(error(no_listener).contains("listener"));
}

#[test]
fn a_bdev_that_cannot_be_created_names_its_entry() {
    let t = edit(
        "spec = \"null:name=Null0,size=64M,block=4096\"",
        "spec = \"aio:name=Null0,path=/nonexistent/pollux/disk.img,block=4096\"",
    );
    let p = TgtPlan::parse(&t).unwrap();
    let e = tgt::build::<Soft>(&p).unwrap_err().to_string();
    // A `[[bdev]]` entry is placed at its header.
    assert_names(&e, line_of(&t, "spec = \"aio") - 1, "bdev[0]");
    assert!(e.contains("/nonexistent/pollux/disk.img"), "{e}");
}
