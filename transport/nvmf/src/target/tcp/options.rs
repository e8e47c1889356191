//! [`TcpOptions`]: the TCP transport's knobs, with SPDK's names
//! (`nvmf_create_transport -t TCP`).

use super::super::target::TargetOptions;
use crate::spec::tcp::{Digests, MIN_MAXH2CDATA};
use crate::OptionValueError;

/// Which digests the target grants.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DigestPolicy {
    /// Grant each digest the host asks for in its ICReq (SPDK, Linux).
    #[default]
    Allow,
    /// Never enable a digest (answer the ICReq with none).
    Disable,
    /// Refuse a host that does not ask for both digests (its ICReq gets an
    /// H2C termination with "unsupported parameter" at the DGST field).
    Require,
}

impl DigestPolicy {
    /// Parse `allow`, `disable` or `require`.
    ///
    /// # Errors
    /// [`OptionValueError::DigestPolicy`] for anything else.
    pub fn parse(s: &str) -> Result<Self, OptionValueError> {
        match s {
            "allow" => Ok(DigestPolicy::Allow),
            "disable" | "none" => Ok(DigestPolicy::Disable),
            "require" => Ok(DigestPolicy::Require),
            _ => Err(OptionValueError::DigestPolicy(s.to_owned())),
        }
    }

    /// The digests granted to a host that asks for `wanted`; `None` when
    /// the host must be refused.
    pub fn grant(self, wanted: Digests) -> Option<Digests> {
        match self {
            DigestPolicy::Allow => Some(wanted),
            DigestPolicy::Disable => Some(Digests::default()),
            DigestPolicy::Require => (wanted.header && wanted.data).then_some(wanted),
        }
    }
}

/// TCP transport options. Queue depth, in-capsule data size, I/O size and
/// the data buffer pool are the target's ([`TargetOptions`]); SPDK's
/// `max_queue_depth` and `in_capsule_data_size` map there, and these
/// cap them per connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpOptions {
    /// In-capsule data accepted on I/O queues (SPDK `in_capsule_data_size`;
    /// at most the target's). Admin queues accept up to 8 KiB or this,
    /// whichever the target allows.
    pub in_capsule_data_size: u32,
    /// Most entries per queue (SPDK `max_queue_depth`; 2 up to the target's).
    pub max_queue_depth: u16,
    /// Most I/O queues one controller may connect over TCP (SPDK
    /// `max_io_qpairs_per_ctrlr`): a Connect for a higher QID is refused
    /// with Connect Invalid Parameters naming the QID field.
    pub max_io_qpairs_per_ctrlr: u16,
    /// Largest H2CData payload the target accepts (ICResp MAXH2CDATA, at
    /// least 4096); also the length of each R2T.
    pub maxh2cdata: u32,
    /// Largest C2HData payload the target sends (reads are split there).
    pub max_c2h_data: u32,
    /// Send the C2H SUCCESS flag (no CapsuleResp after a read's data) when
    /// the host disabled SQ flow control (SPDK `c2h_success`).
    pub c2h_success: bool,
    /// `SO_PRIORITY` of every accepted socket (SPDK `sock_priority`, 0..=6;
    /// 0 leaves the default).
    pub sock_priority: u8,
    /// `SO_RCVBUF` of every accepted socket, bytes (SPDK's `posix`
    /// `sock_impl_set_options recv_buf_size`); 0 leaves the kernel's
    /// default and its auto-tuning.
    pub recv_buf_size: u32,
    /// `SO_SNDBUF` of every accepted socket, bytes (`send_buf_size`); 0
    /// leaves the kernel's.
    pub send_buf_size: u32,
    /// Which digests are granted.
    pub digest: DigestPolicy,
    /// Which poll group (core) serves a new connection.
    pub placement: pollux_verbs::placement::PlacementPolicy,
    /// Most connections (queues: admin and I/O, all hosts) the transport
    /// serves at once (SPDK's RDMA `max_qpairs` name, the same limit as
    /// [`RdmaOptions::max_qpairs`](crate::target::rdma::RdmaOptions::max_qpairs)).
    /// A connection beyond it is accepted, answered (ICResp, then its
    /// Connect fails with Connect Controller Busy, SCT 1 SC 0x81) and
    /// closed, without a queue or any resource beyond its socket.
    pub max_qpairs: usize,
    /// TCP keep-alive on every accepted socket (`None`: off). Pollux's own
    /// choice, on by default: neither SPDK nor Linux's nvmet-tcp sets it.
    pub keepalive: Option<TcpKeepalive>,
    /// Most connections one poll group (core) serves at once; with
    /// least-connections placement a full group's connections go to
    /// another group, and are refused like [`max_qpairs`](Self::max_qpairs)
    /// when every group is full.
    pub max_qpairs_per_core: usize,
}

