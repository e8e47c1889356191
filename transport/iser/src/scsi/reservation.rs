//! Reservations of one logical unit (SPC-4 §5.13): persistent
//! reservations (PERSISTENT RESERVE IN/OUT: register, register and
//! ignore, reserve, release, clear, preempt; read keys, read reservation,
//! report capabilities) and the older RESERVE(6)/RELEASE(6).
//!
//! The state is control-plane state shared by every session of the LU
//! ([`LunShared`], one per target node and LUN): PERSISTENT RESERVE OUT,
//! RESERVE(6) and RELEASE(6) change it under a mutex and then bump an
//! epoch. A media command never takes that mutex: each connection keeps
//! the [`Access`] of its own I_T nexus with the epoch it was computed at
//! and, per command, only loads the epoch (a plain atomic load of a line
//! that is written only when a reservation changes). When the epoch moved,
//! the access is computed again, once, under the mutex.
//!
//! Supported: LU scope only; types Write Exclusive, Exclusive Access and
//! their Registrants Only variants; no SPEC_I_PT, ALL_TG_PT or APTPL
//! (REPORT CAPABILITIES says so); PREEMPT AND ABORT, REGISTER AND MOVE and
//! READ FULL STATUS are refused with INVALID FIELD IN CDB. Registrations
//! are not persistent across a target restart (PTPL_C=0).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use pollux_reactor::sync::{Mutex, MutexGuard};

use super::sense::Sense;

/// An I_T nexus as reservations see it: the initiator port (iSCSI name +
/// ISID) and the target port (portal group tag).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ItNexus {
    /// InitiatorName.
    pub initiator: String,
    /// ISID.
    pub isid: [u8; 6],
    /// Target portal group tag.
    pub tpgt: u16,
}

/// Persistent reservation types supported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrType {
    /// Write Exclusive (1h).
    WriteExclusive,
    /// Exclusive Access (3h).
    ExclusiveAccess,
    /// Write Exclusive – Registrants Only (5h).
    WriteExclusiveRegistrants,
    /// Exclusive Access – Registrants Only (6h).
    ExclusiveAccessRegistrants,
}

impl PrType {
    /// The type of the TYPE field, `None` for an unsupported one.
    pub fn from_code(code: u8) -> Option<PrType> {
        match code {
            1 => Some(PrType::WriteExclusive),
            3 => Some(PrType::ExclusiveAccess),
            5 => Some(PrType::WriteExclusiveRegistrants),
            6 => Some(PrType::ExclusiveAccessRegistrants),
            _ => None,
        }
    }

    /// The TYPE field value.
    pub fn code(self) -> u8 {
        match self {
            PrType::WriteExclusive => 1,
            PrType::ExclusiveAccess => 3,
            PrType::WriteExclusiveRegistrants => 5,
            PrType::ExclusiveAccessRegistrants => 6,
        }
    }

    fn registrants_only(self) -> bool {
        matches!(
            self,
            PrType::WriteExclusiveRegistrants | PrType::ExclusiveAccessRegistrants
        )
    }

    fn exclusive_access(self) -> bool {
        matches!(
            self,
            PrType::ExclusiveAccess | PrType::ExclusiveAccessRegistrants
        )
    }
}

/// What one I_T nexus may do on the LU now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Everything (no reservation, or this nexus holds it or shares it).
    All,
    /// Reads only: writes get RESERVATION CONFLICT (Write Exclusive held
    /// by another nexus).
    ReadOnly,
    /// Neither reads nor writes (Exclusive Access held by another nexus).
    NoMedia,
    /// Another nexus holds a RESERVE(6) reservation: every command but
    /// the few SPC-2 allows gets RESERVATION CONFLICT.
    Reserved6,
}

/// How a command meets a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Allowed under every reservation (INQUIRY, REPORT LUNS, REQUEST
    /// SENSE, REPORT SUPPORTED OPERATION CODES, RELEASE(6)).
    Exempt,
    /// Allowed under persistent reservations, not under RESERVE(6) (TEST
    /// UNIT READY, READ CAPACITY, MODE SENSE, PERSISTENT RESERVE IN/OUT,
    /// RESERVE(6) itself: checked by the command).
    Status,
    /// Reads the medium.
    Read,
    /// Writes the medium.
    Write,
}

/// Whether a command of `class` conflicts under `access`.
pub fn conflicts(access: Access, class: Class) -> bool {
    match (access, class) {
        (_, Class::Exempt) | (Access::All, _) => false,
        (Access::Reserved6, _) => true,
        (_, Class::Status) => false,
        (Access::ReadOnly, Class::Read) => false,
        _ => true,
    }
}

