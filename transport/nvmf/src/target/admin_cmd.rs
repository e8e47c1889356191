//! Admin commands: Identify, Get Log Page, Set/Get Features, Asynchronous
//! Event Request, Keep Alive and Abort, for I/O and discovery controllers.
//! They run on the admin queue's reactor and take the controller's and the
//! subsystem's locks (control path).

use super::conformance::NVME_VERSION;
use super::ctrlr::ERROR_LOG_ENTRIES;
use super::health::{
    composite_temperature_k, data_units, temperature_warning, CRITICAL_TEMP_K, DEFAULT_OVER_TEMP_K,
};
use super::qpair::{ExecOutcome, QueuePair, AER_LIMIT};
use super::req::{Dir, Exec, ParkQ, Plan};
use super::subsystem::Namespace;
use crate::spec::cmd::{AbortCmd, AdminOpcode, NvmeCmd};
use crate::spec::cpl::NvmeStatus;
use crate::spec::features::{
    fid, num_queues_value, parse_num_queues, FeatureCmd, AEN_DISCOVERY_CHANGE, AEN_NS_ATTR,
};
use crate::spec::identify::{
    cns, encode_ns_id_descriptors, encode_ns_list, IdentifyCmd, IdentifyController,
    IdentifyNamespace, LbaFormat, NsIdDescriptor, OptimalIo, CMIC_MULTI_CTRL, CNTRLTYPE_DISCOVERY,
    CNTRLTYPE_IO, CTRATT_HOSTID_128, DPC_PI_LAST, FLBAS_EXTENDED, IDENTIFY_DATA_SIZE,
    LPA_CMD_EFFECTS, LPA_EXTENDED, NSFEAT_OPTPERF, ONCS_DSM, ONCS_WRITE_ZEROES, SGLS_KEYED,
    SGLS_OFFSET, SGLS_SUPPORTED, VWC_NO_BROADCAST_FLUSH, VWC_PRESENT,
};
use crate::spec::log_page::{
    encode_changed_ns_list, lid, GetLogPageCmd, SmartLog, CHANGED_NS_LIST_SIZE,
    ERROR_LOG_ENTRY_SIZE, SMART_LOG_SIZE,
};
use crate::spec::transport_id::TrType;

/// Host identifier size (Get Features 0x81 with EXHID).
const HOST_ID_SIZE: u32 = 16;
/// The preferred write and deallocate unit: 4 KiB, the page of the
/// target's data buffers and the alignment the aio backend's O_DIRECT
/// I/O needs; smaller or unaligned writes still work.
const PREFERRED_IO_BYTES: u32 = 4096;

/// Arbitration CDW11 fields: AB (bits 2:0), LPW, MPW and HPW (bytes 1-3);
/// bits 7:3 are reserved.
const ARBITRATION_FIELDS: u32 = 0xFFFF_FF07;
/// TMPSEL 1111b: every implemented sensor (Set Features only; reserved
/// for Get Features).
const TMPSEL_ALL: u32 = 0xF;

/// Temperature Threshold CDW11 of a Set (`set`) or Get Features:
/// `(under, TMPTH)` for the composite sensor (TMPSEL 0, or 1111b on a Set:
/// the composite is the only sensor implemented); `None` for another sensor
/// (this controller reports only the composite temperature), a reserved
/// TMPSEL or a reserved THSEL.
fn temp_threshold_target(cdw11: u32, set: bool) -> Option<(bool, u16)> {
    let tmpsel = (cdw11 >> 16) & 0xF;
    let thsel = (cdw11 >> 20) & 0x3;
    let composite = tmpsel == 0 || (set && tmpsel == TMPSEL_ALL);
    if !composite || thsel > 1 {
        return None;
    }
    Some((thsel == 1, cdw11 as u16))
}

