//! The metrics as the binary exports them: the same work through `serve` and through `proxy` gives the
//! same admissions, releases, in flight and waiters; and the Grafana dashboard, the Prometheus alert rules
//! and docs/metrics.md name only metrics that the binary exports.
#![allow(missing_docs)]

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::process::{admin_of, listen_of, Running};
use common::Upstream;
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};

/// How long each admission may wait: `wait_ms` of the API's, `--max-wait` of the proxy's.
const WAIT_MS: u64 = 500;

/// A metrics page.
struct Scrape(String);

impl Scrape {
    async fn of(http: &Client, url: &str) -> Self {
        let answer = http.get(url).send().await.unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
        Self(answer.text().await.unwrap())
    }

    /// The value of `series` (its name and labels, as written), 0 when absent.
    fn value(&self, series: &str) -> f64 {
        self.0
            .lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    }

    /// The names of its metrics, from its samples and its `# HELP` and `# TYPE` lines.
    fn names(&self) -> BTreeSet<String> {
        self.0
            .lines()
            .filter_map(|line| {
                let line = line
                    .strip_prefix("# HELP ")
                    .or_else(|| line.strip_prefix("# TYPE "))
                    .unwrap_or(line);
                let name = line.split(['{', ' ']).next()?;
                name.starts_with("inflight_").then(|| name.to_owned())
            })
            .collect()
    }
}

