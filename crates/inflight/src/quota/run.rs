//! [`Quota::run`]: reserve, admit, run the work, settle, in that order, correct on every path.

use std::future::Future;

use super::handle::{CommitOn, Quota, QuotaError};
use super::store::{QuotaStore, Settle};
use crate::permit::Permit;
use crate::store::Store;

/// Why [`Quota::run`] did not return the work's value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError<E, R> {
    /// No reservation (admission was not attempted): the quota is exhausted, or the request or store failed.
    #[error(transparent)]
    Quota(QuotaError),
    /// The admission was refused; the reservation was refunded.
    #[error("admission refused: {0}")]
    Refused(R),
    /// The work failed; the reservation was refunded (under [`CommitOn::Success`]).
    #[error("the work failed: {0}")]
    Work(E),
}

impl<S: Store + QuotaStore> Quota<S> {
    /// Runs `work` under a charge of `amount` to `key` and the permit `admit` grants: reserves the
    /// amount, then admits (`admit` is not polled when the quota is exhausted), then runs the work with
    /// the permit held, then settles. Under [`CommitOn::Success`] the reservation is committed only when
    /// the work returns `Ok`; it is refunded when the admission is refused, the work returns `Err`, this
    /// future is dropped, or the work panics. Under [`CommitOn::Admission`] it is committed once the
    /// request is admitted.
    ///
    /// A commit that the store does not take (it is unavailable) is logged; the reservation then
    /// expires and is refunded.
    ///
    /// ```
    /// use inflight::quota::{Fund, Quota, RunError};
    /// use inflight::{Limiter, MemoryStore, Policy};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let store = MemoryStore::new();
    /// let limiter = Limiter::builder(store.clone()).policy(Policy::new(4, 0)).build();
    /// let quota = Quota::new(store);
    /// quota.fund("tenant:t1", Fund::Set(1)).await.unwrap();
    ///
    /// let ok = quota
    ///     .run("tenant:t1", 1, limiter.try_acquire("app:a1"), async { Ok::<_, ()>("answer") })
    ///     .await;
    /// assert_eq!(ok.unwrap(), "answer");                          // committed: the balance is 0
    /// let refused = quota
    ///     .run("tenant:t1", 1, limiter.try_acquire("app:a1"), async { Ok::<_, ()>("answer") })
    ///     .await;
    /// assert!(matches!(refused, Err(RunError::Quota(e)) if e.is_exhausted()));
    /// # }
    /// ```
    pub async fn run<T, E, R>(
        &self,
        key: &str,
        amount: u64,
        admit: impl Future<Output = Result<Permit, R>>,
        work: impl Future<Output = Result<T, E>>,
    ) -> Result<T, RunError<E, R>> {
        let reservation = self.reserve(key, amount).await.map_err(RunError::Quota)?;
        let permit = match admit.await {
            Ok(permit) => permit,
            Err(refused) => {
                // Awaited: when this returns, the amount is back.
                let _ = reservation.refund().await;
                return Err(RunError::Refused(refused));
            }
        };
        let reservation = match self.commit_on() {
            CommitOn::Success => Some(reservation),
            CommitOn::Admission => {
                reservation
                    .commit()
                    .await
                    .map_err(|error| RunError::Quota(error.into()))?;
                None
            }
        };
        // A panic or a cancellation here drops the reservation unsettled: refunded.
        let outcome = work.await;
        drop(permit);
        if let Some(reservation) = reservation {
            let settle = match outcome {
                Ok(_) => Settle::Commit,
                Err(_) => Settle::Refund,
            };
            let _ = reservation.settle(settle).await;
        }
        outcome.map_err(RunError::Work)
    }
}
