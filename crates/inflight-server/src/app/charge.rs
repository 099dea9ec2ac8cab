//! Admissions charged to a quota, the one place the API and the proxy do it: the reservation before the
//! admission (an exhausted quota is refused before any admission is tried), its refund when the
//! admission is refused, and its settlement when the permit is released.

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use inflight::quota::{CommitOn, DetachedReservation, Extension, QuotaError, Settle, Settlement};
use inflight::store::{IndexOp, Recorded};
use inflight::{AcquireOptions, KeyRefused, Permit, PermitId, Reservation, Store, StoreError};

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

    /// Admits under `keys` (waiting up to `wait`) after `reservation` was made: a refusal refunds it
    /// before it is answered; an admission hands it back with the permit.
    pub async fn acquire_all_charged(
        &self,
        keys: &[&str],
        options: AcquireOptions,
        wait: Duration,
        reservation: Option<Reservation>,
    ) -> Result<(Permit, Option<Reservation>), KeyRefused> {
        match self.acquire_all(keys, options, wait).await {
            Ok(permit) => Ok((permit, reservation)),
            Err(refused) => {
                if let Some(reservation) = reservation {
                    self.refund_refused(reservation).await;
                }
                Err(refused)
            }
        }
    }

    /// Gives back the reservation of a refused admission before the refusal is answered.
    pub async fn refund_refused(&self, reservation: Reservation) {
        if let Err(error) = self.timed("quota", reservation.refund()).await {
            tracing::warn!(%error, "refund after a refused admission failed; the reservation will expire");
        }
    }

    /// The reservation of an admitted request: committed now under `--quota-commit on_admission`,
    /// otherwise left open for whoever releases the permit to settle. The answer describes it either
    /// way.
    pub async fn hand_over(
        &self,
        reservation: Reservation,
    ) -> Result<DetachedReservation, StoreError> {
        if self.quota.commit_on() == CommitOn::Admission && reservation.is_metered() {
            let described = DetachedReservation {
                key: Arc::from(reservation.key()),
                id: reservation.id().clone(),
                amount: reservation.amount(),
                balance: reservation.balance(),
                expires_at_ms: reservation.expires_at_ms(),
            };
            self.timed("quota", reservation.commit()).await?;
            return Ok(described);
        }
        Ok(reservation.detach())
    }

    /// True when a reservation taken with a permit is settled when the permit is released (it is open,
    /// and not committed at admission).
    pub fn settles_on_release(&self, reservation: &Reservation) -> bool {
        reservation.is_metered() && self.quota.commit_on() == CommitOn::Success
    }

    /// Records a permit lent over HTTP with the quota key of its reservation (under the permit's id),
    /// so that its release, through any process, settles it.
    pub async fn record_charged(
        &self,
        keys: &[Arc<str>],
        id: &PermitId,
        lease: Duration,
        quota_key: &str,
    ) -> Result<(), StoreError> {
        let quota = Some((quota_key, self.quota.ttl()));
        let recorded = self.limiter.record_with(keys, id, lease, quota);
        self.timed("record", recorded).await
    }

    /// A renewed permit's charge kept: its reservation extended by the quota's ttl (or by the `lease`,
    /// when longer, so that it outlives the lease between renewals), so that work which outlasts the
    /// ttl is still charged, and its record kept as long. A failure is logged, not answered: the
    /// renewal itself was done, and a charge not extended is only refunded when its ttl passes.
    pub(super) async fn keep_charged(&self, recorded: &Recorded, id: &PermitId, lease: Duration) {
        let Some(quota) = &recorded.quota else {
            return;
        };
        let ttl = self.quota.ttl().max(lease);
        let extended = self.quota.extend(quota, id, Some(ttl));
        let kept = match self.timed("quota", extended).await {
            // (Only an open one's record is written again: a release may have just removed it.)
            Ok(Extension::Extended { .. }) => self
                .record_charged(&recorded.keys, id, lease, quota)
                .await
                .map_err(QuotaError::Store),
            Ok(Extension::NotOpen(None)) => Ok(()),
            Ok(Extension::NotOpen(Some(_))) => {
                tracing::warn!(key = %quota, %id, "a renewed permit's reservation had expired (refunded)");
                Ok(())
            }
            Err(error) => Err(error),
        };
        if let Err(error) = kept {
            tracing::warn!(%error, key = %quota, %id, "a renewed permit's reservation was not extended");
        }
    }

    /// Releases a lease on `keys` lent a moment ago whose record could not be written (its client could
    /// not renew it by id).
    pub async fn release_all_lent(&self, keys: &[Arc<str>], id: &PermitId) {
        if let Ok(held) = self.limiter.release_all(keys, id).await {
            self.count_release(&keys[0], id, held);
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
    /// any, as `settle` says; returns whether the lease was held. The record is looked up while the
    /// lease is released.
    pub async fn release_settled(
        &self,
        key: &str,
        id: &PermitId,
        settle: Settle,
    ) -> Result<bool, StoreError> {
        let record = self.timed("record", self.limiter.store().index(id, IndexOp::Get));
        let (held, record) = futures_util::future::join(self.release(key, id), record).await;
        let held = held?;
        if let Some(recorded) = record?.filter(|recorded| *recorded.keys == [Arc::from(key)]) {
            self.settle_recorded(id, &recorded, settle).await?;
        }
        Ok(held)
    }

    /// Releases a lease on several keys handed out over HTTP, found by its id, and settles the
    /// reservation recorded with it, if any.
    pub async fn release_recorded_settled(
        &self,
        id: &PermitId,
        settle: Settle,
    ) -> Result<(), StoreError> {
        let store = self.limiter.store();
        let Some(recorded) = self.timed("record", store.index(id, IndexOp::Get)).await? else {
            return Ok(());
        };
        // Released first: a release retried after a lost answer still finds the record.
        let held = self
            .timed("release", self.limiter.release_all(&recorded.keys, id))
            .await?;
        self.count_release(&recorded.keys[0], id, held);
        self.settle_recorded(id, &recorded, settle).await
    }

    /// Settles the reservation of a record (if it has one), then forgets the record.
    async fn settle_recorded(
        &self,
        id: &PermitId,
        recorded: &Recorded,
        settle: Settle,
    ) -> Result<(), StoreError> {
        if let Some(quota) = &recorded.quota {
            self.settle(quota, id, settle).await?;
        }
        let forget = self.limiter.store().index(id, IndexOp::Remove);
        self.timed("record", forget).await.map(drop)
    }
}
