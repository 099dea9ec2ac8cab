//! Leases held elsewhere (a detached permit, a worker in another process or language): renewed and
//! released by their keys and id, or by their id alone once [`Limiter::record`] has recorded their keys.
//!
//! Each names the token of the admission it belongs to ([`crate::Lease::token`]; 0: whichever lease the
//! id holds), so that a late or repeated renewal or release of an earlier admission of the same id
//! never acts on a later one's lease.

use std::sync::Arc;
use std::time::Duration;

use super::Limiter;
use crate::clock::millis;
use crate::error::StoreError;
use crate::id::PermitId;
use crate::options::{MAX_LEASE, MIN_LEASE};
use crate::store::{IndexOp, Keys, Recorded, RenewRequest, Renewal, Store};

impl<S: Store> Limiter<S> {
    /// Renews a lease held elsewhere (a detached permit, a remote worker) for `lease` (at least
    /// [`crate::MIN_LEASE`]), or by default for the length it was acquired with. A lease that is gone
    /// stays gone, and so is one that a later admission of the id took over (another `token`):
    /// [`Renewal::Lost`].
    pub async fn renew(
        &self,
        key: &str,
        id: &PermitId,
        token: u64,
        lease: Option<Duration>,
    ) -> Result<Renewal, StoreError> {
        self.renew_all(&[Arc::from(key)], id, token, lease).await
    }

    /// [`Limiter::renew`] for a lease on several keys (a permit of [`Limiter::try_acquire_all`]).
    pub async fn renew_all(
        &self,
        keys: &[Arc<str>],
        id: &PermitId,
        token: u64,
        lease: Option<Duration>,
    ) -> Result<Renewal, StoreError> {
        if id.is_empty() || keys.is_empty() {
            return Ok(Renewal::Lost);
        }
        let request = [RenewRequest {
            keys: Arc::from(keys),
            id: id.clone(),
            lease_ms: lease.map(|lease| millis(lease).clamp(millis(MIN_LEASE), millis(MAX_LEASE))),
            limits: self.core.limits_of(keys),
            readd_weight: None,
            token,
            counted: 0,
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

    /// Releases a lease held elsewhere, unless a later admission of the id took it over (another
    /// `token`); returns whether it was held. Releasing twice is not an error.
    pub async fn release(&self, key: &str, id: &PermitId, token: u64) -> Result<bool, StoreError> {
        self.release_all(&[Arc::from(key)], id, token).await
    }

    /// [`Limiter::release`] for a lease on several keys (a permit of [`Limiter::try_acquire_all`]).
    pub async fn release_all(
        &self,
        keys: &[Arc<str>],
        id: &PermitId,
        token: u64,
    ) -> Result<bool, StoreError> {
        if id.is_empty() || keys.is_empty() {
            return Ok(false);
        }
        // A lease handed out while the store was away (fail_open_local) lives in the fallback.
        let in_fallback = match &self.core.fallback {
            Some(fallback) => fallback.release(keys, id, token).await?,
            None => false,
        };
        match self.core.store.release(keys, id, token).await {
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
        self.record_with(keys, id, lease, None).await
    }

    /// [`Limiter::record`], with the quota key of the permit's reservation (reserved under the permit's
    /// id, see [`crate::Quota`]) and its ttl: the record then lasts at least as long as the reservation,
    /// so that whoever releases the permit by id can settle it.
    pub async fn record_with(
        &self,
        keys: &[Arc<str>],
        id: &PermitId,
        lease: Duration,
        quota: Option<(&str, Duration)>,
    ) -> Result<(), StoreError> {
        let lease_ms = millis(lease).clamp(millis(MIN_LEASE), millis(MAX_LEASE));
        let reservation_ms = quota.map_or(0, |(_, ttl)| millis(ttl));
        let ttl_ms = record_ttl_ms(lease_ms).max(reservation_ms);
        let op = IndexOp::Put {
            keys,
            lease_ms,
            ttl_ms,
            quota: quota.map(|(key, _)| key),
        };
        self.core.store.index(id, op).await.map(drop)
    }

    /// Renews the lease recorded under `id`: its record (as renewed) and the renewal; `None`: no record.
    pub async fn renew_recorded(
        &self,
        id: &PermitId,
        token: u64,
        lease: Option<Duration>,
    ) -> Result<Option<(Recorded, Renewal)>, StoreError> {
        let Some(mut recorded) = self.core.store.index(id, IndexOp::Get).await? else {
            return Ok(None);
        };
        // Without a length asked for, the lease keeps the one it has, and so does its record.
        let lease_ms = lease.map_or(recorded.lease_ms, |lease| {
            millis(lease).clamp(millis(MIN_LEASE), millis(MAX_LEASE))
        });
        recorded.lease_ms = lease_ms;
        let renewal = self
            .renew_all(
                &recorded.keys,
                id,
                token,
                Some(Duration::from_millis(lease_ms)),
            )
            .await?;
        match renewal {
            Renewal::Renewed(_) | Renewal::Readded(_) => {
                let op = IndexOp::Put {
                    keys: &recorded.keys,
                    lease_ms,
                    ttl_ms: record_ttl_ms(lease_ms),
                    quota: recorded.quota.as_deref(),
                };
                self.core.store.index(id, op).await?;
            }
            // (Named by a token, the lease may be a later admission's: its record stays, to expire.)
            Renewal::Lost if token == 0 => drop(self.core.store.index(id, IndexOp::Remove).await?),
            Renewal::Lost => {}
        }
        Ok(Some((recorded, renewal)))
    }

    /// Releases the lease recorded under `id` and forgets the record; its keys and whether the lease
    /// was held, or `None` when nothing is recorded. Releasing twice is not an error.
    pub async fn release_recorded(
        &self,
        id: &PermitId,
        token: u64,
    ) -> Result<Option<(Keys, bool)>, StoreError> {
        let Some(Recorded { keys, .. }) = self.core.store.index(id, IndexOp::Get).await? else {
            return Ok(None);
        };
        // Released first: a release retried after a lost answer still finds the record.
        let held = self.release_all(&keys, id, token).await?;
        // (Named by a token and not held, the lease may be a later admission's: its record stays.)
        if held || token == 0 {
            self.core.store.index(id, IndexOp::Remove).await?;
        }
        Ok(Some((keys, held)))
    }
}

/// How long the record of a lease handed out lasts: past the lease, so that a late renewal finds it.
fn record_ttl_ms(lease_ms: u64) -> u64 {
    lease_ms.saturating_mul(2) + 1000
}
