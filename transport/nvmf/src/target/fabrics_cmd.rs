//! Fabrics commands: Connect (admin and I/O queues, dynamic controller
//! model), Property Get and Property Set. Shared by every transport.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use pollux_reactor::{PollStatus, PollerGuard, Reactor};

use super::conformance::{self, NVME_VERSION};
use super::ctrlr::Controller;
use super::qpair::QueuePair;
use super::req::{Dir, Exec, Plan};
use crate::spec::cmd::{FabricsType, NvmeCmd};
use crate::spec::connect::{
    data_off, invalid_param_dw0, sqe_off, success_dw0, ConnectCmd, ConnectData, CNTLID_DYNAMIC,
    CONNECT_DATA_SIZE,
};
use crate::spec::cpl::NvmeStatus;
use crate::spec::property::{ofst, Cap, Cc, PropertyCmd, PropertySize};
use crate::spec::WireError;

/// The keep-alive timer checks at least this often.
const KEEP_ALIVE_MIN_PERIOD: Duration = Duration::from_millis(100);

impl QueuePair {
    /// Before a Connect succeeds: only Connect is accepted.
    pub(crate) fn classify_unconnected(&self, cmd: &NvmeCmd) -> Result<Plan, NvmeStatus> {
        if !cmd.is_fabrics() || FabricsType::from_code(cmd.fctype()) != Some(FabricsType::Connect) {
            return Err(NvmeStatus::INVALID_OPCODE);
        }
        Ok(Plan::new(
            Exec::Connect,
            Dir::ToCtrl,
            CONNECT_DATA_SIZE as u32,
        ))
    }

    /// Fabrics commands on a connected admin queue.
    pub(crate) fn classify_fabrics_admin(&self, cmd: &NvmeCmd) -> Result<Plan, NvmeStatus> {
        match FabricsType::from_code(cmd.fctype()) {
            Some(FabricsType::PropertyGet) => Ok(Plan::no_data(Exec::PropertyGet)),
            Some(FabricsType::PropertySet) => Ok(Plan::no_data(Exec::PropertySet)),
            Some(FabricsType::Connect) => Err(NvmeStatus::COMMAND_SEQUENCE_ERROR),
            _ => Err(NvmeStatus::INVALID_OPCODE),
        }
    }

    /// Execute a Connect (the 1024 bytes of data are in the buffers).
    /// Sets DW0 (CNTLID, or IPO/IATTR on Invalid Parameters).
    pub(crate) fn exec_connect(&mut self, slot: u16) -> NvmeStatus {
        let si = usize::from(slot);
        let cmd = self.reqs[si].cmd;
        let cc = ConnectCmd::from_cmd(&cmd);
        let mut raw = [0u8; CONNECT_DATA_SIZE];
        self.reqs[si].bufs.copy_to_slice(&mut raw);
        let (status, dw0) = self.connect(&cc, &raw);
        self.reqs[si].dw0 = dw0;
        status
    }

