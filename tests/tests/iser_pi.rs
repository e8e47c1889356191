//! T10 PI between our iSER initiator and our iSER target over the soft
//! verbs provider: insert/strip and DIX (PI in host memory), with the
//! provider's signature offload and in software, Types 1, 2 (READ(32)/
//! WRITE(32)) and 3; corruption
//! of data, guard, application and reference tags in memory and on the
//! wire found with the right status and LBA by the initiator and by the
//! target (and its bdev layer), nothing leaked afterwards.
#![allow(clippy::unwrap_used)]

mod common;

use std::rc::Rc;

use common::iser_loop::{fixture, logout, pattern, pi_blocks, Fx};
use pollux_bdev::{CompletedIo, IoCompletion, IoStatus};
use pollux_iser::initiator::scsi::rw16_cdb;
use pollux_iser::initiator::{
    DataDir, InitiatorOptions, IserInitiator, PiEngine, PiPolicy, SubmitError, TaskResult,
};
use pollux_pi::{BuffersMut, PiParams, PiType};
use pollux_reactor::mem::{DmaBuf, SgList};
use pollux_verbs::soft::Soft;
use pollux_verbs::SigErrKind;

fn pi_round_trip(offload_off: bool) {
    let fx = fixture();
    let mut o = fx.opts();
    o.pi = PiPolicy::Both;
    if offload_off {
        o.pi_engine = PiEngine::Software;
    }
    let mut ini = fx.connect(o);
    assert_eq!(ini.pi_offload(), !offload_off, "PI engine in use");
    fx.discover_luns(&mut ini);
    for (i, len) in [512usize, 4096, 65536].into_iter().enumerate() {
        let data = pattern(70 + i as u8, len);
        let w = fx.write(&mut ini, 1, 8 * i as u64, &data);
        assert!(
            w.is_good(),
            "PI write {len}: {:?} {:?}",
            w.sense,
            w.pi_error
        );
        let r = fx.read(&mut ini, 1, 8 * i as u64, len);
        assert!(r.is_good(), "PI read {len}: {:?} {:?}", r.sense, r.pi_error);
        assert_eq!(r.bufs.unwrap().pop().unwrap().as_slice(), &data[..]);
    }
    // Corrupt the medium: a raw WRITE(16) with WRPROTECT 011b (no checks)
    // of 4 blocks with a bad guard in block 2 and a bad ref tag in block 3.
    let lba = 200u64;
    let mut wire = Vec::new();
    for b in 0..4u64 {
        let blk = pattern(b as u8, 512);
        let crc = pollux_pi::crc16_t10dif(0, &blk);
        wire.extend_from_slice(&blk);
        let guard = if b == 2 { crc ^ 0x5A5A } else { crc };
        let rtag = if b == 3 { 0xDEAD } else { (lba + b) as u32 };
        wire.extend_from_slice(&guard.to_be_bytes());
        wire.extend_from_slice(&0u16.to_be_bytes());
        wire.extend_from_slice(&rtag.to_be_bytes());
    }
    let mut b = DmaBuf::alloc(wire.len()).unwrap();
    b.as_mut_slice().copy_from_slice(&wire);
    ini.submit(
        1,
        &rw16_cdb(true, lba, 4, 3),
        DataDir::Write,
        Some(SgList::from_buf(b)),
        wire.len(),
        5,
    )
    .unwrap();
    assert!(fx.wait(&mut ini, 1).pop().unwrap().is_good());
    // The target checks (RDPROTECT 001b): ABORTED COMMAND 10/01, LBA 202.
    let r = fx.read(&mut ini, 1, lba, 2048);
    assert_eq!(r.sense_code(), Some((0xB, 0x10, 0x01)), "{:?}", r.sense);
    assert_eq!(r.sense.unwrap().info, Some(lba + 2));
    let r = fx.read(&mut ini, 1, lba + 3, 512);
    assert_eq!(r.sense_code(), Some((0xB, 0x10, 0x03)), "{:?}", r.sense);
    logout(&fx, ini);

    // Only the initiator checks (RDPROTECT 011b): a signature error (or
    // the software check) with the LBA, reported as ILLEGAL REQUEST 10/0x.
    let mut o = fx.opts();
    o.pi = PiPolicy::ReadVerify;
    o.target_checks = false;
    if offload_off {
        o.pi_engine = PiEngine::Software;
    }
    let mut ini = fx.connect(o);
    assert_eq!(ini.pi_offload(), !offload_off, "PI engine in use");
    fx.discover_luns(&mut ini);
    let r = fx.read(&mut ini, 1, lba, 2048);
    let e = r.pi_error.expect("initiator-detected PI error");
    assert_eq!((e.kind, e.lba), (SigErrKind::BadGuard, lba + 2));
    assert_eq!(r.sense_code(), Some((0x5, 0x10, 0x01)));
    let r = fx.read(&mut ini, 1, lba + 3, 512);
    let e = r.pi_error.expect("ref tag error");
    assert_eq!((e.kind, e.lba), (SigErrKind::BadRefTag, lba + 3));
    assert_eq!(r.sense_code(), Some((0x5, 0x10, 0x03)));
    assert!(ini.stats().pi_errors >= 2);
    logout(&fx, ini);
}

