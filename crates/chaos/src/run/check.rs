//! What a scenario's histories say: counted here (operations, admissions), judged by
//! `inflight check-history --json` (over-admission, leaks, losses, recovery, tokens).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

/// The operations and admissions of a run's histories (every line but faults and statuses).
pub(crate) fn count(files: &[PathBuf]) -> (u64, u64) {
    let (mut operations, mut admissions) = (0, 0);
    for file in files {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for line in text.lines() {
            let Ok(line) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let op = line["op"].as_str().unwrap_or_default();
            if matches!(op, "fault" | "status") {
                continue;
            }
            operations += 1;
            if op == "acquire" && line["result"] == "admitted" {
                admissions += 1;
            }
        }
    }
    (operations, admissions)
}

/// The checker's verdict on `files`, as its `--json` prints it; `{"error": ...}` when it could not run
/// (an `inflight` without `check-history`, say).
pub(crate) fn check(inflight: &Path, files: &[PathBuf]) -> Value {
    let out = Command::new(inflight)
        .arg("check-history")
        .arg("--json")
        .args(files)
        .output();
    let out = match out {
        Ok(out) => out,
        Err(error) => return json!({"error": format!("{}: {error}", inflight.display())}),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The verdict is its last JSON line; a non-zero exit is how it says it found something.
    match stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Value>(l).ok())
    {
        Some(verdict) => verdict,
        None => json!({
            "error": format!(
                "no verdict from check-history (exit {:?}): {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr).lines().next().unwrap_or_default()
            )
        }),
    }
}

/// A number the verdict gives under any of `names` (its fields may nest one level).
pub(crate) fn field(verdict: &Value, names: &[&str]) -> Value {
    for name in names {
        if let Some(value) = verdict.get(*name) {
            return value.clone();
        }
        let nested = verdict
            .as_object()
            .into_iter()
            .flat_map(|o| o.values())
            .find_map(|v| v.get(*name));
        if let Some(value) = nested {
            return value.clone();
        }
    }
    Value::Null
}

/// The checker's verdict on each key of `keys` alone: the histories' lines projected on the key (a
/// permit on several keys keeps only this one) in `dir/<key>.jsonl`, each judged by itself, so that a
/// bound per key (its limit) can be checked against the largest excess on that key.
pub(crate) fn per_key(
    inflight: &Path,
    files: &[PathBuf],
    keys: &[String],
    dir: &Path,
) -> Vec<(String, Value)> {
    let _ = std::fs::create_dir_all(dir);
    let mut lines = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        lines.extend(
            text.lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok()),
        );
    }
    let mut verdicts = Vec::new();
    for key in keys {
        let mut out = String::new();
        for line in &lines {
            let names = line["keys"].as_array().cloned().unwrap_or_default();
            let at = names.iter().position(|k| k == key.as_str());
            let mut line = line.clone();
            match at {
                Some(at) => {
                    for field in ["keys", "limits", "in_flight", "tokens"] {
                        if let Some(values) = line[field].as_array() {
                            line[field] = json!([values.get(at).cloned().unwrap_or(Value::Null)]);
                        }
                    }
                }
                // Faults name no key; every other line of another key stays out.
                None if names.is_empty() => {}
                None => continue,
            }
            out.push_str(&line.to_string());
            out.push('\n');
        }
        let path = dir.join(format!("{}.jsonl", key.replace(':', "_")));
        if std::fs::write(&path, out).is_ok() {
            verdicts.push((key.clone(), check(inflight, &[path])));
        }
    }
    verdicts
}
