//! The in-memory store: the embedded default and the reference implementation of [`Store`].
//!
//! Each key is a cell (its leases, its in-process holds, its override) behind its own lock, found through
//! a sharded map; every decision on a key runs under that lock, so it is atomic. Permits of this process
//! hold their cell directly and need no lease: they end only by being released, which dropping them does,
//! and they cannot outlive the store. Leases are for permits handed to someone else (detached, or taken
//! over HTTP): their deadlines run on the injected [`Clock`], and expired ones are reclaimed when their
//! key is next touched and by [`Store::maintain`], which also forgets keys idle for a while, so memory
//! stays bounded however many keys pass through.

mod key;

use std::future::{ready, Future};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use dashmap::DashMap;

use self::key::{Hasher, KeyState};
use super::{
    AcquireRequest, Admission, KeyStatus, LocalAdmission, LocalHold, RenewRequest, Renewal, Store,
};
use crate::clock::{millis, Clock, SystemClock};
use crate::error::StoreError;
use crate::id::PermitId;
use crate::policy::Policy;

/// How long a key with nothing in flight and no override is kept before [`Store::maintain`] forgets it.
const DEFAULT_IDLE_TTL: Duration = Duration::from_secs(10);

/// Leases, holds and overrides in this process's memory.
///
/// ```
/// use inflight::{Limiter, MemoryStore, Policy};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let limiter = Limiter::builder(MemoryStore::new()).policy(Policy::new(2, 0)).build();
/// let a = limiter.try_acquire("app-1").await.unwrap();
/// let b = limiter.try_acquire("app-1").await.unwrap();
/// assert!(limiter.try_acquire("app-1").await.unwrap_err().is_full());
/// drop(a);
/// let c = limiter.try_acquire("app-1").await.unwrap();
/// # drop((b, c));
/// # }
/// ```
pub struct MemoryStore<C: Clock = SystemClock> {
    keys: DashMap<Arc<str>, Arc<Cell<C>>, Hasher>,
    time: Arc<Time<C>>,
    overrides: AtomicUsize,
    idle_ttl_ms: u64,
}

/// The store's clock, and its last reading for the paths that need only a rough time.
struct Time<C> {
    clock: C,
    coarse_ms: AtomicU64,
}

impl<C: Clock> Time<C> {
    fn now_ms(&self) -> u64 {
        let now = self.clock.now_ms();
        self.coarse_ms.store(now, Ordering::Relaxed);
        now
    }

    fn coarse_ms(&self) -> u64 {
        self.coarse_ms.load(Ordering::Relaxed)
    }
}

/// One key: what in-process permits hold on to.
struct Cell<C> {
    key: Arc<str>,
    state: Mutex<KeyState>,
    time: Arc<Time<C>>,
}

impl<C> Cell<C> {
    fn lock(&self) -> MutexGuard<'_, KeyState> {
        // The state is consistent between statements that cannot panic, so a poisoned lock is usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<C: Clock> LocalHold for Cell<C> {
    fn key(&self) -> &str {
        &self.key
    }

    fn release(&self, weight: u32) {
        let mut state = self.lock();
        state.unhold(weight);
        state.last_used_ms = self.time.coarse_ms();
    }

    fn hand_off(&self, id: &PermitId, weight: u32, lease_ms: u64) -> u64 {
        let expires_at_ms = self.time.now_ms().saturating_add(lease_ms);
        self.lock().lease_hold(id, weight, expires_at_ms);
        expires_at_ms
    }
}

impl MemoryStore<SystemClock> {
    /// An empty store on the system clock.
    pub fn new() -> Self {
        Self::with_clock(SystemClock)
    }
}

impl Default for MemoryStore<SystemClock> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Clock> MemoryStore<C> {
    /// An empty store on `clock` (a [`crate::ManualClock`] in tests).
    pub fn with_clock(clock: C) -> Self {
        let time = Time {
            coarse_ms: AtomicU64::new(clock.now_ms()),
            clock,
        };
        Self {
            keys: DashMap::with_hasher(Hasher::default()),
            time: Arc::new(time),
            overrides: AtomicUsize::new(0),
            idle_ttl_ms: millis(DEFAULT_IDLE_TTL),
        }
    }

    /// How long a key with nothing in flight and no override is kept before maintenance forgets it.
    #[must_use]
    pub fn idle_ttl(mut self, ttl: Duration) -> Self {
        self.idle_ttl_ms = millis(ttl);
        self
    }

    /// How many keys the store holds right now, idle ones included.
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    fn cell(&self, key: &str, create: bool) -> Option<Arc<Cell<C>>> {
        if let Some(cell) = self.keys.get(key) {
            return Some(cell.clone());
        }
        if !create {
            return None;
        }
        let key: Arc<str> = Arc::from(key);
        let cell = self.keys.entry(key.clone()).or_insert_with(|| {
            Arc::new(Cell {
                key,
                state: Mutex::new(KeyState::default()),
                time: self.time.clone(),
            })
        });
        Some(cell.clone())
    }

    /// Runs `f` on the state of `key` (created when `create` and missing) after reclaiming its expired
    /// leases; `f` gets the time and how many leases were reclaimed.
    fn with_key<R>(
        &self,
        key: &str,
        create: bool,
        f: impl FnOnce(&mut KeyState, u64, u32) -> R,
    ) -> Option<R> {
        let cell = self.cell(key, create)?;
        let now = self.time.now_ms();
        let mut state = cell.lock();
        let reclaimed = state.reclaim(now);
        state.last_used_ms = now;
        Some(f(&mut state, now, reclaimed))
    }

