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

/// The verdict's `name` (null when it has none).
pub(crate) fn field(verdict: &Value, name: &str) -> Value {
    verdict.get(name).cloned().unwrap_or(Value::Null)
}

/// The keys over their limit by more than `allowed(key's limit)`: from the verdict's per-key figures.
pub(crate) fn keys_over(verdict: &Value, allowed: impl Fn(u64) -> u64) -> Vec<String> {
    let keys = verdict["keys"].as_array().cloned().unwrap_or_default();
    keys.iter()
        .filter(|key| {
            let limit = key["limit"].as_u64().unwrap_or(0);
            key["largest_excess"].as_u64().unwrap_or(0) > allowed(limit)
        })
        .map(|key| key["key"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// The longest recovery after a fault, in ms (null when no admission followed one).
pub(crate) fn recovery_ms(verdict: &Value) -> Value {
    let faults = verdict["faults"].as_array().cloned().unwrap_or_default();
    let longest = faults
        .iter()
        .filter_map(|fault| fault["recovery_ms"].as_f64())
        .fold(None, |max: Option<f64>, ms| {
            Some(max.map_or(ms, |m| m.max(ms)))
        });
    longest.map_or(Value::Null, |ms| json!((ms * 10.0).round() / 10.0))
}

/// How long the fault was in force, in ms (the runner's fault line).
pub(crate) fn fault_ms(verdict: &Value) -> Value {
    let faults = verdict["faults"].as_array().cloned().unwrap_or_default();
    let longest = faults
        .iter()
        .filter_map(|f| {
            Some(
                f["complete_ns"]
                    .as_u64()?
                    .saturating_sub(f["invoke_ns"].as_u64()?),
            )
        })
        .max();
    longest.map_or(Value::Null, |ns| json!(ns / 1_000_000))
}
