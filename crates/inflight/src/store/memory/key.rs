//! One key's state and the rules the memory store applies to it.

use std::collections::HashMap;
use std::sync::Arc;

use super::hash::Hasher;
use super::queue::{HandOff, Queue};
use crate::floors::Floors;
use crate::id::PermitId;
use crate::policy::{ClassLimits, Limit};
use crate::store::{Handed, KeyStatus, Ticket};

/// A key's leases, its in-process holds and its override.
#[derive(Default)]
pub(super) struct KeyState {
    leases: HashMap<PermitId, Lease, Hasher>,
    /// The weight of every lease plus that of the permits of this process that have no lease.
    pub(super) in_flight: u32,
    pub(super) override_limit: Option<u32>,
    /// No lease ends before this (a lower bound): reclaiming can be skipped until then.
    next_expiry_ms: u64,
    pub(super) last_used_ms: u64,
    /// Its waiters' tickets, while it has any.
    queue: Option<Box<Queue>>,
    /// The labels of its leases that were given one.
    pub(super) labels: HashMap<PermitId, Arc<str>, Hasher>,
    /// Revoked leases, until their holders can no longer renew them: id -> when it is forgotten.
    pub(super) revoked: HashMap<PermitId, u64, Hasher>,
}

/// One lease: its weight, deadline, length (what a renewal without a length keeps) and its admission's
/// token.
#[derive(Clone, Copy)]
pub(super) struct Lease {
    pub(super) weight: u32,
    pub(super) expires_at_ms: u64,
    pub(super) lease_ms: u64,
    pub(super) token: u64,
    /// The priority level it was admitted at (for floors).
    pub(super) level: u8,
    /// When it was admitted (kept by renewals and re-admissions of its id).
    pub(super) admitted_at_ms: u64,
}

/// Why a key refuses an admission.
pub(super) enum Refusal {
    Full { limit: u32, in_flight: u32 },
    TooHeavy { limit: u32 },
}

impl KeyState {
    /// True when nothing is held and no override is set: the key can be forgotten.
    pub(super) fn is_idle(&self) -> bool {
        self.in_flight == 0
            && self.override_limit.is_none()
            && self.queue.is_none()
            && self.revoked.is_empty()
    }

    /// True when waiters' tickets queue on the key.
    pub(super) fn has_tickets(&self) -> bool {
        self.queue.is_some()
    }

    pub(super) fn has_leases_or_tickets(&self) -> bool {
        !self.leases.is_empty() || self.queue.is_some()
    }

    /// Drops leases whose deadline has passed; returns how many.
    /// Drops the tickets whose lease has ended (their waiters' processes stopped renewing them);
    /// returns how many.
    #[inline]
    pub(super) fn expire_tickets(&mut self, now: u64) -> u32 {
        match self.queue.is_some() {
            true => self.expire_queued(now),
            false => 0,
        }
    }

    /// [`KeyState::expire_tickets`] for a key with a queue: out of line, so that an admission on a key
    /// without waiters carries none of it.
    #[inline(never)]
    fn expire_queued(&mut self, now: u64) -> u32 {
        let Some(queue) = &mut self.queue else {
            return 0;
        };
        let expired = queue.expire(now);
        if queue.is_empty() {
            self.queue = None;
        }
        expired
    }

    #[inline]
    pub(super) fn reclaim(&mut self, now: u64) -> u32 {
        if !self.revoked.is_empty() {
            self.revoked.retain(|_, until| *until > now);
        }
        if now < self.next_expiry_ms || self.leases.is_empty() {
            return 0;
        }
        let (mut reclaimed, mut next) = (0, u64::MAX);
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
        if reclaimed > 0 && !self.labels.is_empty() {
            let leases = &self.leases;
            self.labels.retain(|id, _| leases.contains_key(id));
        }
        reclaimed
    }

    /// The in-flight count without the leases that have expired by `now` (nothing is reclaimed).
    pub(super) fn live(&self, now: u64) -> u32 {
        if now < self.next_expiry_ms {
            return self.in_flight;
        }
        let expired: u32 = self
            .leases
            .values()
            .filter(|lease| lease.expires_at_ms <= now)
            .map(|lease| lease.weight)
            .sum();
        self.in_flight - expired
    }

    pub(super) fn limit(&self, limits: ClassLimits) -> Limit {
        limits.resolve(self.override_limit)
    }

    pub(super) fn lease(&self, id: &PermitId) -> Option<Lease> {
        self.leases.get(id).copied()
    }

    /// Whether `weight` more for `id` (a new hold when `None`) fits; a retried acquisition of a held id
    /// never needs more room than it already has.
    #[inline]
    pub(super) fn check(
        &self,
        limits: ClassLimits,
        id: Option<&PermitId>,
        weight: u32,
    ) -> Result<Limit, Refusal> {
        let limit = self.limit(limits);
        let Limit::Limited(max) = limit else {
            return Ok(limit);
        };
        if weight > max {
            return Err(Refusal::TooHeavy { limit: max });
        }
        let held = id
            .and_then(|id| self.leases.get(id))
            .map_or(0, |l| l.weight);
        // In u64: weights may be as large as the limit.
        if weight > held && u64::from(self.in_flight - held) + u64::from(weight) > u64::from(max) {
            return Err(Refusal::Full {
                limit: max,
                in_flight: self.in_flight,
            });
        }
        Ok(limit)
    }

