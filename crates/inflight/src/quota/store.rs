//! What a [`QuotaStore`] keeps and answers: balances, reservations and their settlement, and the bounds.

use std::future::Future;
use std::time::Duration;

use super::idempotency::IdempotencyKey;
use crate::error::StoreError;
use crate::id::PermitId;

/// The longest a reservation may stay open before the store refunds it by itself.
pub const MAX_RESERVATION_TTL: Duration = Duration::from_secs(86_400);

/// How long a reservation stays open unless [`crate::Quota::ttl`] says otherwise.
pub const DEFAULT_RESERVATION_TTL: Duration = Duration::from_secs(3_600);

/// The most reservations one key may have open at once; one more is [`StoreError::TooManyReservations`].
pub const MAX_OPEN_RESERVATIONS: u32 = 65_536;

/// The most keys with a balance, in a store: balances never expire, so this bounds what funding keys
/// can fill. Funding one more is [`StoreError::TooManyQuotas`].
pub const MAX_QUOTAS: usize = 1 << 18;

/// The largest balance and the largest amount: every sum of them stays exact in a Redis script's numbers.
pub const MAX_BALANCE: u64 = 1_000_000_000_000_000;

/// How long a store remembers how a reservation was settled, so that a retry is answered
/// [`Settlement::Already`] (at most [`MAX_OPEN_RESERVATIONS`] per key, the oldest forgotten first).
pub const SETTLED_MEMORY: Duration = Duration::from_secs(600);

/// How [`QuotaStore::fund`] changes a balance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fund {
    /// Sets the balance to this (what is reserved stays reserved). On a key that had none, the key
    /// becomes metered.
    Set(u64),
    /// Adds this to the balance (a top-up); on a key that had none, sets it.
    Add(u64),
}

/// A key's balance, after the step that answered it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Balance {
    /// What can still be reserved.
    pub balance: u64,
    /// What open reservations hold.
    pub reserved: u64,
    /// Reservations of the key found past their ttl and refunded: a sign of crashed holders.
    pub expired: u32,
}

/// The store's answer to a funding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Funding {
    /// Applied now: the balance after it.
    Applied(Balance),
    /// Applied before under this idempotency key (a caller's retry, or this very call's command,
    /// re-sent by the Redis client after its connection dropped): nothing changed. The balance and
    /// reserved amount as answered the first time (not as they are now); `expired` counts the
    /// reservations this call refunded.
    Repeated(Balance),
    /// The idempotency key was used for another funding of this key (another amount, or a set where
    /// that was a top-up) within its memory: nothing changed.
    KeyReused,
}

impl Funding {
    /// The balance answered; `None` for [`Funding::KeyReused`].
    pub fn balance(&self) -> Option<Balance> {
        match self {
            Self::Applied(balance) | Self::Repeated(balance) => Some(*balance),
            Self::KeyReused => None,
        }
    }

    /// True for [`Funding::Repeated`].
    pub fn is_repeated(&self) -> bool {
        matches!(self, Self::Repeated(_))
    }
}

/// A funding as a store records it beside its idempotency key, to tell a re-send from another funding.
pub(crate) fn fingerprint(fund: Fund) -> (char, u64) {
    match fund {
        Fund::Set(n) => ('s', n),
        Fund::Add(n) => ('a', n),
    }
}

/// The store's decision on a reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reserve {
    /// The amount is held under the id until `expires_at_ms`. For an id already open: that
    /// reservation, its deadline moved to a ttl from now, nothing taken again.
    Reserved {
        /// The balance after it.
        balance: Balance,
        /// When the store refunds it unless it is settled first (ms since the Unix epoch).
        expires_at_ms: u64,
    },
    /// The balance is below the amount: nothing was taken.
    Exhausted {
        /// The balance as it is.
        balance: Balance,
    },
    /// A reservation under this id ended within [`SETTLED_MEMORY`]: nothing was taken.
    Settled {
        /// The balance as it is.
        balance: Balance,
    },
    /// The key has no balance: nothing is counted and nothing was recorded.
    Unmetered,
}

