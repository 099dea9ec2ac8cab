//! [`Limiter`]: admits requests per key under the policy, hands out [`Permit`](crate::Permit)s, renews
//! their leases and releases them.
//!
//! `admission.rs` decides one admission and `acquire.rs` is its future; `renewer.rs` renews the leases of
//! live permits and keeps reservations open; `settler.rs` owns everything settled in the background.

mod acquire;
mod admission;
mod busy;
mod remote;
mod renewer;
mod settler;
mod wait;

pub use acquire::TryAcquire;
pub use busy::{Busiest, Busy};
pub use wait::{DEFAULT_MAX_WAITERS, RECHECK};
pub(crate) use renewer::Extend;
pub(crate) use settler::{Attempt, Deferred, Settler};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::clock::millis;
use crate::error::StoreError;
use crate::failure::{Breaker, FailurePolicy};
use crate::options::{DEFAULT_LEASE, MAX_LEASE};
use crate::permit::{BoxFuture, Owner, PermitState};
use crate::policy::{ClassLimits, Policy, SharedPolicy};
use crate::id::PermitId;
use crate::store::{KeyStatus, Keys, MemoryStore, OverrideChange, Store};
use renewer::Registry;
use settler::Unsettled;

/// How long [`Limiter::release_held`] waits for releases already running in the background.
pub const SHUTDOWN_DRAIN: Duration = Duration::from_secs(2);

/// Admits requests per key, at most the key's limit in flight at once, counted in the store.
///
/// Cheap to clone: clones share the store, the policy and the background tasks.
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
    policy: SharedPolicy,
    lease: Duration,
    on_store_failure: FailurePolicy,
    fallback: Option<MemoryStore>,
    max_waiters: usize,
    store_breaker: bool,
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
    /// Admissions waiting for a slot now ([`Limiter::acquire`]).
    pub waiting: AtomicU64,
    /// Waits that ran their course without a slot (a full queue refuses at once, uncounted here).
    pub wait_timeouts: AtomicU64,
}

/// What the limiter's handles, its permits and its background tasks share.
struct Core<S> {
    store: S,
    policy: SharedPolicy,
    lease_ms: u64,
    registry: Registry,
    settler: Settler,
    stats: LimiterStats,
    on_store_failure: FailurePolicy,
    breaker: Breaker,
    /// Counts the permits admitted under [`FailurePolicy::FailOpenLocal`] while the store is away.
    fallback: Option<MemoryStore>,
    waiters: wait::Waiters,
}

impl<S: Store> LimiterBuilder<S> {
    /// The limits: rules for classes of keys, and the default and ceiling of every other key (all 0,
    /// unlimited, unless set). A [`SharedPolicy`] lets a reload reach every limiter that shares it.
    pub fn policy(mut self, policy: impl Into<SharedPolicy>) -> Self {
        self.policy = policy.into();
        self
    }

    /// The lease of each permit unless its options say otherwise (default 30 s). A crashed holder's slots
    /// come back within one lease; live holders renew at a third of it. Kept between 1 ms and
    /// [`MAX_LEASE`].
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// What to do when the store is unavailable (default [`FailurePolicy::FailClosed`]).
    pub fn on_store_failure(mut self, policy: FailurePolicy) -> Self {
        self.on_store_failure = policy;
        self
    }

    /// Where [`FailurePolicy::FailOpenLocal`] counts while the store is away (default: a store of this
    /// limiter's own). Limiters given clones of one store share the cap: one cap per process.
    pub fn fallback(mut self, store: MemoryStore) -> Self {
        self.fallback = Some(store);
        self
    }

    /// The most admissions of this limiter that may wait on one key at once (default
    /// [`DEFAULT_MAX_WAITERS`]; at least 1); one more is refused at once.
    pub fn max_waiters(mut self, max: usize) -> Self {
        self.max_waiters = max.max(1);
        self
    }