impl QueuePair {
    /// Admin queue: what a command needs.
    pub(crate) fn classify_admin(&self, cmd: &NvmeCmd) -> Result<Plan, NvmeStatus> {
        if cmd.is_fabrics() {
            return self.classify_fabrics_admin(cmd);
        }
        let Some(ctrl) = &self.ctrlr else {
            return Err(NvmeStatus::COMMAND_SEQUENCE_ERROR);
        };
        let disc = ctrl.subsystem().is_discovery();
        if !ctrl.is_ready() {
            return Err(NvmeStatus::COMMAND_SEQUENCE_ERROR);
        }
        let Some(op) = AdminOpcode::from_code(cmd.opcode) else {
            return Err(NvmeStatus::INVALID_OPCODE);
        };
        let exec = Exec::Admin(op);
        match op {
            AdminOpcode::Identify => {
                let id = IdentifyCmd::from_cmd(cmd);
                let ok = match id.cns {
                    cns::CONTROLLER => true,
                    cns::NAMESPACE | cns::ACTIVE_NS_LIST | cns::NS_ID_DESCRIPTORS => !disc,
                    cns::CSI_CONTROLLER => !disc && id.csi == 0,
                    _ => false,
                };
                if !ok {
                    return Err(NvmeStatus::INVALID_FIELD);
                }
                Ok(Plan::new(exec, Dir::ToHost, IDENTIFY_DATA_SIZE as u32))
            }
            AdminOpcode::GetLogPage => {
                let g = GetLogPageCmd::from_cmd(cmd);
                let ok = if disc {
                    g.lid == lid::DISCOVERY
                } else {
                    // Not ANA (0x0C): CMIC bit 3 is clear, so the log is
                    // unsupported and answered as every unsupported LID.
                    matches!(
                        g.lid,
                        lid::ERROR
                            | lid::SMART
                            | lid::FW_SLOT
                            | lid::CHANGED_NS_LIST
                            | lid::CMD_EFFECTS
                    )
                };
                if !ok {
                    // NVMe 1.4 Get Log Page status 09h: "the log page
                    // indicated is invalid" (reserved or unsupported).
                    return Err(NvmeStatus::INVALID_LOG_PAGE);
                }
                if g.lpo % 4 != 0 || g.len() > u64::from(self.target.options().max_io_size) {
                    return Err(NvmeStatus::INVALID_FIELD);
                }
                Ok(Plan::new(exec, Dir::ToHost, g.len() as u32))
            }
            AdminOpcode::SetFeatures => {
                let f = FeatureCmd::from_cmd(cmd);
                // ONCS bit 4 is clear: no feature is saveable, and a Set
                // with SV is refused before anything changes (NVMe 1.4
                // 5.21; SPDK's nvmf_ctrlr_set_features does the same).
                if f.save {
                    return Err(NvmeStatus::FEATURE_NOT_SAVEABLE);
                }
                if f.fid == fid::HOST_IDENTIFIER {
                    return Err(NvmeStatus::COMMAND_SEQUENCE_ERROR);
                }
                // No feature set here takes data; a data buffer is
                // ignored (nvmet: `nvmet_check_data_len_lte(req, 0)`).
                Ok(Plan::no_data(exec).sgl_may_exceed())
            }
            AdminOpcode::GetFeatures => {
                let f = FeatureCmd::from_cmd(cmd);
                if f.fid == fid::HOST_IDENTIFIER {
                    if f.cdw11 & 1 == 0 {
                        return Err(NvmeStatus::INVALID_FIELD);
                    }
                    return Ok(Plan::new(exec, Dir::ToHost, HOST_ID_SIZE).sgl_may_exceed());
                }
                Ok(Plan::no_data(exec).sgl_may_exceed())
            }
            AdminOpcode::AsyncEventRequest | AdminOpcode::KeepAlive => Ok(Plan::no_data(exec)),
            AdminOpcode::Abort if !disc => Ok(Plan::no_data(exec)),
            _ => Err(NvmeStatus::INVALID_OPCODE),
        }
    }

    /// Execute an admin command.
    pub(crate) fn exec_admin(&mut self, slot: u16, op: AdminOpcode) -> ExecOutcome {
        let st = match op {
            AdminOpcode::Identify => self.exec_identify(slot),
            AdminOpcode::GetLogPage => self.exec_get_log_page(slot),
            AdminOpcode::SetFeatures => self.exec_set_features(slot),
            AdminOpcode::GetFeatures => self.exec_get_features(slot),
            AdminOpcode::KeepAlive => self.exec_keep_alive(),
            AdminOpcode::Abort => self.exec_abort(slot),
            AdminOpcode::AsyncEventRequest => return self.exec_aer(slot),
            _ => NvmeStatus::INVALID_OPCODE,
        };
        ExecOutcome::Done(st)
    }

