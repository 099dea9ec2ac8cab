//! The limiter's background task: renews the leases of live permits in batches, retries releases that the
//! store could not take, and runs store maintenance. One task per limiter, not one per permit.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use dashmap::DashMap;
use tokio::time::Instant;

use crate::error::StoreError;
use crate::id::PermitId;
use crate::limiter::Core;
use crate::permit::PermitState;
use crate::store::{ReleaseDone, RenewRequest, Renewal, Store};

/// How often, at most, the task sleeps between passes; maintenance runs on this beat.
const MAX_TICK: Duration = Duration::from_secs(1);
/// How many leases one store call renews.
const BATCH: usize = 512;
/// Releases waiting for the store at once; past this, dropped permits are left to their leases.
const MAX_PENDING_RELEASES: usize = 65_536;

/// The permits this limiter renews.
pub(crate) struct Registry {
    permits: DashMap<u64, Arc<PermitState>, foldhash::fast::RandomState>,
    /// The limiter clock as of the task's last pass: what admissions read to schedule renewals, so the
    /// hot path reads no clock. Stale by at most a tick, which only makes a renewal early.
    coarse_now_ms: AtomicU64,
    next_seq: AtomicU64,
    /// The shortest lease seen: the task wakes at a third of it.
    min_lease_ms: AtomicU64,
    epoch: Instant,
    pub(crate) pending_releases: AtomicUsize,
}

impl Registry {
    pub(crate) fn new(default_lease_ms: u64) -> Self {
        Self {
            permits: DashMap::with_hasher(foldhash::fast::RandomState::default()),
            coarse_now_ms: AtomicU64::new(0),
            next_seq: AtomicU64::new(0),
            min_lease_ms: AtomicU64::new(default_lease_ms),
            epoch: Instant::now(),
            pending_releases: AtomicUsize::new(0),
        }
    }

    pub(crate) fn next_seq(&self) -> u64 {
        self.next_seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Milliseconds on the limiter's monotonic clock (tokio's, so paused-time tests move it).
    pub(crate) fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// When a lease of `lease_ms` renewed now should be renewed next: a third of the way through.
    pub(crate) fn renew_at(&self, lease_ms: u64) -> u64 {
        self.coarse_now_ms
            .load(Ordering::Relaxed)
            .saturating_add((lease_ms / 3).max(1))
    }

    pub(crate) fn insert(&self, state: Arc<PermitState>) {
        if state.lease_ms < self.min_lease_ms.load(Ordering::Relaxed) {
            self.min_lease_ms
                .fetch_min(state.lease_ms, Ordering::Relaxed);
        }
        self.permits.insert(state.seq, state);
    }

    pub(crate) fn remove(&self, seq: u64) {
        self.permits.remove(&seq);
    }

    /// How many permits are being renewed.
    pub(crate) fn len(&self) -> usize {
        self.permits.len()
    }

    fn tick(&self) -> Duration {
        let third = self.min_lease_ms.load(Ordering::Relaxed) / 3;
        Duration::from_millis(third.max(1)).min(MAX_TICK)
    }

    /// Every permit being renewed.
    pub(crate) fn all(&self) -> Vec<Arc<PermitState>> {
        self.due(u64::MAX)
    }

    /// The permits whose renewal is due by `now_ms` (`u64::MAX`: all of them).
    fn due(&self, now: u64) -> Vec<Arc<PermitState>> {
        self.permits
            .iter()
            .filter(|p| p.renew_at_ms.load(Ordering::Relaxed) <= now)
            .map(|p| p.value().clone())
            .collect()
    }
}

/// Runs until the limiter and all its permits are gone.
pub(crate) async fn run<S: Store>(core: Weak<Core<S>>) {
    let mut last_maintain = Instant::now();
    loop {
        let tick = match core.upgrade() {
            Some(core) => core.registry.tick(),
            None => return,
        };
        tokio::time::sleep(tick).await;
        let Some(core) = core.upgrade() else { return };
        let now = core.registry.now_ms();
        core.registry.coarse_now_ms.store(now, Ordering::Relaxed);
        renew_due(&core, now).await;
        if last_maintain.elapsed() >= MAX_TICK {
            core.store.maintain().await;
            if let Some(fallback) = &core.fallback {
                fallback.maintain().await;
            }
            last_maintain = Instant::now();
        }
    }
}

