//! The store: where leases and limit overrides live, shared by every process that uses the same store.
//!
//! A store makes each decision in one atomic step. [`MemoryStore`] is the reference implementation;
//! every store passes the same behaviour suite. [`Store`] is what every limiter needs; a capability
//! beyond it (quota: [`crate::QuotaStore`]; wake-ups for waiters; [`BusyKeys`]) gets a small trait of its own rather
//! than growing this one.

mod any;
pub(crate) mod busy;
mod contract;
pub(crate) mod holders;
mod memory;
#[cfg(feature = "redis")]
mod redis;
pub(crate) mod wake;

#[cfg(feature = "redis")]
pub use self::redis::{
    DifyStore, DifyStoreBuilder, ListingLane, RedisStore, RedisStoreBuilder, DEFAULT_PREFIX,
};
pub use any::AnyStore;
pub use busy::{BusyKey, BusyKeys, BusyList, BUSY_TIME_BUDGET, MAX_BUSY, MAX_EXAMINED};
pub use contract::{
    AcquireRequest, Admission, Grant, IndexOp, KeyStatus, Keys, LocalAdmission, LocalSlots,
    OverrideChange, Recorded, RenewRequest, Renewal, Store, Ticket,
};
pub use holders::{
    Holder, Holders, PermitPage, Waiter, MAX_HOLDER_LEN, MAX_PAGE, REVOKED_GRACE_MS,
};
pub use memory::MemoryStore;
pub use wake::{Handed, Turn, Wakeups};
