//! Fast registration as upper layers use it (the NVMe-oF host's
//! `register-always` mode, the iSER initiator): memory registered for local
//! access only is exposed per I/O by a `RegMr` over one contiguous range
//! (under `iova` = its address), read and written remotely through the new
//! key, and closed again by the peer's SEND_WITH_INV or a LOCAL_INV.
//!
//! These are the registrations every fast-registration mode can express
//! (page lists and type-2 memory windows, see
//! [`FastRegMode`](crate::types::FastRegMode)), so every provider with
//! `mem_mgt_extensions` runs them alike; a provider without prints why and
//! passes.

use super::harness::{Fixture, Pair};
use crate::provider::{Device, MemoryRegion, ProtectionDomain, Provider, QueuePair};
use crate::types::{Access, QpCaps, RemoteAddr, Sge, WcFlags, WcOpcode, WcStatus, WrId};
use crate::wr::{RecvWr, SendOp, SendWr};

const MEM: usize = 1 << 20;

type Mr<F> = <<F as Fixture>::P as Provider>::Mr;

/// A connected pair, an MR over the passive side's whole arena with local
/// access only, and a fast-reg MR of the passive side (`None`, after saying
/// why, when the provider has no fast registration).
struct Setup<F: Fixture> {
    p: Pair<F>,
    // Declared before `fr`, so dropped after it: the registration goes
    // before the memory it exposes.
    local: Mr<F>,
    fr: Mr<F>,
}

fn setup<F: Fixture>(f: &F) -> Option<Setup<F>> {
    let p = Pair::<F>::connect(f, QpCaps::default(), MEM);
    if !p.b.dev.caps().mem_mgt_extensions {
        eprintln!("skip: no fast registration (memory-management extensions)");
        return None;
    }
    let local =
        p.b.pd
            .reg_mr(&p.b.arena, 0, MEM, Access::LOCAL_WRITE)
            .unwrap();
    let fr = p.b.pd.alloc_fast_reg_mr(4).unwrap();
    Some(Setup { p, local, fr })
}

/// The key after `k` (same index, consumer byte + 1, `ibv_inc_rkey`).
fn next_key(k: u32) -> u32 {
    (k & !0xff) | (k.wrapping_add(1) & 0xff)
}

impl<F: Fixture> Setup<F> {
    /// Address of byte `off` of the passive side's arena.
    fn addr(&self, off: usize) -> u64 {
        self.local.addr() + off as u64
    }

    /// Fast-register `[off, off+len)` of the local-only MR as `nseg` equal
    /// contiguous segments, under the fast-reg MR's next key with `access`;
    /// wait for its completion. Returns the key.
    fn register(&self, off: usize, len: u32, nseg: u32, access: Access) -> u32 {
        let key = next_key(self.fr.lkey());
        let seg = len / nseg;
        let pages: Vec<Sge> = (0..nseg)
            .map(|i| Sge {
                addr: self.addr(off) + u64::from(i * seg),
                length: seg,
                lkey: self.local.lkey(),
            })
            .collect();
        let op = SendOp::RegMr {
            key,
            iova: self.addr(off),
            access,
        };
        let p = &self.p;
        p.b.qp
            .post_send(&[SendWr::new(WrId(500), op, &pages).signaled()])
            .unwrap();
        p.until(|p| !p.b.swc.borrow().is_empty());
        let w = p.b.take_swc()[0];
        assert_eq!(
            (w.wr_id, w.status, w.opcode),
            (WrId(500), WcStatus::Success, WcOpcode::RegMr)
        );
        assert_eq!(self.fr.rkey(), key, "the fast-reg MR carries the new key");
        assert_eq!(self.fr.len(), u64::from(len));
        key
    }

