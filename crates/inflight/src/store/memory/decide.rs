//! [`Store`] for [`MemoryStore`]: each decision made under the locks of its keys' cells
//! (`MemoryStore::locked`), so that it is atomic.

use std::future::{ready, Future};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::cell::{admit, grant, Cells, Slot};
use super::key::Lease;
use super::queue::{HandOff, MAX_TICKETS};
use super::MemoryStore;
use crate::clock::{millis, Clock};
use crate::error::StoreError;
use crate::id::PermitId;
use crate::options::DEFAULT_LEASE;
use crate::policy::{ClassLimits, Limit};
use crate::store::{
    AcquireRequest, Admission, IndexOp, KeyStatus, LocalAdmission, LocalSlots, OverrideChange,
    Recorded, RenewRequest, Renewal, Store,
};

impl<C: Clock> MemoryStore<C> {
    fn acquire_now(&self, req: AcquireRequest<'_>) -> Result<Admission, StoreError> {
        if self.all_unlimited(req.limits) {
            return Ok(Admission::Unlimited);
        }
        let mut called = Vec::new();
        let decided = self.locked(req.keys, true, true, |slots, now, reclaimed| {
            let ticket = req.ticket.as_ref();
            let asked = (Some(req.id), ticket.map(|ticket| ticket.name), req.priority);
            let classes = (req.limits, req.floors, req.shadow);
            let (first, shadowed) =
                match (admit(slots, classes, asked, req.weight, reclaimed), ticket) {
                    (Ok(first), _) => first,
                    (
                        Err(Admission::Full {
                            index,
                            limit,
                            in_flight,
                            reclaimed,
                        }),
                        Some(ticket),
                    ) => {
                        // A waiter keeps (or takes) its place in the queue of the key that refused it,
                        // and leaves any other's.
                        for slot in slots.iter_mut().filter(|slot| slot.index != index) {
                            if slot.state.leave_ticket(ticket.name, false) == Some(true) {
                                called.extend(slot.state.called(1));
                            }
                        }
                        // One key and no floors: a release may hand it the slot (`Ticket::handoff`).
                        let handoff = (ticket.handoff && req.keys.len() == 1)
                            .then(|| req.floors.iter().all(|floors| floors.is_empty()))
                            .filter(|none| *none)
                            .map(|_| HandOff {
                                id: req.id.clone(),
                                // (For as long as its ticket would have lasted: its waiter renews it.)
                                lease_ms: req.lease_ms.min(ticket.lease_ms),
                                limits: req.limits[0],
                                holder: req.holder.map(Arc::from),
                            });
                        let terms = (req.priority, req.weight, limit);
                        let refusing = slots.iter_mut().find(|slot| slot.index == index);
                        if !refusing.is_some_and(|slot| {
                            slot.state
                                .take_ticket(ticket, terms, now, (handoff, req.holder))
                        }) {
                            let max = MAX_TICKETS as u32;
                            return Err(StoreError::TooManyWaiters { max });
                        }
                        return Ok(Admission::Queued {
                            index,
                            limit,
                            in_flight,
                            reclaimed,
                        });
                    }
                    (Err(refused), _) => return Ok(refused),
                };
            let lease = Lease {
                weight: req.weight,
                expires_at_ms: now.saturating_add(req.lease_ms),
                lease_ms: req.lease_ms,
                token: self.inner.time.token(now),
                level: req.priority,
                admitted_at_ms: now,
            };
            let mut counted = 0;
            for slot in slots.iter_mut() {
                if slot.state.limit(req.limits[slot.index]) != Limit::Unlimited {
                    slot.state.add(req.id, lease);
                    slot.state.label(req.id, req.holder);
                    counted |= 1 << slot.index;
                }
            }
            let mut grant = grant(slots, first, req.weight, (lease.expires_at_ms, lease.token));
            grant.counted = counted;
            // Admitted: the ticket leaves, and the next in line hear their turn if there is room.
            for slot in slots.iter_mut().filter(|_| ticket.is_some()) {
                let name = ticket.map_or("", |ticket| ticket.name);
                if slot.state.leave_ticket(name, true) == Some(true) {
                    called.extend(slot.state.called(slot.state.room(req.limits[slot.index])));
                }
            }
            Ok(Admission::Admitted {
                grant,
                reclaimed,
                shadowed,
            })
        });
        self.inner.wakes.wake_tickets(&called);
        decided
    }

