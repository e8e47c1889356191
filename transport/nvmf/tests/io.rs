//! NVM I/O end to end over the loopback transport: data verification,
//! every error status, back-pressure, and queues on two cores.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use pollux_nvmf::loopback_host::HostData;
use pollux_nvmf::spec::cmd::{IoOpcode, NvmeCmd};
use pollux_nvmf::spec::cpl::NvmeStatus;
use pollux_nvmf::spec::nvm::{DsmCmd, DsmRange, RwCmd};
use pollux_nvmf::spec::sgl::SglDescriptor;
use pollux_nvmf::target::TargetOptions;

fn rw(op: IoOpcode, nsid: u32, slba: u64, nlb: u32) -> NvmeCmd {
    RwCmd::to_cmd(op, 0, nsid, slba, nlb).unwrap()
}

#[test]
fn write_read_verify_keyed_and_in_capsule() {
    let fx = Fx::new();
    let mut admin = fx.admin();
    let mut io = fx.io_on(&mut admin, 0);

    // Keyed write (data pulled from host memory), keyed read back.
    let a = pattern(8 * BLOCK as usize, 1);
    assert_eq!(fx.write(&mut io, 1, 16, &a), NvmeStatus::SUCCESS);
    let c = fx.read(&mut io, 1, 16, 8);
    assert_eq!(c.cpl.status, NvmeStatus::SUCCESS);
    assert_eq!(c.cpl.sqid, 1);
    assert!(
        c.key_invalidated,
        "0x4F SGL: the response invalidates the key"
    );
    assert_eq!(c.data.unwrap(), a);

    // In-capsule write (4 KiB), read back with a plain keyed SGL.
    let b = pattern(4096, 7);
    let c = fx.exec(
        &mut io,
        rw(IoOpcode::Write, 1, 100, 8),
        HostData::InCapsule(&b),
    );
    assert_eq!(c.cpl.status, NvmeStatus::SUCCESS);
    io.invalidate = false;
    let c = fx.read(&mut io, 1, 100, 8);
    assert!(!c.key_invalidated);
    assert_eq!(c.data.unwrap(), b);

    // Large transfers use the shared pool (128 KiB = 4 × 32 KiB buffers).
    let big = pattern(128 * 1024, 9);
    assert_eq!(fx.write(&mut io, 1, 1024, &big), NvmeStatus::SUCCESS);
    let c = fx.read(&mut io, 1, 1024, 256);
    assert_eq!(c.data.unwrap(), big);
    // The last block of the namespace.
    let last = pattern(512, 3);
    assert_eq!(fx.write(&mut io, 1, BLOCKS - 1, &last), NvmeStatus::SUCCESS);
    assert_eq!(fx.read(&mut io, 1, BLOCKS - 1, 1).data.unwrap(), last);
}

