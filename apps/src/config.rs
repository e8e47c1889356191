//! The apps' TOML configuration file: the bdevs to create. `pollux-tgt`'s
//! larger schema (subsystems, namespaces, listeners, transport options) is
//! [`crate::tgt::config`]; it reuses [`BdevEntry`] and the position helpers
//! here ([`line_col`], [`at`]) so every error names the line and the field.
//!
//! ```toml
//! cores = "0,1"            # optional; the command line wins
//!
//! [[bdev]]
//! spec = "null:size=1G,block=4096"
//!
//! [[bdev]]                 # the same thing as a table
//! type = "malloc"
//! name = "Malloc0"
//! size = "64M"
//! block = 512
//! ```
//!
//! A table's keys other than `type` are the spec string's keys
//! (see `pollux_bdev::BdevSpec`). Errors name the line and the field.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::AppError;

/// A parsed configuration file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Cores to run on (as `--cores`).
    pub cores: Option<String>,
    /// Bdevs to create, in order.
    #[serde(default)]
    pub bdev: Vec<BdevEntry>,
}

/// One `[[bdev]]` entry: a spec string or a table of keys.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum BdevEntry {
    /// `spec = "null:size=1G,block=4096"`.
    Spec {
        /// The spec string.
        spec: String,
    },
    /// `type = "null"` plus the spec's keys.
    Table {
        /// The backend type (`null`, `malloc`, `aio`).
        #[serde(rename = "type")]
        kind: String,
        /// The other keys, as in a spec string.
        #[serde(flatten)]
        keys: BTreeMap<String, toml::Value>,
    },
}

impl BdevEntry {
    /// The entry as a spec string for `BdevRegistry::create`.
    ///
    /// # Errors
    ///
    /// [`AppError::Config`] for a value that is neither a string, an
    /// integer nor a boolean.
    pub fn to_spec(&self) -> Result<String, AppError> {
        match self {
            BdevEntry::Spec { spec } => Ok(spec.clone()),
            BdevEntry::Table { kind, keys } => {
                let mut parts = Vec::with_capacity(keys.len());
                for (k, v) in keys {
                    let v = match v {
                        toml::Value::String(s) => s.clone(),
                        toml::Value::Integer(i) => i.to_string(),
                        toml::Value::Boolean(b) => b.to_string(),
                        other => {
                            return Err(AppError::Config(format!(
                                "bdev key '{k}': unsupported value {other}"
                            )))
                        }
                    };
                    parts.push(format!("{k}={v}"));
                }
                Ok(format!("{kind}:{}", parts.join(",")))
            }
        }
    }
}

impl Config {
    /// Parses configuration text; errors name the line, column and field.
    ///
    /// # Errors
    ///
    /// [`AppError::Config`] with toml's message (line, column, key).
    pub fn parse(text: &str) -> Result<Config, AppError> {
        toml::from_str(text).map_err(|e| AppError::Config(e.to_string()))
    }

    /// Reads and parses a configuration file.
    ///
    /// # Errors
    ///
    /// [`AppError::Config`] when the file cannot be read or parsed.
    pub fn load(path: &Path) -> Result<Config, AppError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| AppError::Config(format!("{}: {e}", path.display())))?;
        Config::parse(&text).map_err(|e| AppError::Config(format!("{}: {e}", path.display())))
    }
}

/// The 1-based line and column of byte `offset` in `text` (clamped to the
/// end of the text).
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut end = offset.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let before = &text[..end];
    let line = before.matches('\n').count() + 1;
    let col = before.rfind('\n').map_or(before.chars().count(), |nl| {
        before[nl + 1..].chars().count()
    }) + 1;
    (line, col)
}

/// A semantic configuration error at byte span `span` of `text`, naming
/// `field` (a path such as `subsystem[0].namespaces[1].nsid`):
/// `line L, column C: FIELD: MESSAGE`.
pub fn at(
    text: &str,
    span: std::ops::Range<usize>,
    field: &str,
    msg: impl std::fmt::Display,
) -> AppError {
    let (line, col) = line_col(text, span.start);
    AppError::Config(format!("line {line}, column {col}: {field}: {msg}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_and_tables_become_spec_strings() {
        let c = Config::parse(
            r#"
cores = "0"
[[bdev]]
spec = "null:size=1G,block=4096"
[[bdev]]
type = "malloc"
name = "m0"
size = "64M"
block = 512
"#,
        )
        .unwrap();
        assert_eq!(c.cores.as_deref(), Some("0"));
        assert_eq!(c.bdev[0].to_spec().unwrap(), "null:size=1G,block=4096");
        assert_eq!(
            c.bdev[1].to_spec().unwrap(),
            "malloc:block=512,name=m0,size=64M"
        );
        pollux_bdev::BdevSpec::parse(&c.bdev[1].to_spec().unwrap()).unwrap();
    }

    #[test]
    fn errors_name_the_line_and_the_field() {
        let e = Config::parse("cores = \"0\"\nbogus = 1\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("bogus") && e.contains("line 2"), "{e}");
        let e = Config::parse("[[bdev]]\ntype = \"null\"\nsize = [1]\n")
            .unwrap()
            .bdev[0]
            .to_spec()
            .unwrap_err()
            .to_string();
        assert!(e.contains("size"), "{e}");
    }

    #[test]
    fn positions_are_one_based_lines_and_columns() {
        let t = "a = 1\nbb = 2\n";
        assert_eq!(line_col(t, 0), (1, 1));
        assert_eq!(line_col(t, 6), (2, 1));
        assert_eq!(line_col(t, 9), (2, 4));
        assert_eq!(line_col(t, 999), (3, 1));
        let e = at(t, 6..8, "bb", "bad").to_string();
        assert_eq!(e, "config: line 2, column 1: bb: bad");
    }
}
