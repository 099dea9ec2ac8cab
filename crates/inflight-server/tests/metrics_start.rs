//! A fresh server exports every metric that the shipped Grafana dashboard and Prometheus alert rules
//! use, before any request: their panels and rules have data (zeros) from the start, not "no data"
//! until the first wait or the first proxied request.
#![allow(missing_docs)]

mod common;

use std::collections::BTreeSet;

use common::process::{admin_of, listen_of, proxy_args, Running};

/// The `inflight_*` names that `path` (from the repository's root) mentions.
fn used_by(path: &str) -> BTreeSet<String> {
    let path = format!("{}/../../{path}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.match_indices("inflight_")
        .map(|(at, _)| {
            let name = &text[at..];
            let end = name
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(name.len());
            name[..end].to_owned()
        })
        .collect()
}

/// The names of the samples on `url`'s metrics page.
async fn exported(url: &str) -> BTreeSet<String> {
    let page = reqwest::get(url).await.unwrap().text().await.unwrap();
    page.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn a_fresh_serve_and_a_fresh_proxy_export_what_the_dashboard_and_the_alerts_use() {
    let mut used = used_by("contrib/grafana/inflight.json");
    used.extend(used_by("contrib/prometheus/alerts.yml"));
    assert!(used.contains("inflight_waiting"), "{used:?}");

    let (_serve, started) = Running::start(&["serve", "--listen", "127.0.0.1:0"]);
    let serve = exported(&format!("http://{}/metrics", listen_of(&started))).await;
    // No request reaches this upstream: the proxy is only scraped.
    let (_proxy, started) = Running::start(&proxy_args("http://127.0.0.1:9", &[]));
    let proxy = exported(&format!("http://{}/metrics", admin_of(&started))).await;

    for (command, exported) in [("serve", serve), ("proxy", proxy)] {
        let missing: Vec<_> = used.difference(&exported).collect();
        assert!(missing.is_empty(), "a fresh {command} lacks {missing:?}");
    }
}