/// Scrapes `url` until `series` is `want`; panics after 5 s.
async fn until(http: &Client, url: &str, series: &str, want: f64) -> Scrape {
    let started = Instant::now();
    loop {
        let scrape = Scrape::of(http, url).await;
        if scrape.value(series) == want {
            return scrape;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{series} stayed {} (want {want}):\n{}",
            scrape.value(series),
            scrape.0
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What the work must show, as (series, value) in the middle (A held, B timed out, C waiting) and at the
/// end (A and C released).
const MIDDLE: &[(&str, f64)] = &[
    ("inflight_admissions_total{result=\"admitted\"}", 1.0),
    ("inflight_admissions_total{result=\"rejected\"}", 1.0),
    ("inflight_admissions_total{result=\"error\"}", 0.0),
    ("inflight_releases_total", 0.0),
    ("inflight_in_flight", 1.0),
    ("inflight_waiting{class=\"default\"}", 1.0),
    ("inflight_wait_timeouts_total", 1.0),
    // A (admitted at once) and B (timed out): each could wait.
    ("inflight_wait_duration_seconds_count", 2.0),
    ("inflight_store_up", 1.0),
];
const END: &[(&str, f64)] = &[
    ("inflight_admissions_total{result=\"admitted\"}", 2.0),
    ("inflight_admissions_total{result=\"rejected\"}", 1.0),
    ("inflight_admissions_total{result=\"error\"}", 0.0),
    ("inflight_releases_total", 2.0),
    ("inflight_in_flight", 0.0),
    ("inflight_waiting{class=\"default\"}", 0.0),
    ("inflight_wait_timeouts_total", 1.0),
    ("inflight_wait_duration_seconds_count", 3.0),
    ("inflight_store_up", 1.0),
];

fn check(command: &str, stage: &str, scrape: &Scrape, want: &[(&str, f64)]) {
    for (series, value) in want {
        assert_eq!(
            scrape.value(series),
            *value,
            "{command}, {stage}: {series}\n{}",
            scrape.0
        );
    }
}

/// The work through `serve`'s API on key app:1 (limit 1): A acquired; B waits and times out; C waits
/// and is admitted when A is released; C released. Returns the scrapes in the middle and at the end.
async fn through_serve(http: &Client, api: &str) -> (Scrape, Scrape) {
    let metrics = format!("{api}/metrics");
    let permits = format!("{api}/v1/keys/app:1/permits");
    let acquire = || {
        http.post(&permits)
            .json(&json!({ "wait_ms": WAIT_MS }))
            .send()
    };
    let a = acquire().await.unwrap();
    assert_eq!(a.status(), StatusCode::CREATED);
    let a: Value = a.json().await.unwrap();
    let b = acquire().await.unwrap();
    assert_eq!(b.status(), StatusCode::TOO_MANY_REQUESTS);
    let c = tokio::spawn({
        let (http, permits) = (http.clone(), permits.clone());
        async move {
            let answer = http.post(&permits).json(&json!({ "wait_ms": 10_000 }));
            answer.send().await.unwrap()
        }
    });
    let middle = until(http, &metrics, "inflight_waiting{class=\"default\"}", 1.0).await;
    let released = http.delete(format!("{permits}/{}", a["id"].as_str().unwrap()));
    assert_eq!(
        released.send().await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    let c = c.await.unwrap();
    assert_eq!(c.status(), StatusCode::CREATED);
    let c: Value = c.json().await.unwrap();
    let released = http.delete(format!("{permits}/{}", c["id"].as_str().unwrap()));
    assert_eq!(
        released.send().await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    let end = until(http, &metrics, "inflight_releases_total", 2.0).await;
    (middle, end)
}

/// The same work through the proxy, each permit held by a streamed response of `/sse` (which sends its
/// last two events when the upstream's gate lets it).
async fn through_proxy(
    http: &Client,
    proxied: &str,
    admin: &str,
    upstream: &Upstream,
) -> (Scrape, Scrape) {
    let metrics = format!("{admin}/metrics");
    let sse = format!("{proxied}/sse");
    let get = || http.get(&sse).header("x-inflight-key", "app:1").send();
    let mut a = get().await.unwrap();
    assert_eq!(a.status(), StatusCode::OK);
    assert!(a.chunk().await.unwrap().is_some(), "the first event");
    let b = get().await.unwrap();
    assert_eq!(b.status(), StatusCode::TOO_MANY_REQUESTS);
    let c = tokio::spawn({
        let request = http.get(&sse).header("x-inflight-key", "app:1");
        async move { request.send().await.unwrap() }
    });
    let middle = until(http, &metrics, "inflight_waiting{class=\"default\"}", 1.0).await;
    upstream.gate.add_permits(2);
    while a.chunk().await.unwrap().is_some() {}
    let c = c.await.unwrap();
    assert_eq!(c.status(), StatusCode::OK);
    upstream.gate.add_permits(2);
    c.bytes().await.unwrap();
    let end = until(http, &metrics, "inflight_releases_total", 2.0).await;
    (middle, end)
}

/// `inflight serve` with a default limit of 1, on `workers` workers (and `extra` settings); its API.
fn serve(workers: &str, extra: &[&str]) -> (Running, String) {
    let mut args = vec![
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--workers",
        workers,
        "--default-limit",
        "1",
    ];
    args.extend_from_slice(extra);
    let (server, started) = Running::start(&args);
    let api = format!("http://{}", listen_of(&started));
    (server, api)
}

/// A proxy to `upstream` (with `extra` settings), its proxied port and its admin listener.
fn proxy(upstream: &Upstream, extra: &[&str]) -> (Running, String, String) {
    let max_wait = format!("{WAIT_MS}ms");
    let mut args = common::process::proxy_args(
        &upstream.base,
        &[
            "--workers",
            "2",
            "--default-limit",
            "1",
            "--max-wait",
            &max_wait,
        ],
    );
    args.extend_from_slice(extra);
    let (server, started) = Running::start(&args);
    let proxied = format!("http://{}", listen_of(&started));
    let admin = format!("http://{}", admin_of(&started));
    (server, proxied, admin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_and_proxy_count_the_same_work_the_same_way() {
    let http = Client::new();
    let (_serve, api) = serve("2", &[]);
    let (served_middle, served_end) = through_serve(&http, &api).await;
    check("serve", "middle", &served_middle, MIDDLE);
    check("serve", "end", &served_end, END);

    let upstream = Upstream::start().await;
    let (_proxy, proxied, admin) = proxy(&upstream, &[]);
    let (proxied_middle, proxied_end) = through_proxy(&http, &proxied, &admin, &upstream).await;
    check("proxy", "middle", &proxied_middle, MIDDLE);
    check("proxy", "end", &proxied_end, END);
    // And what only the proxy has: each request by status class, class of key and result.
    let proxied = |status: &str, result: &str| {
        let series = format!(
            "inflight_proxy_requests_total{{status_class=\"{status}\",class=\"default\",result=\"{result}\"}}"
        );
        proxied_end.value(&series)
    };
    assert_eq!(proxied("2xx", "admitted"), 2.0, "{}", proxied_end.0);
    assert_eq!(proxied("4xx", "refused"), 1.0, "{}", proxied_end.0);
    assert_eq!(
        proxied_end.value("inflight_upstream_duration_seconds_count"),
        2.0,
        "only the forwarded requests reached the upstream"
    );
    assert_eq!(upstream.hits(), 2);
}

/// A wait refused at once because its key's queue is full (`--max-waiters 1`) is a refusal, not a wait
/// that timed out: `inflight_wait_timeouts_total` counts only waits that ran their course.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_wait_queue_is_a_refusal_not_a_wait_timeout() {
    let http = Client::new();
    // One worker, so that every request meets the same queue.
    let (_server, api) = serve("1", &["--max-waiters", "1"]);
    let (metrics, permits) = (
        format!("{api}/metrics"),
        format!("{api}/v1/keys/app:1/permits"),
    );
    let acquire = |wait_ms: u64| {
        http.post(&permits)
            .json(&json!({ "wait_ms": wait_ms }))
            .send()
    };
    let held: Value = acquire(0).await.unwrap().json().await.unwrap();
    let waiter = tokio::spawn(acquire(10_000));
    until(&http, &metrics, "inflight_waiting{class=\"default\"}", 1.0).await;
    let asked = Instant::now();
    let refused = acquire(10_000).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(asked.elapsed() < Duration::from_secs(5), "refused at once");
    let scrape = Scrape::of(&http, &metrics).await;
    check(
        "serve",
        "queue full",
        &scrape,
        &[
            ("inflight_admissions_total{result=\"rejected\"}", 1.0),
            ("inflight_wait_timeouts_total", 0.0),
        ],
    );
    let released = http.delete(format!("{permits}/{}", held["id"].as_str().unwrap()));
    assert_eq!(
        released.send().await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(waiter.await.unwrap().unwrap().status(), StatusCode::CREATED);
}

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

/// The dashboard's panels: each with a title and a Prometheus query on the datasource variable.
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
    assert!(check_dashboard(&dashboard) >= 9, "the panels the docs list");
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

/// `inflight_store_up` follows the store: 1 with Redis up, 0 once it is stopped (and the admissions it
/// refuses meanwhile are `result="error"`), 1 again once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_up_follows_the_store() {
    let mut redis = common::TestRedis::start();
    let url = redis.url();
    let (_server, api) = serve("1", &["--store", &url]);
    let (http, metrics) = (Client::new(), format!("{api}/metrics"));
    until(&http, &metrics, "inflight_store_up", 1.0).await;
    redis.stop();
    until(&http, &metrics, "inflight_store_up", 0.0).await;
    let refused = http
        .post(format!("{api}/v1/keys/app:1/permits"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    let down = until(
        &http,
        &metrics,
        "inflight_admissions_total{result=\"error\"}",
        1.0,
    )
    .await;
    assert_eq!(down.value("inflight_store_up"), 0.0);
    redis.restart();
    until(&http, &metrics, "inflight_store_up", 1.0).await;
}