    /// [`Store::release`], at once.
    pub(super) fn release_now(&self, keys: &[Arc<str>], id: &PermitId, token: u64) -> bool {
        let mut called = Vec::new();
        let time = &self.inner.time;
        let released = self.locked(keys, false, false, |slots, now, _| {
            let mut released = false;
            for slot in slots.iter_mut() {
                let weight = slot.state.lease(id).map_or(0, |lease| lease.weight);
                if slot.state.release(id, token) {
                    released = true;
                    let token = || time.token(now);
                    called.extend(slot.state.called_after_release(weight, now, token));
                }
            }
            released
        });
        self.inner.wakes.wake_tickets(&called);
        released
    }

    fn renew_one(&self, req: &RenewRequest) -> Renewal {
        let mut called = Vec::new();
        let time = &self.inner.time;
        let renewal = self.locked(&req.keys, true, true, |slots, now, _| {
            let limits = |slot: &Slot<'_, C>| req.limits[slot.index];
            let limited = |slot: &Slot<'_, C>| slot.state.limit(limits(slot)) != Limit::Unlimited;
            let found = slots.iter().find_map(|slot| slot.state.lease(&req.id));
            // Taken over by a later admission of the id: not this one's to renew.
            if found.is_some_and(|lease| req.token != 0 && lease.token != req.token) {
                return Renewal::Lost;
            }
            // Revoked on a key: lost, never added back, and its lease goes from the others too (as
            // renew.lua does).
            let mut revoked = false;
            for slot in slots.iter_mut() {
                if slot.state.lease(&req.id).is_none() {
                    revoked |= slot.state.was_revoked(&req.id, now);
                }
            }
            if revoked {
                for slot in slots.iter_mut() {
                    let weight = slot.state.lease(&req.id).map_or(0, |lease| lease.weight);
                    if slot.state.release(&req.id, 0) {
                        let token = || time.token(now);
                        called.extend(slot.state.called_after_release(weight, now, token));
                    }
                }
                return Renewal::Lost;
            }
            let token = match found {
                Some(lease) => lease.token,
                None if req.token != 0 => req.token,
                None => self.inner.time.token(now),
            };
            let missing = slots
                .iter()
                .any(|slot| limited(slot) && slot.state.lease(&req.id).is_none());
            let lease_ms = req
                .lease_ms
                .or(found.map(|lease| lease.lease_ms))
                .unwrap_or(millis(DEFAULT_LEASE));
            let mut weight = found.map_or(1, |lease| lease.weight);
            // Gone, with no room, from a key that recorded it at admission while held on others.
            let lapsed = found.is_some()
                && slots.iter().any(|slot| {
                    req.counted >> slot.index & 1 == 1
                        && slot.state.lease(&req.id).is_none()
                        && slot.state.check(limits(slot), None, weight).is_err()
                });
            if lapsed {
                return Renewal::Lost;
            }
            // Held on no key: gone, unless asked to re-add it and every limited key has room. Held, but
            // not on a key that has become limited since: taken there where it fits (below).
            let readded = match (found.is_some(), missing, req.readd_weight) {
                (_, false, _) | (true, true, _) => false,
                (false, true, None) => return Renewal::Lost,
                (false, true, Some(readd)) => {
                    let room = slots.iter().all(|slot| {
                        slot.state.lease(&req.id).is_some()
                            || slot.state.check(limits(slot), None, readd).is_ok()
                    });
                    if !room {
                        return Renewal::Lost;
                    }
                    weight = readd;
                    true
                }
            };
            let expires_at_ms = now.saturating_add(lease_ms);
            for slot in slots.iter_mut() {
                if slot.state.extend(&req.id, now, Some(lease_ms)).is_none()
                    && limited(slot)
                    && (readded || slot.state.check(limits(slot), None, weight).is_ok())
                {
                    let lease = Lease {
                        weight,
                        expires_at_ms,
                        lease_ms,
                        token,
                        level: 0,
                        admitted_at_ms: now,
                    };
                    slot.state.add(&req.id, lease);
                }
            }
            let first = slots.first().map_or(req.limits[0].resolve(None), |slot| {
                slot.state.limit(limits(slot))
            });
            let grant = grant(slots, first, weight, (expires_at_ms, token));
            if readded {
                Renewal::Readded(grant)
            } else {
                Renewal::Renewed(grant)
            }
        });
        self.inner.wakes.wake_tickets(&called);
        renewal
    }

