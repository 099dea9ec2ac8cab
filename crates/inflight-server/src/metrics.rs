//! Prometheus metrics, low cardinality by default (per-key labels only when asked for):
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `inflight_admissions_total` | counter | `result` = admitted / rejected / error |
//! | `inflight_releases_total` | counter | |
//! | `inflight_in_flight` | gauge | permits in flight through this server: proxied responses', leases lent over HTTP |
//! | `inflight_leases_reclaimed_total` | counter | expired leases reclaimed: a sign of crashed holders |
//! | `inflight_leases_lost_total` | counter | held permits whose lease was gone and could not come back |
//! | `inflight_store_duration_seconds` | histogram | `op` = acquire / release / renew / status / set_limit / record / quota |
//! | `inflight_waiting` | gauge | `class` = the key's `[[limits]]` pattern, or `default`: admissions waiting for a slot |
//! | `inflight_wait_duration_seconds` | histogram | how long admissions that could wait waited |
//! | `inflight_wait_timeouts_total` | counter | waits that ran their course without a slot |
//! | `inflight_reservations_total` | counter | `outcome` = committed / refunded / expired (refunded by the store when their ttl passed) |
//! | `inflight_proxy_requests_total` | counter | `status_class` = 1xx..5xx, `class`, `result` = admitted / unlimited / refused / error |
//! | `inflight_upstream_duration_seconds` | histogram | the proxy's upstream, until its response headers |
//! | `inflight_store_up` | gauge | 1 when the store answered the scrape's check, else 0 |
//! | `inflight_quota_balance`, `inflight_quota_reserved` | gauge | `class`: with `--metrics-balances`, the sum of the last balance (what can be reserved; what open reservations hold) this process was answered for each key of the class |
//!
//! docs/metrics.md describes each, with the alerts to build on them; `describe.rs` has their `# HELP`.

mod describe;
mod proxied;

pub use proxied::ProxyResult;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime};

use http::StatusCode;
use inflight::quota::QuotaStats;
use inflight::{AnyStore, Limiter, Store};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

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

/// How long the scrape's check of the store may take before the store counts as down.
const STORE_CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// The most keys whose balances `--metrics-balances` follows.
pub const MAX_BALANCE_KEYS: usize = 10_000;

/// The class of `key` in metrics' labels: the pattern of its `[[limits]]` rule, or `default`.
pub fn class_of<'p>(policy: &'p inflight::Policy, key: &str) -> &'p str {
    policy
        .rule_for(key)
        .map_or("default", |rule| rule.pattern())
}

/// Leases handed out over HTTP that `inflight_in_flight` counts, at most (past this, new ones go uncounted).
const MAX_LENT: usize = 100_000;

