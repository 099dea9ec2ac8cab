//! The checker on small histories written here: each fault caught, each look-alike left alone.

use inflight_history::{check_text, Line, Report};
use serde_json::{json, Value};

const MS: u64 = 1_000_000;

/// A line of `op` on `keys` (limit 1 each, weight 1, a lease of 10 s), from `invoke` to `complete` ms.
fn line(op: &str, who: &str, id: &str, keys: &[&str], result: &str, at: (u64, u64)) -> Value {
    json!({
        "process": who, "op": op, "keys": keys, "id": id, "result": result,
        "invoke_ns": 1_000 * MS + at.0 * MS, "complete_ns": 1_000 * MS + at.1 * MS,
        "weight": 1, "lease_ms": 10_000, "limits": keys.iter().map(|_| 1).collect::<Vec<_>>(),
    })
}

fn admitted(who: &str, id: &str, keys: &[&str], at: (u64, u64)) -> Value {
    line("acquire", who, id, keys, "admitted", at)
}

fn release(who: &str, id: &str, keys: &[&str], at: (u64, u64)) -> Value {
    line("release", who, id, keys, "released", at)
}

fn set(mut line: Value, field: &str, value: Value) -> Value {
    line[field] = value;
    line
}

fn check(lines: &[Value]) -> Report {
    let text: Vec<String> = lines.iter().map(Value::to_string).collect();
    check_text("h", &text.join("\n")).expect("a readable history")
}

fn error(text: &str) -> String {
    check_text("h.jsonl", text)
        .expect_err("unreadable")
        .to_string()
}

#[test]
fn permits_one_after_another_are_clean() {
    let report = check(&[
        admitted("p1", "x", &["a"], (0, 1)),
        release("p1", "x", &["a"], (2, 3)),
        admitted("p2", "y", &["a"], (3, 4)),
        release("p2", "y", &["a"], (5, 6)),
    ]);
    assert!(report.ok, "{}", report.text());
    assert_eq!((report.operations, report.admissions), (4, 2));
    assert_eq!(report.keys[0].peak_held, 1);
}

#[test]
fn overlapping_holds_over_the_limit_are_caught() {
    let report = check(&[
        admitted("p1", "x", &["a"], (0, 1)),
        admitted("p2", "y", &["a"], (2, 3)),
        release("p1", "x", &["a"], (5, 6)),
        release("p2", "y", &["a"], (7, 8)),
    ]);
    assert!(!report.ok);
    assert_eq!((report.over_admissions, report.largest_excess), (1, 1));
    let example = &report.keys[0].examples[0];
    assert_eq!((example.at_ms, example.held, example.limit), (3.0, 2, 1));
    assert_eq!(example.holders.len(), 2);
    assert_eq!(example.holders[1].at, "h:2");
}

#[test]
fn weights_and_several_keys_count_per_key() {
    let limits = |n: u32| json!([n, n]);
    let report = check(&[
        set(
            set(admitted("p1", "x", &["a", "b"], (0, 1)), "weight", json!(3)),
            "limits",
            limits(4),
        ),
        set(
            set(admitted("p2", "y", &["b"], (2, 3)), "weight", json!(3)),
            "limits",
            json!([4]),
        ),
        set(admitted("p3", "z", &["a"], (2, 3)), "limits", json!([4])),
    ]);
    let keys: Vec<(&str, u64, u64)> = report
        .keys
        .iter()
        .map(|k| (k.key.as_str(), k.peak_held, k.largest_excess))
        .collect();
    assert_eq!(keys, [("a", 4, 0), ("b", 6, 2)]);
    assert_eq!(report.over_admissions, 1);
}

#[test]
fn episodes_are_counted_apart_and_a_handover_stays_one() {
    let report = check(&[
        admitted("p1", "x", &["a"], (0, 1)),
        admitted("p2", "y", &["a"], (2, 3)),
        release("p1", "x", &["a"], (5, 6)),
        // z takes over x's place at the instant x's release is invoked: still one episode.
        admitted("p3", "z", &["a"], (4, 5)),
        release("p2", "y", &["a"], (8, 9)),
        release("p3", "z", &["a"], (8, 9)),
        admitted("p1", "v", &["a"], (20, 21)),
        admitted("p2", "w", &["a"], (20, 22)),
    ]);
    assert_eq!(report.keys[0].over_admissions, 2, "{}", report.text());
}

