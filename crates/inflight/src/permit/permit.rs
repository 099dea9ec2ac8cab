//! [`Permit`]: one admitted request's slot, released exactly once, on every path.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use crate::error::StoreError;
use crate::id::PermitId;
use crate::policy::Limit;
use crate::store::{Grant, Keys, LocalSlots};

/// A boxed future: a release through a store the permit does not name, or the store's part of an admission.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a leased permit knows of itself; shared with the limiter's renewal task while it is held, and by
/// every permit of this process with the same keys and id.
pub(crate) struct PermitState {
    pub(crate) keys: Keys,
    pub(crate) id: PermitId,
    pub(crate) weight: u32,
    pub(crate) lease_ms: u64,
    /// The permits holding this lease: it is released when the last of them goes.
    pub(crate) holders: AtomicUsize,
    pub(crate) expires_at_ms: AtomicU64,
    /// The token of the admission that holds the lease now (a later admission of the id in this
    /// process takes it over with its own).
    pub(crate) token: AtomicU64,
    /// Which keys recorded the lease at admission ([`crate::store::Grant::counted`]).
    pub(crate) counted: u32,
    /// When the renewal task should next renew it, in ms of the limiter's monotonic clock.
    pub(crate) renew_at_ms: AtomicU64,
    pub(crate) lost: Lost,
    /// Set once no permit holds it (released, detached, or handed to shutdown).
    pub(crate) released: AtomicBool,
}

/// Whether a lease was lost (revoked, or gone at renewal without room to come back), and the wake-up of
/// those waiting to hear it.
#[derive(Default)]
pub(crate) struct Lost {
    flag: AtomicBool,
    heard: tokio::sync::Notify,
}

impl Lost {
    /// The lease is lost: every [`Lost::wait`] completes.
    pub(crate) fn set(&self) {
        self.flag.store(true, Ordering::Release);
        self.heard.notify_waiters();
    }

    pub(crate) fn is_set(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    /// Completes once the lease is lost.
    async fn wait(&self) {
        loop {
            let heard = self.heard.notified();
            tokio::pin!(heard);
            heard.as_mut().enable();
            if self.is_set() {
                return;
            }
            heard.await;
        }
    }
}

impl PermitState {
    /// One more holder, unless the last one has already gone.
    pub(crate) fn join(&self) -> bool {
        self.holders
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |holders| {
                (holders > 0).then_some(holders + 1)
            })
            .is_ok()
    }

    /// One holder fewer; true when it was the last.
    pub(crate) fn leave(&self) -> bool {
        self.holders.fetch_sub(1, Ordering::AcqRel) == 1
    }
}

/// The limiter side of a leased permit: how to release it. Type-erased so that `Permit` names no store.
pub(crate) trait Owner: Send + Sync + 'static {
    /// A holder went: when it was the last, the lease is released in the background.
    fn dropped(&self, state: Arc<PermitState>);
    /// A holder releases: when it was the last, the store's answer.
    fn release(
        self: Arc<Self>,
        state: Arc<PermitState>,
    ) -> BoxFuture<'static, Result<(), StoreError>>;
    /// A holder hands the lease off: when it was the last, the limiter stops renewing it.
    fn detach(&self, state: &Arc<PermitState>);
}

/// How a permit holds its slot.
pub(crate) enum Hold {
    /// A lease in the store, renewed by the limiter while the permit is alive.
    Leased {
        state: Arc<PermitState>,
        owner: Arc<dyn Owner>,
    },
    /// Slots in an in-process store, which need no lease: they live exactly as long as the permit.
    Local {
        slots: Arc<dyn LocalSlots>,
        lease_ms: u64,
    },
    /// Nothing to hold: the keys are unlimited.
    Free { key: Arc<str> },
    /// Released or detached.
    Done,
}

/// One admitted request's slot under a key (or under each of several keys, taken together).
///
/// Dropping the permit releases the slot: when the work ends, fails, panics or is cancelled. While it is
/// alive, the limiter renews its lease in the background, so a permit held for hours keeps its slot; a
/// permit whose lease was lost (the store restarted empty and the key is now full) says so through
/// [`Permit::is_lost`].
///
/// ```
/// use inflight::{Limiter, MemoryStore, Policy};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let limiter = Limiter::builder(MemoryStore::new()).policy(Policy::new(1, 0)).build();
/// let permit = limiter.try_acquire("tenant-7").await.unwrap();
/// assert_eq!(permit.key(), "tenant-7");
/// assert_eq!(permit.limit().get(), Some(1));
/// assert_eq!(limiter.status("tenant-7").await.unwrap().in_flight, 1);
/// permit.release().await.unwrap();
/// assert_eq!(limiter.status("tenant-7").await.unwrap().in_flight, 0);
/// # }
/// ```
#[must_use = "the slot is released as soon as the permit is dropped"]
pub struct Permit {
    hold: Hold,
    /// The id, for permits whose id lives nowhere else (generated on first use when not given).
    id: OnceLock<PermitId>,
    weight: u32,
    limit: Limit,
    in_flight: u32,
    /// The admission's token, for a permit without a lease in the store (else its state's).
    token: u64,
    /// Which of its keys it queued on before it was admitted ([`Permit::queued_on`]); none: `u8::MAX`.
    queued_on: u8,
}

