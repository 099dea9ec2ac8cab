//! Leases held elsewhere (a detached permit, a worker in another process or language), renewed and
//! released as a [`RemoteLease`] names them: by their keys and id, or by their id alone once
//! [`Limiter::record`] has recorded their keys.

use std::sync::Arc;
use std::time::Duration;

use super::Limiter;
use crate::clock::millis;
use crate::error::StoreError;
use crate::id::PermitId;
use crate::options::{MAX_LEASE, MIN_LEASE};
use crate::store::{IndexOp, Keys, Recorded, RenewRequest, Renewal, Store};

/// A lease held elsewhere, as its holder names it to renew or release it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteLease {
    /// Its id.
    pub id: PermitId,
    /// The token of its admission ([`crate::Lease::token`]; 0: whichever lease the id holds), so that a
    /// late or repeated renewal or release of an earlier admission of the id never acts on a later one's.
    pub token: u64,
    /// Its keys; `None`: those [`Limiter::record`] recorded under its id.
    pub keys: Option<Keys>,
}

impl RemoteLease {
    /// The lease `id` on `keys`, of the admission `token`.
    pub fn new(keys: &[&str], id: impl Into<PermitId>, token: u64) -> Self {
        let keys = keys.iter().map(|key| Arc::from(*key)).collect();
        Self {
            id: id.into(),
            token,
            keys: Some(keys),
        }
    }

    /// The lease `id`, of the admission `token`, on the keys recorded under its id.
    pub fn recorded(id: impl Into<PermitId>, token: u64) -> Self {
        Self {
            id: id.into(),
            token,
            keys: None,
        }
    }
}

impl<S: Store> Limiter<S> {
    /// Renews a lease held elsewhere for `length` (at least [`crate::MIN_LEASE`]), or by default for as
    /// long as it was acquired, or last recorded, for. A lease that is gone stays gone, and so does one
    /// a later admission of the id took over (another token): [`Renewal::Lost`]. Returns the renewal
    /// and the record the keys were found in, renewed with the lease (`None`: the lease names its keys,
    /// or nothing is recorded); a lost lease named with token 0 loses its record too.
    pub async fn renew(
        &self,
        lease: &RemoteLease,
        length: Option<Duration>,
    ) -> Result<(Renewal, Option<Recorded>), StoreError> {
        let Some((keys, mut recorded)) = self.keys_of(lease).await? else {
            return Ok((Renewal::Lost, None));
        };
        let mut lease_ms =
            length.map(|length| millis(length).clamp(millis(MIN_LEASE), millis(MAX_LEASE)));
        if let Some(recorded) = &mut recorded {
            // Without a length asked for, the lease keeps its recorded one, and so does its record.
            recorded.lease_ms = *lease_ms.get_or_insert(recorded.lease_ms);
        }
        let request = [RenewRequest {
            limits: self.core.limits_of(&keys),
            keys,
            id: lease.id.clone(),
            lease_ms,
            readd_weight: None,
            token: lease.token,
            counted: 0,
        }];
        let outcome = self.core.store.renew(&request).await?.pop();
        let mut renewal =
            outcome.ok_or_else(|| StoreError::Protocol("renewal returned no outcome".into()))?;
        if let (Renewal::Lost, Some(fallback)) = (renewal, &self.core.fallback) {
            // A lease handed out while the store was away (fail_open_local) lives in the fallback.
            if let Some(found @ Renewal::Renewed(_)) = fallback.renew(&request).await?.pop() {
                renewal = found;
            }
        }
        let Some(found) = &recorded else {
            return Ok((renewal, None));
        };
        match renewal {
            Renewal::Renewed(_) | Renewal::Readded(_) => {
                let op = IndexOp::Put {
                    keys: &found.keys,
                    lease_ms: found.lease_ms,
                    ttl_ms: record_ttl_ms(found.lease_ms),
                    quota: found.quota.as_deref(),
                };
                self.core.store.index(&lease.id, op).await?;
            }
            // (Named by a token, the lease may be a later admission's: its record stays, to expire.)
            Renewal::Lost if lease.token == 0 => {
                self.core.store.index(&lease.id, IndexOp::Remove).await?;
            }
            Renewal::Lost => {}
        }
        Ok((renewal, recorded))
    }

    /// Releases a lease held elsewhere, unless a later admission of the id took it over (another
    /// token). Returns whether it was held, and the record its keys were found in: forgotten when the
    /// lease was held or named with token 0, unless a reservation on it remains to settle
    /// ([`crate::Quota::settle_lent`] forgets it then). Releasing twice is not an error.
    pub async fn release(
        &self,
        lease: &RemoteLease,
    ) -> Result<(bool, Option<Recorded>), StoreError> {
        let Some((keys, recorded)) = self.keys_of(lease).await? else {
            return Ok((false, None));
        };
        let (id, token) = (&lease.id, lease.token);
        // A lease handed out while the store was away (fail_open_local) lives in the fallback.
        let in_fallback = match &self.core.fallback {
            Some(fallback) => fallback.release(&keys, id, token).await?,
            None => false,
        };
        let held = match self.core.store.release(&keys, id, token).await {
            Ok(held) => held || in_fallback,
            Err(_) if in_fallback => true,
            Err(error) => return Err(error),
        };
        // Released first: a release retried after a lost answer still finds the record. (Named by a
        // token and not held, the lease may be a later admission's: its record stays.)
        let forget = |found: &Recorded| (held || token == 0) && found.quota.is_none();
        if recorded.as_ref().is_some_and(forget) {
            self.core.store.index(id, IndexOp::Remove).await?;
        }
        Ok((held, recorded))
    }

    /// The keys `lease` names, or those recorded under its id with their record; `None`: no id, no
    /// keys, or nothing recorded.
    async fn keys_of(
        &self,
        lease: &RemoteLease,
    ) -> Result<Option<(Keys, Option<Recorded>)>, StoreError> {
        if lease.id.is_empty() {
            return Ok(None);
        }
        match &lease.keys {
            Some(keys) => Ok((!keys.is_empty()).then(|| (keys.clone(), None))),
            None => Ok(self
                .core
                .store
                .index(&lease.id, IndexOp::Get)
                .await?
                .map(|recorded| (recorded.keys.clone(), Some(recorded)))),
        }
    }

    /// Records `keys` under the id of a lease handed to a remote caller, for `lease` and a margin, so
    /// that a [`RemoteLease::recorded`] finds them from the id alone, in any process that shares the
    /// store. With `quota`, the key and the ttl of the permit's reservation (reserved under its id, see
    /// [`crate::Quota`]): the record then lasts at least as long, so that its release can settle it.
    pub async fn record(
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
}

/// How long the record of a lease handed out lasts: past the lease, so that a late renewal finds it.
fn record_ttl_ms(lease_ms: u64) -> u64 {
    lease_ms.saturating_mul(2) + 1000
}
