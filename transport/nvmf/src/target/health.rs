//! SMART / Health counters of a subsystem: data units and commands read
//! and written, controller busy time, power-on time and unsafe shutdowns,
//! plus the composite temperature policy.
//!
//! # Counting without locks on the data path
//!
//! Each I/O queue owns an [`IoCounters`] (its own cache line) and is its
//! only writer: an update is a relaxed load and a relaxed store of the
//! queue's own line, never a read-modify-write on a shared one. The
//! subsystem keeps the live queues' counters in a registry (taken at
//! Connect and when a queue goes away, control path) and folds a departing
//! queue's counts into its retired totals. A Get Log Page sums the registry
//! and the totals under that registry's lock (control path).
//!
//! # What is counted (NVMe 1.4 SMART / Health log)
//!
//! - Data units read / written: 512-byte units of data of successful Read
//!   / Write commands (Write Zeroes and Dataset Management move no data and
//!   do not count), reported in thousands, rounded up ([`data_units`]).
//! - Host read / write commands: successful Read, and Write and Write
//!   Zeroes (user-data writes) commands.
//! - Controller busy time: the time an I/O queue has at least one command
//!   outstanding, summed over the queues, in whole minutes.
//! - Power-on hours: whole hours since the subsystem was created (the
//!   "device" a host sees; the target keeps no state across runs).
//! - Unsafe shutdowns: controllers that were enabled (CSTS.RDY was 1) and
//!   went away (host disconnect, keep-alive timeout, transport loss)
//!   without a shutdown notification (CC.SHN) first: the fabrics
//!   counterpart of losing power without one.
//!
//! # Temperature
//!
//! A software controller has no sensor of its own; it reports the
//! temperature of the machine it runs on: the hottest of the kernel's
//! thermal zones (`/sys/class/thermal/thermal_zone*/temp`), in kelvin. On a
//! machine without thermal zones (most VMs) it reports
//! [`NOMINAL_TEMPERATURE_K`], a fixed room-temperature value below every
//! default threshold, so the log never claims an alarm it cannot know. The
//! Temperature Threshold feature (over and under, composite sensor only)
//! is kept per controller, and the SMART critical warning bit 1 is set
//! when the reported temperature crosses either threshold.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use pollux_reactor::sync::{Mutex, MutexGuard};

/// Composite temperature reported without a thermal zone: 20 °C.
pub const NOMINAL_TEMPERATURE_K: u16 = 293;
/// Default over-temperature threshold: 70 °C (the usual NVMe default).
pub const DEFAULT_OVER_TEMP_K: u16 = 343;
/// Critical composite temperature (Identify Controller CCTEMP): 100 °C.
pub const CRITICAL_TEMP_K: u16 = 373;
/// Default under-temperature threshold: 0 K (never crossed).
pub const DEFAULT_UNDER_TEMP_K: u16 = 0;
/// SMART critical warning bit 1: temperature outside a threshold.
pub const CRITICAL_WARNING_TEMPERATURE: u8 = 1 << 1;

/// The counters of one I/O queue; written only by that queue's reactor.
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct IoCounters {
    read_cmds: AtomicU64,
    write_cmds: AtomicU64,
    read_units: AtomicU64,
    write_units: AtomicU64,
    busy_ns: AtomicU64,
}

/// Single-writer add: a load and a store, no read-modify-write.
#[inline(always)]
fn add(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

impl IoCounters {
    /// A successful Read of `bytes` data bytes.
    #[inline]
    pub(crate) fn read_done(&self, bytes: u64) {
        add(&self.read_cmds, 1);
        add(&self.read_units, bytes / 512);
    }

    /// A successful Write of `bytes` data bytes (0 for Write Zeroes).
    #[inline]
    pub(crate) fn write_done(&self, bytes: u64) {
        add(&self.write_cmds, 1);
        add(&self.write_units, bytes / 512);
    }

    /// The queue was busy for `ns` nanoseconds.
    #[inline]
    pub(crate) fn busy_for(&self, ns: u64) {
        add(&self.busy_ns, ns);
    }

    fn snapshot(&self) -> IoTotals {
        IoTotals {
            read_cmds: self.read_cmds.load(Ordering::Relaxed),
            write_cmds: self.write_cmds.load(Ordering::Relaxed),
            read_units: self.read_units.load(Ordering::Relaxed),
            write_units: self.write_units.load(Ordering::Relaxed),
            busy_ns: self.busy_ns.load(Ordering::Relaxed),
        }
    }
}

/// Summed I/O counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoTotals {
    /// Host read commands.
    pub read_cmds: u64,
    /// Host write commands.
    pub write_cmds: u64,
    /// 512-byte units read.
    pub read_units: u64,
    /// 512-byte units written.
    pub write_units: u64,
    /// Nanoseconds some I/O queue had a command outstanding.
    pub busy_ns: u64,
}

impl IoTotals {
    fn add(&mut self, o: &IoTotals) {
        self.read_cmds += o.read_cmds;
        self.write_cmds += o.write_cmds;
        self.read_units += o.read_units;
        self.write_units += o.write_units;
        self.busy_ns += o.busy_ns;
    }
}

/// SMART data units: thousands of 512-byte units, rounded up (1 means 1 to
/// 1,000 units; 0 only when nothing moved).
pub fn data_units(units_512: u64) -> u128 {
    u128::from(units_512).div_ceil(1000)
}

#[derive(Debug, Default)]
struct Registry {
    live: Vec<Arc<IoCounters>>,
    retired: IoTotals,
}

/// A subsystem's health counters.
#[derive(Debug)]
pub struct HealthCounters {
    created: Instant,
    queues: Mutex<Registry>,
    unsafe_shutdowns: AtomicU64,
}

