//! [`LimiterBuilder`]: a limiter's settings, and starting its background tasks.

use std::sync::Arc;
use std::time::Duration;

use super::core::{Core, LimiterStats, ShadowHook};
use super::handle::Limiter;
use super::registry::Registry;
use super::renewer;
use super::settler::Settler;
use super::waiters::{self, DEFAULT_MAX_WAITERS};
use crate::clock::millis;
use crate::failure::{Breaker, FailurePolicy};
use crate::options::{DEFAULT_LEASE, MAX_LEASE, MIN_LEASE};
use crate::policy::SharedPolicy;
use crate::store::{MemoryStore, Store};

/// Builds a [`Limiter`].
#[must_use]
pub struct LimiterBuilder<S> {
    pub(super) store: S,
    pub(super) policy: SharedPolicy,
    pub(super) lease: Duration,
    pub(super) on_store_failure: FailurePolicy,
    pub(super) fallback: Option<MemoryStore>,
    pub(super) max_waiters: usize,
    pub(super) store_breaker: bool,
    pub(super) on_shadow_refusal: Option<ShadowHook>,
}

impl<S: Store> Limiter<S> {
    /// Starts building a limiter over `store`.
    pub fn builder(store: S) -> LimiterBuilder<S> {
        LimiterBuilder {
            store,
            policy: SharedPolicy::default(),
            lease: DEFAULT_LEASE,
            on_store_failure: FailurePolicy::default(),
            fallback: None,
            max_waiters: DEFAULT_MAX_WAITERS,
            store_breaker: true,
            on_shadow_refusal: None,
        }
    }
}

impl<S: Store> LimiterBuilder<S> {
    /// The limits: rules for classes of keys, and the default and ceiling of every other key (all 0,
    /// unlimited, unless set). A [`SharedPolicy`] lets a reload reach every limiter that shares it.
    pub fn policy(mut self, policy: impl Into<SharedPolicy>) -> Self {
        self.policy = policy.into();
        self
    }

    /// The lease of each permit unless its options say otherwise (default 30 s; [`MIN_LEASE`] to
    /// [`MAX_LEASE`], a lease outside taken as the nearest of them). A crashed holder's slots come back
    /// within one lease; live holders renew at a third of it.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// What to do when the store is unavailable (default [`FailurePolicy::FailClosed`]).
    pub fn on_store_failure(mut self, policy: FailurePolicy) -> Self {
        self.on_store_failure = policy;
        self
    }

    /// Where [`FailurePolicy::FailOpenLocal`] counts while the store is away (default: a store of this
    /// limiter's own). Limiters given clones of one store share the cap: one cap per process.
    pub fn fallback(mut self, store: MemoryStore) -> Self {
        self.fallback = Some(store);
        self
    }

    /// The most admissions of this limiter that may wait on one key at once (default
    /// [`DEFAULT_MAX_WAITERS`]; at least 1); one more is refused at once.
    pub fn max_waiters(mut self, max: usize) -> Self {
        self.max_waiters = max.max(1);
        self
    }

    /// Whether one transient store failure makes every admission skip the store for 200 ms (default: on).
    /// Turn it off where the store fails in part, as a Redis Cluster that lost one primary does: there
    /// the other primaries' keys must go on being admitted.
    pub fn store_breaker(mut self, on: bool) -> Self {
        self.store_breaker = on;
        self
    }

    /// Calls `hook` with the key of each admission a shadow limit would have refused
    /// ([`crate::Policy::shadow`]), once per key, on the admitting task: keep it short (count, log).
    /// [`LimiterStats::shadow_refusals`] counts them too.
    pub fn on_shadow_refusal(mut self, hook: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.on_shadow_refusal = Some(Arc::new(hook));
        self
    }

    /// Builds the limiter and starts its background tasks on the current Tokio runtime.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime, like `tokio::spawn`.
    pub fn build(self) -> Limiter<S> {
        let lease_ms = millis(self.lease).clamp(millis(MIN_LEASE), millis(MAX_LEASE));
        let fallback = matches!(self.on_store_failure, FailurePolicy::FailOpenLocal { .. })
            .then(|| self.fallback.unwrap_or_default());
        let core = Arc::new(Core {
            settler: Settler::start(),
            store: self.store,
            policy: self.policy,
            lease_ms,
            registry: Registry::new(lease_ms),
            stats: LimiterStats::default(),
            on_store_failure: self.on_store_failure,
            breaker: Breaker::new(!self.store_breaker),
            fallback,
            waiters: waiters::Waiters::new(self.max_waiters),
            on_shadow_refusal: self.on_shadow_refusal,
        });
        tokio::spawn(renewer::run(Arc::downgrade(&core)));
        Limiter { core }
    }
}