#[test]
fn flush_write_zeroes_and_deallocate() {
    let fx = Fx::new();
    let mut admin = fx.admin();
    let mut io = fx.io_on(&mut admin, 0);
    let data = pattern(64 * BLOCK as usize, 5);
    assert_eq!(fx.write(&mut io, 1, 0, &data), NvmeStatus::SUCCESS);

    let mut flush = NvmeCmd::new(IoOpcode::Flush.code(), 0);
    flush.nsid = 1;
    assert_eq!(
        fx.exec(&mut io, flush, HostData::None).cpl.status,
        NvmeStatus::SUCCESS
    );

    // Write Zeroes blocks 4..12.
    let c = fx.exec(&mut io, rw(IoOpcode::WriteZeroes, 1, 4, 8), HostData::None);
    assert_eq!(c.cpl.status, NvmeStatus::SUCCESS);
    let got = fx.read(&mut io, 1, 0, 16).data.unwrap();
    assert_eq!(&got[..4 * 512], &data[..4 * 512]);
    assert!(got[4 * 512..12 * 512].iter().all(|&b| b == 0));
    assert_eq!(&got[12 * 512..], &data[12 * 512..16 * 512]);

    // DSM deallocate two ranges (and an empty one) → bdev unmap (malloc zeroes).
    let ranges = [
        DsmRange {
            attributes: 0,
            nlb: 2,
            slba: 20,
        },
        DsmRange {
            attributes: 0,
            nlb: 0,
            slba: 9999,
        },
        DsmRange {
            attributes: 0,
            nlb: 3,
            slba: 40,
        },
    ];
    let bytes: Vec<u8> = ranges.iter().flat_map(|r| r.encode()).collect();
    assert_eq!(
        fx.exec(&mut io, dsm_cmd(3), HostData::Write(&bytes))
            .cpl
            .status,
        NvmeStatus::SUCCESS
    );
    let got = fx.read(&mut io, 1, 0, 64).data.unwrap();
    assert_zeroed_where(&got, &data, |blk| {
        (4..12).contains(&blk) || (20..22).contains(&blk) || (40..43).contains(&blk)
    });

    // A DSM range out of range fails the whole command, nothing unmapped.
    let bad = [
        DsmRange {
            attributes: 0,
            nlb: 1,
            slba: 0,
        },
        DsmRange {
            attributes: 0,
            nlb: 2,
            slba: BLOCKS - 1,
        },
    ];
    let bytes: Vec<u8> = bad.iter().flat_map(|r| r.encode()).collect();
    let mut dsm = dsm_cmd(2);
    assert_eq!(
        fx.exec(&mut io, dsm, HostData::Write(&bytes)).cpl.status,
        NvmeStatus::LBA_OUT_OF_RANGE
    );
    assert_eq!(&fx.read(&mut io, 1, 0, 1).data.unwrap()[..], &data[..512]);
    // Without AD the ranges are hints: success, nothing changes.
    dsm.cdw11 = 0;
    assert_eq!(
        fx.exec(&mut io, dsm, HostData::Write(&bytes)).cpl.status,
        NvmeStatus::SUCCESS
    );
}

