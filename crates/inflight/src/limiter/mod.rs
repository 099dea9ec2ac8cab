//! [`Limiter`]: admits requests per key under the policy, hands out [`Permit`](crate::Permit)s, renews
//! their leases and releases them.

mod abandon;
mod acquire;
mod admission;
mod builder;
mod busiest;
mod core;
mod decided;
mod handle;
mod holders;
mod registry;
mod remote;
mod renewer;
mod settler;
mod standing;
mod wait;
mod waiters;

pub use acquire::TryAcquire;
pub use builder::LimiterBuilder;
pub use busiest::{Busiest, Busy, Queued};
pub use core::LimiterStats;
pub use handle::{Limiter, SHUTDOWN_DRAIN};
pub(crate) use registry::Extend;
pub use remote::RemoteLease;
pub(crate) use settler::{Attempt, Deferred, Unsettled};
pub use standing::TICKET_LEASE_MS;
pub use wait::{POLL, RECHECK};
pub use waiters::DEFAULT_MAX_WAITERS;