    fn exec_identify(&mut self, slot: u16) -> NvmeStatus {
        let si = usize::from(slot);
        let id = IdentifyCmd::from_cmd(&self.reqs[si].cmd);
        let Some(ctrl) = self.ctrlr.clone() else {
            return NvmeStatus::COMMAND_SEQUENCE_ERROR;
        };
        let subsys = ctrl.subsystem();
        let mut page = [0u8; IDENTIFY_DATA_SIZE];
        match id.cns {
            cns::CONTROLLER => self.identify_controller().encode_into(&mut page),
            cns::NAMESPACE => {
                // Valid NSIDs are 1..=NN; anything else (broadcast included:
                // no namespace management) is Invalid Namespace (NVMe 1.4
                // 6.1.2; SPDK checks `nsid > max_nsid` the same way).
                if id.nsid == 0 || id.nsid > subsys.max_namespaces() {
                    return NvmeStatus::INVALID_NAMESPACE;
                }
                // An inactive valid NSID reads as zeroes (as the Linux target).
                if let Some(ns) = subsys.namespace(id.nsid) {
                    let md = ns.md_size();
                    let pi = ns.pi_type();
                    let info = IdentifyNamespace {
                        nsze: ns.num_blocks(),
                        ncap: ns.num_blocks(),
                        nuse: ns.num_blocks(),
                        nsfeat: NSFEAT_OPTPERF,
                        opt_io: self.optimal_io(&ns),
                        nmic: 1,
                        nguid: ns.nguid(),
                        eui64: ns.eui64(),
                        // Metadata travels interleaved (extended LBA):
                        // FLBAS bit 4, MC bit 0.
                        flbas: if md > 0 { FLBAS_EXTENDED } else { 0 },
                        mc: u8::from(md > 0),
                        // The one PI type of the format, in the last 8
                        // bytes of the metadata (DPS bit 3 clear, DPC bit 4).
                        dps: pi,
                        dpc: if pi > 0 {
                            (1 << (pi - 1)) | DPC_PI_LAST
                        } else {
                            0
                        },
                        lbaf: vec![LbaFormat {
                            ms: md as u16,
                            lbads: ns.block_size().trailing_zeros() as u8,
                            rp: 0,
                        }],
                        ..IdentifyNamespace::default()
                    };
                    info.encode_into(&mut page);
                }
            }
            cns::ACTIVE_NS_LIST => {
                if id.nsid >= 0xFFFF_FFFE {
                    return NvmeStatus::INVALID_NAMESPACE;
                }
                let ids = subsys
                    .namespaces()
                    .iter()
                    .map(|n| n.nsid())
                    .filter(|&n| n > id.nsid)
                    .collect::<Vec<_>>();
                encode_ns_list(ids, &mut page);
            }
            cns::NS_ID_DESCRIPTORS => {
                let Some(ns) = subsys.namespace(id.nsid) else {
                    return NvmeStatus::INVALID_NAMESPACE;
                };
                let d = [
                    NsIdDescriptor::Eui64(ns.eui64()),
                    NsIdDescriptor::Nguid(ns.nguid()),
                    NsIdDescriptor::Uuid(ns.uuid()),
                    NsIdDescriptor::Csi(0),
                ];
                encode_ns_id_descriptors(&d, &mut page);
            }
            // CSI_CONTROLLER for the NVM command set: all zero.
            _ => {}
        }
        self.reqs[si].write_data(&page);
        NvmeStatus::SUCCESS
    }

    /// The optimal-I/O hints of `ns` (0-based block counts): write and
    /// deallocate in [`PREFERRED_IO_BYTES`] units aligned to them, and
    /// write up to the largest transfer (MDTS) at once, which the target
    /// never splits.
    fn optimal_io(&self, ns: &Namespace) -> OptimalIo {
        let bs = ns.block_size().max(1);
        let unit = (PREFERRED_IO_BYTES / bs).max(1);
        let unit0 = u16::try_from(unit - 1).unwrap_or(u16::MAX);
        let nows = (self.target.options().max_io_size / bs).max(1) - 1;
        OptimalIo {
            npwg: unit0,
            npwa: unit0,
            npdg: unit0,
            npda: unit0,
            nows: u16::try_from(nows).unwrap_or(u16::MAX),
        }
    }