/// The store's answer to an extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Extension {
    /// The reservation's deadline moved to `expires_at_ms`.
    Extended {
        /// Its new deadline (ms since the Unix epoch, store clock).
        expires_at_ms: u64,
        /// The key's balance.
        balance: Balance,
    },
    /// No open reservation under the id (settled, expired, never made): nothing changed. The key's
    /// balance, or `None` for an unmetered key.
    NotOpen(Option<Balance>),
}

impl Extension {
    /// The new deadline; `None` when nothing was extended.
    pub fn expires_at_ms(&self) -> Option<u64> {
        match self {
            Self::Extended { expires_at_ms, .. } => Some(*expires_at_ms),
            Self::NotOpen(_) => None,
        }
    }

    /// The key's balance (`None`: unmetered).
    pub fn balance(&self) -> Option<Balance> {
        match self {
            Self::Extended { balance, .. } => Some(*balance),
            Self::NotOpen(balance) => *balance,
        }
    }
}

/// How to settle a reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Settle {
    /// The amount is spent.
    Commit,
    /// The amount goes back to the balance.
    Refund,
}

/// The store's answer to a settlement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settlement {
    /// Settled now, as asked.
    Settled(Balance),
    /// Settled the same way before (a retry): nothing changed.
    Already(Balance),
    /// No open reservation under the id: it expired (and was refunded), was settled the other way, or
    /// never was. Nothing changed. The key's balance, or `None` for an unmetered key.
    NotFound(Option<Balance>),
}

impl Settlement {
    /// The key's balance after the settlement (`None`: unmetered).
    pub fn balance(&self) -> Option<Balance> {
        match self {
            Self::Settled(balance) | Self::Already(balance) => Some(*balance),
            Self::NotFound(balance) => *balance,
        }
    }

    /// False for [`Settlement::NotFound`].
    pub fn is_found(&self) -> bool {
        !matches!(self, Self::NotFound(_))
    }
}

/// Where balances and reservations live, shared by every process that uses the same store. Each method
/// is one atomic step, and each refunds the key's expired reservations first.
///
/// The callers ([`crate::Quota`]) check the bounds: amounts from 1 to [`MAX_BALANCE`], ttls from 1 ms to
/// [`MAX_RESERVATION_TTL`].
pub trait QuotaStore: Clone + Send + Sync + 'static {
    /// Sets or tops up a key's balance, once per `idempotency` key: the store remembers the key with
    /// its answer (for [`IdempotencyKey::memory`], at most
    /// [`crate::quota::MAX_REMEMBERED_FUNDINGS`] per key) in the same atomic step, and answers the same
    /// funding under it again with [`Funding::Repeated`]. One that would pass [`MAX_BALANCE`] is
    /// [`StoreError::Rejected`] (and not remembered).
    fn fund(
        &self,
        key: &str,
        fund: Fund,
        idempotency: &IdempotencyKey,
    ) -> impl Future<Output = Result<Funding, StoreError>> + Send;

    /// A key's balance; `None` for an unmetered key.
    fn balance(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<Balance>, StoreError>> + Send;

    /// Takes `amount` from the key's balance under `id` for `ttl_ms`, if the balance has it. A key with
    /// [`MAX_OPEN_RESERVATIONS`] open is [`StoreError::TooManyReservations`].
    fn reserve(
        &self,
        key: &str,
        id: &PermitId,
        amount: u64,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<Reserve, StoreError>> + Send;

    /// Commits or refunds the open reservation `id` of `key`.
    fn settle(
        &self,
        key: &str,
        id: &PermitId,
        settle: Settle,
    ) -> impl Future<Output = Result<Settlement, StoreError>> + Send;

    /// Moves the deadline of the open reservation `id` of `key` to `ttl_ms` from now.
    fn extend(
        &self,
        key: &str,
        id: &PermitId,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<Extension, StoreError>> + Send;
}
