//! Typed errors: "full right now" differs from "can never fit" differs from "store unavailable".

use std::time::Duration;

/// Why a permit was not granted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AcquireError {
    /// The key is at its limit right now; trying again later may succeed.
    #[error("too many requests: {in_flight} of {limit} in flight")]
    Full {
        /// The key's effective limit.
        limit: u32,
        /// How many (by weight) were in flight when the request was refused.
        in_flight: u32,
    },
    /// The weight asked for is larger than the key's limit: it can never be granted.
    #[error("weight {weight} exceeds the limit {limit}")]
    WeightExceedsLimit {
        /// The weight asked for.
        weight: u32,
        /// The key's effective limit.
        limit: u32,
    },
    /// An admin revoked the waiter's place in the queue ([`crate::Limiter::revoke_waiter`]): it stops
    /// waiting.
    #[error("the wait was revoked")]
    Revoked,
    /// The request itself is malformed (for example a weight of 0).
    #[error("invalid request: {0}")]
    Invalid(&'static str),
    /// The store could not decide.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl AcquireError {
    /// True for [`AcquireError::Full`]: over the limit now, may fit later.
    pub fn is_full(&self) -> bool {
        matches!(self, Self::Full { .. })
    }

    /// A hint for when to try again, for [`AcquireError::Full`] (an HTTP `Retry-After`): a second, never
    /// zero, as holders release when their work ends and crashed holders lose their lease.
    pub fn retry_after(&self) -> Option<Duration> {
        self.is_full().then_some(Duration::from_secs(1))
    }
}

/// A store that could not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store cannot be reached (connection refused or lost, timed out, loading, failing over).
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store answered something inflight does not understand.
    #[error("unexpected store reply: {0}")]
    Protocol(String),
    /// The store refused the request as malformed.
    #[error("store rejected the request: {0}")]
    Rejected(String),
    /// The store cannot do what was asked of it (a weight over 1 in a `DifyStore`, say).
    #[error("not supported by this store: {0}")]
    Unsupported(String),
    /// A new override would pass the store's bound on keys with an override.
    #[error("too many keys have an override (at most {max})")]
    TooManyOverrides {
        /// The bound.
        max: usize,
    },
    /// A new reservation would pass the store's bound on open reservations of one key.
    #[error("too many open reservations on this key (at most {max})")]
    TooManyReservations {
        /// The bound.
        max: u32,
    },
    /// A waiter's ticket would pass the store's bound on a key's queue: tickets, or flows waiting.
    #[error("too many waiters queue on this key (at most {max} tickets and 1000 flows)")]
    TooManyWaiters {
        /// The bound on tickets.
        max: u32,
    },
    /// A new balance would pass the store's bound on keys with a balance.
    #[error("too many keys have a balance (at most {max})")]
    TooManyQuotas {
        /// The bound.
        max: usize,
    },
    /// The permit id is recorded for a permit on other keys ([`crate::Limiter::record`]): one id names
    /// one permit, so that renewing or releasing it by id acts on all of its keys.
    #[error("the permit id names a permit on other keys")]
    IdInUse,
}

impl StoreError {
    /// True when trying again later may succeed: the limiter applies its failure policy to these.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }
}

/// Which key of [`crate::Limiter::try_acquire_all`] refused the request, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("key {key:?} refused: {error}")]
pub struct KeyRefused {
    /// The key that refused (the first that did, in the order given).
    pub key: String,
    /// Its refusal.
    #[source]
    pub error: AcquireError,
}
