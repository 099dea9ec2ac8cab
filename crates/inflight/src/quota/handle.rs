//! [`Quota`]: the handle over a [`QuotaStore`] that the rest of a program uses; it checks the bounds,
//! hands out [`Reservation`]s and counts how reservations end.

use std::sync::Arc;
use std::time::Duration;

use super::idempotency::IdempotencyKey;
use super::stats::QuotaStats;
use super::store::{
    Balance, Extension, Fund, Funding, QuotaStore, Settle, Settlement, DEFAULT_RESERVATION_TTL,
    MAX_BALANCE, MAX_RESERVATION_TTL,
};
use crate::clock::millis;
use crate::error::StoreError;
use crate::id::PermitId;
use crate::limiter::Limiter;
use crate::store::{AnyStore, Store};

/// When [`Quota::run`] commits a reservation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CommitOn {
    /// Once the work has succeeded: work that fails, is cancelled or panics is refunded.
    #[default]
    Success,
    /// Once the request is admitted, whatever becomes of the work (for operators who bill started runs).
    Admission,
}

/// Why a reservation was not made (or a balance not changed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QuotaError {
    /// The key's balance is below the amount asked for.
    #[error("quota exhausted: {balance} left, {amount} asked for")]
    Exhausted {
        /// The balance.
        balance: u64,
        /// The amount asked for.
        amount: u64,
    },
    /// A reservation under this id was settled a moment ago; an id is reserved once.
    #[error("the reservation under this id was settled already")]
    Settled,
    /// The request is malformed (an amount of 0, a ttl over 24 h, an empty id or idempotency key).
    #[error("invalid request: {0}")]
    Invalid(&'static str),
    /// The store could not decide.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl QuotaError {
    /// True for [`QuotaError::Exhausted`].
    pub fn is_exhausted(&self) -> bool {
        matches!(self, Self::Exhausted { .. })
    }
}

/// Balances and reservations over a [`QuotaStore`]. Cheap to clone: clones share the store and the
/// counters.
///
/// ```
/// use inflight::quota::{Fund, Quota};
/// use inflight::MemoryStore;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), inflight::quota::QuotaError> {
/// let quota = Quota::new(MemoryStore::new()); // or `limiter.quota()`, beside a limiter
/// quota.fund("tenant:t1", Fund::Set(2)).await?;
/// let first = quota.reserve("tenant:t1", 1).await?;
/// let second = quota.reserve("tenant:t1", 1).await?;
/// assert!(quota.reserve("tenant:t1", 1).await.unwrap_err().is_exhausted());
/// first.commit().await?;                   // spent
/// drop(second);                            // refunded
/// assert_eq!(quota.balance("tenant:t1").await?.unwrap().balance, 1);
/// assert!(quota.reserve("free:f1", 5).await?.balance().is_none(), "no balance set: unmetered");
/// # Ok(())
/// # }
/// ```
///
/// A quota works beside a [`Limiter`] of the same store ([`Limiter::quota`]), whose background task
/// extends the reservations held in this process and finishes the settlements that dropped ones leave,
/// with the retries and the shutdown flush of a dropped permit's release.
#[derive(Clone)]
pub struct Quota<S: Store + QuotaStore = AnyStore> {
    limiter: Limiter<S>,
    ttl_ms: u64,
    commit_on: CommitOn,
    stats: Arc<QuotaStats>,
}

impl<S: Store + QuotaStore> Limiter<S> {
    /// Balances in this limiter's store: reservations of [`DEFAULT_RESERVATION_TTL`], committed on
    /// success, kept open and settled in the background by this limiter's task.
    pub fn quota(&self) -> Quota<S> {
        Quota {
            limiter: self.clone(),
            ttl_ms: millis(DEFAULT_RESERVATION_TTL),
            commit_on: CommitOn::default(),
            stats: Arc::default(),
        }
    }
}

impl<S: Store + QuotaStore> Quota<S> {
    /// Balances in `store`, with a [`Limiter`] of its own (no limits) for its background work; prefer
    /// [`Limiter::quota`] beside a limiter.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime, like [`crate::LimiterBuilder::build`].
    pub fn new(store: S) -> Self {
        Limiter::builder(store).build().quota()
    }

