//! Transport IDs in the form users know (SPDK's `-r`, nvme-cli's options):
//! `trtype:rdma adrfam:ipv4 traddr:192.168.1.10 trsvcid:4420 subnqn:nqn...`,
//! `trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:4420 subnqn:nqn...` for
//! NVMe/TCP, `trtype:soft traddr:pollux-tgt subnqn:nqn...` for the software
//! RDMA provider, `trtype:loop traddr:NAME` for the in-process loopback.
//!
//! Keys are case-insensitive and take `:` or `=`; values keep their case.

use std::fmt;

use super::HostError;
use crate::spec::transport_id::{AdrFam, TransportId};

/// The default NVMe-oF port.
pub const DEFAULT_TRSVCID: &str = "4420";
/// The well-known discovery NQN.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// The host NQN used when none is given.
pub const DEFAULT_HOSTNQN: &str = "nqn.2024-01.io.pollux:host";

/// Which transport a [`HostTrid`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HostTrType {
    /// RDMA over the `ibverbs` provider (`trtype:rdma`).
    Rdma,
    /// RDMA over the software provider (`trtype:soft`).
    Soft,
    /// The in-process loopback transport (`trtype:loop`).
    Loop,
    /// NVMe/TCP (`trtype:tcp`).
    Tcp,
}

/// A parsed transport ID.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostTrid {
    /// Transport.
    pub trtype: HostTrType,
    /// Address family (`ipv4` unless given).
    pub adrfam: AdrFam,
    /// Address: an IP (rdma) or a soft CM name/path (soft).
    pub traddr: String,
    /// Service id (port), `4420` unless given.
    pub trsvcid: String,
    /// Subsystem NQN (the discovery NQN when none is given).
    pub subnqn: String,
    /// Host NQN ([`DEFAULT_HOSTNQN`] unless given).
    pub hostnqn: String,
}

impl HostTrid {
    /// Parse `key:value` pairs separated by spaces.
    ///
    /// # Errors
    /// [`HostError::Trid`] for an unknown key or transport, a missing
    /// `trtype` or `traddr`, or a value that does not parse.
    pub fn parse(s: &str) -> Result<Self, HostError> {
        let mut trtype = None;
        let mut adrfam = AdrFam::Ipv4;
        let mut traddr = None;
        let mut trsvcid = DEFAULT_TRSVCID.to_string();
        let mut subnqn = DISCOVERY_NQN.to_string();
        let mut hostnqn = DEFAULT_HOSTNQN.to_string();
        for tok in s.split_whitespace() {
            let (k, v) = tok
                .split_once([':', '='])
                .ok_or_else(|| HostError::Trid(format!("'{tok}' is not key:value")))?;
            if v.is_empty() {
                return Err(HostError::Trid(format!("'{k}' has an empty value")));
            }
            match k.to_ascii_lowercase().as_str() {
                "trtype" => {
                    trtype = Some(match v.to_ascii_lowercase().as_str() {
                        "rdma" => HostTrType::Rdma,
                        "soft" => HostTrType::Soft,
                        "loop" | "loopback" => HostTrType::Loop,
                        "tcp" => HostTrType::Tcp,
                        _ => {
                            return Err(HostError::Trid(format!(
                                "unknown trtype '{v}' (rdma, tcp, soft or loop)"
                            )))
                        }
                    })
                }
                "adrfam" => {
                    adrfam = match v.to_ascii_lowercase().as_str() {
                        "ipv4" => AdrFam::Ipv4,
                        "ipv6" => AdrFam::Ipv6,
                        "ib" => AdrFam::Ib,
                        "intra_host" | "intra-host" | "local" => AdrFam::IntraHost,
                        _ => return Err(HostError::Trid(format!("unknown adrfam '{v}'"))),
                    }
                }
                "traddr" => traddr = Some(v.to_string()),
                "trsvcid" => {
                    v.parse::<u16>()
                        .map_err(|_| HostError::Trid(format!("trsvcid '{v}' is not a port")))?;
                    trsvcid = v.to_string();
                }
                "subnqn" => subnqn = v.to_string(),
                "hostnqn" => hostnqn = v.to_string(),
                _ => return Err(HostError::Trid(format!("unknown key '{k}'"))),
            }
        }
        let trtype = trtype.ok_or_else(|| HostError::Trid("trtype is missing".into()))?;
        let traddr = traddr.ok_or_else(|| HostError::Trid("traddr is missing".into()))?;
        for (what, nqn) in [("subnqn", &subnqn), ("hostnqn", &hostnqn)] {
            if !crate::spec::connect::is_valid_nqn(nqn) {
                return Err(HostError::Trid(format!(
                    "{what} '{nqn}' is not a valid NQN"
                )));
            }
        }
        if trtype == HostTrType::Soft || trtype == HostTrType::Loop {
            adrfam = AdrFam::IntraHost;
        }
        Ok(HostTrid {
            trtype,
            adrfam,
            traddr,
            trsvcid,
            subnqn,
            hostnqn,
        })
    }

