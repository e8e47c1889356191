//! A host controller: the admin queue, the enable sequence, Identify,
//! the number of I/O queues, keep-alive, discovery, shutdown, and the
//! connection of I/O queue pairs (on any reactor, through that reactor's
//! transport).
//!
//! Everything here is control path: it allocates, and it spins on the
//! admin queue until each command completes (bounded by
//! [`CtrlOptions::timeout`]).

use std::time::{Duration, Instant};

use pollux_reactor::mem::{DmaBuf, SgList};

use super::fabrics::{self, HostIdentity};
use super::qpair::Qpair;
use super::reconnect::{CtrlLink, CtrlState};
use super::transport::{DataDir, HostTransport, QueueParams};
use super::trid::DISCOVERY_NQN;
use super::HostError;
use crate::spec::cmd::{AdminOpcode, NvmeCmd};
use crate::spec::connect::CNTLID_DYNAMIC;
use crate::spec::features::{fid, num_queues_value, parse_num_queues, FeatureCmd};
use crate::spec::identify::{
    cns, parse_ns_list, IdentifyCmd, IdentifyController, IdentifyNamespace, CNTRLTYPE_DISCOVERY,
    IDENTIFY_DATA_SIZE,
};
use crate::spec::log_page::{
    lid, DiscoveryLogEntry, DiscoveryLogHeader, GetLogPageCmd, DISCOVERY_RECORD_SIZE,
};
use crate::spec::property::{ofst as reg, Cap, Cc, Csts, PropertySize, SHN_NORMAL, SHST_COMPLETE};

/// Admin queue entries (Linux `NVME_AQ_DEPTH`).
pub const ADMIN_QUEUE_ENTRIES: u16 = 32;

/// Vendor-specific log page of a Pollux target: its reactors' busy and
/// idle time (see [`ReactorLoad`]).
pub const LID_POLLUX_REACTORS: u8 = 0xC0;
/// Size of the [`LID_POLLUX_REACTORS`] log page.
pub const POLLUX_REACTORS_LOG_SIZE: usize = 512;

/// Controller options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtrlOptions {
    /// Keep-alive timeout asked for in the admin Connect (0: none); a Keep
    /// Alive goes out every half of it.
    pub kato: Duration,
    /// I/O queues to ask for (Set Features Number of Queues).
    pub io_queues: u16,
    /// How long one control command may take.
    pub timeout: Duration,
    /// How long one I/O may take before its queue is torn down (0: no
    /// limit).
    pub io_timeout: Duration,
    /// Host identifier.
    pub hostid: [u8; 16],
    /// After the controller is lost, try to connect again this often
    /// (nvme-cli `--reconnect-delay`, default 10 s).
    pub reconnect_delay: Duration,
    /// Give up reconnecting after the controller was lost this long, then
    /// fail every new command (nvme-cli `--ctrl-loss-tmo`, default 600 s;
    /// zero: no reconnect, fail at once).
    pub ctrl_loss_tmo: Duration,
}

/// Default [`CtrlOptions::reconnect_delay`] (nvme-cli's).
pub const DEFAULT_RECONNECT_DELAY: Duration = Duration::from_secs(10);
/// Default [`CtrlOptions::ctrl_loss_tmo`] (nvme-cli's).
pub const DEFAULT_CTRL_LOSS_TMO: Duration = Duration::from_secs(600);

impl Default for CtrlOptions {
    fn default() -> Self {
        CtrlOptions {
            kato: Duration::from_secs(10),
            io_queues: 1,
            timeout: Duration::from_secs(10),
            io_timeout: Duration::from_secs(30),
            hostid: *b"pollux-host-0001",
            reconnect_delay: DEFAULT_RECONNECT_DELAY,
            ctrl_loss_tmo: DEFAULT_CTRL_LOSS_TMO,
        }
    }
}