#[test]
fn pi_with_signature_offload() {
    pi_round_trip(false);
}

#[test]
fn pi_in_software() {
    pi_round_trip(true);
}

#[test]
fn corrupted_stored_pi_is_caught_by_the_bdev_layer_with_the_right_sense() {
    let fx = fixture();
    let mut o = fx.opts();
    o.pi = PiPolicy::Both; // RDPROTECT/WRPROTECT 001b: the target checks
    let mut ini = fx.connect(o);
    fx.discover_luns(&mut ini);
    let lba = 300u64;
    let data = pattern(3, 4 * 512);
    assert!(fx.write(&mut ini, 1, lba, &data).is_good());
    // Corrupt the stored metadata behind the target, straight through the
    // bdev (an I/O without a PI action passes metadata untouched): block 1
    // gets a bad guard, block 3 a bad reference tag; the data stay intact.
    let mut raw = pi_blocks(lba, 4, 0);
    for b in 0..4 {
        raw[b * 520..b * 520 + 512].copy_from_slice(&data[b * 512..(b + 1) * 512]);
        let g = pollux_pi::crc16_t10dif(0, &data[b * 512..(b + 1) * 512]);
        raw[b * 520 + 512..b * 520 + 514].copy_from_slice(&g.to_be_bytes());
    }
    raw[520 + 512] ^= 0x80; // guard of LBA 301
    raw[3 * 520 + 519] ^= 0x01; // ref tag of LBA 303
    let done: Rc<std::cell::RefCell<Option<IoStatus>>> = Rc::default();
    let d2 = done.clone();
    let keep = fx.cl.on(0, |r| {
        let ch = fx.pi_bdev.open(true).unwrap().channel(r).unwrap();
        let mut b = DmaBuf::alloc(raw.len()).unwrap();
        b.as_mut_slice().copy_from_slice(&raw);
        let cb: Rc<dyn IoCompletion> =
            Rc::new(move |io: CompletedIo| *d2.borrow_mut() = Some(io.status()));
        ch.write(lba, 4, SgList::from_buf(b), &cb, 0).unwrap();
        ch
    });
    assert!(fx.spin(|| done.borrow().is_some().then_some(())).is_some());
    assert_eq!(*done.borrow(), Some(Ok(())));
    drop(keep);
    // READ with RDPROTECT 001b: the bdev's read-verify fails the I/O and
    // the target answers ABORTED COMMAND 10/01 with the first bad LBA.
    let r = fx.read(&mut ini, 1, lba, 4 * 512);
    assert_eq!(r.sense_code(), Some((0xB, 0x10, 0x01)), "{:?}", r.sense);
    assert_eq!(r.sense.unwrap().info, Some(lba + 1));
    assert!(
        r.pi_error.is_none(),
        "found by the target, not the initiator"
    );
    let r = fx.read(&mut ini, 1, lba + 2, 2 * 512);
    assert_eq!(r.sense_code(), Some((0xB, 0x10, 0x03)), "{:?}", r.sense);
    assert_eq!(r.sense.unwrap().info, Some(lba + 3));
    // The intact blocks still read back.
    let r = fx.read(&mut ini, 1, lba + 2, 512);
    assert!(r.is_good(), "{:?}", r.sense);
    assert_eq!(
        r.bufs.unwrap().pop().unwrap().as_slice(),
        &data[2 * 512..3 * 512]
    );
    // WRITE with WRPROTECT 001b and a bad guard from the wire: the bdev's
    // write-verify refuses it before the medium (10/01 at that LBA) and
    // the old data stay.
    let mut wire = pi_blocks(lba + 2, 1, 9);
    wire[512] ^= 0x01;
    let mut b = DmaBuf::alloc(wire.len()).unwrap();
    b.as_mut_slice().copy_from_slice(&wire);
    ini.submit(
        1,
        &rw16_cdb(true, lba + 2, 1, 1),
        DataDir::Write,
        Some(SgList::from_buf(b)),
        wire.len(),
        5,
    )
    .unwrap();
    let w = fx.wait(&mut ini, 1).pop().unwrap();
    assert_eq!(w.sense_code(), Some((0xB, 0x10, 0x01)), "{:?}", w.sense);
    assert_eq!(w.sense.unwrap().info, Some(lba + 2));
    let r = fx.read(&mut ini, 1, lba + 2, 512);
    assert!(r.is_good());
    assert_eq!(
        r.bufs.unwrap().pop().unwrap().as_slice(),
        &data[2 * 512..3 * 512]
    );
    logout(&fx, ini);
}

