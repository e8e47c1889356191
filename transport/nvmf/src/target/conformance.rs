//! What this target claims to implement: the NVMe version it reports (VS
//! property and Identify Controller VER) and the capability bits that
//! follow from it.
//!
//! # Version: NVMe Base 1.4
//!
//! The target implements what 1.4 requires of a fabrics I/O controller and
//! a discovery controller: CNTRLTYPE (1 I/O, 2 discovery; must be non-zero
//! from 1.4), CTRATT (bit 0: 128-bit host identifier, the only attribute
//! supported), OAES (bit 8 namespace attribute notices on I/O controllers,
//! bit 31 discovery log change on discovery controllers), the Namespace
//! Identification Descriptor list (CNS 03h), Identify Namespace NSFEAT bit 4
//! with NPWG/NPWA/NPDG/NPDA/NOWS, the Error, SMART / Health, Firmware Slot,
//! Changed Namespace List and Commands Supported and Effects log pages (LPA
//! bit 1), VWC bits 2:1 = 10b (Flush with NSID FFFFFFFFh not supported:
//! Invalid Namespace), Keep Alive, and Dataset Management / Write Zeroes.
//!
//! It does not claim 2.0: that needs the I/O Command Set Profile feature
//! (FID 19h), Identify CNS 1Ch (I/O Command Set data structure) and CNS 08h
//! (I/O command set independent Identify Namespace), and the Supported Log
//! Pages log (LID 00h), none of which this target serves.
//!
//! # CAP.CSS bit 6 (I/O Command Set Support): cleared
//!
//! Set, it tells the host it may enable the controller with CC.CSS = 110b
//! ("all supported I/O command sets") and must then select the command sets
//! through the I/O Command Set Profile feature and Identify CNS 1Ch: 2.0
//! machinery this target does not have (in 1.4 the bit is reserved). The
//! Linux target sets it and reports 1.3; a host that believes it uses CNS
//! 1Ch and FID 19h. Only bit 0 (NVM command set) is set, and enabling with
//! CC.CSS other than 000b sets CSTS.CFS.
//!
//! # CAP.CQR (Contiguous Queues Required): set
//!
//! NVMe over Fabrics fixes it to 1 (queues are not in host memory and are
//! never created with Create I/O SQ/CQ, so the host has nothing to lay out
//! non-contiguously); SPDK sets it for that reason. The Linux target leaves
//! it 0; no fabrics host reads it.

use crate::spec::property::{Cap, CAP_CSS_NVM, VS_1_4};

/// The NVMe version this target implements (VS and Identify VER).
pub const NVME_VERSION: u32 = VS_1_4;

/// CAP.TO: 7.5 s ready timeout (500 ms units), as the Linux target.
const CAP_TO: u8 = 15;

/// CAP for a controller whose queues hold at most `max_queue_depth`
/// entries.
pub(crate) fn cap(max_queue_depth: u16) -> Cap {
    Cap {
        mqes: max_queue_depth.saturating_sub(1),
        cqr: true,
        to: CAP_TO,
        css: CAP_CSS_NVM,
        ..Cap::default()
    }
}

/// Whether CC.CSS `css` selects a command set [`cap`] advertises.
pub(crate) fn css_supported(css: u8) -> bool {
    css == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::property::CAP_CSS_IOCS;

    #[test]
    fn cap_matches_the_version() {
        let c = cap(128);
        assert_eq!(c.mqes, 127);
        assert!(c.cqr, "fabrics: contiguous queues required");
        assert_eq!(c.css & CAP_CSS_IOCS, 0, "no 2.0 I/O command set support");
        assert!(css_supported(0) && !css_supported(6));
        assert_eq!(NVME_VERSION, 0x0001_0400);
    }
}
