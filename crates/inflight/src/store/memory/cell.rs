//! The cells of the memory store's keys, what in-process permits hold on to, and the rule a decision
//! over several of them applies.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::key::{KeyState, Lease, Refusal};
use crate::clock::Clock;
use crate::floors::Floors;
use crate::id::PermitId;
use crate::policy::{ClassLimits, Limit};
use crate::store::wake::Wakes;
use crate::store::{Admission, Grant, LocalSlots};

/// The store's clock, its last reading for the paths that need only a rough time, and the last token.
pub(super) struct Time<C> {
    pub(super) clock: C,
    pub(super) coarse_ms: AtomicU64,
    /// One sequence for every key of the store, so that each key's tokens grow however often the key
    /// is forgotten while idle.
    pub(super) last_token: AtomicU64,
}

impl<C: Clock> Time<C> {
    pub(super) fn now_ms(&self) -> u64 {
        let now = self.clock.now_ms();
        self.coarse_ms.store(now, Ordering::Relaxed);
        now
    }

    pub(super) fn coarse_ms(&self) -> u64 {
        self.coarse_ms.load(Ordering::Relaxed)
    }
}

impl<C> Time<C> {
    /// The next token: the clock in microseconds (`now_ms` in thousands), or the last token + 1.
    pub(super) fn token(&self, now_ms: u64) -> u64 {
        let next = |last: u64| (last + 1).max(now_ms.saturating_mul(1000));
        let last = self
            .last_token
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |last| Some(next(last)));
        next(last.unwrap_or_else(|last| last))
    }
}

/// One key: what in-process permits hold on to.
pub(super) struct Cell<C> {
    pub(super) key: Arc<str>,
    pub(super) state: Mutex<KeyState>,
    pub(super) time: Arc<Time<C>>,
    /// Wakes the tickets a slot given back calls.
    pub(super) wakes: Arc<Wakes>,
}

impl<C> Cell<C> {
    pub(super) fn lock(&self) -> MutexGuard<'_, KeyState> {
        // The state is consistent between statements that cannot panic, so a poisoned lock is usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<C: Clock> Cell<C> {
    /// Turns `weight` held slots into a lease; the in-flight count does not change.
    fn lease_hold(&self, id: &PermitId, weight: u32, lease: (u64, u64), token: u64) {
        let (lease_ms, expires_at_ms) = lease;
        let mut state = self.lock();
        state.in_flight -= weight;
        let lease = Lease {
            weight,
            expires_at_ms,
            lease_ms,
            token,
            level: 0,
            admitted_at_ms: expires_at_ms.saturating_sub(lease_ms),
        };
        state.add(id, lease);
    }
}

impl<C: Clock> LocalSlots for Cell<C> {
    fn key(&self) -> &str {
        &self.key
    }

    fn give_back(&self, weight: u32) {
        let called = {
            let mut state = self.lock();
            state.in_flight -= weight;
            state.last_used_ms = self.time.coarse_ms();
            // Only a key with waiters' tickets has any to call (and reads the clock: a release without
            // them is on the hot path).
            let time = &self.time;
            state.has_tickets().then(|| {
                let now = time.now_ms();
                // (A dead head is not handed the slot, as in queue.lua.)
                let expired = state.expire_tickets(now);
                (
                    expired,
                    state.called_after_release(weight, now, || time.token(now)),
                )
            })
        };
        if let Some((expired, called)) = called {
            self.wakes.count_expired(i64::from(expired));
            self.wakes.wake_tickets(&called);
        }
    }

    fn hand_off(&self, id: &PermitId, weight: u32, lease_ms: u64, token: u64) -> u64 {
        let expires_at_ms = self.time.now_ms().saturating_add(lease_ms);
        self.lease_hold(id, weight, (lease_ms, expires_at_ms), token);
        expires_at_ms
    }
}

/// The held cells of a permit on several keys (only the limited ones hold anything).
pub(super) struct Cells<C> {
    pub(super) first: Arc<str>,
    pub(super) cells: Vec<Arc<Cell<C>>>,
    pub(super) time: Arc<Time<C>>,
}