    /// Invalidate `key` locally (signaled LOCAL_INV) and wait.
    fn local_inv(&self, key: u32) {
        let p = &self.p;
        p.b.qp
            .post_send(&[SendWr::new(WrId(600), SendOp::LocalInv { key }, &[]).signaled()])
            .unwrap();
        p.until(|p| !p.b.swc.borrow().is_empty());
        let w = p.b.take_swc()[0];
        assert_eq!(
            (w.wr_id, w.status, w.opcode),
            (WrId(600), WcStatus::Success, WcOpcode::LocalInv)
        );
        assert_eq!(
            self.fr.len(),
            0,
            "an invalidated registration covers nothing"
        );
    }

    /// The active side runs one signaled `op` over `[off, off+len)` of its
    /// own MR; the completion's status.
    fn remote(&self, id: u64, op: SendOp<'_>, off: usize, len: u32) -> WcStatus {
        let p = &self.p;
        let s = [p.a.sge(off, len)];
        p.a.qp
            .post_send(&[SendWr::new(WrId(id), op, &s).signaled()])
            .unwrap();
        p.until(|p| !p.a.swc.borrow().is_empty());
        let w = p.a.take_swc()[0];
        assert_eq!(w.wr_id, WrId(id));
        w.status
    }

    fn write(&self, id: u64, key: u32, addr: u64, off: usize, len: u32) -> WcStatus {
        let remote = RemoteAddr { addr, rkey: key };
        self.remote(id, SendOp::RdmaWrite { remote }, off, len)
    }

    fn read(&self, id: u64, key: u32, addr: u64, off: usize, len: u32) -> WcStatus {
        let remote = RemoteAddr { addr, rkey: key };
        self.remote(id, SendOp::RdmaRead { remote }, off, len)
    }
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(seed) >> 3) as u8 ^ seed as u8)
        .collect()
}

/// Memory with local access only becomes remotely writable and readable
/// through a fast registration (two contiguous segments), at exactly the
/// registered range.
pub fn fast_reg_window_read_write<F: Fixture>(f: &F) {
    let Some(s) = setup(f) else { return };
    let rw = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let key = s.register(8192, 8192, 2, rw);
    let data = pattern(8192, 77);
    s.p.a.fill(0, &data);
    s.p.b.fill(8192 - 16, &[0xee; 16]);
    s.p.b.fill(16384, &[0xee; 16]);
    assert_eq!(s.write(1, key, s.addr(8192), 0, 8192), WcStatus::Success);
    assert_eq!(s.p.b.read(8192, 8192), data);
    assert_eq!(
        s.p.b.read(8192 - 16, 16),
        vec![0xee; 16],
        "before the range"
    );
    assert_eq!(s.p.b.read(16384, 16), vec![0xee; 16], "after the range");
    let back = pattern(4096, 13);
    s.p.b.fill(8192 + 4096, &back);
    assert_eq!(
        s.read(2, key, s.addr(8192 + 4096), 65536, 4096),
        WcStatus::Success
    );
    assert_eq!(s.p.a.read(65536, 4096), back);
}

/// Access past the registered range fails with REM_ACCESS_ERR (rxe: only
/// past the MR under it, see [`Expected`](super::Expected)), and so does a
/// READ through a registration without REMOTE_READ.
pub fn fast_reg_access_beyond_window_fails<F: Fixture>(f: &F) {
    let wo = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    // Past the end of a registration inside the MR.
    let Some(s) = setup(f) else { return };
    let key = s.register(8192, 4096, 1, wo);
    let end = s.addr(8192 + 4096);
    let st = s.write(1, key, end - 32, 0, 64);
    let ok = f.expected().beyond_window;
    assert!(ok.contains(&st), "{st:?}: expected one of {ok:?}");
    if st == WcStatus::Success {
        eprintln!("note: this provider checks window accesses against the MR only");
    } else {
        assert_eq!(s.p.a.qp.state(), crate::types::QpState::Err);
    }
    // Past the end of a registration that ends where its MR ends.
    let Some(s) = setup(f) else { return };
    let key = s.register(MEM - 4096, 4096, 1, wo);
    let end = s.addr(MEM);
    assert_eq!(s.write(1, key, end - 32, 0, 64), WcStatus::RemAccessErr);
    assert_eq!(s.p.a.qp.state(), crate::types::QpState::Err);

    let Some(s) = setup(f) else { return };
    let key = s.register(8192, 4096, 1, wo);
    assert_eq!(s.write(1, key, s.addr(8192), 0, 4096), WcStatus::Success);
    assert_eq!(
        s.read(2, key, s.addr(8192), 0, 64),
        WcStatus::RemAccessErr,
        "no REMOTE_READ in the registration"
    );
}