    /// Identify Controller data for this queue's controller.
    pub(crate) fn identify_controller(&self) -> IdentifyController {
        let opts = self.target.options();
        let (cntlid, subsys) = match &self.ctrlr {
            Some(c) => (c.cntlid(), c.subsystem().clone()),
            None => (0, self.target.discovery_subsystem().clone()),
        };
        let disc = subsys.is_discovery();
        let icd = opts.in_capsule_data_size;
        let mut sgls = SGLS_SUPPORTED;
        // Keyed SGL data blocks name remote memory (RDMA, and the loopback
        // transport that stands in for it); NVMe/TCP refuses them (see
        // `QueuePair::prepare`), so a TCP controller does not claim them
        // (as the Linux target: NVMF_KEYED_SGLS is an RDMA flag).
        if self.params.listener.trtype != TrType::Tcp {
            sgls |= SGLS_KEYED;
        }
        if icd > 0 {
            sgls |= SGLS_OFFSET;
        }
        IdentifyController {
            sn: subsys.serial().to_owned(),
            mn: subsys.model().to_owned(),
            fr: env!("CARGO_PKG_VERSION").chars().take(8).collect(),
            rab: 6,
            cmic: if disc { 0 } else { CMIC_MULTI_CTRL },
            mdts: opts.mdts(),
            cntlid,
            ver: NVME_VERSION,
            oaes: if disc {
                AEN_DISCOVERY_CHANGE
            } else {
                AEN_NS_ATTR
            },
            ctratt: CTRATT_HOSTID_128,
            cntrltype: if disc {
                CNTRLTYPE_DISCOVERY
            } else {
                CNTRLTYPE_IO
            },
            acl: 3,
            aerl: (AER_LIMIT - 1) as u8,
            frmw: 0x3,
            lpa: if disc {
                LPA_EXTENDED
            } else {
                LPA_EXTENDED | LPA_CMD_EFFECTS
            },
            elpe: (ERROR_LOG_ENTRIES - 1) as u8,
            // Non-zero from NVMe 1.2 on an I/O controller (the SMART log
            // reports a temperature); WCTEMP is the over threshold's
            // default. Reserved on a discovery controller.
            wctemp: if disc { 0 } else { DEFAULT_OVER_TEMP_K },
            cctemp: if disc { 0 } else { CRITICAL_TEMP_K },
            kas: 10,
            sqes: 0x66,
            cqes: 0x44,
            maxcmd: self.io_depth_limit(),
            nn: if disc { 0 } else { subsys.max_namespaces() },
            oncs: if disc {
                0
            } else {
                ONCS_DSM | ONCS_WRITE_ZEROES
            },
            vwc: if disc {
                0
            } else {
                VWC_PRESENT | VWC_NO_BROADCAST_FLUSH
            },
            sgls,
            subnqn: subsys.nqn().to_owned(),
            ioccsz: (64 + icd) / 16,
            iorcsz: 1,
            icdoff: 0,
            fcatt: 0,
            msdbd: 1,
            psd0_max_power: 0x9C4,
            psd0_entry_lat: 0x10,
            psd0_exit_lat: 0x4,
            ..IdentifyController::default()
        }
    }

    fn exec_get_log_page(&mut self, slot: u16) -> NvmeStatus {
        let si = usize::from(slot);
        let g = GetLogPageCmd::from_cmd(&self.reqs[si].cmd);
        let Some(ctrl) = self.ctrlr.clone() else {
            return NvmeStatus::COMMAND_SEQUENCE_ERROR;
        };
        let log: Vec<u8> = match g.lid {
            lid::ERROR => {
                let st = ctrl.lock();
                let mut v = vec![0u8; ERROR_LOG_ENTRIES * ERROR_LOG_ENTRY_SIZE];
                for (i, e) in st.error_log.iter().enumerate() {
                    let at = i * ERROR_LOG_ENTRY_SIZE;
                    v[at..at + ERROR_LOG_ENTRY_SIZE].copy_from_slice(&e.encode());
                }
                v
            }
            lid::SMART => {
                let (errs, over, under) = {
                    let st = ctrl.lock();
                    (st.error_count, st.over_temp_k, st.under_temp_k)
                };
                let h = ctrl.subsystem().health();
                let io = h.io_totals();
                let temperature = composite_temperature_k();
                SmartLog {
                    critical_warning: temperature_warning(temperature, over, under),
                    temperature,
                    available_spare: 100,
                    spare_threshold: 10,
                    data_units_read: data_units(io.read_units),
                    data_units_written: data_units(io.write_units),
                    host_reads: u128::from(io.read_cmds),
                    host_writes: u128::from(io.write_cmds),
                    ctrl_busy_minutes: u128::from(io.busy_ns / 60_000_000_000),
                    power_on_hours: u128::from(h.power_on_hours()),
                    unsafe_shutdowns: u128::from(h.unsafe_shutdowns()),
                    num_err_log_entries: u128::from(errs),
                    ..SmartLog::default()
                }
                .encode()
                .to_vec()
            }
            lid::CMD_EFFECTS => super::cmd_effects::cmd_effects_log().to_vec(),
            lid::FW_SLOT => {
                let mut v = vec![0u8; SMART_LOG_SIZE];
                v[0] = 1; // active firmware: slot 1
                let fr = env!("CARGO_PKG_VERSION").as_bytes();
                let n = fr.len().min(8);
                v[8..8 + n].copy_from_slice(&fr[..n]);
                v
            }
            lid::CHANGED_NS_LIST => {
                let mut page = [0u8; CHANGED_NS_LIST_SIZE];
                let mut st = ctrl.lock();
                encode_changed_ns_list(&st.changed_ns, st.changed_ns_overflow, &mut page);
                if !g.rae {
                    st.changed_ns.clear();
                    st.changed_ns_overflow = false;
                    st.ns_notice_masked = false;
                }
                page.to_vec()
            }
            lid::DISCOVERY => {
                let log = self
                    .target
                    .discovery_log(ctrl.hostnqn(), Some(&self.params.listener));
                if !g.rae {
                    ctrl.lock().disc_notice_masked = false;
                }
                log
            }
            _ => return NvmeStatus::INVALID_LOG_PAGE,
        };
        let Ok(lpo) = usize::try_from(g.lpo) else {
            return NvmeStatus::INVALID_FIELD;
        };
        if lpo > log.len() {
            return NvmeStatus::INVALID_FIELD;
        }
        let len = g.len() as usize;
        let mut out = vec![0u8; len];
        let n = (log.len() - lpo).min(len);
        out[..n].copy_from_slice(&log[lpo..lpo + n]);
        self.reqs[si].write_data(&out);
        NvmeStatus::SUCCESS
    }