    /// How long a reservation stays open unless settled or extended (kept between 1 ms and
    /// [`MAX_RESERVATION_TTL`]): how long after its holder's death the store refunds it. A
    /// [`crate::Reservation`] held in this process is extended by a ttl every third of one, so work may run
    /// longer; one held elsewhere is extended with [`Quota::extend`].
    #[must_use]
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl_ms = millis(ttl).clamp(1, millis(MAX_RESERVATION_TTL));
        self
    }

    /// When [`Quota::run`] commits (default [`CommitOn::Success`]).
    #[must_use]
    pub fn with_commit_on(mut self, commit_on: CommitOn) -> Self {
        self.commit_on = commit_on;
        self
    }

    /// Counts into `stats`, shared with other handles (every worker of a server, say).
    #[must_use]
    pub fn with_stats(mut self, stats: Arc<QuotaStats>) -> Self {
        self.stats = stats;
        self
    }

    /// How long a reservation stays open unless its caller asks for another ttl.
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms)
    }

    /// When [`Quota::run`] commits.
    pub fn commit_on(&self) -> CommitOn {
        self.commit_on
    }

    /// How reservations have ended so far.
    pub fn stats(&self) -> &QuotaStats {
        &self.stats
    }

    /// Sets or tops up `key`'s balance (amounts up to [`MAX_BALANCE`]; a top-up of 0 is refused), once:
    /// under an idempotency key generated for this call, so that a command the Redis client re-sends
    /// after a dropped connection is not credited twice.
    pub async fn fund(&self, key: &str, fund: Fund) -> Result<Balance, QuotaError> {
        let funding = self
            .fund_with(key, fund, &IdempotencyKey::generate())
            .await?;
        let reused = "a generated idempotency key was found in use";
        funding
            .balance()
            .ok_or_else(|| QuotaError::Store(StoreError::Protocol(reused.into())))
    }

    /// Sets or tops up `key`'s balance once per `idempotency` key (given by the caller: its retries
    /// apply once too, within [`crate::quota::FUNDING_MEMORY`]). The same funding under the same key
    /// again is [`Funding::Repeated`], answered as the first time; another funding under it is
    /// [`Funding::KeyReused`]. Both change nothing.
    ///
    /// ```
    /// use inflight::quota::{Fund, Funding, IdempotencyKey, Quota};
    /// use inflight::MemoryStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), inflight::quota::QuotaError> {
    /// let quota = Quota::new(MemoryStore::new());
    /// let payment = IdempotencyKey::from("payment-42");
    /// quota.fund("tenant:t1", Fund::Set(100)).await?;
    /// let first = quota.fund_with("tenant:t1", Fund::Add(50), &payment).await?;
    /// let retry = quota.fund_with("tenant:t1", Fund::Add(50), &payment).await?;
    /// assert_eq!((first.balance().unwrap().balance, retry.is_repeated()), (150, true));
    /// assert_eq!(quota.balance("tenant:t1").await?.unwrap().balance, 150);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn fund_with(
        &self,
        key: &str,
        fund: Fund,
        idempotency: &IdempotencyKey,
    ) -> Result<Funding, QuotaError> {
        match fund {
            Fund::Set(n) | Fund::Add(n) if n > MAX_BALANCE => {
                return Err(QuotaError::Invalid("balances are at most 10^15"))
            }
            Fund::Add(0) => return Err(QuotaError::Invalid("a top-up must be at least 1")),
            _ if idempotency.is_empty() => {
                return Err(QuotaError::Invalid("an idempotency key is not empty"))
            }
            _ => {}
        }
        let funding = self.store().fund(key, fund, idempotency).await?;
        match &funding {
            Funding::Applied(balance) => self.stats.saw(key, Some(balance)),
            // (Answered as it was: not the balance now, which the stats keep.)
            Funding::Repeated(balance) => self.stats.saw_expired(balance.expired),
            Funding::KeyReused => {}
        }
        Ok(funding)
    }

    /// `key`'s balance; `None` for an unmetered key.
    pub async fn balance(&self, key: &str) -> Result<Option<Balance>, StoreError> {
        let balance = self.store().balance(key).await?;
        self.stats.saw(key, balance.as_ref());
        Ok(balance)
    }

    /// Commits or refunds the reservation `id` of `key`, held elsewhere (handed to a remote caller with
    /// [`crate::Reservation::detach`]).
    pub async fn settle(
        &self,
        key: &str,
        id: &PermitId,
        settle: Settle,
    ) -> Result<Settlement, StoreError> {
        if id.is_empty() {
            return Ok(Settlement::NotFound(None));
        }
        let settlement = self.store().settle(key, id, settle).await?;
        self.stats.settled(key, settle, &settlement);
        Ok(settlement)
    }

    /// Moves the deadline of the open reservation `id` of `key`, held elsewhere, to `ttl` (default: the
    /// handle's; 1 ms to 24 h) from now; one that is not open is left as it is ([`Extension::NotOpen`]).
    pub async fn extend(
        &self,
        key: &str,
        id: &PermitId,
        ttl: Option<Duration>,
    ) -> Result<Extension, QuotaError> {
        let ttl_ms = self.ttl_ms(ttl)?;
        if id.is_empty() {
            return Ok(Extension::NotOpen(self.balance(key).await?));
        }
        let extension = self.store().extend(key, id, ttl_ms).await?;
        self.stats.saw(key, extension.balance().as_ref());
        Ok(extension)
    }

    pub(super) fn store(&self) -> &S {
        self.limiter.store()
    }

    pub(super) fn limiter(&self) -> &Limiter<S> {
        &self.limiter
    }

    pub(super) fn ttl_ms(&self, ttl: Option<Duration>) -> Result<u64, QuotaError> {
        match ttl {
            None => Ok(self.ttl_ms),
            Some(ttl) if ttl.is_zero() || ttl > MAX_RESERVATION_TTL => {
                Err(QuotaError::Invalid("a ttl is between 1 ms and 24 h"))
            }
            Some(ttl) => Ok(millis(ttl).max(1)),
        }
    }
}

impl<S: Store + QuotaStore> std::fmt::Debug for Quota<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Quota")
            .field("ttl_ms", &self.ttl_ms)
            .field("commit_on", &self.commit_on)
            .finish()
    }
}
