//! Waiting for a slot: [`Limiter::acquire`] and [`Limiter::acquire_all`]. A process's waiters on a key
//! queue in arrival order; only the head of a queue asks the store, when a release on the key wakes it
//! (from this process or, through the store, any other) or, in case a wake-up was lost, after
//! [`RECHECK`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::queue::Place;
use super::Limiter;
use crate::error::{AcquireError, KeyRefused};
use crate::options::{AcquireOptions, TicketSlot};
use crate::permit::Permit;
use crate::store::{Turn, Wakeups};

/// How long the head of a queue waits at most before asking the store again, in case the wake-up of a
/// release was lost (a subscription that broke) or a lease expired (which no one announces).
pub const RECHECK: Duration = Duration::from_secs(1);

/// How long a waiter's place in a store's queue lasts unless it asks again (it does every [`RECHECK`]):
/// a waiter in a process that is killed stops holding its place within this, in milliseconds.
pub const TICKET_LEASE_MS: u64 = 3_000;

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

    /// [`Limiter::acquire_all`] with a wait of `max_wait` (not zero).
    async fn wait_for_slot(
        &self,
        keys: &[&str],
        options: AcquireOptions,
        max_wait: Duration,
    ) -> Result<Permit, KeyRefused> {
        let deadline = Instant::now() + max_wait;
        // A store with one queue per key for every process: the waiter takes a ticket there.
        if let Some(turn) = self.core.store.ticket() {
            if let Some(decided) = self.wait_ticketed(keys, &options, turn, deadline).await {
                return decided;
            }
        }
        let waiters = &self.core.waiters;
        // Nobody of this process waits here: try at once; else queue behind those who do.
        let mut refused = None;
        if waiters.idle(keys) {
            match self.try_acquire_all(keys, options.clone()).await {
                Err(full) if is_full(&full) => refused = Some(full),
                decided => return decided,
            }
        }
        let queue_key = refused
            .as_ref()
            .map_or(keys[0], |r| r.key.as_str())
            .to_owned();
        let standing = (options.priority_level(), options.flow_name().cloned());
        let Some(place) = waiters.join(&queue_key, &self.core.stats.waiting, standing) else {
            return match refused {
                Some(refused) => Err(refused),
                None => self.try_acquire_all(keys, options).await,
            };
        };
        // (The place is left when this future ends or is dropped.)
        self.wait_in_line(keys, options, &place, queue_key, deadline)
            .await
    }

    async fn wait_in_line(
        &self,
        keys: &[&str],
        options: AcquireOptions,
        place: &Place<'_>,
        mut watched: String,
        deadline: Instant,
    ) -> Result<Permit, KeyRefused> {
        let timed_out = || {
            self.core
                .stats
                .wait_timeouts
                .fetch_add(1, Ordering::Relaxed);
        };
        // Until this waiter is the head of its queue.
        if tokio::time::timeout_at(deadline, place.turn.notified())
            .await
            .is_err()
        {
            timed_out();
            return self.try_acquire_all(keys, options).await;
        }
        let mut interest = self.core.store.interest(&watched);
        loop {
            let refused = {
                // Heard before asking (bounded: a subscription that cannot be made leaves the re-check).
                let heard_by = (Instant::now() + RECHECK).min(deadline);
                let _ = tokio::time::timeout_at(heard_by, interest.heard()).await;
                let notified = interest.notified();
                let replaced = self.core.policy.replaced();
                tokio::pin!(notified, replaced);
                // Enabled before asking: a release (or a new policy) while the store decides wakes this
                // waiter all the same.
                notified.as_mut().enable();
                replaced.as_mut().enable();
                let refused = match self.try_acquire_all(keys, options.clone()).await {
                    Err(full) if is_full(&full) => full,
                    decided => return decided,
                };
                if Instant::now() >= deadline {
                    timed_out();
                    return Err(refused);
                }
                let recheck = (Instant::now() + RECHECK).min(deadline);
                tokio::select! {
                    () = &mut notified => {}
                    () = &mut replaced => {}
                    () = tokio::time::sleep_until(recheck) => {}
                }
                refused
            };
            if refused.key != watched {
                watched = refused.key;
                interest = self.core.store.interest(&watched);
            }
        }
    }
}