/// Data followed by its DIX tuples (Type `ty` of `lun`'s format, app tag
/// `app`), the data in `data_parts` buffers and the tuples in one more.
fn dix_bufs(data: &[u8], lba: u64, ty: u8, app: u16, data_parts: usize) -> (SgList, Vec<u8>) {
    let pty = match ty {
        3 => PiType::Type3,
        2 => PiType::Type2,
        _ => PiType::Type1,
    };
    let seed = if ty == 3 { 0 } else { lba as u32 };
    let p = PiParams::for_type(pty, 512, seed, app);
    let mut pi = vec![0u8; data.len() / 512 * 8];
    pollux_pi::generate(BuffersMut::Dix { data, pi: &mut pi }, &p).unwrap();
    let mut sg = SgList::new();
    let step = (data.len() / 512).div_ceil(data_parts) * 512;
    for part in data.chunks(step).chain([&pi[..]]) {
        let mut b = DmaBuf::alloc(part.len()).unwrap();
        b.as_mut_slice().copy_from_slice(part);
        sg.push(b);
    }
    (sg, pi)
}

/// A zeroed DIX read buffer for `len` data bytes.
fn dix_zeroed(len: usize) -> SgList {
    let (sg, _) = dix_bufs(&vec![0u8; len], 0, 1, 0, 2);
    let mut out = SgList::new();
    for mut b in sg {
        b.as_mut_slice().fill(0);
        out.push(b);
    }
    out
}

/// The data and the tuples of a DIX result.
fn dix_split(r: TaskResult, len: usize) -> (Vec<u8>, Vec<u8>) {
    let mut all = Vec::new();
    for b in r.bufs.unwrap() {
        all.extend_from_slice(b.as_slice());
    }
    let pi = all.split_off(len);
    (all, pi)
}

