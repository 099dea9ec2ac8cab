//! Prometheus metrics, low cardinality by default (per-key labels only when asked for); docs/metrics.md
//! lists each with its labels and the alerts to build on them, `describe.rs` has their `# HELP`.

mod describe;
mod proxied;
mod record;
mod scrape;

pub use proxied::{ProxiedClass, ProxyResult};
pub use record::{Proxying, Waiting};

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use record::InFlight;

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

const WAIT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

const STORE_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

const UPSTREAM_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// The most keys whose balances `--metrics-balances` follows.
pub const MAX_BALANCE_KEYS: usize = 10_000;

/// A server's metrics: its workers share one (clones), and every server in a process shares the counters
/// and histograms of the process's one recorder.
#[derive(Clone)]
pub struct Metrics {
    handle: PrometheusHandle,
    per_key: bool,
    admitted: metrics::Counter,
    rejected: metrics::Counter,
    errors: metrics::Counter,
    releases: metrics::Counter,
    store: [(&'static str, metrics::Histogram); 9],
    upstream: metrics::Histogram,
    wait_timeouts: metrics::Counter,
    in_flight: Arc<InFlight>,
    /// The series of `inflight_proxy_requests_total` of each class met.
    proxied: Arc<proxied::ProxiedClasses>,
    /// Admissions admitted and refused so far, for the status page's figures per minute.
    tally: Arc<[AtomicU64; 2]>,
    /// Admissions past shadow limits so far (the status page's figure), and when one was last logged.
    shadowed: Arc<[AtomicU64; 2]>,
}

const STORE_OPS: [&str; 9] = [
    "acquire",
    "release",
    "renew",
    "status",
    "set_limit",
    "record",
    "quota",
    "permits",
    "revoke",
];

/// How an admission ended, for `inflight_admissions_total`.
#[derive(Clone, Copy, Debug)]
pub enum AdmissionResult {
    /// A permit was granted.
    Admitted,
    /// Over the limit, or a weight that can never fit.
    Rejected,
    /// The store failed.
    Error,
}

/// Exports at 0 (class `default`) the series that the shipped dashboard and alerts use and that only
/// events would make: waits, proxied requests, revocations (and the responses they ended), shadow
/// refusals.
fn export_from_start() {
    metrics::gauge!("inflight_waiting", "class" => "default", "priority" => "0").increment(0.0);
    metrics::gauge!("inflight_tickets", "class" => "default").increment(0.0);
    drop(metrics::histogram!("inflight_wait_duration_seconds", "priority" => "0"));
    metrics::counter!(
        "inflight_proxy_requests_total",
        "status_class" => "2xx", "class" => "default", "result" => ProxyResult::Admitted.as_str()
    )
    .increment(0);
    metrics::counter!("inflight_proxy_streams_revoked_total", "class" => "default").increment(0);
    for kind in ["holder", "waiter"] {
        metrics::counter!("inflight_revocations_total", "class" => "default", "kind" => kind)
            .increment(0);
    }
    metrics::counter!("inflight_shadow_refusals_total", "class" => "default").increment(0);
}

impl Metrics {
    /// Installs the recorder on first use; `per_key` adds a `key` label to the admission counters. Every
    /// series the shipped dashboard and alerts use is exported from the start (zero).
    pub fn new(per_key: bool) -> Self {
        let handle = HANDLE
            .get_or_init(|| {
                let builder = [
                    ("inflight_store_duration_seconds", STORE_BUCKETS),
                    ("inflight_wait_duration_seconds", WAIT_BUCKETS),
                    ("inflight_upstream_duration_seconds", UPSTREAM_BUCKETS),
                ]
                .into_iter()
                .try_fold(PrometheusBuilder::new(), |builder, (name, buckets)| {
                    builder.set_buckets_for_metric(Matcher::Full(name.into()), buckets)
                })
                .unwrap_or_else(|_| PrometheusBuilder::new());
                let recorder = builder.build_recorder();
                let handle = recorder.handle();
                // Fails only if another recorder was installed first; the handle then renders nothing.
                if metrics::set_global_recorder(recorder).is_ok() {
                    describe::describe_all();
                }
                handle
            })
            .clone();
        export_from_start();
        Self {
            handle,
            per_key,
            admitted: metrics::counter!("inflight_admissions_total", "result" => "admitted"),
            rejected: metrics::counter!("inflight_admissions_total", "result" => "rejected"),
            errors: metrics::counter!("inflight_admissions_total", "result" => "error"),
            releases: metrics::counter!("inflight_releases_total"),
            in_flight: Arc::default(),
            proxied: Arc::default(),
            upstream: metrics::histogram!("inflight_upstream_duration_seconds"),
            wait_timeouts: metrics::counter!("inflight_wait_timeouts_total"),
            tally: Arc::default(),
            shadowed: Arc::default(),
            store: STORE_OPS.map(|op| {
                (
                    op,
                    metrics::histogram!("inflight_store_duration_seconds", "op" => op),
                )
            }),
        }
    }
}