#[test]
fn unknown_outcomes_releases_in_flight_and_lapsed_leases_are_not_held() {
    let error = line("acquire", "p2", "y", &["a"], "error", (2, 3));
    // x's release was invoked before y's admission completed.
    let report = check(&[
        admitted("p1", "x", &["a"], (0, 1)),
        error,
        release("p1", "x", &["a"], (2, 5)),
        admitted("p3", "z", &["a"], (3, 4)),
    ]);
    assert!(report.ok, "{}", report.text());
    assert_eq!(report.unknown_outcomes, 1);
    // A lease of 10 ms, never renewed, lapsed before y came.
    let lapsed = set(admitted("p1", "x", &["a"], (0, 1)), "lease_ms", json!(10));
    let report = check(&[lapsed.clone(), admitted("p2", "y", &["a"], (10, 11))]);
    assert!(report.ok, "{}", report.text());
    // Renewed in time, it is still held.
    let renewed = set(
        line("renew", "p1", "x", &["a"], "renewed", (5, 6)),
        "lease_ms",
        json!(10),
    );
    let report = check(&[lapsed, renewed, admitted("p2", "y", &["a"], (10, 11))]);
    assert_eq!(report.over_admissions, 1, "{}", report.text());
}

#[test]
fn a_lost_permit_is_counted_and_no_longer_held() {
    let report = check(&[
        admitted("p1", "x", &["a"], (0, 1)),
        line("renew", "p1", "x", &["a"], "lost", (5, 6)),
        admitted("p2", "y", &["a"], (5, 7)),
    ]);
    assert!(report.ok, "{}", report.text());
    assert_eq!((report.permits_lost, report.keys[0].lost), (1, 1));
}

#[test]
fn limits_take_the_largest_reported_and_unlimited_or_unknown_never_alarm() {
    let raised = set(admitted("p2", "y", &["a"], (2, 3)), "limits", json!([2]));
    let report = check(&[admitted("p1", "x", &["a"], (0, 1)), raised]);
    assert!(report.ok, "{}", report.text());
    assert_eq!(report.keys[0].limit, Some(2));
    let unlimited = set(admitted("p2", "y", &["a"], (2, 3)), "limits", json!([0]));
    let report = check(&[admitted("p1", "x", &["a"], (0, 1)), unlimited]);
    assert_eq!((report.ok, report.keys[0].limit), (true, Some(0)));
    let unknown = |line: Value| set(line, "limits", Value::Null);
    let report = check(&[
        unknown(admitted("p1", "x", &["a"], (0, 1))),
        unknown(admitted("p2", "y", &["a"], (2, 3))),
    ]);
    assert_eq!((report.ok, report.keys[0].limit), (true, None));
}

#[test]
fn the_same_id_is_one_slot_at_its_smallest_weight_and_shortest_lease() {
    // Re-acquiring a held id refreshes that lease: counted once.
    let report = check(&[
        admitted("p1", "x", &["a"], (0, 1)),
        admitted("p2", "x", &["a"], (2, 3)),
    ]);
    assert!(report.ok, "{}", report.text());
    // ... at its new weight, and its new (shorter) lease.
    let report = check(&[
        set(
            set(admitted("p1", "x", &["a"], (0, 1)), "weight", json!(2)),
            "limits",
            json!([2]),
        ),
        set(admitted("p1", "x", &["a"], (2, 3)), "lease_ms", json!(5)),
        admitted("p2", "y", &["a"], (4, 5)),
        admitted("p3", "z", &["a"], (8, 9)),
    ]);
    assert!(report.ok, "{}", report.text());
}