#[derive(Debug, Clone)]
struct Holder {
    nexus: ItNexus,
    ty: PrType,
}

/// The reservation state of one LU.
#[derive(Debug, Default)]
pub struct Reservations {
    /// Registered I_T nexuses and their keys.
    registrations: Vec<(ItNexus, u64)>,
    /// The persistent reservation.
    holder: Option<Holder>,
    /// The RESERVE(6) reservation: its nexus and the session of that
    /// nexus that last reserved (see [`nexus_lost`](Self::nexus_lost)).
    reserved6: Option<(ItNexus, u64)>,
    /// PRGENERATION.
    generation: u32,
}

/// PERSISTENT RESERVE OUT service actions.
pub mod out_sa {
    /// REGISTER.
    pub const REGISTER: u8 = 0x00;
    /// RESERVE.
    pub const RESERVE: u8 = 0x01;
    /// RELEASE.
    pub const RELEASE: u8 = 0x02;
    /// CLEAR.
    pub const CLEAR: u8 = 0x03;
    /// PREEMPT.
    pub const PREEMPT: u8 = 0x04;
    /// REGISTER AND IGNORE EXISTING KEY.
    pub const REGISTER_AND_IGNORE: u8 = 0x06;
}

/// PERSISTENT RESERVE IN service actions.
pub mod in_sa {
    /// READ KEYS.
    pub const READ_KEYS: u8 = 0x00;
    /// READ RESERVATION.
    pub const READ_RESERVATION: u8 = 0x01;
    /// REPORT CAPABILITIES.
    pub const REPORT_CAPABILITIES: u8 = 0x02;
}

/// Writes into a fixed buffer, counting what does not fit.
struct Writer<'a> {
    out: &'a mut [u8],
    n: usize,
}

impl Writer<'_> {
    fn put(&mut self, b: &[u8]) {
        let end = (self.n + b.len()).min(self.out.len());
        if self.n < end {
            self.out[self.n..end].copy_from_slice(&b[..end - self.n]);
        }
        self.n += b.len();
    }
}

/// Length of the PERSISTENT RESERVE OUT parameter list (no SPEC_I_PT).
pub const PR_OUT_PARAM_LEN: u32 = 24;

fn key_at(d: &[u8], o: usize) -> u64 {
    let mut k = [0u8; 8];
    k.copy_from_slice(&d[o..o + 8]);
    u64::from_be_bytes(k)
}

impl Reservations {
    fn key_of(&self, n: &ItNexus) -> Option<u64> {
        self.registrations
            .iter()
            .find(|(x, _)| x == n)
            .map(|(_, k)| *k)
    }

    /// What `n` may do now.
    pub fn access(&self, n: &ItNexus) -> Access {
        if let Some((r, _)) = &self.reserved6 {
            return if r == n {
                Access::All
            } else {
                Access::Reserved6
            };
        }
        let Some(h) = &self.holder else {
            return Access::All;
        };
        if h.nexus == *n || (h.ty.registrants_only() && self.key_of(n).is_some()) {
            return Access::All;
        }
        if h.ty.exclusive_access() {
            Access::NoMedia
        } else {
            Access::ReadOnly
        }
    }

    /// Whether any persistent registration or reservation exists.
    pub fn persistent(&self) -> bool {
        !self.registrations.is_empty() || self.holder.is_some()
    }

    fn unregister(&mut self, n: &ItNexus) {
        self.registrations.retain(|(x, _)| x != n);
        if self.holder.as_ref().is_some_and(|h| h.nexus == *n) {
            self.holder = None;
        }
    }

