//! The store: where leases and limit overrides live, shared by every process that uses the same store.
//!
//! A store makes each admission decision in one atomic step. [`MemoryStore`] is the reference
//! implementation; every store passes the same behaviour suite.

mod memory;
#[cfg(feature = "redis")]
mod redis;

#[cfg(feature = "redis")]
pub use self::redis::{RedisStore, RedisStoreBuilder, DEFAULT_PREFIX};
pub use memory::MemoryStore;

use std::future::Future;
use std::sync::Arc;

use crate::error::StoreError;
use crate::id::PermitId;
use crate::policy::{Limit, Policy};

/// One admission to decide: add a lease of `weight` for `id` under `key` if it fits.
#[derive(Clone, Copy, Debug)]
pub struct AcquireRequest<'a> {
    /// The key whose in-flight count is limited.
    pub key: &'a str,
    /// The permit's id. Acquiring an id the key already holds refreshes that lease and counts once.
    pub id: &'a PermitId,
    /// How many slots the permit takes (>= 1).
    pub weight: u32,
    /// How long the lease lasts unless renewed, in milliseconds.
    pub lease_ms: u64,
    /// The process's limit settings; the store combines them with the key's override.
    pub policy: Policy,
}

/// A granted lease as the store sees it after an admission or a renewal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The key's effective limit at that moment.
    pub limit: Limit,
    /// The key's in-flight count (by weight) including this lease.
    pub in_flight: u32,
    /// The lease's weight.
    pub weight: u32,
    /// When the lease ends unless renewed, in the store's clock (ms since the Unix epoch).
    pub expires_at_ms: u64,
}

/// The store's decision on an [`AcquireRequest`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// The lease was added (or refreshed, for an id already held).
    Admitted {
        /// The lease.
        grant: Grant,
        /// Expired leases of this key that the admission reclaimed: a sign of crashed holders.
        reclaimed: u32,
    },
    /// The key is unlimited: nothing was recorded.
    Unlimited,
    /// The key is at its limit.
    Full {
        /// The effective limit.
        limit: u32,
        /// The in-flight count (by weight).
        in_flight: u32,
        /// Expired leases reclaimed on the way.
        reclaimed: u32,
    },
    /// The weight is over the limit and can never fit.
    TooHeavy {
        /// The effective limit.
        limit: u32,
    },
}

/// One lease to renew.
#[derive(Clone, Debug)]
pub struct RenewRequest {
    /// The key.
    pub key: Arc<str>,
    /// The permit's id.
    pub id: PermitId,
    /// The new lease duration from now, in milliseconds.
    pub lease_ms: u64,
    /// The process's limit settings, to report the effective limit and to judge a re-add.
    pub policy: Policy,
    /// When the lease is gone (the store lost it, or it expired): add it again with this weight if the key
    /// has room. The library's own permits do; a renewal from a remote caller does not.
    pub readd_weight: Option<u32>,
}

/// The outcome of one renewal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The lease was held and now lasts longer.
    Renewed(Grant),
    /// The lease was gone and has been added again.
    Readded(Grant),
    /// The lease was gone (and, when asked to, could not be added again).
    Lost,
}

/// What a key looks like now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyStatus {
    /// The effective limit under the policy asked with.
    pub limit: Limit,
    /// The key's override, if it has one.
    pub override_limit: Option<u32>,
    /// How many (by weight) are in flight, counting only unexpired leases.
    pub in_flight: u32,
}

/// A slot held by a permit of this process in an in-process store, without a lease.
pub trait LocalHold: Send + Sync + 'static {
    /// The key the slot is under.
    fn key(&self) -> &str;
    /// Gives back `weight` slots.
    fn release(&self, weight: u32);
    /// Turns the hold into a lease under `id` that ends `lease_ms` from now unless renewed, keeping the
    /// in-flight count as it is; returns the deadline.
    fn hand_off(&self, id: &PermitId, weight: u32, lease_ms: u64) -> u64;
}

/// The decision of [`Store::acquire_local`].
pub enum LocalAdmission {
    /// Admitted: the permit keeps `hold` until it is released.
    Held {
        /// The slot.
        hold: Arc<dyn LocalHold>,
        /// The admission (its `expires_at_ms` is 0: there is no lease).
        grant: Grant,
        /// Expired leases reclaimed on the way.
        reclaimed: u32,
    },
    /// Any other decision.
    Decided(Admission),
}

/// Called with the outcome of a release that a store runs in the background ([`Store::release_queued`]):
/// whether the lease was held, or why the store could not say.
pub type ReleaseDone = Box<dyn FnOnce(Result<bool, StoreError>) + Send + Sync>;

