//! `inflight check-history`: the real binary on histories written here. Broken histories are each caught
//! (exit 1, or the finding reported); look-alikes that are not certain are left alone (exit 0); input
//! that cannot be read is named by file and line (exit 2).
#![allow(missing_docs)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};

const MS: u64 = 1_000_000;
/// Histories start at an instant far from 0, as wall-clock times do.
const T0: u64 = 1_700_000_000_000 * MS;

/// A line of `op` on `keys` (limit 1 each, weight 1, a lease of 10 s) from `invoke` to `complete` ms.
fn line(op: &str, who: &str, id: &str, keys: &[&str], result: &str, at: (u64, u64)) -> Value {
    json!({
        "process": who, "op": op, "keys": keys, "id": id, "result": result,
        "invoke_ns": T0 + at.0 * MS, "complete_ns": T0 + at.1 * MS,
        "weight": 1, "lease_ms": 10_000, "limits": keys.iter().map(|_| 1).collect::<Vec<_>>(),
    })
}

fn admitted(who: &str, id: &str, keys: &[&str], at: (u64, u64)) -> Value {
    line("acquire", who, id, keys, "admitted", at)
}

fn release(who: &str, id: &str, keys: &[&str], at: (u64, u64)) -> Value {
    line("release", who, id, keys, "released", at)
}

fn with(mut line: Value, fields: Value) -> Value {
    for (field, value) in fields.as_object().expect("fields") {
        line[field] = value.clone();
    }
    line
}

/// Writes `lines` to `name` in `dir`.
fn write(dir: &Path, name: &str, lines: &[Value]) -> PathBuf {
    let path = dir.join(name);
    let text: Vec<String> = lines.iter().map(Value::to_string).collect();
    std::fs::write(&path, text.join("\n") + "\n").expect("write a history");
    path
}

fn inflight(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_inflight"))
        .arg("check-history")
        .args(args)
        .output()
        .expect("run inflight")
}

/// Checks `lines` (one file) with `--json`: the exit code and the report.
fn check(lines: &[Value]) -> (i32, Value) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = write(dir.path(), "history.jsonl", lines);
    checked(inflight(&["--json", file.to_str().unwrap()]))
}

fn checked(out: Output) -> (i32, Value) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "one JSON object: {stdout}");
    let report = serde_json::from_str(&stdout).expect("JSON");
    (out.status.code().expect("an exit code"), report)
}

fn key<'a>(report: &'a Value, name: &str) -> &'a Value {
    let keys = report["keys"].as_array().expect("keys");
    keys.iter().find(|key| key["key"] == name).expect("the key")
}

#[test]
fn a_clean_history_passes_in_text_and_in_json() {
    let dir = tempfile::tempdir().unwrap();
    let lines = [
        admitted("rust-1", "x", &["a"], (0, 1)),
        release("rust-1", "x", &["a"], (5, 6)),
        admitted("py-1", "y", &["a"], (6, 7)),
        release("py-1", "y", &["a"], (9, 10)),
    ];
    // Two files (one per process) are read as one history.
    let first = write(
        dir.path(),
        "rust-1.jsonl",
        &[lines[0].clone(), lines[1].clone()],
    );
    let second = write(
        dir.path(),
        "py-1.jsonl",
        &[lines[2].clone(), lines[3].clone()],
    );
    let files = [first.to_str().unwrap(), second.to_str().unwrap()];
    let out = inflight(&files);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("2 files, 4 operations (2 admissions, 0 with an unknown outcome)"),
        "{text}"
    );
    assert!(text.contains("over-admission: none certain"), "{text}");
    assert!(text.trim_end().ends_with("result: ok"), "{text}");
    let (code, report) = checked(inflight(&["--json", files[0], files[1]]));
    assert_eq!((code, &report["ok"]), (0, &json!(true)));
    assert_eq!(
        (report["operations"].as_u64(), report["admissions"].as_u64()),
        (Some(4), Some(2))
    );
    assert_eq!(key(&report, "a")["peak_held"], 1);
}