    fn connect(&mut self, cc: &ConnectCmd, raw: &[u8; CONNECT_DATA_SIZE]) -> (NvmeStatus, u32) {
        let bad_sqe = |off: usize| {
            (
                NvmeStatus::CONNECT_INVALID_PARAMETERS,
                invalid_param_dw0(off as u16, false),
            )
        };
        let bad_data = |off: usize| {
            (
                NvmeStatus::CONNECT_INVALID_PARAMETERS,
                invalid_param_dw0(off as u16, true),
            )
        };
        if self.ctrlr.is_some() {
            return (NvmeStatus::COMMAND_SEQUENCE_ERROR, 0);
        }
        if cc.recfmt != 0 {
            return (NvmeStatus::CONNECT_INCOMPATIBLE_FORMAT, 0);
        }
        let data = match ConnectData::parse(raw) {
            Ok(d) => d,
            Err(WireError::BadString { what: "HOSTNQN" }) => return bad_data(data_off::HOSTNQN),
            Err(_) => return bad_data(data_off::SUBNQN),
        };
        if let Some(q) = self.params.qid {
            if q != cc.qid {
                return bad_sqe(sqe_off::QID);
            }
        }
        if cc.sqsize == 0 || u32::from(cc.sqsize) + 1 > u32::from(self.depth) {
            return bad_sqe(sqe_off::SQSIZE);
        }
        let Some(subsys) = self.target.subsystem(&data.subnqn) else {
            log::debug!("nvmf: connect to unknown subsystem {:?}", data.subnqn);
            return bad_data(data_off::SUBNQN);
        };
        if !subsys.host_allowed(&data.hostnqn) {
            log::debug!(
                "nvmf: host {} may not connect to {}",
                data.hostnqn,
                data.subnqn
            );
            return (
                NvmeStatus::CONNECT_INVALID_HOST,
                invalid_param_dw0(data_off::HOSTNQN as u16, true),
            );
        }
        // SPDK (lib/nvmf/ctrlr.c, nvmf_ctrlr_cmd_connect): a subsystem that
        // does not listen where the queue came in refuses it with SCT 1
        // SC 0x84, Connect Invalid Host.
        if !self.target.listener_allowed(&subsys, &self.params.listener) {
            log::debug!(
                "nvmf: subsystem {} does not allow host {} to connect at {}",
                data.subnqn,
                data.hostnqn,
                self.params.listener
            );
            return (NvmeStatus::CONNECT_INVALID_HOST, 0);
        }
        let ctrl = if cc.qid == 0 {
            if data.cntlid != CNTLID_DYNAMIC {
                return bad_data(data_off::CNTLID);
            }
            let kato = if subsys.is_discovery() && cc.kato == 0 {
                self.target.options().discovery_kato_ms
            } else {
                cc.kato
            };
            let core = self.reactor.core();
            let trtype = self.params.listener.trtype;
            let hostnqn = data.hostnqn.clone();
            let made = subsys.register_controller(|cntlid| {
                Controller::new(
                    cntlid,
                    Arc::clone(&subsys),
                    hostnqn,
                    data.hostid,
                    kato,
                    trtype,
                    core,
                )
            });
            let Some(ctrl) = made else {
                return (NvmeStatus::CONNECT_CONTROLLER_BUSY, 0);
            };
            self.ctrlr = Some(Arc::clone(&ctrl));
            self.qid = Some(0);
            self.arm_keep_alive(kato);
            ctrl
        } else {
            if subsys.is_discovery() {
                return bad_sqe(sqe_off::QID);
            }
            let ctrl = match subsys.controller(data.cntlid) {
                Some(c) if c.hostnqn() == data.hostnqn && !c.is_dead() => c,
                _ => return bad_data(data_off::CNTLID),
            };
            if !ctrl.is_ready() {
                return (NvmeStatus::COMMAND_SEQUENCE_ERROR, 0);
            }
            if cc.qid > ctrl.io_queues() {
                return bad_sqe(sqe_off::QID);
            }
            if u32::from(cc.sqsize) >= u32::from(self.io_depth_limit()) {
                return bad_sqe(sqe_off::SQSIZE);
            }
            if !ctrl.add_io_qid(cc.qid) {
                return (NvmeStatus::COMMAND_SEQUENCE_ERROR, 0);
            }
            ctrl.subsystem().health().register(&self.io_counters);
            self.ctrlr = Some(Arc::clone(&ctrl));
            self.qid = Some(cc.qid);
            self.refresh_ns_view();
            ctrl
        };
        self.sq_entries = cc.sqsize + 1;
        self.sqhd = 0;
        self.sqflow_disabled = cc.sq_flow_disabled();
        log::debug!(
            "nvmf: {} connected qid {} ({} entries) to {} as controller {}",
            data.hostnqn,
            cc.qid,
            self.sq_entries,
            subsys.nqn(),
            ctrl.cntlid()
        );
        (NvmeStatus::SUCCESS, success_dw0(ctrl.cntlid()))
    }