#[test]
fn io_errors_get_the_right_status() {
    let fx = Fx::new();
    let mut admin = fx.admin();
    let mut io = fx.io_on(&mut admin, 0);
    let st = |io: &mut _, cmd, data| fx.exec(io, cmd, data).cpl.status;

    // LBA range: past the end, wrapping, and write zeroes too.
    assert_eq!(
        st(
            &mut io,
            rw(IoOpcode::Read, 1, BLOCKS - 1, 2),
            HostData::Read(1024)
        ),
        NvmeStatus::LBA_OUT_OF_RANGE
    );
    assert_eq!(
        st(
            &mut io,
            rw(IoOpcode::Read, 1, u64::MAX, 1),
            HostData::Read(512)
        ),
        NvmeStatus::LBA_OUT_OF_RANGE
    );
    assert_eq!(
        st(
            &mut io,
            rw(IoOpcode::WriteZeroes, 1, BLOCKS, 1),
            HostData::None
        ),
        NvmeStatus::LBA_OUT_OF_RANGE
    );
    // Unknown opcode (valid namespace), unknown namespace, broadcast flush.
    let mut odd = NvmeCmd::new(0x7E, 0);
    odd.nsid = 1;
    assert_eq!(st(&mut io, odd, HostData::None), NvmeStatus::INVALID_OPCODE);
    assert_eq!(
        st(&mut io, rw(IoOpcode::Read, 9, 0, 1), HostData::Read(512)),
        NvmeStatus::INVALID_NAMESPACE
    );
    let mut flush = NvmeCmd::new(IoOpcode::Flush.code(), 0);
    flush.nsid = 0xFFFF_FFFF;
    assert_eq!(
        st(&mut io, flush, HostData::None),
        NvmeStatus::INVALID_NAMESPACE
    );
    // Over MDTS (128 KiB).
    assert_eq!(
        st(
            &mut io,
            rw(IoOpcode::Read, 1, 0, 257),
            HostData::Read(257 * 512)
        ),
        NvmeStatus::INVALID_FIELD
    );
    // SGL length does not match NLB.
    assert_eq!(
        st(&mut io, rw(IoOpcode::Read, 1, 0, 2), HostData::Read(512)),
        NvmeStatus::DATA_SGL_LENGTH_INVALID
    );
    // In-capsule data on a read, and past the in-capsule data.
    let mut c = rw(IoOpcode::Read, 1, 0, 1);
    c.set_sgl(&SglDescriptor::in_capsule(0, 512));
    c.cid = io.alloc_cid();
    let cid = io.submit_with_sgl(c, &[0u8; 512], None).unwrap();
    fx.drive()();
    io.poll();
    assert_eq!(io.take(cid).unwrap().cpl.status, NvmeStatus::INVALID_FIELD);
    let mut c = rw(IoOpcode::Write, 1, 0, 1);
    c.set_sgl(&SglDescriptor::in_capsule(256, 512));
    c.cid = io.alloc_cid();
    let cid = io.submit_with_sgl(c, &[0u8; 512], None).unwrap();
    fx.drive()();
    io.poll();
    assert_eq!(
        io.take(cid).unwrap().cpl.status,
        NvmeStatus::SGL_OFFSET_INVALID
    );
    // Unsupported SGL types and subtypes, PSDT, fused.
    let mut c = rw(IoOpcode::Read, 1, 0, 1);
    c.cid = io.alloc_cid();
    c.set_sgl(&SglDescriptor::DataBlock { addr: 0, len: 512 });
    let cid = io.submit_with_sgl(c, &[], None).unwrap();
    fx.drive()();
    io.poll();
    assert_eq!(
        io.take(cid).unwrap().cpl.status,
        NvmeStatus::SGL_DESCRIPTOR_TYPE_INVALID
    );
    let mut c = rw(IoOpcode::Read, 1, 0, 1);
    c.cid = io.alloc_cid();
    c.dptr[15] = 0x41;
    let cid = io.submit_with_sgl(c, &[], None).unwrap();
    fx.drive()();
    io.poll();
    assert_eq!(io.take(cid).unwrap().cpl.status, NvmeStatus::INVALID_FIELD);
    let mut c = rw(IoOpcode::Read, 1, 0, 1);
    c.flags = 0;
    assert_eq!(
        st(&mut io, c, HostData::Read(512)),
        NvmeStatus::INVALID_FIELD
    );
    let mut c = rw(IoOpcode::Read, 1, 0, 1);
    c.flags |= 1;
    assert_eq!(
        st(&mut io, c, HostData::Read(512)),
        NvmeStatus::INVALID_FIELD
    );
    // A bad remote key: Data Transfer Error (the command still completes).
    let mut c = rw(IoOpcode::Write, 1, 0, 1);
    c.cid = io.alloc_cid();
    c.set_sgl(&SglDescriptor::keyed(0, 512, 0xDEAD, false).unwrap());
    let cid = io.submit_with_sgl(c, &[], None).unwrap();
    fx.drive()();
    io.poll();
    assert_eq!(
        io.take(cid).unwrap().cpl.status,
        NvmeStatus::DATA_TRANSFER_ERROR
    );
    // A key that is valid but too short for the transfer.
    let key = io.register(vec![0u8; 100]);
    let mut c = rw(IoOpcode::Write, 1, 0, 1);
    c.cid = io.alloc_cid();
    c.set_sgl(&SglDescriptor::keyed(0, 512, key, false).unwrap());
    let cid = io.submit_with_sgl(c, &[], None).unwrap();
    fx.drive()();
    io.poll();
    assert_eq!(
        io.take(cid).unwrap().cpl.status,
        NvmeStatus::DATA_TRANSFER_ERROR
    );
    // Connect on a connected I/O queue.
    let c = NvmeCmd::fabrics(pollux_nvmf::spec::cmd::FabricsType::Connect, 0);
    assert_eq!(
        st(&mut io, c, HostData::None),
        NvmeStatus::COMMAND_SEQUENCE_ERROR
    );

    // Disabling the controller: I/O gets Command Sequence Error.
    let d = fx.drive();
    admin.property_set(0x14, 0, &d).unwrap();
    assert_eq!(
        st(&mut io, rw(IoOpcode::Read, 1, 0, 1), HostData::Read(512)),
        NvmeStatus::COMMAND_SEQUENCE_ERROR
    );
    // Every command got exactly one completion.
    io.poll();
    assert!(io.drain().is_empty());
}

