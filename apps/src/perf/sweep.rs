//! `pollux-perf --sweep`: block sizes × host modes, one run per cell, and
//! the table of `IOPS/CPU%` cells (rows: block sizes, columns: modes).

use std::fmt::Write as _;

use pollux_nvmf::host::rdma::MemMode;

use crate::error::AppError;
use crate::report::Report;

/// Block sizes of a sweep: 512 B … 64 KiB.
pub const SWEEP_SIZES: [usize; 8] = [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536];

/// The default modes of a sweep.
pub const DEFAULT_MODES: &str = "pool,register-always+inline,register-always+inline+local-inv";

/// One column of a sweep: a memory mode and its options, named
/// `MODE[+inline][+local-inv]`: `pool` or `register-always`; `inline` lets
/// writes up to the target's in-capsule limit travel in the capsule
/// (without it in-capsule data is off); `local-inv` invalidates keys with
/// LOCAL_INV instead of asking the target (register-always only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepMode {
    /// The name as given.
    pub name: String,
    /// Memory mode.
    pub mem: MemMode,
    /// In-capsule writes on.
    pub inline: bool,
    /// Remote invalidation asked for.
    pub remote_invalidate: bool,
}

impl SweepMode {
    /// Parse one mode name.
    ///
    /// # Errors
    /// [`AppError::Usage`] naming the bad part.
    pub fn parse(s: &str) -> Result<Self, AppError> {
        let mut parts = s.split('+');
        let mem = MemMode::parse(parts.next().unwrap_or(""))
            .map_err(|e| AppError::Usage(format!("mode '{s}': {e}")))?;
        let mut m = SweepMode {
            name: s.to_string(),
            mem,
            inline: false,
            remote_invalidate: mem == MemMode::RegisterAlways,
        };
        for p in parts {
            match p {
                "inline" => m.inline = true,
                "local-inv" if mem == MemMode::RegisterAlways => m.remote_invalidate = false,
                "remote-inv" if mem == MemMode::RegisterAlways => m.remote_invalidate = true,
                _ => {
                    return Err(AppError::Usage(format!(
                        "mode '{s}': unknown option '{p}' (inline, local-inv, remote-inv)"
                    )))
                }
            }
        }
        Ok(m)
    }

    /// Parse a comma-separated list.
    ///
    /// # Errors
    /// As [`SweepMode::parse`]; an empty list.
    pub fn parse_list(s: &str) -> Result<Vec<Self>, AppError> {
        let v: Vec<SweepMode> = s
            .split(',')
            .filter(|x| !x.trim().is_empty())
            .map(|x| SweepMode::parse(x.trim()))
            .collect::<Result<_, _>>()?;
        if v.is_empty() {
            return Err(AppError::Usage("no sweep mode given".into()));
        }
        Ok(v)
    }
}

/// One cell: IOPS and host CPU busy percent (`None`: the run failed).
pub type Cell = Option<(f64, f64)>;

/// The sweep table: a header of mode names, a row per block size with
/// `IOPS/CPU%` cells (`failed` for a run that failed).
pub fn table(modes: &[SweepMode], rows: &[(usize, Vec<Cell>)]) -> String {
    let names: Vec<&str> = modes.iter().map(|m| m.name.as_str()).collect();
    let mut s = String::new();
    grid(&mut s, &names, 16, rows, |c| match c {
        Some((iops, cpu)) => format!("{iops:.0}/{cpu:.0}%"),
        None => "failed".to_string(),
    });
    s
}

/// Appends a table to `s`: a `bs` header with one column per name (at
/// least `min_width` wide), then a row per block size whose cells are
/// `text(cell)`. Shared by every sweep (host modes, PI policies).
pub fn grid(
    s: &mut String,
    cols: &[&str],
    min_width: usize,
    rows: &[(usize, Vec<Cell>)],
    mut text: impl FnMut(&Cell) -> String,
) {
    let w = cols
        .iter()
        .map(|c| c.len())
        .max()
        .unwrap_or(0)
        .max(min_width);
    let _ = write!(s, "{:>8}", "bs");
    for c in cols {
        let _ = write!(s, "  {c:>w$}");
    }
    s.push('\n');
    for (bs, cells) in rows {
        let _ = write!(s, "{:>8}", size_label(*bs));
        for c in cells {
            let _ = write!(s, "  {:>w$}", text(c));
        }
        s.push('\n');
    }
}

/// One run's cell: IOPS and the mean host busy % over its cores; and
/// whether any I/O failed or miscompared.
pub fn cell_of(r: &Report) -> (Cell, bool) {
    let cpu = if r.cores.is_empty() {
        0.0
    } else {
        r.cores.iter().map(|c| c.busy_pct).sum::<f64>() / r.cores.len() as f64
    };
    (
        Some((r.total.iops, cpu)),
        r.total.errors + r.total.miscompares > 0,
    )
}

/// A sweep as JSON: an array with one object per block size, `{"bs": N,
/// COLUMN: {"iops", "cpu_pct"} or null}`.
pub fn to_json(cols: &[&str], rows: &[(usize, Vec<Cell>)]) -> String {
    let v: Vec<serde_json::Value> = rows
        .iter()
        .map(|(bs, cells)| {
            let mut o = serde_json::Map::new();
            o.insert("bs".into(), (*bs).into());
            for (n, c) in cols.iter().zip(cells) {
                o.insert(
                    (*n).to_string(),
                    c.map_or(
                        serde_json::Value::Null,
                        |(iops, cpu)| serde_json::json!({"iops": iops, "cpu_pct": cpu}),
                    ),
                );
            }
            serde_json::Value::Object(o)
        })
        .collect();
    serde_json::Value::Array(v).to_string()
}

fn size_label(bs: usize) -> String {
    if bs >= 1024 && bs % 1024 == 0 {
        format!("{}K", bs / 1024)
    } else {
        bs.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse() {
        let v = SweepMode::parse_list(DEFAULT_MODES).unwrap();
        assert_eq!(v.len(), 3);
        assert_eq!((v[0].mem, v[0].inline), (MemMode::Pool, false));
        assert!(v[1].inline && v[1].remote_invalidate);
        assert!(v[2].inline && !v[2].remote_invalidate);
        assert!(SweepMode::parse("pool+local-inv").is_err());
        assert!(SweepMode::parse("fast").is_err());
        assert!(SweepMode::parse_list(",").is_err());
    }

    #[test]
    fn table_has_rows_of_sizes_and_columns_of_modes() {
        let modes = SweepMode::parse_list("pool,register-always").unwrap();
        let t = table(
            &modes,
            &[
                (512, vec![Some((1000.0, 99.0)), None]),
                (65536, vec![Some((5.0, 50.0)), Some((4.0, 40.0))]),
            ],
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].contains("pool") && lines[0].contains("register-always"));
        assert!(
            lines[1].trim_start().starts_with("512")
                && lines[1].contains("1000/99%")
                && lines[1].contains("failed")
        );
        assert!(lines[2].trim_start().starts_with("64K"));
    }
}