#[test]
fn an_older_release_names_its_token_and_spares_a_newer_lease() {
    // x released with a slow answer; x admitted again meanwhile; then y: x's new lease is still held.
    let tokens = |line: Value, token: u64| set(line, "token", json!(token));
    let lines = [
        tokens(admitted("p1", "x", &["a"], (0, 1)), 1),
        release("p1", "x", &["a"], (2, 1_100)),
        tokens(admitted("p1", "x", &["a"], (500, 510)), 2),
        tokens(admitted("p2", "y", &["a"], (600, 610)), 3),
    ];
    let report = check(&lines);
    assert_eq!(report.over_admissions, 1, "{}", report.text());
    // Without tokens the release may have removed the new lease: nothing certain.
    let plain: Vec<Value> = lines
        .iter()
        .map(|line| set(line.clone(), "token", Value::Null))
        .collect();
    assert!(check(&plain).ok);
    // x's first lease lapsed and another process holds x anew; the first holder's late release names
    // the old token (or, without one, its process's last): the new lease stays held.
    let late = |token: Value| {
        let mut lines = [
            tokens(
                set(admitted("p1", "x", &["a"], (0, 1)), "lease_ms", json!(5)),
                1,
            ),
            tokens(admitted("p2", "x", &["a"], (10, 11)), 2),
            set(
                release("p1", "x", &["a"], (20, 21)),
                "result",
                json!("gone"),
            ),
            tokens(admitted("p3", "y", &["a"], (30, 31)), 3),
        ];
        lines[2]["token"] = token;
        check(&lines)
    };
    assert_eq!(late(json!(1)).over_admissions, 1);
    assert_eq!(late(Value::Null).over_admissions, 1);
    // An unknown release from another process with the same id may land any time later.
    let report = check(&[
        line("release", "p2", "x", &["a"], "error", (0, 1)),
        admitted("p1", "x", &["a"], (2, 3)),
        admitted("p3", "y", &["a"], (5, 6)),
    ]);
    assert!(report.ok, "{}", report.text());
}

#[test]
fn tokens_going_backwards_are_caught_and_re_entries_are_not() {
    let token = |line: Value, token: u64| set(line, "token", json!(token));
    let report = check(&[
        token(admitted("p1", "x", &["a"], (0, 1)), 7),
        token(admitted("p2", "y", &["a"], (2, 3)), 5),
        release("p1", "x", &["a"], (4, 5)),
    ]);
    assert_eq!(report.token_violations, 1);
    let example = &report.token_examples[0];
    assert_eq!(
        (example.later.token, example.earlier.token),
        (Some(5), Some(7))
    );
    assert_eq!(example.later.at, "h:2");
    // A re-entry of a held id repeats its lease's token, also after another id's admission.
    let report = check(&[
        set(
            token(admitted("p1", "x", &["a"], (0, 1)), 1),
            "limits",
            json!([2]),
        ),
        token(admitted("p2", "y", &["a"], (2, 3)), 2),
        token(admitted("p1", "x", &["a"], (4, 5)), 1),
    ]);
    assert_eq!((report.token_violations, report.tokens_compared), (0, 3));
    // ... but not once that lease was certainly released.
    let report = check(&[
        token(admitted("p1", "x", &["a"], (0, 1)), 1),
        release("p1", "x", &["a"], (2, 3)),
        token(admitted("p1", "x", &["a"], (4, 5)), 1),
    ]);
    assert_eq!(report.token_violations, 1, "{}", report.text());
    // Admissions of several keys are not compared (`tokens` give one per key; `token` the first's).
    let report = check(&[
        set(
            admitted("p1", "x", &["a", "b"], (0, 1)),
            "tokens",
            json!([9, 9]),
        ),
        token(admitted("p2", "y", &["a"], (2, 3)), 3),
    ]);
    assert_eq!((report.token_violations, report.tokens_compared), (0, 1));
}

