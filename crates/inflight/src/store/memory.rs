//! The in-memory store: the embedded default and the reference implementation of [`Store`].
//!
//! Keys live in a sharded map; each key holds its leases (id -> weight, deadline) and its override. Every
//! operation on a key runs under that key's shard lock, so each decision is atomic. Expired leases are
//! reclaimed when their key is next touched and by [`Store::maintain`], which also forgets keys that have
//! been idle (no lease, no override) for a while, so memory stays bounded however many keys pass through.

use std::collections::HashMap;
use std::future::{ready, Future};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dashmap::DashMap;

use super::{AcquireRequest, Admission, Grant, KeyStatus, RenewRequest, Renewal, Store};
use crate::clock::{millis, Clock, SystemClock};
use crate::error::StoreError;
use crate::id::PermitId;
use crate::policy::{Limit, Policy};

/// How long a key with no lease and no override is kept before [`Store::maintain`] forgets it.
const DEFAULT_IDLE_TTL: Duration = Duration::from_secs(10);

/// Leases and overrides in this process's memory.
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
    keys: DashMap<Box<str>, KeyState>,
    overrides: AtomicUsize,
    clock: C,
    idle_ttl_ms: u64,
}

#[derive(Default)]
struct KeyState {
    leases: HashMap<PermitId, Lease>,
    in_flight: u32,
    override_limit: Option<u32>,
    /// No lease ends before this (a lower bound): reclaiming can be skipped until then.
    next_expiry_ms: u64,
    last_used_ms: u64,
}

