//! What every store does: the [`Store`] trait, and the requests and decisions it passes.

use std::future::Future;
use std::sync::Arc;

use crate::error::StoreError;
use crate::floors::Floors;
use crate::id::PermitId;
use crate::policy::{ClassLimits, Limit};

/// The keys of one permit: one key, or several taken together. Never empty, no key twice.
pub type Keys = Arc<[Arc<str>]>;

/// One admission to decide: a lease of `weight` for `id` under every key of `keys`, or under none.
#[derive(Clone, Copy, Debug)]
pub struct AcquireRequest<'a> {
    /// The keys whose in-flight counts are limited (at least one, no key twice).
    pub keys: &'a [&'a str],
    /// The permit's id. Acquiring an id a key already holds refreshes that lease and counts once.
    pub id: &'a PermitId,
    /// How many slots the permit takes on each key (>= 1).
    pub weight: u32,
    /// How long the lease lasts unless renewed, in milliseconds.
    pub lease_ms: u64,
    /// The limits of each key's class, in the order of `keys` (the store applies each key's override).
    pub limits: &'a [ClassLimits],
    /// `id` was generated for this admission: no earlier admission used it, so no release of another
    /// admission can name it, and a store may keep less for its lease (Redis keeps no token for it).
    pub generated: bool,
    /// A waiter's ticket ([`crate::store::Wakeups::ticket`]): refused as full, the admission takes (or
    /// keeps) a place in the refusing key's queue; admitted, it leaves. Stores without queues ignore it.
    pub ticket: Option<Ticket<'a>>,
    /// The admission's priority level: where it waits ([`Ticket`]), and which floors it may not take.
    pub priority: u8,
    /// The floors of each key's class, in the order of `keys`; empty when no class has floors.
    pub floors: &'a [Floors],
    /// A label for the lease and the ticket, listed with them ([`crate::store::Holders::permits`]): at
    /// most [`crate::store::MAX_HOLDER_LEN`] bytes.
    pub holder: Option<&'a str>,
    /// Which keys' limits are watched, not enforced (bit i: key i; [`crate::Policy::shadow`]): the lease
    /// counts there, but the key neither refuses nor queues the admission; [`Admission::Admitted`] says
    /// where it went past the limit. A store without shadow limits refuses a request with any.
    pub shadow: u32,
}

/// A waiter's place in a key's queue, shared by every process: ordered by the admission's priority
/// (higher first), then by its flow's turn (flows of one priority are served in turn), then by arrival.
#[derive(Clone, Copy, Debug)]
pub struct Ticket<'a> {
    /// Its name ([`crate::store::Turn::name`]).
    pub name: &'a str,
    /// Its flow: the tenant, say ("": the flow of waiters that name none).
    pub flow: &'a str,
    /// Its flow's weight (at least 1): tickets of the flow per turn of its level's round.
    pub flow_weight: u32,
    /// How long the place is kept unless its waiter asks again, in milliseconds.
    pub lease_ms: u64,
    /// The waiter takes the slot a release frees for it without asking again: the store records the
    /// admission's lease (under its id, weight and lease, with a token of its own) in the release's step
    /// and tells the waiter ([`crate::store::Turn::handed`]). Only for an admission on one key whose class
    /// has no floors, under an id no other admission uses; a store may call its turn instead.
    pub handoff: bool,
}

/// A lease as the store sees it after an admission or a renewal (of its first key).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The key's effective limit at that moment.
    pub limit: Limit,
    /// The key's in-flight count (by weight) including this lease.
    pub in_flight: u32,
    /// The lease's weight.
    pub weight: u32,
    /// When the lease ends unless renewed, in the store's clock (ms since the Unix epoch).
    pub expires_at_ms: u64,
    /// The admission's fencing token (see [`Store::acquire`]); 0 when nothing was recorded.
    pub token: u64,
    /// Which keys of the admission recorded its lease (bit `i`: key `i`; 0 after a renewal): a renewal
    /// that finds the lease gone from one of these, and no room to take it back, reports the permit
    /// lost, where a key that never counted it (limited only since) is left to take it when it fits.
    pub counted: u32,
}

