//! `pollux-verbs-perf`: RDMA verbs micro-benchmarks in the manner of
//! perftest (`ib_send_lat`, `ib_send_bw`, `ib_write_bw`, `ib_read_bw`,
//! `ib_write_lat`), generic over a `pollux_verbs::Provider`.
//!
//! ```text
//! pollux-verbs-perf server --addr @perf --core 1
//! pollux-verbs-perf client --addr @perf --core 0 --test send-lat --size 64 --iters 1000000
//! pollux-verbs-perf client --spawn --core 0 --server-core 1 --test write-bw --sizes 64,4096 --batch 32
//! ```

use std::io::Write;
use std::process::{Child, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args as ClapArgs, Parser, Subcommand, ValueEnum};
use pollux_apps::latency::LatencyHistogram;
use pollux_reactor::mem::{ArenaOptions, DmaArena};
use pollux_verbs::{
    Access, CmAddr, CmEvent, CmId, CmListener, CompletionQueue, ConnParam, CqError, Device,
    MemoryRegion, PostError, ProtectionDomain, Provider, QpAttr, QpCaps, QpInit, QpState,
    QueuePair, RecvWr, RemoteAddr, SendOp, SendWr, Sge, VerbsError, Wc, WcStatus, WrId,
};
use serde::Serialize;

const TRUST: &str = "\
Trust model of the soft provider (the default): it is for cooperating \
processes on one machine. Each side maps the peer's DMA arenas that hold \
memory registered for remote access (passed as memfds over the CM Unix \
socket) and RDMA READ/WRITE is one memcpy between the mappings. Keys and \
bounds are checked before every copy, but a peer can read and write all of \
an exposed arena through its own mapping: never connect untrusted processes.";

/// RDMA verbs micro-benchmarks (perftest style) over a pollux-verbs provider.
#[derive(Parser, Debug)]
#[command(name = "pollux-verbs-perf", version, after_help = TRUST, after_long_help = TRUST)]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand, Debug)]
enum Mode {
    /// Wait for clients and serve the tests they ask for, until a client
    /// sends the quit request (`--spawn` does at the end).
    Server(ServerArgs),
    /// Run tests against a server (or a server forked with `--spawn`).
    Client(ClientArgs),
}

#[derive(ClapArgs, Debug, Clone)]
struct Common {
    /// Listen/connect address: `@name` (abstract Unix socket) or a path for
    /// the soft provider, `ip:port` for ibverbs.
    #[arg(long)]
    addr: Option<String>,
    /// Pin this process to core C.
    #[arg(long)]
    core: Option<usize>,
    /// Device name (default: the provider's first device).
    #[arg(long)]
    device: Option<String>,
    /// Provider: `soft` (default) or `ibverbs` (built with `--features ibverbs`).
    #[arg(long, default_value = "soft")]
    provider: String,
}

#[derive(ClapArgs, Debug)]
struct ServerArgs {
    #[command(flatten)]
    common: Common,
}

#[derive(ClapArgs, Debug)]
struct ClientArgs {
    #[command(flatten)]
    common: Common,
    /// The test to run.
    #[arg(long, value_enum, default_value = "send-lat")]
    test: Test,
    /// Message size in bytes.
    #[arg(long, default_value_t = 64)]
    size: u32,
    /// Several sizes, comma-separated (overrides `--size`).
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<u32>,
    /// Every power of two from 2 bytes to 8 MiB (SENDs capped at the
    /// device's maximum message size).
    #[arg(long)]
    all: bool,
    /// Iterations (messages, or round trips for latency tests).
    #[arg(long, default_value_t = 100_000)]
    iters: u64,
    /// WRs per post (one doorbell) for bandwidth tests; one of them signaled.
    #[arg(long, default_value_t = 32)]
    batch: u32,
    /// Send-queue depth of bandwidth tests.
    #[arg(long, default_value_t = 512)]
    tx_depth: u32,
    /// Fork the server as a child process (two processes, one core each).
    #[arg(long)]
    spawn: bool,
    /// Core of the spawned server.
    #[arg(long)]
    server_core: Option<usize>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// The tests.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Test {
    /// SEND ping-pong; round-trip latency.
    SendLat,
    /// Batched SENDs; message rate and bandwidth.
    SendBw,
    /// Batched RDMA WRITEs.
    WriteBw,
    /// Batched RDMA READs.
    ReadBw,
    /// RDMA WRITE ping-pong (each side polls its memory); round-trip latency.
    WriteLat,
}

