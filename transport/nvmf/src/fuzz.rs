//! Fuzz entry points (feature `fuzzing`; always built for this crate's
//! tests). Each must never panic on any input; a panic is a finding. Wire
//! them to cargo-fuzz with one-line targets:
//!
//! ```ignore
//! fuzz_target!(|data: &[u8]| pollux_nvmf::fuzz::fuzz_capsule(data));
//! ```
//!
//! - [`fuzz_capsule`]: every parser of [`crate::spec`] on the bytes (with
//!   round-trip checks where the format is lossless), then the bytes as a
//!   command capsule on a live loopback queue.
//! - [`fuzz_admin`]: the bytes as a sequence of commands (admin or I/O
//!   queue, with keyed, in-capsule or raw data) against a connected, enabled
//!   controller; checks that every command gets exactly one completion (an
//!   AER may wait), that the target settles, and that dropping the queues
//!   frees the controller.
//!
//! Each thread keeps one target on a one-core `TestCluster` (a 1 MiB malloc
//! namespace) across calls.

use std::cell::RefCell;
use std::collections::HashSet;
use std::sync::Arc;

use pollux_bdev::BdevRegistry;
use pollux_reactor::TestCluster;

use crate::loopback_host::{HostData, HostQueue, LoopbackHost};
use crate::spec::cmd::{AdminOpcode, NvmeCmd, SQE_SIZE};
use crate::spec::connect::ConnectData;
use crate::spec::cpl::NvmeCompletion;
use crate::spec::identify::{
    parse_ns_id_descriptors, parse_ns_list, IdentifyController, IdentifyNamespace,
};
use crate::spec::log_page::{DiscoveryLogEntry, DiscoveryLogHeader, ErrorLogEntry, SmartLog};
use crate::spec::nvm::DsmRange;
use crate::spec::rdma_cm::{CmAccept, CmReject, CmRequest};
use crate::spec::sgl::SglDescriptor;
use crate::spec::transport_id::TransportId;
use crate::target::{
    LoopbackQueueOptions, LoopbackTransport, NamespaceConfig, SubsystemConfig, Target,
    TargetOptions,
};

/// The subsystem the fuzzers connect to.
pub const FUZZ_NQN: &str = "nqn.2024-01.io.pollux:fuzz";
/// The host NQN the fuzzers use.
pub const FUZZ_HOSTNQN: &str = "nqn.2024-01.io.pollux:fuzz-host";

struct Harness {
    cluster: TestCluster,
    target: Arc<Target>,
    host: LoopbackHost,
    trid: TransportId,
    raw: Option<HostQueue>,
    _registry: BdevRegistry,
}

impl Harness {
    fn new() -> Option<Harness> {
        let cluster = TestCluster::new(1);
        let target = Target::new(TargetOptions::for_tests()).ok()?;
        let lt = LoopbackTransport::new();
        target.add_transport(lt.clone()).ok()?;
        let trid = TransportId::loopback("fuzz");
        target.add_listener(trid.clone()).ok()?;
        let registry = BdevRegistry::new();
        let sub = target.add_subsystem(SubsystemConfig::new(FUZZ_NQN)).ok()?;
        let bdev = registry
            .create("malloc:size=1M,block=512,name=fuzz0")
            .ok()?;
        sub.add_namespace(NamespaceConfig::new(bdev).with_nsid(1))
            .ok()?;
        let host = LoopbackHost::new(&lt, &target, FUZZ_HOSTNQN);
        Some(Harness {
            cluster,
            target,
            host,
            trid,
            raw: None,
            _registry: registry,
        })
    }

    fn drive(&self) {
        settle(&self.cluster);
    }
}

/// Run the reactors until idle; never settling is a finding.
fn settle(cluster: &TestCluster) {
    if let Err(e) = cluster.poll_until_idle() {
        panic!("the target never settled: {e}");
    }
}

/// A thread's harness. At thread exit it is leaked, not dropped: other
/// thread-locals it needs (the reactor's buffer caches) may already be gone.
/// [`reset`] drops this module's properly.
pub(crate) struct Slot<H>(pub(crate) Option<H>);

impl<H> Drop for Slot<H> {
    fn drop(&mut self) {
        if let Some(h) = self.0.take() {
            std::mem::forget(h);
        }
    }
}

thread_local! {
    static HARNESS: RefCell<Slot<Harness>> = const { RefCell::new(Slot(None)) };
}