/// Renews every permit whose renewal is due by `now` (limiter clock), in batches.
pub(crate) async fn renew_due<S: Store>(core: &Core<S>, now: u64) {
    let due = core.registry.due(now);
    for chunk in due.chunks(BATCH) {
        let batch: Vec<RenewRequest> = chunk
            .iter()
            .map(|p| RenewRequest {
                key: p.key.clone(),
                id: p.id.clone(),
                lease_ms: p.lease_ms,
                policy: core.policy,
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
            apply(core, permit, outcome).await;
        }
    }
}

async fn apply<S: Store>(core: &Core<S>, permit: &PermitState, outcome: Renewal) {
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
                tracing::info!(key = %permit.key, id = %permit.id, "lease was gone and has been re-added");
                // A permit released while its re-add was in flight must not leave the re-added lease behind.
                if permit.released.load(Ordering::Acquire) {
                    let _ = core.store.release(&permit.key, &permit.id).await;
                }
            }
        }
        Renewal::Lost => {
            permit.lost.store(true, Ordering::Relaxed);
            core.registry.remove(permit.seq);
            if !permit.released.load(Ordering::Acquire) {
                core.stats.lost.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(key = %permit.key, id = %permit.id, "lease lost: the key is full without it");
            }
        }
    }
}

/// Releases a dropped permit in the background, retrying transient failures until its lease would have
/// ended anyway (the store then reclaims it by itself).
pub(crate) fn spawn_release<S: Store>(core: Arc<Core<S>>, permit: Arc<PermitState>) {
    spawn_release_id(core, permit.key.clone(), permit.id.clone(), permit.lease_ms);
}

/// Releases the lease `id` of `key` in the background, as [`spawn_release`] does: queued in the store
/// when it can queue ([`Store::release_queued`]), else in a task. Counted in `pending_releases` until done,
/// however it ends (released, given up, panicked or dropped).
pub(crate) fn spawn_release_id<S: Store>(
    core: Arc<Core<S>>,
    key: Arc<str>,
    id: PermitId,
    lease_ms: u64,
) {
    let pending = core
        .registry
        .pending_releases
        .fetch_add(1, Ordering::AcqRel);
    if pending >= MAX_PENDING_RELEASES {
        core.registry
            .pending_releases
            .fetch_sub(1, Ordering::AcqRel);
        tracing::warn!(%key, %id, "too many releases pending; leaving this one to its lease");
        return;
    }
    let release = Release {
        core: core.clone(),
        key,
        id,
        give_up: Instant::now() + Duration::from_millis(lease_ms),
        _counted: Pending(core.clone()),
    };
    let (key, id) = (release.key.clone(), release.id.clone());
    let done: ReleaseDone = Box::new(move |outcome| release.after(outcome));
    if let Err(done) = core.store.release_queued(&key, &id, done) {
        let runtime = core.runtime.clone();
        runtime.spawn(async move { done(core.store.release(&key, &id).await) });
    }
}

/// A release in the background, counted in `pending_releases` while it lasts.
struct Release<S: Store> {
    core: Arc<Core<S>>,
    key: Arc<str>,
    id: PermitId,
    give_up: Instant,
    _counted: Pending<S>,
}

/// The first wait before a failed release is tried again; it doubles up to [`MAX_RETRY_DELAY`].
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(20);
const MAX_RETRY_DELAY: Duration = Duration::from_secs(2);

impl<S: Store> Release<S> {
    /// After a try: done, or tried again in a task after a pause, while its lease lasts.
    fn after(self, outcome: Result<bool, StoreError>) {
        if let Some(delay) = self.retry_after(outcome, FIRST_RETRY_DELAY) {
            let runtime = self.core.runtime.clone();
            runtime.spawn(self.retry(delay));
        }
    }

    /// How long to wait before trying again, if at all.
    fn retry_after(&self, outcome: Result<bool, StoreError>, delay: Duration) -> Option<Duration> {
        match outcome {
            Ok(_) => None,
            Err(error) if error.is_transient() && Instant::now() + delay < self.give_up => {
                tracing::debug!(%error, key = %self.key, "release failed; retrying");
                Some(delay)
            }
            Err(error) => {
                tracing::warn!(%error, key = %self.key, id = %self.id, "release failed; the lease will expire");
                None
            }
        }
    }

    async fn retry(self, mut delay: Duration) {
        loop {
            tokio::time::sleep(delay).await;
            let outcome = self.core.store.release(&self.key, &self.id).await;
            let next = (delay * 2).min(MAX_RETRY_DELAY);
            match self.retry_after(outcome, next) {
                Some(next) => delay = next,
                None => return,
            }
        }
    }
}

/// One release counted in `pending_releases`, until dropped.
struct Pending<S: Store>(Arc<Core<S>>);

impl<S: Store> Drop for Pending<S> {
    fn drop(&mut self) {
        self.0
            .registry
            .pending_releases
            .fetch_sub(1, Ordering::AcqRel);
    }
}
