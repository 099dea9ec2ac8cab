//! What every handler of a worker shares: the limiter, the quotas, the tokens, the metrics, the status
//! board; and where every admission, renewal and release over HTTP or through the proxy is timed and
//! counted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use inflight::store::{IndexOp, Recorded};
use inflight::{
    AcquireError, AcquireOptions, AnyStore, KeyRefused, Keys, Lease, Limiter, Permit, PermitId,
    RemoteLease, Renewal, Store, StoreError,
};

use inflight_tower::rejection::{limit_header, Refusing};

use crate::error::ApiError;
use crate::metrics::{AdmissionResult, Metrics};

mod charge;
mod listings;

pub use charge::{quota_error, Charge};
pub use listings::{ListingPlace, Listings, MAX_LISTINGS};

/// The state of one worker of a server.
pub struct App {
    /// The worker's limiter, which every request it serves goes through.
    pub limiter: Limiter<AnyStore>,
    /// The balances of keys, over the same store (`charge.rs` charges admissions to them).
    pub quota: inflight::Quota,
    /// The bearer tokens its routes need.
    pub tokens: crate::auth::Tokens,
    /// Whether an override may be set only on a key of a `--limit` class (not on one with the defaults).
    pub overrides_for_classes_only: bool,
    /// The server's metrics, shared by its workers.
    pub metrics: Metrics,
    /// Set when the worker's shutdown grace period is over: responses still streaming end then.
    pub cut: tokio::sync::watch::Sender<bool>,
    /// The status page's board: its watchers, what it shows, the last minute of counts.
    pub status: Arc<crate::status::Board>,
    /// The places of listings of busy keys in progress, shared by the process's workers.
    pub listings: Listings,
    /// The priority levels an admission may ask for (`--priorities`; empty: any).
    pub priorities: Arc<[u8]>,
}

impl App {
    /// Runs a store operation and records its latency under `op`.
    pub async fn timed<T>(
        &self,
        op: &'static str,
        work: impl std::future::Future<Output = T>,
    ) -> T {
        let started = Instant::now();
        let out = work.await;
        self.metrics.store_latency(op, started.elapsed());
        out
    }

    /// Admits a request under `key`, waiting up to `wait` for a slot; times and counts every admission.
    pub async fn acquire(
        &self,
        key: &str,
        options: AcquireOptions,
        wait: Duration,
    ) -> Result<Permit, AcquireError> {
        let outcome = if wait.is_zero() {
            let admission = self.limiter.try_acquire_with(key, options);
            self.timed("acquire", admission).await
        } else {
            let priority = options.priority_level();
            let admission = self.limiter.acquire(key, options.max_wait(wait));
            // Boxed (as below): a wait's future is large, and every request's future (moved whole by
            // hyper, every byte copied) would carry it, waiting or not.
            Box::pin(self.waited((key, priority), wait, admission, AcquireError::is_full)).await
        };
        self.count_admission(key, outcome.as_ref().err());
        outcome
    }

    /// Runs an admission that may wait up to `wait`, counted in the waiting gauge of `key`'s class; it
    /// timed out when it ran its course and the key was still `full` (not when refused at once).
    async fn waited<T, E>(
        &self,
        (key, priority): (&str, u8),
        wait: Duration,
        admission: impl std::future::Future<Output = Result<T, E>>,
        full: impl Fn(&E) -> bool,
    ) -> Result<T, E> {
        let policy = self.limiter.policy();
        let class = policy.class_of(key);
        let waiting = self.metrics.waiting(class, priority, self.limiter.store());
        let started = Instant::now();
        let outcome = admission.await;
        let waited = started.elapsed();
        let timed_out = outcome.as_ref().err().is_some_and(full) && waited >= wait;
        waiting.done(waited, timed_out);
        outcome
    }

    fn count_admission(&self, key: &str, refused: Option<&AcquireError>) {
        let result = match refused {
            None => AdmissionResult::Admitted,
            Some(AcquireError::Store(_)) => AdmissionResult::Error,
            Some(_) => AdmissionResult::Rejected,
        };
        self.metrics.admission(key, result);
    }

    /// Admits a request under every key of `keys` at once, or under none; counted under the first key.
    pub async fn acquire_all(
        &self,
        keys: &[&str],
        options: AcquireOptions,
        wait: Duration,
    ) -> Result<Permit, KeyRefused> {
        let first = keys.first().copied().unwrap_or_default();
        let outcome = if wait.is_zero() {
            // Timed here rather than through `timed`: one future less to build and move per request.
            let started = Instant::now();
            let outcome = self.limiter.try_acquire_all(keys, options).await;
            self.metrics.store_latency("acquire", started.elapsed());
            outcome
        } else {
            let priority = options.priority_level();
            let admission = self.limiter.acquire_all(keys, options.max_wait(wait));
            let full = |refused: &KeyRefused| refused.error.is_full();
            Box::pin(self.waited((first, priority), wait, admission, full)).await
        };
        self.count_admission(first, outcome.as_ref().err().map(|refused| &refused.error));
        outcome
    }