/// The store's decision on an [`AcquireRequest`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// The lease was added on every limited key (or refreshed, for an id already held).
    Admitted {
        /// The lease, as its first key sees it.
        grant: Grant,
        /// Expired leases the admission reclaimed: a sign of crashed holders.
        reclaimed: u32,
        /// The keys of [`AcquireRequest::shadow`] whose limits it went past (bit i: key i).
        shadowed: u32,
    },
    /// Every key is unlimited: nothing was recorded.
    Unlimited,
    /// The key at `index` of the request's keys is at its limit; nothing was recorded.
    Full {
        /// Which key refused.
        index: usize,
        /// Its effective limit.
        limit: u32,
        /// Its in-flight count (by weight).
        in_flight: u32,
        /// Expired leases reclaimed on the way.
        reclaimed: u32,
    },
    /// As [`Admission::Full`], and the request's ticket holds a place in the queue of the key at `index`.
    Queued {
        /// Which key refused.
        index: usize,
        /// Its effective limit.
        limit: u32,
        /// Its in-flight count (by weight).
        in_flight: u32,
        /// Expired leases reclaimed on the way.
        reclaimed: u32,
    },
    /// The weight is over the limit of the key at `index` and can never fit.
    TooHeavy {
        /// Which key refused.
        index: usize,
        /// Its effective limit.
        limit: u32,
    },
}

/// One lease to renew.
#[derive(Clone, Debug)]
pub struct RenewRequest {
    /// The permit's keys.
    pub keys: Keys,
    /// The permit's id.
    pub id: PermitId,
    /// The new lease from now, in milliseconds; `None` keeps the length the lease was acquired with.
    pub lease_ms: Option<u64>,
    /// The limits of each key's class, in the order of `keys`: to report the effective limit and to
    /// judge a re-add.
    pub limits: Vec<ClassLimits>,
    /// When the lease is gone (the store lost it, or it expired): add it again with this weight if every
    /// key has room. The library's own permits do; a renewal from a remote caller does not.
    pub readd_weight: Option<u32>,
    /// The token of the admission renewed (0: whichever the id holds). A lease a later admission of
    /// the id took is not this one's: [`Renewal::Lost`], and left as it is.
    pub token: u64,
    /// The keys that recorded the lease at admission ([`Grant::counted`]; 0: not known).
    pub counted: u32,
}

/// The outcome of one renewal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The lease was held and now lasts longer.
    Renewed(Grant),
    /// The lease was gone and has been added again.
    Readded(Grant),
    /// The lease was gone (and, when asked to, could not be added again).
    Lost,
}

/// What a key looks like now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyStatus {
    /// The effective limit under the policy asked with.
    pub limit: Limit,
    /// The key's override, if it has one.
    pub override_limit: Option<u32>,
    /// How many (by weight) are in flight, counting only unexpired leases.
    pub in_flight: u32,
}

/// What [`Store::status`] does to the key's override first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverrideChange {
    /// Nothing: just read.
    Keep,
    /// Sets the override to this limit (0 clears it).
    Set(u32),
    /// Clears the override: the class's default applies again.
    Clear,
}

/// A permit as [`Store::index`] recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// Its keys.
    pub keys: Keys,
    /// The length of its lease, as last recorded.
    pub lease_ms: u64,
    /// The key its reservation (under the permit's id) charges, if it has one to settle on release.
    pub quota: Option<Arc<str>>,
}

/// What [`Store::index`] does.
#[derive(Clone, Copy, Debug)]
pub enum IndexOp<'a> {
    /// Records the fields under the id for `ttl_ms`, replacing what was there, unless a live entry
    /// names other keys: then [`StoreError::IdInUse`], nothing changed; answers `None`.
    Put {
        /// The permit's keys.
        keys: &'a [Arc<str>],
        /// The length of its lease.
        lease_ms: u64,
        /// How long the entry lasts.
        ttl_ms: u64,
        /// The key its reservation charges, if any.
        quota: Option<&'a str>,
    },
    /// Finds the keys.
    Get,
    /// Removes the entry; answers `None`.
    Remove,
}

