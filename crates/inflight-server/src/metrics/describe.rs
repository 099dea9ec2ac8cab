//! The `# HELP` of every metric the server exports: a table a kind, described once when the recorder
//! is installed (docs/metrics.md says the same at more length).

/// The counters of the recorder: their names and help. `inflight_in_flight` and `inflight_store_up`
/// are a server's own and written out by [`super::Metrics::scrape`].
const COUNTERS: &[(&str, &str)] = &[
    (
        "inflight_admissions_total",
        "Admissions, by result: admitted, rejected (over the limit), error (the store failed).",
    ),
    (
        "inflight_releases_total",
        "Permits released that held a slot (a lease given back, a proxied response ended).",
    ),
    (
        "inflight_wait_timeouts_total",
        "Waits that ran their course without a slot (a full queue's refusal at once is not one).",
    ),
    (
        "inflight_tickets_expired_total",
        "Waiters' tickets found expired in the keys' queues: their processes stopped renewing them (killed, paused, cut off).",
    ),
    (
        "inflight_leases_reclaimed_total",
        "Expired leases that admissions reclaimed: their holders went away without releasing (crashed).",
    ),
    (
        "inflight_leases_lost_total",
        "Held permits whose lease was gone at renewal and could not come back.",
    ),
    (
        "inflight_leases_readded_total",
        "Held permits whose lease was gone at renewal (the store had lost it) and was added again.",
    ),
    (
        "inflight_reservations_total",
        "Quota reservations ended, by outcome: committed, refunded, expired.",
    ),
    (
        "inflight_proxy_requests_total",
        "Requests the proxy answered, by status class, class of key and result: admitted (forwarded \
         under a slot), unlimited (forwarded without one), refused (429 from the proxy), error (another \
         answer of the proxy's own).",
    ),
    (
        "inflight_proxy_streams_revoked_total",
        "Proxied requests the proxy ended because their permit was revoked (or its lease lost) while \
         they ran, with --on-revoke end, by class of key: a response cut short, or 409 revoked before \
         the upstream answered.",
    ),
    (
        "inflight_revocations_total",
        "Holders and waiters an admin revoked through this server, by class of key and kind.",
    ),
    (
        "inflight_shadow_refusals_total",
        "Admissions a shadow limit would have refused: admitted past it, by class of key (a shadow rule \
         watches a limit without enforcing it).",
    ),
    (
        "inflight_tls_handshake_failures_total",
        "Connections to a TLS port closed in their handshake, by reason: timeout or error.",
    ),
];

/// Its gauges.
const GAUGES: &[(&str, &str)] = &[
    (
        "inflight_waiting",
        "Admissions waiting for a slot now, by class of key and priority level.",
    ),
    (
        "inflight_tickets",
        "Admissions of this server waiting now on a store that keeps a queue per key (memory, Redis), by \
         class of key: each holds a ticket, a place in its key's shared queue, while refused. Counted for \
         the whole wait, as inflight_waiting: the server does not see when the ticket is queued.",
    ),
    (
        "inflight_quota_balance",
        "With --metrics-balances: the sum, by class of key, of the last balance seen of each key.",
    ),
    (
        "inflight_quota_reserved",
        "With --metrics-balances: the sum, by class of key, of what open reservations of each key hold.",
    ),
];

/// Its histograms.
const HISTOGRAMS: &[(&str, &str)] = &[
    (
        "inflight_wait_duration_seconds",
        "How long admissions that could wait waited, admitted or not, by priority level.",
    ),
    (
        "inflight_store_duration_seconds",
        "How long store operations took, by operation.",
    ),
    (
        "inflight_upstream_duration_seconds",
        "How long the upstream took to send its response headers (connecting and sending included).",
    ),
];

pub(super) const IN_FLIGHT: &str =
    "Permits in flight through this server: proxied responses, leases lent over HTTP.";

pub(super) const STORE_UP: &str =
    "1 when the store answered this scrape's check (a PING on Redis), 0 when it did not.";

/// Describes every recorded metric to the installed recorder.
pub(super) fn describe_all() {
    for &(name, help) in COUNTERS {
        metrics::describe_counter!(name, help);
    }
    for &(name, help) in GAUGES {
        metrics::describe_gauge!(name, help);
    }
    for &(name, help) in HISTOGRAMS {
        metrics::describe_histogram!(name, help);
    }
}
