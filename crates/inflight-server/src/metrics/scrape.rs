//! The metrics page: the limiter's and the quotas' counters brought up to date, the store checked, and
//! this server's own gauges.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use inflight::quota::QuotaStats;
use inflight::{AnyStore, Clock, Limiter, Store, SystemClock};

use super::{describe, Metrics};

/// How long the scrape's check of the store may take before the store counts as down.
const STORE_CHECK_TIMEOUT: Duration = Duration::from_secs(1);

impl Metrics {
    /// Brings `inflight_reservations_total` up to date with how the server's reservations have ended,
    /// and the balances per class (of `policy`) with the last ones seen.
    fn reservations(&self, stats: &QuotaStats, policy: &inflight::Policy) {
        let mut classes: HashMap<&str, (u64, u64)> = HashMap::new();
        for (key, balance) in stats.balances() {
            let sums = classes.entry(policy.class_of(&key)).or_default();
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

    /// The metrics page of a worker with `limiter` and `quota`: the store checked (within a second).
    pub async fn scrape(&self, limiter: &Limiter<AnyStore>, quota: &QuotaStats) -> String {
        self.reservations(quota, &limiter.policy());
        let check = tokio::time::timeout(STORE_CHECK_TIMEOUT, limiter.store().maintain());
        let store_up = matches!(check.await, Ok(Ok(())));
        metrics::counter!("inflight_tickets_expired_total")
            .absolute(inflight::Wakeups::tickets_expired(limiter.store()));
        self.render(limiter.stats(), store_up)
    }

    /// The Prometheus text, with the limiter's own counters and `store_up` brought up to date.
    fn render(&self, stats: &inflight::LimiterStats, store_up: bool) -> String {
        metrics::counter!("inflight_leases_reclaimed_total")
            .absolute(stats.reclaimed.load(Ordering::Relaxed));
        metrics::counter!("inflight_leases_lost_total")
            .absolute(stats.lost.load(Ordering::Relaxed));
        metrics::counter!("inflight_leases_readded_total")
            .absolute(stats.readded.load(Ordering::Relaxed));
        let lent = {
            let mut lent = self.in_flight.lent();
            let now = SystemClock.now_ms();
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