#[test]
fn buffer_exhaustion_parks_requests_instead_of_failing_them() {
    // 6 data buffers of 32 KiB: one 128 KiB request needs 4, so of 8
    // concurrent reads at most one holds buffers at a time.
    let opts = TargetOptions {
        num_data_buffers: 6,
        buffer_cache_size: 2,
        ..TargetOptions::for_tests()
    };
    let fx = Fx::with(opts, 1);
    let mut admin = fx.admin();
    let mut io = fx.io_on(&mut admin, 0);
    let data = pattern(128 * 1024, 11);
    assert_eq!(fx.write(&mut io, 1, 0, &data), NvmeStatus::SUCCESS);
    let cids: Vec<u16> = (0..8)
        .map(|_| {
            io.submit(rw(IoOpcode::Read, 1, 0, 256), HostData::Read(128 * 1024))
                .unwrap()
        })
        .collect();
    fx.drive()();
    io.poll();
    for cid in cids {
        let c = io.take(cid).unwrap();
        assert_eq!(c.cpl.status, NvmeStatus::SUCCESS);
        assert_eq!(c.data.unwrap(), data);
    }
    // 8 requests × 4 buffers cannot all have held buffers at once: they
    // waited (parked) and resumed as buffers came back.
    assert!(8 * 4 > fx.target.data_pool().count());
}

#[test]
fn io_queue_on_another_core() {
    let fx = Fx::with(TargetOptions::for_tests(), 2);
    let mut admin = fx.admin();
    let mut io = fx.io_on(&mut admin, 1);
    let data = pattern(4096, 42);
    assert_eq!(fx.write(&mut io, 1, 8, &data), NvmeStatus::SUCCESS);
    assert_eq!(fx.read(&mut io, 1, 8, 8).data.unwrap(), data);
    let cntlid = admin.cntlid.unwrap();
    let ctrl = fx.sub1.controller(cntlid).unwrap();
    assert_eq!(ctrl.admin_core(), 0);
    assert_eq!(ctrl.io_qids(), vec![1]);
}

#[test]
fn sq_head_advances_and_can_be_disabled() {
    let fx = Fx::new();
    let d = fx.drive();
    let mut admin = fx.admin();
    let mut io = fx.io_on(&mut admin, 0);
    let a = fx.read(&mut io, 1, 0, 1).cpl.sqhd;
    let b = fx.read(&mut io, 1, 0, 1).cpl.sqhd;
    assert_eq!(b, (a + 1) % 32);

    // Queue 2 with CATTR bit 2: SQ flow control off, SQHD = 0xFFFF.
    let r = fx.cluster.reactor(0);
    let mut q2 = fx
        .host
        .open(
            &r,
            &fx.trid,
            pollux_nvmf::target::LoopbackQueueOptions::io(16),
        )
        .unwrap();
    let cmd = pollux_nvmf::spec::connect::ConnectCmd {
        qid: 2,
        sqsize: 15,
        cattr: pollux_nvmf::spec::connect::CATTR_DISABLE_SQ_FLOW,
        ..Default::default()
    }
    .to_cmd(0);
    let data = fx.host.connect_data(SUB1, admin.cntlid.unwrap());
    let c = q2.exec(cmd, HostData::InCapsule(&data), &d).unwrap();
    assert_eq!(c.cpl.status, NvmeStatus::SUCCESS);
    assert_eq!(c.cpl.sqhd, 0xFFFF);
    assert_eq!(fx.read(&mut q2, 1, 0, 1).cpl.sqhd, 0xFFFF);
}

/// `got` (512-byte blocks) is zero in the blocks `zero` names and `data`
/// elsewhere.
fn assert_zeroed_where(got: &[u8], data: &[u8], zero: impl Fn(usize) -> bool) {
    for (blk, s) in got.chunks(512).enumerate() {
        if zero(blk) {
            assert!(s.iter().all(|&b| b == 0), "block {blk} deallocated");
        } else {
            assert_eq!(s, &data[blk * 512..(blk + 1) * 512], "block {blk} kept");
        }
    }
}

/// A Dataset Management command with `nr` ranges, AD set, on namespace 1.
fn dsm_cmd(nr: u16) -> NvmeCmd {
    let (c10, c11) = DsmCmd {
        nr,
        idr: false,
        idw: false,
        ad: true,
    }
    .cdw10_11();
    let mut dsm = NvmeCmd::new(IoOpcode::DatasetManagement.code(), 0);
    dsm.nsid = 1;
    dsm.cdw10 = c10;
    dsm.cdw11 = c11;
    dsm
}