    fn empty_status(policy: Policy) -> KeyStatus {
        KeyStatus {
            limit: policy.resolve(None),
            override_limit: None,
            in_flight: 0,
        }
    }

    fn acquire_now(&self, req: AcquireRequest<'_>) -> Admission {
        if req.policy.is_unlimited_by_default() && !self.may_have_override(req.key) {
            return Admission::Unlimited;
        }
        self.with_key(req.key, true, |state, now, reclaimed| {
            state.acquire(&req, now, reclaimed)
        })
        .unwrap_or(Admission::Unlimited)
    }

    fn set_limit_now(&self, key: &str, limit: Option<u32>, policy: Policy) -> KeyStatus {
        let limit = limit.filter(|n| *n > 0);
        self.with_key(key, limit.is_some(), |state, _, _| {
            match (state.override_limit.is_some(), limit.is_some()) {
                (false, true) => {
                    self.overrides.fetch_add(1, Ordering::SeqCst);
                }
                (true, false) => {
                    self.overrides.fetch_sub(1, Ordering::SeqCst);
                }
                _ => {}
            }
            state.override_limit = limit;
            state.status(policy)
        })
        .unwrap_or_else(|| Self::empty_status(policy))
    }

    /// Whether a live lease was released: an expired one is already gone.
    fn release_sync(&self, key: &str, id: &PermitId) -> bool {
        self.with_key(key, false, |state, _, _| state.release(id))
            .unwrap_or(false)
    }

    fn maintain_now(&self) {
        let now = self.time.now_ms();
        let idle_ttl = self.idle_ttl_ms;
        self.keys.retain(|_, cell| {
            // Someone between finding the cell and locking it (under this shard's write lock no one new
            // can find it): keep it, or what they do would land on a cell no longer in the map.
            if Arc::strong_count(cell) > 1 {
                return true;
            }
            let mut state = cell.lock();
            state.reclaim(now);
            !state.is_idle() || now.saturating_sub(state.last_used_ms) < idle_ttl
        });
    }
}

impl<C: Clock> Store for MemoryStore<C> {
    fn acquire(
        &self,
        req: AcquireRequest<'_>,
    ) -> impl Future<Output = Result<Admission, StoreError>> + Send {
        ready(Ok(self.acquire_now(req)))
    }

    fn release(
        &self,
        key: &str,
        id: &PermitId,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        ready(Ok(self.release_sync(key, id)))
    }

    fn renew(
        &self,
        batch: &[RenewRequest],
    ) -> impl Future<Output = Result<Vec<Renewal>, StoreError>> + Send {
        let outcomes = batch
            .iter()
            .map(|req| {
                let create = req.readd_weight.is_some();
                self.with_key(&req.key, create, |state, now, _| state.renew(req, now))
                    .unwrap_or(Renewal::Lost)
            })
            .collect();
        ready(Ok(outcomes))
    }

    fn status(
        &self,
        key: &str,
        policy: Policy,
    ) -> impl Future<Output = Result<KeyStatus, StoreError>> + Send {
        let status = self
            .with_key(key, false, |state, _, _| state.status(policy))
            .unwrap_or_else(|| Self::empty_status(policy));
        ready(Ok(status))
    }

    fn set_limit(
        &self,
        key: &str,
        limit: Option<u32>,
        policy: Policy,
    ) -> impl Future<Output = Result<KeyStatus, StoreError>> + Send {
        ready(Ok(self.set_limit_now(key, limit, policy)))
    }

    fn acquire_local(&self, key: &str, weight: u32, policy: Policy) -> Option<LocalAdmission> {
        if policy.is_unlimited_by_default() && !self.may_have_override(key) {
            return Some(LocalAdmission::Decided(Admission::Unlimited));
        }
        let cell = self.cell(key, true)?;
        let decision = {
            let mut state = cell.lock();
            // Only keys with leases need the clock.
            let reclaimed = if state.has_leases() {
                state.reclaim(self.time.now_ms())
            } else {
                0
            };
            state.last_used_ms = self.time.coarse_ms();
            state.hold(weight, policy, reclaimed)
        };
        Some(match decision {
            Admission::Admitted { grant, reclaimed } => LocalAdmission::Held {
                hold: cell,
                grant,
                reclaimed,
            },
            other => LocalAdmission::Decided(other),
        })
    }

    fn release_now(&self, key: &str, id: &PermitId) -> Option<Result<bool, StoreError>> {
        Some(Ok(self.release_sync(key, id)))
    }

    fn may_have_override(&self, _key: &str) -> bool {
        self.overrides.load(Ordering::Relaxed) > 0
    }

    fn maintain(&self) -> impl Future<Output = ()> + Send {
        self.maintain_now();
        ready(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ManualClock;

    #[test]
    fn maintenance_keeps_a_cell_someone_is_about_to_use() {
        let store = MemoryStore::with_clock(ManualClock::new(0)).idle_ttl(Duration::ZERO);
        // Found (as an admission finds it) but not yet locked: idle, yet about to be used.
        let cell = store.cell("k", true).expect("created");
        store.maintain_now();
        assert_eq!(
            store.key_count(),
            1,
            "removing it would orphan what the admission does next"
        );
        drop(cell);
        store.maintain_now();
        assert_eq!(store.key_count(), 0, "idle and unreferenced: forgotten");
    }
}
