//! Persistent reservations and RESERVE(6)/RELEASE(6), service action by
//! service action, with the access each nexus gets.

use super::*;

fn nexus(i: u8) -> ItNexus {
    ItNexus {
        initiator: format!("iqn.2024-01.io.pollux:host{i}"),
        isid: [0x80, 0, 0, 0, 0, i],
        tpgt: 1,
    }
}

fn param(key: u64, sa_key: u64) -> [u8; 24] {
    let mut p = [0u8; 24];
    p[..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sa_key.to_be_bytes());
    p
}

fn keys(r: &Reservations) -> (u32, Vec<u64>) {
    let mut b = [0u8; 512];
    let n = r.read(in_sa::READ_KEYS, &mut b).unwrap();
    let gen = u32::from_be_bytes(b[..4].try_into().unwrap());
    let len = u32::from_be_bytes(b[4..8].try_into().unwrap()) as usize;
    assert_eq!(n, 8 + len);
    (
        gen,
        b[8..8 + len]
            .chunks(8)
            .map(|c| u64::from_be_bytes(c.try_into().unwrap()))
            .collect(),
    )
}

fn reservation(r: &Reservations) -> Option<(u64, u8)> {
    let mut b = [0u8; 512];
    let n = r.read(in_sa::READ_RESERVATION, &mut b).unwrap();
    (n == 24).then(|| (u64::from_be_bytes(b[8..16].try_into().unwrap()), b[21]))
}

const CONFLICT: Result<(), Sense> = Err(Sense::RESERVATION_CONFLICT);

#[test]
fn register_reserve_release_and_access() {
    let (a, b) = (nexus(1), nexus(2));
    let mut r = Reservations::default();
    // REGISTER with a wrong current key, then properly.
    assert_eq!(r.out(&a, out_sa::REGISTER, 0, &param(5, 0xA)), CONFLICT);
    assert_eq!(r.out(&a, out_sa::REGISTER, 0, &param(0, 0xA)), Ok(()));
    assert_eq!(keys(&r), (1, vec![0xA]));
    // An unregistered nexus cannot reserve.
    assert_eq!(r.out(&b, out_sa::RESERVE, 1, &param(0xB, 0)), CONFLICT);
    // Write Exclusive: B reads, its writes conflict.
    assert_eq!(r.out(&a, out_sa::RESERVE, 1, &param(0xA, 0)), Ok(()));
    assert_eq!(reservation(&r), Some((0xA, 1)));
    assert_eq!(r.access(&a), Access::All);
    assert_eq!(r.access(&b), Access::ReadOnly);
    assert!(!conflicts(r.access(&b), Class::Read));
    assert!(conflicts(r.access(&b), Class::Write));
    assert!(!conflicts(r.access(&b), Class::Status));
    // The same reservation again is fine, another type conflicts.
    assert_eq!(r.out(&a, out_sa::RESERVE, 1, &param(0xA, 0)), Ok(()));
    assert_eq!(r.out(&a, out_sa::RESERVE, 3, &param(0xA, 0)), CONFLICT);
    // Unsupported scope / type.
    assert_eq!(
        r.out(&a, out_sa::RESERVE, 0x11, &param(0xA, 0))
            .map_err(|s| s.code()),
        Err((5, 0x24, 0))
    );
    assert_eq!(
        r.out(&a, out_sa::RESERVE, 7, &param(0xA, 0))
            .map_err(|s| s.code()),
        Err((5, 0x24, 0))
    );
    // RELEASE of another type: 26/04; a non-holder's release does nothing.
    assert_eq!(
        r.out(&a, out_sa::RELEASE, 3, &param(0xA, 0))
            .map_err(|s| s.code()),
        Err((5, 0x26, 4))
    );
    assert_eq!(r.out(&b, out_sa::REGISTER, 0, &param(0, 0xB)), Ok(()));
    assert_eq!(r.out(&b, out_sa::RELEASE, 1, &param(0xB, 0)), Ok(()));
    assert_eq!(reservation(&r), Some((0xA, 1)));
    assert_eq!(r.out(&a, out_sa::RELEASE, 1, &param(0xA, 0)), Ok(()));
    assert_eq!(reservation(&r), None);
    assert_eq!(r.access(&b), Access::All);
    // Bad parameter lists.
    assert_eq!(
        r.out(&a, out_sa::REGISTER, 0, &[0; 20])
            .map_err(|s| s.code()),
        Err((5, 0x1A, 0))
    );
    let mut aptpl = param(0xA, 0xA);
    aptpl[20] = 1;
    assert_eq!(
        r.out(&a, out_sa::REGISTER, 0, &aptpl).map_err(|s| s.code()),
        Err((5, 0x26, 0))
    );
}