    /// A refusal by `key` as the API answers it, naming the key and its class.
    pub fn refusal(&self, key: &str, error: AcquireError) -> ApiError {
        ApiError::refused(key, self.limiter.policy().class_of(key), error)
    }

    /// `Inflight-Limit`'s value naming the key `permit` queued on before it was admitted (none when it
    /// did not wait), with that key's figures at admission when it is the permit's first key.
    pub fn queued_limit(&self, permit: &Permit) -> Option<http::HeaderValue> {
        let key = permit.queued_on()?;
        let policy = self.limiter.policy();
        let figures = (key == permit.key())
            .then(|| {
                permit
                    .limit()
                    .get()
                    .map(|limit| (limit, permit.in_flight()))
            })
            .flatten();
        let class = policy.class_of(key);
        limit_header(Refusing { key, class }, figures)
    }

    /// Hands `permit` over to an HTTP client, which renews or releases it; counted in flight until then.
    pub fn lend(&self, permit: Permit) -> Lease {
        let lease = permit.detach();
        self.metrics
            .lent(&lease.key, &lease.id.to_string(), lease.expires_at_ms);
        lease
    }

    /// Renews a lease handed out over HTTP and extends the reservation recorded with it, if any; its
    /// keys and the renewal, or `None` when it is named by its id alone and nothing is recorded. (A
    /// failed read of the record of a lease named by its keys is logged, and the renewal answered.)
    pub async fn renew(
        &self,
        lease: &RemoteLease,
        length: Option<Duration>,
    ) -> Result<Option<(Keys, Renewal)>, StoreError> {
        let renewal = self.timed("renew", self.limiter.renew(lease, length));
        let (renewed, record) = futures_util::future::join(renewal, self.record_of(lease)).await;
        let (renewal, found) = renewed?;
        let recorded = found.or_else(|| {
            record.unwrap_or_else(|error| {
                tracing::warn!(%error, id = %lease.id, "a renewed permit's record could not be read: a reservation it has is not extended");
                None
            })
        });
        let found_keys = recorded.as_ref().map(|found| &found.keys);
        let Some(keys) = lease.keys.as_ref().or(found_keys).cloned() else {
            return Ok(None);
        };
        self.count_renewal(&keys[0], &lease.id, &renewal);
        if let (Some(recorded), Renewal::Renewed(_) | Renewal::Readded(_)) = (&recorded, &renewal) {
            let length = length.unwrap_or(Duration::from_millis(recorded.lease_ms));
            self.keep_lent(recorded, &lease.id, length).await;
        }
        Ok(Some((keys, renewal)))
    }

    /// The record of a lease named by its keys, when it has one on the same keys (a charged permit's,
    /// with a reservation to extend or settle). The limiter finds that of a lease named by its id.
    async fn record_of(&self, lease: &RemoteLease) -> Result<Option<Recorded>, StoreError> {
        let Some(keys) = &lease.keys else {
            return Ok(None);
        };
        let record = self.limiter.store().index(&lease.id, IndexOp::Get);
        let found = self.timed("record", record).await?;
        Ok(found.filter(|recorded| recorded.keys == *keys))
    }

    /// A lent lease renewed (its new deadline) or found gone (no longer in flight).
    fn count_renewal(&self, key: &str, id: &PermitId, renewal: &Renewal) {
        let id = id.to_string();
        match renewal {
            Renewal::Renewed(grant) | Renewal::Readded(grant) => {
                self.metrics.renewed(key, &id, grant.expires_at_ms);
            }
            Renewal::Lost => self.metrics.returned(key, &id),
        }
    }

    /// A lent lease given back; a release counted when it was held.
    fn count_release(&self, key: &str, id: &PermitId, held: bool) {
        self.metrics.returned(key, &id.to_string());
        if held {
            self.metrics.release();
        }
    }

    /// Hands a permit on several keys over to an HTTP client, recording its keys under its id so that
    /// any process can renew or release it by id alone. A permit that holds nothing (every key
    /// unlimited) is not recorded: there is nothing to renew or release, and no store to ask. A counted
    /// permit whose keys cannot be recorded is released again: the client could not renew it.
    pub async fn lend_all(
        &self,
        permit: Permit,
        keys: &[Arc<str>],
        lease: Duration,
    ) -> Result<Lease, StoreError> {
        let counted = permit.is_counted();
        let lease_out = self.lend(permit);
        if !counted {
            return Ok(lease_out);
        }
        let recorded = self.limiter.record(keys, &lease_out.id, lease, None);
        if let Err(error) = self.timed("record", recorded).await {
            self.release_unanswered(keys, &lease_out).await;
            return Err(error);
        }
        Ok(lease_out)
    }
}
