//! One admission, on one key or on several at once: the checks and fast paths that need no waiting,
//! and the store's decision (turned into a permit by decided.rs).

use std::sync::Arc;

use super::abandon::Deciding;
use super::settler::Unsettled;
use super::standing::{Standing, TicketState, Waiting};
use super::Limiter;
use crate::clock::millis;
use crate::error::{AcquireError, KeyRefused, StoreError};
use crate::id::PermitId;
use crate::options::{AcquireOptions, MAX_FLOW_LEN, MAX_FLOW_WEIGHT, MAX_LEASE, MIN_LEASE};
use crate::permit::Permit;
use crate::policy::ClassLimits;
use crate::store::{
    AcquireRequest, Admission, Grant, Keys, LocalAdmission, LocalSlots, Store, MAX_HOLDER_LEN,
};

/// The most keys of one admission (a longer list is refused before it reaches the store).
pub(super) const MAX_KEYS: usize = 16;

/// A refusal, with the place among the admission's keys of the key that refused.
pub(super) type Refused = (usize, AcquireError);

/// What [`Limiter::acquire_now`] decided.
pub(super) enum Now {
    /// Held in this process's store: the caller turns it into a permit at once, with [`Permit::local`].
    Local {
        slots: Arc<dyn LocalSlots>,
        grant: Grant,
        lease_ms: u64,
    },
    /// The answer, with no store to ask: refused as invalid, decided by the in-process store, or the
    /// failure policy's answer while the store is failing.
    Decided(Result<Permit, Refused>),
    /// For the store to decide.
    Store(Prepared),
}

/// An admission that the store has yet to decide.
pub(super) struct Prepared {
    /// The limits of each key's class, in the order of the keys.
    limits: [ClassLimits; MAX_KEYS],
    id: PermitId,
    /// The id was made here, not given: a lease under it can only be this admission's.
    generated: bool,
    weight: u32,
    lease_ms: u64,
    standing: Standing,
}

impl<S: Store> Limiter<S> {
    /// Admits one request under every key of `keys` at once, or under none, in one atomic step of the
    /// store: an app's limit, its tenant's and a global one, say. The permit holds a slot on each key under
    /// one id and one lease, renewed and released together. Repeated keys count once. The permit's `key`,
    /// `limit` and `in_flight` are those of the first key; a refusal names the key that refused.
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
    /// assert_eq!(limiter.status("app:chat").await.unwrap().in_flight, 1, "nothing taken by the refusal");
    /// # drop((a, b));
    /// # }
    /// ```
    pub async fn try_acquire_all(
        &self,
        keys: &[&str],
        options: AcquireOptions,
    ) -> Result<Permit, KeyRefused> {
        self.acquire_keys(keys, options, None).await.0
    }

    /// [`Limiter::try_acquire_all`], for a waiter with `ticket` (its name) when it has one; what the
    /// store did with the ticket.
    pub(super) async fn acquire_keys(
        &self,
        keys: &[&str],
        mut options: AcquireOptions,
        ticket: Option<&Waiting>,
    ) -> (Result<Permit, KeyRefused>, TicketState) {
        let mut unique: Vec<&str> = Vec::with_capacity(keys.len().min(MAX_KEYS + 1));
        for key in keys {
            if !unique.contains(key) {
                unique.push(key);
            }
            if unique.len() > MAX_KEYS {
                break;
            }
        }
        let invalid = match unique.len() {
            0 => Some("no keys"),
            1..=MAX_KEYS => None,
            _ => Some("at most 16 keys at once"),
        };
        if let Some(why) = invalid {
            let error = AcquireError::Invalid(why);
            let key = keys
                .first()
                .map_or_else(String::new, |key| (*key).to_owned());
            return (Err(KeyRefused { key, error }), TicketState::Untaken);
        }
        let (decided, ticket) = match self.acquire_now(&unique, &mut options, ticket) {
            Now::Local {
                slots,
                grant,
                lease_ms,
            } => (
                Ok(Permit::local(slots, None, grant, lease_ms)),
                TicketState::Untaken,
            ),
            Now::Decided(decided) => (decided, TicketState::Untaken),
            Now::Store(prepared) => self.acquire_in_store(&unique, prepared).await,
        };
        let refused = |(index, error): Refused| KeyRefused {
            key: unique[index].to_owned(),
            error,
        };
        (decided.map_err(refused), ticket)
    }