/// Drop this thread's harness (target, reactors, queues); the next call
/// builds a fresh one.
pub fn reset() {
    let h = HARNESS.with(|s| s.borrow_mut().0.take());
    drop(h);
}

fn with_harness(f: impl FnOnce(&mut Harness)) {
    HARNESS.with(|s| {
        let mut s = s.borrow_mut();
        if s.0.is_none() {
            s.0 = Harness::new();
        }
        if let Some(h) = s.0.as_mut() {
            f(h);
        }
    });
}

/// Parse `data` with every parser; check lossless round trips.
fn parse_everything(data: &[u8]) {
    if let Ok(c) = NvmeCmd::parse(data) {
        assert_eq!(&c.encode()[..], &data[..SQE_SIZE], "SQE round trip");
        let _ = c.sgl();
    }
    if let Ok(c) = NvmeCompletion::parse(data) {
        let _ = c.status.to_field();
    }
    if let Ok(s) = SglDescriptor::parse_slice(data) {
        let again = SglDescriptor::parse(&s.encode());
        assert_eq!(again, Ok(s), "SGL round trip");
    }
    let _ = ConnectData::parse(data).map(|d| d.encode());
    let _ = CmRequest::parse(data).map(|r| r.validate(128));
    let _ = CmAccept::parse(data);
    let _ = CmReject::parse(data);
    let _ = IdentifyController::parse(data);
    let _ = IdentifyNamespace::parse(data).map(|n| n.block_size());
    let _ = parse_ns_list(data);
    let _ = parse_ns_id_descriptors(data);
    let _ = DiscoveryLogHeader::parse(data);
    let _ = DiscoveryLogEntry::parse(data);
    let _ = ErrorLogEntry::parse(data);
    let _ = SmartLog::parse(data);
    let _ = DsmRange::parse(data);
    for off in [1usize, 7, 16, 40] {
        if let Some(rest) = data.get(off..) {
            let _ = NvmeCmd::parse(rest);
            let _ = SglDescriptor::parse_slice(rest);
        }
    }
}

/// Fuzz the capsule parsers and a live queue with one capsule.
///
/// # Panics
///
/// On a finding: a parser panicked or lost information, or the target
/// answered a capsule more than once (or answered a malformed one).
pub fn fuzz_capsule(data: &[u8]) {
    parse_everything(data);
    with_harness(|h| {
        if h.raw.as_ref().map_or(true, |q| !q.is_connected()) {
            let r = h.cluster.reactor(0);
            h.raw = h.host.open(&r, &h.trid, LoopbackQueueOptions::io(8)).ok();
        }
        let Some(q) = h.raw.as_mut() else {
            return;
        };
        if q.endpoint().send_capsule(data.to_vec()).is_err() {
            return;
        }
        settle(&h.cluster);
        let mut n = 0;
        while q.endpoint().recv_completion().is_some() {
            n += 1;
        }
        if data.len() < SQE_SIZE {
            assert_eq!(n, 0, "a malformed capsule was answered");
        }
        assert!(n <= 1 + 4, "one capsule, {n} completions");
    });
}

/// One fuzzed command: queue, data mode and bytes, from the input.
struct Record<'a> {
    io_queue: bool,
    mode: u8,
    sqe: &'a [u8],
    data: &'a [u8],
}

fn records(mut data: &[u8]) -> impl Iterator<Item = Record<'_>> {
    std::iter::from_fn(move || {
        let (&sel, rest) = data.split_first()?;
        let sqe = rest.get(..SQE_SIZE)?;
        let rest = &rest[SQE_SIZE..];
        let len_bytes = rest.get(..2).unwrap_or(&[0, 0]);
        let dlen = usize::from(u16::from_le_bytes([
            len_bytes[0],
            len_bytes.get(1).copied().unwrap_or(0),
        ]));
        let rest = rest.get(2..).unwrap_or(&[]);
        let take = dlen.min(rest.len());
        let (d, rest) = rest.split_at(take);
        data = rest;
        Some(Record {
            io_queue: sel & 1 != 0,
            mode: (sel >> 1) & 3,
            sqe,
            data: d,
        })
    })
}

/// Encode one [`fuzz_admin`] record (for seeds): `io_queue`, data `mode`
/// (0 raw SGL, 1 keyed write of `data`, 2 keyed read of `data.len()`
/// bytes, 3 in-capsule `data`), the SQE and the data.
pub fn admin_record(io_queue: bool, mode: u8, cmd: &NvmeCmd, data: &[u8]) -> Vec<u8> {
    let mut v = vec![u8::from(io_queue) | ((mode & 3) << 1)];
    v.extend_from_slice(&cmd.encode());
    let n = data.len().min(usize::from(u16::MAX));
    v.extend_from_slice(&(n as u16).to_le_bytes());
    v.extend_from_slice(&data[..n]);
    v
}

