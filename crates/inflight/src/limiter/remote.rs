//! Leases held elsewhere (a detached permit, a worker in another process or language): renewed and
//! released by their keys and id, or by their id alone once [`Limiter::record`] has recorded their keys.

use std::sync::Arc;
use std::time::Duration;

use super::Limiter;
use crate::clock::millis;
use crate::error::StoreError;
use crate::id::PermitId;
use crate::options::MAX_LEASE;
use crate::store::{IndexOp, Keys, RenewRequest, Renewal, Store};

impl<S: Store> Limiter<S> {
    /// Renews a lease held elsewhere (a detached permit, a remote worker) for `lease`, or by default for
    /// the length it was acquired with. A lease that is gone stays gone: [`Renewal::Lost`].
    pub async fn renew(
        &self,
        key: &str,
        id: &PermitId,
        lease: Option<Duration>,
    ) -> Result<Renewal, StoreError> {
        self.renew_all(&[Arc::from(key)], id, lease).await
    }

    /// [`Limiter::renew`] for a lease on several keys (a permit of [`Limiter::try_acquire_all`]).
    pub async fn renew_all(
        &self,
        keys: &[Arc<str>],
        id: &PermitId,
        lease: Option<Duration>,
    ) -> Result<Renewal, StoreError> {
        if id.is_empty() || keys.is_empty() {
            return Ok(Renewal::Lost);
        }
        let request = [RenewRequest {
            keys: Arc::from(keys),
            id: id.clone(),
            lease_ms: lease.map(|lease| millis(lease).clamp(1, millis(MAX_LEASE))),
            limits: self.core.limits_of(keys),
            readd_weight: None,
        }];
        let outcome = self.core.store.renew(&request).await?.pop();
        let outcome =
            outcome.ok_or_else(|| StoreError::Protocol("renewal returned no outcome".into()))?;
        if let (Renewal::Lost, Some(fallback)) = (outcome, &self.core.fallback) {
            // A lease handed out while the store was away (fail_open_local) lives in the fallback.
            if let Some(found @ Renewal::Renewed(_)) = fallback.renew(&request).await?.pop() {
                return Ok(found);
            }
        }
        Ok(outcome)
    }

    /// Releases a lease held elsewhere; returns whether it was held. Releasing twice is not an error.
    pub async fn release(&self, key: &str, id: &PermitId) -> Result<bool, StoreError> {
        self.release_all(&[Arc::from(key)], id).await
    }

    /// [`Limiter::release`] for a lease on several keys (a permit of [`Limiter::try_acquire_all`]).
    pub async fn release_all(&self, keys: &[Arc<str>], id: &PermitId) -> Result<bool, StoreError> {
        if id.is_empty() || keys.is_empty() {
            return Ok(false);
        }
        // A lease handed out while the store was away (fail_open_local) lives in the fallback.
        let in_fallback = match &self.core.fallback {
            Some(fallback) => fallback.release(keys, id).await?,
            None => false,
        };
        match self.core.store.release(keys, id).await {
            Ok(held) => Ok(held || in_fallback),
            Err(_) if in_fallback => Ok(true),
            Err(error) => Err(error),
        }
    }

    /// Records `keys` under the id of a lease handed to a remote caller, for `lease` and a margin, so
    /// that [`Limiter::renew_recorded`] and [`Limiter::release_recorded`] find them from the id alone,
    /// in any process that shares the store.
    pub async fn record(
        &self,
        keys: &[Arc<str>],
        id: &PermitId,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let ttl_ms = record_ttl_ms(lease);
        let op = IndexOp::Put { keys, ttl_ms };
        self.core.store.index(id, op).await.map(drop)
    }

    /// Renews the lease recorded under `id` ([`Limiter::record`]); its keys and the renewal, or `None`
    /// when nothing is recorded (released, or ended).
    pub async fn renew_recorded(
        &self,
        id: &PermitId,
        lease: Option<Duration>,
    ) -> Result<Option<(Keys, Renewal)>, StoreError> {
        let ttl_ms = record_ttl_ms(lease.unwrap_or(self.lease()));
        let Some(keys) = self.core.store.index(id, IndexOp::Get { ttl_ms }).await? else {
            return Ok(None);
        };
        let renewal = self.renew_all(&keys, id, lease).await?;
        if renewal == Renewal::Lost {
            self.core.store.index(id, IndexOp::Take).await?;
        }
        Ok(Some((keys, renewal)))
    }

    /// Releases the lease recorded under `id` and forgets the record; its keys and whether the lease
    /// was held, or `None` when nothing is recorded. Releasing twice is not an error.
    pub async fn release_recorded(
        &self,
        id: &PermitId,
    ) -> Result<Option<(Keys, bool)>, StoreError> {
        let Some(keys) = self.core.store.index(id, IndexOp::Take).await? else {
            return Ok(None);
        };
        let held = self.release_all(&keys, id).await?;
        Ok(Some((keys, held)))
    }
}

/// How long the record of a lease handed out lasts: past the lease, so that a renewal a little late
/// still finds it.
fn record_ttl_ms(lease: Duration) -> u64 {
    millis(lease).clamp(1, millis(MAX_LEASE)).saturating_mul(2) + 1000
}