    /// The part of an admission that needs no waiting: checks the options, then admits without I/O when
    /// the store lives in this process; otherwise hands back what the store must decide (with a waiter's
    /// `ticket`, always).
    #[inline]
    pub(super) fn acquire_now(
        &self,
        keys: &[&str],
        options: &mut AcquireOptions,
        ticket: Option<&Waiting>,
    ) -> Now {
        let invalid = |why| Now::Decided(Err((0, AcquireError::Invalid(why))));
        let weight = match options.weight {
            None => 1,
            Some(0) => return invalid("weight must be at least 1"),
            Some(weight) => weight,
        };
        let lease_ms = match options.lease.map(millis) {
            None => self.core.lease_ms,
            Some(lease_ms) if (millis(MIN_LEASE)..=millis(MAX_LEASE)).contains(&lease_ms) => {
                lease_ms
            }
            Some(_) => return invalid("lease must be between 100 ms and 24 h"),
        };
        if options.id.as_ref().is_some_and(PermitId::is_empty) {
            return invalid("id must not be empty");
        }
        if options.holder.as_ref().is_some_and(|holder| {
            holder.is_empty()
                || holder.len() > MAX_HOLDER_LEN
                || holder.chars().any(char::is_control)
        }) {
            return invalid("holder must be 1 to 128 bytes without control characters");
        }
        if options
            .flow_name()
            .is_some_and(|flow| flow.len() > MAX_FLOW_LEN)
        {
            return invalid("flow must be at most 256 bytes");
        }
        if options
            .queue
            .as_ref()
            .and_then(|queue| queue.flow_weight)
            .is_some_and(|weight| !(1..=MAX_FLOW_WEIGHT).contains(&weight))
        {
            return invalid("flow weight must be 1 to 1000");
        }
        let core = &self.core;
        let mut limits = [ClassLimits::default(); MAX_KEYS];
        core.policy.limits_into(keys, &mut limits[..keys.len()]);
        let floors = core.policy.floors_of(keys);
        // (A waiter with a ticket, or an admission on a key with floors, asks the store: its place, and
        // which level holds what, are there.)
        let shadow = core.policy.shadow_of(keys);
        // (A labelled admission takes a lease, so that it is listed with its label.)
        let given_id = options.id.is_some() || options.holder.is_some();
        let held = match ticket.is_none() && floors.is_none() && shadow == 0 {
            true => core
                .store
                .hold(keys, &limits[..keys.len()], weight, given_id),
            false => None,
        };
        match held {
            Some(LocalAdmission::Taken {
                slots,
                grant,
                reclaimed,
            }) => {
                self.count_reclaimed(reclaimed);
                return Now::Local {
                    slots,
                    grant,
                    lease_ms,
                };
            }
            Some(LocalAdmission::Decided(admission)) => {
                let leased = options.id.take().map(|id| {
                    let keys: Keys = keys.iter().map(|key| Arc::from(*key)).collect();
                    (keys, id)
                });
                return Now::Decided(self.decided(keys, leased, weight, lease_ms, admission, None));
            }
            None => {}
        }
        if core.breaker.is_open(|| core.registry.now_ms()) {
            let error =
                StoreError::Unavailable("the store failed moments ago; retrying shortly".into());
            let id = options.id.take();
            return Now::Decided(self.store_failed(keys, id, weight, lease_ms, error));
        }
        let given = options.id.take();
        let standing = Standing {
            ticket: ticket.map(|waiting| (waiting.clone(), options.flow_name().cloned())),
            priority: options.priority_level(),
            flow_weight: options
                .queue
                .as_ref()
                .and_then(|queue| queue.flow_weight)
                .unwrap_or(1),
            floors,
            holder: options.holder.clone(),
            shadow,
        };
        // (A wait's first ask under the id it made is the id's first admission, as one it generates.)
        let fresh = ticket.is_some_and(|waiting| waiting.fresh);
        Now::Store(Prepared {
            limits,
            generated: given.is_none() || fresh,
            id: given.unwrap_or_else(PermitId::generate),
            weight,
            lease_ms,
            standing,
        })
    }