    /// PERSISTENT RESERVE OUT `sa` with SCOPE/TYPE `scope_type` and the
    /// 24-byte parameter list `param`, from `n`.
    ///
    /// # Errors
    /// [`Sense::RESERVATION_CONFLICT`] (also whenever a RESERVE(6)
    /// reservation is held, by `n` too: SPC-3 PERSISTENT RESERVE OUT),
    /// 05/24/00 (unsupported service action, scope or type), 05/26/00
    /// (unsupported parameter bits, key 0 to preempt), 05/1A/00
    /// (parameter list length), 05/26/04 (release of another type).
    pub fn out(&mut self, n: &ItNexus, sa: u8, scope_type: u8, param: &[u8]) -> Result<(), Sense> {
        if self.reserved6.is_some() {
            return Err(Sense::RESERVATION_CONFLICT);
        }
        if param.len() != PR_OUT_PARAM_LEN as usize {
            return Err(Sense::PARAM_LIST_LENGTH);
        }
        if param[20] & 0x0D != 0 {
            // SPEC_I_PT, ALL_TG_PT, APTPL: not offered (capabilities).
            return Err(Sense::INVALID_FIELD_IN_PARAM);
        }
        let key = key_at(param, 0);
        let sa_key = key_at(param, 8);
        let mine = self.key_of(n);
        match sa {
            out_sa::REGISTER | out_sa::REGISTER_AND_IGNORE => {
                if sa == out_sa::REGISTER && key != mine.unwrap_or(0) {
                    return Err(Sense::RESERVATION_CONFLICT);
                }
                match (mine, sa_key) {
                    (None, 0) => {}
                    (None, k) => self.registrations.push((n.clone(), k)),
                    (Some(_), 0) => self.unregister(n),
                    (Some(_), k) => {
                        for r in self.registrations.iter_mut().filter(|(x, _)| x == n) {
                            r.1 = k;
                        }
                    }
                }
                self.generation = self.generation.wrapping_add(1);
                Ok(())
            }
            out_sa::RESERVE | out_sa::RELEASE | out_sa::CLEAR | out_sa::PREEMPT => {
                if mine != Some(key) {
                    return Err(Sense::RESERVATION_CONFLICT);
                }
                let ty = || {
                    if scope_type >> 4 != 0 {
                        return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(2, Some(7)));
                    }
                    PrType::from_code(scope_type & 0x0F)
                        .ok_or(Sense::INVALID_FIELD_IN_CDB.at_cdb(2, Some(3)))
                };
                match sa {
                    out_sa::RESERVE => {
                        let ty = ty()?;
                        match &self.holder {
                            None => {
                                self.holder = Some(Holder {
                                    nexus: n.clone(),
                                    ty,
                                })
                            }
                            Some(h) if h.nexus == *n && h.ty == ty => {}
                            Some(_) => return Err(Sense::RESERVATION_CONFLICT),
                        }
                        Ok(())
                    }
                    out_sa::RELEASE => {
                        match &self.holder {
                            Some(h) if h.nexus == *n => {
                                if h.ty.code() != scope_type & 0x0F || scope_type >> 4 != 0 {
                                    return Err(Sense::INVALID_RELEASE);
                                }
                                self.holder = None;
                            }
                            // Not the holder, or no reservation: no effect.
                            _ => {}
                        }
                        Ok(())
                    }
                    out_sa::CLEAR => {
                        self.registrations.clear();
                        self.holder = None;
                        self.generation = self.generation.wrapping_add(1);
                        Ok(())
                    }
                    _ => {
                        let ty = ty()?;
                        if sa_key == 0 {
                            return Err(Sense::INVALID_FIELD_IN_PARAM);
                        }
                        let holder_key = self.holder.as_ref().and_then(|h| self.key_of(&h.nexus));
                        let before = self.registrations.len();
                        self.registrations.retain(|(x, k)| *k != sa_key || x == n);
                        let removed = before != self.registrations.len();
                        if holder_key == Some(sa_key) {
                            // Preempt the holder: its reservation passes to n.
                            self.holder = Some(Holder {
                                nexus: n.clone(),
                                ty,
                            });
                        } else if !removed {
                            return Err(Sense::RESERVATION_CONFLICT);
                        }
                        self.generation = self.generation.wrapping_add(1);
                        Ok(())
                    }
                }
            }
            _ => Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(1, Some(4))),
        }
    }

    /// PERSISTENT RESERVE IN `sa` into `out`; returns the length of the
    /// whole answer (keys that do not fit in `out` are left out, the
    /// ADDITIONAL LENGTH still counts them, as SPC-4 asks).
    ///
    /// # Errors
    /// 05/24/00 for an unsupported service action;
    /// [`Sense::RESERVATION_CONFLICT`] while a RESERVE(6) reservation is
    /// held, whoever holds it (SPC-3 PERSISTENT RESERVE IN).
    pub fn read(&self, sa: u8, out: &mut [u8]) -> Result<usize, Sense> {
        if self.reserved6.is_some() {
            return Err(Sense::RESERVATION_CONFLICT);
        }
        let mut w = Writer { out, n: 0 };
        match sa {
            in_sa::READ_KEYS => {
                w.put(&self.generation.to_be_bytes());
                let len = (self.registrations.len() * 8) as u32;
                w.put(&len.to_be_bytes());
                for (_, k) in &self.registrations {
                    w.put(&k.to_be_bytes());
                }
            }
            in_sa::READ_RESERVATION => {
                w.put(&self.generation.to_be_bytes());
                match &self.holder {
                    None => w.put(&0u32.to_be_bytes()),
                    Some(h) => {
                        w.put(&16u32.to_be_bytes());
                        let k = self.key_of(&h.nexus).unwrap_or(0);
                        w.put(&k.to_be_bytes());
                        // Obsolete (4), reserved, SCOPE 0h (LU) | TYPE,
                        // obsolete (2).
                        w.put(&[0, 0, 0, 0, 0, h.ty.code(), 0, 0]);
                    }
                }
            }
            in_sa::REPORT_CAPABILITIES => {
                w.put(&8u16.to_be_bytes());
                // CRH 0, SIP_C 0, ATP_C 0, PTPL_C 0; TMV (the type mask
                // is valid), ALLOW COMMANDS 000b, PTPL_A 0; the type mask:
                // EX_AC_RO (6), WR_EX_RO (5), EX_AC (3), WR_EX (1).
                w.put(&[0, 0x80, 0x40 | 0x20 | 0x08 | 0x02, 0, 0, 0]);
            }
            _ => return Err(Sense::INVALID_FIELD_IN_CDB.at_cdb(1, Some(4))),
        }
        Ok(w.n)
    }

    /// RESERVE(6) from `n`, in its session `session` (any number that
    /// tells this session of the nexus from an earlier or later one).
    ///
    /// # Errors
    /// [`Sense::RESERVATION_CONFLICT`] when another nexus holds it or a
    /// persistent reservation exists (CRH=0).
    pub fn reserve6(&mut self, n: &ItNexus, session: u64) -> Result<(), Sense> {
        if self.persistent() {
            return Err(Sense::RESERVATION_CONFLICT);
        }
        match &self.reserved6 {
            Some((r, _)) if r != n => Err(Sense::RESERVATION_CONFLICT),
            _ => {
                self.reserved6 = Some((n.clone(), session));
                Ok(())
            }
        }
    }

    /// RELEASE(6) from `n` (no effect unless `n` holds the reservation).
    ///
    /// # Errors
    /// [`Sense::RESERVATION_CONFLICT`] when a persistent reservation
    /// exists (CRH=0).
    pub fn release6(&mut self, n: &ItNexus) -> Result<(), Sense> {
        if self.persistent() {
            return Err(Sense::RESERVATION_CONFLICT);
        }
        if self.reserved6.as_ref().is_some_and(|(r, _)| r == n) {
            self.reserved6 = None;
        }
        Ok(())
    }

    /// A logical unit reset (LOGICAL UNIT RESET or TARGET WARM RESET): the
    /// RESERVE(6) reservation ends whoever holds it; persistent
    /// registrations and reservations stay (they survive a reset, SPC-4).
    pub fn lu_reset(&mut self) {
        self.reserved6 = None;
    }

    /// Session `session` of the I_T nexus `n` is gone: the RESERVE(6)
    /// reservation it took ends (persistent registrations stay). One that a
    /// later session of the same nexus took (after a reinstatement, or
    /// while the old connection waited for its initiator to disconnect
    /// after a logout) stays.
    pub fn nexus_lost(&mut self, n: &ItNexus, session: u64) {
        if self
            .reserved6
            .as_ref()
            .is_some_and(|(r, s)| r == n && *s == session)
        {
            self.reserved6 = None;
        }
    }
}