fn dix_write(fx: &Fx, ini: &mut IserInitiator<Soft>, lun: u16, lba: u64, sg: SgList) -> TaskResult {
    let blocks = (sg.total_len() / 520) as u32;
    ini.write(lun, lba, blocks, sg, 3).unwrap();
    fx.wait(ini, 1).pop().unwrap()
}

fn dix_read(fx: &Fx, ini: &mut IserInitiator<Soft>, lun: u16, lba: u64, len: usize) -> TaskResult {
    ini.read(lun, lba, (len / 512) as u32, dix_zeroed(len), 4)
        .unwrap();
    fx.wait(ini, 1).pop().unwrap()
}

fn dix_opts(fx: &Fx, software: bool) -> InitiatorOptions {
    let mut o = fx.opts();
    o.pi = PiPolicy::Dix;
    if software {
        o.pi_engine = PiEngine::Software;
    }
    o
}

/// Every task buffer of the target back in its pool.
fn pool_back(fx: &Fx, total: usize) {
    assert!(
        fx.spin(|| (fx.target.pool().available() == total).then_some(()))
            .is_some(),
        "task buffers {}/{total}",
        fx.target.pool().available()
    );
}

fn dix_round_trip(software: bool) {
    let fx = fixture();
    let pool_total = fx.target.pool().count();
    let mut ini = fx.connect(dix_opts(&fx, software));
    assert_eq!(ini.pi_offload(), !software);
    fx.discover_luns(&mut ini);
    for (lun, ty) in [(1u16, 1u8), (2, 3), (3, 2)] {
        for (i, len) in [512usize, 4096, 65536].into_iter().enumerate() {
            let lba = 1000 + 200 * i as u64;
            let data = pattern(90 + i as u8, len);
            let (sg, pi) = dix_bufs(&data, lba, ty, 0x00A5, 1 + i);
            let w = dix_write(&fx, &mut ini, lun, lba, sg);
            assert!(
                w.is_good(),
                "LUN {lun} {len}: {:?} {:?}",
                w.sense,
                w.pi_error
            );
            let r = dix_read(&fx, &mut ini, lun, lba, len);
            assert!(
                r.is_good(),
                "LUN {lun} {len}: {:?} {:?}",
                r.sense,
                r.pi_error
            );
            let (d, t) = dix_split(r, len);
            assert!(d == data, "LUN {lun} {len}: data");
            assert_eq!(t, pi, "LUN {lun} {len}: the stored tuples came back");
        }
    }
    // Blocks written without PI in host memory (insert) read back with the
    // tuples the target generated: app tag 0, ref tag = LBA.
    let lba = 2000;
    let mut o = fx.opts();
    o.pi = PiPolicy::Off;
    o.isid[5] = 2; // another session (the same ISID would reinstate `ini`'s)
    let mut plain = fx.connect(o);
    fx.discover_luns(&mut plain);
    let data = pattern(5, 2048);
    assert!(fx.write(&mut plain, 1, lba, &data).is_good());
    fx.logout(plain); // only this session (`logout` waits for every one)
    let r = dix_read(&fx, &mut ini, 1, lba, 2048);
    assert!(r.is_good(), "{r:?}");
    let (d, t) = dix_split(r, 2048);
    assert!(d == data, "data {:?}", &d[..16]);
    assert_eq!(t, dix_bufs(&data, lba, 1, 0, 1).1);
    assert_eq!(ini.stats().pi_errors, 0);
    logout(&fx, ini);
    pool_back(&fx, pool_total);
}

#[test]
fn dix_with_signature_offload() {
    dix_round_trip(false);
}

#[test]
fn dix_in_software() {
    dix_round_trip(true);
}

