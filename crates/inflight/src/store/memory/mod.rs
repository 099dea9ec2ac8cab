//! The in-memory store: the embedded default and the reference implementation of [`Store`].
//!
//! Each key is a cell (its leases, its in-process holds, its override) behind its own lock, found through
//! a sharded map; a decision locks the cells of its keys (in key order, so that no two decisions wait on
//! each other in a circle), so it is atomic. Permits of this process hold their cells directly and need
//! no lease: they end only by being released, which dropping them does. Leases are for permits handed to
//! someone else (detached, or taken over HTTP): their deadlines run on the injected [`Clock`], and expired
//! ones are reclaimed when their key is next touched and by [`Store::maintain`], which also forgets keys
//! idle for a while, so memory stays bounded however many keys pass through.

mod busy;
mod cell;
mod index;
mod key;
mod quota;

use std::future::{ready, Future};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dashmap::DashMap;

use self::cell::{admit, grant, Cell, Cells, Slot, Time};
use self::key::{Hasher, KeyState, Lease};
use super::wake::{Interest, Wakes, Wakeups};
use super::{
    AcquireRequest, Admission, IndexOp, KeyStatus, LocalAdmission, LocalHold, OverrideChange,
    Recorded, RenewRequest, Renewal, Store,
};
use crate::clock::{millis, Clock, SystemClock};
use crate::error::StoreError;
use crate::id::PermitId;
use crate::options::DEFAULT_LEASE;
use crate::policy::{ClassLimits, Limit};

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
    inner: Arc<Inner<C>>,
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

