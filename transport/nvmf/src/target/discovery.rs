//! The discovery log page: what a host sees through the discovery
//! subsystem (`nqn.2014-08.org.nvmexpress.discovery`).

use super::target::Target;
use crate::spec::connect::CNTLID_DYNAMIC;
use crate::spec::log_page::{
    DiscoveryLogEntry, DiscoveryLogHeader, DISCOVERY_RECORD_SIZE, SUBTYPE_CURRENT_DISCOVERY,
    SUBTYPE_NVME, TREQ_DEFAULT,
};
use crate::spec::rdma_cm::ADMIN_QUEUE_MAX_DEPTH;
use crate::spec::transport_id::TransportId;

use super::subsystem::DISCOVERY_NQN;

/// The whole log for `hostnqn` (header + entries), control path.
///
/// Order (as the Linux target): the current discovery subsystem at the
/// listener the host came through, then each NVM subsystem the host may
/// access, once per listener of that subsystem
/// ([`Target::listeners_of`]: its own, then the target-wide ones).
pub(crate) fn build_log(target: &Target, hostnqn: &str, current: Option<&TransportId>) -> Vec<u8> {
    let listeners = target.listeners();
    let transports = target.transports();
    let tsas = |trid: &TransportId| {
        transports
            .iter()
            .find(|t| t.trtype() == trid.trtype)
            .and_then(|t| t.rdma_tsas(trid))
    };
    let entry = |subtype: u8, nqn: &str, l: &super::target::Listener| DiscoveryLogEntry {
        trtype: l.trid.trtype,
        adrfam: l.trid.adrfam,
        subtype,
        treq: TREQ_DEFAULT,
        portid: l.portid,
        cntlid: CNTLID_DYNAMIC,
        asqsz: ADMIN_QUEUE_MAX_DEPTH,
        eflags: 0,
        trsvcid: l.trid.trsvcid.clone(),
        subnqn: nqn.to_owned(),
        traddr: l.trid.traddr.clone(),
        rdma: tsas(&l.trid),
    };
    let mut entries = Vec::new();
    if let Some(cur) = current {
        if let Some(l) = listeners.iter().find(|l| &l.trid == cur) {
            entries.push(entry(SUBTYPE_CURRENT_DISCOVERY, DISCOVERY_NQN, l));
        }
    }
    for s in target.subsystems() {
        if !s.host_allowed(hostnqn) {
            continue;
        }
        for l in &target.listeners_of(&s) {
            entries.push(entry(SUBTYPE_NVME, s.nqn(), l));
        }
    }
    let header = DiscoveryLogHeader {
        genctr: target.discovery_genctr(),
        numrec: entries.len() as u64,
        recfmt: 0,
    };
    let mut out = Vec::with_capacity(DISCOVERY_RECORD_SIZE * (1 + entries.len()));
    out.extend_from_slice(&header.encode());
    for e in &entries {
        out.extend_from_slice(&e.encode());
    }
    out
}
