//! Prometheus metrics, low cardinality by default (per-key labels only when asked for):
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `inflight_admissions_total` | counter | `result` = admitted / rejected / error |
//! | `inflight_releases_total` | counter | |
//! | `inflight_in_flight` | gauge | permits this process holds (proxied responses) |
//! | `inflight_leases_reclaimed_total` | counter | expired leases reclaimed: a sign of crashed holders |
//! | `inflight_leases_lost_total` | counter | held permits whose lease was gone and could not come back |
//! | `inflight_store_duration_seconds` | histogram | `op` = acquire / release / renew / status / set_limit |

use std::sync::atomic::Ordering;
use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

const STORE_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// The process's metrics (one recorder per process, shared by every server in it). The handles of the
/// fixed series are registered once, so the request path only bumps atomics.
#[derive(Clone)]
pub struct Metrics {
    handle: PrometheusHandle,
    per_key: bool,
    admitted: metrics::Counter,
    rejected: metrics::Counter,
    errors: metrics::Counter,
    releases: metrics::Counter,
    in_flight: metrics::Gauge,
    store: [(&'static str, metrics::Histogram); 5],
}

const STORE_OPS: [&str; 5] = ["acquire", "release", "renew", "status", "set_limit"];

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

impl Metrics {
    /// Installs the recorder on first use; `per_key` adds a `key` label to the admission counters.
    pub fn new(per_key: bool) -> Self {
        let handle = HANDLE
            .get_or_init(|| {
                let builder = PrometheusBuilder::new()
                    .set_buckets_for_metric(
                        Matcher::Full("inflight_store_duration_seconds".into()),
                        STORE_BUCKETS,
                    )
                    .unwrap_or_else(|_| PrometheusBuilder::new());
                let recorder = builder.build_recorder();
                let handle = recorder.handle();
                // Fails only if another recorder was installed first; the handle then renders nothing.
                let _ = metrics::set_global_recorder(recorder);
                handle
            })
            .clone();
        Self {
            handle,
            per_key,
            admitted: metrics::counter!("inflight_admissions_total", "result" => "admitted"),
            rejected: metrics::counter!("inflight_admissions_total", "result" => "rejected"),
            errors: metrics::counter!("inflight_admissions_total", "result" => "error"),
            releases: metrics::counter!("inflight_releases_total"),
            in_flight: metrics::gauge!("inflight_in_flight"),
            store: STORE_OPS.map(|op| {
                (
                    op,
                    metrics::histogram!("inflight_store_duration_seconds", "op" => op),
                )
            }),
        }
    }

    /// Counts an admission.
    pub fn admission(&self, key: &str, result: AdmissionResult) {
        let (counter, label) = match result {
            AdmissionResult::Admitted => (&self.admitted, "admitted"),
            AdmissionResult::Rejected => (&self.rejected, "rejected"),
            AdmissionResult::Error => (&self.errors, "error"),
        };
        if self.per_key {
            metrics::counter!("inflight_admissions_total", "result" => label, "key" => key.to_owned())
                .increment(1);
        } else {
            counter.increment(1);
        }
    }

    /// Counts a release.
    pub fn release(&self) {
        self.releases.increment(1);
    }

    /// Records how long a store operation took.
    pub fn store_latency(&self, op: &'static str, took: Duration) {
        if let Some((_, histogram)) = self.store.iter().find(|(name, _)| *name == op) {
            histogram.record(took.as_secs_f64());
        }
    }

    /// One more permit held by this process until the guard is dropped.
    pub fn hold(&self) -> InFlightGuard {
        self.in_flight.increment(1.0);
        InFlightGuard(self.in_flight.clone())
    }

    /// The Prometheus text, with the limiter's own counters brought up to date.
    pub fn render(&self, stats: &inflight::LimiterStats) -> String {
        metrics::counter!("inflight_leases_reclaimed_total")
            .absolute(stats.reclaimed.load(Ordering::Relaxed));
        metrics::counter!("inflight_leases_lost_total")
            .absolute(stats.lost.load(Ordering::Relaxed));
        metrics::counter!("inflight_leases_readded_total")
            .absolute(stats.readded.load(Ordering::Relaxed));
        self.handle.render()
    }
}

/// Decrements `inflight_in_flight` when dropped.
pub struct InFlightGuard(metrics::Gauge);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}
