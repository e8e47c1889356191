//! Initiator-side helpers of the `pollux-tgt` iSER tests: our initiator
//! (soft provider) logging in to a running target, polled on the test
//! thread with a deadline of [`WAIT`].

use std::time::Instant;

use pollux_iser::initiator::scsi::{parse_read_capacity16, read_capacity16_cdb};
use pollux_iser::initiator::{
    DataDir, InitiatorOptions, IserInitiator, LunGeometry, PiPolicy, SessionState, TaskResult,
};
use pollux_reactor::mem::{DmaBuf, SgList};
use pollux_verbs::soft::Soft;

use super::WAIT;

/// The `[iscsi.options]` section of the test targets' configurations
/// (queue depth 16, 64 KiB I/O, 64 task buffers, no hugepages).
pub const ISCSI_OPTIONS: &str = r#"[iscsi.options]
queue_depth = 16
max_io_bytes = "64k"
task_buffers = 64
max_srq_depth = 128
num_cqe = 4096
hugepages = "never"
"#;

/// Poll `ini` until `done` says so (panics when the session fails or after
/// [`WAIT`]); `done` sees every result that arrived so far.
pub fn drive(
    ini: &mut IserInitiator<Soft>,
    mut done: impl FnMut(&mut IserInitiator<Soft>, &mut Vec<TaskResult>) -> bool,
) {
    let deadline = Instant::now() + WAIT;
    let mut out = Vec::new();
    while Instant::now() < deadline {
        ini.poll(&mut |r| out.push(r));
        if let SessionState::Failed(e) = ini.state() {
            panic!("session failed: {e}");
        }
        if done(ini, &mut out) {
            return;
        }
        std::thread::yield_now();
    }
    panic!("timed out in state {:?}", ini.state());
}

/// The next task result of `ini`.
pub fn one(ini: &mut IserInitiator<Soft>) -> TaskResult {
    let mut got = None;
    drive(ini, |_, out| {
        got = out.pop();
        got.is_some()
    });
    got.unwrap()
}

/// A session of `initiator` with `target` at `addr` (queue depth 8, 64 KiB
/// I/O, `pi` policy, ISID ending in `isid`), polled until it is ready.
pub fn connect(
    addr: &str,
    initiator: &str,
    target: &str,
    pi: PiPolicy,
    isid: u8,
) -> IserInitiator<Soft> {
    let mut o = InitiatorOptions::new(addr, initiator, target);
    o.queue_depth = 8;
    o.max_io_bytes = 65536;
    o.pi = pi;
    o.isid[5] = isid;
    let mut ini = IserInitiator::<Soft>::connect(o).unwrap();
    drive(&mut ini, |i, _| i.is_ready());
    ini
}

/// READ CAPACITY(16) of `lun`, which must succeed.
pub fn read_capacity(ini: &mut IserInitiator<Soft>, lun: u16) -> LunGeometry {
    let b = SgList::from_buf(DmaBuf::alloc(32).unwrap());
    ini.submit(lun, &read_capacity16_cdb(), DataDir::Read, Some(b), 32, 9)
        .unwrap();
    let r = one(ini);
    assert!(r.is_good(), "READ CAPACITY(16): {:?}", r.sense);
    parse_read_capacity16(r.bufs.unwrap().pop().unwrap().as_slice()).unwrap()
}

/// Log `ini` out and poll until the session is closed.
pub fn logout(mut ini: IserInitiator<Soft>) {
    ini.logout().unwrap();
    drive(&mut ini, |i, _| *i.state() == SessionState::Closed);
}
