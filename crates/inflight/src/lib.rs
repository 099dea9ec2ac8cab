//! # inflight
//!
//! Cap how many requests each key (an app, a tenant, an API key) has **in flight at once**, counted across
//! every process that shares a store, and hold a streamed response's slot until the stream really ends.
//!
//! - [`Policy`]: a key's limit is its override, else its class's default, capped by its class's
//!   ceiling; 0 is unlimited.
//! - [`Limiter::try_acquire`] admits at once or says why not; [`Limiter::try_acquire_all`] takes several
//!   keys together or not at all.
//! - [`Permit`] releases its slot when dropped, on every path; its lease is renewed while it lives, so
//!   a crashed holder's slots come back within a lease. [`PermitStream`] and [`Permit::scope`] carry it.
//! - [`Store`]: [`MemoryStore`] (the embedded default) or `RedisStore` (feature `redis`, on by default),
//!   shared by every process that uses the same Redis.
//! - [`FailurePolicy`]: refuse, admit, or admit under a per-process cap when the store cannot answer.
//! - [`Quota`] ([`quota`]): a balance per key, reserved before an admission and committed on success or
//!   refunded otherwise ([`Quota::run`]).
//!
//! ## Sharing limits between processes
//!
//! ```no_run
//! use inflight::{FailurePolicy, Limiter, Policy, RedisStore};
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = Limiter::builder(RedisStore::open("redis://127.0.0.1:6379")?)
//!     .policy(Policy::new(4, 20))                 // 4 per key by default, never more than 20
//!     .lease(Duration::from_secs(10))              // a crashed process's slots return within 10 s
//!     .on_store_failure(FailurePolicy::FailOpenLocal { limit: 2 })
//!     .build();
//! limiter.set_limit("app-42", 8).await?;           // every process sees it at its next admission
//! let permit = limiter.try_acquire("app-42").await?;
//! # drop(permit);
//! # Ok(())
//! # }
//! ```
//!
//! ## Quick start
//!
//! ```
//! use futures_util::{stream, StreamExt};
//! use inflight::{Limiter, MemoryStore, Policy};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), inflight::AcquireError> {
//! let limiter = Limiter::builder(MemoryStore::new())
//!     .policy(Policy::new(3, 0)) // every key: 3 in flight at once
//!     .build();
//!
//! // A request: admitted now, or refused at once.
//! let permit = limiter.try_acquire("app-42").await?;
//!
//! // Its streamed answer holds the slot until the last chunk is sent or the client goes away.
//! let mut answer = permit.guard_stream(stream::iter(["data: 1\n\n", "data: 2\n\n"]));
//! while let Some(chunk) = answer.next().await {
//!     let _ = chunk;
//! }
//! assert_eq!(limiter.status("app-42").await?.in_flight, 0);
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

mod clock;
mod error;
mod failure;
mod floors;
mod id;
mod limit;
mod limiter;
mod options;
mod permit;
mod policy;
pub mod quota;
pub mod store;

pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{AcquireError, KeyRefused, StoreError};
pub use failure::FailurePolicy;
pub use floors::{Floors, MAX_FLOORS};
pub use id::PermitId;
pub use limiter::{
    Busiest, Busy, Limiter, LimiterBuilder, LimiterStats, Queued, RemoteLease, TryAcquire,
    DEFAULT_MAX_WAITERS, POLL, RECHECK, SHUTDOWN_DRAIN, TICKET_LEASE_MS,
};
pub use options::{
    AcquireOptions, DEFAULT_LEASE, MAX_FLOW_LEN, MAX_FLOW_WEIGHT, MAX_LEASE, MIN_LEASE,
};
pub use permit::{Lease, Permit, PermitStream, Scoped};
pub use policy::{ClassLimits, Limit, Policy, PolicyError, Rule, SharedPolicy, MAX_RULES};
pub use quota::{Quota, QuotaStore, Reservation};
pub use store::{
    AnyStore, BusyKeys, Holders, KeyStatus, Keys, MemoryStore, PermitPage, Renewal, Store, Wakeups,
};
#[cfg(feature = "redis")]
pub use store::{DifyStore, DifyStoreBuilder, RedisStore, RedisStoreBuilder};