    fn exec_set_features(&mut self, slot: u16) -> NvmeStatus {
        let si = usize::from(slot);
        let f = FeatureCmd::from_cmd(&self.reqs[si].cmd);
        let Some(ctrl) = self.ctrlr.clone() else {
            return NvmeStatus::COMMAND_SEQUENCE_ERROR;
        };
        let disc = ctrl.subsystem().is_discovery();
        match f.fid {
            fid::KEEP_ALIVE_TIMER => {
                ctrl.lock().kato_ms = f.cdw11;
                self.arm_keep_alive(f.cdw11);
                NvmeStatus::SUCCESS
            }
            fid::ASYNC_EVENT_CONFIG => {
                let supported = if disc {
                    AEN_DISCOVERY_CHANGE
                } else {
                    AEN_NS_ATTR
                };
                ctrl.lock().aec = f.cdw11 & supported;
                NvmeStatus::SUCCESS
            }
            _ if disc => NvmeStatus::INVALID_FIELD,
            fid::NUMBER_OF_QUEUES => {
                let Some((nsq, ncq)) = parse_num_queues(f.cdw11) else {
                    return NvmeStatus::INVALID_FIELD;
                };
                let max = u32::from(ctrl.subsystem().max_io_queues());
                let mut st = ctrl.lock();
                if !st.io_qids.is_empty() {
                    return NvmeStatus::COMMAND_SEQUENCE_ERROR;
                }
                let (nsq, ncq) = (nsq.min(max), ncq.min(max));
                st.io_queues = nsq.min(ncq) as u16;
                st.io_queues_set = true;
                self.reqs[si].dw0 = num_queues_value(nsq, ncq);
                NvmeStatus::SUCCESS
            }
            fid::TEMPERATURE_THRESHOLD => {
                let Some((under, k)) = temp_threshold_target(f.cdw11, true) else {
                    return NvmeStatus::INVALID_FIELD;
                };
                let mut st = ctrl.lock();
                if under {
                    st.under_temp_k = k;
                } else {
                    st.over_temp_k = k;
                }
                NvmeStatus::SUCCESS
            }
            // Power state (CDW11 bits 4:0) 0 is the only one (NPSS 0); any
            // other is Invalid Field (NVMe 1.4 5.21.1.2).
            fid::POWER_MANAGEMENT if f.cdw11 & 0x1F != 0 => NvmeStatus::INVALID_FIELD,
            fid::POWER_MANAGEMENT => NvmeStatus::SUCCESS,
            fid::ARBITRATION => {
                ctrl.lock().arbitration = f.cdw11 & ARBITRATION_FIELDS;
                NvmeStatus::SUCCESS
            }
            // The cache stays on (Get Features reports WCE 1 and writes
            // complete into it): clearing WCE cannot be honoured.
            fid::VOLATILE_WRITE_CACHE if f.cdw11 & 1 == 0 => NvmeStatus::FEATURE_NOT_CHANGEABLE,
            fid::VOLATILE_WRITE_CACHE => NvmeStatus::SUCCESS,
            _ => NvmeStatus::INVALID_FIELD,
        }
    }

