//! [`MemoryStore`]: the embedded default and the reference implementation of [`Store`](crate::Store)
//! (`decide.rs`).
//!
//! Each key is a cell (its leases, its in-process holds, its override) behind its own lock; a decision
//! locks the cells of its keys in key order (no two decisions wait on each other in a circle), so it is
//! atomic. Permits of this process hold their cells directly and need no lease: they end only by being
//! released, which dropping them does. Leases (permits handed to someone else) run on the injected
//! [`Clock`]; expired ones are reclaimed when their key is next touched and by
//! [`Store::maintain`](crate::Store::maintain), which also forgets idle keys, so memory stays bounded.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dashmap::DashMap;

use super::account::Quotas;
use super::cell::{Cell, Slot, Time};
use super::hash::Hasher;
use super::index::Index;
use super::key::KeyState;
use crate::clock::{millis, Clock, SystemClock};
use crate::error::StoreError;
use crate::policy::ClassLimits;
use crate::store::wake::{Turn, Wakes, Wakeups};

/// How long a key with nothing in flight and no override is kept before maintenance forgets it.
const DEFAULT_IDLE_TTL: Duration = Duration::from_secs(10);
/// Maintenance sweeps the keys at most this often, however often it is called.
const SWEEP_EVERY_MS: u64 = 500;

/// Leases, holds and overrides in this process's memory. Clones share them.
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
    pub(super) inner: Arc<Inner<C>>,
}

impl<C: Clock> Clone for MemoryStore<C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<C: Clock> std::fmt::Debug for MemoryStore<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("keys", &self.inner.keys.len())
            .finish()
    }
}