    fn status_now(
        &self,
        key: &str,
        limits: ClassLimits,
        change: OverrideChange,
    ) -> Result<KeyStatus, StoreError> {
        let limit = match change {
            OverrideChange::Keep => None,
            OverrideChange::Set(n) => Some(Some(n)),
            OverrideChange::Clear => Some(None),
        };
        let create = matches!(limit, Some(Some(1..)));
        let status = self.locked(&[key], create, false, |slots, _, _| {
            let Some(slot) = slots.first_mut() else {
                return Ok(KeyStatus {
                    limit: limits.resolve(None),
                    override_limit: None,
                    in_flight: 0,
                });
            };
            if let Some(limit) = limit {
                let limit = limit.filter(|n| *n > 0);
                match (slot.state.override_limit.is_some(), limit.is_some()) {
                    (false, true) => {
                        let max = self.inner.max_overrides.load(Ordering::Relaxed);
                        let counted = self.inner.overrides.fetch_update(
                            Ordering::SeqCst,
                            Ordering::SeqCst,
                            |n| (max == 0 || n < max).then_some(n + 1),
                        );
                        if counted.is_err() {
                            return Err(StoreError::TooManyOverrides { max });
                        }
                    }
                    (true, false) => drop(self.inner.overrides.fetch_sub(1, Ordering::SeqCst)),
                    _ => {}
                }
                slot.state.override_limit = limit;
            }
            Ok(slot.state.status(limits))
        });
        // A new limit may admit waiters at once: they ask again, as after a release.
        if limit.is_some() && status.is_ok() {
            let called = self.locked(&[key], false, false, |slots, _, _| {
                slots
                    .first()
                    .map_or_else(Vec::new, |slot| slot.state.called(slot.state.room(limits)))
            });
            self.inner.wakes.wake_tickets(&called);
        }
        status
    }
}

impl<C: Clock> Store for MemoryStore<C> {
    fn acquire(
        &self,
        req: AcquireRequest<'_>,
    ) -> impl Future<Output = Result<Admission, StoreError>> + Send {
        ready(self.acquire_now(req))
    }

    fn release(
        &self,
        keys: &[Arc<str>],
        id: &PermitId,
        token: u64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        ready(Ok(self.release_now(keys, id, token)))
    }

    fn renew(
        &self,
        batch: &[RenewRequest],
    ) -> impl Future<Output = Result<Vec<Renewal>, StoreError>> + Send {
        ready(Ok(batch.iter().map(|req| self.renew_one(req)).collect()))
    }

    fn status(
        &self,
        key: &str,
        limits: ClassLimits,
        change: OverrideChange,
    ) -> impl Future<Output = Result<KeyStatus, StoreError>> + Send {
        ready(self.status_now(key, limits, change))
    }

    #[inline]
    fn hold(
        &self,
        keys: &[&str],
        limits: &[ClassLimits],
        weight: u32,
        given_id: bool,
    ) -> Option<LocalAdmission> {
        if self.all_unlimited(limits) {
            return Some(LocalAdmission::Decided(Admission::Unlimited));
        }
        if given_id {
            return None;
        }
        if let [key] = keys {
            // One key (limited, or `admit` says unlimited): the permit holds the very reference to its
            // cell found here, not one more.
            let cell = self.made_cell(key);
            let decided = {
                let mut state = cell.lock();
                let mut slots = [Slot {
                    index: 0,
                    cell: &cell,
                    state: &mut state,
                }];
                let (now, reclaimed) = self.prepare(&mut slots, false);
                admit(&slots, (limits, &[], 0), (None, None, 0), weight, reclaimed).map(
                    |(first, _)| {
                        slots[0].state.in_flight += weight;
                        let token = self.inner.time.token(now);
                        (grant(&slots, first, weight, (0, token)), reclaimed)
                    },
                )
            };
            return Some(match decided {
                Ok((grant, reclaimed)) => LocalAdmission::Taken {
                    slots: cell,
                    grant,
                    reclaimed,
                },
                Err(refused) => LocalAdmission::Decided(refused),
            });
        }
        Some(self.locked(keys, true, false, |slots, now, reclaimed| {
            let first = match admit(slots, (limits, &[], 0), (None, None, 0), weight, reclaimed) {
                Ok((first, _)) => first,
                Err(refused) => return LocalAdmission::Decided(refused),
            };
            let mut cells = Vec::with_capacity(slots.len());
            for slot in slots.iter_mut() {
                if slot.state.limit(limits[slot.index]) != Limit::Unlimited {
                    slot.state.in_flight += weight;
                    cells.push(slot.cell.clone());
                }
            }
            let (first_key, time) = (slots[0].cell.key.clone(), self.inner.time.clone());
            let taken: Arc<dyn LocalSlots> = Arc::new(Cells {
                first: first_key,
                cells,
                time,
            });
            LocalAdmission::Taken {
                slots: taken,
                grant: grant(slots, first, weight, (0, self.inner.time.token(now))),
                reclaimed,
            }
        }))
    }

    fn index(
        &self,
        id: &PermitId,
        op: IndexOp<'_>,
    ) -> impl Future<Output = Result<Option<Recorded>, StoreError>> + Send {
        ready(self.inner.index.apply(id, op, self.inner.time.now_ms()))
    }

    fn maintain(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.maintain_now();
        ready(Ok(()))
    }
}