/// A lease handed off by [`Permit::detach`]: its holder must renew or release it (for example over HTTP).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The key.
    pub key: Arc<str>,
    /// The permit's id.
    pub id: PermitId,
    /// Its weight.
    pub weight: u32,
    /// The key's effective limit at admission.
    pub limit: Limit,
    /// The key's in-flight count at admission, this permit included.
    pub in_flight: u32,
    /// When the lease ends unless renewed (ms since the Unix epoch, store clock); 0 when nothing is held
    /// (an unlimited key).
    pub expires_at_ms: u64,
    /// The admission's fencing token ([`Permit::token`]); renewals and releases name it.
    pub token: u64,
}

impl Permit {
    #[inline]
    pub(crate) fn new(
        hold: Hold,
        id: Option<PermitId>,
        weight: u32,
        limit: Limit,
        in_flight: u32,
    ) -> Self {
        Self {
            hold,
            id: id.map_or_else(OnceLock::new, OnceLock::from),
            weight,
            limit,
            in_flight,
            token: 0,
            queued_on: u8::MAX,
        }
    }

    /// The permit, admitted after it queued on its key at `index` ([`Permit::queued_on`]).
    pub(crate) fn queued(mut self, index: usize) -> Self {
        self.queued_on = u8::try_from(index).unwrap_or(u8::MAX);
        self
    }

    /// The key it waited on before it was admitted ([`crate::Limiter::acquire`] with a wait): the key
    /// that refused it last, whose queue it stood in; `None` when it was admitted without waiting.
    ///
    /// ```
    /// use std::time::Duration;
    /// use inflight::{AcquireOptions, Limiter, MemoryStore, Policy};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let limiter = Limiter::builder(MemoryStore::new()).policy(Policy::new(1, 0)).build();
    /// let first = limiter.acquire("app-1", AcquireOptions::new()).await.unwrap();
    /// assert_eq!(first.queued_on(), None);
    /// let waiting = AcquireOptions::new().max_wait(Duration::from_secs(10));
    /// let (second, ()) = tokio::join!(limiter.acquire("app-1", waiting), async { drop(first) });
    /// assert_eq!(second.unwrap().queued_on(), Some("app-1"));
    /// # }
    /// ```
    pub fn queued_on(&self) -> Option<&str> {
        let index = usize::from(self.queued_on);
        match &self.hold {
            _ if self.queued_on == u8::MAX => None,
            Hold::Leased { state, .. } => state.keys.get(index).map(|key| &**key),
            _ if index == 0 => Some(self.key()),
            _ => None,
        }
    }

    /// A permit holding a slot of an in-process store (no lease: it lives exactly as long as the permit).
    #[inline]
    pub(crate) fn local(
        slots: Arc<dyn LocalSlots>,
        id: Option<PermitId>,
        grant: Grant,
        lease_ms: u64,
    ) -> Self {
        let mut permit = Self::new(
            Hold::Local { slots, lease_ms },
            id,
            grant.weight,
            grant.limit,
            grant.in_flight,
        );
        permit.token = grant.token;
        permit
    }

    /// The permit with the store's figures of its admission.
    pub(crate) fn granted(mut self, grant: Grant) -> Self {
        if let Hold::Leased { state, .. } = &self.hold {
            state
                .expires_at_ms
                .store(grant.expires_at_ms, Ordering::Relaxed);
            state.token.store(grant.token, Ordering::Release);
        }
        self.token = grant.token;
        self.weight = grant.weight;
        self.limit = grant.limit;
        self.in_flight = grant.in_flight;
        self
    }

    /// Its lease's state, for a permit with a lease in the store.
    fn state(&self) -> Option<&PermitState> {
        match &self.hold {
            Hold::Leased { state, .. } => Some(state),
            _ => None,
        }
    }

    /// The lease length, for a permit with a lease in the store.
    pub(crate) fn lease_ms(&self) -> u64 {
        self.state().map_or(0, |state| state.lease_ms)
    }

    /// The key this permit counts against (the first, when it holds several).
    pub fn key(&self) -> &str {
        match &self.hold {
            Hold::Leased { state, .. } => &state.keys[0],
            Hold::Local { slots, .. } => slots.key(),
            Hold::Free { key } => key,
            Hold::Done => "",
        }
    }

    /// The permit's id: the one given in [`crate::AcquireOptions::id`], else a generated UUID v4.
    pub fn id(&self) -> &PermitId {
        match &self.hold {
            Hold::Leased { state, .. } => &state.id,
            _ => self.id.get_or_init(PermitId::generate),
        }
    }

    /// How many slots it takes.
    pub fn weight(&self) -> u32 {
        self.weight
    }

    /// The key's effective limit when the permit was granted.
    pub fn limit(&self) -> Limit {
        self.limit
    }