pub(super) struct Inner<C> {
    pub(super) keys: DashMap<Arc<str>, Arc<Cell<C>>, Hasher>,
    pub(super) time: Arc<Time<C>>,
    pub(super) overrides: AtomicUsize,
    /// The most keys with an override (0: no bound).
    pub(super) max_overrides: AtomicUsize,
    pub(super) index: Index,
    pub(super) quotas: Quotas,
    pub(super) idle_ttl_ms: AtomicU64,
    pub(super) next_sweep_ms: AtomicU64,
    pub(super) wakes: Arc<Wakes>,
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
            last_token: AtomicU64::new(0),
            clock,
        };
        let inner = Inner {
            keys: DashMap::with_hasher(Hasher::default()),
            time: Arc::new(time),
            overrides: AtomicUsize::new(0),
            max_overrides: AtomicUsize::new(0),
            index: Index::default(),
            quotas: Quotas::default(),
            idle_ttl_ms: AtomicU64::new(millis(DEFAULT_IDLE_TTL)),
            next_sweep_ms: AtomicU64::new(0),
            wakes: Arc::new(Wakes::local_tickets()),
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// How long a key with nothing in flight and no override is kept before maintenance forgets it.
    #[must_use]
    pub fn idle_ttl(self, ttl: Duration) -> Self {
        self.inner.idle_ttl_ms.store(millis(ttl), Ordering::Relaxed);
        self
    }

    /// The most keys that may have an override at once (0, the default: no bound); setting one more is
    /// [`StoreError::TooManyOverrides`](crate::StoreError::TooManyOverrides).
    #[must_use]
    pub fn max_overrides(self, max: usize) -> Self {
        self.inner.max_overrides.store(max, Ordering::Relaxed);
        self
    }

    /// How many keys the store holds right now, idle ones included.
    pub fn key_count(&self) -> usize {
        self.inner.keys.len()
    }

    #[inline]
    pub(super) fn cell(&self, key: &str, create: bool) -> Option<Arc<Cell<C>>> {
        match create {
            true => Some(self.made_cell(key)),
            false => self.inner.keys.get(key).map(|cell| cell.clone()),
        }
    }

    /// The cell of `key`, made if it has none.
    #[inline(always)]
    pub(super) fn made_cell(&self, key: &str) -> Arc<Cell<C>> {
        if let Some(cell) = self.inner.keys.get(key) {
            return cell.clone();
        }
        let key: Arc<str> = Arc::from(key);
        let cell = self.inner.keys.entry(key.clone()).or_insert_with(|| {
            Arc::new(Cell {
                key,
                state: Mutex::new(KeyState::default()),
                time: self.inner.time.clone(),
                wakes: self.inner.wakes.clone(),
            })
        });
        cell.clone()
    }

    /// Locks the cells of `keys` (created when `create`; missing ones are left out), reclaims their
    /// expired leases, and runs `f` on them in the order of `keys`, with the time and how many leases were
    /// reclaimed. Without `precise`, a decision on keys without leases uses the last time read.
    #[inline]
    pub(super) fn locked<K: AsRef<str>, R>(
        &self,
        keys: &[K],
        create: bool,
        precise: bool,
        f: impl FnOnce(&mut [Slot<'_, C>], u64, u32) -> R,
    ) -> R {
        let time = &self.inner.time;
        let prepare = |slots: &mut [Slot<'_, C>]| self.prepare(slots, precise);
        if let [key] = keys {
            let Some(cell) = self.cell(key.as_ref(), create) else {
                return f(&mut [], time.now_ms(), 0);
            };
            let mut state = cell.lock();
            let mut slots = [Slot {
                index: 0,
                cell: &cell,
                state: &mut state,
            }];
            let (now, reclaimed) = prepare(&mut slots);
            return f(&mut slots, now, reclaimed);
        }
        let mut cells: Vec<(usize, Arc<Cell<C>>)> = keys
            .iter()
            .enumerate()
            .filter_map(|(index, key)| Some((index, self.cell(key.as_ref(), create)?)))
            .collect();
        cells.sort_by(|a, b| a.1.key.cmp(&b.1.key));
        cells.dedup_by(|a, b| a.1.key == b.1.key);
        let mut guards: Vec<_> = cells.iter().map(|(_, cell)| cell.lock()).collect();
        let mut slots: Vec<Slot<'_, C>> = cells
            .iter()
            .zip(guards.iter_mut())
            .map(|((index, cell), state)| Slot {
                index: *index,
                cell,
                state,
            })
            .collect();
        slots.sort_by_key(|slot| slot.index);
        let (now, reclaimed) = prepare(&mut slots);
        f(&mut slots, now, reclaimed)
    }

    /// Reclaims the expired leases (and tickets) of the locked `slots` and marks them used: the time (read
    /// again when `precise` or when a key has leases or tickets, else the last time read) and how many
    /// leases were reclaimed.
    #[inline]
    pub(super) fn prepare(&self, slots: &mut [Slot<'_, C>], precise: bool) -> (u64, u32) {
        let time = &self.inner.time;
        let now = if precise || slots.iter().any(|slot| slot.state.has_leases_or_tickets()) {
            time.now_ms()
        } else {
            time.coarse_ms()
        };
        let (mut reclaimed, mut expired) = (0, 0);
        for slot in slots.iter_mut() {
            reclaimed += slot.state.reclaim(now);
            expired += slot.state.expire_tickets(now);
            slot.state.last_used_ms = now;
        }
        self.inner.wakes.count_expired(i64::from(expired));
        (now, reclaimed)
    }

    /// True when none of the keys can be limited: their classes limit nothing and no key has an override.
    pub(super) fn all_unlimited(&self, limits: &[ClassLimits]) -> bool {
        limits.iter().all(ClassLimits::is_unlimited)
            && self.inner.overrides.load(Ordering::Relaxed) == 0
    }

    pub(super) fn maintain_now(&self) {
        let inner = &self.inner;
        let now = inner.time.now_ms();
        let due = inner.next_sweep_ms.load(Ordering::Relaxed);
        if now < due
            || inner
                .next_sweep_ms
                .compare_exchange(
                    due,
                    now + SWEEP_EVERY_MS,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return;
        }
        inner.index.sweep(now);
        let idle_ttl = inner.idle_ttl_ms.load(Ordering::Relaxed);
        inner.keys.retain(|_, cell| {
            // Someone between finding the cell and locking it (under this shard's write lock no one new
            // can find it): keep it, or what they do would land on a cell no longer in the map.
            if Arc::strong_count(cell) > 1 {
                return true;
            }
            let mut state = cell.lock();
            state.reclaim(now);
            inner
                .wakes
                .count_expired(i64::from(state.expire_tickets(now)));
            !state.is_idle() || now.saturating_sub(state.last_used_ms) < idle_ttl
        });
    }
}

impl<C: Clock> Wakeups for MemoryStore<C> {
    /// A ticket in the keys' queues, shared by every limiter on this store or its clones.
    fn ticket(&self) -> Option<Turn> {
        Some(self.inner.wakes.ticket())
    }

    fn tickets_expired(&self) -> u64 {
        self.inner.wakes.tickets_expired()
    }

    fn leave(
        &self,
        keys: &[Arc<str>],
        ticket: &str,
        handed: Option<&crate::id::PermitId>,
    ) -> impl std::future::Future<Output = Result<bool, StoreError>> + Send {
        let mut called = Vec::new();
        let left = self.locked(keys, false, false, |slots, _, _| {
            let mut left = false;
            for slot in slots.iter_mut() {
                let head = slot.state.leave_ticket(ticket, false);
                left |= head.is_some();
                if head == Some(true) {
                    called.extend(slot.state.called(1));
                }
            }
            left
        });
        self.inner.wakes.wake_tickets(&called);
        // No longer queued: a release may have handed it a slot it never heard of.
        if let (false, Some(id)) = (left, handed) {
            self.release_now(keys, id, 0);
        }
        std::future::ready(Ok(left))
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
        store.inner.time.clock.advance(Duration::from_secs(1));
        store.maintain_now();
        assert_eq!(store.key_count(), 0, "idle and unreferenced: forgotten");
    }
}
