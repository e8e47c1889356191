//! SPDK's JSON configuration files: `{"subsystems": [{"subsystem": NAME,
//! "config": [{"method": M, "params": {...}}, ...]}, ...]}`.
//!
//! [`save`] asks every registered subsystem for the calls that rebuild
//! what exists now (what `save_config` answers and `spdk-rpc save_config`
//! assembles from `framework_get_config`). [`JsonConfig::apply`] makes
//! those calls through [`RpcService::call`], as a client would: first it
//! checks that every method exists (unknown ones are reported by name and
//! nothing is called), then it calls them in order. If one fails, the
//! calls already made are undone in reverse order (each subsystem says how
//! to undo its own calls, see [`Subsystem::undo`](crate::Subsystem::undo)),
//! so a file that does not load leaves nothing behind.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::RpcError;
use crate::service::RpcService;

/// One call of a configuration: a method and its parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigEntry {
    /// The method.
    pub method: String,
    /// Its parameters (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<Value>,
}

impl ConfigEntry {
    /// An entry calling `method` with `params`.
    pub fn new(method: impl Into<String>, params: Value) -> Self {
        Self {
            method: method.into(),
            params: Some(params),
        }
    }
}

/// One subsystem's part of a configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubsystemConfig {
    /// The subsystem's name.
    pub subsystem: String,
    /// Its calls (SPDK writes null for a subsystem that has none to give).
    #[serde(default)]
    pub config: Option<Vec<ConfigEntry>>,
}

/// A whole configuration file.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonConfig {
    /// The subsystems, in the order they are applied.
    pub subsystems: Vec<SubsystemConfig>,
}

/// Why a configuration did not load.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: {reason}")]
    Read {
        /// The file.
        path: String,
        /// The error.
        reason: String,
    },
    /// Not JSON, or not the shape of a configuration.
    #[error("not an SPDK JSON configuration: {0}")]
    Shape(String),
    /// Methods this target does not have (nothing was called).
    #[error("unknown method(s) in the configuration: {}", .0.join(", "))]
    UnknownMethods(Vec<String>),
    /// A call failed; the calls before it were undone.
    #[error("subsystem `{subsystem}`, entry {index} ({method}): {error}; the {undone} call(s) before it were undone")]
    Call {
        /// The subsystem of the failed entry.
        subsystem: String,
        /// The entry's position in that subsystem's `config` (from 0).
        index: usize,
        /// Its method.
        method: String,
        /// The method's error.
        error: RpcError,
        /// Calls undone.
        undone: usize,
    },
}

impl ConfigError {
    /// The error as a JSON-RPC error (for the `load_config` method).
    pub fn to_rpc(&self) -> RpcError {
        match self {
            ConfigError::Call { error, .. } => {
                RpcError::new(error.code, error.message.clone()).with_data(self.to_string())
            }
            ConfigError::UnknownMethods(_) => RpcError::invalid_params(self.to_string()),
            _ => RpcError::invalid_params(self.to_string()),
        }
    }
}

impl JsonConfig {
    /// Parses configuration text.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Shape`] naming where the text goes wrong.
    pub fn parse(text: &str) -> Result<JsonConfig, ConfigError> {
        serde_json::from_str(text).map_err(|e| ConfigError::Shape(e.to_string()))
    }

    /// Reads and parses a file.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Read`] or [`ConfigError::Shape`] (with the path).
    pub fn load(path: &Path) -> Result<JsonConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        JsonConfig::parse(&text).map_err(|e| match e {
            ConfigError::Shape(m) => ConfigError::Shape(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    /// Every entry, with its subsystem's name.
    pub fn entries(&self) -> impl Iterator<Item = (&str, usize, &ConfigEntry)> {
        self.subsystems.iter().flat_map(|s| {
            s.config
                .iter()
                .flatten()
                .enumerate()
                .map(move |(i, e)| (s.subsystem.as_str(), i, e))
        })
    }

    /// The methods `svc` does not have, each once, in file order.
    pub fn unknown_methods(&self, svc: &RpcService) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for (_, _, e) in self.entries() {
            if !svc.has_method(&e.method) && !out.contains(&e.method) {
                out.push(e.method.clone());
            }
        }
        out
    }

    /// Makes every call, all or nothing (see the module docs); returns
    /// how many calls were made.
    ///
    /// # Errors
    ///
    /// [`ConfigError::UnknownMethods`] (nothing called) or
    /// [`ConfigError::Call`] (everything undone).
    pub fn apply(&self, svc: &RpcService) -> Result<usize, ConfigError> {
        let unknown = self.unknown_methods(svc);
        if !unknown.is_empty() {
            return Err(ConfigError::UnknownMethods(unknown));
        }
        let mut undo: Vec<ConfigEntry> = Vec::new();
        let mut made = 0;
        for (subsystem, index, e) in self.entries() {
            match svc.call(&e.method, e.params.clone()) {
                Ok(result) => {
                    made += 1;
                    if let Some(u) = svc.undo_of(&e.method, e.params.as_ref(), &result) {
                        undo.push(u);
                    }
                }
                Err(error) => {
                    let undone = undo.len();
                    for u in undo.iter().rev() {
                        if let Err(ue) = svc.call(&u.method, u.params.clone()) {
                            log::warn!("config: undoing with {} failed: {ue}", u.method);
                        }
                    }
                    return Err(ConfigError::Call {
                        subsystem: subsystem.to_owned(),
                        index,
                        method: e.method.clone(),
                        error,
                        undone,
                    });
                }
            }
        }
        Ok(made)
    }
}

/// The configuration of everything `svc`'s subsystems hold now.
///
/// # Errors
///
/// When a subsystem cannot read its state.
pub fn save(svc: &RpcService) -> Result<JsonConfig, RpcError> {
    let mut subsystems = Vec::new();
    for s in svc.subsystems() {
        subsystems.push(SubsystemConfig {
            subsystem: s.name().to_owned(),
            config: Some(s.config(svc)?),
        });
    }
    Ok(JsonConfig { subsystems })
}