/// TCP keep-alive of the accepted sockets: the kernel probes a connection
/// that was idle for `idle`, every `interval`, and resets it once `probes`
/// went unanswered (the connection then ends as if the host had reset it,
/// and everything it held returns). So a host that vanished without a FIN
/// or a reset (power lost, a cut network) and whose controller has no NVMe
/// keep-alive to end it (KATO 0: discovery hosts, some initiators) holds its
/// queue, socket and seat for about `idle + interval * probes`, not for the
/// life of the target. A connection in use sends no probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpKeepalive {
    /// Idle time before the first probe (`TCP_KEEPIDLE`; 1 s to 32767 s).
    pub idle: std::time::Duration,
    /// Time between probes (`TCP_KEEPINTVL`; 1 s to 32767 s).
    pub interval: std::time::Duration,
    /// Unanswered probes before the reset (`TCP_KEEPCNT`; 1 to 127).
    pub probes: u32,
}

impl Default for TcpKeepalive {
    /// 60 s idle, then a probe every 10 s, 6 probes: a silent dead host is
    /// found within two minutes.
    fn default() -> Self {
        TcpKeepalive {
            idle: std::time::Duration::from_secs(60),
            interval: std::time::Duration::from_secs(10),
            probes: 6,
        }
    }
}

impl Default for TcpOptions {
    fn default() -> Self {
        TcpOptions {
            in_capsule_data_size: 4096,
            max_queue_depth: 128,
            max_io_qpairs_per_ctrlr: 127,
            maxh2cdata: 128 * 1024,
            max_c2h_data: 128 * 1024,
            c2h_success: true,
            sock_priority: 0,
            recv_buf_size: 0,
            send_buf_size: 0,
            digest: DigestPolicy::Allow,
            placement: pollux_verbs::placement::PlacementPolicy::LeastConnections,
            max_qpairs: 1024,
            max_qpairs_per_core: 1024,
            keepalive: Some(TcpKeepalive::default()),
        }
    }
}

/// Why a combination of options cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid TCP transport options: {0}")]
pub struct TcpOptionsError(pub String);

impl TcpOptions {
    /// The defaults for a transport of target `t`: the queue depth and the
    /// in-capsule data size are the default or the target's, whichever is
    /// smaller, so a configuration that sets neither always validates.
    pub fn for_target(t: &TargetOptions) -> Self {
        let d = Self::default();
        TcpOptions {
            max_queue_depth: d.max_queue_depth.min(t.max_queue_depth),
            in_capsule_data_size: d.in_capsule_data_size.min(t.in_capsule_data_size),
            ..d
        }
    }

    /// Check the options against each other and the target's.
    ///
    /// # Errors
    /// [`TcpOptionsError`] naming the option.
    pub fn validate(&self, t: &TargetOptions) -> Result<(), TcpOptionsError> {
        let bad = |m: String| Err(TcpOptionsError(m));
        if self.maxh2cdata < MIN_MAXH2CDATA {
            return bad(format!("maxh2cdata {} is under 4096", self.maxh2cdata));
        }
        if self.max_c2h_data < 512 {
            return bad(format!("max_c2h_data {} is under 512", self.max_c2h_data));
        }
        if self.sock_priority > 6 {
            return bad(format!("sock_priority {} is over 6", self.sock_priority));
        }
        if self.max_queue_depth < 2 || self.max_queue_depth > t.max_queue_depth {
            return bad(format!(
                "max_queue_depth {} must lie in 2..={} (the target's)",
                self.max_queue_depth, t.max_queue_depth
            ));
        }
        if self.max_io_qpairs_per_ctrlr == 0 {
            return bad("max_io_qpairs_per_ctrlr must be at least 1".into());
        }
        if self.max_qpairs == 0 || self.max_qpairs_per_core == 0 {
            return bad("max_qpairs and max_qpairs_per_core must be positive".into());
        }
        if let Some(k) = &self.keepalive {
            let secs = 1..=32767;
            if !secs.contains(&k.idle.as_secs()) {
                return bad(format!(
                    "keepalive idle {:?} must lie in 1..=32767 s",
                    k.idle
                ));
            }
            if !secs.contains(&k.interval.as_secs()) {
                return bad(format!(
                    "keepalive interval {:?} must lie in 1..=32767 s",
                    k.interval
                ));
            }
            if !(1..=127).contains(&k.probes) {
                return bad(format!("keepalive probes {} must lie in 1..=127", k.probes));
            }
        }
        if self.in_capsule_data_size > t.in_capsule_data_size {
            return bad(format!(
                "in_capsule_data_size {} exceeds the target's {}",
                self.in_capsule_data_size, t.in_capsule_data_size
            ));
        }
        Ok(())
    }

