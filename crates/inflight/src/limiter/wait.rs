//! Waiting for a slot: [`Limiter::acquire`] and [`Limiter::acquire_all`]. A waiter takes a ticket in
//! the store's queue of the key that refuses it, one queue for every process sharing the store; the store
//! calls its turn when room is made for it, and it asks again then (or, in case a turn was lost, after
//! [`RECHECK`]). A store that keeps no queues has its waiters ask again every [`POLL`] at most.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::settler::{Deferred, Unsettled};
use super::standing::{TicketState, Waiting, TICKET_LEASE_MS};
use super::Limiter;
use crate::clock::millis;
use crate::error::{AcquireError, KeyRefused};
use crate::id::PermitId;
use crate::options::AcquireOptions;
use crate::permit::Permit;
use crate::store::{Turn, Wakeups};

/// How long the head of a queue waits at most before asking the store again, in case the wake-up of a
/// release was lost (a subscription that broke) or a lease expired (which no one announces).
pub const RECHECK: Duration = Duration::from_secs(1);

/// The longest a waiter in a store without queues waits before asking again; it first asks again after
/// 5 ms, then twice as long each time.
pub const POLL: Duration = Duration::from_millis(100);
const POLL_FIRST: Duration = Duration::from_millis(5);

impl<S: Wakeups> Limiter<S> {
    /// Admits one request under `key`, waiting up to the options' [`AcquireOptions::max_wait`] for a
    /// slot; without one, as [`Limiter::try_acquire_with`]. On timeout, the refusal `try_acquire` gives.
    /// Waiting holds no slot.
    ///
    /// ```
    /// use std::time::Duration;
    /// use inflight::{AcquireOptions, Limiter, MemoryStore, Policy};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let limiter = Limiter::builder(MemoryStore::new()).policy(Policy::new(1, 0)).build();
    /// let first = limiter.try_acquire("model").await.unwrap();
    /// tokio::spawn(async move {
    ///     tokio::time::sleep(Duration::from_millis(20)).await;
    ///     drop(first); // its release wakes the waiter at once
    /// });
    /// let wait = AcquireOptions::new().max_wait(Duration::from_secs(5));
    /// let second = limiter.acquire("model", wait).await.unwrap();
    /// # drop(second);
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the queue at once and holds nothing (as [`Limiter::try_acquire_with`]).
    pub async fn acquire(
        &self,
        key: &str,
        options: AcquireOptions,
    ) -> Result<Permit, AcquireError> {
        self.acquire_all(&[key], options)
            .await
            .map_err(|refused| refused.error)
    }

    /// [`Limiter::try_acquire_all`], waiting as [`Limiter::acquire`] does. The waiter queues on the key
    /// that refused it first; when at the head, it tries every key again.
    pub async fn acquire_all(
        &self,
        keys: &[&str],
        options: AcquireOptions,
    ) -> Result<Permit, KeyRefused> {
        let max_wait = options.max_wait.unwrap_or(Duration::ZERO);
        if max_wait.is_zero() {
            return self.try_acquire_all(keys, options).await;
        }
        // Boxed: a wait's state (its ticket, its place, its timers) is several times the size of an
        // admission that does not wait, and every caller's future would otherwise carry (and move) it.
        Box::pin(self.wait_for_slot(keys, options, max_wait)).await
    }