/// What the sessions of one LU share: the reservations, the epoch that
/// says they changed, and the COMPARE AND WRITE gate.
#[derive(Debug, Default)]
pub struct LunShared {
    state: Mutex<Reservations>,
    /// Read by every media command: on a line of its own, apart from the
    /// mutex and the gate that other cores write.
    epoch: Line<AtomicU64>,
    caw: Line<AtomicBool>,
}

/// A value alone on its cache lines.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Line<T>(T);

impl LunShared {
    /// The state, for a change or a PERSISTENT RESERVE IN (control path).
    pub fn lock(&self) -> MutexGuard<'_, Reservations> {
        match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Run `f` on the state and publish the change (a new epoch).
    pub fn change<T>(&self, f: impl FnOnce(&mut Reservations) -> T) -> T {
        let mut g = self.lock();
        let r = f(&mut g);
        self.epoch.0.fetch_add(1, Ordering::Release);
        r
    }

    /// The current epoch (one load; the data-path check).
    pub fn epoch(&self) -> u64 {
        self.epoch.0.load(Ordering::Acquire)
    }

    /// Take the COMPARE AND WRITE gate: `false` when another COMPARE AND
    /// WRITE on this LU holds it (the caller waits). COMPARE AND WRITE
    /// commands of all sessions run one at a time, as Linux's LIO does
    /// (its per-device CAW semaphore); other commands are not held up.
    pub fn try_caw(&self) -> bool {
        self.caw
            .0
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Release the COMPARE AND WRITE gate.
    pub fn end_caw(&self) {
        self.caw.0.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests;
