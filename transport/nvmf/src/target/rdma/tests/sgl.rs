//! Keyed SGL descriptors and remote invalidation: the target answers with
//! SEND_WITH_INVALIDATE of the descriptor's key only where the host asked
//! for it (subtype Invalidate Key) and handed over a registration (a
//! length other than 0).

use pollux_verbs::MemoryRegion;

use super::host::{spin, Rsp};
use super::*;

/// Send `cmd` on `h` and wait for its response; `None` when the host's
/// queue died first.
fn exec_alive(cl: &TestCluster, h: &mut Host, cmd: &NvmeCmd) -> Option<Rsp> {
    h.send(cmd, &[]);
    let cid = cmd.cid;
    spin(cl, || {
        if !h.poll() {
            return Some(None);
        }
        let i = h.rsps.iter().position(|r| r.cpl.cid == cid)?;
        Some(h.rsps.remove(i))
    })
    .flatten()
}

/// A keyed SGL of length 0 (a command without data) describes no host
/// memory, so its key names no registration, even with the Invalidate Key
/// subtype (0x4F): the response is a plain SEND, as the Linux target
/// (`nvmet_rdma_map_sgl_keyed`: "no data command?" returns before the key
/// is recorded) and SPDK (a transfer of length 0 is no transfer: the SGL is
/// never parsed) answer. A SEND_WITH_INV of such a key fails at the host
/// (no MR to invalidate there: its NIC NAKs the SEND, both QPs go to ERR)
/// and takes the queue down. A descriptor with a length still gets its key
/// invalidated when the command itself moves no data (Set Features with a
/// buffer), as Linux does.
#[test]
fn a_zero_length_keyed_sgl_asking_for_invalidation_is_answered_with_a_plain_send() {
    let fx = fixture(RdmaOptions::for_tests());
    let (mut admin, cntlid) = fx.admin();
    let mut io = fx.io(cntlid, 8);
    let errors = fx.pg.stats().wc_errors;
    let rkey = io.mr.rkey();
    for (cid, key) in [(40u16, 0u32), (41, 0x1234_5678), (42, rkey)] {
        let mut flush = NvmeCmd::new(0x00, cid);
        flush.nsid = 1;
        flush.set_sgl(&SglDescriptor::keyed(0, 0, key, true).expect("sgl"));
        let r = exec_alive(&fx.cl, &mut io, &flush);
        let r = r.unwrap_or_else(|| panic!("key {key:#x}: the host's queue died"));
        assert!(r.cpl.status.is_success(), "key {key:#x}: {:?}", r.cpl);
        assert_eq!(r.invalidated, None, "key {key:#x} was invalidated");
    }
    assert_eq!(fx.pg.stats().wc_errors, errors, "a work request failed");
    assert_eq!(fx.pg.connections(), 2, "a queue went");
    write_read_back_io(&fx, &mut io);
    // Set Features (Async Event Configuration: no data) with a registered
    // 4 KiB buffer asking for invalidation: its key is invalidated.
    let (sgl, key) = admin.keyed_inv(&fx.cl, 0, 4096);
    let mut sf = NvmeCmd::new(0x09, 43);
    sf.cdw10 = 0x0B;
    sf.cdw11 = 0x100;
    sf.set_sgl(&sgl);
    let r = exec_alive(&fx.cl, &mut admin, &sf).expect("the admin queue died");
    assert!(r.cpl.status.is_success(), "{:?}", r.cpl);
    assert_eq!(r.invalidated, Some(key));
}

/// An 8 KiB keyed write and read back on `io` (the queue still moves data).
fn write_read_back_io(fx: &Fx, io: &mut Host) {
    const L: usize = 8192;
    let data = pattern(21, L);
    io.data_mut(0, L).copy_from_slice(&data);
    let w = rw(0x01, 50, 0, L as u32, &io.keyed(0, L as u32, false));
    assert!(io.exec(&fx.cl, &w, &[]).cpl.status.is_success());
    io.data_mut(0, L).fill(0);
    let r = rw(0x02, 51, 0, L as u32, &io.keyed(0, L as u32, false));
    assert!(io.exec(&fx.cl, &r, &[]).cpl.status.is_success());
    assert!(io.data(0, L) == &data[..], "read back differs");
}
