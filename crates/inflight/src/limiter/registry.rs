//! [`Registry`]: what the renewal task renews: the leases of live permits, one per keys and id, and the
//! reservations held in this process.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::StoreError;
use crate::id::PermitId;
use crate::permit::{BoxFuture, PermitState};
use crate::store::Keys;

/// How often, at most, the renewal task sleeps between passes.
pub(super) const MAX_TICK: Duration = Duration::from_secs(1);

/// The leases this limiter renews, one per keys and id (permits of this process with the same keys and
/// id share one).
pub(super) struct Registry {
    permits: DashMap<(Keys, PermitId), Arc<PermitState>, foldhash::fast::RandomState>,
    /// The reservations kept open, by the number [`Registry::keep`] gave them.
    pub(super) kept: DashMap<u64, Arc<Kept>, foldhash::fast::RandomState>,
    next_kept: AtomicU64,
    /// The limiter clock as of the task's last pass: what admissions read to schedule renewals, so the
    /// hot path reads no clock. Stale by at most a tick, which only makes a renewal early.
    pub(super) coarse_now_ms: AtomicU64,
    /// The shortest lease (or reservation ttl) seen: the task wakes at a third of it.
    min_lease_ms: AtomicU64,
    /// Told when a shorter one arrives, so that the task does not sleep through its first renewal.
    pub(super) shorter: Arc<Notify>,
    epoch: Instant,
}

impl Registry {
    pub(super) fn new(default_lease_ms: u64) -> Self {
        Self {
            permits: DashMap::with_hasher(foldhash::fast::RandomState::default()),
            kept: DashMap::with_hasher(foldhash::fast::RandomState::default()),
            next_kept: AtomicU64::new(0),
            coarse_now_ms: AtomicU64::new(0),
            min_lease_ms: AtomicU64::new(default_lease_ms),
            shorter: Arc::default(),
            epoch: Instant::now(),
        }
    }

    /// Milliseconds on the limiter's monotonic clock (tokio's, so paused-time tests move it).
    pub(super) fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// When a lease of `lease_ms` renewed now should be renewed next: a third of the way through.
    pub(super) fn renew_at(&self, lease_ms: u64) -> u64 {
        self.coarse_now_ms
            .load(Ordering::Relaxed)
            .saturating_add((lease_ms / 3).max(1))
    }

    /// One more holder of the lease of `keys` and `id`, if this limiter holds it.
    pub(super) fn join(&self, keys: &Keys, id: &PermitId) -> Option<Arc<PermitState>> {
        let held = self.permits.get(&slot(keys, id))?;
        held.join().then(|| held.clone())
    }

    /// True when a permit of this process other than `state` holds the lease of its keys and id.
    pub(super) fn holds_other(&self, state: &Arc<PermitState>) -> bool {
        let held = self.permits.get(&slot(&state.keys, &state.id));
        held.is_some_and(|held| !Arc::ptr_eq(&held, state))
    }

    /// Renews `state` from now on; when a permit of this process already holds the same lease, that one
    /// is joined instead and returned.
    pub(super) fn insert(&self, state: Arc<PermitState>) -> Arc<PermitState> {
        self.shortest(state.lease_ms);
        match self.permits.entry(slot(&state.keys, &state.id)) {
            Entry::Occupied(held) if held.get().join() => held.get().clone(),
            Entry::Occupied(mut gone) => {
                gone.insert(state.clone());
                state
            }
            Entry::Vacant(vacant) => vacant.insert(state).clone(),
        }
    }

    /// Stops renewing `state`: no permit of this process holds it any more.
    pub(super) fn remove(&self, state: &Arc<PermitState>) {
        state.released.store(true, Ordering::Release);
        self.forget(state);
    }

    /// Stops renewing `state` (still held, its lease lost).
    pub(super) fn forget(&self, state: &Arc<PermitState>) {
        self.permits
            .remove_if(&slot(&state.keys, &state.id), |_, held| {
                Arc::ptr_eq(held, state)
            });
    }