impl Default for HealthCounters {
    fn default() -> Self {
        HealthCounters {
            created: Instant::now(),
            queues: Mutex::new(Registry::default()),
            unsafe_shutdowns: AtomicU64::new(0),
        }
    }
}

impl HealthCounters {
    fn lock(&self) -> MutexGuard<'_, Registry> {
        self.queues.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An I/O queue connected: its counters join the sums.
    pub(crate) fn register(&self, c: &Arc<IoCounters>) {
        let mut r = self.lock();
        if !r.live.iter().any(|x| Arc::ptr_eq(x, c)) {
            r.live.push(Arc::clone(c));
        }
    }

    /// An I/O queue went away: its counts move to the retired totals.
    pub(crate) fn retire(&self, c: &Arc<IoCounters>) {
        let mut r = self.lock();
        if let Some(i) = r.live.iter().position(|x| Arc::ptr_eq(x, c)) {
            let gone = r.live.swap_remove(i);
            let snap = gone.snapshot();
            r.retired.add(&snap);
        }
    }

    /// A controller went away without a shutdown notification.
    pub(crate) fn unsafe_shutdown(&self) {
        self.unsafe_shutdowns.fetch_add(1, Ordering::Relaxed);
    }

    /// The I/O counters summed over live and departed queues.
    pub fn io_totals(&self) -> IoTotals {
        let r = self.lock();
        let mut t = r.retired;
        for c in &r.live {
            t.add(&c.snapshot());
        }
        t
    }

    /// Unsafe shutdowns so far.
    pub fn unsafe_shutdowns(&self) -> u64 {
        self.unsafe_shutdowns.load(Ordering::Relaxed)
    }

    /// Whole hours since the subsystem was created.
    pub fn power_on_hours(&self) -> u64 {
        self.created.elapsed().as_secs() / 3600
    }
}

/// The composite temperature to report, in kelvin (see the module docs).
pub fn composite_temperature_k() -> u16 {
    hottest_thermal_zone_k().unwrap_or(NOMINAL_TEMPERATURE_K)
}

/// The hottest readable thermal zone, in kelvin.
fn hottest_thermal_zone_k() -> Option<u16> {
    let dir = std::fs::read_dir("/sys/class/thermal").ok()?;
    dir.filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("thermal_zone"))
        .filter_map(|e| std::fs::read_to_string(e.path().join("temp")).ok())
        .filter_map(|s| millicelsius_to_kelvin(s.trim()))
        .max()
}

/// A thermal zone reading (milli-degrees Celsius) in whole kelvin; `None`
/// for an unparsable or impossible value.
fn millicelsius_to_kelvin(s: &str) -> Option<u16> {
    let mc: i64 = s.parse().ok()?;
    let k = (mc + 273_150).div_euclid(1000);
    u16::try_from(k).ok().filter(|&k| k > 0)
}

/// The SMART critical warning temperature bit for `temp_k` against the
/// `over` and `under` thresholds: at or above the over threshold, or at or
/// below the under one (NVMe 1.4 SMART log byte 0 bit 1); an under
/// threshold of 0 is never crossed.
pub fn temperature_warning(temp_k: u16, over: u16, under: u16) -> u8 {
    if temp_k >= over || (under > 0 && temp_k <= under) {
        CRITICAL_WARNING_TEMPERATURE
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_units_round_up_in_thousands() {
        assert_eq!(data_units(0), 0);
        assert_eq!(data_units(1), 1);
        assert_eq!(data_units(1000), 1);
        assert_eq!(data_units(1001), 2);
        assert_eq!(data_units(8 * 1000), 8);
    }

    #[test]
    fn queues_sum_and_retire() {
        let h = HealthCounters::default();
        let a = Arc::new(IoCounters::default());
        let b = Arc::new(IoCounters::default());
        h.register(&a);
        h.register(&b);
        h.register(&a);
        a.read_done(4096);
        b.write_done(512);
        b.write_done(0);
        a.busy_for(10);
        h.retire(&a);
        a.read_done(4096); // after retiring: not counted
        b.read_done(1024);
        let t = h.io_totals();
        assert_eq!(
            t,
            IoTotals {
                read_cmds: 2,
                write_cmds: 2,
                read_units: 10,
                write_units: 1,
                busy_ns: 10,
            }
        );
        h.unsafe_shutdown();
        assert_eq!(h.unsafe_shutdowns(), 1);
        assert_eq!(h.power_on_hours(), 0);
    }

    #[test]
    fn temperature_policy() {
        assert_eq!(millicelsius_to_kelvin("45000"), Some(318));
        assert_eq!(millicelsius_to_kelvin("-5000"), Some(268));
        assert_eq!(millicelsius_to_kelvin("x"), None);
        assert_eq!(millicelsius_to_kelvin("-300000"), None);
        assert_eq!(temperature_warning(300, 343, 0), 0);
        assert_eq!(
            temperature_warning(343, 343, 0),
            CRITICAL_WARNING_TEMPERATURE
        );
        assert_eq!(
            temperature_warning(260, 343, 273),
            CRITICAL_WARNING_TEMPERATURE
        );
        let t = composite_temperature_k();
        assert!(t > 0);
    }

    #[test]
    fn a_temperature_at_either_threshold_warns() {
        // NVMe 1.4 SMART critical warning bit 1: greater than or equal to
        // the over threshold, or less than or equal to the under one.
        assert_eq!(
            temperature_warning(273, 343, 273),
            CRITICAL_WARNING_TEMPERATURE
        );
        assert_eq!(temperature_warning(274, 343, 273), 0);
        assert_eq!(temperature_warning(1, 343, 0), 0, "under 0: never");
    }
}
