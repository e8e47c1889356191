//! The nvmf provider's SPDK option methods (see [`crate::options`] for
//! the rule): `nvmf_set_config` and `nvmf_set_crdt` accept SPDK's
//! defaults; `nvmf_set_max_subsystems` sets the most subsystems
//! `nvmf_create_subsystem` makes (SPDK's default, 1024, to start with;
//! the discovery subsystem does not count), refusing a limit below what
//! exists now; `sock_impl_set_options` of `posix` sets the socket buffer
//! sizes of the TCP transport `nvmf_create_transport` makes next
//! (refused with -16 once one runs: its sockets are made with the sizes
//! it started with, as SPDK takes them only before its framework starts).

use serde_json::Value;

use crate::config::ConfigEntry;
use crate::error::RpcError;
use crate::options::check;
use crate::service::{Method, StateMask};

/// SPDK's default `max_subsystems`.
pub const DEFAULT_MAX_SUBSYSTEMS: u32 = 1024;

/// The limit and the one before the last change (what undoing it
/// restores).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct MaxSubsystems {
    pub(super) now: u32,
    pub(super) before: u32,
}

impl Default for MaxSubsystems {
    fn default() -> Self {
        Self {
            now: DEFAULT_MAX_SUBSYSTEMS,
            before: DEFAULT_MAX_SUBSYSTEMS,
        }
    }
}

/// SPDK's default `recv_buf_size` and `send_buf_size` of `posix`
/// sockets: Pollux leaves the kernel's sizing for it.
pub const SPDK_SOCK_BUF: u32 = 2 * 1024 * 1024;

/// `SO_RCVBUF` and `SO_SNDBUF` for the next TCP transport (0: the
/// kernel's), and the values before the last change (what undoing it
/// restores).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct SockBuffers {
    pub(super) recv: u32,
    pub(super) send: u32,
    before: (u32, u32),
}

impl super::NvmfSubsystem {
    /// `sock_impl_set_options`.
    fn set_sock_options(&self, p: Option<Value>) -> Result<Value, RpcError> {
        const METHOD: &str = "sock_impl_set_options";
        let posix = p
            .as_ref()
            .and_then(|v| v.get("impl_name"))
            .is_some_and(|n| n == "posix");
        let honoured: &[&str] = if posix {
            &["recv_buf_size", "send_buf_size"]
        } else {
            &[]
        };
        let set = check(METHOD, p.as_ref(), honoured)?;
        if !posix {
            return Ok(Value::Bool(true));
        }
        let size = |key: &str| -> Result<u32, RpcError> {
            match set.get(key) {
                None => Ok(0),
                Some(v) => v
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .filter(|&n| n > 0)
                    .ok_or_else(|| {
                        RpcError::invalid_params(format!("{METHOD}: {key} {v}: a size in bytes"))
                    }),
            }
        };
        let (recv, send) = (size("recv_buf_size")?, size("send_buf_size")?);
        let mut st = self.lock();
        if (recv, send) != (st.sock.recv, st.sock.send) && st.transports.contains_key("TCP") {
            return Err(RpcError::errno(
                crate::error::Errno::Busy,
                format!("{METHOD}: the TCP transport runs with its socket sizes; set them before nvmf_create_transport"),
            ));
        }
        let before = (st.sock.recv, st.sock.send);
        st.sock = SockBuffers { recv, send, before };
        Ok(Value::Bool(true))
    }

    /// What undoes the last successful `sock_impl_set_options`.
    pub(super) fn undo_sock_options(&self) -> ConfigEntry {
        let (recv, send) = self.lock().sock.before;
        ConfigEntry::new("sock_impl_set_options", sock_params(recv, send))
    }

    /// The call that rebuilds the socket sizes, when they are not the
    /// kernel's.
    pub(super) fn sock_options_entry(&self) -> Option<ConfigEntry> {
        let s = self.lock().sock;
        (s.recv != 0 || s.send != 0)
            .then(|| ConfigEntry::new("sock_impl_set_options", sock_params(s.recv, s.send)))
    }

    /// `nvmf_set_max_subsystems`.
    fn set_max_subsystems(&self, p: Option<Value>) -> Result<Value, RpcError> {
        const METHOD: &str = "nvmf_set_max_subsystems";
        let set = check(METHOD, p.as_ref(), &["max_subsystems"])?;
        let mut st = self.lock();
        let want = match set.get("max_subsystems") {
            None => DEFAULT_MAX_SUBSYSTEMS,
            Some(v) => v
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .filter(|&n| n > 0)
                .ok_or_else(|| {
                    RpcError::invalid_params(format!(
                        "{METHOD}: max_subsystems {v}: a number from 1 to {}",
                        u32::MAX
                    ))
                })?,
        };
        let made = self.made_subsystems();
        if usize::try_from(want).is_ok_and(|w| w < made) {
            return Err(RpcError::invalid_params(format!(
                "{METHOD}: max_subsystems {want}: {made} subsystem(s) exist"
            )));
        }
        st.max_subsystems = MaxSubsystems {
            now: want,
            before: st.max_subsystems.now,
        };
        Ok(Value::Bool(true))
    }

    /// What undoes the last successful `nvmf_set_max_subsystems`.
    pub(super) fn undo_max_subsystems(&self) -> ConfigEntry {
        let before = self.lock().max_subsystems.before;
        ConfigEntry::new(
            "nvmf_set_max_subsystems",
            serde_json::json!({ "max_subsystems": before }),
        )
    }

    /// The call that rebuilds the limit, when it is not SPDK's default.
    pub(super) fn max_subsystems_entry(&self) -> Option<ConfigEntry> {
        let now = self.lock().max_subsystems.now;
        (now != DEFAULT_MAX_SUBSYSTEMS).then(|| {
            ConfigEntry::new(
                "nvmf_set_max_subsystems",
                serde_json::json!({ "max_subsystems": now }),
            )
        })
    }

    /// Subsystems made (the discovery subsystem not counted).
    pub(super) fn made_subsystems(&self) -> usize {
        self.target
            .subsystems()
            .iter()
            .filter(|s| !s.is_discovery())
            .count()
    }
}

/// `sock_impl_set_options` parameters of `posix` with these sizes (0:
/// SPDK's default, which leaves the kernel's).
fn sock_params(recv: u32, send: u32) -> Value {
    let or_default = |v: u32| if v == 0 { SPDK_SOCK_BUF } else { v };
    serde_json::json!({
        "impl_name": "posix",
        "recv_buf_size": or_default(recv),
        "send_buf_size": or_default(send),
    })
}

/// The option methods over `nvmf`.
pub(super) fn methods(nvmf: &std::sync::Arc<super::NvmfSubsystem>) -> Vec<Method> {
    let me = std::sync::Arc::clone(nvmf);
    let sock = std::sync::Arc::clone(nvmf);
    let mut out = vec![
        Method::new("nvmf_set_max_subsystems", StateMask::ANY, move |_, p| {
            me.set_max_subsystems(p)
        }),
        Method::new("sock_impl_set_options", StateMask::ANY, move |_, p| {
            sock.set_sock_options(p)
        }),
    ];
    for name in ["nvmf_set_config", "nvmf_set_crdt"] {
        out.push(Method::new(name, StateMask::ANY, move |_, p| {
            check(name, p.as_ref(), &[])?;
            Ok(Value::Bool(true))
        }));
    }
    out
}