    /// Most in-capsule data one CapsuleCmd PDU may carry before the queue's
    /// Connect says which queue it is: the admin size (8 KiB, what Linux
    /// hosts assume) or the I/O size, whichever is larger. The core then
    /// refuses data over its own in-capsule size with a command status.
    pub(crate) fn capsule_limit(&self) -> u32 {
        self.in_capsule_data_size
            .max(crate::spec::tcp::ADMIN_ICD_SIZE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_policies_grant_what_they_say() {
        let both = Digests {
            header: true,
            data: true,
        };
        let hdr = Digests {
            header: true,
            data: false,
        };
        assert_eq!(DigestPolicy::Allow.grant(hdr), Some(hdr));
        assert_eq!(DigestPolicy::Disable.grant(both), Some(Digests::default()));
        assert_eq!(DigestPolicy::Require.grant(hdr), None);
        assert_eq!(DigestPolicy::Require.grant(both), Some(both));
        assert_eq!(DigestPolicy::parse("require"), Ok(DigestPolicy::Require));
        assert!(DigestPolicy::parse("sometimes").is_err());
    }

    #[test]
    fn defaults_for_a_smaller_target_validate() {
        let t = TargetOptions {
            max_queue_depth: 64,
            in_capsule_data_size: 1024,
            ..TargetOptions::default()
        };
        assert!(TcpOptions::default().validate(&t).is_err());
        let o = TcpOptions::for_target(&t);
        assert_eq!((o.max_queue_depth, o.in_capsule_data_size), (64, 1024));
        assert!(o.validate(&t).is_ok());
    }

    #[test]
    fn options_that_cannot_work_are_named() {
        let t = TargetOptions::default();
        assert!(TcpOptions::default().validate(&t).is_ok());
        for (o, what) in [
            (
                TcpOptions {
                    maxh2cdata: 1024,
                    ..TcpOptions::default()
                },
                "maxh2cdata",
            ),
            (
                TcpOptions {
                    sock_priority: 7,
                    ..TcpOptions::default()
                },
                "sock_priority",
            ),
            (
                TcpOptions {
                    keepalive: Some(TcpKeepalive {
                        idle: std::time::Duration::from_millis(500),
                        ..TcpKeepalive::default()
                    }),
                    ..TcpOptions::default()
                },
                "keepalive idle",
            ),
            (
                TcpOptions {
                    keepalive: Some(TcpKeepalive {
                        probes: 0,
                        ..TcpKeepalive::default()
                    }),
                    ..TcpOptions::default()
                },
                "keepalive probes",
            ),
            (
                TcpOptions {
                    max_queue_depth: 1024,
                    ..TcpOptions::default()
                },
                "max_queue_depth",
            ),
            (
                TcpOptions {
                    in_capsule_data_size: 65536,
                    ..TcpOptions::default()
                },
                "in_capsule_data_size",
            ),
            (
                TcpOptions {
                    max_io_qpairs_per_ctrlr: 0,
                    ..TcpOptions::default()
                },
                "max_io_qpairs_per_ctrlr",
            ),
            (
                TcpOptions {
                    max_qpairs: 0,
                    ..TcpOptions::default()
                },
                "max_qpairs",
            ),
            (
                TcpOptions {
                    max_qpairs_per_core: 0,
                    ..TcpOptions::default()
                },
                "max_qpairs_per_core",
            ),
        ] {
            let e = o.validate(&t).expect_err(what);
            assert!(e.to_string().contains(what), "{e}");
        }
    }
}