#[test]
fn overlapping_permits_over_the_limit_are_caught() {
    let (code, report) = check(&[
        admitted("rust-1", "x", &["a"], (0, 1)),
        admitted("rust-2", "y", &["a"], (2, 3)),
        release("rust-1", "x", &["a"], (5, 6)),
    ]);
    assert_eq!(code, 1, "{report}");
    assert_eq!(
        (
            report["over_admissions"].as_u64(),
            report["largest_excess"].as_u64()
        ),
        (Some(1), Some(1))
    );
    let example = &key(&report, "a")["examples"][0];
    assert_eq!(
        (example["held"].as_u64(), example["at_ms"].as_f64()),
        (Some(2), Some(3.0))
    );
    // In text: the key, the instant and who held it.
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "h.jsonl",
        &[
            admitted("rust-1", "x", &["a"], (0, 1)),
            admitted("rust-2", "y", &["a"], (2, 3)),
        ],
    );
    let out = inflight(&[file.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text.contains("a (limit 1): 1 episode, largest excess 1"),
        "{text}"
    );
    let holder = format!("acquire rust-2 id y ({}:2) weight 1", file.display());
    assert!(text.contains(&holder), "{text}");
    assert!(
        text.contains("result: FAILED (certain over-admission)"),
        "{text}"
    );
}

#[test]
fn weights_of_three_and_permits_over_several_keys_are_caught() {
    let heavy = |line: Value| with(line, json!({"weight": 3, "limits": [4]}));
    let (code, report) = check(&[
        heavy(admitted("rust-1", "x", &["a"], (0, 1))),
        heavy(admitted("rust-2", "y", &["a"], (2, 3))),
    ]);
    assert_eq!((code, report["largest_excess"].as_u64()), (1, Some(2)));
    // One permit over a and b, another on b alone: b is over, a is not.
    let (code, report) = check(&[
        with(
            admitted("rust-1", "x", &["a", "b"], (0, 1)),
            json!({"weight": 3, "limits": [4, 4]}),
        ),
        heavy(admitted("py-1", "y", &["b"], (2, 3))),
    ]);
    assert_eq!(code, 1, "{report}");
    assert_eq!(key(&report, "a")["over_admissions"], 0);
    assert_eq!(
        (
            key(&report, "b")["peak_held"].as_u64(),
            key(&report, "b")["largest_excess"].as_u64()
        ),
        (Some(6), Some(2))
    );
}

#[test]
fn a_token_going_backwards_is_caught() {
    let (code, report) = check(&[
        with(admitted("rust-1", "x", &["a"], (0, 1)), json!({"token": 8})),
        release("rust-1", "x", &["a"], (2, 3)),
        with(
            admitted("rust-2", "y", &["a"], (4, 5)),
            json!({"tokens": [7]}),
        ),
    ]);
    assert_eq!(code, 1, "{report}");
    assert_eq!(
        (
            report["token_violations"].as_u64(),
            report["over_admissions"].as_u64()
        ),
        (Some(1), Some(0))
    );
    let example = &report["token_examples"][0];
    assert_eq!(
        (
            example["later"]["token"].as_u64(),
            example["earlier"]["token"].as_u64()
        ),
        (Some(7), Some(8))
    );
}

#[test]
fn lost_permits_leaked_slots_and_recovery_are_reported() {
    let (code, report) = check(&[
        admitted("rust-1", "x", &["a"], (0, 1)),
        with(
            line("fault", "runner", "", &[], "ok", (2, 10)),
            json!({"name": "redis-kill"}),
        ),
        line("renew", "rust-1", "x", &["a"], "lost", (12, 13)),
        admitted("rust-2", "y", &["a"], (20, 35)),
        release("rust-2", "y", &["a"], (40, 41)),
        with(
            line("status", "runner", "", &["a"], "ok", (100, 101)),
            json!({"in_flight": [1]}),
        ),
    ]);
    // Reported, but none is a violation by itself.
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["permits_lost"], 1);
    assert_eq!(
        (
            report["slots_leaked"].as_u64(),
            key(&report, "a")["leaked"].as_u64()
        ),
        (Some(1), Some(1))
    );
    assert_eq!(report["faults"][0]["name"], "redis-kill");
    assert_eq!(report["faults"][0]["recovery_ms"].as_f64(), Some(25.0));
}

