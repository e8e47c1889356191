//! An iSER initiator's session steps for the churn tests: log in (a fresh
//! ISID each time) and read LUN 0's capacity, wait for one task, write a
//! pattern and read it back. Each polls the initiator and, between polls,
//! the caller's `world` (the in-process target's reactors, or nothing when
//! the target is another process); a step that does not finish within
//! [`LIMIT`] fails (a bound against a hang, not a speed check).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use pollux_iser::initiator::scsi::{parse_read_capacity16, read_capacity16_cdb};
use pollux_iser::initiator::{DataDir, InitiatorOptions, IserInitiator, SessionState, TaskResult};
use pollux_reactor::mem::{DmaBuf, SgList};
use pollux_verbs::soft::Soft;

/// Longest wait for a login or one task.
pub const LIMIT: Duration = Duration::from_secs(120);

/// Log `initiator` in to `target` at `addr` (a session of its own: a fresh
/// ISID) and read LUN 0's capacity: the session, or why it failed.
pub fn login(
    addr: &str,
    initiator: &str,
    target: &str,
    world: &mut dyn FnMut(),
) -> Result<IserInitiator<Soft>, String> {
    static ISID: AtomicU32 = AtomicU32::new(1);
    let mut o = InitiatorOptions::new(addr, initiator, target);
    o.queue_depth = 8;
    // The churn and soak runs hold sessions idle, stopped or killed on
    // purpose and count the target's NOP-Ins: no pings of our own beside
    // them (the initiator's keep-alive is tested in iser_loop).
    o.nop_interval = std::time::Duration::ZERO;
    let n = ISID.fetch_add(1, Ordering::Relaxed).to_be_bytes();
    o.isid = [0x80, 0, n[0], n[1], n[2], n[3]];
    let mut ini = IserInitiator::<Soft>::connect(o).map_err(|e| e.to_string())?;
    let start = Instant::now();
    loop {
        world();
        ini.poll(&mut |_| {});
        match ini.state() {
            SessionState::Ready => break,
            SessionState::Failed(e) => return Err(e.to_string()),
            _ if start.elapsed() > LIMIT => return Err("login did not finish".into()),
            _ => {}
        }
    }
    let bufs = SgList::from_buf(DmaBuf::alloc(32).map_err(|e| e.to_string())?);
    ini.submit(0, &read_capacity16_cdb(), DataDir::Read, Some(bufs), 32, 9)
        .map_err(|e| format!("{e:?}"))?;
    let r = wait(&mut ini, world)?;
    let d = r.bufs.and_then(|mut b| b.pop()).ok_or("no capacity data")?;
    let g = parse_read_capacity16(d.as_slice()).ok_or("bad capacity data")?;
    ini.set_geometry(0, g);
    Ok(ini)
}

/// The next task `ini` completes.
pub fn wait(ini: &mut IserInitiator<Soft>, world: &mut dyn FnMut()) -> Result<TaskResult, String> {
    let mut out = None;
    let start = Instant::now();
    while start.elapsed() < LIMIT {
        world();
        ini.poll(&mut |r| out = Some(r));
        if let Some(r) = out.take() {
            return Ok(r);
        }
        if let SessionState::Failed(e) = ini.state() {
            return Err(format!("session failed: {e}"));
        }
    }
    Err("a task did not finish".into())
}

fn pattern(seed: u64) -> Vec<u8> {
    (0..4096u64)
        .map(|i| (i.wrapping_mul(29) ^ seed) as u8)
        .collect()
}

/// Write 4 KiB at `lba` of LUN 0, read it back, compare.
pub fn verified_io(
    ini: &mut IserInitiator<Soft>,
    lba: u64,
    seed: u64,
    world: &mut dyn FnMut(),
) -> Result<(), String> {
    let data = pattern(seed);
    let mut b = DmaBuf::alloc(4096).map_err(|e| e.to_string())?;
    b.as_mut_slice().copy_from_slice(&data);
    ini.write(0, lba, 8, SgList::from_buf(b), 1)
        .map_err(|e| format!("write: {e:?}"))?;
    let w = wait(ini, world)?;
    if !w.is_good() {
        return Err(format!("write: {:?}", w.sense));
    }
    let b = DmaBuf::alloc(4096).map_err(|e| e.to_string())?;
    ini.read(0, lba, 8, SgList::from_buf(b), 2)
        .map_err(|e| format!("read: {e:?}"))?;
    let r = wait(ini, world)?;
    if !r.is_good() {
        return Err(format!("read: {:?}", r.sense));
    }
    let got = r.bufs.and_then(|mut b| b.pop()).ok_or("no read data")?;
    if got.as_slice() != &data[..] {
        return Err(format!(
            "lba {lba}: read back differs from what was written"
        ));
    }
    Ok(())
}

/// Log `ini` out and poll until its session is closed.
pub fn logout(mut ini: IserInitiator<Soft>, world: &mut dyn FnMut()) -> Result<(), String> {
    ini.logout().map_err(|e| format!("logout: {e}"))?;
    let start = Instant::now();
    while start.elapsed() < LIMIT {
        world();
        ini.poll(&mut |_| {});
        if *ini.state() == SessionState::Closed {
            return Ok(());
        }
    }
    Err("logout did not finish".into())
}