#[test]
fn dsm_takes_its_ranges_from_a_longer_buffer_as_linux_sends() {
    let fx = Fx::new();
    let mut admin = fx.admin();
    let mut io = fx.io_on(&mut admin, 0);
    let data = pattern(16 * BLOCK as usize, 3);
    assert_eq!(fx.write(&mut io, 1, 0, &data), NvmeStatus::SUCCESS);
    // One range in a 4096-byte keyed buffer (what the Linux host sends for
    // blkdiscard / fstrim); the bytes after NR+1 ranges are ignored, even
    // if they look like ranges.
    let mut buf = vec![0u8; 4096];
    let r = DsmRange {
        attributes: 0,
        nlb: 4,
        slba: 2,
    };
    buf[..16].copy_from_slice(&r.encode());
    let junk = DsmRange {
        attributes: 0,
        nlb: 1,
        slba: 10,
    };
    buf[16..32].copy_from_slice(&junk.encode());
    let mut c = dsm_cmd(1);
    c.cid = io.alloc_cid();
    let key = io.register(buf.clone());
    c.set_sgl(&SglDescriptor::keyed(0, 4096, key, true).unwrap());
    let cid = io.submit_with_sgl(c, &[], Some(key)).unwrap();
    fx.drive()();
    io.poll();
    assert_eq!(io.take(cid).unwrap().cpl.status, NvmeStatus::SUCCESS);
    let got = fx.read(&mut io, 1, 0, 16).data.unwrap();
    assert_zeroed_where(&got, &data, |blk| (2..6).contains(&blk));
    // In-capsule: one range in 64 bytes of capsule data.
    let mut icd = vec![0u8; 64];
    icd[..16].copy_from_slice(&junk.encode());
    let mut c = dsm_cmd(1);
    c.cid = io.alloc_cid();
    c.set_sgl(&SglDescriptor::in_capsule(0, 64));
    let cid = io.submit_with_sgl(c, &icd, None).unwrap();
    fx.drive()();
    io.poll();
    assert_eq!(io.take(cid).unwrap().cpl.status, NvmeStatus::SUCCESS);
    assert!(fx
        .read(&mut io, 1, 10, 1)
        .data
        .unwrap()
        .iter()
        .all(|&b| b == 0));
    // Shorter than NR+1 ranges: still Data SGL Length Invalid.
    let mut c = dsm_cmd(2);
    c.cid = io.alloc_cid();
    let key = io.register(vec![0u8; 16]);
    c.set_sgl(&SglDescriptor::keyed(0, 16, key, true).unwrap());
    let cid = io.submit_with_sgl(c, &[], Some(key)).unwrap();
    fx.drive()();
    io.poll();
    assert_eq!(
        io.take(cid).unwrap().cpl.status,
        NvmeStatus::DATA_SGL_LENGTH_INVALID
    );
    // Reads and writes still need the exact length.
    assert_eq!(
        fx.exec(&mut io, rw(IoOpcode::Read, 1, 0, 1), HostData::Read(1024))
            .cpl
            .status,
        NvmeStatus::DATA_SGL_LENGTH_INVALID
    );
}