#[test]
fn what_is_not_certain_raises_no_alarm() {
    // An admission of unknown outcome overlapping another.
    let unknown = line("acquire", "rust-2", "y", &["a"], "error", (2, 3));
    // A release invoked before the other's admission completed.
    let early = [
        admitted("rust-1", "x", &["a"], (0, 1)),
        release("rust-1", "x", &["a"], (4, 9)),
        admitted("rust-2", "y", &["a"], (3, 5)),
    ];
    // A lease of 10 ms, not renewed, that lapsed before the next admission.
    let lapsed = [
        with(
            admitted("rust-1", "x", &["a"], (0, 1)),
            json!({"lease_ms": 10}),
        ),
        admitted("rust-2", "y", &["a"], (10, 12)),
    ];
    // A limit raised from 1 to 2 mid-run.
    let raised = [
        admitted("rust-1", "x", &["a"], (0, 1)),
        with(
            admitted("rust-2", "y", &["a"], (2, 3)),
            json!({"limits": [2]}),
        ),
    ];
    for lines in [
        &[admitted("rust-1", "x", &["a"], (0, 1)), unknown][..],
        &early[..],
        &lapsed[..],
        &raised[..],
    ] {
        let (code, report) = check(lines);
        assert_eq!(
            (code, &report["over_admissions"]),
            (0, &json!(0)),
            "{report}"
        );
    }
}

#[test]
fn unreadable_input_exits_2_naming_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let good = write(
        dir.path(),
        "good.jsonl",
        &[admitted("rust-1", "x", &["a"], (0, 1))],
    );
    let bad = dir.path().join("bad.jsonl");
    let text = format!(
        "{}\n{{\"process\": \"rust-1\", \"op\": \"acquire\"}}\n",
        admitted("p", "x", &["a"], (0, 1))
    );
    std::fs::write(&bad, text).unwrap();
    let out = inflight(&[good.to_str().unwrap(), bad.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let expected = format!(
        "{}:2: not a history line: missing field `invoke_ns`",
        bad.display()
    );
    assert!(stderr.contains(&expected), "{stderr}");
    let missing = dir.path().join("missing.jsonl");
    let out = inflight(&[missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.jsonl: cannot open"));
}

/// A sequential simulation: clients take turns; each admission is decided by a count that never passes
/// the limit, and each lease is released, renewed or left to lapse; its history, split into a file per
/// process, must show no over-admission and no token going backwards.
#[test]
fn a_simulation_that_keeps_the_limit_is_never_reported_over_it() {
    let dir = tempfile::tempdir().unwrap();
    for seed in 1..=20u64 {
        let mut rng = seed;
        let mut next = |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let limit = 1 + next(4);
        let (mut now, mut token) = (0u64, 0u64);
        // (client, id, weight, lease expiry in ms)
        let mut held: Vec<(u64, String, u64, u64)> = Vec::new();
        let mut files: Vec<Vec<Value>> = vec![Vec::new(); 3];
        for n in 0..600 {
            now += 1 + next(3);
            held.retain(|h| h.3 > now);
            let client = next(3);
            let who = format!("client-{client}");
            let weight = 1 + next(2);
            let mine = held.iter().position(|h| h.0 == client);
            let line = match (mine, next(3)) {
                (Some(at), 0) => {
                    let (_, id, _, _) = held.swap_remove(at);
                    release(&who, &id, &["k"], (now, now + 1))
                }
                (Some(at), 1) => {
                    held[at].3 = now + 8;
                    let id = held[at].1.clone();
                    with(
                        line("renew", &who, &id, &["k"], "renewed", (now, now + 1)),
                        json!({"lease_ms": 8}),
                    )
                }
                _ => {
                    let id = format!("id-{n}");
                    let count: u64 = held.iter().map(|h| h.2).sum();
                    let result = if count + weight <= limit {
                        "admitted"
                    } else {
                        "full"
                    };
                    let mut line = line("acquire", &who, &id, &["k"], result, (now, now + 1));
                    if result == "admitted" {
                        token += 1;
                        held.push((client, id, weight, now + 8));
                        line["token"] = json!(token);
                    }
                    with(
                        line,
                        json!({"weight": weight, "lease_ms": 8, "limits": [limit]}),
                    )
                }
            };
            files[client as usize].push(line);
        }
        let paths: Vec<PathBuf> = files
            .iter()
            .enumerate()
            .map(|(n, lines)| write(dir.path(), &format!("{seed}-{n}.jsonl"), lines))
            .collect();
        let mut args = vec!["--json"];
        args.extend(paths.iter().map(|p| p.to_str().unwrap()));
        let (code, report) = checked(inflight(&args));
        assert_eq!(code, 0, "seed {seed}: {report}");
        assert!(report["admissions"].as_u64().unwrap() > 50, "{report}");
        assert_eq!(key(&report, "k")["limit"].as_u64(), Some(limit));
    }
}