#[test]
fn exclusive_access_and_registrants_only() {
    let (a, b, c) = (nexus(1), nexus(2), nexus(3));
    let mut r = Reservations::default();
    r.out(&a, out_sa::REGISTER, 0, &param(0, 0xA)).unwrap();
    r.out(&b, out_sa::REGISTER_AND_IGNORE, 0, &param(77, 0xB))
        .unwrap();
    r.out(&a, out_sa::RESERVE, 3, &param(0xA, 0)).unwrap();
    assert_eq!(r.access(&b), Access::NoMedia);
    assert!(conflicts(Access::NoMedia, Class::Read));
    assert!(!conflicts(Access::NoMedia, Class::Exempt));
    r.out(&a, out_sa::RELEASE, 3, &param(0xA, 0)).unwrap();
    // Registrants Only: registered B has access, unregistered C not.
    r.out(&a, out_sa::RESERVE, 6, &param(0xA, 0)).unwrap();
    assert_eq!(r.access(&b), Access::All);
    assert_eq!(r.access(&c), Access::NoMedia);
    r.out(&a, out_sa::RELEASE, 6, &param(0xA, 0)).unwrap();
    r.out(&a, out_sa::RESERVE, 5, &param(0xA, 0)).unwrap();
    assert_eq!(r.access(&c), Access::ReadOnly);
    // The holder unregisters: its reservation goes.
    r.out(&a, out_sa::REGISTER, 0, &param(0xA, 0)).unwrap();
    assert_eq!(reservation(&r), None);
    assert_eq!(keys(&r).1, vec![0xB]);
}

#[test]
fn preempt_and_clear() {
    let (a, b, c) = (nexus(1), nexus(2), nexus(3));
    let mut r = Reservations::default();
    r.out(&a, out_sa::REGISTER, 0, &param(0, 0xA)).unwrap();
    r.out(&b, out_sa::REGISTER, 0, &param(0, 0xB)).unwrap();
    r.out(&c, out_sa::REGISTER, 0, &param(0, 0xC)).unwrap();
    r.out(&a, out_sa::RESERVE, 1, &param(0xA, 0)).unwrap();
    // Preempting an unknown key conflicts; key 0 is invalid.
    assert_eq!(r.out(&b, out_sa::PREEMPT, 3, &param(0xB, 0x99)), CONFLICT);
    assert_eq!(
        r.out(&b, out_sa::PREEMPT, 3, &param(0xB, 0))
            .map_err(|s| s.code()),
        Err((5, 0x26, 0))
    );
    // Preempting a non-holder removes its registration only.
    r.out(&b, out_sa::PREEMPT, 3, &param(0xB, 0xC)).unwrap();
    assert_eq!(keys(&r).1, vec![0xA, 0xB]);
    assert_eq!(reservation(&r), Some((0xA, 1)));
    // Preempting the holder: B holds an Exclusive Access reservation.
    let gen = keys(&r).0;
    r.out(&b, out_sa::PREEMPT, 3, &param(0xB, 0xA)).unwrap();
    assert_eq!(keys(&r), (gen + 1, vec![0xB]));
    assert_eq!(reservation(&r), Some((0xB, 3)));
    assert_eq!(r.access(&a), Access::NoMedia);
    // A, no longer registered, cannot clear; B can.
    assert_eq!(r.out(&a, out_sa::CLEAR, 0, &param(0xA, 0)), CONFLICT);
    r.out(&b, out_sa::CLEAR, 0, &param(0xB, 0)).unwrap();
    assert_eq!(keys(&r).1, Vec::<u64>::new());
    assert_eq!(reservation(&r), None);
    assert_eq!(r.access(&a), Access::All);
}

#[test]
fn report_capabilities_and_unknown_actions() {
    let r = Reservations::default();
    let mut b = [0u8; 512];
    assert_eq!(r.read(in_sa::REPORT_CAPABILITIES, &mut b), Ok(8));
    assert_eq!(&b[..8], &[0, 8, 0, 0x80, 0x6A, 0, 0, 0]);
    assert_eq!(
        r.read(3, &mut b).map_err(|s| s.code()),
        Err((5, 0x24, 0)),
        "READ FULL STATUS"
    );
    // Keys beyond the buffer are counted, not written.
    let mut r = Reservations::default();
    for i in 1..=3u8 {
        r.out(&nexus(i), out_sa::REGISTER, 0, &param(0, u64::from(i)))
            .unwrap();
    }
    let mut small = [0u8; 12];
    assert_eq!(r.read(in_sa::READ_KEYS, &mut small), Ok(32));
    assert_eq!(&small[4..8], &24u32.to_be_bytes());
}

