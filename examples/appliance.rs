//! An appliance built on Pollux: it links the crates, starts reactors on two
//! cores, adds a bdev backend of its own next to a stock malloc bdev,
//! registers its own pollers, does I/O on every core and shuts down cleanly.
//!
//! Run it with `cargo run --example appliance`; the test suite runs it too
//! (`tests/tests/appliance.rs`).

use std::cell::Cell;
use std::rc::{Rc, Weak};
use std::sync::mpsc;
use std::sync::Arc;

use pollux_bdev::{
    BackendChannel, Bdev, BdevBackend, BdevError, BdevInfo, BdevIo, BdevRegistry, CompletedIo,
    Completions, IoChannel, IoCompletion, IoTag, IoType, SgList, Submitted,
};
use pollux_reactor::mem::DmaBuf;
use pollux_reactor::{launch, Cores, LaunchConfig, PollStatus, Reactor};

/// The appliance's own backend: a read-only device whose every byte is the
/// low byte of its block number (think: a ROM, or a synthetic test image).
struct RomBackend {
    info: BdevInfo,
}

/// Its per-core half: stateless, every read is filled at submit time.
struct RomChannel;

impl BdevBackend for RomBackend {
    fn info(&self) -> &BdevInfo {
        &self.info
    }
    fn supports(&self, t: IoType) -> bool {
        t == IoType::Read
    }
    fn create_channel(&self, _r: &Reactor) -> Result<Box<dyn BackendChannel>, BdevError> {
        Ok(Box::new(RomChannel))
    }
}

impl BackendChannel for RomChannel {
    fn submit(&mut self, _tag: IoTag, io: &mut BdevIo) -> Submitted {
        // Fill the buffers now: done, the completion comes from the
        // channel's next poll.
        let mut block = io.offset_blocks();
        for buf in io.bufs.iter_mut() {
            for chunk in buf.as_mut_slice().chunks_mut(512) {
                chunk.fill(block as u8);
                block += 1;
            }
        }
        Submitted::Done(Ok(()))
    }
    fn poll(&mut self, _done: &mut Completions) -> PollStatus {
        // Nothing is ever queued.
        PollStatus::Idle
    }
}

/// What each core reports back to the main thread.
#[derive(Debug)]
pub struct CoreReport {
    /// The core.
    pub core: u32,
    /// Whether the ROM read returned the expected bytes.
    pub rom_ok: bool,
    /// Whether the malloc write-then-read round trip matched.
    pub malloc_ok: bool,
    /// How many times the appliance's own poller ran.
    pub poller_runs: u64,
}

/// Runs the appliance and returns one report per core.
pub fn run() -> Result<Vec<CoreReport>, String> {
    // Control path: bdevs are created before (or while) reactors run.
    let registry = BdevRegistry::new();
    let rom = Bdev::new(Arc::new(RomBackend {
        info: BdevInfo::new("rom0", "Appliance ROM", 512, 2048).map_err(|e| e.to_string())?,
    }));
    registry
        .register(Arc::clone(&rom))
        .map_err(|e| e.to_string())?;
    let malloc = registry
        .create("malloc:name=scratch,size=4M,block=512")
        .map_err(|e| e.to_string())?;
    let rom_desc = Arc::new(rom.open(false).map_err(|e| e.to_string())?);
    let scratch_desc = Arc::new(malloc.open(true).map_err(|e| e.to_string())?);

    let cores = Cores::parse("0-1").map_err(|e| e.to_string())?;
    let (tx, rx) = mpsc::channel();
    let set = launch(LaunchConfig::new(cores), move |r| {
        let (rom_desc, scratch_desc, tx) = (rom_desc.clone(), scratch_desc.clone(), tx.clone());
        appliance_core(r, &rom_desc, &scratch_desc, tx);
    })
    .map_err(|e| e.to_string())?;
    let mut reports: Vec<CoreReport> = Vec::new();
    for _ in 0..2 {
        match rx.recv_timeout(std::time::Duration::from_secs(30)) {
            Ok(rep) => reports.push(rep),
            Err(e) => {
                set.stop_all();
                let _ = set.join();
                return Err(format!("a core did not report: {e}"));
            }
        }
    }
    set.stop_all();
    set.join().map_err(|e| e.to_string())?;
    reports.sort_by_key(|r| r.core);
    Ok(reports)
}

/// One core's I/O state; it is also the completion target of its I/Os.
struct CoreIo {
    me: Weak<CoreIo>,
    scratch: IoChannel,
    lba: u64,
    expect: u8,
    rom_ok: Cell<Option<bool>>,
    malloc_ok: Cell<Option<bool>>,
}

