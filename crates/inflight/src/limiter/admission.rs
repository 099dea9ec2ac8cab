//! One admission: the checks and fast paths that need no waiting, the store's decision, the failure
//! policy, and several keys at once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use super::{Core, Limiter};
use crate::clock::millis;
use crate::error::{AcquireError, KeyRefused, StoreError};
use crate::failure::FailurePolicy;
use crate::id::PermitId;
use crate::options::AcquireOptions;
use crate::permit::{Hold, Owner, Permit, PermitState};
use crate::policy::{Limit, Policy};
use crate::renewer;
use crate::store::{AcquireRequest, Admission, Grant, LocalAdmission, LocalHold, Store};

/// The longest lease a permit may have (a day): renewals keep longer work alive.
pub(super) const MAX_LEASE_MS: u64 = 86_400_000;

/// What [`Limiter::acquire_now`] decided.
pub(crate) enum Now {
    /// Held in this process's store. The caller turns it into a permit at once, with
    /// [`Permit::local`], where it returns it: the slot is released only by that permit's drop.
    Local {
        hold: Arc<dyn LocalHold>,
        grant: Grant,
        lease_ms: u64,
    },
    /// The answer, with no store to ask: refused as invalid, admitted without a count (an unlimited key),
    /// decided by the in-process store, or the failure policy's answer while the store is failing.
    Decided(Result<Permit, AcquireError>),
    /// For the store to decide.
    Store(Prepared),
}

/// An admission that the store has yet to decide.
pub(crate) struct Prepared {
    id: PermitId,
    /// The id was made here, not given: a lease under it can only be this admission's.
    generated: bool,
    weight: u32,
    lease_ms: u64,
}

impl<S: Store> Limiter<S> {
    /// Admits one request under every key of `keys` at once, or under none: an app's limit, its tenant's
    /// and a global one, say (defect D12 of the reference system). The permit holds a slot on each key,
    /// all with the same id, and releases them all together.
    ///
    /// The keys are tried in order; when one refuses, the slots already taken are given back. No key ever
    /// goes over its limit; for that brief moment a concurrent request on an earlier key may be refused
    /// for a slot that was about to come back. Repeated keys count once. The permit's `key`, `limit` and
    /// `in_flight` are those of the first key.
    ///
    /// ```
    /// use inflight::{AcquireOptions, Limiter, MemoryStore, Policy};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let limiter = Limiter::builder(MemoryStore::new()).policy(Policy::new(5, 0)).build();
    /// limiter.set_limit("tenant:acme", 2).await.unwrap();
    /// let keys = ["app:chat", "tenant:acme", "global"];
    /// let a = limiter.try_acquire_all(&keys, AcquireOptions::new()).await.unwrap();
    /// let b = limiter.try_acquire_all(&["app:search", "tenant:acme", "global"], AcquireOptions::new()).await.unwrap();
    /// let refused = limiter.try_acquire_all(&keys, AcquireOptions::new()).await.unwrap_err();
    /// assert_eq!(refused.key, "tenant:acme");
    /// assert_eq!(limiter.status("app:chat").await.unwrap().in_flight, 1, "nothing kept from the refusal");
    /// # drop((a, b));
    /// # }
    /// ```
    pub async fn try_acquire_all(
        &self,
        keys: &[&str],
        options: AcquireOptions,
    ) -> Result<Permit, KeyRefused> {
        let Some(first) = keys.first() else {
            return Err(KeyRefused {
                key: String::new(),
                error: AcquireError::Invalid("no keys"),
            });
        };
        let id = options.id.clone().unwrap_or_else(PermitId::generate);
        let mut permits: Vec<Permit> = Vec::with_capacity(keys.len());
        for (n, key) in keys.iter().enumerate() {
            if keys[..n].contains(key) {
                continue;
            }
            match self
                .try_acquire_with(key, options.clone().id(id.clone()))
                .await
            {
                Ok(permit) => permits.push(permit),
                Err(error) => {
                    // Give back the slots taken so far before answering (a failed release goes on in the
                    // background).
                    for permit in permits {
                        let _ = permit.release().await;
                    }
                    return Err(KeyRefused {
                        key: (*key).to_owned(),
                        error,
                    });
                }
            }
        }
        let (weight, limit, in_flight) = (
            permits[0].weight(),
            permits[0].limit(),
            permits[0].in_flight(),
        );
        debug_assert_eq!(permits[0].key(), *first);
        Ok(Permit::new(
            Hold::Many(permits),
            Some(id),
            weight,
            limit,
            in_flight,
        ))
    }

