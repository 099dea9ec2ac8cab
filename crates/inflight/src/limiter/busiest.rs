//! [`Limiter::busy`]: the store's busy keys with their effective limits under this limiter's policy and
//! this limiter's waiters on them.

use std::sync::Arc;

use super::Limiter;
use crate::error::StoreError;
use crate::policy::Limit;
use crate::store::BusyKeys;

/// A key with permits in flight, as [`Limiter::busy`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Busy {
    /// The key.
    pub key: Arc<str>,
    /// Its effective limit: its class's under this limiter's policy, with its override.
    pub limit: Limit,
    /// How many (by weight) are in flight, under unexpired leases (every process sharing the store).
    pub in_flight: u32,
    /// How many admissions of this limiter (not of other processes) wait on the key now ([`Limiter::acquire`]).
    pub waiters: usize,
}

/// What [`Limiter::busy`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Busiest {
    /// Busiest first.
    pub keys: Vec<Busy>,
    /// True when there may be more busy keys than listed (see [`crate::store::BusyList`]).
    pub truncated: bool,
}

impl<S: BusyKeys> Limiter<S> {
    /// The keys starting with `prefix` that have permits in flight, busiest first, at most `limit`
    /// (at most [`crate::store::MAX_BUSY`]), found with bounded work ([`BusyKeys::busy`]).
    ///
    /// ```
    /// use inflight::{Limit, Limiter, MemoryStore, Policy};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let limiter = Limiter::builder(MemoryStore::new()).policy(Policy::new(4, 0)).build();
    /// let _held = limiter.try_acquire("app-1").await.unwrap();
    /// let busy = limiter.busy("app-", 10).await.unwrap();
    /// assert_eq!(&*busy.keys[0].key, "app-1");
    /// assert_eq!((busy.keys[0].in_flight, busy.keys[0].limit), (1, Limit::Limited(4)));
    /// # }
    /// ```
    pub async fn busy(&self, prefix: &str, limit: usize) -> Result<Busiest, StoreError> {
        let list = self.core.store.busy(prefix, limit).await?;
        let policy = self.core.policy.get();
        let keys = list
            .keys
            .into_iter()
            .map(|busy| Busy {
                limit: policy.resolve(&busy.key, busy.override_limit),
                waiters: self.core.waiters.on(&busy.key),
                in_flight: busy.in_flight,
                key: busy.key,
            })
            .collect();
        Ok(Busiest {
            keys,
            truncated: list.truncated,
        })
    }
}
