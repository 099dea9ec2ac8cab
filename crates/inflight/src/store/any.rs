//! [`AnyStore`]: the store chosen at start-up, as one type, so that the code above it (a server, say)
//! names no store type. Each method is the variant's own ([`Store::hold`] included). Library users with
//! a store of their own keep [`crate::Limiter`]`<S>` for it.

use std::sync::Arc;

use super::busy::{BusyKeys, BusyList};
use super::holders::{Holders, PermitPage};
use super::wake::{Turn, Wakeups};
use super::{
    AcquireRequest, Admission, IndexOp, KeyStatus, LocalAdmission, MemoryStore, OverrideChange,
    Recorded, RenewRequest, Renewal, Store,
};
use crate::error::StoreError;
use crate::id::PermitId;
use crate::policy::ClassLimits;
use crate::quota::{
    Balance, Extension, Fund, Funding, IdempotencyKey, QuotaStore, Reserve, Settle, Settlement,
};

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
    /// Redis in Dify's own keys, shared with Dify's workers.
    #[cfg(feature = "redis")]
    Dify(super::DifyStore),
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

#[cfg(feature = "redis")]
impl From<super::DifyStore> for AnyStore {
    fn from(store: super::DifyStore) -> Self {
        Self::Dify(store)
    }
}

impl AnyStore {
    /// Redis's own CPU time so far, summed over every primary
    /// ([`RedisStore::redis_cpu_time`](super::RedisStore::redis_cpu_time)); `None` for the memory store.
    pub async fn redis_cpu_time(&self) -> Option<Result<std::time::Duration, StoreError>> {
        match self {
            AnyStore::Memory(_) => None,
            #[cfg(feature = "redis")]
            AnyStore::Redis(store) => Some(store.redis_cpu_time().await),
            #[cfg(feature = "redis")]
            AnyStore::Dify(store) => Some(store.redis_cpu_time().await),
        }
    }
}

/// Calls `$call` on whichever store `$any` is, as `$store`.
macro_rules! each {
    ($any:expr, $store:ident => $call:expr) => {
        match $any {
            AnyStore::Memory($store) => $call,
            #[cfg(feature = "redis")]
            AnyStore::Redis($store) => $call,
            #[cfg(feature = "redis")]
            AnyStore::Dify($store) => $call,
        }
    };
}

/// Forwards each `async fn` listed to whichever store `self` is (a Dify store `d`, to `target`). A Redis
/// store's future is boxed: it is large, and every future holding it would be as large, memory's too.
macro_rules! forward {
    ($d:ident => $dify:expr; $(async fn $name:ident(&self $(, $arg:ident: $ty:ty)*) -> $ret:ty;)*) => {$(
        async fn $name(&self $(, $arg: $ty)*) -> $ret {
            match self {
                AnyStore::Memory(s) => s.$name($($arg),*).await,
                #[cfg(feature = "redis")]
                AnyStore::Redis(s) => Box::pin(s.$name($($arg),*)).await,
                #[cfg(feature = "redis")]
                AnyStore::Dify($d) => Box::pin($dify.$name($($arg),*)).await,
            }
        }
    )*};
}

impl Store for AnyStore {
    forward! { d => d;
        async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Admission, StoreError>;
        async fn release(&self, keys: &[Arc<str>], id: &PermitId, token: u64) -> Result<bool, StoreError>;
        async fn renew(&self, batch: &[RenewRequest]) -> Result<Vec<Renewal>, StoreError>;
        async fn status(&self, key: &str, limits: ClassLimits, change: OverrideChange)
            -> Result<KeyStatus, StoreError>;
        async fn index(&self, id: &PermitId, op: IndexOp<'_>) -> Result<Option<Recorded>, StoreError>;
        async fn maintain(&self) -> Result<(), StoreError>;
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
}

impl Wakeups for AnyStore {
    fn ticket(&self) -> Option<Turn> {
        each!(self, s => s.ticket())
    }

    fn tickets_expired(&self) -> u64 {
        each!(self, s => s.tickets_expired())
    }

    forward! { d => d;
        async fn leave(&self, keys: &[Arc<str>], ticket: &str, handed: Option<&PermitId>) -> Result<bool, StoreError>;
    }
}

impl BusyKeys for AnyStore {
    forward! { d => d;
        async fn busy(&self, prefix: &str, limit: usize) -> Result<BusyList, StoreError>;
    }
}

impl Holders for AnyStore {
    forward! { d => d;
        async fn permits(&self, key: &str, cursor: Option<&str>) -> Result<PermitPage, StoreError>;
        async fn revoke(&self, key: &str, id: &PermitId) -> Result<bool, StoreError>;
        async fn revoke_waiter(&self, key: &str, ticket: &str) -> Result<bool, StoreError>;
    }
}

impl QuotaStore for AnyStore {
    forward! { d => d.plain;
        async fn fund(&self, key: &str, fund: Fund, idempotency: &IdempotencyKey)
            -> Result<Funding, StoreError>;
        async fn balance(&self, key: &str) -> Result<Option<Balance>, StoreError>;
        async fn reserve(&self, key: &str, id: &PermitId, amount: u64, ttl_ms: u64)
            -> Result<Reserve, StoreError>;
        async fn settle(&self, key: &str, id: &PermitId, settle: Settle)
            -> Result<Settlement, StoreError>;
        async fn extend(&self, key: &str, id: &PermitId, ttl_ms: u64) -> Result<Extension, StoreError>;
    }
}
