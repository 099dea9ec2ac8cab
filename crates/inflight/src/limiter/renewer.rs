//! The renewal task: renews the leases of live permits in batches, extends the reservations held in this
//! process, and runs store maintenance. One task per limiter, not one per permit or reservation;
//! [`Registry`] is what it renews.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::Core;
use crate::error::StoreError;
use crate::id::PermitId;
use crate::permit::{BoxFuture, PermitState};
use crate::store::{Keys, RenewRequest, Renewal, Store};

/// How often, at most, the task sleeps between passes; maintenance runs on this beat.
const MAX_TICK: Duration = Duration::from_secs(1);
/// How many leases one store call renews.
const BATCH: usize = 512;

/// The leases this limiter renews, one per keys and id (permits of this process with the same keys and
/// id share one).
pub(super) struct Registry {
    permits: DashMap<(Keys, PermitId), Arc<PermitState>, foldhash::fast::RandomState>,
    /// The reservations kept open, by the number [`Registry::keep`] gave them.
    kept: DashMap<u64, Arc<Kept>, foldhash::fast::RandomState>,
    next_kept: AtomicU64,
    /// The limiter clock as of the task's last pass: what admissions read to schedule renewals, so the
    /// hot path reads no clock. Stale by at most a tick, which only makes a renewal early.
    coarse_now_ms: AtomicU64,
    /// The shortest lease (or reservation ttl) seen: the task wakes at a third of it.
    min_lease_ms: AtomicU64,
    /// Told when a shorter one arrives, so that the task does not sleep through its first renewal.
    shorter: Arc<Notify>,
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
    fn forget(&self, state: &Arc<PermitState>) {
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

    /// How many leases are being renewed.
    pub(super) fn len(&self) -> usize {
        self.permits.len()
    }

    fn tick(&self) -> Duration {
        let third = self.min_lease_ms.load(Ordering::Relaxed) / 3;
        Duration::from_millis(third.max(1)).min(MAX_TICK)
    }

    /// The leases whose renewal is due by `now_ms` (`u64::MAX`: all of them); the shortest lease held sets
    /// the next tick.
    fn due(&self, now: u64, default_lease_ms: u64) -> Vec<Arc<PermitState>> {
        let kept = self.kept.iter().map(|kept| kept.ttl_ms).min();
        let mut shortest = kept.unwrap_or(u64::MAX).min(default_lease_ms);
        let due = self
            .permits
            .iter()
            .inspect(|p| shortest = shortest.min(p.lease_ms))
            .filter(|p| p.renew_at_ms.load(Ordering::Relaxed) <= now)
            .map(|p| p.value().clone())
            .collect();
        self.min_lease_ms.store(shortest, Ordering::Relaxed);
        due
    }
}

/// One try at extending a reservation held in this process: true while it is still open.
pub(crate) type Extend = Box<dyn Fn() -> BoxFuture<'static, Result<bool, StoreError>> + Send + Sync>;

/// A reservation held in this process, extended while its holder works.
struct Kept {
    key: Arc<str>,
    id: PermitId,
    ttl_ms: u64,
    renew_at_ms: AtomicU64,
    extend: Extend,
}

/// Runs until the limiter and all its permits are gone.
pub(super) async fn run<S: Store>(core: Weak<Core<S>>) {
    let mut last_maintain = Instant::now();
    let Some(shorter) = core.upgrade().map(|core| core.registry.shorter.clone()) else {
        return;
    };
    loop {
        let tick = match core.upgrade() {
            Some(core) => core.registry.tick(),
            None => return,
        };
        tokio::select! {
            () = tokio::time::sleep(tick) => {}
            () = shorter.notified() => continue,
        }
        let Some(core) = core.upgrade() else { return };
        let now = core.registry.now_ms();
        core.registry.coarse_now_ms.store(now, Ordering::Relaxed);
        renew_due(&core, now).await;
        if last_maintain.elapsed() >= MAX_TICK {
            let _ = core.store.maintain().await;
            if let Some(fallback) = &core.fallback {
                let _ = fallback.maintain().await;
            }
            last_maintain = Instant::now();
        }
    }
}

/// Renews every lease whose renewal is due by `now` (limiter clock), in batches.
pub(super) async fn renew_due<S: Store>(core: &Core<S>, now: u64) {
    extend_due(&core.registry, now).await;
    let due = core.registry.due(now, core.lease_ms);
    for chunk in due.chunks(BATCH) {
        let batch: Vec<RenewRequest> = chunk
            .iter()
            .map(|p| RenewRequest {
                keys: p.keys.clone(),
                id: p.id.clone(),
                lease_ms: Some(p.lease_ms),
                limits: core.limits_of(&p.keys),
                readd_weight: Some(p.weight),
            })
            .collect();
        let outcomes = match core.store.renew(&batch).await {
            Ok(outcomes) => outcomes,
            Err(error) => {
                // Left due: the next pass tries again, and the lease re-adds itself once the store is back.
                tracing::warn!(%error, permits = batch.len(), "lease renewal failed");
                return;
            }
        };
        for (permit, outcome) in chunk.iter().zip(outcomes) {
            apply(core, permit, outcome);
        }
    }
}

/// Extends every reservation kept open whose extension is due by `now` (limiter clock), together.
async fn extend_due(registry: &Registry, now: u64) {
    let due: Vec<_> = registry
        .kept
        .iter()
        .filter(|kept| kept.renew_at_ms.load(Ordering::Relaxed) <= now)
        .map(|kept| (*kept.key(), kept.value().clone()))
        .collect();
    let extensions = due.iter().map(|(_, kept)| (kept.extend)());
    let outcomes = futures_util::future::join_all(extensions).await;
    for ((number, kept), outcome) in due.into_iter().zip(outcomes) {
        let (key, id) = (&kept.key, &kept.id);
        let next = match outcome {
            Ok(true) => kept.ttl_ms / 3,
            Ok(false) => {
                // (Settled as the extension left: it is no longer kept, and nothing is wrong.)
                if registry.kept.remove(&number).is_some() {
                    tracing::warn!(%key, %id, "a held reservation was no longer open: it expired (refunded) before it was settled");
                }
                continue;
            }
            Err(error) => {
                // Sooner after a failure: a third of the ttl twice more would let it expire while held.
                tracing::warn!(%error, %key, %id, "a held reservation was not extended; trying again");
                kept.ttl_ms / 10
            }
        };
        kept.renew_at_ms
            .store(now.saturating_add(next.max(1)), Ordering::Relaxed);
    }
}

fn apply<S: Store>(core: &Core<S>, permit: &Arc<PermitState>, outcome: Renewal) {
    match outcome {
        Renewal::Renewed(grant) | Renewal::Readded(grant) => {
            permit
                .expires_at_ms
                .store(grant.expires_at_ms, Ordering::Relaxed);
            permit
                .renew_at_ms
                .store(core.registry.renew_at(permit.lease_ms), Ordering::Relaxed);
            if matches!(outcome, Renewal::Readded(_)) {
                core.stats.readded.fetch_add(1, Ordering::Relaxed);
                tracing::info!(key = %permit.keys[0], id = %permit.id, "lease was gone and has been re-added");
            }
            // A permit released while its renewal was on its way must not leave the lease behind, unless
            // another permit of this process holds the same lease since.
            if permit.released.load(Ordering::Acquire) && !core.registry.holds_other(permit) {
                let release = core.release_of(permit.keys.clone(), permit.id.clone(), permit.lease_ms);
                core.settler.settle(release);
            }
        }
        Renewal::Lost => {
            permit.lost.store(true, Ordering::Release);
            if !permit.released.load(Ordering::Acquire) {
                core.stats.lost.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(key = %permit.keys[0], id = %permit.id, "lease lost: the key is full without it");
            }
            core.registry.forget(permit);
        }
    }
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