struct Inner<C> {
    keys: DashMap<Arc<str>, Arc<Cell<C>>, Hasher>,
    time: Arc<Time<C>>,
    overrides: AtomicUsize,
    /// The most keys with an override (0: no bound).
    max_overrides: AtomicUsize,
    index: index::Index,
    quotas: quota::Quotas,
    idle_ttl_ms: AtomicU64,
    next_sweep_ms: AtomicU64,
    wakes: Arc<Wakes>,
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
        let inner = Inner {
            keys: DashMap::with_hasher(Hasher::default()),
            time: Arc::new(time),
            overrides: AtomicUsize::new(0),
            max_overrides: AtomicUsize::new(0),
            index: index::Index::default(),
            quotas: quota::Quotas::default(),
            idle_ttl_ms: AtomicU64::new(millis(DEFAULT_IDLE_TTL)),
            next_sweep_ms: AtomicU64::new(0),
            wakes: Arc::default(),
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
    /// [`StoreError::TooManyOverrides`].
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
    fn cell(&self, key: &str, create: bool) -> Option<Arc<Cell<C>>> {
        if let Some(cell) = self.inner.keys.get(key) {
            return Some(cell.clone());
        }
        if !create {
            return None;
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
        Some(cell.clone())
    }

    /// Locks the cells of `keys` (created when `create`; missing ones are left out), reclaims their
    /// expired leases, and runs `f` on them in the order of `keys`, with the time and how many leases were
    /// reclaimed. Without `precise`, a decision on keys without leases uses the last time read.
    #[inline]
    fn locked<K: AsRef<str>, R>(
        &self,
        keys: &[K],
        create: bool,
        precise: bool,
        f: impl FnOnce(&mut [Slot<'_, C>], u64, u32) -> R,
    ) -> R {
        let time = &self.inner.time;
        let prepare = |slots: &mut [Slot<'_, C>]| {
            let now = if precise || slots.iter().any(|slot| slot.state.has_leases()) {
                time.now_ms()
            } else {
                time.coarse_ms()
            };
            let mut reclaimed = 0;
            for slot in slots.iter_mut() {
                reclaimed += slot.state.reclaim(now);
                slot.state.last_used_ms = now;
            }
            (now, reclaimed)
        };
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

    /// True when none of the keys can be limited: their classes limit nothing and no key has an override.
    fn all_unlimited(&self, limits: &[ClassLimits]) -> bool {
        limits.iter().all(ClassLimits::is_unlimited)
            && self.inner.overrides.load(Ordering::Relaxed) == 0
    }

    fn acquire_now(&self, req: AcquireRequest<'_>) -> Admission {
        if self.all_unlimited(req.limits) {
            return Admission::Unlimited;
        }
        self.locked(req.keys, true, true, |slots, now, reclaimed| {
            let first = match admit(slots, req.limits, Some(req.id), req.weight, reclaimed) {
                Ok(first) => first,
                Err(refused) => return refused,
            };
            let lease = Lease {
                weight: req.weight,
                expires_at_ms: now.saturating_add(req.lease_ms),
                lease_ms: req.lease_ms,
            };
            for slot in slots.iter_mut() {
                if slot.state.limit(req.limits[slot.index]) != Limit::Unlimited {
                    slot.state.add(req.id, lease);
                }
            }
            Admission::Admitted {
                grant: grant(slots, first, req.weight, lease.expires_at_ms),
                reclaimed,
            }
        })
    }

    fn renew_one(&self, req: &RenewRequest) -> Renewal {
        self.locked(&req.keys, true, true, |slots, now, _| {
            let limits = |slot: &Slot<'_, C>| req.limits[slot.index];
            let limited = |slot: &Slot<'_, C>| slot.state.limit(limits(slot)) != Limit::Unlimited;
            let found = slots.iter().find_map(|slot| slot.state.lease(&req.id));
            let missing = slots
                .iter()
                .any(|slot| limited(slot) && slot.state.lease(&req.id).is_none());
            let lease_ms = req
                .lease_ms
                .or(found.map(|lease| lease.lease_ms))
                .unwrap_or(millis(DEFAULT_LEASE));
            let mut weight = found.map_or(1, |lease| lease.weight);
            // Held on no key: gone, unless asked to re-add it and every limited key has room. Held, but
            // not on a key that has become limited since: taken there where it fits (below).
            let readded = match (found.is_some(), missing, req.readd_weight) {
                (_, false, _) | (true, true, _) => false,
                (false, true, None) => return Renewal::Lost,
                (false, true, Some(readd)) => {
                    let room = slots.iter().all(|slot| {
                        slot.state.lease(&req.id).is_some()
                            || slot.state.check(limits(slot), None, readd).is_ok()
                    });
                    if !room {
                        return Renewal::Lost;
                    }
                    weight = readd;
                    true
                }
            };
            let expires_at_ms = now.saturating_add(lease_ms);
            for slot in slots.iter_mut() {
                if slot.state.extend(&req.id, now, Some(lease_ms)).is_none()
                    && limited(slot)
                    && (readded || slot.state.check(limits(slot), None, weight).is_ok())
                {
                    let lease = Lease {
                        weight,
                        expires_at_ms,
                        lease_ms,
                    };
                    slot.state.add(&req.id, lease);
                }
            }
            let first = slots.first().map_or(req.limits[0].resolve(None), |slot| {
                slot.state.limit(limits(slot))
            });
            let grant = grant(slots, first, weight, expires_at_ms);
            if readded {
                Renewal::Readded(grant)
            } else {
                Renewal::Renewed(grant)
            }
        })
    }

    fn status_now(
        &self,
        key: &str,
        limits: ClassLimits,
        change: OverrideChange,
    ) -> Result<KeyStatus, StoreError> {
        let limit = match change {
            OverrideChange::Keep => None,
            OverrideChange::Set(n) => Some(Some(n)),
            OverrideChange::Clear => Some(None),
        };
        let create = matches!(limit, Some(Some(1..)));
        self.locked(&[key], create, false, |slots, _, _| {
            let Some(slot) = slots.first_mut() else {
                return Ok(KeyStatus {
                    limit: limits.resolve(None),
                    override_limit: None,
                    in_flight: 0,
                });
            };
            if let Some(limit) = limit {
                let limit = limit.filter(|n| *n > 0);
                match (slot.state.override_limit.is_some(), limit.is_some()) {
                    (false, true) => {
                        let max = self.inner.max_overrides.load(Ordering::Relaxed);
                        let counted = self.inner.overrides.fetch_update(
                            Ordering::SeqCst,
                            Ordering::SeqCst,
                            |n| (max == 0 || n < max).then_some(n + 1),
                        );
                        if counted.is_err() {
                            return Err(StoreError::TooManyOverrides { max });
                        }
                    }
                    (true, false) => drop(self.inner.overrides.fetch_sub(1, Ordering::SeqCst)),
                    _ => {}
                }
                slot.state.override_limit = limit;
            }
            Ok(slot.state.status(limits))
        })
    }

    fn maintain_now(&self) {
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
        keys: &[Arc<str>],
        id: &PermitId,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let released = self.locked(keys, false, false, |slots, _, _| {
            let mut released = false;
            for slot in slots.iter_mut() {
                released |= slot.state.release(id);
            }
            released
        });
        if released {
            keys.iter().for_each(|key| self.inner.wakes.wake(key));
        }
        ready(Ok(released))
    }

    fn renew(
        &self,
        batch: &[RenewRequest],
    ) -> impl Future<Output = Result<Vec<Renewal>, StoreError>> + Send {
        ready(Ok(batch.iter().map(|req| self.renew_one(req)).collect()))
    }

    fn status(
        &self,
        key: &str,
        limits: ClassLimits,
        change: OverrideChange,
    ) -> impl Future<Output = Result<KeyStatus, StoreError>> + Send {
        ready(self.status_now(key, limits, change))
    }

    #[inline]
    fn hold(
        &self,
        keys: &[&str],
        limits: &[ClassLimits],
        weight: u32,
        given_id: bool,
    ) -> Option<LocalAdmission> {
        if self.all_unlimited(limits) {
            return Some(LocalAdmission::Decided(Admission::Unlimited));
        }
        if given_id {
            return None;
        }
        Some(self.locked(keys, true, false, |slots, _, reclaimed| {
            let first = match admit(slots, limits, None, weight, reclaimed) {
                Ok(first) => first,
                Err(refused) => return LocalAdmission::Decided(refused),
            };
            let hold: Arc<dyn LocalHold> = if let [slot] = slots {
                // One key (limited, or `admit` would have said unlimited): the permit holds its cell.
                slot.state.in_flight += weight;
                slot.cell.clone()
            } else {
                let mut cells = Vec::with_capacity(slots.len());
                for slot in slots.iter_mut() {
                    if slot.state.limit(limits[slot.index]) != Limit::Unlimited {
                        slot.state.in_flight += weight;
                        cells.push(slot.cell.clone());
                    }
                }
                let (first, time) = (slots[0].cell.key.clone(), self.inner.time.clone());
                Arc::new(Cells { first, cells, time })
            };
            LocalAdmission::Held {
                hold,
                grant: grant(slots, first, weight, 0),
                reclaimed,
            }
        }))
    }

    fn index(
        &self,
        id: &PermitId,
        op: IndexOp<'_>,
    ) -> impl Future<Output = Result<Option<Recorded>, StoreError>> + Send {
        ready(self.inner.index.apply(id, op, self.inner.time.now_ms()))
    }

    fn maintain(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.maintain_now();
        ready(Ok(()))
    }
}

impl<C: Clock> Wakeups for MemoryStore<C> {
    /// Woken by every slot given back through this store or its clones.
    fn interest(&self, key: &str) -> Interest {
        self.inner.wakes.interest(key)
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