/// Slots held by a permit of this process in an in-process store, without a lease.
pub trait LocalSlots: Send + Sync + 'static {
    /// The first key the slots are under.
    fn key(&self) -> &str;
    /// Gives back `weight` slots on every key.
    fn give_back(&self, weight: u32);
    /// Turns the slots into a lease under `id` that ends `lease_ms` from now unless renewed, keeping the
    /// in-flight counts as they are and the admission's `token`; returns the deadline.
    fn hand_off(&self, id: &PermitId, weight: u32, lease_ms: u64, token: u64) -> u64;
}

/// The decision of [`Store::hold`].
pub enum LocalAdmission {
    /// Admitted: the permit keeps `slots` until it is released.
    Taken {
        /// The slots.
        slots: Arc<dyn LocalSlots>,
        /// The admission (its `expires_at_ms` is 0: there is no lease).
        grant: Grant,
        /// Expired leases reclaimed on the way.
        reclaimed: u32,
    },
    /// Any other decision.
    Decided(Admission),
}

/// Where leases and limit overrides live. Each method is one atomic step.
///
/// Clones share the same state (as processes share one Redis). Implement it for a new backend and run
/// the behaviour suite against it.
pub trait Store: Clone + Send + Sync + 'static {
    /// Decides one admission atomically: reclaims expired leases, resolves each key's limit, and adds the
    /// lease on every limited key if it fits on all of them.
    ///
    /// Each admission gets a fencing token ([`Grant::token`]): larger than every token given before on
    /// each of its keys, by every process sharing the store. A lease under a given id keeps its token; a
    /// later admission of the same id takes the lease over with a new one, and a release or renewal
    /// naming the old token leaves it alone, in whatever order they reach the store.
    fn acquire(
        &self,
        req: AcquireRequest<'_>,
    ) -> impl Future<Output = Result<Admission, StoreError>> + Send;

    /// Removes the lease `id` from every key of `keys`, unless a later admission of the id took it over
    /// (a token other than `token`; 0: whichever lease the id holds); whether any was held (releasing
    /// twice is no error).
    fn release(
        &self,
        keys: &[Arc<str>],
        id: &PermitId,
        token: u64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Renews leases, one outcome per request in the same order.
    fn renew(
        &self,
        batch: &[RenewRequest],
    ) -> impl Future<Output = Result<Vec<Renewal>, StoreError>> + Send;

    /// Reads a key's limit and in-flight count after changing its override as `change` says (`limits`:
    /// its class's); every process sharing the store sees a new override at its next admission.
    fn status(
        &self,
        key: &str,
        limits: ClassLimits,
        change: OverrideChange,
    ) -> impl Future<Output = Result<KeyStatus, StoreError>> + Send;

    /// The fast path, decided without I/O when it can be: an admission of this process that needs no
    /// lease (`given_id` is false) when the store lives in this process, or any admission on keys that
    /// are all unlimited (their classes' limits are 0, and the store knows that none has an override).
    /// A permit that gets a [`LocalSlots`] keeps it and gives its slots back by being released, which
    /// dropping it does. `None` means "cannot: use [`Store::acquire`]".
    fn hold(
        &self,
        keys: &[&str],
        limits: &[ClassLimits],
        weight: u32,
        given_id: bool,
    ) -> Option<LocalAdmission> {
        let _ = (keys, limits, weight, given_id);
        None
    }

    /// The index of permits handed to remote callers, by id, so that a caller that knows only the id can
    /// renew or release one. Entries end by themselves after their `ttl_ms`.
    fn index(
        &self,
        id: &PermitId,
        op: IndexOp<'_>,
    ) -> impl Future<Output = Result<Option<Recorded>, StoreError>> + Send;

    /// Housekeeping, called by the limiter about once a second and by health checks: an in-process store
    /// reclaims expired leases and forgets idle keys; a remote one checks that it can be reached.
    fn maintain(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Ok(()))
    }
}
