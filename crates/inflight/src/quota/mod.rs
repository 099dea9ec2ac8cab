//! Quota: a balance per key (a tenant, an API key), charged around each admission.
//!
//! A [`QuotaStore`] keeps the balances. A **reservation** takes an amount from a key's balance at once
//! (never below zero) and holds it until it is **committed** (spent) or **refunded** (given back),
//! exactly once, idempotent by its id; one that is not settled within its ttl is refunded by the store
//! itself, so a crashed worker loses no credit. While its holder works, a reservation is **extended**
//! (a [`Reservation`] held in this process extends itself; one held elsewhere is extended with
//! [`Quota::extend`]), so work may outlast the ttl. A key whose balance was never set is **unmetered**:
//! reservations on it succeed and record nothing.
//!
//! Funding a key (setting its balance, or a **top-up**) applies once per [`IdempotencyKey`]: one is
//! generated per call, so that a command re-sent after a dropped connection is not credited twice, or
//! given by the caller ([`Quota::fund_with`]), so that its own retries are not either.
//!
//! [`Quota`] is the handle the rest of a program uses: a [`Reservation`] settles itself (refunds) when it
//! is dropped unsettled, and [`Quota::run`] does the whole order — reserve, admit, run the work, settle —
//! committing only when the work succeeds (or, with [`CommitOn::Admission`], once it is admitted).

mod handle;
mod idempotency;
mod lent;
mod reservation;
mod reserve;
mod run;
mod stats;
mod store;

pub use handle::{CommitOn, Quota, QuotaError};
pub use idempotency::{
    IdempotencyKey, FUNDING_MEMORY, GENERATED_FUNDING_MEMORY, MAX_REMEMBERED_FUNDINGS,
};
pub use reservation::{DetachedReservation, Reservation, Settling};
pub use run::RunError;
pub use stats::QuotaStats;
pub(crate) use store::fingerprint;
pub use store::{
    Balance, Extension, Fund, Funding, QuotaStore, Reserve, Settle, Settlement,
    DEFAULT_RESERVATION_TTL, MAX_BALANCE, MAX_OPEN_RESERVATIONS, MAX_QUOTAS, MAX_RESERVATION_TTL,
    SETTLED_MEMORY,
};
