//! Operational parameters (RFC 7143 §13, RFC 7145 §6): defaults, the
//! target's offer, and key-by-key negotiation with the result functions of
//! each key.

use crate::pdu::text::{bool_str, parse_bool, parse_number, push_pair};

/// Smallest legal data segment / burst length.
pub const MIN_LEN: u32 = 512;
/// Largest legal data segment / burst length (2^24 − 1).
pub const MAX_LEN: u32 = 0x00FF_FFFF;

/// The values the target offers (its limits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetLimits {
    /// MaxBurstLength.
    pub max_burst: u32,
    /// FirstBurstLength.
    pub first_burst: u32,
    /// The target wants InitialR2T (OR).
    pub initial_r2t: bool,
    /// The target accepts ImmediateData (AND).
    pub immediate_data: bool,
    /// TargetRecvDataSegmentLength (iSER) / MaxRecvDataSegmentLength (TCP).
    pub recv_dsl: u32,
    /// Commands per session window (queue depth).
    pub queue_depth: u32,
    /// DefaultTime2Wait.
    pub time2wait: u16,
    /// DefaultTime2Retain.
    pub time2retain: u16,
    /// Whether this portal is iSER (RDMAExtensions=Yes).
    pub rdma: bool,
    /// MaxOutstandingUnexpectedPDUs the target declares when the initiator
    /// sends the key (RFC 7145 §6.4, declarative): how many unexpected
    /// PDUs (immediate PDUs, see [`SessionParams::target_unexpected_pdus`])
    /// it can have outstanding per connection. 0 or at least 2.
    pub max_unexpected_pdus: u32,
}

impl Default for TargetLimits {
    fn default() -> Self {
        TargetLimits {
            max_burst: 1 << 20,
            first_burst: 64 << 10,
            // InitialR2T=Yes (the RFC 7143 default, and LIO's): the
            // initiator sends no unsolicited Data-Out; everything past the
            // immediate data is solicited (an RDMA READ on iSER). A common
            // iSER initiator crashed on its first write larger than the
            // immediate data with InitialR2T=No.
            initial_r2t: true,
            immediate_data: true,
            recv_dsl: 8192,
            queue_depth: 128,
            time2wait: 2,
            time2retain: 0,
            rdma: true,
            max_unexpected_pdus: 8,
        }
    }
}

/// The negotiated session and connection parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionParams {
    /// MaxBurstLength.
    pub max_burst: u32,
    /// FirstBurstLength.
    pub first_burst: u32,
    /// InitialR2T.
    pub initial_r2t: bool,
    /// ImmediateData.
    pub immediate_data: bool,
    /// MaxOutstandingR2T.
    pub max_outstanding_r2t: u32,
    /// DataPDUInOrder.
    pub data_pdu_in_order: bool,
    /// DataSequenceInOrder.
    pub data_seq_in_order: bool,
    /// ErrorRecoveryLevel.
    pub erl: u8,
    /// DefaultTime2Wait.
    pub time2wait: u16,
    /// DefaultTime2Retain.
    pub time2retain: u16,
    /// MaxConnections.
    pub max_connections: u16,
    /// RDMAExtensions.
    pub rdma_extensions: bool,
    /// What the target may put in one PDU's data segment
    /// (InitiatorRecvDataSegmentLength on iSER, else the initiator's
    /// MaxRecvDataSegmentLength).
    pub target_send_dsl: u32,
    /// What the initiator may put in one PDU's data segment
    /// (TargetRecvDataSegmentLength / the target's MaxRecvDataSegmentLength).
    pub initiator_send_dsl: u32,
    /// MaxOutstandingUnexpectedPDUs the initiator declared: the unexpected
    /// PDUs it can receive from the target (0 = no limit). The target sends
    /// none (no target-initiated NOP-In, no Async Message), so it is
    /// always respected.
    pub max_unexpected_pdus: u32,
    /// MaxOutstandingUnexpectedPDUs the target declared in its answer: the
    /// unexpected PDUs the initiator may have outstanding at the target
    /// (0 = not declared, no limit). Unexpected are the PDUs the CmdSN
    /// window does not bound: immediate commands (I bit: NOP-Out with a
    /// valid ITT, SCSI Command, Task Management, Text, Logout), each
    /// outstanding until its response. The connection enforces it.
    pub target_unexpected_pdus: u32,
}