    /// The part of an admission that the store decides; what it did with a waiter's ticket.
    pub(super) async fn acquire_in_store(
        &self,
        keys: &[&str],
        prepared: Prepared,
    ) -> (Result<Permit, Refused>, TicketState) {
        let Prepared {
            limits,
            id,
            generated,
            weight,
            lease_ms,
            standing,
        } = prepared;
        let core = &self.core;
        let shared: Keys = keys.iter().map(|key| Arc::from(*key)).collect();
        // A permit of this process already holding this lease (a request entered twice): joined, so that
        // the slot stays held until the last of them goes. Dropped on a refusal, which undoes the join.
        let joined = match generated {
            true => None,
            false => core
                .registry
                .join(&shared, &id)
                .map(|state| self.permit(state)),
        };
        if let Some(joined) = &joined {
            if (joined.weight(), joined.lease_ms()) != (weight, lease_ms) {
                let why = "the id is held here with another weight or lease";
                return (Err((0, AcquireError::Invalid(why))), TicketState::Untaken);
            }
        }
        let answer = if generated || joined.is_some() {
            let request = AcquireRequest {
                keys,
                id: &id,
                weight,
                lease_ms,
                limits: &limits[..keys.len()],
                generated,
                ticket: standing.ticket(),
                priority: standing.priority,
                floors: standing.floors(),
                holder: standing.holder.as_deref(),
                shadow: standing.shadow,
            };
            // Dropped before the store answers (the caller went away), or failed on the way (a timeout),
            // this admission may still have been made: its lease is then released in the background
            // instead of holding a slot until it expires. By id alone: the admission's token is not
            // known, and a generated id names no other admission. (Under an id a permit here holds, that
            // permit's release gives the lease back.)
            let release =
                generated.then(|| core.release_of(shared.clone(), id.clone(), lease_ms, 0));
            let mut unanswered = Unsettled::new(&core.settler, release);
            let answer = core.store.acquire(request).await;
            unanswered.disarm_unless(matches!(&answer, Err(error) if error.is_transient()));
            answer
        } else {
            // Under a given id: dropped before the store answers, the decision is finished in the
            // background and a lease it made released by its own token.
            let limits = &limits[..keys.len()];
            let lease = (shared.clone(), id.clone());
            Deciding::start(
                &self.core,
                lease,
                (weight, lease_ms),
                limits,
                standing.clone(),
            )
            .answer()
            .await
        };
        let ticket = match (&standing.ticket, &answer) {
            (Some(_), Ok(Admission::Queued { .. })) => TicketState::Queued,
            (Some(_), Ok(Admission::Admitted { .. })) => TicketState::Admitted,
            _ => TicketState::Untaken,
        };
        let decided = match answer {
            Ok(admission) => {
                core.breaker.reset();
                let leased = (shared, id);
                self.decided(keys, Some(leased), weight, lease_ms, admission, joined)
            }
            Err(error) if error.is_transient() => {
                core.breaker.trip(core.registry.now_ms());
                tracing::warn!(%error, key = keys[0], policy = ?core.on_store_failure, "store unavailable at admission");
                self.store_failed(keys, Some(id), weight, lease_ms, error)
            }
            Err(error) => Err((0, AcquireError::Store(error))),
        };
        (decided, ticket)
    }
}
