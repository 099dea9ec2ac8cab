//! [`Limiter`]: the handle every admission goes through.

use std::sync::Arc;
use std::time::Duration;

use super::core::{Core, LimiterStats};
use super::registry::Extend;
use super::settler::Settler;
use crate::error::StoreError;
use crate::id::PermitId;
use crate::policy::{ClassLimits, Policy};
use crate::store::{KeyStatus, MemoryStore, OverrideChange, Store};

/// How long [`Limiter::release_leases`] waits for releases already running in the background.
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
    pub(super) core: Arc<Core<S>>,
}

impl<S: Store> Clone for Limiter<S> {
    fn clone(&self) -> Self {
        Self {
            core: self.core.clone(),
        }
    }
}

impl<S: Store> Limiter<S> {
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

    /// Replaces the limit settings of every limiter sharing this one's policy ([`crate::SharedPolicy`]).
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
    pub fn renewing(&self) -> usize {
        self.core.registry.len()
    }

    /// Releases, in the store, the lease of every permit this limiter still holds, then waits (up to
    /// [`SHUTDOWN_DRAIN`]) for the releases running in the background; for shutdown, so that a process
    /// that stops does not leave its slots taken until their leases end. The permits stay usable objects;
    /// dropping them later releases nothing more.
    pub async fn release_leases(&self) {
        let core = &self.core;
        let releases = core.registry.take_all().into_iter().map(|state| async move {
            let token = state.token.load(std::sync::atomic::Ordering::Acquire);
            if let Err(error) = core.store.release(&state.keys, &state.id, token).await {
                tracing::warn!(%error, key = %state.keys[0], "release at shutdown failed; the lease will expire");
            }
        });
        futures_util::future::join_all(releases).await;
        if !core.settler.flush(SHUTDOWN_DRAIN).await {
            tracing::warn!(
                "settlements still running at shutdown; the store's deadlines will settle them"
            );
        }
    }

    /// What settles in the background what this limiter's permits and reservations leave.
    pub(crate) fn settler(&self) -> &Settler {
        &self.core.settler
    }

    /// Keeps a reservation held in this process open: the renewal task extends it every third of
    /// `ttl_ms` until [`Limiter::stop_keeping`] is given the number returned.
    pub(crate) fn keep_open(
        &self,
        key: Arc<str>,
        id: PermitId,
        ttl_ms: u64,
        extend: Extend,
    ) -> u64 {
        self.core.registry.keep(key, id, ttl_ms, extend)
    }

    /// Stops extending the reservation numbered `number`.
    pub(crate) fn stop_keeping(&self, number: u64) {
        self.core.registry.unkeep(number);
    }

    /// Renews the lease of every permit this limiter holds now, without waiting for the renewal task.
    #[cfg(feature = "test-util")]
    pub async fn renew_now(&self) {
        super::renewer::renew_due(&self.core, u64::MAX).await;
    }
}
