//! The store's decision on an admission turned into a permit or a refusal: a lease registered for
//! renewal, a free permit for an unlimited key, the failure policy when the store could not decide,
//! and the lease a release handed a waiter.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use super::admission::{Refused, MAX_KEYS};
use super::renewer;
use super::Limiter;
use crate::error::{AcquireError, StoreError};
use crate::failure::FailurePolicy;
use crate::id::PermitId;
use crate::permit::{Hold, Owner, Permit, PermitState};
use crate::policy::{ClassLimits, Limit};
use crate::store::{Admission, Grant, Handed, Keys, LocalAdmission, Store};

impl<S: Store> Limiter<S> {
    /// The permit of the lease a release handed a waiter's ticket (`Ticket::handoff`): `id` on `keys`,
    /// recorded by the store for as long as the ticket would have lasted, claimed (renewed to
    /// `lease_ms`) a third of the way through unless released by then.
    pub(super) fn handed(
        &self,
        keys: &[&str],
        id: PermitId,
        (weight, lease_ms): (u32, u64),
        handed: Handed,
    ) -> Permit {
        let grant = Grant {
            limit: Limit::from_u32(handed.limit),
            in_flight: handed.in_flight,
            weight,
            expires_at_ms: handed.expires_at_ms,
            token: handed.token,
            counted: 1,
        };
        let keys = keys.iter().map(|key| Arc::from(*key)).collect();
        let state = self.lease_state(keys, id, lease_ms, &grant);
        renewer::claim(&self.core, state.clone());
        self.permit(state).granted(grant)
    }

    /// Applies the failure policy to an admission the store could not decide.
    pub(super) fn store_failed(
        &self,
        keys: &[&str],
        id: Option<PermitId>,
        weight: u32,
        lease_ms: u64,
        error: StoreError,
    ) -> Result<Permit, Refused> {
        match self.core.on_store_failure {
            FailurePolicy::FailOpen => Ok(free_permit(keys, id, weight)),
            FailurePolicy::FailOpenLocal { limit } => {
                let Some(fallback) = &self.core.fallback else {
                    return Err((0, AcquireError::Store(error)));
                };
                let limits = [ClassLimits::new(limit, 0); MAX_KEYS];
                match fallback.hold(keys, &limits[..keys.len()], weight, false) {
                    Some(LocalAdmission::Taken { slots, grant, .. }) => {
                        Ok(Permit::local(slots, id, grant, lease_ms))
                    }
                    Some(LocalAdmission::Decided(admission)) => {
                        self.decided(keys, None, weight, lease_ms, admission, None)
                    }
                    None => Err((0, AcquireError::Store(error))),
                }
            }
            _ => Err((0, AcquireError::Store(error))),
        }
    }

    /// Turns the store's decision into a permit or a refusal; `leased` is the lease's keys and id, and
    /// `joined` the permit that joined a lease this process already held.
    pub(super) fn decided(
        &self,
        keys: &[&str],
        leased: Option<(Keys, PermitId)>,
        weight: u32,
        lease_ms: u64,
        admission: Admission,
        joined: Option<Permit>,
    ) -> Result<Permit, Refused> {
        match admission {
            Admission::Admitted {
                grant,
                reclaimed,
                shadowed,
            } => {
                self.count_reclaimed(reclaimed);
                if shadowed != 0 {
                    self.core.shadow_refused(keys, shadowed);
                }
                if let Some(joined) = joined {
                    return Ok(joined.granted(grant));
                }
                let (keys, id) = leased.unwrap_or_else(|| {
                    let keys = keys.iter().map(|key| Arc::from(*key)).collect();
                    (keys, PermitId::generate())
                });
                Ok(self.leased(keys, id, lease_ms, grant))
            }
            Admission::Unlimited => {
                let id = leased.map(|(_, id)| id);
                Ok(joined.unwrap_or_else(|| free_permit(keys, id, weight)))
            }
            Admission::Full {
                index,
                limit,
                in_flight,
                reclaimed,
            }
            | Admission::Queued {
                index,
                limit,
                in_flight,
                reclaimed,
            } => {
                self.count_reclaimed(reclaimed);
                Err((index, AcquireError::Full { limit, in_flight }))
            }
            Admission::TooHeavy { index, limit } => {
                Err((index, AcquireError::WeightExceedsLimit { weight, limit }))
            }
        }
    }

    /// The permit of `grant`, the lease of `id` on `keys` in the store, renewed by the renewal task.
    fn leased(&self, keys: Keys, id: PermitId, lease_ms: u64, grant: Grant) -> Permit {
        let state = self.lease_state(keys, id, lease_ms, &grant);
        self.permit(state).granted(grant)
    }

    /// The state of the lease `grant` of `id` on `keys`, registered for renewal.
    fn lease_state(
        &self,
        keys: Keys,
        id: PermitId,
        lease_ms: u64,
        grant: &Grant,
    ) -> Arc<PermitState> {
        let state = Arc::new(PermitState {
            keys,
            id,
            weight: grant.weight,
            lease_ms,
            holders: AtomicUsize::new(1),
            expires_at_ms: AtomicU64::new(grant.expires_at_ms),
            token: AtomicU64::new(grant.token),
            counted: grant.counted,
            renew_at_ms: AtomicU64::new(self.core.registry.renew_at(lease_ms)),
            lost: Default::default(),
            released: AtomicBool::new(false),
        });
        self.core.registry.insert(state)
    }

    pub(super) fn count_reclaimed(&self, reclaimed: u32) {
        if reclaimed > 0 {
            self.core
                .stats
                .reclaimed
                .fetch_add(u64::from(reclaimed), Ordering::Relaxed);
        }
    }

    /// A permit holding `state`, a lease in the store (its figures set by [`Permit::granted`]).
    pub(super) fn permit(&self, state: Arc<PermitState>) -> Permit {
        let owner: Arc<dyn Owner> = self.core.clone();
        let weight = state.weight;
        Permit::new(
            Hold::Leased { state, owner },
            None,
            weight,
            Limit::Unlimited,
            0,
        )
    }
}

pub(super) fn free_permit(keys: &[&str], id: Option<PermitId>, weight: u32) -> Permit {
    let hold = Hold::Free {
        key: Arc::from(keys[0]),
    };
    Permit::new(hold, id, weight, Limit::Unlimited, 0)
}