    /// The part of an admission that needs no waiting: checks the options, then admits without I/O when
    /// the key is unlimited or the store lives in this process; otherwise hands back what the store must
    /// decide. Takes the options by reference: moving them out of the future costs more than reading them.
    #[inline]
    pub(crate) fn acquire_now(&self, key: &str, options: &mut AcquireOptions) -> Now {
        // Only what the caller set needs checking (the limiter's own lease was clamped when it was built).
        let weight = match options.weight {
            None => 1,
            Some(0) => {
                return Now::Decided(Err(AcquireError::Invalid("weight must be at least 1")))
            }
            Some(weight) => weight,
        };
        let lease_ms = match options.lease.map(millis) {
            None => self.core.lease_ms,
            Some(lease_ms @ 1..=MAX_LEASE_MS) => lease_ms,
            Some(_) => {
                return Now::Decided(Err(AcquireError::Invalid(
                    "lease must be between 1 ms and 24 h",
                )))
            }
        };
        if options.id.as_ref().is_some_and(PermitId::is_empty) {
            return Now::Decided(Err(AcquireError::Invalid("id must not be empty")));
        }
        let core = &self.core;
        if core.policy.is_unlimited_by_default() && !core.store.may_have_override(key) {
            return Now::Decided(Ok(free_permit(key, options.id.take(), weight)));
        }
        if options.id.is_none() {
            match core.store.acquire_local(key, weight, core.policy) {
                Some(LocalAdmission::Held {
                    hold,
                    grant,
                    reclaimed,
                }) => {
                    self.count_reclaimed(reclaimed);
                    return Now::Local {
                        hold,
                        grant,
                        lease_ms,
                    };
                }
                Some(LocalAdmission::Decided(admission)) => {
                    return Now::Decided(self.decided(key, None, weight, lease_ms, admission));
                }
                None => {}
            }
        }
        if core.breaker.is_open(|| core.registry.now_ms()) {
            let error =
                StoreError::Unavailable("the store failed moments ago; retrying shortly".into());
            return Now::Decided(self.store_failed(
                key,
                options.id.take(),
                weight,
                lease_ms,
                error,
            ));
        }
        let given = options.id.take();
        Now::Store(Prepared {
            generated: given.is_none(),
            id: given.unwrap_or_else(PermitId::generate),
            weight,
            lease_ms,
        })
    }

    /// Applies the failure policy to an admission the store could not decide.
    fn store_failed(
        &self,
        key: &str,
        id: Option<PermitId>,
        weight: u32,
        lease_ms: u64,
        error: StoreError,
    ) -> Result<Permit, AcquireError> {
        match self.core.on_store_failure {
            FailurePolicy::FailClosed => Err(AcquireError::Store(error)),
            FailurePolicy::FailOpen => Ok(free_permit(key, id, weight)),
            FailurePolicy::FailOpenLocal { limit } => {
                let policy = Policy::new(limit, 0);
                let Some(fallback) = &self.core.fallback else {
                    return Err(AcquireError::Store(error));
                };
                match fallback.acquire_local(key, weight, policy) {
                    Some(LocalAdmission::Held { hold, grant, .. }) => {
                        Ok(Permit::local(hold, id, grant, lease_ms))
                    }
                    Some(LocalAdmission::Decided(admission)) => {
                        self.decided(key, id, weight, lease_ms, admission)
                    }
                    None => Err(AcquireError::Store(error)),
                }
            }
        }
    }

