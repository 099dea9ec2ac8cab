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
    /// Those waiters by priority level and flow, the largest groups first (at most 16 groups).
    pub queued: Vec<Queued>,
}

/// This limiter's waiters on a key at one priority level in one flow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Queued {
    /// The level.
    pub priority: u8,
    /// The flow (`None`: the flow of waiters that name none).
    pub flow: Option<Arc<str>>,
    /// How many wait.
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
                queued: self
                    .core
                    .waiters
                    .groups(&busy.key)
                    .into_iter()
                    .map(|(priority, flow, waiters)| Queued {
                        priority,
                        flow,
                        waiters,
                    })
                    .collect(),
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
