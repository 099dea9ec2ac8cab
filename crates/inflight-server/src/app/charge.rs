//! Admissions charged to a quota, as the API and the proxy map them onto HTTP: the reservation before
//! the admission (an exhausted quota is refused before any admission is tried), timed and counted; the
//! order itself is the library's (`inflight::quota`).

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use inflight::quota::{QuotaError, Settle, Settlement};
use inflight::store::Recorded;
use inflight::{AcquireOptions, Lease, Permit, PermitId, RemoteLease, Reservation, StoreError};

use super::App;
use crate::error::ApiError;

/// A charge to a key's balance, as an acquire body's `"quota"` or the proxy's `--quota-key` names it.
#[derive(Clone, Debug)]
pub struct Charge {
    /// The key charged.
    pub key: String,
    /// How much.
    pub amount: u64,
}

/// The answer to a reservation that was not made.
pub fn quota_error(key: &str, error: QuotaError) -> ApiError {
    match error {
        QuotaError::Exhausted { balance, amount } => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "quota_exhausted",
            format!("The quota of this key is exhausted: {balance} left, {amount} needed."),
        )
        .naming(key),
        QuotaError::Settled => ApiError::new(
            StatusCode::CONFLICT,
            "reservation_settled",
            "A reservation under this id was settled a moment ago: use a new id.",
        ),
        QuotaError::Invalid(why) => ApiError::invalid_request(why),
        QuotaError::Store(StoreError::Rejected(why)) => ApiError::invalid_request(why),
        QuotaError::Store(error) => error.into(),
        other => ApiError::invalid_request(other.to_string()),
    }
}

impl App {
    /// Reserves `charge`, if any, under `id` (default: generated) for the quota's ttl.
    pub async fn reserve(
        &self,
        charge: Option<&Charge>,
        id: Option<PermitId>,
    ) -> Result<Option<Reservation>, ApiError> {
        let Some(charge) = charge else {
            return Ok(None);
        };
        let reserved = self
            .quota
            .reserve_with(&charge.key, charge.amount, id, None);
        self.timed("quota", reserved)
            .await
            .map(Some)
            .map_err(|error| quota_error(&charge.key, error))
    }

    /// [`App::acquire_all`], answered as [`inflight::Quota::admitted`] says for `reservation`.
    pub async fn acquire_all_charged(
        &self,
        keys: &[&str],
        options: AcquireOptions,
        wait: Duration,
        reservation: Option<Reservation>,
    ) -> Result<(Permit, Option<Reservation>), ApiError> {
        let admission = self.acquire_all(keys, options, wait).await;
        let charged = self.charged(reservation, admission).await;
        charged.map_err(|refused| self.refusal(&refused.key, refused.error))
    }

    /// The answer to an admission a reservation was made for: a refusal refunds it (timed) first.
    pub async fn charged<E>(
        &self,
        reservation: Option<Reservation>,
        admission: Result<Permit, E>,
    ) -> Result<(Permit, Option<Reservation>), E> {
        if admission.is_ok() || reservation.is_none() {
            return admission.map(|permit| (permit, reservation));
        }
        self.timed("quota", self.quota.admitted(reservation, admission))
            .await
    }

    /// A lent permit renewed: the reservation recorded with it, if any, extended (timed).
    pub(super) async fn keep_lent(&self, recorded: &Recorded, id: &PermitId, lease: Duration) {
        if recorded.quota.is_some() {
            self.timed("quota", self.quota.keep_lent(recorded, id, lease))
                .await;
        }
    }

    /// Releases a lease lent a moment ago that its client never got (its record, or its reservation,
    /// could not be written).
    pub async fn release_unanswered(&self, keys: &[Arc<str>], lent: &Lease) {
        let lease = RemoteLease {
            id: lent.id.clone(),
            token: lent.token,
            keys: Some(Arc::from(keys)),
        };
        if let Ok((held, _)) = self.limiter.release(&lease).await {
            self.count_release(&keys[0], &lent.id, held);
        }
    }

    /// Settles the reservation `id` of `key`, held by a remote caller.
    pub async fn settle(
        &self,
        key: &str,
        id: &PermitId,
        settle: Settle,
    ) -> Result<Settlement, StoreError> {
        self.timed("quota", self.quota.settle(key, id, settle))
            .await
    }

    /// Releases a lease handed out over HTTP (that the admission `lease.token` took; 0: whichever the
    /// id holds) and settles the reservation recorded with it, if any, as `settle` says; returns whether
    /// it was held (and then counts the release).
    pub async fn release(&self, lease: &RemoteLease, settle: Settle) -> Result<bool, StoreError> {
        let release = self.timed("release", self.limiter.release(lease));
        let (released, record) = futures_util::future::join(release, self.record_of(lease)).await;
        let (held, found) = released?;
        let found_keys = found.as_ref().map(|found| &found.keys);
        let Some(keys) = lease.keys.as_ref().or(found_keys) else {
            return Ok(false); // Named by its id alone, and nothing recorded.
        };
        self.count_release(&keys[0], &lease.id, held);
        // (The limiter forgets a record it found, unless a reservation on it remains to settle.)
        let unsettled = match found {
            Some(found) => found.quota.is_some().then_some(found),
            None => record?,
        };
        if let Some(recorded) = unsettled {
            let settled = self.quota.settle_lent(&lease.id, &recorded, settle);
            self.timed("quota", settled).await?;
        }
        Ok(held)
    }
}