    /// Whether `weight` more by `ticket` (`None`: a request without one, behind every waiter) at
    /// priority `level` does not fit under `max`: behind the tickets ahead of it in the key's queue, or
    /// into the slots `floors` keep for higher levels (as `queue.lua`'s `acquire` decides); a retried
    /// acquisition of a held id never needs more room than it already has.
    #[inline]
    pub(super) fn behind(
        &self,
        max: u32,
        (id, ticket): (Option<&PermitId>, Option<&str>),
        weight: u32,
        (level, floors): (u8, &Floors),
    ) -> bool {
        if self.queue.is_none() && floors.is_empty() {
            return false;
        }
        self.behind_queued(max, (id, ticket), weight, (level, floors))
    }

    /// [`KeyState::behind`] for a key with a queue or floors: out of line, so that an admission on a
    /// key with neither carries none of it.
    #[inline(never)]
    fn behind_queued(
        &self,
        max: u32,
        (id, ticket): (Option<&PermitId>, Option<&str>),
        weight: u32,
        (level, floors): (u8, &Floors),
    ) -> bool {
        let reserve = match floors.is_empty() {
            true => 0,
            false => floors.reserved(level, |l| self.held_at(l), |l| self.waiting_at(l)),
        };
        let count = u64::from(self.in_flight);
        let (max, weight64, reserve) = (u64::from(max), u64::from(weight), u64::from(reserve));
        let over = count + weight64 + reserve > max;
        let behind = !over
            && self
                .queue
                .as_ref()
                .is_some_and(|queue| !queue.in_turn((max - count) as u32, weight, ticket));
        if !over && !behind {
            return false;
        }
        let held = id
            .and_then(|id| self.leases.get(id))
            .map_or(0, |l| u64::from(l.weight));
        weight64 > held && (behind || count - held + weight64 + reserve > max)
    }

    /// The weight of the live leases admitted at `level`.
    fn held_at(&self, level: u8) -> u32 {
        self.leases
            .values()
            .filter(|lease| lease.level == level)
            .map(|lease| lease.weight)
            .sum()
    }

    /// True when a ticket of `level` waits on the key.
    fn waiting_at(&self, level: u8) -> bool {
        self.queue
            .as_ref()
            .is_some_and(|queue| queue.waiting_at(level))
    }

    /// Keeps (or takes) `ticket`'s place in the key's queue, with the admission a release may hand the
    /// slot to; false at the queue's bound.
    pub(super) fn take_ticket(
        &mut self,
        ticket: &Ticket<'_>,
        (level, weight, limit): (u8, u32, u32),
        now: u64,
        handoff: (Option<HandOff>, Option<&str>),
    ) -> bool {
        self.queue.get_or_insert_with(Box::default).take(
            ticket,
            (level, weight, limit),
            now,
            handoff,
        )
    }

    /// After `weight` was given back: the tickets at the head that fit in the slots free under the limit
    /// the waiters last met (at least `weight`), as `queue.lua`'s `call_after_release`: the front ones
    /// that registered their admission are handed the slot (their lease added here, with a token of
    /// `token`'s), up to the first that did not, which is called with those behind it.
    pub(super) fn called_after_release(
        &mut self,
        weight: u32,
        now: u64,
        token: impl Fn() -> u64,
    ) -> Vec<(Arc<str>, Option<Handed>)> {
        let Some(queue) = &self.queue else {
            return Vec::new();
        };
        let head = queue.head(queue.limit.saturating_sub(self.in_flight).max(weight));
        let mut hand = true;
        let mut called = Vec::with_capacity(head.len());
        for (name, level, weight, handoff) in head {
            let handed = match (hand, handoff) {
                (true, Some(handoff)) => {
                    self.hand_off(&name, (level, weight), &handoff, now, &token)
                }
                _ => None,
            };
            hand = handed.is_some();
            called.push((name, handed));
        }
        called
    }

    /// Hands `ticket` the slot, as `queue.lua`'s `hand_off`: unless its limit leaves no room for it.
    fn hand_off(
        &mut self,
        ticket: &str,
        (level, weight): (u8, u32),
        handoff: &HandOff,
        now: u64,
        token: impl Fn() -> u64,
    ) -> Option<Handed> {
        let Limit::Limited(max) = self.limit(handoff.limits) else {
            return None;
        };
        if u64::from(self.in_flight) + u64::from(weight) > u64::from(max) {
            return None;
        }
        let lease = Lease {
            weight,
            expires_at_ms: now.saturating_add(handoff.lease_ms),
            lease_ms: handoff.lease_ms,
            token: token(),
            level,
            admitted_at_ms: now,
        };
        self.add(&handoff.id, lease);
        self.label(&handoff.id, handoff.holder.as_deref());
        self.leave_ticket(ticket, true);
        Some(Handed {
            token: lease.token,
            expires_at_ms: lease.expires_at_ms,
            limit: max,
            in_flight: self.in_flight,
        })
    }