#[test]
fn smart_log_counts_io_per_queue_summed_on_the_admin_queue() {
    use pollux_nvmf::spec::log_page::{lid, GetLogPageCmd, SmartLog};
    let fx = Fx::new();
    let mut admin = fx.admin();
    let mut io = fx.io_on(&mut admin, 0);
    let smart = |admin: &mut _| {
        let cmd = GetLogPageCmd::to_cmd(lid::SMART, 0xFFFF_FFFF, 512, 0, false, 0).unwrap();
        SmartLog::parse(&fx.exec(admin, cmd, HostData::Read(512)).data.unwrap()).unwrap()
    };
    let s0 = smart(&mut admin);
    assert_eq!(
        (
            s0.data_units_read,
            s0.data_units_written,
            s0.host_reads,
            s0.host_writes
        ),
        (0, 0, 0, 0)
    );
    // 3 writes of 8 blocks (24 units), 2 reads of 256 blocks (512 units),
    // 1 write zeroes (a write command, no data units), 1 failed read.
    for i in 0..3 {
        let d = pattern(8 * 512, i);
        assert_eq!(
            fx.write(&mut io, 1, u64::from(i) * 8, &d),
            NvmeStatus::SUCCESS
        );
    }
    for _ in 0..2 {
        assert_eq!(fx.read(&mut io, 1, 0, 256).cpl.status, NvmeStatus::SUCCESS);
    }
    let wz = fx.exec(&mut io, rw(IoOpcode::WriteZeroes, 1, 0, 8), HostData::None);
    assert_eq!(wz.cpl.status, NvmeStatus::SUCCESS);
    assert_eq!(
        fx.read(&mut io, 1, BLOCKS, 1).cpl.status,
        NvmeStatus::LBA_OUT_OF_RANGE
    );
    let s = smart(&mut admin);
    assert_eq!(s.host_reads, 2);
    assert_eq!(s.host_writes, 4);
    assert_eq!(s.data_units_read, 1, "512 units: one thousand, rounded up");
    assert_eq!(s.data_units_written, 1, "24 units: rounded up");
    // The queue's counts stay in the sums after it disconnects.
    let big = pattern(128 * 1024, 1);
    for _ in 0..4 {
        assert_eq!(fx.write(&mut io, 1, 0, &big), NvmeStatus::SUCCESS);
    }
    io.endpoint().disconnect();
    fx.drive()();
    let s = smart(&mut admin);
    assert_eq!(s.host_writes, 8);
    assert_eq!(s.data_units_written, 2, "24 + 1024 units");
    assert_eq!(s.power_on_hours, 0);
}

#[test]
fn completions_carry_the_sq_head_and_it_wraps_at_the_queue_size() {
    let fx = Fx::new();
    let mut admin = fx.admin();
    // 32 entries (`io_on`): 70 commands one after another wrap it twice.
    let mut io = fx.io_on(&mut admin, 0);
    let mut prev = fx.read(&mut io, 1, 0, 1).cpl.sqhd;
    assert!(prev < 32);
    let mut wraps = 0;
    for i in 0..70u64 {
        let c = fx.read(&mut io, 1, i, 1);
        assert_eq!(c.cpl.status, NvmeStatus::SUCCESS);
        let want = if prev == 31 { 0 } else { prev + 1 };
        assert_eq!(c.cpl.sqhd, want, "command {i}: SQ head after {prev}");
        wraps += usize::from(c.cpl.sqhd == 0);
        prev = c.cpl.sqhd;
    }
    assert_eq!(wraps, 2);
}

/// A malloc bdev that logs the type of every I/O it is handed.
struct Logged {
    inner: pollux_bdev::MallocBackend,
    log: std::sync::Arc<pollux_reactor::sync::Mutex<Vec<pollux_bdev::IoType>>>,
}

struct LoggedChannel {
    inner: Box<dyn pollux_bdev::BackendChannel>,
    log: std::sync::Arc<pollux_reactor::sync::Mutex<Vec<pollux_bdev::IoType>>>,
}

impl pollux_bdev::BdevBackend for Logged {
    fn info(&self) -> &pollux_bdev::BdevInfo {
        self.inner.info()
    }
    fn supports(&self, t: pollux_bdev::IoType) -> bool {
        self.inner.supports(t)
    }
    fn create_channel(
        &self,
        reactor: &pollux_reactor::Reactor,
    ) -> Result<Box<dyn pollux_bdev::BackendChannel>, pollux_bdev::BdevError> {
        Ok(Box::new(LoggedChannel {
            inner: self.inner.create_channel(reactor)?,
            log: self.log.clone(),
        }))
    }
}

impl pollux_bdev::BackendChannel for LoggedChannel {
    fn submit(
        &mut self,
        tag: pollux_bdev::IoTag,
        io: &mut pollux_bdev::BdevIo,
    ) -> pollux_bdev::Submitted {
        self.log.lock().unwrap().push(io.io_type());
        self.inner.submit(tag, io)
    }
    fn poll(&mut self, done: &mut pollux_bdev::Completions<'_>) -> pollux_reactor::PollStatus {
        self.inner.poll(done)
    }
}

