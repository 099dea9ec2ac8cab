//! Admissions charged to a quota, as the API and the proxy map them onto HTTP: the reservation before
//! the admission (an exhausted quota is refused before any admission is tried), timed and counted; the
//! order itself is the library's (`inflight::quota`).

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use inflight::quota::{QuotaError, Settle, Settlement};
use inflight::store::{IndexOp, Recorded};
use inflight::{
    AcquireOptions, KeyRefused, Lease, Permit, PermitId, Reservation, Store, StoreError,
};

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
    /// Reserves `charge` under `id` (default: generated) for the quota's ttl.
    pub async fn reserve(
        &self,
        charge: &Charge,
        id: Option<PermitId>,
    ) -> Result<Reservation, ApiError> {
        let reserved = self
            .quota
            .reserve_with(&charge.key, charge.amount, id, None);
        self.timed("quota", reserved)
            .await
            .map_err(|error| quota_error(&charge.key, error))
    }

    /// [`App::acquire_all`], answered as [`inflight::Quota::admitted`] says for `reservation`.
    pub async fn acquire_all_charged(
        &self,
        keys: &[&str],
        options: AcquireOptions,
        wait: Duration,
        reservation: Option<Reservation>,
    ) -> Result<(Permit, Option<Reservation>), KeyRefused> {
        let admission = self.acquire_all(keys, options, wait).await;
        self.charged(reservation, admission).await
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

    /// Releases a lease on `keys` lent a moment ago whose record (to renew it by id) could not be written.
    pub async fn release_all_lent(&self, keys: &[Arc<str>], lent: &Lease) {
        if let Ok(held) = self.limiter.release_all(keys, &lent.id, lent.token).await {
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

    /// Releases a lease on `key` handed out over HTTP and settles the reservation recorded with it, if
    /// any, as `settle` says; returns whether the lease was held.
    pub async fn release_settled(
        &self,
        key: &str,
        id: &PermitId,
        token: u64,
        settle: Settle,
    ) -> Result<bool, StoreError> {
        let record = self.timed("record", self.limiter.store().index(id, IndexOp::Get));
        let release = self.release(key, id, token);
        let (held, record) = futures_util::future::join(release, record).await;
        let held = held?;
        if let Some(recorded) = record?.filter(|recorded| *recorded.keys == [Arc::from(key)]) {
            let settled = self.quota.settle_lent(id, &recorded, settle);
            self.timed("quota", settled).await?;
        }
        Ok(held)
    }

    /// [`App::release_settled`] for a lease on several keys, found by its id.
    pub async fn release_recorded_settled(
        &self,
        id: &PermitId,
        token: u64,
        settle: Settle,
    ) -> Result<(), StoreError> {
        let store = self.limiter.store();
        let Some(recorded) = self.timed("record", store.index(id, IndexOp::Get)).await? else {
            return Ok(());
        };
        // Released first: a release retried after a lost answer still finds the record.
        let held = self
            .timed(
                "release",
                self.limiter.release_all(&recorded.keys, id, token),
            )
            .await?;
        self.count_release(&recorded.keys[0], id, held);
        let settled = self.quota.settle_lent(id, &recorded, settle);
        self.timed("quota", settled).await
    }
}
