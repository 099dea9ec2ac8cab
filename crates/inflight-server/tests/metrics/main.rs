//! The metrics as the binary exports them: the same work through `serve` and through `proxy` gives the
//! same admissions, releases, in flight and waiters; and the Grafana dashboard, the Prometheus alert rules
//! and docs/metrics.md name only metrics that the binary exports.
//!
//! By theme: the counts of the same work through serve and proxy (counts.rs), the series by class of
//! key (classes.rs), and the metric names the dashboard, the alert rules and the docs use (names.rs).
#![allow(missing_docs)]

mod classes;
#[path = "../common/mod.rs"]
mod common;
mod counts;
mod names;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use reqwest::{Client, StatusCode};

use common::process::{admin_of, listen_of, Running};
use common::Upstream;

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
        self.sample(series).unwrap_or(0.0)
    }

    /// The value of `series`, `None` when absent.
    fn sample(&self, series: &str) -> Option<f64> {
        self.0
            .lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
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
    let middle = until(
        http,
        &metrics,
        "inflight_waiting{class=\"default\",priority=\"0\"}",
        1.0,
    )
    .await;
    upstream.gate.add_permits(2);
    while a.chunk().await.unwrap().is_some() {}
    let c = c.await.unwrap();
    assert_eq!(c.status(), StatusCode::OK);
    upstream.gate.add_permits(2);
    c.bytes().await.unwrap();
    let end = until(http, &metrics, "inflight_releases_total", 2.0).await;
    (middle, end)
}
