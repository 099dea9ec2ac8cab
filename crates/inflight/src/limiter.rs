//! [`Limiter`]: admits requests per key under the policy, hands out [`Permit`]s, renews their leases.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;

use crate::acquire::TryAcquire;
use crate::clock::millis;
use crate::error::{AcquireError, KeyRefused, StoreError};
use crate::failure::{Breaker, FailurePolicy};
use crate::id::PermitId;
use crate::options::AcquireOptions;
use crate::permit::{BoxFuture, Hold, Owner, Permit, PermitState};
use crate::policy::{Limit, Policy};
use crate::renewer::{self, Registry};
use crate::store::{
    AcquireRequest, Admission, Grant, KeyStatus, LocalAdmission, MemoryStore, RenewRequest,
    Renewal, Store,
};

/// The longest lease a permit may have (a day): renewals keep longer work alive.
const MAX_LEASE_MS: u64 = 86_400_000;

/// The lease of a permit unless [`LimiterBuilder::lease`] or [`AcquireOptions::lease`] says otherwise.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

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

/// An admission that the store has yet to decide.
pub(crate) struct Prepared {
    id: PermitId,
    weight: u32,
    lease_ms: u64,
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
    /// Counts the permits admitted under [`FailurePolicy::FailOpenLocal`] while the store is away.
    pub(crate) fallback: MemoryStore,
}