    /// The connection address: `ip:port` for rdma and tcp; for soft the
    /// traddr as given when it is a path (`/…`) or an abstract name (`@…`),
    /// otherwise the abstract name `@traddr`.
    pub fn cm_addr(&self) -> String {
        match self.trtype {
            HostTrType::Rdma | HostTrType::Tcp => format!("{}:{}", self.traddr, self.trsvcid),
            HostTrType::Soft | HostTrType::Loop => {
                if self.traddr.starts_with('@') || self.traddr.starts_with('/') {
                    self.traddr.clone()
                } else {
                    format!("@{}", self.traddr)
                }
            }
        }
    }

    /// The wire transport ID (what discovery log entries carry).
    pub fn transport_id(&self) -> TransportId {
        match self.trtype {
            HostTrType::Loop => TransportId::loopback(self.traddr.clone()),
            HostTrType::Tcp => TransportId {
                adrfam: self.adrfam,
                ..TransportId::tcp_ipv4(self.traddr.clone(), self.trsvcid.clone())
            },
            _ => TransportId {
                adrfam: self.adrfam,
                ..TransportId::rdma_ipv4(self.traddr.clone(), self.trsvcid.clone())
            },
        }
    }

    /// The transport's name (`rdma`, `tcp`, `soft`, `loop`).
    pub fn trtype_name(&self) -> &'static str {
        match self.trtype {
            HostTrType::Tcp => "tcp",
            HostTrType::Rdma => "rdma",
            HostTrType::Soft => "soft",
            HostTrType::Loop => "loop",
        }
    }

    /// The same address with another subsystem NQN.
    pub fn with_subnqn(&self, subnqn: impl Into<String>) -> Self {
        HostTrid {
            subnqn: subnqn.into(),
            ..self.clone()
        }
    }
}

impl fmt::Display for HostTrid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = self.trtype_name();
        write!(
            f,
            "trtype:{t} traddr:{} trsvcid:{} subnqn:{}",
            self.traddr, self.trsvcid, self.subnqn
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::transport_id::TrType;

    #[test]
    fn spdk_style_ids_parse() {
        let t = HostTrid::parse(
            "trtype:RDMA adrfam:IPv4 traddr:192.168.1.10 trsvcid:4420 subnqn:nqn.2016-06.io.spdk:cnode1",
        )
        .unwrap();
        assert_eq!(t.trtype, HostTrType::Rdma);
        assert_eq!(t.cm_addr(), "192.168.1.10:4420");
        assert_eq!(t.subnqn, "nqn.2016-06.io.spdk:cnode1");
        assert_eq!(t.transport_id().trtype, TrType::Rdma);
        let s = HostTrid::parse("trtype=soft traddr=pollux-tgt subnqn=nqn.2024-01.io.pollux:null0")
            .unwrap();
        assert_eq!(s.cm_addr(), "@pollux-tgt");
        assert_eq!(s.trsvcid, "4420");
        assert_eq!(
            HostTrid::parse("trtype:soft traddr:/run/x")
                .unwrap()
                .cm_addr(),
            "/run/x"
        );
        assert_eq!(
            HostTrid::parse("trtype:soft traddr:@x").unwrap().subnqn,
            DISCOVERY_NQN
        );
        let t = HostTrid::parse(
            "trtype:tcp adrfam:ipv4 traddr:127.0.0.1 trsvcid:4420 subnqn:nqn.2024-01.io.pollux:d",
        )
        .unwrap();
        assert_eq!(t.trtype, HostTrType::Tcp);
        assert_eq!(t.cm_addr(), "127.0.0.1:4420");
        assert_eq!(t.transport_id().trtype, TrType::Tcp);
        assert_eq!(t.trtype_name(), "tcp");
    }

    #[test]
    fn bad_ids_are_refused_with_a_reason() {
        for bad in [
            "",
            "trtype:fc traddr:1.2.3.4",
            "trtype:rdma",
            "traddr:1.2.3.4",
            "trtype:rdma traddr:1.2.3.4 trsvcid:http",
            "trtype:rdma traddr:1.2.3.4 color:blue",
            "trtype:rdma traddr",
            "trtype:rdma traddr:1.2.3.4 subnqn:nope",
            "trtype:rdma traddr:",
        ] {
            assert!(
                matches!(HostTrid::parse(bad), Err(HostError::Trid(_))),
                "{bad}"
            );
        }
    }
}