    /// (Re)start the keep-alive timer of this admin queue's controller: a
    /// timed poller on this reactor that tears the controller down when no
    /// Keep Alive arrived for `kato_ms`. 0 stops it.
    pub(crate) fn arm_keep_alive(&mut self, kato_ms: u32) {
        // The old timer (if any) goes with its guard.
        self.keep_alive = None;
        let Some(ctrl) = self.ctrlr.clone() else {
            return;
        };
        if kato_ms == 0 {
            return;
        }
        let kato = Duration::from_millis(u64::from(kato_ms));
        let period = (kato / 2).max(KEEP_ALIVE_MIN_PERIOD);
        let last = Rc::new(Cell::new(self.reactor.now()));
        let seen = Rc::clone(&last);
        let timer = PollerGuard::timed(&self.reactor, "nvmf-keep-alive", period, move || {
            if ctrl.is_dead() {
                return PollStatus::Idle;
            }
            let Some(now) = Reactor::current().map(|r| r.now()) else {
                return PollStatus::Idle;
            };
            if now.saturating_duration_since(seen.get()) >= kato {
                log::warn!(
                    "nvmf: controller {} of {}: keep-alive timeout ({} ms), tearing it down",
                    ctrl.cntlid(),
                    ctrl.subsystem().nqn(),
                    kato.as_millis()
                );
                ctrl.keep_alive_expired();
                return PollStatus::Busy;
            }
            PollStatus::Idle
        });
        self.keep_alive = Some((timer, last));
    }

    /// A Keep Alive (or Connect) arrived: restart the countdown.
    pub(crate) fn touch_keep_alive(&self) {
        if let Some((_, last)) = &self.keep_alive {
            last.set(self.reactor.now());
        }
    }

    /// Property Get: sets DW0/DW1.
    pub(crate) fn exec_property_get(&mut self, slot: u16) -> NvmeStatus {
        let si = usize::from(slot);
        let p = PropertyCmd::from_cmd(&self.reqs[si].cmd);
        let Some(ctrl) = &self.ctrlr else {
            return NvmeStatus::COMMAND_SEQUENCE_ERROR;
        };
        let value: u64 = match (p.offset, p.size) {
            (ofst::CAP, Some(PropertySize::Eight)) => self.cap().to_u64(),
            (ofst::VS, Some(PropertySize::Four)) => u64::from(NVME_VERSION),
            (ofst::CC, Some(PropertySize::Four)) => u64::from(ctrl.cc().to_u32()),
            (ofst::CSTS, Some(PropertySize::Four)) => u64::from(ctrl.csts().to_u32()),
            _ => return NvmeStatus::INVALID_FIELD,
        };
        self.reqs[si].dw0 = value as u32;
        self.reqs[si].dw1 = (value >> 32) as u32;
        NvmeStatus::SUCCESS
    }

    /// Property Set: only CC, 4 bytes.
    pub(crate) fn exec_property_set(&mut self, slot: u16) -> NvmeStatus {
        let p = PropertyCmd::from_cmd(&self.reqs[usize::from(slot)].cmd);
        let Some(ctrl) = &self.ctrlr else {
            return NvmeStatus::COMMAND_SEQUENCE_ERROR;
        };
        match (p.offset, p.size) {
            (ofst::CC, Some(PropertySize::Four)) => {
                ctrl.set_cc(Cc::from_u32(p.value as u32));
                NvmeStatus::SUCCESS
            }
            _ => NvmeStatus::INVALID_FIELD,
        }
    }

    /// This target's CAP.
    pub(crate) fn cap(&self) -> Cap {
        conformance::cap(self.io_depth_limit())
    }

    /// The deepest I/O queue a host of this queue's controller may connect:
    /// the transport's limit within the target's (CAP.MQES + 1, MAXCMD).
    pub(crate) fn io_depth_limit(&self) -> u16 {
        let max = self.target.options().max_queue_depth;
        self.params.io_queue_depth.clamp(2.min(max), max)
    }
}