    /// Whether one transient store failure makes every admission skip the store for a moment (200 ms),
    /// so that an outage costs one failed round trip per interval, not one per request (default: on).
    /// Turn it off where the store fails in part, as a Redis Cluster that lost one primary does:
    /// there the other primaries' keys must go on being admitted.
    pub fn store_breaker(mut self, on: bool) -> Self {
        self.store_breaker = on;
        self
    }

    /// Builds the limiter and starts its background tasks on the current Tokio runtime.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime, like `tokio::spawn`.
    pub fn build(self) -> Limiter<S> {
        let lease_ms = millis(self.lease).clamp(1, millis(MAX_LEASE));
        let fallback = matches!(self.on_store_failure, FailurePolicy::FailOpenLocal { .. })
            .then(|| self.fallback.unwrap_or_default());
        let core = Arc::new(Core {
            settler: Settler::start(),
            store: self.store,
            policy: self.policy,
            lease_ms,
            registry: Registry::new(lease_ms),
            stats: LimiterStats::default(),
            on_store_failure: self.on_store_failure,
            breaker: Breaker::new(!self.store_breaker),
            fallback,
            waiters: wait::Waiters::new(self.max_waiters),
        });
        tokio::spawn(renewer::run(Arc::downgrade(&core)));
        Limiter { core }
    }
}

impl<S: Store> Limiter<S> {
    /// Starts building a limiter over `store`.
    pub fn builder(store: S) -> LimiterBuilder<S> {
        LimiterBuilder {
            store,
            policy: SharedPolicy::default(),
            lease: DEFAULT_LEASE,
            on_store_failure: FailurePolicy::default(),
            fallback: None,
            max_waiters: DEFAULT_MAX_WAITERS,
            store_breaker: true,
        }
    }

    /// The key's effective limit and in-flight count.
    pub async fn status(&self, key: &str) -> Result<KeyStatus, StoreError> {
        let limits = self.core.limits(key);
        self.core
            .store
            .status(key, limits, OverrideChange::Keep)
            .await
    }

    /// Sets the key's limit override (0 clears it); it applies to the next admission in every process
    /// that shares the store. Its class's ceiling still caps it.
    pub async fn set_limit(&self, key: &str, limit: u32) -> Result<KeyStatus, StoreError> {
        let limits = self.core.limits(key);
        let change = OverrideChange::Set(limit);
        self.core.store.status(key, limits, change).await
    }

    /// Clears the key's limit override: its class's default applies again.
    pub async fn clear_limit(&self, key: &str) -> Result<KeyStatus, StoreError> {
        let limits = self.core.limits(key);
        let change = OverrideChange::Clear;
        self.core.store.status(key, limits, change).await
    }

    /// The limit settings now.
    pub fn policy(&self) -> Arc<Policy> {
        self.core.policy.get()
    }

    /// Replaces the limit settings of this limiter and of every other that shares its policy (a reload):
    /// held permits stay held; the new limits apply from the next admission on.
    pub fn set_policy(&self, policy: Policy) {
        self.core.policy.set(policy);
    }

