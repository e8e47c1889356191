//! Fabrics commands the host sends: Connect (admin and I/O queues) and
//! Property Get/Set, with the checks on their answers.

use std::time::Duration;

use pollux_reactor::mem::{DmaBuf, SgList};

use super::qpair::Qpair;
use super::transport::{DataDir, HostQueue};
use super::{HostError, InvalidParam};
use crate::spec::connect::{ConnectCmd, ConnectData, CNTLID_DYNAMIC, CONNECT_DATA_SIZE};
use crate::spec::property::{PropertyCmd, PropertySize};

/// Who the host is and what it connects to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostIdentity {
    /// Host NQN.
    pub hostnqn: String,
    /// Host identifier (a UUID).
    pub hostid: [u8; 16],
    /// Subsystem NQN.
    pub subnqn: String,
}

/// Send the Fabrics Connect for `qp` (queue `qp.qid()`, SQSIZE
/// `entries - 1`) and return the controller id.
///
/// `cntlid` is [`CNTLID_DYNAMIC`] on the admin queue, the controller's id
/// on I/O queues; `kato_ms` only matters on the admin queue.
///
/// # Errors
/// [`HostError::ConnectRefused`] with the target's reason,
/// [`HostError::Timeout`], [`HostError::Disconnected`].
pub fn connect<Q: HostQueue>(
    qp: &mut Qpair<Q>,
    who: &HostIdentity,
    cntlid: u16,
    kato_ms: u32,
    timeout: Duration,
) -> Result<u16, HostError> {
    let qid = qp.qid();
    let cc = ConnectCmd {
        recfmt: 0,
        qid,
        sqsize: qp.entries().saturating_sub(1).max(1),
        cattr: if qp.transport().disable_sq_flow() {
            crate::spec::connect::CATTR_DISABLE_SQ_FLOW
        } else {
            0
        },
        kato: if qid == 0 { kato_ms } else { 0 },
    };
    let data = ConnectData {
        hostid: who.hostid,
        cntlid: if qid == 0 { CNTLID_DYNAMIC } else { cntlid },
        subnqn: who.subnqn.clone(),
        hostnqn: who.hostnqn.clone(),
    };
    let mut buf =
        DmaBuf::alloc(CONNECT_DATA_SIZE).map_err(|e| HostError::Transport(e.to_string()))?;
    data.encode_into(
        buf.as_mut_slice()
            .try_into()
            .map_err(|_| HostError::Transport("connect buffer".into()))?,
    );
    match qp.exec(
        "Connect",
        cc.to_cmd(0),
        DataDir::ToCtrl,
        SgList::from_buf(buf),
        timeout,
    ) {
        Ok((cpl, _)) => Ok(cpl.dw0 as u16),
        Err(HostError::Nvme { status, .. }) => Err(HostError::ConnectRefused {
            qid,
            status,
            param: InvalidParam::from_completion(status, qp.last_error_dw0()),
        }),
        Err(e) => Err(e),
    }
}

/// Property Get (4 or 8 bytes) of register `offset`.
///
/// # Errors
/// As [`Qpair::exec`].
pub fn property_get<Q: HostQueue>(
    qp: &mut Qpair<Q>,
    offset: u32,
    size: PropertySize,
    timeout: Duration,
) -> Result<u64, HostError> {
    let cmd = PropertyCmd::get(offset, size, 0);
    let (cpl, _) = qp.exec("Property Get", cmd, DataDir::None, SgList::new(), timeout)?;
    Ok(match size {
        PropertySize::Four => u64::from(cpl.dw0),
        _ => cpl.result64(),
    })
}

/// Property Set (4 bytes) of register `offset`.
///
/// # Errors
/// As [`Qpair::exec`].
pub fn property_set<Q: HostQueue>(
    qp: &mut Qpair<Q>,
    offset: u32,
    value: u32,
    timeout: Duration,
) -> Result<(), HostError> {
    let cmd = PropertyCmd::set(offset, PropertySize::Four, u64::from(value), 0);
    qp.exec("Property Set", cmd, DataDir::None, SgList::new(), timeout)?;
    Ok(())
}