    /// The key's in-flight count when the permit was granted, this permit included.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// When the lease ends unless renewed (ms since the Unix epoch, store clock); 0 when the permit has no
    /// lease (an unlimited key, or a permit held in this process's memory store).
    pub fn expires_at_ms(&self) -> u64 {
        self.state()
            .map_or(0, |state| state.expires_at_ms.load(Ordering::Relaxed))
    }

    /// The admission's fencing token: larger than every token given before on each of its keys, by
    /// every process sharing the store (on Redis, the Redis clock in microseconds or the key's last
    /// token + 1), so a resource the permit guards can refuse a holder whose lease lapsed and was
    /// given to another meanwhile (it brings a smaller token than one already seen). 0 for an unlimited
    /// key, and under the Dify layout, which keeps none. On a Redis Cluster, a permit over keys of
    /// several slots carries the token of its first slot (in slot order), whose keys it grows on.
    ///
    /// ```
    /// use inflight::{Limiter, MemoryStore, Policy};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let limiter = Limiter::builder(MemoryStore::new()).policy(Policy::new(1, 0)).build();
    /// let first = limiter.try_acquire("printer").await.unwrap();
    /// let token = first.token();
    /// drop(first);
    /// let second = limiter.try_acquire("printer").await.unwrap();
    /// assert!(second.token() > token);
    /// # }
    /// ```
    pub fn token(&self) -> u64 {
        match &self.hold {
            Hold::Leased { state, .. } => state.token.load(Ordering::Acquire),
            _ => self.token,
        }
    }

    /// True once a renewal found the lease gone and could not take it back (the key was full): the
    /// request is no longer counted. Finishing its work is still safe; the permit is released as usual.
    pub fn is_lost(&self) -> bool {
        self.state().is_some_and(|state| state.lost.is_set())
    }

    /// Completes once the permit is lost ([`Permit::is_lost`]): an admin revoked it
    /// ([`crate::Limiter::revoke`]), or its lease was gone at renewal without room to come back. Heard
    /// at the permit's next renewal (a third of its lease). Never completes for a permit without a
    /// lease (an in-process store's own, an unlimited key's), which nobody can revoke.
    ///
    /// ```
    /// use inflight::{Limiter, MemoryStore, Policy};
    /// use inflight::AcquireOptions;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let limiter = Limiter::builder(MemoryStore::new()).policy(Policy::new(2, 0)).build();
    /// let options = AcquireOptions::new().holder("10.0.0.7");
    /// let permit = limiter.acquire("app-1", options).await.unwrap();
    /// limiter.revoke("app-1", permit.id()).await.unwrap();
    /// limiter.renew_now().await;
    /// permit.lost().await;
    /// assert!(permit.is_lost());
    /// # }
    /// ```
    pub async fn lost(&self) {
        match self.state() {
            Some(state) => state.lost.wait().await,
            None => std::future::pending().await,
        }
    }

    /// True when the permit counts against its key's limit (false for an unlimited key).
    pub fn is_counted(&self) -> bool {
        matches!(self.hold, Hold::Leased { .. } | Hold::Local { .. })
    }

    /// Releases the slot now, with the store's error if it failed (dropping the permit releases too).
    pub async fn release(mut self) -> Result<(), StoreError> {
        match std::mem::replace(&mut self.hold, Hold::Done) {
            Hold::Leased { state, owner } => owner.release(state).await,
            Hold::Local { slots, .. } => {
                slots.give_back(self.weight);
                Ok(())
            }
            Hold::Free { .. } | Hold::Done => Ok(()),
        }
    }

    /// Hands the slot off as a lease: the limiter stops renewing it and dropping the permit no longer
    /// releases it. Whoever holds the returned [`Lease`] must renew or release it before it expires. (While
    /// another permit of this process holds the same lease, under the same id, the limiter keeps renewing
    /// it, and releases it when that permit goes.)
    pub fn detach(mut self) -> Lease {
        let key: Arc<str> = Arc::from(self.key());
        let id = self.id().clone();
        let token = self.token();
        let expires_at_ms = match std::mem::replace(&mut self.hold, Hold::Done) {
            Hold::Leased { state, owner } => {
                owner.detach(&state);
                state.expires_at_ms.load(Ordering::Relaxed)
            }
            Hold::Local { slots, lease_ms } => slots.hand_off(&id, self.weight, lease_ms, token),
            Hold::Free { .. } | Hold::Done => 0,
        };
        Lease {
            key,
            id,
            weight: self.weight,
            limit: self.limit,
            in_flight: self.in_flight,
            expires_at_ms,
            token,
        }
    }
}

impl Drop for Permit {
    #[inline]
    fn drop(&mut self) {
        match &self.hold {
            // Given back in place (no move of the hold on the proxy's hot path); the slots go with it.
            Hold::Local { slots, .. } => slots.give_back(self.weight),
            Hold::Leased { .. } => {
                if let Hold::Leased { state, owner } = std::mem::replace(&mut self.hold, Hold::Done)
                {
                    owner.dropped(state);
                }
            }
            Hold::Free { .. } | Hold::Done => {}
        }
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("key", &self.key())
            .field("weight", &self.weight)
            .field("limit", &self.limit)
            .field("lost", &self.is_lost())
            .finish()
    }
}