#[test]
fn a_fua_write_reaches_the_media_before_it_completes() {
    use pollux_bdev::IoType;
    use pollux_nvmf::target::NamespaceConfig;
    let fx = Fx::new();
    let log = std::sync::Arc::new(pollux_reactor::sync::Mutex::new(Vec::new()));
    let info = pollux_bdev::BdevInfo::new("logged", "Malloc disk", 512, 256).unwrap();
    let inner = pollux_bdev::MallocBackend::new(info, None).unwrap();
    let bdev = pollux_bdev::Bdev::new(std::sync::Arc::new(Logged {
        inner,
        log: log.clone(),
    }));
    fx.sub1
        .add_namespace(NamespaceConfig::new(bdev).with_nsid(2))
        .unwrap();
    let mut admin = fx.admin();
    let mut io = fx.io_on(&mut admin, 0);
    let take = || std::mem::take(&mut *log.lock().unwrap());
    let fua = |mut c: NvmeCmd| {
        c.cdw12 |= 1 << 30;
        c
    };
    let data = pattern(4 * BLOCK as usize, 9);

    // Without FUA: the write alone (the volatile cache may keep it).
    assert_eq!(fx.write(&mut io, 2, 0, &data), NvmeStatus::SUCCESS);
    assert_eq!(take(), vec![IoType::Write]);
    // With FUA: the write, then a flush, before the completion.
    let c = fx.exec(
        &mut io,
        fua(rw(IoOpcode::Write, 2, 8, 4)),
        HostData::Write(&data),
    );
    assert_eq!(c.cpl.status, NvmeStatus::SUCCESS);
    assert_eq!(take(), vec![IoType::Write, IoType::Flush]);
    assert_eq!(fx.read(&mut io, 2, 8, 4).data.unwrap(), data);
    take();
    // Write Zeroes with FUA too; a FUA read needs no flush.
    let c = fx.exec(
        &mut io,
        fua(rw(IoOpcode::WriteZeroes, 2, 8, 4)),
        HostData::None,
    );
    assert_eq!(c.cpl.status, NvmeStatus::SUCCESS);
    assert_eq!(take(), vec![IoType::WriteZeroes, IoType::Flush]);
    let c = fx.exec(
        &mut io,
        fua(rw(IoOpcode::Read, 2, 8, 4)),
        HostData::Read(4 * BLOCK),
    );
    assert_eq!(c.cpl.status, NvmeStatus::SUCCESS);
    assert_eq!(take(), vec![IoType::Read]);
    // A failed FUA write is not flushed and fails as before.
    let c = fx.exec(
        &mut io,
        fua(rw(IoOpcode::Write, 2, 256, 1)),
        HostData::Write(&data[..512]),
    );
    assert_eq!(c.cpl.status, NvmeStatus::LBA_OUT_OF_RANGE);
    assert!(take().is_empty());
    // The SMART log counts each FUA write once.
    let cmd = pollux_nvmf::spec::log_page::GetLogPageCmd::to_cmd(
        pollux_nvmf::spec::log_page::lid::SMART,
        0xFFFF_FFFF,
        512,
        0,
        false,
        0,
    )
    .unwrap();
    let s = pollux_nvmf::spec::log_page::SmartLog::parse(
        &fx.exec(&mut admin, cmd, HostData::Read(512)).data.unwrap(),
    )
    .unwrap();
    assert_eq!((s.host_writes, s.host_reads), (3, 2));

    // On a PI namespace: a PRACT write with FUA (the target generates the
    // tuples, then flushes), read back with every check.
    let pi = fx
        .registry
        .create("malloc:size=64K,block=512,md=8,pi=1,md_interleave=true,name=p1")
        .unwrap();
    fx.sub1
        .add_namespace(NamespaceConfig::new(pi).with_nsid(3))
        .unwrap();
    let prinfo = |mut c: NvmeCmd, p: u32| {
        c.cdw12 |= p << 26;
        c.cdw14 = 8; // ILBRT = SLBA
        c
    };
    let c = fx.exec(
        &mut io,
        fua(prinfo(rw(IoOpcode::Write, 3, 8, 4), 0x8)),
        HostData::Write(&data),
    );
    assert_eq!(c.cpl.status, NvmeStatus::SUCCESS);
    let c = fx.exec(
        &mut io,
        prinfo(rw(IoOpcode::Read, 3, 8, 4), 0x8 | 0x4 | 0x1),
        HostData::Read(4 * BLOCK),
    );
    assert_eq!(c.cpl.status, NvmeStatus::SUCCESS);
    assert_eq!(c.data.unwrap(), data);
}