/// One namespace as the host sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NsInfo {
    /// Namespace id.
    pub nsid: u32,
    /// Bytes per block.
    pub block_size: u32,
    /// Number of blocks.
    pub num_blocks: u64,
    /// Metadata bytes per block (0: none), carried after each block's
    /// data (extended LBA).
    pub md_size: u32,
    /// PI type (0: none, 1-3), in the last 8 bytes of the metadata (or the
    /// first, with `pi_first`).
    pub pi_type: u8,
    /// The PI tuple is in the first 8 bytes of the metadata (DPS bit 3).
    pub pi_first: bool,
}

/// What the host learned about a controller; `Send`, so other reactors
/// can connect their I/O queues with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtrlInfo {
    /// Host and subsystem names.
    pub who: HostIdentity,
    /// Controller id.
    pub cntlid: u16,
    /// CAP.
    pub cap: Cap,
    /// VS.
    pub vs: u32,
    /// Identify Controller.
    pub ident: IdentifyController,
    /// I/O queues granted.
    pub io_queues: u16,
    /// Active namespaces.
    pub namespaces: Vec<NsInfo>,
    /// Options the controller was connected with.
    pub opts: CtrlOptions,
}

impl CtrlInfo {
    /// Most entries an I/O queue may have (CAP.MQES + 1, MAXCMD).
    pub fn max_io_entries(&self) -> u16 {
        let mqes = self.cap.mqes.saturating_add(1).max(2);
        if self.ident.maxcmd > 0 {
            mqes.min(self.ident.maxcmd)
        } else {
            mqes
        }
    }

    /// The controller's in-capsule data limit for I/O queues (IOCCSZ×16
    /// − 64; 0 when offsets in the capsule are not supported).
    pub fn inline_limit(&self) -> u32 {
        let sgl_offset = self.ident.sgls & crate::spec::identify::SGLS_OFFSET != 0;
        if !sgl_offset || self.ident.icdoff != 0 {
            return 0;
        }
        self.ident.ioccsz.saturating_mul(16).saturating_sub(64)
    }

    /// The largest transfer (MDTS; `None`: unlimited).
    pub fn max_transfer(&self) -> Option<u64> {
        (self.ident.mdts > 0).then(|| 4096u64 << self.ident.mdts)
    }
}

/// A target's reactor load, from the [`LID_POLLUX_REACTORS`] log page:
/// `u32 version @0 (1)`, `u32 count @4`, `u64 busy_ns @8`, `u64 idle_ns
/// @16` (sums over the target's reactors since they started).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReactorLoad {
    /// Reactors.
    pub reactors: u32,
    /// Busy nanoseconds, summed.
    pub busy_ns: u64,
    /// Idle nanoseconds, summed.
    pub idle_ns: u64,
}

impl ReactorLoad {
    /// Parse the log page (`None` for an unknown version or a short page).
    pub fn parse(b: &[u8]) -> Option<Self> {
        let u32_at = |o: usize| {
            b.get(o..o + 4)
                .and_then(|s| s.try_into().ok())
                .map(u32::from_le_bytes)
        };
        let u64_at = |o: usize| {
            b.get(o..o + 8)
                .and_then(|s| s.try_into().ok())
                .map(u64::from_le_bytes)
        };
        if u32_at(0)? != 1 {
            return None;
        }
        Some(ReactorLoad {
            reactors: u32_at(4)?,
            busy_ns: u64_at(8)?,
            idle_ns: u64_at(16)?,
        })
    }

    /// Busy percentage between two samples (`earlier` first).
    pub fn busy_pct_since(&self, earlier: &ReactorLoad) -> Option<f64> {
        let b = self.busy_ns.checked_sub(earlier.busy_ns)?;
        let i = self.idle_ns.checked_sub(earlier.idle_ns)?;
        (b + i > 0).then(|| b as f64 * 100.0 / (b + i) as f64)
    }
}

/// A connected, enabled controller: its admin queue on this reactor.
pub struct Controller<T: HostTransport> {
    admin: Qpair<T::Queue>,
    info: CtrlInfo,
    last_keep_alive: Instant,
    keep_alive_out: bool,
    link: CtrlLink,
    lost: Option<Lost>,
}

/// A lost controller being reconnected.
#[derive(Debug)]
struct Lost {
    since: Instant,
    next_try: Instant,
    attempts: u32,
}