    /// `ticket` leaves the key's queue (`admitted`, or given up); `Some(true)` when it was the head.
    pub(super) fn leave_ticket(&mut self, ticket: &str, admitted: bool) -> Option<bool> {
        let queue = self.queue.as_mut()?;
        let left = queue.leave(ticket, admitted);
        if queue.is_empty() {
            self.queue = None;
        }
        left
    }

    /// The tickets whose turn it is when `room` slots are free (none without a queue).
    pub(super) fn called(&self, room: u32) -> Vec<(Arc<str>, Option<Handed>)> {
        match &self.queue {
            Some(queue) if room > 0 => queue.head(room).into_iter().map(|h| (h.0, None)).collect(),
            _ => Vec::new(),
        }
    }

    /// The room under the key's limit now (0 when unlimited: no queue there).
    pub(super) fn room(&self, limits: ClassLimits) -> u32 {
        match self.limit(limits) {
            Limit::Limited(max) => max.saturating_sub(self.in_flight),
            Limit::Unlimited => 0,
        }
    }

    /// Adds (or replaces) the lease of `id`.
    pub(super) fn add(&mut self, id: &PermitId, lease: Lease) {
        self.next_expiry_ms = self.next_expiry_ms.min(lease.expires_at_ms);
        // The old weight leaves before the new one comes: the sum never passes the limit, so no overflow.
        if let Some(old) = self.leases.insert(id.clone(), lease) {
            self.in_flight -= old.weight;
        }
        self.in_flight += lease.weight;
        if !self.revoked.is_empty() {
            self.revoked.remove(id);
        }
    }

    /// Labels the lease of `id` (`None`: no label).
    pub(super) fn label(&mut self, id: &PermitId, holder: Option<&str>) {
        match holder {
            Some(holder) => drop(self.labels.insert(id.clone(), holder.into())),
            None if !self.labels.is_empty() => drop(self.labels.remove(id)),
            None => {}
        }
    }

    /// Takes the lease of `id` away, whatever its token, and remembers it as revoked until
    /// `forget_at_ms`; whether it was held.
    pub(super) fn revoke(&mut self, id: &PermitId, now: u64, forget_at_ms: u64) -> bool {
        let Some(lease) = self.leases.remove(id) else {
            return false;
        };
        self.in_flight -= lease.weight;
        self.labels.remove(id);
        self.revoked.retain(|_, until| *until > now);
        // (Bounded: at most one entry per lease revoked within the last lease and grace.)
        self.revoked.insert(id.clone(), forget_at_ms);
        true
    }

    /// Whether `id`'s lease was revoked (and is still remembered as such); forgets it if so.
    pub(super) fn was_revoked(&mut self, id: &PermitId, now: u64) -> bool {
        if self.revoked.is_empty() {
            return false;
        }
        self.revoked.retain(|_, until| *until > now);
        self.revoked.remove(id).is_some()
    }

    /// The key's leases, unexpired at `now`.
    pub(super) fn leases(&self, now: u64) -> impl Iterator<Item = (&PermitId, &Lease)> {
        self.leases
            .iter()
            .filter(move |(_, lease)| lease.expires_at_ms > now)
    }

    /// The key's queue, if it has one.
    pub(super) fn queue(&self) -> Option<&Queue> {
        self.queue.as_deref()
    }

    /// The slots held without a lease (this process's fast-path permits).
    pub(super) fn unleased(&self) -> u32 {
        self.in_flight - self.leases.values().map(|lease| lease.weight).sum::<u32>()
    }

    /// Moves the deadline of a held lease; returns it as it now is.
    pub(super) fn extend(
        &mut self,
        id: &PermitId,
        now: u64,
        lease_ms: Option<u64>,
    ) -> Option<Lease> {
        let lease = self.leases.get_mut(id)?;
        lease.lease_ms = lease_ms.unwrap_or(lease.lease_ms);
        lease.expires_at_ms = now.saturating_add(lease.lease_ms);
        // A renewal may shorten the lease: keep the bound a lower bound.
        self.next_expiry_ms = self.next_expiry_ms.min(lease.expires_at_ms);
        Some(*lease)
    }

    /// Removes the lease of `id`, unless a later admission took it over (another `token`; 0: any).
    pub(super) fn release(&mut self, id: &PermitId, token: u64) -> bool {
        match self.leases.get(id) {
            Some(lease) if token == 0 || lease.token == token => {
                self.in_flight -= lease.weight;
                self.leases.remove(id);
                if !self.labels.is_empty() {
                    self.labels.remove(id);
                }
                true
            }
            _ => false,
        }
    }

    pub(super) fn status(&self, limits: ClassLimits) -> KeyStatus {
        KeyStatus {
            limit: self.limit(limits),
            override_limit: self.override_limit,
            in_flight: self.in_flight,
        }
    }
}