impl<C: Clock> LocalSlots for Cells<C> {
    fn key(&self) -> &str {
        &self.first
    }

    fn give_back(&self, weight: u32) {
        self.cells.iter().for_each(|cell| cell.give_back(weight));
    }

    fn hand_off(&self, id: &PermitId, weight: u32, lease_ms: u64, token: u64) -> u64 {
        let expires_at_ms = self.time.now_ms().saturating_add(lease_ms);
        for cell in &self.cells {
            cell.lease_hold(id, weight, (lease_ms, expires_at_ms), token);
        }
        expires_at_ms
    }
}

/// One locked key of a decision: its place among the request's keys, its cell and its state.
pub(super) struct Slot<'a, C> {
    pub(super) index: usize,
    pub(super) cell: &'a Arc<Cell<C>>,
    pub(super) state: &'a mut KeyState,
}

/// Checks every key of a decision (`id`: the lease's, `None` for a hold; `ticket`: a waiter's, `None`
/// for a request that must not pass the keys' queues; its priority level and the keys' floors, none
/// for a hold; `shadow`: the keys whose limits are watched, not enforced); the first key's limit and
/// the shadow keys it goes past when all have room, else the refusal of the first key, in the request's
/// order, that refuses.
#[inline(always)] // into each decision: a hold with no floors, ticket or shadow folds their checks away
pub(super) fn admit<C>(
    slots: &[Slot<'_, C>],
    (limits, floors, shadow): (&[ClassLimits], &[Floors], u32),
    asked: (Option<&PermitId>, Option<&str>, u8),
    weight: u32,
    reclaimed: u32,
) -> Result<(Limit, u32), Admission> {
    let (id, ticket, level) = asked;
    let (mut limited, mut first, mut shadowed) = (false, Limit::Unlimited, 0);
    for (n, slot) in slots.iter().enumerate() {
        let floors = floors.get(slot.index).unwrap_or(&Floors::NONE);
        if shadow >> slot.index & 1 == 1 {
            // Watched: counted where limited, never refused (nor queued behind waiters).
            let limit = slot.state.limit(limits[slot.index]);
            if slot.state.check(limits[slot.index], id, weight).is_err() {
                shadowed |= 1 << slot.index;
            }
            limited |= limit != Limit::Unlimited;
            if n == 0 {
                first = limit;
            }
            continue;
        }
        match slot.state.check(limits[slot.index], id, weight) {
            Ok(Limit::Limited(max))
                if slot
                    .state
                    .behind(max, (id, ticket), weight, (level, floors)) =>
            {
                return Err(Admission::Full {
                    index: slot.index,
                    limit: max,
                    in_flight: slot.state.in_flight,
                    reclaimed,
                })
            }
            Ok(limit) => {
                limited |= limit != Limit::Unlimited;
                if n == 0 {
                    first = limit;
                }
            }
            Err(Refusal::Full { limit, in_flight }) => {
                return Err(Admission::Full {
                    index: slot.index,
                    limit,
                    in_flight,
                    reclaimed,
                })
            }
            Err(Refusal::TooHeavy { limit }) => {
                return Err(Admission::TooHeavy {
                    index: slot.index,
                    limit,
                })
            }
        }
    }
    if !limited {
        return Err(Admission::Unlimited);
    }
    Ok((first, shadowed))
}

/// The grant as the first key sees it (an unlimited key records nothing: 0 in flight).
#[inline]
pub(super) fn grant<C>(
    slots: &[Slot<'_, C>],
    limit: Limit,
    weight: u32,
    lease: (u64, u64),
) -> Grant {
    let (expires_at_ms, token) = lease;
    let in_flight = match (limit, slots.first()) {
        (Limit::Limited(_), Some(slot)) => slot.state.in_flight,
        _ => 0,
    };
    Grant {
        limit,
        in_flight,
        weight,
        expires_at_ms,
        token,
        counted: 0,
    }
}
