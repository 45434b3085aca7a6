//! Reads the instruction counts iai-callgrind saved (`--save-summary=json`) for this run.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;

/// One benchmark's count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Count {
    /// The benchmark function.
    pub function: String,
    /// Its id (`#[bench::id(..)]`).
    pub id: String,
    /// Instructions executed (callgrind's `Ir`) in this run.
    pub instructions: u64,
}

/// Every `summary.json` under `dir`.
pub fn read(dir: &Path) -> Result<Vec<Count>> {
    let mut files = Vec::new();
    walk(dir, &mut files)?;
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
        let v: Value = serde_json::from_str(&text).with_context(|| format!("parsing {}", f.display()))?;
        let function = v["function_name"].as_str().unwrap_or_default().to_owned();
        let id = v["id"].as_str().unwrap_or_default().to_owned();
        // `Ir.metrics` is `{"Left": new}` or `{"Both": [new, old]}`.
        let instructions = find_key(&v, "Ir")
            .map(|ir| &ir["metrics"])
            .and_then(first_int)
            .with_context(|| format!("no Ir in {}", f.display()))?;
        out.push(Count { function, id, instructions });
    }
    out.sort_by(|a, b| (&a.function, &a.id).cmp(&(&b.function, &b.id)));
    Ok(out)
}

fn walk(dir: &Path, files: &mut Vec<std::path::PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            walk(&path, files)?;
        } else if path.file_name().is_some_and(|n| n == "summary.json") {
            files.push(path);
        }
    }
    Ok(())
}

/// The first value under `key`, depth first.
fn find_key<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    match v {
        Value::Object(m) => m.get(key).or_else(|| m.values().find_map(|x| find_key(x, key))),
        Value::Array(a) => a.iter().find_map(|x| find_key(x, key)),
        _ => None,
    }
}

/// The first integer, depth first.
fn first_int(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => n.as_u64(),
        Value::Object(m) => m.values().find_map(first_int),
        Value::Array(a) => a.iter().find_map(first_int),
        _ => None,
    }
}