/// Where leases and limit overrides live. Each method is one atomic step.
///
/// Implement it for a new backend and run the behaviour suite against it. The futures are `Send` so that
/// the limiter can drive them from any task.
pub trait Store: Send + Sync + 'static {
    /// Decides one admission atomically: reclaim expired leases, resolve the limit, add the lease if it fits.
    fn acquire(
        &self,
        req: AcquireRequest<'_>,
    ) -> impl Future<Output = Result<Admission, StoreError>> + Send;

    /// Removes a lease. Returns whether it was held; releasing twice is not an error.
    fn release(
        &self,
        key: &str,
        id: &PermitId,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Renews leases, one outcome per request in the same order.
    fn renew(
        &self,
        batch: &[RenewRequest],
    ) -> impl Future<Output = Result<Vec<Renewal>, StoreError>> + Send;

    /// Reads a key's limit and in-flight count.
    fn status(
        &self,
        key: &str,
        policy: Policy,
    ) -> impl Future<Output = Result<KeyStatus, StoreError>> + Send;

    /// Sets (`Some(n)`, n > 0) or clears (`None` or `Some(0)`) a key's limit override; returns the new status.
    fn set_limit(
        &self,
        key: &str,
        limit: Option<u32>,
        policy: Policy,
    ) -> impl Future<Output = Result<KeyStatus, StoreError>> + Send;

    /// Admits a permit of this process without a lease, when the store lives in this process: the permit
    /// holds the returned [`LocalHold`] and ends only by being released, which dropping it does. `None`
    /// means "cannot: use [`Store::acquire`]". Permits with a caller-given id always take a lease.
    fn acquire_local(&self, key: &str, weight: u32, policy: Policy) -> Option<LocalAdmission> {
        let _ = (key, weight, policy);
        None
    }

    /// Releases without waiting, when the store can (an in-process store). `None` means "cannot: use
    /// [`Store::release`]". Used when a permit is dropped.
    fn release_now(&self, key: &str, id: &PermitId) -> Option<Result<bool, StoreError>> {
        let _ = (key, id);
        None
    }

    /// Releases in the background without a task of the caller's, when the store queues work itself (the
    /// Redis store's batches): `done` is called with the outcome, on the store's side. `Err(done)` hands
    /// `done` back when the store cannot; the caller then awaits [`Store::release`] in a task of its own.
    /// Used when a permit is dropped and [`Store::release_now`] cannot release it. A task spawned for each
    /// release would cost the process that drops the permit a wake-up of the runtime it spawns on.
    fn release_queued(
        &self,
        key: &str,
        id: &PermitId,
        done: ReleaseDone,
    ) -> Result<(), ReleaseDone> {
        let _ = (key, id);
        Err(done)
    }

    /// False only when the store knows, without I/O, that `key` has no override; the limiter then grants
    /// permits of a policy that is unlimited by default without asking the store.
    fn may_have_override(&self, key: &str) -> bool {
        let _ = key;
        true
    }

    /// Is the store reachable now? (An in-process store always is.)
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Ok(()))
    }

    /// Housekeeping, called by the limiter now and then: reclaim expired leases, forget idle keys.
    fn maintain(&self) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }
}

/// A shared store is a store: limiters in one process can share one (as processes share Redis).
impl<S: Store> Store for Arc<S> {
    fn acquire(
        &self,
        req: AcquireRequest<'_>,
    ) -> impl Future<Output = Result<Admission, StoreError>> + Send {
        (**self).acquire(req)
    }
    fn release(
        &self,
        key: &str,
        id: &PermitId,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        (**self).release(key, id)
    }
    fn renew(
        &self,
        batch: &[RenewRequest],
    ) -> impl Future<Output = Result<Vec<Renewal>, StoreError>> + Send {
        (**self).renew(batch)
    }
    fn status(
        &self,
        key: &str,
        policy: Policy,
    ) -> impl Future<Output = Result<KeyStatus, StoreError>> + Send {
        (**self).status(key, policy)
    }
    fn set_limit(
        &self,
        key: &str,
        limit: Option<u32>,
        policy: Policy,
    ) -> impl Future<Output = Result<KeyStatus, StoreError>> + Send {
        (**self).set_limit(key, limit, policy)
    }
    fn release_now(&self, key: &str, id: &PermitId) -> Option<Result<bool, StoreError>> {
        (**self).release_now(key, id)
    }
    fn release_queued(
        &self,
        key: &str,
        id: &PermitId,
        done: ReleaseDone,
    ) -> Result<(), ReleaseDone> {
        (**self).release_queued(key, id, done)
    }
    fn may_have_override(&self, key: &str) -> bool {
        (**self).may_have_override(key)
    }
    fn maintain(&self) -> impl Future<Output = ()> + Send {
        (**self).maintain()
    }
    fn acquire_local(&self, key: &str, weight: u32, policy: Policy) -> Option<LocalAdmission> {
        (**self).acquire_local(key, weight, policy)
    }
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).ping()
    }
}