    /// The limits of `key`'s class under the policy now.
    pub fn limits(&self, key: &str) -> ClassLimits {
        self.core.limits(key)
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

    /// How many leases this limiter holds and renews right now (permits of an in-process store have none).
    pub fn held(&self) -> usize {
        self.core.registry.len()
    }

    /// Releases, in the store, the lease of every permit this limiter still holds, then waits (up to
    /// [`SHUTDOWN_DRAIN`]) for the releases running in the background; for shutdown, so that a process
    /// that stops does not leave its slots taken until their leases end. The permits stay usable objects;
    /// dropping them later releases nothing more.
    pub async fn release_held(&self) {
        let core = &self.core;
        let releases = core.registry.take_all().into_iter().map(|state| async move {
            if let Err(error) = core.store.release(&state.keys, &state.id).await {
                tracing::warn!(%error, key = %state.keys[0], "release at shutdown failed; the lease will expire");
            }
        });
        futures_util::future::join_all(releases).await;
        if !core.settler.flush(SHUTDOWN_DRAIN).await {
            tracing::warn!("settlements still running at shutdown; the store's deadlines will settle them");
        }
    }

    /// What settles in the background what this limiter's permits and reservations leave.
    pub(crate) fn settler(&self) -> &Settler {
        &self.core.settler
    }

    /// Keeps a reservation held in this process open: the renewal task extends it every third of
    /// `ttl_ms` until [`Limiter::stop_keeping`] is given the number returned.
    pub(crate) fn keep_open(&self, key: Arc<str>, id: PermitId, ttl_ms: u64, extend: Extend) -> u64 {
        self.core.registry.keep(key, id, ttl_ms, extend)
    }

    /// Stops extending the reservation numbered `number`.
    pub(crate) fn stop_keeping(&self, number: u64) {
        self.core.registry.unkeep(number);
    }

    /// Renews the lease of every permit this limiter holds now, without waiting for the renewal task.
    #[cfg(feature = "test-util")]
    pub async fn renew_now(&self) {
        renewer::renew_due(&self.core, u64::MAX).await;
    }
}

impl<S> Core<S> {
    /// The limits of `key`'s class.
    #[inline]
    fn limits(&self, key: &str) -> ClassLimits {
        self.policy.with(|policy| policy.limits(key))
    }

    /// The limits of each key's class, in order.
    fn limits_of<K: AsRef<str>>(&self, keys: &[K]) -> Vec<ClassLimits> {
        self.policy
            .with(|policy| keys.iter().map(|key| policy.limits(key.as_ref())).collect())
    }
}

impl<S: Store> Core<S> {
    /// The release of the lease `id` on `keys`, for the [`Settler`]: tried until the lease would end.
    fn release_of(&self, keys: Keys, id: PermitId, lease_ms: u64) -> Deferred {
        let store = self.store.clone();
        let (key, within) = (keys[0].clone(), Duration::from_millis(lease_ms));
        let attempt_id = id.clone();
        let attempt: settler::Attempt = Box::new(move || {
            let (store, keys, id) = (store.clone(), keys.clone(), attempt_id.clone());
            Box::pin(async move { store.release(&keys, &id).await.map(drop) })
        });
        Deferred {
            what: "release",
            key,
            id,
            within,
            attempt,
        }
    }
}

impl<S: Store> Owner for Core<S> {
    fn dropped(&self, state: Arc<PermitState>) {
        // Nothing to release when shutdown already did, or when the lease was lost (another permit of
        // this process may hold the same id since).
        if state.leave() && !state.released.load(Ordering::Acquire) {
            self.registry.remove(&state);
            if !state.lost.load(Ordering::Acquire) {
                let release = self.release_of(state.keys.clone(), state.id.clone(), state.lease_ms);
                self.settler.settle(release);
            }
        }
    }

    fn release(
        self: Arc<Self>,
        state: Arc<PermitState>,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        if !state.leave() || state.released.load(Ordering::Acquire) {
            return Box::pin(std::future::ready(Ok(())));
        }
        self.registry.remove(&state);
        if state.lost.load(Ordering::Acquire) {
            return Box::pin(std::future::ready(Ok(())));
        }
        // Dropped before the store answers, or answered with a transient error: the release goes on in
        // the background like a dropped permit's.
        let release = self.release_of(state.keys.clone(), state.id.clone(), state.lease_ms);
        let mut unsettled = Unsettled::new(&self.settler, release, true);
        Box::pin(async move {
            let result = self.store.release(&state.keys, &state.id).await;
            unsettled.disarm_unless(matches!(&result, Err(error) if error.is_transient()));
            drop(unsettled);
            result.map(drop)
        })
    }

    fn detach(&self, state: &Arc<PermitState>) {
        // No longer this limiter's to renew once no permit here holds it: a renewal already on its way
        // must not re-add it, nor shutdown release it.
        if state.leave() {
            self.registry.remove(state);
        }
    }
}
