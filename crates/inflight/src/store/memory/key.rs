//! One key's state and every decision the memory store makes about it.

use std::collections::HashMap;

use crate::id::PermitId;
use crate::policy::{Limit, Policy};
use crate::store::{AcquireRequest, Admission, Grant, KeyStatus, RenewRequest, Renewal};

/// A fast hasher seeded per process, so that chosen keys or ids cannot flood one bucket.
pub(super) type Hasher = foldhash::fast::RandomState;

/// A key's leases, its in-process holds and its override.
#[derive(Default)]
pub(super) struct KeyState {
    leases: HashMap<PermitId, Lease, Hasher>,
    /// The weight of every lease plus that of the permits of this process that have no lease.
    in_flight: u32,
    pub(super) override_limit: Option<u32>,
    /// No lease ends before this (a lower bound): reclaiming can be skipped until then.
    next_expiry_ms: u64,
    pub(super) last_used_ms: u64,
}

#[derive(Clone, Copy)]
struct Lease {
    weight: u32,
    expires_at_ms: u64,
}

impl KeyState {
    /// True when nothing is held and no override is set: the key can be forgotten.
    pub(super) fn is_idle(&self) -> bool {
        self.in_flight == 0 && self.override_limit.is_none()
    }

    pub(super) fn has_leases(&self) -> bool {
        !self.leases.is_empty()
    }

    /// Drops leases whose deadline has passed; returns how many.
    pub(super) fn reclaim(&mut self, now: u64) -> u32 {
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

    fn grant(&self, limit: Limit, weight: u32, expires_at_ms: u64) -> Grant {
        Grant {
            limit,
            in_flight: self.in_flight,
            weight,
            expires_at_ms,
        }
    }

    fn add(&mut self, id: &PermitId, lease: Lease) {
        self.next_expiry_ms = self.next_expiry_ms.min(lease.expires_at_ms);
        // The old weight leaves before the new one comes: the sum never passes the limit, so no overflow.
        if let Some(old) = self.leases.insert(id.clone(), lease) {
            self.in_flight -= old.weight;
        }
        self.in_flight += lease.weight;
    }

    /// Would `in_flight - held + weight` pass `max`? (In u64: weights may be as large as the limit.)
    fn over(&self, held: u32, weight: u32, max: u32) -> bool {
        u64::from(self.in_flight - held) + u64::from(weight) > u64::from(max)
    }

    /// The admission rule, shared by leases and in-process holds: `held` is the weight `id` already has.
    fn decide(
        &self,
        policy: Policy,
        weight: u32,
        held: u32,
        reclaimed: u32,
    ) -> Result<u32, Admission> {
        let Limit::Limited(max) = policy.resolve(self.override_limit) else {
            return Err(Admission::Unlimited);
        };
        if weight > max {
            return Err(Admission::TooHeavy { limit: max });
        }
        // A retried acquisition of a held id never needs more room than it already has.
        if weight > held && self.over(held, weight, max) {
            return Err(Admission::Full {
                limit: max,
                in_flight: self.in_flight,
                reclaimed,
            });
        }
        Ok(max)
    }

    pub(super) fn acquire(
        &mut self,
        req: &AcquireRequest<'_>,
        now: u64,
        reclaimed: u32,
    ) -> Admission {
        let held = self.leases.get(req.id).map_or(0, |l| l.weight);
        let max = match self.decide(req.policy, req.weight, held, reclaimed) {
            Ok(max) => max,
            Err(decision) => return decision,
        };
        let lease = Lease {
            weight: req.weight,
            expires_at_ms: now.saturating_add(req.lease_ms),
        };
        self.add(req.id, lease);
        Admission::Admitted {
            grant: self.grant(Limit::Limited(max), lease.weight, lease.expires_at_ms),
            reclaimed,
        }
    }

    /// Admits a hold without a lease (an in-process permit).
    pub(super) fn hold(&mut self, weight: u32, policy: Policy, reclaimed: u32) -> Admission {
        let max = match self.decide(policy, weight, 0, reclaimed) {
            Ok(max) => max,
            Err(decision) => return decision,
        };
        self.in_flight += weight;
        Admission::Admitted {
            grant: self.grant(Limit::Limited(max), weight, 0),
            reclaimed,
        }
    }

    pub(super) fn unhold(&mut self, weight: u32) {
        self.in_flight -= weight;
    }

    /// Turns a hold into a lease under `id`; the in-flight count does not change.
    pub(super) fn lease_hold(&mut self, id: &PermitId, weight: u32, expires_at_ms: u64) {
        self.unhold(weight);
        self.add(
            id,
            Lease {
                weight,
                expires_at_ms,
            },
        );
    }

    pub(super) fn renew(&mut self, req: &RenewRequest, now: u64) -> Renewal {
        let expires_at_ms = now.saturating_add(req.lease_ms);
        let limit = req.policy.resolve(self.override_limit);
        if let Some(lease) = self.leases.get_mut(&req.id) {
            lease.expires_at_ms = expires_at_ms;
            let weight = lease.weight;
            // A renewal may shorten the lease: keep the bound a lower bound.
            self.next_expiry_ms = self.next_expiry_ms.min(expires_at_ms);
            return Renewal::Renewed(self.grant(limit, weight, expires_at_ms));
        }
        let Some(weight) = req.readd_weight else {
            return Renewal::Lost;
        };
        match limit {
            // Nothing is recorded for an unlimited key: nothing was lost.
            Limit::Unlimited => Renewal::Renewed(self.grant(limit, weight, expires_at_ms)),
            Limit::Limited(max) if !self.over(0, weight, max) => {
                self.add(
                    &req.id,
                    Lease {
                        weight,
                        expires_at_ms,
                    },
                );
                Renewal::Readded(self.grant(limit, weight, expires_at_ms))
            }
            Limit::Limited(_) => Renewal::Lost,
        }
    }

    pub(super) fn release(&mut self, id: &PermitId) -> bool {
        match self.leases.remove(id) {
            Some(lease) => {
                self.in_flight -= lease.weight;
                true
            }
            None => false,
        }
    }

    pub(super) fn status(&self, policy: Policy) -> KeyStatus {
        KeyStatus {
            limit: policy.resolve(self.override_limit),
            override_limit: self.override_limit,
            in_flight: self.in_flight,
        }
    }
}