impl Default for SessionParams {
    /// RFC defaults (RFC 7145 defaults for the iSER keys).
    fn default() -> Self {
        SessionParams {
            max_burst: 262_144,
            first_burst: 65_536,
            initial_r2t: true,
            immediate_data: true,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_seq_in_order: true,
            erl: 0,
            time2wait: 2,
            time2retain: 20,
            max_connections: 1,
            rdma_extensions: false,
            target_send_dsl: 8192,
            initiator_send_dsl: 8192,
            max_unexpected_pdus: 0,
            target_unexpected_pdus: 0,
        }
    }
}

/// A key the negotiation could not accept: login fails with
/// initiator error (2/0) naming it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError(pub String);

fn num_in(v: &str, lo: u64, hi: u64) -> Option<u64> {
    parse_number(v).filter(|n| (lo..=hi).contains(n))
}

/// Which keys this side already answered (so each appears once).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Answered {
    bits: u32,
}

impl SessionParams {
    /// Negotiate one operational key offered by the initiator and append
    /// the target's answer to `out`. Returns `Ok(false)` for keys that are
    /// not operational (the login layer handles those).
    ///
    /// # Errors
    /// [`KeyError`] for a value out of range or with no acceptable choice.
    pub fn negotiate(
        &mut self,
        key: &str,
        value: &str,
        ours: &TargetLimits,
        out: &mut Vec<u8>,
    ) -> Result<bool, KeyError> {
        let bad = || KeyError(format!("{key}={value}"));
        let lenv = || num_in(value, u64::from(MIN_LEN), u64::from(MAX_LEN)).map(|n| n as u32);
        match key {
            "HeaderDigest" | "DataDigest" => {
                if value.split(',').any(|v| v == "None") {
                    push_pair(out, key, "None");
                } else {
                    return Err(bad());
                }
            }
            "MaxRecvDataSegmentLength" => {
                self.target_send_dsl = lenv().ok_or_else(bad)?;
                push_pair(out, key, &ours.recv_dsl.to_string());
                self.initiator_send_dsl = ours.recv_dsl;
            }
            "InitiatorRecvDataSegmentLength" => {
                self.target_send_dsl = lenv().ok_or_else(bad)?;
                push_pair(out, key, value);
            }
            "TargetRecvDataSegmentLength" => {
                let v = lenv().ok_or_else(bad)?.min(ours.recv_dsl);
                self.initiator_send_dsl = v;
                push_pair(out, key, &v.to_string());
            }
            "MaxBurstLength" => {
                self.max_burst = lenv().ok_or_else(bad)?.min(ours.max_burst);
                push_pair(out, key, &self.max_burst.to_string());
            }
            "FirstBurstLength" => {
                // Never above the target's MaxBurstLength (RFC 7143
                // §13.14): the answer must be what `finish` keeps.
                let ours_first = ours.first_burst.min(ours.max_burst);
                self.first_burst = lenv().ok_or_else(bad)?.min(ours_first);
                push_pair(out, key, &self.first_burst.to_string());
            }
            "InitialR2T" => {
                self.initial_r2t = parse_bool(value).ok_or_else(bad)? || ours.initial_r2t;
                push_pair(out, key, bool_str(self.initial_r2t));
            }
            "ImmediateData" => {
                self.immediate_data = parse_bool(value).ok_or_else(bad)? && ours.immediate_data;
                push_pair(out, key, bool_str(self.immediate_data));
            }
            "DataPDUInOrder" => {
                // OR (RFC 7143 §13.18); we only do in-order.
                parse_bool(value).ok_or_else(bad)?;
                self.data_pdu_in_order = true;
                push_pair(out, key, "Yes");
            }
            "DataSequenceInOrder" => {
                parse_bool(value).ok_or_else(bad)?;
                self.data_seq_in_order = true;
                push_pair(out, key, "Yes");
            }
            "MaxOutstandingR2T" => {
                num_in(value, 1, 65535).ok_or_else(bad)?;
                self.max_outstanding_r2t = 1;
                push_pair(out, key, "1");
            }
            "ErrorRecoveryLevel" => {
                num_in(value, 0, 2).ok_or_else(bad)?;
                self.erl = 0;
                push_pair(out, key, "0");
            }
            "DefaultTime2Wait" => {
                let v = num_in(value, 0, 3600).ok_or_else(bad)? as u16;
                self.time2wait = v.max(ours.time2wait);
                push_pair(out, key, &self.time2wait.to_string());
            }
            "DefaultTime2Retain" => {
                let v = num_in(value, 0, 3600).ok_or_else(bad)? as u16;
                self.time2retain = v.min(ours.time2retain);
                push_pair(out, key, &self.time2retain.to_string());
            }
            "MaxConnections" => {
                num_in(value, 1, 65535).ok_or_else(bad)?;
                self.max_connections = 1;
                push_pair(out, key, "1");
            }
            "IFMarker" | "OFMarker" => {
                parse_bool(value).ok_or_else(bad)?;
                push_pair(out, key, "No");
            }
            "RDMAExtensions" => {
                self.rdma_extensions = parse_bool(value).ok_or_else(bad)? && ours.rdma;
                push_pair(out, key, bool_str(self.rdma_extensions));
            }
            "MaxOutstandingUnexpectedPDUs" => {
                let v = parse_number(value)
                    .filter(|&n| n == 0 || (2..=u64::from(u32::MAX)).contains(&n))
                    .ok_or_else(bad)?;
                self.max_unexpected_pdus = v as u32;
                // Declarative: answer with our own declaration (what the
                // target can receive), not an echo of the initiator's.
                let ours = match ours.max_unexpected_pdus {
                    0 => 0,
                    n => n.max(2),
                };
                self.target_unexpected_pdus = ours;
                push_pair(out, key, &ours.to_string());
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Make the result consistent after negotiation
    /// (FirstBurstLength ≤ MaxBurstLength).
    pub fn finish(&mut self) {
        self.first_burst = self.first_burst.min(self.max_burst);
    }

    /// Initiator side: the keys of a normal iSER session's first login
    /// request (what open-iscsi sends, `iser-iscsi.md` §7.3).
    pub fn initiator_offer(out: &mut Vec<u8>, recv_dsl: u32, max_burst: u32, first_burst: u32) {
        for (k, v) in [
            ("HeaderDigest", "None"),
            ("DataDigest", "None"),
            ("DefaultTime2Wait", "2"),
            ("DefaultTime2Retain", "0"),
            ("IFMarker", "No"),
            ("OFMarker", "No"),
            ("ErrorRecoveryLevel", "0"),
            ("InitialR2T", "No"),
            ("ImmediateData", "Yes"),
            ("MaxOutstandingR2T", "1"),
            ("MaxConnections", "1"),
            ("DataPDUInOrder", "Yes"),
            ("DataSequenceInOrder", "Yes"),
            ("RDMAExtensions", "Yes"),
        ] {
            push_pair(out, k, v);
        }
        push_pair(out, "MaxBurstLength", &max_burst.to_string());
        push_pair(out, "FirstBurstLength", &first_burst.to_string());
        push_pair(out, "InitiatorRecvDataSegmentLength", &recv_dsl.to_string());
        push_pair(out, "TargetRecvDataSegmentLength", "8192");
    }

    /// Initiator side: apply one key of the target's answer.
    ///
    /// # Errors
    /// [`KeyError`] for a value out of range or a result this initiator
    /// refuses (RDMAExtensions=No, ERL ≠ 0, MaxConnections ≠ 1,
    /// NotUnderstood/Reject for a key it needs).
    pub fn apply_answer(&mut self, key: &str, value: &str) -> Result<(), KeyError> {
        let bad = || KeyError(format!("{key}={value}"));
        let lenv = || num_in(value, u64::from(MIN_LEN), u64::from(MAX_LEN)).map(|n| n as u32);
        match key {
            "HeaderDigest" | "DataDigest" if value != "None" => return Err(bad()),
            "MaxBurstLength" => self.max_burst = lenv().ok_or_else(bad)?,
            "FirstBurstLength" => self.first_burst = lenv().ok_or_else(bad)?,
            "InitialR2T" => self.initial_r2t = parse_bool(value).ok_or_else(bad)?,
            "ImmediateData" => self.immediate_data = parse_bool(value).ok_or_else(bad)?,
            "RDMAExtensions" => {
                self.rdma_extensions = parse_bool(value).ok_or_else(bad)?;
                if !self.rdma_extensions {
                    return Err(bad());
                }
            }
            "ErrorRecoveryLevel" if value != "0" => return Err(bad()),
            "MaxConnections" if value != "1" => return Err(bad()),
            "TargetRecvDataSegmentLength" | "MaxRecvDataSegmentLength" => {
                self.initiator_send_dsl = lenv().ok_or_else(bad)?
            }
            "InitiatorRecvDataSegmentLength" => self.target_send_dsl = lenv().ok_or_else(bad)?,
            "DefaultTime2Wait" => self.time2wait = num_in(value, 0, 3600).ok_or_else(bad)? as u16,
            "DefaultTime2Retain" => {
                self.time2retain = num_in(value, 0, 3600).ok_or_else(bad)? as u16
            }
            _ if value == "NotUnderstood" || value == "Reject" => return Err(bad()),
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pdu::text::parse_text;

    fn answer(key: &str, value: &str) -> (Result<bool, KeyError>, SessionParams, String) {
        let mut p = SessionParams::default();
        let mut out = Vec::new();
        let r = p.negotiate(key, value, &TargetLimits::default(), &mut out);
        let text = parse_text(&out)
            .unwrap()
            .first()
            .map(|(_, v)| v.to_string())
            .unwrap_or_default();
        (r, p, text)
    }

    #[test]
    fn result_functions() {
        assert_eq!(answer("MaxBurstLength", "16776192").2, "1048576");
        assert_eq!(answer("MaxBurstLength", "4096").2, "4096");
        assert_eq!(answer("FirstBurstLength", "262144").2, "65536");
        // The default target wants InitialR2T=Yes: OR gives Yes.
        assert_eq!(answer("InitialR2T", "No").2, "Yes");
        assert_eq!(answer("InitialR2T", "Yes").2, "Yes");
        assert_eq!(answer("ImmediateData", "No").2, "No");
        assert_eq!(answer("ErrorRecoveryLevel", "2").2, "0");
        assert_eq!(answer("MaxConnections", "8").2, "1");
        assert_eq!(answer("DefaultTime2Wait", "0").2, "2");
        assert_eq!(answer("DefaultTime2Retain", "20").2, "0");
        assert_eq!(answer("HeaderDigest", "CRC32C,None").2, "None");
        assert_eq!(answer("RDMAExtensions", "Yes").2, "Yes");
        assert_eq!(answer("RDMAExtensions", "No").2, "No");
        let (_, p, v) = answer("InitiatorRecvDataSegmentLength", "262144");
        assert_eq!((p.target_send_dsl, v.as_str()), (262144, "262144"));
        let (_, p, v) = answer("TargetRecvDataSegmentLength", "65536");
        assert_eq!((p.initiator_send_dsl, v.as_str()), (8192, "8192"));
        assert_eq!(answer("TargetAlias", "x").0, Ok(false));
    }

    #[test]
    fn initial_r2t_defaults_to_yes_and_negotiates_by_or() {
        assert!(TargetLimits::default().initial_r2t);
        let no = TargetLimits {
            initial_r2t: false,
            ..TargetLimits::default()
        };
        for (ours, theirs, result) in [
            (&no, "No", "No"),
            (&no, "Yes", "Yes"),
            (&TargetLimits::default(), "No", "Yes"),
            (&TargetLimits::default(), "Yes", "Yes"),
        ] {
            let mut p = SessionParams::default();
            let mut out = Vec::new();
            assert_eq!(p.negotiate("InitialR2T", theirs, ours, &mut out), Ok(true));
            assert_eq!(parse_text(&out).unwrap()[0].1, result, "{theirs}");
            assert_eq!(p.initial_r2t, result == "Yes");
        }
    }

    #[test]
    fn first_burst_answer_never_exceeds_the_max_burst_answer() {
        // RFC 7143 §13.14: FirstBurstLength MUST NOT exceed MaxBurstLength.
        // A target whose MaxBurstLength is below its FirstBurstLength
        // answers open-iscsi's offer with a FirstBurstLength the burst
        // allows, not one the initiator would send and the target refuse.
        let limits = TargetLimits {
            max_burst: 32768,
            first_burst: 65536,
            ..TargetLimits::default()
        };
        let mut offer = Vec::new();
        SessionParams::initiator_offer(&mut offer, 262144, 16776192, 262144);
        let mut p = SessionParams::default();
        let mut out = Vec::new();
        for (k, v) in parse_text(&offer).unwrap() {
            p.negotiate(k, v, &limits, &mut out).unwrap();
        }
        p.finish();
        let ans = parse_text(&out).unwrap();
        assert!(ans.contains(&("MaxBurstLength", "32768")));
        assert!(ans.contains(&("FirstBurstLength", "32768")), "{ans:?}");
        assert_eq!((p.max_burst, p.first_burst), (32768, 32768));
    }

    #[test]
    fn unexpected_pdus_is_declarative() {
        // The initiator declares what it can receive; the target answers
        // with its own limit (not the echo), which it then enforces.
        let (r, p, v) = answer("MaxOutstandingUnexpectedPDUs", "64");
        assert_eq!(r, Ok(true));
        assert_eq!((p.max_unexpected_pdus, p.target_unexpected_pdus), (64, 8));
        assert_eq!(v, "8");
        let (_, p, v) = answer("MaxOutstandingUnexpectedPDUs", "0");
        assert_eq!((p.max_unexpected_pdus, p.target_unexpected_pdus), (0, 8));
        assert_eq!(v, "8");
        let limits = TargetLimits {
            max_unexpected_pdus: 0,
            ..TargetLimits::default()
        };
        let mut p = SessionParams::default();
        let mut out = Vec::new();
        p.negotiate("MaxOutstandingUnexpectedPDUs", "4", &limits, &mut out)
            .unwrap();
        assert_eq!(parse_text(&out).unwrap()[0].1, "0", "no limit declared");
        assert_eq!(p.target_unexpected_pdus, 0);
        // Not sent by the initiator: nothing declared, nothing enforced.
        assert_eq!(SessionParams::default().target_unexpected_pdus, 0);
    }

    #[test]
    fn out_of_range_values_fail() {
        for (k, v) in [
            ("MaxBurstLength", "511"),
            ("MaxBurstLength", "16777216"),
            ("FirstBurstLength", "abc"),
            ("InitialR2T", "yes"),
            ("ErrorRecoveryLevel", "3"),
            ("MaxConnections", "0"),
            ("DefaultTime2Wait", "3601"),
            ("HeaderDigest", "CRC32C"),
            ("InitiatorRecvDataSegmentLength", "100"),
            ("MaxOutstandingUnexpectedPDUs", "1"),
        ] {
            assert!(answer(k, v).0.is_err(), "{k}={v}");
        }
    }

    #[test]
    fn initiator_side_round_trip() {
        let mut offer = Vec::new();
        SessionParams::initiator_offer(&mut offer, 262144, 16776192, 262144);
        let mut tp = SessionParams::default();
        let mut ans = Vec::new();
        for (k, v) in parse_text(&offer).unwrap() {
            assert_eq!(
                tp.negotiate(k, v, &TargetLimits::default(), &mut ans),
                Ok(true),
                "{k}"
            );
        }
        let mut ip = SessionParams::default();
        for (k, v) in parse_text(&ans).unwrap() {
            ip.apply_answer(k, v).unwrap();
        }
        assert_eq!(ip.max_burst, tp.max_burst);
        assert_eq!(ip.first_burst, 65536);
        assert!(ip.initial_r2t && ip.immediate_data && ip.rdma_extensions);
        assert_eq!(ip.initiator_send_dsl, 8192);
        assert!(ip.apply_answer("RDMAExtensions", "No").is_err());
        assert!(ip.apply_answer("Foo", "NotUnderstood").is_err());
    }
}
