//! [`Limiter`]: admits requests per key under the policy, hands out [`Permit`](crate::Permit)s, renews
//! their leases.
//!
//! `admission.rs` decides one admission; `owner.rs` is how a permit gets back to its limiter.

mod admission;
pub(crate) use admission::Now;
mod owner;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;

use crate::acquire::TryAcquire;
use crate::clock::millis;
use crate::error::StoreError;
use crate::failure::{Breaker, FailurePolicy};
use crate::id::PermitId;
use crate::options::AcquireOptions;
use crate::policy::Policy;
use crate::renewer::{self, Registry};
use crate::store::{KeyStatus, MemoryStore, RenewRequest, Renewal, Store};

/// The lease of a permit unless [`LimiterBuilder::lease`] or [`AcquireOptions::lease`] says otherwise.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// How long [`Limiter::release_held`] waits for releases already running in the background.
pub const SHUTDOWN_DRAIN: Duration = Duration::from_secs(2);

/// Admits requests per key, at most the key's limit in flight at once, counted in the store.
///
/// Cheap to clone: clones share the store, the policy and the renewal task.
///
/// ```
/// use inflight::{AcquireError, AcquireOptions, Limiter, MemoryStore, Policy};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// // Every key may have 2 in flight; no key more than 10.
/// let limiter = Limiter::builder(MemoryStore::new()).policy(Policy::new(2, 10)).build();
///
/// let first = limiter.try_acquire("app-1").await.unwrap();
/// let second = limiter
///     .try_acquire_with("app-1", AcquireOptions::new().id("request-2"))
///     .await
///     .unwrap();
/// match limiter.try_acquire("app-1").await {
///     Err(AcquireError::Full { limit, in_flight }) => assert_eq!((limit, in_flight), (2, 2)),
///     other => panic!("expected Full, got {other:?}"),
/// }
///
/// // Overrides live in the store: every process sharing it sees them at its next admission.
/// limiter.set_limit("app-1", 3).await.unwrap();
/// let third = limiter.try_acquire("app-1").await.unwrap();
/// assert_eq!(limiter.status("app-1").await.unwrap().in_flight, 3);
/// # drop((first, second, third));
/// # }
/// ```
pub struct Limiter<S: Store = MemoryStore> {
    core: Arc<Core<S>>,
}

impl<S: Store> Clone for Limiter<S> {
    fn clone(&self) -> Self {
        Self {
            core: self.core.clone(),
        }
    }
}

/// Builds a [`Limiter`].
#[must_use]
pub struct LimiterBuilder<S> {
    store: S,
    policy: Policy,
    lease: Duration,
    on_store_failure: FailurePolicy,
}

/// Counters of what the limiter has seen, for metrics.
#[derive(Debug, Default)]
pub struct LimiterStats {
    /// Expired leases that admissions reclaimed: their holders went away without releasing.
    pub reclaimed: AtomicU64,
    /// Held permits whose lease was gone at renewal and could not be re-added.
    pub lost: AtomicU64,
    /// Held permits whose lease was gone at renewal and was re-added (the store had lost it).
    pub readded: AtomicU64,
}

/// What the limiter's handles, its permits and its renewal task share.
pub(crate) struct Core<S> {
    pub(crate) store: S,
    pub(crate) policy: Policy,
    pub(crate) lease_ms: u64,
    pub(crate) registry: Registry,
    pub(crate) runtime: Handle,
    pub(crate) stats: LimiterStats,
    on_store_failure: FailurePolicy,
    breaker: Breaker,
    /// Counts the permits admitted under [`FailurePolicy::FailOpenLocal`] while the store is away (only
    /// under that policy).
    pub(crate) fallback: Option<MemoryStore>,
}

impl<S: Store> LimiterBuilder<S> {
    /// The default limit and the ceiling (both 0, unlimited, unless set).
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// The lease of each permit unless its options say otherwise (default 30 s). A crashed holder's slots
    /// come back within one lease; live holders renew at a third of it. Kept between 1 ms and 24 h.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// What to do when the store is unavailable (default [`FailurePolicy::FailClosed`]).
    pub fn on_store_failure(mut self, policy: FailurePolicy) -> Self {
        self.on_store_failure = policy;
        self
    }

    /// Builds the limiter and starts its renewal task.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime, like `tokio::spawn`.
    pub fn build(self) -> Limiter<S> {
        let lease_ms = millis(self.lease).clamp(1, admission::MAX_LEASE_MS);
        let core = Arc::new(Core {
            store: self.store,
            policy: self.policy,
            lease_ms,
            registry: Registry::new(lease_ms),
            runtime: Handle::current(),
            stats: LimiterStats::default(),
            on_store_failure: self.on_store_failure,
            breaker: Breaker::default(),
            fallback: matches!(self.on_store_failure, FailurePolicy::FailOpenLocal { .. })
                .then(MemoryStore::new),
        });
        core.runtime.spawn(renewer::run(Arc::downgrade(&core)));
        Limiter { core }
    }
}

impl<S: Store> Limiter<S> {
    /// Starts building a limiter over `store`.
    pub fn builder(store: S) -> LimiterBuilder<S> {
        LimiterBuilder {
            store,
            policy: Policy::default(),
            lease: DEFAULT_LEASE,
            on_store_failure: FailurePolicy::default(),
        }
    }