    fn exec_get_features(&mut self, slot: u16) -> NvmeStatus {
        let si = usize::from(slot);
        let f = FeatureCmd::from_cmd(&self.reqs[si].cmd);
        let Some(ctrl) = self.ctrlr.clone() else {
            return NvmeStatus::COMMAND_SEQUENCE_ERROR;
        };
        let disc = ctrl.subsystem().is_discovery();
        let dw0 = match f.fid {
            fid::KEEP_ALIVE_TIMER => ctrl.kato_ms(),
            fid::ASYNC_EVENT_CONFIG => ctrl.lock().aec,
            _ if disc => return NvmeStatus::INVALID_FIELD,
            fid::NUMBER_OF_QUEUES => {
                let n = u32::from(ctrl.io_queues());
                num_queues_value(n, n)
            }
            fid::VOLATILE_WRITE_CACHE => 1,
            fid::ARBITRATION => ctrl.lock().arbitration,
            fid::POWER_MANAGEMENT => 0,
            fid::TEMPERATURE_THRESHOLD => {
                let Some((under, _)) = temp_threshold_target(f.cdw11, false) else {
                    return NvmeStatus::INVALID_FIELD;
                };
                let st = ctrl.lock();
                u32::from(if under {
                    st.under_temp_k
                } else {
                    st.over_temp_k
                })
            }
            fid::HOST_IDENTIFIER => {
                self.reqs[si].write_data(&ctrl.hostid());
                0
            }
            _ => return NvmeStatus::INVALID_FIELD,
        };
        self.reqs[si].dw0 = dw0;
        NvmeStatus::SUCCESS
    }

    fn exec_keep_alive(&mut self) -> NvmeStatus {
        let kato = self.ctrlr.as_ref().map_or(0, |c| c.kato_ms());
        if kato == 0 {
            return NvmeStatus::KEEP_ALIVE_INVALID;
        }
        self.touch_keep_alive();
        if let Some(c) = &self.ctrlr {
            c.subsystem().counters().keep_alive();
        }
        NvmeStatus::SUCCESS
    }

    fn exec_aer(&mut self, slot: u16) -> ExecOutcome {
        if self.aers.len() >= AER_LIMIT {
            return ExecOutcome::Done(NvmeStatus::AER_LIMIT_EXCEEDED);
        }
        if let Some(ev) = self.ctrlr.as_ref().and_then(|c| c.take_event()) {
            self.reqs[usize::from(slot)].dw0 = ev.to_dw0();
            return ExecOutcome::Done(NvmeStatus::SUCCESS);
        }
        self.aers.push(slot);
        ExecOutcome::Async
    }

    /// Abort: an outstanding AER of this queue can be aborted (it completes
    /// with Command Abort Requested); anything else is reported "not
    /// aborted" (DW0 bit 0 = 1), as the Linux target does for every command.
    fn exec_abort(&mut self, slot: u16) -> NvmeStatus {
        let si = usize::from(slot);
        let a = AbortCmd::from_cmd(&self.reqs[si].cmd);
        let found = (a.sqid == 0)
            .then(|| {
                self.aers
                    .iter()
                    .position(|&s| self.reqs[usize::from(s)].cmd.cid == a.cid)
            })
            .flatten();
        match found {
            Some(i) => {
                let aer = self.aers.remove(i);
                self.finish(aer, NvmeStatus::ABORT_REQUESTED);
                // Its response goes out from the next poll, never from
                // inside this command's execution.
                self.park(aer, ParkQ::Response);
                self.reqs[si].dw0 = 0;
            }
            None => self.reqs[si].dw0 = 1,
        }
        NvmeStatus::SUCCESS
    }

    /// Complete outstanding AERs with pending events.
    pub(crate) fn deliver_events(&mut self, ops: &mut dyn super::transport::QpairOps) -> bool {
        let mut did = false;
        while !self.aers.is_empty() {
            let Some(ev) = self.ctrlr.as_ref().and_then(|c| c.take_event()) else {
                break;
            };
            let slot = self.aers.remove(0);
            self.reqs[usize::from(slot)].dw0 = ev.to_dw0();
            self.finish(slot, NvmeStatus::SUCCESS);
            self.process(slot, ops);
            did = true;
        }
        did
    }
}
