//! The `# HELP` of every metric the server exports: one table, described once when the recorder is
//! installed (docs/metrics.md says the same at more length).

/// How a metric is described to the recorder.
#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Every metric of the recorder: its name, kind and help. `inflight_in_flight` and `inflight_store_up`
/// are a server's own and written out by [`super::Metrics::scrape`].
const RECORDED: &[(&str, Kind, &str)] = &[
    (
        "inflight_admissions_total",
        Kind::Counter,
        "Admissions, by result: admitted, rejected (over the limit), error (the store failed).",
    ),
    (
        "inflight_releases_total",
        Kind::Counter,
        "Permits released that held a slot (a lease given back, a proxied response ended).",
    ),
    (
        "inflight_waiting",
        Kind::Gauge,
        "Admissions waiting for a slot now, by class of key and priority level.",
    ),
    (
        "inflight_wait_duration_seconds",
        Kind::Histogram,
        "How long admissions that could wait waited, admitted or not, by priority level.",
    ),
    (
        "inflight_wait_timeouts_total",
        Kind::Counter,
        "Waits that ran their course without a slot (a full queue's refusal at once is not one).",
    ),
    (
        "inflight_tickets_expired_total",
        Kind::Counter,
        "Waiters' tickets found expired in the keys' queues: their processes stopped renewing them (killed, paused, cut off).",
    ),
    (
        "inflight_store_duration_seconds",
        Kind::Histogram,
        "How long store operations took, by operation.",
    ),
    (
        "inflight_leases_reclaimed_total",
        Kind::Counter,
        "Expired leases that admissions reclaimed: their holders went away without releasing (crashed).",
    ),
    (
        "inflight_leases_lost_total",
        Kind::Counter,
        "Held permits whose lease was gone at renewal and could not come back.",
    ),
    (
        "inflight_leases_readded_total",
        Kind::Counter,
        "Held permits whose lease was gone at renewal (the store had lost it) and was added again.",
    ),
    (
        "inflight_reservations_total",
        Kind::Counter,
        "Quota reservations ended, by outcome: committed, refunded, expired.",
    ),
    (
        "inflight_quota_balance",
        Kind::Gauge,
        "With --metrics-balances: the sum, by class of key, of the last balance seen of each key.",
    ),
    (
        "inflight_quota_reserved",
        Kind::Gauge,
        "With --metrics-balances: the sum, by class of key, of what open reservations of each key hold.",
    ),
    (
        "inflight_proxy_requests_total",
        Kind::Counter,
        "Requests the proxy answered, by status class, class of key and result: admitted (forwarded \
         under a slot), unlimited (forwarded without one), refused (429 from the proxy), error (another \
         answer of the proxy's own).",
    ),
    (
        "inflight_upstream_duration_seconds",
        Kind::Histogram,
        "How long the upstream took to send its response headers (connecting and sending included).",
    ),
    (
        "inflight_tls_handshake_failures_total",
        Kind::Counter,
        "Connections to a TLS port closed in their handshake, by reason: timeout or error.",
    ),
];

pub(super) const IN_FLIGHT: &str =
    "Permits in flight through this server: proxied responses, leases lent over HTTP.";

pub(super) const STORE_UP: &str =
    "1 when the store answered this scrape's check (a PING on Redis), 0 when it did not.";

/// Describes every recorded metric to the installed recorder.
pub(super) fn describe_all() {
    for &(name, kind, help) in RECORDED {
        match kind {
            Kind::Counter => metrics::describe_counter!(name, help),
            Kind::Gauge => metrics::describe_gauge!(name, help),
            Kind::Histogram => metrics::describe_histogram!(name, help),
        }
    }
}