/// SEND_WITH_INV invalidates the registration: the receive reports it
/// (`WITH_INV` and the key), the fast-reg MR can be registered again at
/// once under the next key, which works, and the old key reaches nothing.
pub fn fast_reg_send_with_inv_invalidates<F: Fixture>(f: &F) {
    let Some(s) = setup(f) else { return };
    let rw = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let key = s.register(8192, 4096, 1, rw);
    let p = &s.p;
    let rs = [p.b.sge(0, 64)];
    p.b.qp
        .post_recv(&[RecvWr {
            wr_id: WrId(70),
            sg_list: &rs,
        }])
        .unwrap();
    let data = pattern(4096, 5);
    p.a.fill(0, &data);
    let ws = [p.a.sge(0, 4096)];
    let remote = RemoteAddr {
        addr: s.addr(8192),
        rkey: key,
    };
    let wrs = [
        SendWr::new(WrId(1), SendOp::RdmaWrite { remote }, &ws),
        SendWr::new(WrId(2), SendOp::SendWithInv { rkey: key }, &[]).signaled(),
    ];
    p.a.qp.post_send(&wrs).unwrap();
    p.until(|p| !p.b.rwc.borrow().is_empty() && !p.a.swc.borrow().is_empty());
    let r = p.b.take_rwc()[0];
    assert_eq!((r.wr_id, r.status), (WrId(70), WcStatus::Success));
    assert!(r.flags.contains(WcFlags::WITH_INV), "{r:?}");
    assert_eq!(r.imm, key, "the invalidated key");
    assert_eq!(p.a.take_swc()[0].status, WcStatus::Success);
    assert_eq!(p.b.read(8192, 4096), data);
    assert_eq!(s.fr.len(), 0, "an invalidated registration covers nothing");
    // Registered again (no LOCAL_INV needed) under the next key.
    let key2 = s.register(8192, 4096, 1, rw);
    assert_ne!(key2, key);
    assert_eq!(s.write(3, key2, s.addr(8192), 4096, 64), WcStatus::Success);
    assert_eq!(s.write(4, key, s.addr(8192), 0, 64), WcStatus::RemAccessErr);
}

/// LOCAL_INV invalidates the registration: its key reaches nothing.
pub fn fast_reg_local_inv_invalidates<F: Fixture>(f: &F) {
    let Some(s) = setup(f) else { return };
    let rw = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let key = s.register(8192, 4096, 1, rw);
    assert_eq!(s.write(1, key, s.addr(8192), 0, 64), WcStatus::Success);
    s.local_inv(key);
    assert_eq!(s.write(2, key, s.addr(8192), 0, 64), WcStatus::RemAccessErr);
}

/// After LOCAL_INV the fast-reg MR is registered again, elsewhere and
/// under a new key: the new key reaches the new range, the old key nothing.
pub fn fast_reg_rebind_new_key<F: Fixture>(f: &F) {
    let Some(s) = setup(f) else { return };
    let rw = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let key1 = s.register(8192, 4096, 1, rw);
    s.local_inv(key1);
    let key2 = s.register(32768, 8192, 4, rw);
    assert_ne!(key1, key2);
    assert_eq!(key1 >> 8, key2 >> 8, "same fast-reg MR, new consumer byte");
    let data = pattern(8192, 31);
    s.p.a.fill(0, &data);
    assert_eq!(s.write(1, key2, s.addr(32768), 0, 8192), WcStatus::Success);
    assert_eq!(s.p.b.read(32768, 8192), data);
    assert_eq!(
        s.write(2, key1, s.addr(8192), 0, 64),
        WcStatus::RemAccessErr
    );
}
