//! What the request path records: admissions, releases, waits, store and upstream latencies, proxied
//! requests, and what `inflight_in_flight` counts (proxied responses, leases lent over HTTP).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use http::StatusCode;
use inflight::{AnyStore, Clock, SystemClock};

use super::{proxied, AdmissionResult, Metrics, ProxiedClass, ProxyResult};

/// Leases handed out over HTTP that `inflight_in_flight` counts, at most (past this, new ones go uncounted).
const MAX_LENT: usize = 100_000;

/// What `inflight_in_flight` counts, for one server.
#[derive(Default)]
pub(super) struct InFlight {
    /// Permits held by proxied responses.
    pub(super) proxied: AtomicU64,
    /// Leases handed out over HTTP: (key, id) -> when the lease ends (ms since the Unix epoch) unless renewed.
    lent: Mutex<HashMap<(String, String), u64>>,
}

impl InFlight {
    pub(super) fn lent(&self) -> MutexGuard<'_, HashMap<(String, String), u64>> {
        self.lent.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Metrics {
    /// Counts an admission.
    pub fn admission(&self, key: &str, result: AdmissionResult) {
        let [admitted, refused] = &*self.tally;
        let (counter, label, tally) = match result {
            AdmissionResult::Admitted => (&self.admitted, "admitted", Some(admitted)),
            AdmissionResult::Rejected => (&self.rejected, "rejected", Some(refused)),
            AdmissionResult::Error => (&self.errors, "error", None),
        };
        if let Some(tally) = tally {
            tally.fetch_add(1, Ordering::Relaxed);
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

    /// The series of proxied requests of `class` (a `[[limits]]` pattern, or `default`).
    pub fn proxied_class(&self, class: &str) -> Arc<ProxiedClass> {
        self.proxied.get(class)
    }

    /// The series of proxied requests under no key (class `none`).
    pub fn no_class(&self) -> Arc<ProxiedClass> {
        self.proxied.none.clone()
    }

    /// Counts a request the proxy answered with `status`, under `class` and, per key, `key`.
    pub fn proxied(
        &self,
        status: StatusCode,
        class: &ProxiedClass,
        key: Option<&str>,
        result: ProxyResult,
    ) {
        match key.filter(|_| self.per_key) {
            Some(key) => metrics::counter!(
                "inflight_proxy_requests_total",
                "status_class" => proxied::status_class(status), "class" => class.name().to_owned(),
                "result" => result.as_str(), "key" => key.to_owned()
            )
            .increment(1),
            None => class.counter(status, result).increment(1),
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

    /// Counts an admission of `key` of `class` past a shadow limit, logged at most once a second (with
    /// how many went unlogged since).
    pub fn shadow_refused(&self, class: &str, key: &str) {
        metrics::counter!("inflight_shadow_refusals_total", "class" => class.to_owned())
            .increment(1);
        let [count, logged_at] = &*self.shadowed;
        let total = count.fetch_add(1, Ordering::Relaxed) + 1;
        let now = SystemClock.now_ms();
        let last = logged_at.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= 1000
            && logged_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                class,
                key,
                total,
                "admitted past a shadow limit (watched, not enforced)"
            );
        }
    }

    /// Admissions past shadow limits so far.
    pub fn shadow_refusals(&self) -> u64 {
        self.shadowed[0].load(Ordering::Relaxed)
    }

    /// Counts a holder or a waiter (`kind`) of `class` an admin revoked.
    pub fn revoked(&self, class: &str, kind: &'static str) {
        metrics::counter!("inflight_revocations_total", "class" => class.to_owned(), "kind" => kind)
            .increment(1);
    }

    /// Records how long a store operation took.
    pub fn store_latency(&self, op: &'static str, took: Duration) {
        if let Some((_, histogram)) = self.store.iter().find(|(name, _)| *name == op) {
            histogram.record(took.as_secs_f64());
        }
    }

    /// An admission of `class` that may wait at `priority` on `store`: counted as waiting until
    /// [`Waiting::done`], and as holding a ticket meanwhile when the store takes tickets.
    pub fn waiting(&self, class: &str, priority: u8, store: &AnyStore) -> Waiting {
        let priority = priority.to_string();
        let labels = [("class", class.to_owned()), ("priority", priority.clone())];
        let gauge = metrics::gauge!("inflight_waiting", &labels);
        gauge.increment(1.0);
        let tickets = takes_tickets(store).then(|| {
            let tickets = metrics::gauge!("inflight_tickets", "class" => class.to_owned());
            tickets.increment(1.0);
            tickets
        });
        Waiting {
            gauge,
            tickets,
            duration: metrics::histogram!("inflight_wait_duration_seconds", "priority" => priority),
            timeouts: self.wait_timeouts.clone(),
        }
    }

    /// One more response proxied under a permit that holds a slot: see [`Proxying`].
    pub fn proxying(&self) -> Proxying {
        self.in_flight.proxied.fetch_add(1, Ordering::Relaxed);
        Proxying {
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
            let now = SystemClock.now_ms();
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
}

/// Whether waiters on `store` take tickets, places in a queue per key that every process sharing the
/// store shares ([`inflight::Wakeups::ticket`]): the memory store and Redis (Dify's layout too) do. The
/// limiter does not tell when a waiter's ticket is in the queue (from its first refusal to its wait's
/// end), and asking the store for a ticket to know would take one (on Redis, subscribe to its turns).
fn takes_tickets(store: &AnyStore) -> bool {
    matches!(
        store,
        AnyStore::Memory(_) | AnyStore::Redis(_) | AnyStore::Dify(_)
    )
}

/// An admission waiting for a slot, in `inflight_waiting` (and, on a store that takes tickets, in
/// `inflight_tickets`) until done or dropped (its client went away).
pub struct Waiting {
    gauge: metrics::Gauge,
    tickets: Option<metrics::Gauge>,
    duration: metrics::Histogram,
    timeouts: metrics::Counter,
}

impl Waiting {
    /// The wait ended after `waited`, without a slot when `timed_out`.
    pub fn done(self, waited: Duration, timed_out: bool) {
        self.duration.record(waited.as_secs_f64());
        if timed_out {
            self.timeouts.increment(1);
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.gauge.decrement(1.0);
        if let Some(tickets) = &self.tickets {
            tickets.decrement(1.0);
        }
    }
}

/// A response proxied under a permit that holds a slot, counted in `inflight_in_flight`; dropped,
/// counted as released.
pub struct Proxying {
    in_flight: Arc<InFlight>,
    releases: metrics::Counter,
}

impl Drop for Proxying {
    fn drop(&mut self) {
        self.in_flight.proxied.fetch_sub(1, Ordering::Relaxed);
        self.releases.increment(1);
    }
}
