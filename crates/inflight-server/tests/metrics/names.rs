//! The Grafana dashboard, the Prometheus alert rules and docs/metrics.md name only metrics that the
//! binary exports.

use std::collections::BTreeSet;

use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

use crate::common::Upstream;
use crate::{proxy, through_proxy};

/// Every `inflight_*` name in `text`.
fn names_in(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("inflight_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

/// True when `name` is exported, or is a histogram's series (`_bucket`, `_sum`, `_count`) of one that is.
/// Exported only by a TLS port (`--tls-cert`): tests/tls checks them on the binary.
const ONLY_WITH_TLS: &[&str] = &["inflight_tls_handshake_failures_total"];

fn exported(name: &str, exports: &BTreeSet<String>) -> bool {
    exports.contains(name)
        || ONLY_WITH_TLS.contains(&name)
        || ["_bucket", "_sum", "_count"].iter().any(|suffix| {
            name.strip_suffix(suffix)
                .is_some_and(|base| exports.contains(base))
        })
}

fn read(path: &str) -> String {
    let path = format!("{}/../../{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A simple structural check of the alert rules (no YAML parser is in the dependency tree): spaces, not
/// tabs; one `groups:` list; each rule an `alert:` with an `expr:`, `labels:` with a severity and
/// `annotations:`.
fn check_alert_rules(yaml: &str) -> usize {
    assert!(!yaml.contains('\t'), "YAML is indented with spaces only");
    let lines: Vec<&str> = yaml
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .collect();
    assert_eq!(lines.first().copied(), Some("groups:"), "{yaml}");
    let mut rules = 0;
    let blocks = yaml.split("- alert: ").skip(1);
    for block in blocks {
        rules += 1;
        let name = block.lines().next().unwrap_or_default();
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric()),
            "alert name {name:?}"
        );
        for field in [
            "expr: ",
            "for: ",
            "labels:",
            "severity: ",
            "annotations:",
            "summary: ",
        ] {
            assert!(block.contains(field), "alert {name} has no {field}");
        }
    }
    for line in &lines {
        let indent = line.len() - line.trim_start().len();
        assert_eq!(indent % 2, 0, "odd indentation: {line:?}");
    }
    rules
}

/// The panels by class of key, each as a query it must have: waiters and tickets summed by class,
/// revocations by class and kind and shadow refusals by class as rates.
const BY_CLASS: &[&str] = &[
    "sum by (class) (inflight_waiting{",
    "sum by (class) (inflight_tickets{",
    "sum by (class, kind) (rate(inflight_revocations_total{",
    "sum by (class) (rate(inflight_shadow_refusals_total{",
];

/// The dashboard's panels: each with a unique id, a place of its own on the grid, a title and a
/// Prometheus query on the datasource variable; the panels by class among them.
fn check_dashboard(json: &str) -> usize {
    let dashboard: Value = serde_json::from_str(json).expect("the dashboard is JSON");
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("variables");
    assert!(
        variables
            .iter()
            .any(|v| v["type"] == "datasource" && v["query"] == "prometheus"),
        "a Prometheus datasource variable"
    );
    let panels = dashboard["panels"].as_array().expect("panels");
    let ids: BTreeSet<_> = panels.iter().map(|panel| panel["id"].as_u64()).collect();
    assert_eq!(ids.len(), panels.len(), "panel ids are unique");
    assert!(ids.iter().all(Option::is_some), "panel ids are numbers");
    let places: Vec<[u64; 4]> = panels.iter().map(place).collect();
    for (i, a) in places.iter().enumerate() {
        for b in &places[i + 1..] {
            let apart = a[0] + a[2] <= b[0] || b[0] + b[2] <= a[0];
            let apart = apart || a[1] + a[3] <= b[1] || b[1] + b[3] <= a[1];
            assert!(apart, "panels at {a:?} and {b:?} overlap");
        }
    }
    let exprs: Vec<&str> = panels
        .iter()
        .flat_map(|panel| panel["targets"].as_array().into_iter().flatten())
        .filter_map(|target| target["expr"].as_str())
        .collect();
    for query in BY_CLASS {
        assert!(
            exprs.iter().any(|expr| expr.starts_with(query)),
            "no panel queries {query}"
        );
    }
    for panel in panels {
        assert!(panel["title"].is_string(), "{panel}");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{panel}");
        for target in targets {
            assert!(
                target["expr"].as_str().is_some_and(|e| !e.is_empty()),
                "{panel}"
            );
        }
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{panel}");
    }
    panels.len()
}

/// A panel's place on the grid: x, y, width, height.
fn place(panel: &Value) -> [u64; 4] {
    ["x", "y", "w", "h"].map(|field| {
        panel["gridPos"][field]
            .as_u64()
            .unwrap_or_else(|| panic!("no gridPos.{field}: {panel}"))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_the_alerts_and_the_docs_name_only_exported_metrics() {
    let http = Client::new();
    let upstream = Upstream::start().await;
    // Balances by class too: exported with --metrics-balances once a key has one.
    let (_proxy, proxied, admin) = proxy(&upstream, &["--metrics-balances", "true"]);
    let quota = http.put(format!("{admin}/v1/quotas/app:2"));
    let quota = quota.json(&json!({ "balance": 5 })).send().await.unwrap();
    assert_eq!(quota.status(), StatusCode::OK);
    let (_, end) = through_proxy(&http, &proxied, &admin, &upstream).await;
    let exports = end.names();
    for expected in [
        "inflight_admissions_total",
        "inflight_proxy_requests_total",
        "inflight_upstream_duration_seconds",
        "inflight_store_up",
        "inflight_waiting",
        "inflight_tickets",
        "inflight_revocations_total",
        "inflight_shadow_refusals_total",
    ] {
        assert!(exports.contains(expected), "{expected} in {exports:?}");
    }
    // Every metric has its help.
    for name in &exports {
        let base = name
            .strip_suffix("_bucket")
            .or_else(|| name.strip_suffix("_sum"))
            .or_else(|| name.strip_suffix("_count"))
            .filter(|base| exports.contains(*base))
            .unwrap_or(name);
        assert!(
            end.0.contains(&format!("# HELP {base} ")),
            "{base} has no # HELP"
        );
    }

    let dashboard = read("contrib/grafana/inflight.json");
    let alerts = read("contrib/prometheus/alerts.yml");
    assert!(
        check_dashboard(&dashboard) >= 13,
        "the panels the docs list"
    );
    assert!(check_alert_rules(&alerts) >= 4, "the alerts the docs list");
    for (file, text) in [
        ("contrib/grafana/inflight.json", &dashboard),
        ("contrib/prometheus/alerts.yml", &alerts),
        ("docs/metrics.md", &read("docs/metrics.md")),
    ] {
        let used = names_in(text);
        assert!(!used.is_empty(), "{file} names no metric");
        let unknown: Vec<_> = used.iter().filter(|n| !exported(n, &exports)).collect();
        assert!(
            unknown.is_empty(),
            "{file} uses metrics the binary does not export: {unknown:?}"
        );
    }
    // And the docs list every metric exported.
    let documented = names_in(&read("docs/metrics.md"));
    let undocumented: Vec<_> = exports
        .iter()
        .filter(|name| !documented.contains(*name) && !exported(name, &documented))
        .collect();
    assert!(
        undocumented.is_empty(),
        "docs/metrics.md lacks {undocumented:?}"
    );
}
