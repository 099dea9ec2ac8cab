//! [`Core`]: what a limiter's handles, its permits and its background tasks share, and how a permit's
//! lease is released through it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::registry::Registry;
use super::settler::{self, Deferred, Settler, Unsettled};
use super::waiters;
use crate::error::StoreError;
use crate::failure::{Breaker, FailurePolicy};
use crate::id::PermitId;
use crate::permit::{BoxFuture, Owner, PermitState};
use crate::policy::{ClassLimits, SharedPolicy};
use crate::store::{Keys, MemoryStore, Store};

/// Counters of what the limiter has seen, for metrics.
#[derive(Debug, Default)]
pub struct LimiterStats {
    /// Expired leases that admissions reclaimed: their holders went away without releasing.
    pub reclaimed: AtomicU64,
    /// Held permits whose lease was gone at renewal and could not be re-added.
    pub lost: AtomicU64,
    /// Held permits whose lease was gone at renewal and was re-added (the store had lost it).
    pub readded: AtomicU64,
    /// Admissions waiting for a slot now ([`crate::Limiter::acquire`]).
    pub waiting: AtomicU64,
    /// Waits that ran their course without a slot (a full queue refuses at once, uncounted here).
    pub wait_timeouts: AtomicU64,
    /// Keys of admissions that a shadow limit would have refused ([`crate::Policy::shadow`]).
    pub shadow_refusals: AtomicU64,
}

/// What [`crate::LimiterBuilder::on_shadow_refusal`] calls.
pub(super) type ShadowHook = Arc<dyn Fn(&str) + Send + Sync>;

/// What the limiter's handles, its permits and its background tasks share.
pub(super) struct Core<S> {
    pub(super) store: S,
    pub(super) policy: SharedPolicy,
    pub(super) lease_ms: u64,
    pub(super) registry: Registry,
    pub(super) settler: Settler,
    pub(super) stats: LimiterStats,
    pub(super) on_store_failure: FailurePolicy,
    pub(super) breaker: Breaker,
    /// Counts the permits admitted under [`FailurePolicy::FailOpenLocal`] while the store is away.
    pub(super) fallback: Option<MemoryStore>,
    pub(super) waiters: waiters::Waiters,
    pub(super) on_shadow_refusal: Option<ShadowHook>,
}

impl<S> Core<S> {
    #[inline]
    pub(super) fn limits(&self, key: &str) -> ClassLimits {
        self.policy.limits(key)
    }

    /// An admission on `keys` went past the shadow limits of the keys of `shadowed` (bit i: key i).
    pub(super) fn shadow_refused(&self, keys: &[&str], shadowed: u32) {
        for (_, key) in keys
            .iter()
            .enumerate()
            .filter(|(i, _)| shadowed >> i & 1 == 1)
        {
            self.stats.shadow_refusals.fetch_add(1, Ordering::Relaxed);
            if let Some(hook) = &self.on_shadow_refusal {
                hook(key);
            }
        }
    }

    /// The limits of each key's class, in order.
    pub(super) fn limits_of<K: AsRef<str>>(&self, keys: &[K]) -> Vec<ClassLimits> {
        let mut limits = vec![ClassLimits::default(); keys.len()];
        self.policy.limits_into(keys, &mut limits);
        limits
    }
}

impl<S: Store> Core<S> {
    /// The release of the lease `id` on `keys` that the admission with `token` took (0: whichever the id
    /// holds), for the [`Settler`]: tried until the lease would end.
    pub(super) fn release_of(
        &self,
        keys: Keys,
        id: PermitId,
        lease_ms: u64,
        token: u64,
    ) -> Deferred {
        let store = self.store.clone();
        let (key, within) = (keys[0].clone(), Duration::from_millis(lease_ms));
        let attempt_id = id.clone();
        let attempt: settler::Attempt = Box::new(move || {
            let (store, keys, id) = (store.clone(), keys.clone(), attempt_id.clone());
            Box::pin(async move { store.release(&keys, &id, token).await.map(drop) })
        });
        Deferred {
            what: "release",
            key,
            id,
            within,
            attempt,
        }
    }

    /// The release of a permit's lease, by the token of the admission that holds it now.
    pub(super) fn release_state(&self, state: &PermitState) -> Deferred {
        let token = state.token.load(Ordering::Acquire);
        self.release_of(state.keys.clone(), state.id.clone(), state.lease_ms, token)
    }
}

impl<S: Store> Owner for Core<S> {
    fn dropped(&self, state: Arc<PermitState>) {
        // Nothing to release when shutdown already did, or when the lease was lost (another permit of
        // this process may hold the same id since).
        if state.leave() && !state.released.load(Ordering::Acquire) {
            self.registry.remove(&state);
            if !state.lost.is_set() {
                self.settler.settle(self.release_state(&state));
            }
        }
    }

    fn release(
        self: Arc<Self>,
        state: Arc<PermitState>,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        if !state.leave() || state.released.load(Ordering::Acquire) {
            return Box::pin(std::future::ready(Ok(())));
        }
        self.registry.remove(&state);
        if state.lost.is_set() {
            return Box::pin(std::future::ready(Ok(())));
        }
        // Dropped before the store answers, or answered with a transient error: the release goes on in
        // the background like a dropped permit's.
        let release = self.release_state(&state);
        let mut unsettled = Unsettled::new(&self.settler, Some(release));
        Box::pin(async move {
            let token = state.token.load(Ordering::Acquire);
            let result = self.store.release(&state.keys, &state.id, token).await;
            unsettled.disarm_unless(matches!(&result, Err(error) if error.is_transient()));
            drop(unsettled);
            result.map(drop)
        })
    }

    fn detach(&self, state: &Arc<PermitState>) {
        // No longer this limiter's to renew once no permit here holds it, nor shutdown's to release. Not
        // marked released: a renewal already on its way would then give back the lease its holder keeps.
        if state.leave() {
            self.registry.forget(state);
        }
    }
}
