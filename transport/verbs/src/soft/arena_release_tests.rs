//! Arenas registered and deregistered over a long-lived connection: the
//! owner's device lets each go with its last MR, the peer unmaps its copy,
//! and slot indexes are reused (no growth, whatever the count).

#![allow(clippy::unwrap_used)]

use crate::conformance::{Fixture, Pair, SoftFixture};
use crate::provider::{MemoryRegion, ProtectionDomain};
use crate::types::{Access, QpCaps, RemoteAddr, WcStatus, WrId};
use crate::wr::{SendOp, SendWr};
use crate::QueuePair;

type F = SoftFixture;
const F: SoftFixture = SoftFixture::new("pollux-softrelease");

fn write_to(p: &Pair<F>, to: RemoteAddr, id: u64) -> WcStatus {
    let w = [p.a.sge(0, 64)];
    let wr = SendWr::new(WrId(id), SendOp::RdmaWrite { remote: to }, &w).signaled();
    p.a.qp.post_send(&[wr]).unwrap();
    p.until(|p| !p.a.swc.borrow().is_empty());
    p.a.take_swc()[0].status
}

fn peer_mappings(p: &Pair<F>) -> usize {
    let link = p.a.qp.0.link.borrow().clone().unwrap();
    link.refresh_arenas();
    let n = link.peer_arenas.borrow().iter().flatten().count();
    n
}

#[test]
fn arenas_of_deregistered_memory_are_released_on_both_sides() {
    let p = Pair::connect(&F, QpCaps::default(), 1 << 16);
    let dev = p.b.pd.0.dev.clone();
    let held = dev.registered_arenas();
    let slots = dev.0.slots.borrow().len();
    let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    for i in 0..64u64 {
        let arena = F.arena(1 << 16);
        let mr = p.b.pd.reg_mr(&arena, 0, 4096, rights).unwrap();
        assert_eq!(dev.registered_arenas(), held + 1);
        let to = RemoteAddr {
            addr: mr.addr(),
            rkey: mr.rkey(),
        };
        assert_eq!(write_to(&p, to, i), WcStatus::Success, "write {i}");
        drop(mr);
        drop(arena);
        assert_eq!(dev.registered_arenas(), held, "after MR {i}");
    }
    // The last arena is swept at the next registration activity.
    dev.0.sweep_slots();
    assert!(
        dev.0.slots.borrow().len() <= slots + 1,
        "slot indexes are reused: {} for {slots} at the start",
        dev.0.slots.borrow().len()
    );
    assert!(
        peer_mappings(&p) <= held,
        "the peer unmapped the arenas that went: {} mapped, {held} registered",
        peer_mappings(&p)
    );
}

#[test]
fn a_key_on_a_released_arena_fails_and_a_reused_index_reaches_only_the_new_arena() {
    let p = Pair::connect(&F, QpCaps::default(), 1 << 16);
    let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let old = F.arena(1 << 16);
    let mr = p.b.pd.reg_mr(&old, 0, 4096, rights).unwrap();
    let stale = RemoteAddr {
        addr: mr.addr(),
        rkey: mr.rkey(),
    };
    assert_eq!(write_to(&p, stale, 1), WcStatus::Success);
    drop(mr);
    drop(old);
    let new = F.arena(1 << 16);
    let mr2 = p.b.pd.reg_mr(&new, 0, 4096, rights).unwrap();
    p.a.fill(0, &[7; 64]);
    let to = RemoteAddr {
        addr: mr2.addr(),
        rkey: mr2.rkey(),
    };
    assert_eq!(write_to(&p, to, 2), WcStatus::Success);
    let mut got = [0u8; 64];
    new.copy_out(0, &mut got).unwrap();
    assert_eq!(got, [7; 64]);
}