impl<S: Store> LimiterBuilder<S> {
    /// The default limit and the ceiling (both 0, unlimited, unless set).
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// The lease of each permit unless its options say otherwise (default 30 s). A crashed holder's slots
    /// come back within one lease; live holders renew at a third of it.
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
        let lease_ms = millis(self.lease).max(1);
        let core = Arc::new(Core {
            store: self.store,
            policy: self.policy,
            lease_ms,
            registry: Registry::new(lease_ms),
            runtime: Handle::current(),
            stats: LimiterStats::default(),
            on_store_failure: self.on_store_failure,
            breaker: Breaker::default(),
            fallback: MemoryStore::new(),
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

    /// Admits one request under every key of `keys` at once, or under none: an app's limit, its tenant's
    /// and a global one, say (defect D12 of the reference system). The permit holds a slot on each key,
    /// all with the same id, and releases them all together.
    ///
    /// The keys are tried in order; when one refuses, the slots already taken are given back. No key ever
    /// goes over its limit; for that brief moment a concurrent request on an earlier key may be refused
    /// for a slot that was about to come back. Repeated keys count once. The permit's `key`, `limit` and
    /// `in_flight` are those of the first key.
    ///
    /// ```
    /// use inflight::{AcquireOptions, Limiter, MemoryStore, Policy};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let limiter = Limiter::builder(MemoryStore::new()).policy(Policy::new(5, 0)).build();
    /// limiter.set_limit("tenant:acme", 2).await.unwrap();
    /// let keys = ["app:chat", "tenant:acme", "global"];
    /// let a = limiter.try_acquire_all(&keys, AcquireOptions::new()).await.unwrap();
    /// let b = limiter.try_acquire_all(&["app:search", "tenant:acme", "global"], AcquireOptions::new()).await.unwrap();
    /// let refused = limiter.try_acquire_all(&keys, AcquireOptions::new()).await.unwrap_err();
    /// assert_eq!(refused.key, "tenant:acme");
    /// assert_eq!(limiter.status("app:chat").await.unwrap().in_flight, 1, "nothing kept from the refusal");
    /// # drop((a, b));
    /// # }
    /// ```
    pub async fn try_acquire_all(
        &self,
        keys: &[&str],
        options: AcquireOptions,
    ) -> Result<Permit, KeyRefused> {
        let Some(first) = keys.first() else {
            return Err(KeyRefused {
                key: String::new(),
                error: AcquireError::Invalid("no keys"),
            });
        };
        let id = options.id.clone().unwrap_or_else(PermitId::generate);
        let mut permits: Vec<Permit> = Vec::with_capacity(keys.len());
        for (n, key) in keys.iter().enumerate() {
            if keys[..n].contains(key) {
                continue;
            }
            match self
                .try_acquire_with(key, options.clone().id(id.clone()))
                .await
            {
                Ok(permit) => permits.push(permit),
                Err(error) => {
                    // Give back the slots taken so far before answering (a failed release goes on in the
                    // background).
                    for permit in permits {
                        let _ = permit.release().await;
                    }
                    return Err(KeyRefused {
                        key: (*key).to_owned(),
                        error,
                    });
                }
            }
        }
        let (weight, limit, in_flight) = (
            permits[0].weight(),
            permits[0].limit(),
            permits[0].in_flight(),
        );
        debug_assert_eq!(permits[0].key(), *first);
        Ok(Permit::new(
            Hold::Many(permits),
            Some(id),
            weight,
            limit,
            in_flight,
        ))
    }

    /// The part of an admission that needs no waiting: checks the options, then admits without I/O when
    /// the key is unlimited or the store lives in this process. `Err` hands back what the store must
    /// decide.
    #[inline]
    pub(crate) fn acquire_now(
        &self,
        key: &str,
        options: AcquireOptions,
    ) -> Result<Result<Permit, AcquireError>, Prepared> {
        let weight = options.weight.unwrap_or(1);
        if weight == 0 {
            return Ok(Err(AcquireError::Invalid("weight must be at least 1")));
        }
        let lease_ms = options.lease.map_or(self.core.lease_ms, millis);
        if lease_ms == 0 || lease_ms > MAX_LEASE_MS {
            return Ok(Err(AcquireError::Invalid(
                "lease must be between 1 ms and 24 h",
            )));
        }
        if options.id.as_ref().is_some_and(PermitId::is_empty) {
            return Ok(Err(AcquireError::Invalid("id must not be empty")));
        }
        let core = &self.core;
        if core.policy.is_unlimited_by_default() && !core.store.may_have_override(key) {
            return Ok(Ok(free_permit(key, options.id, weight)));
        }
        if options.id.is_none() {
            match core.store.acquire_local(key, weight, core.policy) {
                Some(LocalAdmission::Held {
                    hold,
                    grant,
                    reclaimed,
                }) => {
                    self.count_reclaimed(reclaimed);
                    let hold = Hold::Local { hold, lease_ms };
                    let permit =
                        Permit::new(hold, None, grant.weight, grant.limit, grant.in_flight);
                    return Ok(Ok(permit));
                }
                Some(LocalAdmission::Decided(admission)) => {
                    return Ok(self.decided(key, None, weight, lease_ms, admission));
                }
                None => {}
            }
        }
        if core.breaker.is_open(core.registry.now_ms()) {
            let error =
                StoreError::Unavailable("the store failed moments ago; retrying shortly".into());
            return Ok(self.store_failed(key, options.id, weight, lease_ms, error));
        }
        Err(Prepared {
            id: options.id.unwrap_or_else(PermitId::generate),
            weight,
            lease_ms,
        })
    }

    /// Applies the failure policy to an admission the store could not decide.
    fn store_failed(
        &self,
        key: &str,
        id: Option<PermitId>,
        weight: u32,
        lease_ms: u64,
        error: StoreError,
    ) -> Result<Permit, AcquireError> {
        match self.core.on_store_failure {
            FailurePolicy::FailClosed => Err(AcquireError::Store(error)),
            FailurePolicy::FailOpen => Ok(free_permit(key, id, weight)),
            FailurePolicy::FailOpenLocal { limit } => {
                let policy = Policy::new(limit, 0);
                match self.core.fallback.acquire_local(key, weight, policy) {
                    Some(LocalAdmission::Held { hold, grant, .. }) => {
                        let hold = Hold::Local { hold, lease_ms };
                        Ok(Permit::new(
                            hold,
                            id,
                            grant.weight,
                            grant.limit,
                            grant.in_flight,
                        ))
                    }
                    Some(LocalAdmission::Decided(admission)) => {
                        self.decided(key, id, weight, lease_ms, admission)
                    }
                    None => Err(AcquireError::Store(error)),
                }
            }
        }
    }

    /// The part of an admission that the store decides.
    pub(crate) async fn acquire_in_store(
        &self,
        key: &str,
        prepared: Prepared,
    ) -> Result<Permit, AcquireError> {
        let Prepared {
            id,
            weight,
            lease_ms,
        } = prepared;
        let request = AcquireRequest {
            key,
            id: &id,
            weight,
            lease_ms,
            policy: self.core.policy,
        };
        match self.core.store.acquire(request).await {
            Ok(admission) => {
                self.core.breaker.reset();
                self.decided(key, Some(id), weight, lease_ms, admission)
            }
            Err(error) if error.is_transient() => {
                self.core.breaker.trip(self.core.registry.now_ms());
                tracing::warn!(%error, key, policy = ?self.core.on_store_failure, "store unavailable at admission");
                self.store_failed(key, Some(id), weight, lease_ms, error)
            }
            Err(error) => Err(AcquireError::Store(error)),
        }
    }

    /// Turns the store's decision into a permit or an error.
    fn decided(
        &self,
        key: &str,
        id: Option<PermitId>,
        weight: u32,
        lease_ms: u64,
        admission: Admission,
    ) -> Result<Permit, AcquireError> {
        match admission {
            Admission::Admitted { grant, reclaimed } => {
                self.count_reclaimed(reclaimed);
                let id = id.unwrap_or_else(PermitId::generate);
                Ok(self.leased_permit(key, id, lease_ms, grant))
            }
            Admission::Unlimited => Ok(free_permit(key, id, weight)),
            Admission::Full {
                limit,
                in_flight,
                reclaimed,
            } => {
                self.count_reclaimed(reclaimed);
                Err(AcquireError::Full { limit, in_flight })
            }
            Admission::TooHeavy { limit } => {
                Err(AcquireError::WeightExceedsLimit { weight, limit })
            }
        }
    }

    fn count_reclaimed(&self, reclaimed: u32) {
        if reclaimed > 0 {
            self.core
                .stats
                .reclaimed
                .fetch_add(u64::from(reclaimed), Ordering::Relaxed);
        }
    }

    fn leased_permit(&self, key: &str, id: PermitId, lease_ms: u64, grant: Grant) -> Permit {
        let registry = &self.core.registry;
        let state = Arc::new(PermitState {
            key: Arc::from(key),
            id,
            weight: grant.weight,
            lease_ms,
            seq: registry.next_seq(),
            expires_at_ms: AtomicU64::new(grant.expires_at_ms),
            renew_at_ms: AtomicU64::new(registry.renew_at(lease_ms)),
            lost: AtomicBool::new(false),
            released: AtomicBool::new(false),
        });
        registry.insert(state.clone());
        let owner: Arc<dyn Owner> = self.core.clone();
        Permit::new(
            Hold::Leased { state, owner },
            None,
            grant.weight,
            grant.limit,
            grant.in_flight,
        )
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
        if outcome == Renewal::Lost {
            // A lease handed out while the store was away (fail_open_local) lives in the fallback.
            if let Some(found @ Renewal::Renewed(_)) =
                self.core.fallback.renew(request).await?.pop()
            {
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
        let in_fallback = matches!(self.core.fallback.release_now(key, id), Some(Ok(true)));
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

    /// Releases, in the store, the lease of every permit this limiter still holds; for shutdown, so that a
    /// process that stops does not leave its slots taken until their leases end. The permits stay usable
    /// objects; dropping them later releases nothing more.
    pub async fn release_held(&self) {
        for permit in self.core.registry.all() {
            if !permit.released.swap(true, Ordering::AcqRel) {
                self.core.registry.remove(permit.seq);
                if let Err(error) = self.core.store.release(&permit.key, &permit.id).await {
                    tracing::warn!(%error, key = %permit.key, "release at shutdown failed; the lease will expire");
                }
            }
        }
    }

    /// Renews the lease of every permit this limiter holds now, without waiting for the renewal task.
    pub async fn renew_now(&self) {
        renewer::renew_due(&self.core, u64::MAX).await;
    }
}

fn free_permit(key: &str, id: Option<PermitId>, weight: u32) -> Permit {
    let hold = Hold::Free {
        key: Arc::from(key),
    };
    Permit::new(hold, id, weight, Limit::Unlimited, 0)
}

impl<S: Store> Owner for Core<S> {
    fn release_dropped(self: Arc<Self>, state: Arc<PermitState>) {
        state.released.store(true, Ordering::Release);
        self.registry.remove(state.seq);
        match self.store.release_now(&state.key, &state.id) {
            Some(Ok(_)) => {}
            Some(Err(error)) => tracing::warn!(%error, key = %state.key, "release failed"),
            None => renewer::spawn_release(self, state),
        }
    }

    fn release(
        self: Arc<Self>,
        state: Arc<PermitState>,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        state.released.store(true, Ordering::Release);
        self.registry.remove(state.seq);
        // If this future is dropped before the store answers, or the store is away, the release goes on
        // in the background like a dropped permit's.
        let mut pending = PendingRelease {
            core: Some(self),
            state,
        };
        Box::pin(async move {
            let Some(core) = pending.core.clone() else {
                return Ok(());
            };
            let result = core
                .store
                .release(&pending.state.key, &pending.state.id)
                .await;
            if !matches!(&result, Err(error) if error.is_transient()) {
                pending.core.take();
            }
            result.map(drop)
        })
    }

    fn detach(&self, state: &PermitState) {
        // No longer this limiter's: a renewal already on its way must not re-add it, nor shutdown release it.
        state.released.store(true, Ordering::Release);
        self.registry.remove(state.seq);
    }
}

/// An explicit release not yet taken by the store: finished in the background if dropped.
struct PendingRelease<S: Store> {
    core: Option<Arc<Core<S>>>,
    state: Arc<PermitState>,
}

impl<S: Store> Drop for PendingRelease<S> {
    fn drop(&mut self) {
        if let Some(core) = self.core.take() {
            renewer::spawn_release(core, self.state.clone());
        }
    }
}