    /// Every lease still held, no longer renewed (for shutdown).
    pub(super) fn take_all(&self) -> Vec<Arc<PermitState>> {
        let all: Vec<_> = self.permits.iter().map(|p| p.value().clone()).collect();
        all.into_iter()
            .filter(|state| !state.released.swap(true, Ordering::AcqRel))
            .inspect(|state| self.remove(state))
            .collect()
    }

    /// Extends a reservation every third of `ttl_ms` (a tenth after a failure) until [`Registry::unkeep`];
    /// returns its number.
    pub(super) fn keep(&self, key: Arc<str>, id: PermitId, ttl_ms: u64, extend: Extend) -> u64 {
        self.shortest(ttl_ms);
        let number = self.next_kept.fetch_add(1, Ordering::Relaxed);
        let kept = Kept {
            key,
            id,
            ttl_ms,
            renew_at_ms: AtomicU64::new(self.renew_at(ttl_ms)),
            extend,
        };
        self.kept.insert(number, Arc::new(kept));
        number
    }

    /// Notes a lease (or ttl) of `ms`, waking the task when it is the shortest yet.
    fn shortest(&self, ms: u64) {
        if ms < self.min_lease_ms.load(Ordering::Relaxed)
            && self.min_lease_ms.fetch_min(ms, Ordering::Relaxed) > ms
        {
            self.shorter.notify_one();
        }
    }

    /// Stops extending the reservation numbered `number`.
    pub(super) fn unkeep(&self, number: u64) {
        self.kept.remove(&number);
    }

    pub(super) fn len(&self) -> usize {
        self.permits.len()
    }

    pub(super) fn tick(&self) -> Duration {
        let third = self.min_lease_ms.load(Ordering::Relaxed) / 3;
        Duration::from_millis(third.max(1)).min(MAX_TICK)
    }

    /// The leases whose renewal is due by `now_ms` (`u64::MAX`: all of them); the shortest lease held sets
    /// the next tick.
    pub(super) fn due(&self, now: u64, default_lease_ms: u64) -> Vec<Arc<PermitState>> {
        let seen = self.min_lease_ms.load(Ordering::Relaxed);
        let kept = self.kept.iter().map(|kept| kept.ttl_ms).min();
        let mut shortest = kept.unwrap_or(u64::MAX).min(default_lease_ms);
        let due = self
            .permits
            .iter()
            .inspect(|p| shortest = shortest.min(p.lease_ms))
            .filter(|p| p.renew_at_ms.load(Ordering::Relaxed) <= now)
            .map(|p| p.value().clone())
            .collect();
        // A shorter one that arrived meanwhile is kept: it lowered the minimum after `seen`.
        let relaxed = Ordering::Relaxed;
        if self
            .min_lease_ms
            .compare_exchange(seen, shortest, relaxed, relaxed)
            .is_err()
        {
            self.min_lease_ms.fetch_min(shortest, relaxed);
        }
        due
    }
}

/// One try at extending a reservation held in this process: true while it is still open.
pub(crate) type Extend =
    Box<dyn Fn() -> BoxFuture<'static, Result<bool, StoreError>> + Send + Sync>;

/// A reservation held in this process, extended while its holder works.
pub(super) struct Kept {
    pub(super) key: Arc<str>,
    pub(super) id: PermitId,
    pub(super) ttl_ms: u64,
    pub(super) renew_at_ms: AtomicU64,
    pub(super) extend: Extend,
}

/// The registry's key of a lease: its keys in order (so that one set of keys is one lease however it
/// was spelled) and its id.
fn slot(keys: &Keys, id: &PermitId) -> (Keys, PermitId) {
    if keys.len() == 1 {
        return (keys.clone(), id.clone());
    }
    let mut sorted = keys.to_vec();
    sorted.sort();
    (sorted.into(), id.clone())
}