#[test]
fn reserve6_release6() {
    let (a, b) = (nexus(1), nexus(2));
    let mut r = Reservations::default();
    r.reserve6(&a, 1).unwrap();
    r.reserve6(&a, 1).unwrap();
    assert_eq!(r.reserve6(&b, 2), CONFLICT);
    assert_eq!(r.access(&b), Access::Reserved6);
    assert!(conflicts(Access::Reserved6, Class::Status));
    assert!(!conflicts(Access::Reserved6, Class::Exempt));
    // Another nexus's RELEASE(6) has no effect.
    r.release6(&b).unwrap();
    assert_eq!(r.access(&b), Access::Reserved6);
    // Another session of the nexus (one that ended before this one
    // reserved) does not end it; its own does.
    r.nexus_lost(&a, 0);
    assert_eq!(r.access(&b), Access::Reserved6);
    r.nexus_lost(&a, 1);
    assert_eq!(r.access(&b), Access::All);
    // A later session of the same nexus that reserves again holds it past
    // the end of the earlier one.
    r.reserve6(&a, 1).unwrap();
    r.reserve6(&a, 3).unwrap();
    r.nexus_lost(&a, 1);
    assert_eq!(r.access(&b), Access::Reserved6);
    r.nexus_lost(&a, 3);
    assert_eq!(r.access(&b), Access::All);
    // With a persistent registration RESERVE(6)/RELEASE(6) conflict.
    r.out(&a, out_sa::REGISTER, 0, &param(0, 1)).unwrap();
    assert_eq!(r.reserve6(&b, 2), CONFLICT);
    assert_eq!(r.release6(&b), CONFLICT);
}

#[test]
fn shared_state_epoch_and_caw_gate() {
    let s = LunShared::default();
    let e0 = s.epoch();
    s.change(|r| r.reserve6(&nexus(1), 1)).unwrap();
    assert_ne!(s.epoch(), e0);
    assert_eq!(s.lock().access(&nexus(2)), Access::Reserved6);
    assert!(s.try_caw());
    assert!(!s.try_caw());
    s.end_caw();
    assert!(s.try_caw());
}

/// A logical unit reset ends the RESERVE(6) reservation, not persistent
/// registrations or reservations.
#[test]
fn lu_reset_releases_reserve6_only() {
    let (a, b) = (nexus(1), nexus(2));
    let mut r = Reservations::default();
    r.reserve6(&a, 1).unwrap();
    assert_eq!(r.access(&b), Access::Reserved6);
    r.lu_reset();
    assert_eq!(r.access(&b), Access::All);
    r.out(&a, out_sa::REGISTER, 0, &param(0, 0xA)).unwrap();
    r.out(&a, out_sa::RESERVE, 3, &param(0xA, 0)).unwrap();
    r.lu_reset();
    assert_eq!(keys(&r), (1, vec![0xA]));
    assert_eq!(reservation(&r), Some((0xA, 3)));
    assert_eq!(r.access(&b), Access::NoMedia);
}

/// SPC-3: PERSISTENT RESERVE IN and OUT while a RESERVE(6) reservation
/// is held get RESERVATION CONFLICT, from its holder too (no mixing of
/// the two kinds).
#[test]
fn persistent_reserve_commands_conflict_under_reserve6_even_for_its_holder() {
    let (a, b) = (nexus(1), nexus(2));
    let mut r = Reservations::default();
    r.reserve6(&a, 1).unwrap();
    let mut buf = [0u8; 64];
    assert_eq!(r.read(in_sa::READ_KEYS, &mut buf), CONFLICT.map(|()| 0));
    assert_eq!(r.out(&a, out_sa::REGISTER, 0, &param(0, 0xA)), CONFLICT);
    assert_eq!(
        r.out(&a, out_sa::REGISTER_AND_IGNORE, 0, &param(0, 0xA)),
        CONFLICT
    );
    assert_eq!(r.out(&b, out_sa::REGISTER, 0, &param(0, 0xB)), CONFLICT);
    assert!(!r.persistent());
    r.release6(&a).unwrap();
    assert_eq!(r.out(&a, out_sa::REGISTER, 0, &param(0, 0xA)), Ok(()));
    assert_eq!(keys(&r).1, vec![0xA]);
}
