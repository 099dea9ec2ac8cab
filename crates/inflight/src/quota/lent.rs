//! A lent permit's charge in the quota's order: refunded when its admission is refused; once admitted,
//! committed at once ([`CommitOn::Admission`]) or recorded with the permit's keys, so that whichever
//! process releases the permit settles it, and each renewal extends it.

use std::sync::Arc;
use std::time::Duration;

use super::handle::{CommitOn, Quota, QuotaError};
use super::reservation::{DetachedReservation, Reservation};
use super::store::{Extension, QuotaStore, Settle};
use crate::error::StoreError;
use crate::id::PermitId;
use crate::permit::Permit;
use crate::store::{IndexOp, Recorded, Store};

impl<S: Store + QuotaStore> Quota<S> {
    /// The answer to the admission `reservation` was made for: a refusal refunds it (the amount is back
    /// when this returns); an admission keeps it with the permit.
    pub async fn admitted<R>(
        &self,
        reservation: Option<Reservation<S>>,
        admission: Result<Permit, R>,
    ) -> Result<(Permit, Option<Reservation<S>>), R> {
        match (admission, reservation) {
            (Ok(permit), reservation) => Ok((permit, reservation)),
            (Err(refused), Some(reservation)) => {
                if let Err(error) = reservation.refund().await {
                    tracing::warn!(%error, "refund after a refused admission failed; the reservation will expire");
                }
                Err(refused)
            }
            (Err(refused), None) => Err(refused),
        }
    }

    /// True when a reservation taken with a permit is settled at its release: metered, not committed yet.
    pub fn settles_on_release(&self, reservation: &Reservation<S>) -> bool {
        reservation.is_metered() && self.commit_on() == CommitOn::Success
    }

    /// The reservation of a permit just admitted and lent, as handed over: committed now under
    /// [`CommitOn::Admission`], else handed off for the permit's release to settle.
    pub async fn hand_over(
        &self,
        reservation: Reservation<S>,
    ) -> Result<DetachedReservation, StoreError> {
        if self.commit_on() == CommitOn::Admission && reservation.is_metered() {
            let described = reservation.described();
            reservation.commit().await?;
            return Ok(described);
        }
        Ok(reservation.detach())
    }

    /// Records a lent permit (its `keys`, its `lease`) with the key its reservation (same id) charges,
    /// for as long as the reservation, so that its release, through any process, settles it.
    pub async fn record_lent(
        &self,
        keys: &[Arc<str>],
        id: &PermitId,
        lease: Duration,
        quota_key: &str,
    ) -> Result<(), StoreError> {
        let charge = Some((quota_key, self.ttl()));
        self.limiter().record(keys, id, lease, charge).await
    }

    /// A lent permit was renewed for `lease`: extends the reservation recorded with it by the quota's
    /// ttl (or by the lease, when longer, so that it outlives the lease between renewals) and keeps
    /// its record as long. A failure is logged, not returned: the renewal itself was done, and a
    /// charge not extended is only refunded when its ttl passes.
    pub async fn keep_lent(&self, recorded: &Recorded, id: &PermitId, lease: Duration) {
        let Some(quota) = &recorded.quota else {
            return;
        };
        let kept = match self.extend(quota, id, Some(self.ttl().max(lease))).await {
            // (Only an open one's record is written again: a release may have just removed it.)
            Ok(Extension::Extended { .. }) => self
                .record_lent(&recorded.keys, id, lease, quota)
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

    /// A lent permit was released: settles its recorded reservation (if any), then forgets the record.
    pub async fn settle_lent(
        &self,
        id: &PermitId,
        recorded: &Recorded,
        settle: Settle,
    ) -> Result<(), StoreError> {
        if let Some(quota) = &recorded.quota {
            self.settle(quota, id, settle).await?;
        }
        self.store().index(id, IndexOp::Remove).await.map(drop)
    }
}
