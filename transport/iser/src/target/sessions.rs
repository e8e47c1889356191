//! The target's table of live sessions, for session reinstatement
//! (RFC 7143 §6.3.5) and for "Session does not exist" (0x020A) answers.
//!
//! A session is identified by its I_T nexus: InitiatorName + ISID, and
//! TargetName + portal group tag. A leading login (TSIH 0) for a nexus that
//! already has a live session reinstates it: the old session's core is
//! told, by reactor message, to close it; the new session proceeds.
//!
//! Control path only: the table is touched when a session enters full
//! feature phase and when its connection is dropped, never per I/O (the
//! `Mutex` around it is in [`IscsiTarget`](super::IscsiTarget)).

use pollux_reactor::CoreId;

/// The I_T nexus of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Nexus {
    pub(crate) initiator: String,
    pub(crate) isid: [u8; 6],
    pub(crate) target: Option<String>,
    pub(crate) tpgt: u16,
}

#[derive(Debug)]
struct Live {
    nexus: Nexus,
    tsih: u16,
    core: CoreId,
}

/// Live sessions.
#[derive(Debug, Default)]
pub(crate) struct SessionTable {
    live: Vec<Live>,
}

impl SessionTable {
    /// Record session `tsih` of `nexus` living on `core`; returns the
    /// session it reinstates (same nexus), which leaves the table.
    pub(crate) fn register(
        &mut self,
        nexus: Nexus,
        tsih: u16,
        core: CoreId,
    ) -> Option<(u16, CoreId)> {
        let old = self
            .live
            .iter()
            .position(|l| l.nexus == nexus)
            .map(|i| self.live.swap_remove(i))
            .map(|l| (l.tsih, l.core));
        self.live.push(Live { nexus, tsih, core });
        old
    }

    /// Forget session `tsih` (its connection is gone); `false` if it was
    /// not in the table (already reinstated).
    pub(crate) fn remove(&mut self, tsih: u16) -> bool {
        match self.live.iter().position(|l| l.tsih == tsih) {
            Some(i) => {
                self.live.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// Whether a live session has TSIH `tsih` and ISID `isid`.
    pub(crate) fn exists(&self, isid: [u8; 6], tsih: u16) -> bool {
        self.live
            .iter()
            .any(|l| l.tsih == tsih && l.nexus.isid == isid)
    }

    /// Whether TSIH `tsih` is in use.
    pub(crate) fn tsih_in_use(&self, tsih: u16) -> bool {
        self.live.iter().any(|l| l.tsih == tsih)
    }

    /// Live sessions.
    pub(crate) fn len(&self) -> usize {
        self.live.len()
    }

    /// What each live session is.
    pub(crate) fn list(&self) -> Vec<SessionInfo> {
        self.live
            .iter()
            .map(|l| SessionInfo {
                initiator: l.nexus.initiator.clone(),
                isid: l.nexus.isid,
                target: l.nexus.target.clone(),
                tpgt: l.nexus.tpgt,
                tsih: l.tsih,
                core: l.core,
            })
            .collect()
    }
}

/// A live session, as the management plane lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    /// InitiatorName.
    pub initiator: String,
    /// ISID.
    pub isid: [u8; 6],
    /// TargetName (`None`: a discovery session).
    pub target: Option<String>,
    /// Portal group tag it logged in on.
    pub tpgt: u16,
    /// TSIH.
    pub tsih: u16,
    /// The core its connection lives on.
    pub core: CoreId,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nexus(ini: &str, isid: u8) -> Nexus {
        Nexus {
            initiator: ini.into(),
            isid: [0x80, 0, 0, 0, 0, isid],
            target: Some("iqn.t".into()),
            tpgt: 1,
        }
    }

    #[test]
    fn same_nexus_reinstates_other_nexus_coexists() {
        let mut t = SessionTable::default();
        let c0: CoreId = 0;
        let c1: CoreId = 1;
        assert_eq!(t.register(nexus("a", 1), 5, c0), None);
        assert_eq!(t.register(nexus("a", 2), 6, c1), None, "other ISID");
        assert_eq!(t.register(nexus("b", 1), 7, c1), None, "other initiator");
        let mut other_tpg = nexus("a", 1);
        other_tpg.tpgt = 2;
        assert_eq!(t.register(other_tpg, 8, c1), None, "other portal group");
        assert_eq!(t.len(), 4);
        assert_eq!(t.register(nexus("a", 1), 9, c1), Some((5, c0)));
        assert_eq!(t.len(), 4);
        assert!(!t.tsih_in_use(5));
        assert!(!t.remove(5), "the reinstated session already left");
        assert!(t.exists([0x80, 0, 0, 0, 0, 1], 9));
        assert!(!t.exists([0x80, 0, 0, 0, 0, 2], 9), "TSIH of another ISID");
        assert!(t.remove(9));
        assert!(!t.exists([0x80, 0, 0, 0, 0, 1], 9));
    }
}