impl IoCompletion for CoreIo {
    fn complete(&self, io: CompletedIo<'_>) {
        let all = |v: u8| {
            io.bufs()
                .iter()
                .all(|b| b.as_slice().iter().all(|x| *x == v))
        };
        match io.ctx() {
            ROM_READ => self
                .rom_ok
                .set(Some(io.status().is_ok() && all(self.lba as u8))),
            SCRATCH_WRITE => {
                // Read it back into the same buffer, with ourselves as the target.
                let ok = io.status().is_ok();
                // Taking the buffers frees the request slot for the read.
                let bufs = io.into_bufs();
                let sent = self.me.upgrade().is_some_and(|me| {
                    let cb: Rc<dyn IoCompletion> = me;
                    ok && self
                        .scratch
                        .read(self.lba, 1, bufs, &cb, SCRATCH_READ)
                        .is_ok()
                });
                if !sent {
                    self.malloc_ok.set(Some(false));
                }
            }
            _ => self
                .malloc_ok
                .set(Some(io.status().is_ok() && all(self.expect))),
        }
    }
}

const ROM_READ: u64 = 1;
const SCRATCH_WRITE: u64 = 2;
const SCRATCH_READ: u64 = 3;

/// Per-core work: one poller of our own, one read from the ROM, one write
/// and read back on the scratch malloc bdev, then a report.
fn appliance_core(
    r: &Reactor,
    rom: &pollux_bdev::BdevDesc,
    scratch: &pollux_bdev::BdevDesc,
    tx: mpsc::Sender<CoreReport>,
) {
    let core = r.core();
    let runs = Rc::new(Cell::new(0u64));
    let runs2 = runs.clone();
    r.add_poller("appliance-heartbeat", move || {
        runs2.set(runs2.get() + 1);
        PollStatus::Idle
    });
    let (Ok(rom_ch), Ok(scratch_ch)) = (rom.channel(r), scratch.channel(r)) else {
        let _ = tx.send(CoreReport {
            core,
            rom_ok: false,
            malloc_ok: false,
            poller_runs: 0,
        });
        return;
    };
    let lba = 10 + u64::from(core);
    let expect = (core as u8).wrapping_add(0x40);
    let io = Rc::new_cyclic(|me| CoreIo {
        me: me.clone(),
        scratch: scratch_ch.clone(),
        lba,
        expect,
        rom_ok: Cell::new(None),
        malloc_ok: Cell::new(None),
    });
    let cb: Rc<dyn IoCompletion> = io.clone();
    let mut ok = true;
    match DmaBuf::alloc(512) {
        Ok(b) => {
            ok &= rom_ch
                .read(lba, 1, SgList::from_buf(b), &cb, ROM_READ)
                .is_ok()
        }
        Err(_) => ok = false,
    }
    match DmaBuf::alloc(512) {
        Ok(mut b) => {
            b.as_mut_slice().fill(expect);
            ok &= scratch_ch
                .write(lba, 1, SgList::from_buf(b), &cb, SCRATCH_WRITE)
                .is_ok();
        }
        Err(_) => ok = false,
    }
    // A poller of ours waits for both results, reports and removes itself.
    let rr = r.clone();
    let me = Rc::new(Cell::new(None));
    let me2 = me.clone();
    let mut tx = Some(tx);
    let id = r.add_poller("appliance-report", move || {
        if let (Some(rom_ok), Some(malloc_ok)) = (io.rom_ok.get(), io.malloc_ok.get()) {
            if let Some(tx) = tx.take() {
                let _ = tx.send(CoreReport {
                    core,
                    rom_ok: rom_ok && ok,
                    malloc_ok,
                    poller_runs: runs.get(),
                });
            }
            if let Some(id) = me2.get() {
                rr.remove_poller(id);
            }
            return PollStatus::Busy;
        }
        PollStatus::Idle
    });
    me.set(Some(id));
}

#[allow(dead_code)]
fn main() {
    match run() {
        Ok(reports) => {
            for r in &reports {
                println!(
                    "core {}: rom read {}, scratch round trip {}, heartbeat ran {} times",
                    r.core,
                    ok(r.rom_ok),
                    ok(r.malloc_ok),
                    r.poller_runs
                );
            }
            if reports.iter().any(|r| !r.rom_ok || !r.malloc_ok) {
                std::process::exit(1);
            }
        }
        Err(e) => {
            eprintln!("appliance: {e}");
            std::process::exit(2);
        }
    }
}

#[allow(dead_code)]
fn ok(b: bool) -> &'static str {
    if b {
        "ok"
    } else {
        "FAILED"
    }
}