#[test]
fn leaks_losses_and_recovery_are_reported() {
    let status = |in_flight: u32, at: u64| {
        set(
            line("status", "runner", "", &["a"], "ok", (at, at)),
            "in_flight",
            json!([in_flight]),
        )
    };
    let fault = |name: &str, at: (u64, u64)| {
        set(
            line("fault", "runner", "", &[], "ok", at),
            "name",
            json!(name),
        )
    };
    let report = check(&[
        status(3, 100),
        admitted("p1", "x", &["a"], (0, 1)),
        fault("redis-restart", (2, 10)),
        release("p1", "x", &["a"], (20, 21)),
        admitted("p1", "y", &["a"], (40, 42)),
        fault("pause", (50, 60)),
        status(1, 90),
        line("renew", "p1", "y", &["a"], "lost", (45, 46)),
    ]);
    assert_eq!((report.slots_leaked, report.keys[0].leaked), (3, Some(3)));
    assert_eq!(report.permits_lost, 1);
    let faults: Vec<(&str, Option<f64>)> = report
        .faults
        .iter()
        .map(|f| (f.name.as_str(), f.recovery_ms))
        .collect();
    assert_eq!(faults, [("redis-restart", Some(32.0)), ("pause", None)]);
    assert_eq!(report.operations, 6);
    assert!(report.ok);
    let text = report.text();
    assert!(text.contains("slots leaked at the end: 3 (a: 3)"), "{text}");
    assert!(
        text.contains("redis-restart (runner): first admission 32.000 ms after its end"),
        "{text}"
    );
}

#[test]
fn unreadable_lines_name_their_file_and_line() {
    let good = admitted("p", "x", &["a"], (0, 1)).to_string();
    assert_eq!(
        error(&format!("{good}\n\n{{")),
        "h.jsonl:3: not a history line: EOF while parsing an object (column 1)"
    );
    let with = |field: &str, value: Value| {
        set(admitted("p", "x", &["a"], (0, 1)), field, value).to_string()
    };
    assert_eq!(
        error(&with("op", json!("take"))),
        "h.jsonl:1: unknown op `take` (acquire, release, renew, status or fault)"
    );
    assert!(error(&with("result", json!("ok")))
        .starts_with("h.jsonl:1: unknown result `ok` of `acquire`"));
    assert_eq!(
        error(&with("lease_ms", Value::Null)),
        "h.jsonl:1: `acquire` `admitted` without `lease_ms`"
    );
    assert_eq!(
        error(&with("tokens", json!([1, 2]))),
        "h.jsonl:1: `tokens` has 2 entries for 1 keys"
    );
    assert_eq!(
        error(&with("invoke_ns", json!(u64::MAX))),
        "h.jsonl:1: complete_ns is before invoke_ns"
    );
    assert!(error(&with("complete_ns", Value::Null))
        .starts_with("h.jsonl:1: not a history line: invalid type: null"));
    assert_eq!(
        error(&format!("{good}\n\u{0}\n")),
        "h.jsonl:2: not a history line: expected value (column 1)"
    );
}

#[test]
fn a_line_is_read_as_written_and_as_other_writers_spell_it() {
    let line = Line {
        process: "runner".into(),
        op: "status".into(),
        keys: vec!["a".into()],
        limits: Some(vec![Some(1)]),
        invoke_ns: 5,
        complete_ns: 6,
        result: "ok".into(),
        in_flight: vec![2],
        ..Line::default()
    };
    let text = serde_json::to_string(&line).unwrap();
    let written = r#"{"process":"runner","op":"status","keys":["a"],"limits":[1],"invoke_ns":5,"complete_ns":6,"result":"ok","in_flight":[2]}"#;
    assert_eq!(text, written);
    assert_eq!(serde_json::from_str::<Line>(&text).unwrap(), line);
    assert_eq!(check_text("h", &text).unwrap().slots_leaked, 2);
    // Nulls for what a writer lacks, and fields the checker does not read.
    let other = r#"{"process":"py-1","op":"fault","keys":null,"token":null,"in_flight":null,"invoke_ns":1,"complete_ns":2,"result":"ok","name":"pause","extra":1}"#;
    let line: Line = serde_json::from_str(other).unwrap();
    assert_eq!((line.keys.len(), line.name.as_deref()), (0, Some("pause")));
}
