//! A soft connect request detached from the core that received it
//! ([`CmId::detach`](crate::provider::CmId::detach)): the CM socket and the
//! request (its data, its fds, peer arenas mapped so far) as owned values,
//! so it is `Send` without any `unsafe` (the trait's `Send` bound checks
//! it). The core that attaches it builds a
//! fresh passive connection on its own device; the QP it accepts with
//! (its own PD, CQs, SRQ) ships that device's arenas to the peer, and the
//! peer's arenas announced after the request are still queued on the
//! socket and are mapped there.
//!
//! Dropped without being attached, it sends a consumer reject (no private
//! data) and closes the socket: the peer sees `Rejected`.

use super::cm::{drain, send_msg, Conn, RequestParts, SoftCmId};
use super::device::SoftDevice;
use super::wire::Msg;
use super::Soft;
use crate::cm::{
    ConnRequestInfo, PrivateData, CONNECT_PRIVATE_DATA_MAX, REJECT_PRIVATE_DATA_MAX,
    REJECT_REASON_CONSUMER,
};
use crate::error::VerbsError;
use crate::provider::PendingConn;

/// A detached soft connect request (`Send`; see the module docs).
pub struct SoftPendingConn {
    /// `None` once attached (nothing left to reject on drop).
    parts: Option<RequestParts>,
    request: ConnRequestInfo,
}

impl std::fmt::Debug for SoftPendingConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftPendingConn")
            .field("request", &self.request)
            .finish_non_exhaustive()
    }
}

impl SoftPendingConn {
    pub(super) fn new(parts: RequestParts) -> SoftPendingConn {
        let h = parts.hello;
        let n = usize::from(h.pdata_len).min(CONNECT_PRIVATE_DATA_MAX);
        let request = ConnRequestInfo {
            private_data: PrivateData::padded(&h.pdata[..n], CONNECT_PRIVATE_DATA_MAX)
                .unwrap_or(PrivateData::EMPTY),
            responder_resources: h.initiator_depth,
            initiator_depth: h.responder_resources,
            rnr_retry_count: h.rnr_retry,
            qp_num: h.qp_num,
        };
        SoftPendingConn {
            parts: Some(parts),
            request,
        }
    }
}

impl PendingConn<Soft> for SoftPendingConn {
    fn request(&self) -> &ConnRequestInfo {
        &self.request
    }

    fn attach(mut self, dev: &SoftDevice) -> Result<SoftCmId, VerbsError> {
        // Every soft device is the one device `soft0`: any core's will do.
        let parts = self
            .parts
            .take()
            .ok_or(VerbsError::CmState("the request was attached already"))?;
        Ok(SoftCmId(Conn::from_parts(dev, parts)))
    }
}

impl Drop for SoftPendingConn {
    fn drop(&mut self) {
        let Some(p) = self.parts.take() else {
            return;
        };
        let rej = Msg::Rej {
            reason: REJECT_REASON_CONSUMER,
            pdata_len: 0,
            pdata: [0; REJECT_PRIVATE_DATA_MAX],
        };
        if let Err(e) = send_msg(&p.sock, &rej, &[]) {
            log::debug!("soft verbs: rejecting a dropped connect request: {e}");
        }
        drain(&p.sock);
        // The socket, the request's fds and the arenas close here: the
        // peer reads the reject, then the hang-up.
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::cm::{CmAddr, CmEvent, ConnParam};
    use crate::conformance::spin;
    use crate::provider::{CmId, CmListener, Device, ProtectionDomain, Provider, QpInit};
    use crate::soft::SOFT_DEVICE_NAME;
    use crate::types::QpCaps;

    #[test]
    fn a_shared_id_is_not_detached_and_a_dropped_request_is_rejected() {
        let dev = Soft::open_device(SOFT_DEVICE_NAME).unwrap();
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(16).unwrap();
        let qp = pd
            .create_qp(&QpInit {
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                caps: QpCaps::default(),
                sq_sig_all: false,
            })
            .unwrap();
        let addr = CmAddr::new(format!("@pollux-pending-test-{}", std::process::id()));
        let l = dev.listen(&addr, 4).unwrap();
        let active = dev
            .connect(&addr, &qp, &ConnParam::with_data(b"hi"))
            .unwrap();
        let id = spin(|| l.get_request().unwrap()).expect("request");
        let clone = id.clone();
        let err = id.detach().expect_err("a shared id");
        assert!(matches!(err.error, VerbsError::CmState(_)), "{err}");
        drop(clone);
        let pending = err.id.detach().expect("the only handle");
        assert_eq!(&pending.request().private_data.as_bytes()[..2], b"hi");
        drop(pending);
        match spin(|| active.get_event().unwrap()).expect("event") {
            CmEvent::Rejected { reason, .. } => assert_eq!(reason, REJECT_REASON_CONSUMER),
            e => panic!("{e:?}"),
        }
    }
}