    /// [`Limiter::acquire_all`] with a wait of `max_wait` (not zero). With a ticket in the store's
    /// queue of the key that refuses, asking again when its turn is called, when the policy changes, or
    /// every [`RECHECK`] (which keeps the ticket); where the store takes none, every [`POLL`].
    async fn wait_for_slot(
        &self,
        keys: &[&str],
        options: AcquireOptions,
        max_wait: Duration,
    ) -> Result<Permit, KeyRefused> {
        let deadline = Instant::now() + max_wait;
        let core = &self.core;
        let turn = core.store.ticket();
        let mut options = options;
        // One key, no floors, no id of the caller's: a release may hand this waiter the slot, under an
        // id of the wait's own (the same at every ask).
        let one_key = keys.iter().all(|key| *key == keys[0]);
        let handoff = turn.is_some()
            && options.id.is_none()
            && one_key
            && core.policy.floors_of(keys).is_none();
        let id = handoff.then(PermitId::generate);
        options.id = options.id.or_else(|| id.clone());
        let mut waiting = turn.as_ref().map(|turn| Waiting {
            name: Arc::from(turn.name()),
            handoff,
            fresh: handoff,
        });
        // Given up in the store (by the settler) when this wait ends unadmitted or is dropped.
        let mut leaving = waiting.as_ref().map(|waiting| {
            let leave = self.leave(keys, &waiting.name, id.clone());
            Unsettled::new(&core.settler, Some(leave))
        });
        let mut place = None;
        // Turns heard before the first ask: none of this ticket's can have gone unheard.
        let mut heard = turn.as_ref().is_none_or(Turn::is_heard);
        let (mut poll, mut queued) = (POLL_FIRST, false);
        // An ask the store did not answer (it failed; the failure policy refused) may still be decided
        // under the wait's id: from then on the asks go under ids of their own, and a slot handed to
        // the wait's id is left to the leave, which gives it back.
        let mut unanswered = false;
        // The key that refused it last: the one it waits on.
        let mut queued_on: Option<String> = None;
        loop {
            let replaced = core.policy.replaced();
            tokio::pin!(replaced);
            replaced.as_mut().enable();
            // (A slot handed before this ask is the ask's to take: its id holds it, which admits it.)
            let _ = turn.as_ref().map(Turn::handed);
            let (decided, ticket) = self
                .acquire_keys(keys, options.clone(), waiting.as_ref())
                .await;
            if let Some(waiting) = &mut waiting {
                waiting.fresh = false;
                if handoff && !unanswered && ticket == TicketState::Untaken && decided.is_err() {
                    (unanswered, waiting.handoff, options.id) = (true, false, None);
                }
            }
            let refused = match decided {
                Err(full) if is_full(&full) => full,
                Ok(permit) => {
                    // A store admission took the ticket out; any other (unlimited keys, the failure
                    // policy's) leaves it to be given up.
                    if let Some(leaving) = &mut leaving {
                        leaving.disarm_unless(unanswered || ticket != TicketState::Admitted);
                    }
                    let on = queued_on.as_deref();
                    return Ok(match keys.iter().position(|key| Some(*key) == on) {
                        Some(index) => permit.queued(index),
                        None => permit,
                    });
                }
                decided => return decided,
            };
            // (Refused by the failure policy while the store failed, a ticket waits on.)
            queued |= ticket == TicketState::Queued;
            if queued_on.as_deref() != Some(&*refused.key) {
                queued_on = Some(refused.key.clone());
            }
            if place.is_none() {
                let group = (options.priority_level(), options.flow_name().cloned());
                match core.waiters.join(&refused.key, &core.stats.waiting, group) {
                    Some(joined) => place = Some(joined),
                    None => return Err(refused),
                }
            }
            if Instant::now() >= deadline {
                core.stats.wait_timeouts.fetch_add(1, Ordering::Relaxed);
                return Err(refused);
            }
            // Handed while the ask was on its way: the hand-off may have come before the ask reached the
            // store and its lease lapsed since (the ask was refused), so asked again at once; the ask
            // takes a lease still there (its id holds it).
            if turn.as_ref().and_then(Turn::handed).is_some() && !unanswered {
                continue;
            }
            let Some(turn) = turn.as_ref().filter(|_| queued) else {
                // No ticket taken (a store without queues): asked again soon, then less often.
                let again = (Instant::now() + poll).min(deadline);
                poll = (poll * 2).min(POLL);
                tokio::select! {
                    () = &mut replaced => {}
                    () = tokio::time::sleep_until(again) => {}
                }
                continue;
            };
            if !heard {
                // A turn called before the subscription was in force went unheard: asked again after.
                heard = true;
                let heard_by = (Instant::now() + RECHECK).min(deadline);
                let _ = tokio::time::timeout_at(heard_by, turn.heard()).await;
                continue;
            }
            let recheck = (Instant::now() + RECHECK).min(deadline);
            tokio::select! {
                () = turn.called() => {}
                () = &mut replaced => {}
                () = tokio::time::sleep_until(recheck) => {}
            }
            if turn.is_revoked() {
                let error = AcquireError::Revoked;
                return Err(KeyRefused { error, ..refused });
            }
            // Handed the slot by a release: held, without asking again.
            if let (Some(handed), Some(id), false) = (turn.handed(), &id, unanswered) {
                if let Some(leaving) = &mut leaving {
                    leaving.disarm_unless(false);
                }
                let weight = options.weight.unwrap_or(1);
                let lease_ms = options.lease.map_or(core.lease_ms, millis);
                return Ok(self
                    .handed(&keys[..1], id.clone(), (weight, lease_ms), handed)
                    .queued(0));
            }
        }
    }

    /// Gives up the ticket `name` in the queues of `keys`, for the [`crate::limiter::Settler`]; with the
    /// wait's `id`, a slot a release handed it before it heard is given back.
    fn leave(&self, keys: &[&str], name: &Arc<str>, id: Option<PermitId>) -> Deferred {
        let keys: Arc<[Arc<str>]> = keys.iter().map(|key| Arc::from(*key)).collect();
        let (store, ticket) = (self.core.store.clone(), name.clone());
        Deferred {
            what: "leave",
            key: keys[0].clone(),
            id: PermitId::from(&**name),
            // (Past the ticket's lease it is gone; a slot handed to it, at the longest lease.)
            within: Duration::from_millis(TICKET_LEASE_MS),
            attempt: Box::new(move || {
                let (store, keys, ticket, id) =
                    (store.clone(), keys.clone(), ticket.clone(), id.clone());
                Box::pin(async move { store.leave(&keys, &ticket, id.as_ref()).await.map(drop) })
            }),
        }
    }
}

fn is_full(refused: &KeyRefused) -> bool {
    matches!(refused.error, AcquireError::Full { .. })
}
