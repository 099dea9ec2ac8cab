//! A key's queue of waiters in the memory store, one for every limiter sharing the store: the twin of
//! `queue.lua`. Tickets are ordered by priority (higher first), then by their flow's round (each flow of
//! a level takes the next round it has not had, so flows are served in turn), then by arrival; an
//! admission takes a slot only when the tickets ahead of it leave room for it too. (`queue.lua` also keeps
//! a ticket given up as such for a while, against an ask of its waiter arriving after the leave; the
//! memory store's asks never do.)

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::hash::Hasher;
use crate::id::PermitId;
use crate::policy::ClassLimits;
use crate::store::Ticket;

/// The most tickets in one key's queue, and the most flows with a round there.
pub(crate) const MAX_TICKETS: usize = 10_000;
const MAX_FLOWS: usize = 1_000;

/// The most tickets an admission looks at, or a release calls, from the head.
const SCAN: u32 = 64;

/// Where a ticket stands: its level (higher first), its round, its arrival.
type Place = (Reverse<u8>, u64, u64);

struct Waiter {
    name: Arc<str>,
    weight: u32,
    expires_at_ms: u64,
    handoff: Option<HandOff>,
    flow: Arc<str>,
    since_ms: u64,
    holder: Option<Arc<str>>,
}

/// A waiter's admission, registered for a release to hand it the slot ([`Ticket::handoff`]; `queue.lua`'s
/// terms): its id, its lease and its key's class limits.
#[derive(Clone)]
pub(super) struct HandOff {
    pub(super) id: PermitId,
    pub(super) lease_ms: u64,
    pub(super) limits: ClassLimits,
    pub(super) holder: Option<Arc<str>>,
}

/// A ticket at the head: its name, level and weight, and its registered admission.
pub(super) type Head = (Arc<str>, u8, u32, Option<HandOff>);

/// One key's tickets.
#[derive(Default)]
pub(super) struct Queue {
    order: BTreeMap<Place, Waiter>,
    places: HashMap<Arc<str>, Place, Hasher>,
    /// Each flow's next round and the tickets it took in that round, by level and flow.
    flows: HashMap<(u8, Arc<str>), (u64, u32), Hasher>,
    /// The last round admitted, by level.
    served: HashMap<u8, u64, Hasher>,
    arrivals: u64,
    /// No ticket ends before this (a lower bound).
    next_expiry_ms: u64,
    /// The key's limit as the last ticket taken found it (for releases, which know none).
    pub(super) limit: u32,
}

impl Queue {
    pub(super) fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Removes the tickets whose lease ended by `now`; how many.
    pub(super) fn expire(&mut self, now: u64) -> u32 {
        if now < self.next_expiry_ms {
            return 0;
        }
        let (mut next, mut gone) = (u64::MAX, Vec::new());
        for waiter in self.order.values() {
            match waiter.expires_at_ms <= now {
                true => gone.push(waiter.name.clone()),
                false => next = next.min(waiter.expires_at_ms),
            }
        }
        for name in &gone {
            self.leave(name, false);
        }
        self.next_expiry_ms = next;
        gone.len() as u32
    }

    /// Whether an admission of `weight` by `ticket` (`None`: one without) fits in `free` slots behind
    /// the tickets ahead of it.
    /// Looks at most at the first [`SCAN`] tickets and `free`, as `queue.lua` does: a ticket further
    /// back waits for those ahead to be admitted and call the next.
    pub(super) fn in_turn(&self, free: u32, weight: u32, ticket: Option<&str>) -> bool {
        let scan = free.min(SCAN) as usize + 1;
        let (free, weight) = (u64::from(free), u64::from(weight));
        let (mut ahead, mut seen) = (0, 0);
        for waiter in self.order.values().take(scan) {
            seen += 1;
            if Some(&*waiter.name) == ticket {
                return ahead + weight <= free;
            }
            ahead += u64::from(waiter.weight);
            if ahead + weight > free {
                return false;
            }
        }
        seen < scan && ahead + weight <= free
    }