    /// The part of an admission that the store decides.
    pub(crate) async fn acquire_in_store(
        &self,
        key: &str,
        prepared: Prepared,
    ) -> Result<Permit, AcquireError> {
        let Prepared {
            id,
            generated,
            weight,
            lease_ms,
        } = prepared;
        let request = AcquireRequest {
            key,
            id: &id,
            weight,
            lease_ms,
            policy: self.core.policy,
        };
        // Dropped before the store answers (the caller went away), this admission may still have been
        // made: its lease is then released in the background instead of holding a slot until it expires.
        // Only for a generated id, which no other permit can hold.
        // (`then`, not `then_some`: a guard made and thrown away would release at once.)
        let cancelled = generated.then(|| Cancelled {
            core: &self.core,
            key,
            id: &id,
            lease_ms,
        });
        let answer = self.core.store.acquire(request).await;
        // Answered: nothing to undo. The guard owns nothing, so forgetting it only skips its release.
        std::mem::forget(cancelled);
        match answer {
            Ok(admission) => {
                self.core.breaker.reset();
                self.decided(key, Some(id), weight, lease_ms, admission)
            }
            Err(error) if error.is_transient() => {
                self.core.breaker.trip(self.core.registry.now_ms());
                tracing::warn!(%error, key, policy = ?self.core.on_store_failure, "store unavailable at admission");
                self.store_failed(key, Some(id), weight, lease_ms, error)
            }
            Err(error) => Err(AcquireError::Store(error)),
        }
    }

    /// Turns the store's decision into a permit or an error.
    fn decided(
        &self,
        key: &str,
        id: Option<PermitId>,
        weight: u32,
        lease_ms: u64,
        admission: Admission,
    ) -> Result<Permit, AcquireError> {
        match admission {
            Admission::Admitted { grant, reclaimed } => {
                self.count_reclaimed(reclaimed);
                let id = id.unwrap_or_else(PermitId::generate);
                Ok(self.leased_permit(key, id, lease_ms, grant))
            }
            Admission::Unlimited => Ok(free_permit(key, id, weight)),
            Admission::Full {
                limit,
                in_flight,
                reclaimed,
            } => {
                self.count_reclaimed(reclaimed);
                Err(AcquireError::Full { limit, in_flight })
            }
            Admission::TooHeavy { limit } => {
                Err(AcquireError::WeightExceedsLimit { weight, limit })
            }
        }
    }

    fn count_reclaimed(&self, reclaimed: u32) {
        if reclaimed > 0 {
            self.core
                .stats
                .reclaimed
                .fetch_add(u64::from(reclaimed), Ordering::Relaxed);
        }
    }

    fn leased_permit(&self, key: &str, id: PermitId, lease_ms: u64, grant: Grant) -> Permit {
        let registry = &self.core.registry;
        let state = Arc::new(PermitState {
            key: Arc::from(key),
            id,
            weight: grant.weight,
            lease_ms,
            seq: registry.next_seq(),
            expires_at_ms: AtomicU64::new(grant.expires_at_ms),
            renew_at_ms: AtomicU64::new(registry.renew_at(lease_ms)),
            lost: AtomicBool::new(false),
            released: AtomicBool::new(false),
        });
        registry.insert(state.clone());
        let owner: Arc<dyn Owner> = self.core.clone();
        Permit::new(
            Hold::Leased { state, owner },
            None,
            grant.weight,
            grant.limit,
            grant.in_flight,
        )
    }
}

fn free_permit(key: &str, id: Option<PermitId>, weight: u32) -> Permit {
    let hold = Hold::Free {
        key: Arc::from(key),
    };
    Permit::new(hold, id, weight, Limit::Unlimited, 0)
}

/// An admission waiting for the store: if dropped (not forgotten once the store has answered), its lease
/// is released in the background. It only borrows what it would need, so that an admission the store
/// answers costs nothing more.
struct Cancelled<'a, S: Store> {
    core: &'a Arc<Core<S>>,
    key: &'a str,
    id: &'a PermitId,
    lease_ms: u64,
}

impl<S: Store> Drop for Cancelled<'_, S> {
    fn drop(&mut self) {
        renewer::spawn_release_id(
            self.core.clone(),
            Arc::from(self.key),
            self.id.clone(),
            self.lease_ms,
        );
    }
}
