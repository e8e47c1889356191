//! Transport identifiers: transport type, address family, address and
//! service id, as discovery log entries carry them.

use std::fmt;

/// Transport type (TRTYPE).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TrType {
    /// 1: RDMA.
    Rdma,
    /// 2: Fibre Channel.
    Fc,
    /// 3: TCP.
    Tcp,
    /// 254: intra-host loop (Linux `loop`, our loopback).
    Loop,
    /// Anything else.
    Other(u8),
}

impl TrType {
    /// The wire value.
    pub const fn code(self) -> u8 {
        match self {
            TrType::Rdma => 1,
            TrType::Fc => 2,
            TrType::Tcp => 3,
            TrType::Loop => 254,
            TrType::Other(v) => v,
        }
    }

    /// The type of a wire value.
    pub const fn from_code(v: u8) -> Self {
        match v {
            1 => TrType::Rdma,
            2 => TrType::Fc,
            3 => TrType::Tcp,
            254 => TrType::Loop,
            v => TrType::Other(v),
        }
    }
}

/// Address family (ADRFAM).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AdrFam {
    /// 1: IPv4.
    Ipv4,
    /// 2: IPv6.
    Ipv6,
    /// 3: InfiniBand.
    Ib,
    /// 4: Fibre Channel.
    Fc,
    /// 254: intra-host.
    IntraHost,
    /// Anything else.
    Other(u8),
}

impl AdrFam {
    /// The wire value.
    pub const fn code(self) -> u8 {
        match self {
            AdrFam::Ipv4 => 1,
            AdrFam::Ipv6 => 2,
            AdrFam::Ib => 3,
            AdrFam::Fc => 4,
            AdrFam::IntraHost => 254,
            AdrFam::Other(v) => v,
        }
    }

    /// The family of a wire value.
    pub const fn from_code(v: u8) -> Self {
        match v {
            1 => AdrFam::Ipv4,
            2 => AdrFam::Ipv6,
            3 => AdrFam::Ib,
            4 => AdrFam::Fc,
            254 => AdrFam::IntraHost,
            v => AdrFam::Other(v),
        }
    }
}

/// Where a listener listens: `(trtype, adrfam, traddr, trsvcid)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TransportId {
    /// Transport type.
    pub trtype: TrType,
    /// Address family.
    pub adrfam: AdrFam,
    /// Address, e.g. `192.168.1.10` (at most 256 bytes on the wire).
    pub traddr: String,
    /// Service id, e.g. `4420` (at most 32 bytes on the wire).
    pub trsvcid: String,
}

impl TransportId {
    /// An RDMA/IPv4 address.
    pub fn rdma_ipv4(traddr: impl Into<String>, trsvcid: impl Into<String>) -> Self {
        TransportId {
            trtype: TrType::Rdma,
            adrfam: AdrFam::Ipv4,
            traddr: traddr.into(),
            trsvcid: trsvcid.into(),
        }
    }

    /// A TCP/IPv4 address (NVMe/TCP).
    pub fn tcp_ipv4(traddr: impl Into<String>, trsvcid: impl Into<String>) -> Self {
        TransportId {
            trtype: TrType::Tcp,
            adrfam: AdrFam::Ipv4,
            traddr: traddr.into(),
            trsvcid: trsvcid.into(),
        }
    }

    /// A loopback address (trtype `loop`, adrfam intra-host).
    pub fn loopback(traddr: impl Into<String>) -> Self {
        TransportId {
            trtype: TrType::Loop,
            adrfam: AdrFam::IntraHost,
            traddr: traddr.into(),
            trsvcid: String::new(),
        }
    }
}

impl fmt::Display for TransportId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "trtype={} adrfam={} traddr={} trsvcid={}",
            self.trtype.code(),
            self.adrfam.code(),
            self.traddr,
            self.trsvcid
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for v in 0..=255u8 {
            assert_eq!(TrType::from_code(v).code(), v);
            assert_eq!(AdrFam::from_code(v).code(), v);
        }
        assert_eq!(TrType::Rdma.code(), 1);
        assert_eq!(TrType::Loop.code(), 254);
        let t = TransportId::rdma_ipv4("10.0.0.1", "4420");
        assert!(t.to_string().contains("traddr=10.0.0.1"));
    }
}