    /// Admits one request under `key` now, or says why not; never waits for room.
    pub fn try_acquire<'a>(&'a self, key: &'a str) -> TryAcquire<'a, S> {
        self.try_acquire_with(key, AcquireOptions::new())
    }

    /// Admits one request under `key` with `options`, or says why not; never waits for room.
    ///
    /// A key that is unlimited by the policy and has no override is admitted without any store I/O, and
    /// an in-process store admits without awaiting anything.
    ///
    /// # Cancel safety
    ///
    /// Cancelling the future before it completes may leave a lease in the store that nobody holds; it ends
    /// with its lease.
    pub fn try_acquire_with<'a>(
        &'a self,
        key: &'a str,
        options: AcquireOptions,
    ) -> TryAcquire<'a, S> {
        TryAcquire::new(self, key, options)
    }

    /// The key's effective limit and in-flight count.
    pub async fn status(&self, key: &str) -> Result<KeyStatus, StoreError> {
        self.core.store.status(key, self.core.policy).await
    }

    /// Sets the key's limit override (0 clears it); it applies to the next admission in every process
    /// that shares the store. The ceiling still caps it.
    pub async fn set_limit(&self, key: &str, limit: u32) -> Result<KeyStatus, StoreError> {
        self.core
            .store
            .set_limit(key, Some(limit), self.core.policy)
            .await
    }

    /// Clears the key's limit override: the default applies again.
    pub async fn clear_limit(&self, key: &str) -> Result<KeyStatus, StoreError> {
        self.core.store.set_limit(key, None, self.core.policy).await
    }

    /// Renews a lease held elsewhere (a detached permit, a remote worker) for `lease` (default: the
    /// limiter's). A lease that is gone stays gone: [`Renewal::Lost`].
    pub async fn renew(
        &self,
        key: &str,
        id: &PermitId,
        lease: Option<Duration>,
    ) -> Result<Renewal, StoreError> {
        let request = RenewRequest {
            key: Arc::from(key),
            id: id.clone(),
            lease_ms: lease.map_or(self.core.lease_ms, millis).max(1),
            policy: self.core.policy,
            readd_weight: None,
        };
        if id.is_empty() {
            return Ok(Renewal::Lost);
        }
        let request = std::slice::from_ref(&request);
        let outcome = self.core.store.renew(request).await?.pop();
        let outcome =
            outcome.ok_or_else(|| StoreError::Protocol("renewal returned no outcome".into()))?;
        if let (Renewal::Lost, Some(fallback)) = (outcome, &self.core.fallback) {
            // A lease handed out while the store was away (fail_open_local) lives in the fallback.
            if let Some(found @ Renewal::Renewed(_)) = fallback.renew(request).await?.pop() {
                return Ok(found);
            }
        }
        Ok(outcome)
    }

    /// Releases a lease held elsewhere; returns whether it was held. Releasing twice is not an error.
    pub async fn release(&self, key: &str, id: &PermitId) -> Result<bool, StoreError> {
        if id.is_empty() {
            return Ok(false);
        }
        // A lease handed out while the store was away (fail_open_local) lives in the fallback.
        let in_fallback = self
            .core
            .fallback
            .as_ref()
            .is_some_and(|fallback| matches!(fallback.release_now(key, id), Some(Ok(true))));
        match self.core.store.release(key, id).await {
            Ok(held) => Ok(held || in_fallback),
            Err(_) if in_fallback => Ok(true),
            Err(error) => Err(error),
        }
    }

    /// The limit settings.
    pub fn policy(&self) -> Policy {
        self.core.policy
    }

    /// The default lease.
    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.core.lease_ms)
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.core.store
    }

    /// What the limiter has counted so far.
    pub fn stats(&self) -> &LimiterStats {
        &self.core.stats
    }

    /// How many permits this limiter holds and renews right now.
    pub fn held(&self) -> usize {
        self.core.registry.len()
    }

    /// Releases, in the store, the lease of every permit this limiter still holds, then waits (up to
    /// [`SHUTDOWN_DRAIN`]) for the releases of dropped permits still running in the background; for
    /// shutdown, so that a process that stops does not leave its slots taken until their leases end. The
    /// permits stay usable objects; dropping them later releases nothing more.
    pub async fn release_held(&self) {
        for permit in self.core.registry.all() {
            if !permit.released.swap(true, Ordering::AcqRel) {
                self.core.registry.remove(permit.seq);
                if let Err(error) = self.core.store.release(&permit.key, &permit.id).await {
                    tracing::warn!(%error, key = %permit.key, "release at shutdown failed; the lease will expire");
                }
            }
        }
        let core = self.core.clone();
        let pending = move || core.registry.pending_releases.load(Ordering::Acquire);
        if pending() == 0 {
            return;
        }
        // On the limiter's runtime, whose timer the renewal task already uses (the caller's may have none).
        let _ = self
            .core
            .runtime
            .spawn(async move {
                let drained = tokio::time::timeout(SHUTDOWN_DRAIN, async {
                    while pending() > 0 {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                })
                .await;
                if drained.is_err() {
                    tracing::warn!(
                        pending = pending(),
                        "releases still running at shutdown; their leases will expire"
                    );
                }
            })
            .await;
    }

    /// Renews the lease of every permit this limiter holds now, without waiting for the renewal task.
    pub async fn renew_now(&self) {
        renewer::renew_due(&self.core, u64::MAX).await;
    }
}