/// Tuples of the caller's memory that lie: each is caught on the way out
/// (by the initiator, with the LBA) and by the target, which refuses the
/// write before the medium; the old data stay.
fn dix_bad_memory(software: bool) {
    let fx = fixture();
    let pool_total = fx.target.pool().count();
    let mut o = dix_opts(&fx, software);
    o.app_tag = 0x0042;
    o.app_tag_mask = 0xFFFF;
    let mut ini = fx.connect(o);
    assert_eq!(ini.pi_offload(), !software, "PI engine in use");
    fx.discover_luns(&mut ini);
    let lba = 400u64;
    let good = pattern(1, 4 * 512);
    let (sg, _) = dix_bufs(&good, lba, 1, 0x0042, 1);
    assert!(dix_write(&fx, &mut ini, 1, lba, sg).is_good());
    let new = pattern(2, 4 * 512);
    // (byte to flip in the data ‖ tuples image, failing field, block,
    // whether the target, which does not check app tags under WRPROTECT
    // 001b, refuses it too)
    let cases = [
        (512 + 3, SigErrKind::BadGuard, 1, true),  // data of block 1
        (2048 + 8, SigErrKind::BadGuard, 1, true), // guard of block 1
        (2048 + 24 + 7, SigErrKind::BadRefTag, 3, true), // ref tag of block 3
        (2048 + 16 + 3, SigErrKind::BadAppTag, 2, false), // app tag of block 2 (last:
                                                   // it reaches the medium)
    ];
    for (byte, kind, block, target_refuses) in cases {
        let (sg, _) = dix_bufs(&new, lba, 1, 0x0042, 1);
        let mut image: Vec<u8> = sg.iter().flat_map(|b| b.as_slice().to_vec()).collect();
        image[byte] ^= 0x10;
        let mut b = DmaBuf::alloc(image.len()).unwrap();
        b.as_mut_slice().copy_from_slice(&image);
        let w = dix_write(&fx, &mut ini, 1, lba, SgList::from_buf(b));
        let e = w.pi_error.expect("initiator-detected error");
        assert_eq!((e.kind, e.lba), (kind, lba + block), "byte {byte}");
        let s = w.sense.unwrap();
        assert_eq!(s.info, Some(lba + block), "byte {byte}: {s:?}");
        let ascq = match kind {
            SigErrKind::BadGuard => 1,
            SigErrKind::BadAppTag => 2,
            SigErrKind::BadRefTag => 3,
        };
        // ABORTED COMMAND from the target, else the initiator's ILLEGAL
        // REQUEST.
        let key = if target_refuses { 0xB } else { 0x5 };
        assert_eq!(w.sense_code(), Some((key, 0x10, ascq)), "byte {byte}");
        if target_refuses {
            let r = dix_read(&fx, &mut ini, 1, lba, 2048);
            assert!(r.is_good(), "{:?} {:?}", r.sense, r.pi_error);
            assert!(dix_split(r, 2048).0 == good, "byte {byte}: old data kept");
        }
    }
    assert_eq!(ini.stats().pi_errors, 4);
    logout(&fx, ini);
    pool_back(&fx, pool_total);
}

#[test]
fn dix_bad_tuples_in_memory_with_signature_offload() {
    dix_bad_memory(false);
}

#[test]
fn dix_bad_tuples_in_memory_in_software() {
    dix_bad_memory(true);
}