/// A server's metrics: its workers share one (clones), and every server in a process shares the counters
/// and histograms of the process's one recorder. The handles of the fixed series are registered once, so
/// the request path only bumps atomics.
#[derive(Clone)]
pub struct Metrics {
    handle: PrometheusHandle,
    per_key: bool,
    admitted: metrics::Counter,
    rejected: metrics::Counter,
    errors: metrics::Counter,
    releases: metrics::Counter,
    store: [(&'static str, metrics::Histogram); 7],
    upstream: metrics::Histogram,
    in_flight: Arc<InFlight>,
    /// Admissions admitted and refused so far, for the status page's figures per minute.
    tally: Arc<[AtomicU64; 2]>,
}

/// What `inflight_in_flight` counts, for one server.
#[derive(Default)]
struct InFlight {
    /// Permits held by proxied responses.
    proxied: AtomicU64,
    /// Leases handed out over HTTP: (key, id) -> when the lease ends (ms since the Unix epoch) unless renewed.
    lent: Mutex<HashMap<(String, String), u64>>,
}

impl InFlight {
    fn lent(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), u64>> {
        self.lent.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn now_ms() -> u64 {
    let since_epoch = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH);
    since_epoch.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

const STORE_OPS: [&str; 7] = [
    "acquire",
    "release",
    "renew",
    "status",
    "set_limit",
    "record",
    "quota",
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
                    .and_then(|builder| {
                        builder.set_buckets_for_metric(
                            Matcher::Full("inflight_wait_duration_seconds".into()),
                            WAIT_BUCKETS,
                        )
                    })
                    .and_then(|builder| {
                        builder.set_buckets_for_metric(
                            Matcher::Full("inflight_upstream_duration_seconds".into()),
                            UPSTREAM_BUCKETS,
                        )
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
        Self {
            handle,
            per_key,
            admitted: metrics::counter!("inflight_admissions_total", "result" => "admitted"),
            rejected: metrics::counter!("inflight_admissions_total", "result" => "rejected"),
            errors: metrics::counter!("inflight_admissions_total", "result" => "error"),
            releases: metrics::counter!("inflight_releases_total"),
            in_flight: Arc::default(),
            upstream: metrics::histogram!("inflight_upstream_duration_seconds"),
            tally: Arc::default(),
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
        let [admitted, refused] = &*self.tally;
        match result {
            AdmissionResult::Admitted => {
                admitted.fetch_add(1, Ordering::Relaxed);
            }
            AdmissionResult::Rejected => {
                refused.fetch_add(1, Ordering::Relaxed);
            }
            AdmissionResult::Error => {}
        }
        if self.per_key {
            metrics::counter!("inflight_admissions_total", "result" => label, "key" => key.to_owned())
                .increment(1);
        } else {
            counter.increment(1);
        }
    }

    /// Whether metrics (and the access log) may name keys.
    pub fn per_key(&self) -> bool {
        self.per_key
    }

    /// Counts a request the proxy answered with `status`, under a key of `class` (`none` when it had
    /// no key) and, with per-key metrics, `key`.
    pub fn proxied(&self, status: StatusCode, class: &str, key: Option<&str>, result: ProxyResult) {
        let (status_class, result, class) = (
            proxied::status_class(status),
            result.as_str(),
            class.to_owned(),
        );
        match key.filter(|_| self.per_key) {
            Some(key) => metrics::counter!(
                "inflight_proxy_requests_total",
                "status_class" => status_class, "class" => class, "result" => result, "key" => key.to_owned()
            )
            .increment(1),
            None => metrics::counter!(
                "inflight_proxy_requests_total",
                "status_class" => status_class, "class" => class, "result" => result
            )
            .increment(1),
        }
    }

    /// Records how long the upstream took until its response headers.
    pub fn upstream_latency(&self, took: Duration) {
        self.upstream.record(took.as_secs_f64());
    }

    /// Admissions of this server so far: (admitted, refused).
    pub fn admissions(&self) -> (u64, u64) {
        let [admitted, refused] = &*self.tally;
        (
            admitted.load(Ordering::Relaxed),
            refused.load(Ordering::Relaxed),
        )
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

    /// An admission of `class` that may wait: counted as waiting until [`Waiting::done`].
    pub fn waiting(&self, class: &str) -> Waiting {
        let gauge = metrics::gauge!("inflight_waiting", "class" => class.to_owned());
        gauge.increment(1.0);
        Waiting { gauge }
    }

    /// One more permit held by a proxied response: in flight until the guard is dropped, which counts its
    /// release.
    pub fn hold(&self) -> Held {
        self.in_flight.proxied.fetch_add(1, Ordering::Relaxed);
        Held {
            in_flight: self.in_flight.clone(),
            releases: self.releases.clone(),
        }
    }

    /// A lease handed out over HTTP, in flight until `expires_at_ms` (0: nothing is held, not counted).
    pub fn lent(&self, key: &str, id: &str, expires_at_ms: u64) {
        if expires_at_ms == 0 {
            return;
        }
        let mut lent = self.in_flight.lent();
        if lent.len() >= MAX_LENT {
            let now = now_ms();
            lent.retain(|_, expires| *expires > now);
        }
        if lent.len() < MAX_LENT {
            lent.insert((key.to_owned(), id.to_owned()), expires_at_ms);
        }
    }

    /// A lease handed out over HTTP was renewed until `expires_at_ms`.
    pub fn renewed(&self, key: &str, id: &str, expires_at_ms: u64) {
        if let Some(expires) = self
            .in_flight
            .lent()
            .get_mut(&(key.to_owned(), id.to_owned()))
        {
            *expires = expires_at_ms;
        }
    }

    /// A lease handed out over HTTP has ended: released, or lost.
    pub fn returned(&self, key: &str, id: &str) {
        self.in_flight
            .lent()
            .remove(&(key.to_owned(), id.to_owned()));
    }

    /// Brings `inflight_reservations_total` up to date with how the server's reservations have ended,
    /// and the balances per class (of `policy`) with the last ones seen.
    fn reservations(&self, stats: &QuotaStats, policy: &inflight::Policy) {
        let mut classes: HashMap<&str, (u64, u64)> = HashMap::new();
        for (key, balance) in stats.balances() {
            let sums = classes.entry(class_of(policy, &key)).or_default();
            sums.0 = sums.0.saturating_add(balance.balance);
            sums.1 = sums.1.saturating_add(balance.reserved);
        }
        for (class, (balance, reserved)) in classes {
            let class = class.to_owned();
            metrics::gauge!("inflight_quota_balance", "class" => class.clone()).set(balance as f64);
            metrics::gauge!("inflight_quota_reserved", "class" => class).set(reserved as f64);
        }
        for (outcome, count) in [
            ("committed", &stats.committed),
            ("refunded", &stats.refunded),
            ("expired", &stats.expired),
        ] {
            metrics::counter!("inflight_reservations_total", "outcome" => outcome)
                .absolute(count.load(Ordering::Relaxed));
        }
    }

    /// The metrics page of a worker with `limiter` and the reservations `quota` counts: the store checked
    /// (within a second), the counters brought up to date.
    pub async fn scrape(&self, limiter: &Limiter<AnyStore>, quota: &QuotaStats) -> String {
        self.reservations(quota, &limiter.policy());
        let check = tokio::time::timeout(STORE_CHECK_TIMEOUT, limiter.store().maintain());
        let store_up = matches!(check.await, Ok(Ok(())));
        self.render(limiter.stats(), store_up)
    }

    /// The Prometheus text, with the limiter's own counters brought up to date and `store_up` (whether
    /// the store answered a check just now).
    fn render(&self, stats: &inflight::LimiterStats, store_up: bool) -> String {
        metrics::counter!("inflight_leases_reclaimed_total")
            .absolute(stats.reclaimed.load(Ordering::Relaxed));
        metrics::counter!("inflight_leases_lost_total")
            .absolute(stats.lost.load(Ordering::Relaxed));
        metrics::counter!("inflight_leases_readded_total")
            .absolute(stats.readded.load(Ordering::Relaxed));
        let lent = {
            let mut lent = self.in_flight.lent();
            let now = now_ms();
            lent.retain(|_, expires| *expires > now);
            lent.len() as u64
        };
        let in_flight = self.in_flight.proxied.load(Ordering::Relaxed) + lent;
        // This server's own, where the recorder's gauges are the process's.
        let mut text = self.handle.render();
        for (name, help, value) in [
            ("inflight_in_flight", describe::IN_FLIGHT, in_flight),
            ("inflight_store_up", describe::STORE_UP, u64::from(store_up)),
        ] {
            text.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}\n"
            ));
        }
        text
    }
}

/// An admission waiting for a slot, in `inflight_waiting` until done or dropped (its client went away).
pub struct Waiting {
    gauge: metrics::Gauge,
}

impl Waiting {
    /// The wait ended after `waited`, without a slot when `timed_out`.
    pub fn done(self, waited: Duration, timed_out: bool) {
        metrics::histogram!("inflight_wait_duration_seconds").record(waited.as_secs_f64());
        if timed_out {
            metrics::counter!("inflight_wait_timeouts_total").increment(1);
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.gauge.decrement(1.0);
    }
}

/// A permit held by a proxied response, counted in `inflight_in_flight`; dropped, counted as released.
pub struct Held {
    in_flight: Arc<InFlight>,
    releases: metrics::Counter,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.in_flight.proxied.fetch_sub(1, Ordering::Relaxed);
        self.releases.increment(1);
    }
}