    /// Keeps `ticket`'s place for another lease from `now`, or gives it one at the end of its flow's
    /// next round; false when the queue (or its flows) are at their bound.
    pub(super) fn take(
        &mut self,
        ticket: &Ticket<'_>,
        (level, weight, limit): (u8, u32, u32),
        now: u64,
        (handoff, holder): (Option<HandOff>, Option<&str>),
    ) -> bool {
        let expires_at_ms = now.saturating_add(ticket.lease_ms);
        self.next_expiry_ms = self.next_expiry_ms.min(expires_at_ms);
        if let Some(place) = self.places.get(ticket.name) {
            // (Its registered admission as this ask has it, as queue.lua's: a new limit, floors; none
            // when the ask's weight is not its place's.)
            if let Some(waiter) = self.order.get_mut(place) {
                waiter.expires_at_ms = expires_at_ms;
                waiter.handoff = handoff.filter(|_| waiter.weight == weight);
            }
            return true;
        }
        let flow_name: Arc<str> = Arc::from(ticket.flow);
        let flow = (level, flow_name.clone());
        if !self.flows.contains_key(&flow) && self.flows.len() >= MAX_FLOWS {
            self.prune_flows();
        }
        if self.order.len() >= MAX_TICKETS
            || (!self.flows.contains_key(&flow) && self.flows.len() >= MAX_FLOWS)
        {
            return false;
        }
        // The first round of its level in which its flow has taken fewer tickets than its weight.
        let served = self.served.get(&level).copied().unwrap_or(0);
        let (next, used) = self.flows.entry(flow).or_insert((0, 0));
        let round = (*next).max(served);
        let taken = if round > *next { 1 } else { *used + 1 };
        (*next, *used) = match taken >= ticket.flow_weight {
            true => (round + 1, 0),
            false => (round, taken),
        };
        self.arrivals += 1;
        let place = (Reverse(level), round, self.arrivals);
        let name: Arc<str> = Arc::from(ticket.name);
        self.places.insert(name.clone(), place);
        self.limit = limit;
        let waiter = Waiter {
            name,
            weight,
            expires_at_ms,
            handoff,
            flow: flow_name,
            since_ms: now,
            holder: holder.map(Arc::from),
        };
        self.order.insert(place, waiter);
        true
    }

    /// At the bound of flows, as `queue.lua`'s `prune_flows`: forgets the flows whose next round is at
    /// most the one after the round their level serves; one that comes back starts at the served round,
    /// at most one turn more than its share, only while a key has this many flows.
    fn prune_flows(&mut self) {
        let served = &self.served;
        self.flows
            .retain(|(level, _), (next, _)| *next > served.get(level).copied().unwrap_or(0) + 1);
    }

    /// True when a ticket of `level` waits.
    pub(super) fn waiting_at(&self, level: u8) -> bool {
        let level = Reverse(level);
        self.order
            .range((level, 0, 0)..=(level, u64::MAX, u64::MAX))
            .next()
            .is_some()
    }

    /// `ticket` leaves (`admitted`, or given up); `Some(true)` when it was the head.
    pub(super) fn leave(&mut self, ticket: &str, admitted: bool) -> Option<bool> {
        let place = self.places.remove(ticket)?;
        let head = self.order.keys().next() == Some(&place);
        self.order.remove(&place);
        // Served: the level's round moves on to an admitted ticket's.
        let (Reverse(level), round, _) = place;
        if admitted {
            let served = self.served.entry(level).or_insert(0);
            *served = (*served).max(round);
        }
        if self.order.is_empty() {
            self.flows.clear();
            self.served.clear();
        }
        Some(head)
    }

    /// The tickets in queue order, as [`Holders::permits`](crate::store::Holders::permits) lists them.
    pub(super) fn waiters(&self) -> impl Iterator<Item = crate::store::Waiter> + '_ {
        self.order
            .iter()
            .map(|((Reverse(level), _, _), waiter)| crate::store::Waiter {
                ticket: waiter.name.clone(),
                priority: *level,
                flow: waiter.flow.clone(),
                weight: waiter.weight,
                waiting_since_ms: waiter.since_ms,
                holder: waiter.holder.clone(),
            })
    }

    /// The tickets at the head that fit in `room` slots (the head's at least): whose turn it is.
    pub(super) fn head(&self, room: u32) -> Vec<Head> {
        let mut used = 0u64;
        let mut head = Vec::new();
        for ((Reverse(level), _, _), waiter) in self.order.iter().take(room.clamp(1, SCAN) as usize)
        {
            used += u64::from(waiter.weight);
            if !head.is_empty() && used > u64::from(room) {
                break;
            }
            let (name, handoff) = (waiter.name.clone(), waiter.handoff.clone());
            head.push((name, *level, waiter.weight, handoff));
        }
        head
    }
}