/// Tuples stored wrong (written raw with WRPROTECT 011b) and read with
/// RDPROTECT 011b, so only the initiator checks: each bad field is found
/// with its LBA and the tuples as stored reach the caller's PI buffer.
/// On the Type 3 LU the reference tag is never checked.
fn dix_bad_wire(software: bool) {
    let fx = fixture();
    let pool_total = fx.target.pool().count();
    let mut o = dix_opts(&fx, software);
    o.app_tag_mask = 0xFFFF;
    o.target_checks = false;
    let mut ini = fx.connect(o);
    assert_eq!(ini.pi_offload(), !software, "PI engine in use");
    fx.discover_luns(&mut ini);
    let lba = 600u64;
    let mut wire = pi_blocks(lba, 4, 7);
    wire[520 + 512 + 2] ^= 0x01; // app tag of block 1
    wire[2 * 520 + 100] ^= 0x01; // data of block 2 (guard no longer matches)
    wire[3 * 520 + 519] ^= 0x01; // ref tag of block 3
    for lun in [1u16, 2] {
        let mut w = wire.clone();
        if lun == 2 {
            // Type 3: ref tags are opaque; store 0 as a generator would,
            // except block 3's odd one.
            for b in 0..4 {
                w[b * 520 + 516..b * 520 + 520].copy_from_slice(&[0, 0, 0, u8::from(b == 3)]);
            }
        }
        let mut b = DmaBuf::alloc(w.len()).unwrap();
        b.as_mut_slice().copy_from_slice(&w);
        ini.submit(
            lun,
            &rw16_cdb(true, lba, 4, 3),
            DataDir::Write,
            Some(SgList::from_buf(b)),
            w.len(),
            5,
        )
        .unwrap();
        assert!(fx.wait(&mut ini, 1).pop().unwrap().is_good());
        let expect = [
            (0u64, None),
            (1, Some(SigErrKind::BadAppTag)),
            (2, Some(SigErrKind::BadGuard)),
            (3, (lun == 1).then_some(SigErrKind::BadRefTag)),
        ];
        for (blk, kind) in expect {
            let r = dix_read(&fx, &mut ini, lun, lba + blk, 512);
            assert_eq!(
                r.pi_error.map(|e| (e.kind, e.lba)),
                kind.map(|k| (k, lba + blk)),
                "LUN {lun} block {blk}"
            );
            if kind.is_some() {
                assert_eq!(r.sense_code().map(|c| (c.0, c.1)), Some((0x5, 0x10)));
            }
            let (d, t) = dix_split(r, 512);
            let at = blk as usize * 520;
            assert!(d == w[at..at + 512], "LUN {lun} block {blk}: data");
            assert_eq!(
                t,
                &w[at + 512..at + 520],
                "LUN {lun} block {blk}: tuple as stored"
            );
        }
        // All four at once: the first bad block is reported.
        let r = dix_read(&fx, &mut ini, lun, lba, 2048);
        let e = r.pi_error.unwrap();
        assert_eq!((e.kind, e.lba), (SigErrKind::BadAppTag, lba + 1));
    }
    logout(&fx, ini);
    pool_back(&fx, pool_total);
}

#[test]
fn dix_bad_tuples_on_the_wire_with_signature_offload() {
    dix_bad_wire(false);
}

#[test]
fn dix_bad_tuples_on_the_wire_in_software() {
    dix_bad_wire(true);
}

#[test]
fn dix_buffers_without_room_for_the_tuples_are_refused_and_returned() {
    let fx = fixture();
    let mut ini = fx.connect(dix_opts(&fx, false));
    fx.discover_luns(&mut ini);
    let e = ini
        .read(1, 0, 8, SgList::from_buf(DmaBuf::alloc(4096).unwrap()), 1)
        .unwrap_err();
    assert!(matches!(e, SubmitError::Invalid(..)), "{e}");
    assert_eq!(e.into_bufs().unwrap().total_len(), 4096);
    logout(&fx, ini);
}

