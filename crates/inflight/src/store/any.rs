//! [`AnyStore`]: the store chosen at start-up, as one type, so that the code above it (a server, say)
//! names no store type and is not generic over one.
//!
//! Each method is a `match` on the variant, with static dispatch: the memory store keeps its admission
//! without I/O ([`Store::hold`] answers in place). Library users with a store of their own keep
//! [`crate::Limiter`]`<S>` for it.

use std::future::Future;
use std::sync::Arc;

use super::busy::{BusyKeys, BusyList};
use super::wake::{Interest, Wakeups};
use super::{
    AcquireRequest, Admission, IndexOp, KeyStatus, LocalAdmission, MemoryStore, OverrideChange,
    Recorded, RenewRequest, Renewal, Store,
};
use crate::error::StoreError;
use crate::id::PermitId;
use crate::policy::ClassLimits;
use crate::quota::{Balance, Extension, Fund, QuotaStore, Reserve, Settle, Settlement};

/// One of the stores this crate ships: every store trait, implemented by dispatching to the variant.
///
/// ```
/// use inflight::{AnyStore, Limiter, MemoryStore, Policy};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store = AnyStore::from(MemoryStore::new());
/// let limiter = Limiter::builder(store).policy(Policy::new(1, 0)).build();
/// let permit = limiter.try_acquire("app-1").await.unwrap();
/// assert!(limiter.try_acquire("app-1").await.unwrap_err().is_full());
/// # drop(permit);
/// # }
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum AnyStore {
    /// The in-process store.
    Memory(MemoryStore),
    /// Redis: one server, a Cluster, or a primary under Sentinel.
    #[cfg(feature = "redis")]
    Redis(super::RedisStore),
}

impl From<MemoryStore> for AnyStore {
    fn from(store: MemoryStore) -> Self {
        Self::Memory(store)
    }
}

#[cfg(feature = "redis")]
impl From<super::RedisStore> for AnyStore {
    fn from(store: super::RedisStore) -> Self {
        Self::Redis(store)
    }
}

/// Calls `$call` on whichever store `$any` is, as `$store`.
macro_rules! each {
    ($any:expr, $store:ident => $call:expr) => {
        match $any {
            AnyStore::Memory($store) => $call,
            #[cfg(feature = "redis")]
            AnyStore::Redis($store) => $call,
        }
    };
}

impl Store for AnyStore {
    fn acquire(
        &self,
        req: AcquireRequest<'_>,
    ) -> impl Future<Output = Result<Admission, StoreError>> + Send {
        async move { each!(self, s => s.acquire(req).await) }
    }

    fn release(
        &self,
        keys: &[Arc<str>],
        id: &PermitId,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        async move { each!(self, s => s.release(keys, id).await) }
    }

    fn renew(
        &self,
        batch: &[RenewRequest],
    ) -> impl Future<Output = Result<Vec<Renewal>, StoreError>> + Send {
        async move { each!(self, s => s.renew(batch).await) }
    }

    fn status(
        &self,
        key: &str,
        limits: ClassLimits,
        change: OverrideChange,
    ) -> impl Future<Output = Result<KeyStatus, StoreError>> + Send {
        async move { each!(self, s => s.status(key, limits, change).await) }
    }

    #[inline]
    fn hold(
        &self,
        keys: &[&str],
        limits: &[ClassLimits],
        weight: u32,
        given_id: bool,
    ) -> Option<LocalAdmission> {
        each!(self, s => s.hold(keys, limits, weight, given_id))
    }

    fn index(
        &self,
        id: &PermitId,
        op: IndexOp<'_>,
    ) -> impl Future<Output = Result<Option<Recorded>, StoreError>> + Send {
        async move { each!(self, s => s.index(id, op).await) }
    }

    fn maintain(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        async move { each!(self, s => s.maintain().await) }
    }
}

impl Wakeups for AnyStore {
    fn interest(&self, key: &str) -> Interest {
        each!(self, s => s.interest(key))
    }
}

impl BusyKeys for AnyStore {
    fn busy(
        &self,
        prefix: &str,
        limit: usize,
    ) -> impl Future<Output = Result<BusyList, StoreError>> + Send {
        async move { each!(self, s => s.busy(prefix, limit).await) }
    }
}

impl QuotaStore for AnyStore {
    fn fund(
        &self,
        key: &str,
        fund: Fund,
    ) -> impl Future<Output = Result<Balance, StoreError>> + Send {
        async move { each!(self, s => s.fund(key, fund).await) }
    }

    fn balance(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<Balance>, StoreError>> + Send {
        async move { each!(self, s => s.balance(key).await) }
    }

    fn reserve(
        &self,
        key: &str,
        id: &PermitId,
        amount: u64,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<Reserve, StoreError>> + Send {
        async move { each!(self, s => s.reserve(key, id, amount, ttl_ms).await) }
    }

    fn settle(
        &self,
        key: &str,
        id: &PermitId,
        settle: Settle,
    ) -> impl Future<Output = Result<Settlement, StoreError>> + Send {
        async move { each!(self, s => s.settle(key, id, settle).await) }
    }

    fn extend(
        &self,
        key: &str,
        id: &PermitId,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<Extension, StoreError>> + Send {
        async move { each!(self, s => s.extend(key, id, ttl_ms).await) }
    }
}