/// Fuzz the admin and I/O command sets on a connected, enabled controller.
///
/// # Panics
///
/// On a finding: a command completed twice or never (AERs aside), the
/// target never settled, or the controller outlived its queues.
pub fn fuzz_admin(data: &[u8]) {
    with_harness(|h| {
        let r = h.cluster.reactor(0);
        let drive = || h.drive();
        let Ok(mut admin) = h.host.connect_admin(&r, &h.trid, FUZZ_NQN, 0, &drive) else {
            panic!("the fuzz harness could not connect");
        };
        let cntlid = admin.cntlid.unwrap_or(0);
        let _ = admin.set_num_queues(1, &drive);
        let Ok(mut io) = h
            .host
            .connect_io(&r, &h.trid, FUZZ_NQN, cntlid, 1, 16, &drive)
        else {
            panic!("the fuzz harness could not connect an I/O queue");
        };
        let mut aers: HashSet<u16> = HashSet::new();
        for rec in records(data).take(64) {
            let Ok(mut cmd) = NvmeCmd::parse(rec.sqe) else {
                continue;
            };
            let q = if rec.io_queue { &mut io } else { &mut admin };
            if !q.is_connected() {
                continue;
            }
            let is_aer = !rec.io_queue && cmd.opcode == AdminOpcode::AsyncEventRequest.code();
            let submitted = match rec.mode {
                0 => {
                    cmd.cid = q.alloc_cid();
                    q.submit_with_sgl(cmd, &[], None)
                }
                1 => q.submit(cmd, HostData::Write(rec.data)),
                2 => q.submit(cmd, HostData::Read(rec.data.len() as u32)),
                _ => q.submit(cmd, HostData::InCapsule(rec.data)),
            };
            let Ok(cid) = submitted else {
                continue;
            };
            h.drive();
            q.poll();
            let got = q.take(cid);
            // Anything else that completed must be an outstanding AER
            // (completed by an event or aborted).
            for extra in q.drain() {
                assert!(
                    !rec.io_queue && aers.remove(&extra.cid),
                    "unexpected completion {extra:?}"
                );
            }
            match got {
                // CIDs are per queue: an I/O command's says nothing of
                // the admin queue's AERs.
                Some(_) if !rec.io_queue => {
                    aers.remove(&cid);
                }
                Some(_) => {}
                None if is_aer => {
                    aers.insert(cid);
                }
                None => assert!(!q.is_connected(), "command {cmd:?} was dropped"),
            }
        }
        drop(io);
        drop(admin);
        h.drive();
        let left = h
            .target
            .subsystem(FUZZ_NQN)
            .map_or(0, |s| s.controller_count());
        assert_eq!(left, 0, "the controller outlived its queues");
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::cmd::IoOpcode;
    use crate::spec::features::{fid, FeatureCmd};
    use crate::spec::identify::IdentifyCmd;
    use crate::spec::log_page::GetLogPageCmd;
    use crate::spec::nvm::RwCmd;
    use crate::spec::property::{ofst, PropertyCmd, PropertySize};

    /// xorshift64*: deterministic, seedable.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }

        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }
    }

    fn mutate(rng: &mut Rng, mut v: Vec<u8>) -> Vec<u8> {
        for _ in 0..1 + rng.below(6) {
            if v.is_empty() {
                break;
            }
            let i = rng.below(v.len());
            match rng.below(4) {
                0 => v[i] ^= 1 << rng.below(8),
                1 => v[i] = rng.next() as u8,
                2 => v[i] = [0, 0xFF, 0x7F, 0x80, 1][rng.below(5)],
                _ => {
                    let cut = rng.below(v.len());
                    v.truncate(cut.max(1));
                }
            }
        }
        v
    }

    fn seeds() -> Vec<Vec<u8>> {
        let rw = |op, slba, nlb| RwCmd::to_cmd(op, 0, 1, slba, nlb).unwrap_or_default();
        let glp = |lid, len| {
            GetLogPageCmd::to_cmd(lid, 0xFFFF_FFFF, len, 0, false, 0).unwrap_or_default()
        };
        let mut aer = NvmeCmd::new(AdminOpcode::AsyncEventRequest.code(), 0);
        aer.nsid = 0;
        vec![
            admin_record(false, 2, &IdentifyCmd::to_cmd(1, 0, 0), &[0; 4096]),
            admin_record(false, 2, &IdentifyCmd::to_cmd(0, 1, 0), &[0; 4096]),
            admin_record(false, 2, &IdentifyCmd::to_cmd(3, 1, 0), &[0; 4096]),
            admin_record(false, 2, &glp(2, 512), &[0; 512]),
            admin_record(false, 2, &glp(4, 4096), &[0; 4096]),
            admin_record(false, 2, &glp(1, 128), &[0; 128]),
            admin_record(
                false,
                0,
                &FeatureCmd::set(fid::ASYNC_EVENT_CONFIG, 1 << 8, 0),
                &[],
            ),
            admin_record(false, 0, &FeatureCmd::get(fid::NUMBER_OF_QUEUES, 0), &[]),
            admin_record(false, 0, &aer, &[]),
            admin_record(false, 0, &NvmeCmd::new(AdminOpcode::Abort.code(), 0), &[]),
            admin_record(
                false,
                0,
                &PropertyCmd::get(ofst::CSTS, PropertySize::Four, 0),
                &[],
            ),
            admin_record(
                false,
                0,
                &PropertyCmd::set(ofst::CC, PropertySize::Four, 0x46_4001, 0),
                &[],
            ),
            admin_record(true, 1, &rw(IoOpcode::Write, 0, 2), &[7; 1024]),
            admin_record(true, 3, &rw(IoOpcode::Write, 8, 1), &[9; 512]),
            admin_record(true, 2, &rw(IoOpcode::Read, 0, 2), &[0; 1024]),
            admin_record(true, 0, &rw(IoOpcode::WriteZeroes, 4, 4), &[]),
            admin_record(
                true,
                1,
                &{
                    let mut c = NvmeCmd::new(IoOpcode::DatasetManagement.code(), 0);
                    c.nsid = 1;
                    c.cdw11 = 4;
                    c
                },
                &DsmRange {
                    attributes: 0,
                    nlb: 8,
                    slba: 0,
                }
                .encode(),
            ),
        ]
    }

    #[test]
    fn fuzz_capsule_survives_random_and_mutated_inputs() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let seeds = seeds();
        for i in 0..3000 {
            let input = match i % 3 {
                0 => {
                    let n = rng.below(1100);
                    rng.bytes(n)
                }
                1 => {
                    let s = &seeds[rng.below(seeds.len())];
                    mutate(&mut rng, s.get(1..65).unwrap_or(&[]).to_vec())
                }
                _ => {
                    let s = &seeds[rng.below(seeds.len())];
                    let mut v = s.get(1..65).unwrap_or(&[]).to_vec();
                    let n = rng.below(600);
                    v.extend_from_slice(&rng.bytes(n));
                    mutate(&mut rng, v)
                }
            };
            fuzz_capsule(&input);
        }
        reset();
    }

    #[test]
    fn fuzz_admin_survives_random_and_mutated_inputs() {
        let mut rng = Rng(0xD1B5_4A32_D192_ED03);
        let seeds = seeds();
        for i in 0..1500 {
            let mut input = Vec::new();
            for _ in 0..1 + rng.below(6) {
                let s = seeds[rng.below(seeds.len())].clone();
                input.extend(if i % 4 == 0 { s } else { mutate(&mut rng, s) });
            }
            if i % 5 == 0 {
                let n = rng.below(400);
                input = rng.bytes(n);
            }
            fuzz_admin(&input);
        }
        reset();
    }

    #[test]
    fn an_io_command_with_an_outstanding_aers_cid_is_no_finding() {
        // An AER waits on the admin queue; I/O commands (own CID space)
        // reuse its CID; aborting each small admin CID then completes the
        // AER with Command Abort Requested: an AER completion, not a
        // finding.
        let rw = RwCmd::to_cmd(IoOpcode::Read, 0, 1, 0, 1).unwrap_or_default();
        let aer = NvmeCmd::new(AdminOpcode::AsyncEventRequest.code(), 0);
        let mut input = admin_record(false, 0, &aer, &[]);
        for _ in 0..20 {
            input.extend(admin_record(true, 2, &rw, &[0; 512]));
        }
        for cid in 1..=20u32 {
            let mut abort = NvmeCmd::new(AdminOpcode::Abort.code(), 0);
            abort.cdw10 = cid << 16;
            input.extend(admin_record(false, 0, &abort, &[]));
        }
        fuzz_admin(&input);
        reset();
    }
}