/// PI Type 2 over iSCSI: the initiator sends READ(32)/WRITE(32) (bytes
/// 16.. in an extended CDB AHS) whose EXPECTED INITIAL LOGICAL BLOCK
/// REFERENCE TAG seeds the tags, the target checks against it; the 16-byte
/// forms cannot carry Type 2 PI and READ(32) is for Type 2 LUs only (both
/// INVALID COMMAND OPERATION CODE); the application tag is checked under
/// the command's mask.
#[test]
fn pi_type2_through_32_byte_cdbs() {
    use pollux_iser::scsi::cdb::{rw32_cdb, PiTags};
    let fx = fixture();
    let mut o = fx.opts();
    o.pi = PiPolicy::Both;
    let mut ini = fx.connect(o);
    fx.discover_luns(&mut ini);
    assert_eq!(ini.geometry(3).unwrap().pi_type, 2);
    // Insert and strip through READ(32)/WRITE(32).
    let data = pattern(21, 8 * 512);
    let w = fx.write(&mut ini, 3, 40, &data);
    assert!(w.is_good(), "{:?} {:?}", w.sense, w.pi_error);
    let r = fx.read(&mut ini, 3, 40, data.len());
    assert!(r.is_good(), "{:?} {:?}", r.sense, r.pi_error);
    assert_eq!(r.bufs.unwrap().pop().unwrap().as_slice(), &data[..]);
    let raw =
        |ini: &mut IserInitiator<Soft>, lun: u16, cdb: &[u8], write: Option<&[u8]>, len: usize| {
            let mut b = DmaBuf::alloc(len.max(1)).unwrap();
            let dir = match write {
                Some(d) => {
                    b.as_mut_slice()[..d.len()].copy_from_slice(d);
                    DataDir::Write
                }
                None => DataDir::Read,
            };
            ini.submit(lun, cdb, dir, Some(SgList::from_buf(b)), len, 6)
                .unwrap();
            fx.wait(ini, 1).pop().unwrap()
        };
    // Blocks whose reference tags start at 0x1000 (WRPROTECT 011b: the
    // target takes them unchecked).
    let p = PiParams::for_type(PiType::Type2, 512, 0x1000, 0x00AB);
    let mut wire = Vec::new();
    for i in 0..4u64 {
        let d = pattern(i as u8, 512);
        wire.extend_from_slice(&d);
        wire.extend_from_slice(&p.tuple_for(i, &d).encode());
    }
    let t = |ref_tag, app_mask| PiTags {
        ref_tag,
        app_tag: 0x00AB,
        app_mask,
    };
    let w = raw(
        &mut ini,
        3,
        &rw32_cdb(true, 100, 4, 3, t(0x1000, 0)),
        Some(&wire),
        wire.len(),
    );
    assert!(w.is_good(), "{:?}", w.sense);
    // Read back checked against the same seed: good, tuples as written.
    let r = raw(
        &mut ini,
        3,
        &rw32_cdb(false, 100, 4, 1, t(0x1000, 0xFFFF)),
        None,
        wire.len(),
    );
    assert!(r.is_good(), "{:?}", r.sense);
    assert_eq!(r.bufs.unwrap().pop().unwrap().as_slice(), &wire[..]);
    // The initiator seeds with the LBA: the target finds the ref tag wrong.
    let r = fx.read(&mut ini, 3, 100, 4 * 512);
    assert_eq!(r.sense_code(), Some((0xB, 0x10, 0x03)), "{:?}", r.sense);
    assert_eq!(r.sense.unwrap().info, Some(100));
    // A wrong expected application tag under the mask: 10/02.
    let bad_app = PiTags {
        app_tag: 0x00AC,
        ..t(0x1000, 0xFFFF)
    };
    let r = raw(
        &mut ini,
        3,
        &rw32_cdb(false, 100, 4, 1, bad_app),
        None,
        wire.len(),
    );
    assert_eq!(r.sense_code(), Some((0xB, 0x10, 0x02)), "{:?}", r.sense);
    // READ(16) with RDPROTECT on a Type 2 LU, READ(32) on a Type 1 LU:
    // INVALID COMMAND OPERATION CODE.
    let r = raw(&mut ini, 3, &rw16_cdb(false, 100, 1, 1), None, 520);
    assert_eq!(r.sense_code(), Some((0x5, 0x20, 0x00)), "{:?}", r.sense);
    let r = raw(&mut ini, 1, &rw32_cdb(false, 0, 1, 1, t(0, 0)), None, 520);
    assert_eq!(r.sense_code(), Some((0x5, 0x20, 0x00)), "{:?}", r.sense);
    logout(&fx, ini);
}
