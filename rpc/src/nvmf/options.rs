//! The nvmf provider's SPDK option methods (see [`crate::options`] for
//! the rule): `nvmf_set_config` and `nvmf_set_crdt` accept SPDK's
//! defaults; `nvmf_set_max_subsystems` sets the most subsystems
//! `nvmf_create_subsystem` makes (SPDK's default, 1024, to start with;
//! the discovery subsystem does not count), refusing a limit below what
//! exists now.

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

impl super::NvmfSubsystem {
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

/// The three methods over `nvmf`.
pub(super) fn methods(nvmf: &std::sync::Arc<super::NvmfSubsystem>) -> Vec<Method> {
    let me = std::sync::Arc::clone(nvmf);
    let mut out = vec![Method::new(
        "nvmf_set_max_subsystems",
        StateMask::ANY,
        move |_, p| me.set_max_subsystems(p),
    )];
    for name in ["nvmf_set_config", "nvmf_set_crdt"] {
        out.push(Method::new(name, StateMask::ANY, move |_, p| {
            check(name, p.as_ref(), &[])?;
            Ok(Value::Bool(true))
        }));
    }
    out
}