#[derive(Clone, Copy)]
struct Lease {
    weight: u32,
    expires_at_ms: u64,
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
        Self {
            keys: DashMap::new(),
            overrides: AtomicUsize::new(0),
            clock,
            idle_ttl_ms: millis(DEFAULT_IDLE_TTL),
        }
    }

    /// How long an idle key (no lease, no override) is kept before maintenance forgets it.
    #[must_use]
    pub fn idle_ttl(mut self, ttl: Duration) -> Self {
        self.idle_ttl_ms = millis(ttl);
        self
    }

    /// How many keys the store holds right now, idle ones included.
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// Runs `f` on the state of `key`, creating it when `create` and it is missing.
    /// The callback gets the state (its expired leases already reclaimed), the time, and how many leases
    /// were reclaimed.
    fn with_key<R>(
        &self,
        key: &str,
        create: bool,
        f: impl FnOnce(&mut KeyState, u64, u32) -> R,
    ) -> Option<R> {
        let now = self.clock.now_ms();
        let mut state = match self.keys.get_mut(key) {
            Some(state) => state,
            None if create => self.keys.entry(Box::from(key)).or_default(),
            None => return None,
        };
        let reclaimed = state.reclaim(now);
        state.last_used_ms = now;
        Some(f(&mut state, now, reclaimed))
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

    fn renew_now(&self, req: &RenewRequest) -> Renewal {
        let create = req.readd_weight.is_some();
        self.with_key(&req.key, create, |state, now, _| state.renew(req, now))
            .unwrap_or(Renewal::Lost)
    }

    fn status_now(&self, key: &str, policy: Policy) -> KeyStatus {
        self.with_key(key, false, |state, _, _| state.status(policy))
            .unwrap_or(KeyStatus {
                limit: policy.resolve(None),
                override_limit: None,
                in_flight: 0,
            })
    }

    fn release_sync(&self, key: &str, id: &PermitId) -> bool {
        self.with_key(key, false, |state, _, _| state.release(id))
            .unwrap_or(false)
    }

    fn set_limit_now(&self, key: &str, limit: Option<u32>, policy: Policy) -> KeyStatus {
        let limit = limit.filter(|n| *n > 0);
        let create = limit.is_some();
        self.with_key(key, create, |state, _, _| {
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
        .unwrap_or(KeyStatus {
            limit: policy.resolve(None),
            override_limit: None,
            in_flight: 0,
        })
    }

    fn maintain_now(&self) {
        let now = self.clock.now_ms();
        let idle_ttl = self.idle_ttl_ms;
        self.keys.retain(|_, state| {
            state.reclaim(now);
            !state.leases.is_empty()
                || state.override_limit.is_some()
                || now.saturating_sub(state.last_used_ms) < idle_ttl
        });
    }
}

impl KeyState {
    /// Drops leases whose deadline has passed; returns how many.
    fn reclaim(&mut self, now: u64) -> u32 {
        if now < self.next_expiry_ms || self.leases.is_empty() {
            return 0;
        }
        let mut reclaimed = 0;
        let mut next = u64::MAX;
        let in_flight = &mut self.in_flight;
        self.leases.retain(|_, lease| {
            if lease.expires_at_ms <= now {
                *in_flight -= lease.weight;
                reclaimed += 1;
                false
            } else {
                next = next.min(lease.expires_at_ms);
                true
            }
        });
        self.next_expiry_ms = next;
        reclaimed
    }

    fn grant(&self, limit: Limit, lease: Lease) -> Grant {
        Grant {
            limit,
            in_flight: self.in_flight,
            weight: lease.weight,
            expires_at_ms: lease.expires_at_ms,
        }
    }

    fn add(&mut self, id: &PermitId, lease: Lease) {
        self.in_flight += lease.weight;
        self.next_expiry_ms = self.next_expiry_ms.min(lease.expires_at_ms);
        if let Some(old) = self.leases.insert(id.clone(), lease) {
            self.in_flight -= old.weight;
        }
    }

    fn acquire(&mut self, req: &AcquireRequest<'_>, now: u64, reclaimed: u32) -> Admission {
        let limit = req.policy.resolve(self.override_limit);
        let Limit::Limited(max) = limit else {
            return Admission::Unlimited;
        };
        if req.weight > max {
            return Admission::TooHeavy { limit: max };
        }
        let held = self.leases.get(req.id).map_or(0, |l| l.weight);
        // A retried acquisition of a held id never needs more room than it already has.
        if req.weight > held && self.in_flight - held + req.weight > max {
            return Admission::Full {
                limit: max,
                in_flight: self.in_flight,
                reclaimed,
            };
        }
        let lease = Lease {
            weight: req.weight,
            expires_at_ms: now.saturating_add(req.lease_ms),
        };
        self.add(req.id, lease);
        Admission::Admitted {
            grant: self.grant(limit, lease),
            reclaimed,
        }
    }

    fn renew(&mut self, req: &RenewRequest, now: u64) -> Renewal {
        let expires_at_ms = now.saturating_add(req.lease_ms);
        let limit = req.policy.resolve(self.override_limit);
        if let Some(lease) = self.leases.get_mut(&req.id) {
            lease.expires_at_ms = expires_at_ms;
            let lease = *lease;
            // A renewal may shorten the lease: keep the bound a lower bound.
            self.next_expiry_ms = self.next_expiry_ms.min(expires_at_ms);
            return Renewal::Renewed(self.grant(limit, lease));
        }
        let Some(weight) = req.readd_weight else {
            return Renewal::Lost;
        };
        let lease = Lease {
            weight,
            expires_at_ms,
        };
        match limit {
            Limit::Unlimited => Renewal::Readded(self.grant(limit, lease)),
            Limit::Limited(max) if self.in_flight + weight <= max => {
                self.add(&req.id, lease);
                Renewal::Readded(self.grant(limit, lease))
            }
            Limit::Limited(_) => Renewal::Lost,
        }
    }

    fn release(&mut self, id: &PermitId) -> bool {
        match self.leases.remove(id) {
            Some(lease) => {
                self.in_flight -= lease.weight;
                true
            }
            None => false,
        }
    }

    fn status(&self, policy: Policy) -> KeyStatus {
        KeyStatus {
            limit: policy.resolve(self.override_limit),
            override_limit: self.override_limit,
            in_flight: self.in_flight,
        }
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
        ready(Ok(batch.iter().map(|r| self.renew_now(r)).collect()))
    }

    fn status(
        &self,
        key: &str,
        policy: Policy,
    ) -> impl Future<Output = Result<KeyStatus, StoreError>> + Send {
        ready(Ok(self.status_now(key, policy)))
    }

    fn set_limit(
        &self,
        key: &str,
        limit: Option<u32>,
        policy: Policy,
    ) -> impl Future<Output = Result<KeyStatus, StoreError>> + Send {
        ready(Ok(self.set_limit_now(key, limit, policy)))
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