impl<S: Wakeups> Limiter<S> {
    /// Waits with a ticket in the store's queue of the key that refuses, asking again when its turn is
    /// called, when the policy changes, or every [`RECHECK`] (which keeps the ticket). `None`: the
    /// store took no ticket (keys in several Cluster slots): the caller waits as without queues.
    async fn wait_ticketed(
        &self,
        keys: &[&str],
        options: &AcquireOptions,
        turn: Turn,
        deadline: Instant,
    ) -> Option<Result<Permit, KeyRefused>> {
        let slot = Arc::new(TicketSlot {
            name: turn.name().to_owned(),
            queued: AtomicBool::new(false),
            taken_out: AtomicBool::new(false),
        });
        let mut options = options.clone();
        options.queueing().ticket = Some(slot.clone());
        // Given up in the store when this wait ends unadmitted or is dropped.
        let mut leaving = Leaving {
            store: Some(self.core.store.clone()),
            keys: keys.iter().map(|key| Arc::from(*key)).collect(),
            ticket: slot.name.clone(),
        };
        let mut place = None;
        // Turns heard before the first ask: none of this ticket's can have gone unheard.
        let mut heard = turn.is_heard();
        let mut queued = false;
        loop {
            let replaced = self.core.policy.replaced();
            tokio::pin!(replaced);
            replaced.as_mut().enable();
            let refused = match self.try_acquire_all(keys, options.clone()).await {
                Err(full) if is_full(&full) => full,
                Ok(permit) => {
                    // A store admission took the ticket out; any other (unlimited keys, the failure
                    // policy's) leaves it to be given up.
                    if slot.taken_out.load(Ordering::Relaxed) {
                        leaving.store = None;
                    }
                    return Some(Ok(permit));
                }
                decided => return Some(decided),
            };
            match (slot.queued.load(Ordering::Relaxed), queued) {
                (true, _) => queued = true,
                // The store took no ticket at first (keys in several Cluster slots): as without queues.
                (false, false) => {
                    leaving.store = None;
                    return None;
                }
                // Refused by the failure policy while the store failed: the ticket waits on.
                (false, true) => {}
            }
            if place.is_none() {
                let waiters = &self.core.waiters;
                let standing = (options.priority_level(), options.flow_name().cloned());
                match waiters.join(&refused.key, &self.core.stats.waiting, standing) {
                    Some(joined) => place = Some(joined),
                    None => return Some(Err(refused)),
                }
            }
            if Instant::now() >= deadline {
                self.core
                    .stats
                    .wait_timeouts
                    .fetch_add(1, Ordering::Relaxed);
                return Some(Err(refused));
            }
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
        }
    }
}

/// A ticket to give up in the store unless the wait was admitted (`store` taken).
struct Leaving<S: Wakeups> {
    store: Option<S>,
    keys: Vec<Arc<str>>,
    ticket: String,
}

impl<S: Wakeups> Drop for Leaving<S> {
    fn drop(&mut self) {
        let Some(store) = self.store.take() else {
            return;
        };
        // Off every runtime nothing can send it: the ticket ends with its lease.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (keys, ticket) = (
            std::mem::take(&mut self.keys),
            std::mem::take(&mut self.ticket),
        );
        runtime.spawn(async move {
            if let Err(error) = store.leave(&keys, &ticket).await {
                tracing::debug!(%error, "a ticket was not given up; it ends with its lease");
            }
        });
    }
}

fn is_full(refused: &KeyRefused) -> bool {
    matches!(refused.error, AcquireError::Full { .. })
}