impl<T: HostTransport> std::fmt::Debug for Controller<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("info", &self.info)
            .finish()
    }
}

const KEEP_ALIVE_CTX: u64 = u64::MAX - 1;

impl<T: HostTransport> Controller<T> {
    /// Connect the admin queue to subsystem `who.subnqn` through `t`,
    /// enable the controller, identify it and its namespaces, and ask for
    /// `opts.io_queues` I/O queues. For the discovery subsystem the
    /// namespace scan and queue count are skipped.
    ///
    /// # Errors
    /// [`HostError`]: the transport could not connect, the target refused
    /// (Connect status), a step timed out, or an answer was malformed.
    pub fn connect(t: &T, who: HostIdentity, opts: CtrlOptions) -> Result<Self, HostError> {
        let (admin, info) = Self::establish(t, who, opts)?;
        let link = CtrlLink::new(info.clone());
        Ok(Controller {
            admin,
            info,
            last_keep_alive: Instant::now(),
            keep_alive_out: false,
            link,
            lost: None,
        })
    }

    /// Connect, enable and identify: a new admin queue and what it told.
    fn establish(
        t: &T,
        who: HostIdentity,
        opts: CtrlOptions,
    ) -> Result<(Qpair<T::Queue>, CtrlInfo), HostError> {
        let q = t.open_queue(&QueueParams {
            qid: 0,
            entries: ADMIN_QUEUE_ENTRIES,
            cntlid: CNTLID_DYNAMIC,
            inline_limit: 0,
        })?;
        let mut admin = Qpair::new(q, 0, ADMIN_QUEUE_ENTRIES, Duration::ZERO);
        let to = opts.timeout;
        let kato_ms = u32::try_from(opts.kato.as_millis()).unwrap_or(u32::MAX);
        let cntlid = fabrics::connect(&mut admin, &who, CNTLID_DYNAMIC, kato_ms, to)?;
        let cap = Cap::from_u64(fabrics::property_get(
            &mut admin,
            reg::CAP,
            PropertySize::Eight,
            to,
        )?);
        // Enable: CC with EN=0 first (Linux), then EN=1, then wait for RDY.
        let css = if cap.css & crate::spec::property::CAP_CSS_IOCS != 0 {
            6
        } else {
            0
        };
        let mut cc = Cc::linux_default(css);
        cc.en = false;
        fabrics::property_set(&mut admin, reg::CC, cc.to_u32(), to)?;
        cc.en = true;
        fabrics::property_set(&mut admin, reg::CC, cc.to_u32(), to)?;
        let ready_to = Duration::from_millis(500 * (u64::from(cap.to) + 1)).max(to);
        let start = Instant::now();
        loop {
            let csts =
                Csts::from_u32(
                    fabrics::property_get(&mut admin, reg::CSTS, PropertySize::Four, to)? as u32,
                );
            if csts.cfs {
                return Err(HostError::Protocol(
                    "controller fatal status (CSTS.CFS) while enabling".into(),
                ));
            }
            if csts.rdy {
                break;
            }
            if start.elapsed() > ready_to {
                return Err(HostError::Timeout {
                    what: "controller ready (CSTS.RDY)",
                    after: ready_to,
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let vs = fabrics::property_get(&mut admin, reg::VS, PropertySize::Four, to)? as u32;
        let data = identify(&mut admin, cns::CONTROLLER, 0, to)?;
        let ident = IdentifyController::parse(&data)
            .map_err(|e| HostError::Protocol(format!("Identify Controller: {e}")))?;
        if ident.cntlid != cntlid {
            return Err(HostError::Protocol(format!(
                "Identify says controller {} but Connect said {cntlid}",
                ident.cntlid
            )));
        }
        let discovery = ident.cntrltype == CNTRLTYPE_DISCOVERY || who.subnqn == DISCOVERY_NQN;
        if !discovery
            && super::transport::HostQueue::needs_keyed_sgls(admin.transport())
            && ident.sgls & crate::spec::identify::SGLS_KEYED == 0
        {
            return Err(HostError::Protocol(
                "the controller does not support keyed SGLs".into(),
            ));
        }
        let mut info = CtrlInfo {
            who,
            cntlid,
            cap,
            vs,
            ident,
            io_queues: 0,
            namespaces: Vec::new(),
            opts: opts.clone(),
        };
        if !discovery {
            let want = u32::from(opts.io_queues.max(1));
            let cmd = FeatureCmd::set(fid::NUMBER_OF_QUEUES, num_queues_value(want, want), 0);
            let (cpl, _) = admin.exec(
                "Set Features (Number of Queues)",
                cmd,
                DataDir::None,
                SgList::new(),
                to,
            )?;
            let (nsq, ncq) = parse_num_queues(cpl.dw0).unwrap_or((want, want));
            info.io_queues = u16::try_from(nsq.min(ncq)).unwrap_or(u16::MAX);
            let list = identify(&mut admin, cns::ACTIVE_NS_LIST, 0, to)?;
            let nsids = parse_ns_list(&list)
                .map_err(|e| HostError::Protocol(format!("namespace list: {e}")))?;
            for nsid in nsids {
                let d = identify(&mut admin, cns::NAMESPACE, nsid, to)?;
                let ns = IdentifyNamespace::parse(&d)
                    .map_err(|e| HostError::Protocol(format!("Identify Namespace {nsid}: {e}")))?;
                let Some(bs) = ns.block_size().and_then(|b| u32::try_from(b).ok()) else {
                    continue;
                };
                let Some((md_size, pi_type, pi_first)) = ns.metadata() else {
                    log::warn!(
                        "nvmf host: namespace {nsid}: separate metadata, not usable over a fabric"
                    );
                    continue;
                };
                if ns.nsze == 0 {
                    continue;
                }
                info.namespaces.push(NsInfo {
                    nsid,
                    block_size: bs,
                    num_blocks: ns.nsze,
                    md_size,
                    pi_type,
                    pi_first,
                });
            }
        }
        Ok((admin, info))
    }

    /// What the host learned.
    pub fn info(&self) -> &CtrlInfo {
        &self.info
    }

    /// The admin queue.
    pub fn admin(&mut self) -> &mut Qpair<T::Queue> {
        &mut self.admin
    }

    /// Whether the admin queue is alive.
    pub fn is_alive(&self) -> bool {
        self.admin.is_alive()
    }

    /// The controller's state as every reactor sees it: hand a clone to
    /// the reactors that own its I/O queue pairs.
    pub fn link(&self) -> &CtrlLink {
        &self.link
    }

    /// The controller's state.
    pub fn state(&self) -> CtrlState {
        self.link.state()
    }

    /// [`poll`](Self::poll) with loss handling: when the admin queue dies,
    /// the keep-alive times out or an I/O queue [reported a
    /// failure](CtrlLink::report_failure), the controller goes
    /// [`Reconnecting`](CtrlState::Reconnecting) and every
    /// [`CtrlOptions::reconnect_delay`] this connects, enables and
    /// identifies it again through `t` (blocking, bounded by
    /// [`CtrlOptions::timeout`] per command); once
    /// [`CtrlOptions::ctrl_loss_tmo`] passed without success (at once
    /// when it is zero) it is [`Failed`](CtrlState::Failed). Call it from
    /// a poller, e.g. every 50-100 ms.
    pub fn poll_recover(&mut self, t: &T) -> CtrlState {
        let state = self.link.state();
        if state == CtrlState::Failed {
            return state;
        }
        if self.lost.is_none() {
            let res = if self.link.take_reset_request() {
                Err(HostError::Disconnected("an I/O queue failed".into()))
            } else {
                self.poll()
            };
            let Err(e) = res else {
                return CtrlState::Live;
            };
            self.admin.disconnect();
            if self.info.opts.ctrl_loss_tmo.is_zero() {
                log::warn!("nvmf host: controller lost ({e}); reconnects are off");
                self.link.set_failed(e);
                return CtrlState::Failed;
            }
            log::warn!(
                "nvmf host: controller {} of {} lost ({e}); reconnecting every {:?} for up to {:?}",
                self.info.cntlid,
                self.info.who.subnqn,
                self.info.opts.reconnect_delay,
                self.info.opts.ctrl_loss_tmo
            );
            let now = Instant::now();
            self.lost = Some(Lost {
                since: now,
                next_try: now + self.info.opts.reconnect_delay,
                attempts: 0,
            });
            self.link.set_reconnecting(e);
        }
        let Some(lost) = self.lost.as_mut() else {
            return self.link.state();
        };
        let now = Instant::now();
        let (delay, tmo) = (self.info.opts.reconnect_delay, self.info.opts.ctrl_loss_tmo);
        if now >= lost.next_try && now.saturating_duration_since(lost.since) < tmo {
            lost.attempts += 1;
            match Self::establish(t, self.info.who.clone(), self.info.opts.clone()) {
                Ok((admin, info)) => {
                    log::info!(
                        "nvmf host: reconnected to {} as controller {} (attempt {})",
                        info.who.subnqn,
                        info.cntlid,
                        lost.attempts
                    );
                    self.admin = admin;
                    self.info = info.clone();
                    self.last_keep_alive = Instant::now();
                    self.keep_alive_out = false;
                    self.lost = None;
                    self.link.set_live(info);
                    return CtrlState::Live;
                }
                Err(e) => {
                    log::debug!("nvmf host: reconnect attempt {}: {e}", lost.attempts);
                    lost.next_try = Instant::now() + delay;
                    self.link.set_reconnecting(e);
                }
            }
        }
        if Instant::now().saturating_duration_since(lost.since) >= tmo {
            let why = self
                .link
                .lost_because()
                .unwrap_or_else(|| HostError::Disconnected("the controller was lost".into()));
            log::warn!(
                "nvmf host: giving up on {} after {:?} ({} attempts): {why}",
                self.info.who.subnqn,
                tmo,
                lost.attempts
            );
            self.link.set_failed(why);
            return CtrlState::Failed;
        }
        CtrlState::Reconnecting
    }

    /// Poll the admin queue and send a Keep Alive every KATO/2 (call it
    /// from a poller, e.g. every 100 ms).
    ///
    /// # Errors
    /// [`HostError::Disconnected`] (or the keep-alive's failure) once the
    /// admin queue is dead: the controller is lost.
    pub fn poll(&mut self) -> Result<(), HostError> {
        let mut failed = None;
        let ka_out = &mut self.keep_alive_out;
        self.admin.poll(&mut |c| {
            if c.ctx == KEEP_ALIVE_CTX {
                *ka_out = false;
                if let Err(e) = c.result {
                    failed = Some(e);
                }
            }
        });
        if let Some(e) = failed {
            self.admin.disconnect();
            return Err(HostError::Disconnected(format!("keep-alive failed: {e}")));
        }
        if let Some(e) = self.admin.dead_reason() {
            return Err(e.clone());
        }
        let kato = self.info.opts.kato;
        if !kato.is_zero() && self.last_keep_alive.elapsed() >= kato / 2 {
            if self.keep_alive_out {
                self.admin.disconnect();
                return Err(HostError::Timeout {
                    what: "Keep Alive",
                    after: kato / 2,
                });
            }
            self.last_keep_alive = Instant::now();
            let cmd = NvmeCmd::new(AdminOpcode::KeepAlive.code(), 0);
            if self
                .admin
                .submit(cmd, DataDir::None, SgList::new(), KEEP_ALIVE_CTX)
                .is_ok()
            {
                self.keep_alive_out = true;
            }
            self.admin.flush();
        }
        Ok(())
    }

    /// Read `len` bytes of log page `lid` at offset `lpo`.
    ///
    /// # Errors
    /// As [`Qpair::exec`].
    pub fn get_log_page(
        &mut self,
        lid: u8,
        nsid: u32,
        len: usize,
        lpo: u64,
    ) -> Result<Vec<u8>, HostError> {
        get_log(&mut self.admin, lid, nsid, len, lpo, self.info.opts.timeout)
    }

    /// Identify Namespace `nsid` (the whole structure).
    ///
    /// # Errors
    /// As [`Qpair::exec`]; [`HostError::Protocol`] for a short page.
    pub fn identify_namespace(&mut self, nsid: u32) -> Result<IdentifyNamespace, HostError> {
        let d = identify(
            &mut self.admin,
            cns::NAMESPACE,
            nsid,
            self.info.opts.timeout,
        )?;
        IdentifyNamespace::parse(&d)
            .map_err(|e| HostError::Protocol(format!("Identify Namespace {nsid}: {e}")))
    }

    /// The discovery log entries (discovery controllers).
    ///
    /// # Errors
    /// As [`Qpair::exec`]; [`HostError::Protocol`] for a malformed log.
    pub fn discovery_log(&mut self) -> Result<Vec<DiscoveryLogEntry>, HostError> {
        let to = self.info.opts.timeout;
        for _ in 0..4 {
            let h = get_log(
                &mut self.admin,
                lid::DISCOVERY,
                0,
                DISCOVERY_RECORD_SIZE,
                0,
                to,
            )?;
            let hdr = DiscoveryLogHeader::parse(&h)
                .map_err(|e| HostError::Protocol(format!("discovery log: {e}")))?;
            let n = usize::try_from(hdr.numrec.min(1024)).unwrap_or(1024);
            let mut out = Vec::with_capacity(n);
            for i in 0..n {
                let off = (DISCOVERY_RECORD_SIZE * (i + 1)) as u64;
                let e = get_log(
                    &mut self.admin,
                    lid::DISCOVERY,
                    0,
                    DISCOVERY_RECORD_SIZE,
                    off,
                    to,
                )?;
                out.push(
                    DiscoveryLogEntry::parse(&e)
                        .map_err(|e| HostError::Protocol(format!("discovery entry {i}: {e}")))?,
                );
            }
            let h2 = get_log(
                &mut self.admin,
                lid::DISCOVERY,
                0,
                DISCOVERY_RECORD_SIZE,
                0,
                to,
            )?;
            let again = DiscoveryLogHeader::parse(&h2)
                .map_err(|e| HostError::Protocol(format!("discovery log: {e}")))?;
            if again.genctr == hdr.genctr {
                return Ok(out);
            }
        }
        Err(HostError::Protocol(
            "the discovery log keeps changing".into(),
        ))
    }

    /// The target's reactor load, when the target is a Pollux target
    /// (vendor log page [`LID_POLLUX_REACTORS`]); `None` otherwise.
    pub fn reactor_load(&mut self) -> Option<ReactorLoad> {
        let b = self
            .get_log_page(LID_POLLUX_REACTORS, 0, POLLUX_REACTORS_LOG_SIZE, 0)
            .ok()?;
        ReactorLoad::parse(&b)
    }

    /// Open I/O queue `qid` of `entries` entries on `t` (the calling
    /// reactor's transport) and connect it to this controller.
    ///
    /// # Errors
    /// As [`connect_io_qpair`].
    pub fn connect_io<U: HostTransport>(
        &self,
        t: &U,
        qid: u16,
        entries: u16,
        inline_cap: Option<u32>,
    ) -> Result<Qpair<U::Queue>, HostError> {
        connect_io_qpair(t, &self.info, qid, entries, inline_cap)
    }

    /// Normal shutdown: CC.SHN = normal, wait for CSTS.SHST = complete
    /// (bounded by the timeout), then disconnect the admin queue. I/O
    /// queues should be gone first.
    ///
    /// # Errors
    /// As [`Qpair::exec`]; [`HostError::Timeout`].
    pub fn shutdown(mut self) -> Result<(), HostError> {
        let to = self.info.opts.timeout;
        let css = if self.info.cap.css & crate::spec::property::CAP_CSS_IOCS != 0 {
            6
        } else {
            0
        };
        let mut cc = Cc::linux_default(css);
        cc.en = true;
        cc.shn = SHN_NORMAL;
        fabrics::property_set(&mut self.admin, reg::CC, cc.to_u32(), to)?;
        let start = Instant::now();
        loop {
            let csts = Csts::from_u32(fabrics::property_get(
                &mut self.admin,
                reg::CSTS,
                PropertySize::Four,
                to,
            )? as u32);
            if csts.shst == SHST_COMPLETE {
                break;
            }
            if start.elapsed() > to {
                return Err(HostError::Timeout {
                    what: "shutdown (CSTS.SHST)",
                    after: to,
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.admin.disconnect();
        Ok(())
    }
}

/// Open and connect I/O queue `qid` with `entries` entries (capped by the
/// controller's limits) to the controller `info` describes, through `t`
/// (the calling reactor's transport). `inline_cap` lowers the in-capsule
/// write limit (`Some(0)` disables in-capsule data).
///
/// # Errors
/// [`HostError::Unsupported`] for `qid` 0 or beyond the granted queues; as
/// [`HostTransport::open_queue`] and [`fabrics::connect`].
pub fn connect_io_qpair<U: HostTransport>(
    t: &U,
    info: &CtrlInfo,
    qid: u16,
    entries: u16,
    inline_cap: Option<u32>,
) -> Result<Qpair<U::Queue>, HostError> {
    if qid == 0 || qid > info.io_queues {
        return Err(HostError::Unsupported(format!(
            "I/O queue {qid}: the controller granted {} I/O queues",
            info.io_queues
        )));
    }
    let entries = entries.clamp(2, info.max_io_entries());
    let inline_limit = inline_cap.map_or(info.inline_limit(), |c| c.min(info.inline_limit()));
    let q = t.open_queue(&QueueParams {
        qid,
        entries,
        cntlid: info.cntlid,
        inline_limit,
    })?;
    let mut qp = Qpair::new(q, qid, entries, info.opts.io_timeout);
    fabrics::connect(&mut qp, &info.who, info.cntlid, 0, info.opts.timeout)?;
    Ok(qp)
}

/// Connect to the discovery controller through `t`, read the discovery log
/// and disconnect.
///
/// # Errors
/// As [`Controller::connect`] and [`Controller::discovery_log`].
pub fn discover<T: HostTransport>(
    t: &T,
    hostnqn: &str,
    opts: CtrlOptions,
) -> Result<Vec<DiscoveryLogEntry>, HostError> {
    let who = HostIdentity {
        hostnqn: hostnqn.to_string(),
        hostid: opts.hostid,
        subnqn: DISCOVERY_NQN.to_string(),
    };
    let opts = CtrlOptions {
        kato: Duration::ZERO,
        ..opts
    };
    let mut c = Controller::connect(t, who, opts)?;
    let log = c.discovery_log()?;
    c.admin.disconnect();
    Ok(log)
}

fn identify<Q: super::transport::HostQueue>(
    admin: &mut Qpair<Q>,
    cns: u8,
    nsid: u32,
    to: Duration,
) -> Result<Vec<u8>, HostError> {
    let buf = DmaBuf::alloc(IDENTIFY_DATA_SIZE).map_err(|e| HostError::Transport(e.to_string()))?;
    let cmd = IdentifyCmd::to_cmd(cns, nsid, 0);
    let (_, data) = admin.exec(
        "Identify",
        cmd,
        DataDir::FromCtrl,
        SgList::from_buf(buf),
        to,
    )?;
    let mut out = vec![0u8; IDENTIFY_DATA_SIZE];
    data.copy_to_slice(&mut out);
    Ok(out)
}

fn get_log<Q: super::transport::HostQueue>(
    admin: &mut Qpair<Q>,
    lid: u8,
    nsid: u32,
    len: usize,
    lpo: u64,
    to: Duration,
) -> Result<Vec<u8>, HostError> {
    let cmd = GetLogPageCmd::to_cmd(lid, nsid, len as u64, lpo, false, 0)
        .map_err(|e| HostError::Unsupported(e.to_string()))?;
    let buf = DmaBuf::alloc(len).map_err(|e| HostError::Transport(e.to_string()))?;
    let (_, data) = admin.exec(
        "Get Log Page",
        cmd,
        DataDir::FromCtrl,
        SgList::from_buf(buf),
        to,
    )?;
    let mut out = vec![0u8; len];
    data.copy_to_slice(&mut out);
    Ok(out)
}