impl Test {
    fn code(self) -> u8 {
        match self {
            Test::SendLat => 1,
            Test::SendBw => 2,
            Test::WriteBw => 3,
            Test::ReadBw => 4,
            Test::WriteLat => 5,
        }
    }
    fn from_code(c: u8) -> Option<Test> {
        Some(match c {
            1 => Test::SendLat,
            2 => Test::SendBw,
            3 => Test::WriteBw,
            4 => Test::ReadBw,
            5 => Test::WriteLat,
            _ => return None,
        })
    }
    fn is_send(self) -> bool {
        matches!(self, Test::SendLat | Test::SendBw)
    }
}

#[derive(Debug, thiserror::Error)]
enum PerfError {
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    #[error(transparent)]
    Post(#[from] PostError),
    #[error(transparent)]
    Cq(#[from] CqError),
    #[error("work request {0:?} completed with {1:?}")]
    Wc(WrId, WcStatus),
    #[error("connection: {0}")]
    Cm(String),
    #[error("memory: {0}")]
    Mem(String),
    #[error("{0}")]
    Usage(String),
    #[error("spawning the server: {0}")]
    Spawn(#[from] std::io::Error),
}

type Res<T> = Result<T, PerfError>;

/// What the client asks for (connect private data, 56 bytes at most).
#[derive(Debug, Clone, Copy)]
struct Request {
    test: Option<Test>,
    size: u32,
    iters: u64,
    addr: u64,
    rkey: u32,
}

const MAGIC: &[u8; 4] = b"PVP1";
const QUIT: u8 = 0xff;

impl Request {
    fn encode(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        b[..4].copy_from_slice(MAGIC);
        b[4] = self.test.map_or(QUIT, Test::code);
        b[8..12].copy_from_slice(&self.size.to_le_bytes());
        b[12..20].copy_from_slice(&self.iters.to_le_bytes());
        b[20..28].copy_from_slice(&self.addr.to_le_bytes());
        b[28..32].copy_from_slice(&self.rkey.to_le_bytes());
        b
    }
    /// `None` for a malformed request; `Some(Request { test: None, .. })` to quit.
    fn decode(b: &[u8]) -> Option<Request> {
        if b.get(..4)? != MAGIC {
            return None;
        }
        let test = match *b.get(4)? {
            QUIT => None,
            c => Some(Test::from_code(c)?),
        };
        Some(Request {
            test,
            size: u32::from_le_bytes(b.get(8..12)?.try_into().ok()?),
            iters: u64::from_le_bytes(b.get(12..20)?.try_into().ok()?),
            addr: u64::from_le_bytes(b.get(20..28)?.try_into().ok()?),
            rkey: u32::from_le_bytes(b.get(28..32)?.try_into().ok()?),
        })
    }
}

fn encode_remote(r: RemoteAddr) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[..8].copy_from_slice(&r.addr.to_le_bytes());
    b[8..].copy_from_slice(&r.rkey.to_le_bytes());
    b
}

fn decode_remote(b: &[u8]) -> Option<RemoteAddr> {
    Some(RemoteAddr {
        addr: u64::from_le_bytes(b.get(..8)?.try_into().ok()?),
        rkey: u32::from_le_bytes(b.get(8..12)?.try_into().ok()?),
    })
}

/// One result row.
#[derive(Debug, Clone, Serialize)]
struct Row {
    test: Test,
    size: u32,
    iters: u64,
    batch: u32,
    secs: f64,
    bw_mb_s: f64,
    mmsg_s: f64,
    lat_avg_us: Option<f64>,
    lat_p50_us: Option<f64>,
    lat_p99_us: Option<f64>,
}

/// One side's verbs objects.
struct Ep<P: Provider> {
    // Field order = drop order: QP before CQs, MR before PD.
    qp: P::Qp,
    scq: P::Cq,
    rcq: P::Cq,
    mr: P::Mr,
    _pd: P::Pd,
    arena: Arc<DmaArena>,
    buf_len: usize,
}

impl<P: Provider> Ep<P> {
    fn new(dev: &P::Device, buf_len: usize, caps: QpCaps, cq_depth: u32) -> Res<Self> {
        let pd = dev.alloc_pd()?;
        let scq = dev.create_cq(cq_depth)?;
        let rcq = dev.create_cq(cq_depth)?;
        let qp = pd.create_qp(&QpInit {
            send_cq: &scq,
            recv_cq: &rcq,
            srq: None,
            caps,
            sq_sig_all: false,
        })?;
        // RDMA CM puts QPs in INIT before connecting: receives can be posted.
        qp.modify(&QpAttr::to(QpState::Init))?;
        // Two buffers: [0, buf_len) receives/targets, [buf_len, 2*buf_len) sources.
        let len = (2 * buf_len).next_multiple_of(4096);
        let arena = DmaArena::new(len, ArenaOptions::named("verbs-perf"))
            .map_err(|e| PerfError::Mem(e.to_string()))?;
        let mr = pd.reg_mr(
            &arena,
            0,
            len,
            Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
        )?;
        Ok(Ep {
            qp,
            scq,
            rcq,
            mr,
            _pd: pd,
            arena,
            buf_len,
        })
    }

    fn sge(&self, src: bool, len: u32) -> Sge {
        let off = if src { self.buf_len as u64 } else { 0 };
        Sge {
            addr: self.mr.addr() + off,
            length: len,
            lkey: self.mr.lkey(),
        }
    }

    fn remote(&self) -> RemoteAddr {
        RemoteAddr {
            addr: self.mr.addr(),
            rkey: self.mr.rkey(),
        }
    }
}

fn caps_for(test: Test, tx_depth: u32, max_wr: u32) -> QpCaps {
    let tx = tx_depth.clamp(16, max_wr);
    QpCaps {
        max_send_wr: tx,
        max_recv_wr: if test == Test::SendBw {
            4096.min(max_wr)
        } else {
            64
        },
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

/// Poll `cq` into `buf`; error on a failed completion.
fn poll_ok<C: CompletionQueue>(cq: &C, buf: &mut [Wc]) -> Res<usize> {
    let n = cq.poll(buf)?;
    for w in &buf[..n] {
        if w.status != WcStatus::Success {
            return Err(PerfError::Wc(w.wr_id, w.status));
        }
    }
    Ok(n)
}

/// Liveness check every so many loop turns (a CM event is a syscall for
/// the soft provider).
const CM_CHECK: u32 = 1 << 14;

fn check_cm<P: Provider>(id: &P::CmId) -> Res<()> {
    match id.get_event()? {
        Some(CmEvent::Disconnected) => Err(PerfError::Cm("peer disconnected".into())),
        _ => Ok(()),
    }
}

fn open<P: Provider>(c: &Common) -> Res<P::Device> {
    let name = match &c.device {
        Some(n) => n.clone(),
        None => P::list_devices()?
            .into_iter()
            .next()
            .map(|d| d.name)
            .ok_or_else(|| PerfError::Usage("no device".into()))?,
    };
    Ok(P::open_device(&name)?)
}

fn pin(core: Option<usize>) -> Res<()> {
    if let Some(c) = core {
        affinity::set_thread_affinity([c])
            .map_err(|e| PerfError::Usage(format!("cannot pin to core {c}: {e}")))?;
    }
    Ok(())
}

fn max_size(all: bool, sizes: &[u32], size: u32) -> Vec<u32> {
    if all {
        (1..=23).map(|s| 1u32 << s).collect()
    } else if !sizes.is_empty() {
        sizes.to_vec()
    } else {
        vec![size]
    }
}

// ----------------------------------------------------------------- server

fn server<P: Provider>(a: &ServerArgs) -> Res<()> {
    pin(a.common.core)?;
    let addr = a
        .common
        .addr
        .clone()
        .ok_or_else(|| PerfError::Usage("server needs --addr".into()))?;
    let dev = open::<P>(&a.common)?;
    let l = dev.listen(&CmAddr::new(addr), 16)?;
    loop {
        let Some(id) = l.get_request()? else {
            std::thread::sleep(Duration::from_micros(200));
            continue;
        };
        let req = match id.request() {
            Some(r) => Request::decode(r.private_data.as_bytes()),
            None => None,
        };
        let Some(req) = req else {
            id.reject(b"bad request")?;
            continue;
        };
        let Some(test) = req.test else {
            id.reject(b"bye")?;
            return Ok(());
        };
        if let Err(e) = serve_one::<P>(&dev, &id, test, req) {
            eprintln!("pollux-verbs-perf server: {test:?} size {}: {e}", req.size);
        }
    }
}

fn serve_one<P: Provider>(dev: &P::Device, id: &P::CmId, test: Test, req: Request) -> Res<()> {
    let caps = caps_for(test, 512, dev.caps().max_qp_wr);
    let ep = Ep::<P>::new(dev, req.size.max(64) as usize, caps, 8192)?;
    let rsge = [ep.sge(false, req.size)];
    if test.is_send() {
        let n = caps.max_recv_wr as usize;
        let wrs: Vec<RecvWr<'_>> = (0..n)
            .map(|i| RecvWr {
                wr_id: WrId(i as u64),
                sg_list: &rsge,
            })
            .collect();
        ep.qp.post_recv(&wrs)?;
    }
    id.accept(&ep.qp, &ConnParam::with_data(&encode_remote(ep.remote())))?;
    let peer = RemoteAddr {
        addr: req.addr,
        rkey: req.rkey,
    };
    let wait_est = |id: &P::CmId| -> Res<()> {
        loop {
            match id.get_event()? {
                Some(CmEvent::Established { .. }) => return Ok(()),
                Some(e) => return Err(PerfError::Cm(format!("{e:?}"))),
                None => std::hint::spin_loop(),
            }
        }
    };
    wait_est(id)?;
    match test {
        Test::SendLat => pong_send::<P>(&ep, id, req),
        Test::SendBw => sink_send::<P>(&ep, id, req),
        Test::WriteLat => pong_write::<P>(&ep, id, req, peer),
        Test::WriteBw | Test::ReadBw => Ok(()),
    }?;
    // Keep the connection (and memory) until the client is done.
    let mut buf = [Wc::default(); 64];
    loop {
        let _ = ep.scq.poll(&mut buf);
        let _ = ep.rcq.poll(&mut buf);
        match id.get_event()? {
            Some(CmEvent::Disconnected) => return Ok(()),
            Some(_) | None => std::thread::sleep(Duration::from_micros(50)),
        }
    }
}

/// SEND ping-pong responder: every receive is answered by a SEND.
fn pong_send<P: Provider>(ep: &Ep<P>, id: &P::CmId, req: Request) -> Res<()> {
    let rsge = [ep.sge(false, req.size)];
    let ssge = [ep.sge(true, req.size)];
    let mut buf = [Wc::default(); 16];
    let mut done = 0u64;
    let mut turn = 0u32;
    while done < req.iters {
        let n = poll_ok(&ep.rcq, &mut buf)?;
        for _ in 0..n {
            // Answer first, then replace the receive (the queue holds
            // `max_recv_wr` of them: the next ping never finds it empty);
            // the re-post is then off the round trip's critical path.
            let mut wr = SendWr::new(WrId(done), SendOp::Send, &ssge);
            if done % 32 == 31 {
                wr = wr.signaled();
            }
            ep.qp.post_send(&[wr])?;
            ep.qp.post_recv(&[RecvWr {
                wr_id: WrId(0),
                sg_list: &rsge,
            }])?;
            done += 1;
        }
        poll_ok(&ep.scq, &mut buf)?;
        turn = turn.wrapping_add(1);
        if turn % CM_CHECK == 0 {
            check_cm::<P>(id)?;
        }
    }
    Ok(())
}

/// SEND sink: count receives, re-post them in batches.
fn sink_send<P: Provider>(ep: &Ep<P>, id: &P::CmId, req: Request) -> Res<()> {
    let rsge = [ep.sge(false, req.size)];
    let re = [RecvWr {
        wr_id: WrId(0),
        sg_list: &rsge,
    }; 256];
    let mut buf = [Wc::default(); 256];
    let mut got = 0u64;
    let mut turn = 0u32;
    while got < req.iters {
        let n = poll_ok(&ep.rcq, &mut buf)?;
        if n > 0 {
            ep.qp.post_recv(&re[..n])?;
            got += n as u64;
        }
        turn = turn.wrapping_add(1);
        if turn % CM_CHECK == 0 {
            check_cm::<P>(id)?;
        }
    }
    Ok(())
}

/// Sequence stamp at the end of a WRITE ping-pong message.
fn stamp_off(size: u32) -> usize {
    size.saturating_sub(8) as usize
}

fn read_stamp(a: &DmaArena, off: usize) -> u64 {
    let mut b = [0u8; 8];
    let _ = a.copy_out(off, &mut b);
    u64::from_le_bytes(b)
}

/// WRITE ping-pong responder.
fn pong_write<P: Provider>(ep: &Ep<P>, id: &P::CmId, req: Request, peer: RemoteAddr) -> Res<()> {
    let so = stamp_off(req.size);
    let src = ep.buf_len + so;
    let ssge = [ep.sge(true, req.size)];
    let mut buf = [Wc::default(); 16];
    let mut turn = 0u32;
    for i in 1..=req.iters {
        while read_stamp(&ep.arena, so) != i {
            turn = turn.wrapping_add(1);
            if turn % CM_CHECK == 0 {
                check_cm::<P>(id)?;
                poll_ok(&ep.scq, &mut buf)?;
            }
            std::hint::spin_loop();
        }
        ep.arena
            .copy_in(src, &i.to_le_bytes())
            .map_err(|e| PerfError::Mem(e.to_string()))?;
        let mut wr = SendWr::new(WrId(i), SendOp::RdmaWrite { remote: peer }, &ssge);
        if i % 32 == 0 {
            wr = wr.signaled();
        }
        ep.qp.post_send(&[wr])?;
        poll_ok(&ep.scq, &mut buf)?;
    }
    Ok(())
}

// ----------------------------------------------------------------- client

fn client<P: Provider>(a: &ClientArgs, addr: &str) -> Res<Vec<Row>> {
    pin(a.common.core)?;
    let dev = open::<P>(&a.common)?;
    let max_msg = dev.caps().max_msg_size;
    let mut rows = Vec::new();
    for size in max_size(a.all, &a.sizes, a.size) {
        if a.test.is_send() && size > max_msg {
            continue;
        }
        if a.test == Test::WriteLat && size < 8 {
            continue;
        }
        if size == 0 {
            return Err(PerfError::Usage("size 0".into()));
        }
        rows.push(run_one::<P>(&dev, a, addr, size)?);
    }
    Ok(rows)
}

fn connect<P: Provider>(
    dev: &P::Device,
    addr: &str,
    qp: &P::Qp,
    pdata: &[u8],
    attempts: u32,
) -> Res<(P::CmId, Option<RemoteAddr>)> {
    // The server may not listen yet (spawn): retry "nobody listens" and a
    // connection dropped while the server starts up.
    for _ in 0..attempts {
        let id = dev.connect(&CmAddr::new(addr), qp, &ConnParam::with_data(pdata))?;
        loop {
            match id.get_event()? {
                None => std::hint::spin_loop(),
                Some(CmEvent::Established { private_data }) => {
                    return Ok((id, decode_remote(private_data.as_bytes())))
                }
                Some(CmEvent::Rejected { reason: 8, .. }) | Some(CmEvent::Unreachable) => break,
                Some(CmEvent::Rejected { .. }) => return Ok((id, None)),
                Some(e) => return Err(PerfError::Cm(format!("{e:?}"))),
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(PerfError::Cm(format!("nobody listens on {addr}")))
}

fn run_one<P: Provider>(dev: &P::Device, a: &ClientArgs, addr: &str, size: u32) -> Res<Row> {
    let caps = caps_for(a.test, a.tx_depth, dev.caps().max_qp_wr);
    let ep = Ep::<P>::new(dev, size.max(64) as usize, caps, 8192)?;
    let rsge = [ep.sge(false, size)];
    if a.test == Test::SendLat {
        let wrs = [RecvWr {
            wr_id: WrId(0),
            sg_list: &rsge,
        }; 16];
        ep.qp.post_recv(&wrs)?;
    }
    let me = ep.remote();
    let req = Request {
        test: Some(a.test),
        size,
        iters: a.iters,
        addr: me.addr,
        rkey: me.rkey,
    };
    let (id, peer) = connect::<P>(dev, addr, &ep.qp, &req.encode(), 500)?;
    let peer = peer.ok_or_else(|| PerfError::Cm("server rejected the test".into()))?;
    let mut hist = LatencyHistogram::new();
    let t0 = Instant::now();
    match a.test {
        Test::SendLat => ping_send::<P>(&ep, &id, a.iters, size, &mut hist)?,
        Test::WriteLat => ping_write::<P>(&ep, &id, a.iters, size, peer, &mut hist)?,
        Test::SendBw | Test::WriteBw | Test::ReadBw => {
            stream::<P>(&ep, &id, a, size, peer)?;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let _ = id.disconnect();
    let lat = matches!(a.test, Test::SendLat | Test::WriteLat);
    let msgs = a.iters as f64;
    Ok(Row {
        test: a.test,
        size,
        iters: a.iters,
        batch: if lat { 1 } else { a.batch },
        secs,
        bw_mb_s: msgs * f64::from(size) / secs / 1e6,
        mmsg_s: msgs / secs / 1e6,
        lat_avg_us: lat.then(|| hist.mean_us()),
        lat_p50_us: lat.then(|| hist.quantile_us(0.5)),
        lat_p99_us: lat.then(|| hist.quantile_us(0.99)),
    })
}

/// SEND ping-pong requester: round-trip latency per iteration.
fn ping_send<P: Provider>(
    ep: &Ep<P>,
    id: &P::CmId,
    iters: u64,
    size: u32,
    hist: &mut LatencyHistogram,
) -> Res<()> {
    let rsge = [ep.sge(false, size)];
    let ssge = [ep.sge(true, size)];
    let mut buf = [Wc::default(); 16];
    let mut turn = 0u32;
    for i in 0..iters {
        let t = Instant::now();
        let mut wr = SendWr::new(WrId(i), SendOp::Send, &ssge);
        if i % 32 == 31 {
            wr = wr.signaled();
        }
        ep.qp.post_send(&[wr])?;
        loop {
            if poll_ok(&ep.rcq, &mut buf[..1])? == 1 {
                break;
            }
            poll_ok(&ep.scq, &mut buf[1..])?;
            turn = turn.wrapping_add(1);
            if turn % CM_CHECK == 0 {
                check_cm::<P>(id)?;
            }
        }
        hist.record(t.elapsed().as_nanos() as u64);
        ep.qp.post_recv(&[RecvWr {
            wr_id: WrId(0),
            sg_list: &rsge,
        }])?;
        poll_ok(&ep.scq, &mut buf)?;
    }
    Ok(())
}

/// WRITE ping-pong requester.
fn ping_write<P: Provider>(
    ep: &Ep<P>,
    id: &P::CmId,
    iters: u64,
    size: u32,
    peer: RemoteAddr,
    hist: &mut LatencyHistogram,
) -> Res<()> {
    let so = stamp_off(size);
    let src = ep.buf_len + so;
    let ssge = [ep.sge(true, size)];
    let mut buf = [Wc::default(); 16];
    let mut turn = 0u32;
    for i in 1..=iters {
        let t = Instant::now();
        ep.arena
            .copy_in(src, &i.to_le_bytes())
            .map_err(|e| PerfError::Mem(e.to_string()))?;
        let mut wr = SendWr::new(WrId(i), SendOp::RdmaWrite { remote: peer }, &ssge);
        if i % 32 == 0 {
            wr = wr.signaled();
        }
        ep.qp.post_send(&[wr])?;
        while read_stamp(&ep.arena, so) != i {
            turn = turn.wrapping_add(1);
            if turn % CM_CHECK == 0 {
                check_cm::<P>(id)?;
                poll_ok(&ep.scq, &mut buf)?;
            }
            std::hint::spin_loop();
        }
        hist.record(t.elapsed().as_nanos() as u64);
        poll_ok(&ep.scq, &mut buf)?;
    }
    Ok(())
}

/// Bandwidth tests: keep up to `tx_depth` WRs in flight, posted `batch` at a
/// time (one doorbell), the last of each batch signaled. `wr_id` = WRs
/// posted up to and including this one, so a completion retires its batch.
fn stream<P: Provider>(
    ep: &Ep<P>,
    id: &P::CmId,
    a: &ClientArgs,
    size: u32,
    peer: RemoteAddr,
) -> Res<()> {
    let depth = u64::from(ep.qp.caps().max_send_wr);
    let batch = u64::from(a.batch.max(1)).min(depth);
    let (sge, op) = match a.test {
        Test::SendBw => (ep.sge(true, size), SendOp::Send),
        Test::WriteBw => (ep.sge(true, size), SendOp::RdmaWrite { remote: peer }),
        _ => (ep.sge(false, size), SendOp::RdmaRead { remote: peer }),
    };
    let sges = [sge];
    let mut wrs: Vec<SendWr<'_>> = (0..batch)
        .map(|_| SendWr::new(WrId(0), op, &sges))
        .collect();
    let mut buf = [Wc::default(); 64];
    let (mut posted, mut completed) = (0u64, 0u64);
    let mut turn = 0u32;
    while completed < a.iters {
        let room = depth - (posted - completed);
        let n = (a.iters - posted).min(batch).min(room);
        if n > 0 && (n == batch || posted + n == a.iters) {
            for (k, wr) in wrs[..n as usize].iter_mut().enumerate() {
                let last = k as u64 == n - 1;
                *wr = SendWr::new(WrId(posted + k as u64 + 1), op, &sges);
                if last {
                    *wr = wr.signaled();
                }
            }
            ep.qp.post_send(&wrs[..n as usize])?;
            posted += n;
        }
        let got = poll_ok(&ep.scq, &mut buf)?;
        for w in &buf[..got] {
            completed = completed.max(w.wr_id.0);
        }
        turn = turn.wrapping_add(1);
        if turn % CM_CHECK == 0 {
            check_cm::<P>(id)?;
        }
    }
    Ok(())
}

// ----------------------------------------------------------------- output

fn print_table(rows: &[Row]) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "{:<10} {:>9} {:>11} {:>6} {:>12} {:>10} {:>10} {:>10} {:>10}",
        "test", "size", "iters", "batch", "BW MB/s", "Mmsg/s", "lat avg", "lat p50", "lat p99"
    );
    let f = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"));
    for r in rows {
        let name = serde_json::to_value(r.test)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "{:<10} {:>9} {:>11} {:>6} {:>12.1} {:>10.3} {:>10} {:>10} {:>10}",
            name,
            r.size,
            r.iters,
            r.batch,
            r.bw_mb_s,
            r.mmsg_s,
            f(r.lat_avg_us),
            f(r.lat_p50_us),
            f(r.lat_p99_us)
        );
    }
    let _ = writeln!(
        out,
        "(latency columns: round trip in microseconds; BW in 10^6 bytes/s)"
    );
}

/// Kills the spawned server if the client fails before it could quit it.
struct ChildGuard(Option<Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn quit<P: Provider>(c: &Common, addr: &str) -> Res<()> {
    let dev = open::<P>(c)?;
    let ep = Ep::<P>::new(&dev, 64, caps_for(Test::SendLat, 16, 16), 64)?;
    let req = Request {
        test: None,
        size: 0,
        iters: 0,
        addr: 0,
        rkey: 0,
    };
    let _ = connect::<P>(&dev, addr, &ep.qp, &req.encode(), 1)?;
    Ok(())
}

fn run_client<P: Provider>(a: &ClientArgs) -> Res<Vec<Row>> {
    let addr = match (&a.common.addr, a.spawn) {
        (Some(x), _) => x.clone(),
        (None, true) => format!("@pollux-verbs-perf-{}", std::process::id()),
        (None, false) => return Err(PerfError::Usage("client needs --addr or --spawn".into())),
    };
    let mut guard = ChildGuard(None);
    if a.spawn {
        let mut cmd = std::process::Command::new(std::env::current_exe()?);
        cmd.args(["server", "--addr", &addr, "--provider", &a.common.provider]);
        if let Some(c) = a.server_core {
            cmd.args(["--core", &c.to_string()]);
        }
        if let Some(d) = &a.common.device {
            cmd.args(["--device", d]);
        }
        guard.0 = Some(cmd.stdout(std::process::Stdio::null()).spawn()?);
    }
    let rows = client::<P>(a, &addr)?;
    if let Some(child) = guard.0.as_mut() {
        // Best effort: ask the server to exit, give it a moment, then the
        // guard kills whatever is left.
        let _ = quit::<P>(&a.common, &addr);
        for _ in 0..200 {
            if matches!(child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ok(rows)
}

fn dispatch(cli: &Cli) -> Res<Option<Vec<Row>>> {
    let provider = match &cli.mode {
        Mode::Server(s) => &s.common.provider,
        Mode::Client(c) => &c.common.provider,
    };
    match provider.as_str() {
        "soft" => run::<pollux_verbs::soft::Soft>(cli),
        #[cfg(feature = "ibverbs")]
        "ibverbs" => run::<pollux_verbs::ibv::Ibverbs>(cli),
        p => Err(PerfError::Usage(format!(
            "unknown or not built provider `{p}`"
        ))),
    }
}

fn run<P: Provider>(cli: &Cli) -> Res<Option<Vec<Row>>> {
    match &cli.mode {
        Mode::Server(s) => server::<P>(s).map(|()| None),
        Mode::Client(c) => run_client::<P>(c).map(Some),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match dispatch(&cli) {
        Ok(None) => ExitCode::SUCCESS,
        Ok(Some(rows)) => {
            let json = matches!(&cli.mode, Mode::Client(c) if c.json);
            if json {
                match serde_json::to_string_pretty(&rows) {
                    Ok(s) => println!("{s}"),
                    Err(e) => eprintln!("pollux-verbs-perf: {e}"),
                }
            } else {
                print_table(&rows);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("pollux-verbs-perf: {e}");
            ExitCode::FAILURE
        }
    }
}
