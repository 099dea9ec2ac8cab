//! [`Permit`]: one admitted request's slot, released exactly once, on every path.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use std::sync::OnceLock;

use crate::error::StoreError;
use crate::id::PermitId;
use crate::policy::Limit;
use crate::store::{Grant, LocalHold};

/// A boxed future: for a permit's release through a store it does not name, and for the store's part of an
/// admission.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a leased permit knows of itself; shared with the limiter's renewal task while it is held.
pub(crate) struct PermitState {
    pub(crate) key: Arc<str>,
    pub(crate) id: PermitId,
    pub(crate) weight: u32,
    pub(crate) lease_ms: u64,
    /// The registry slot, for the renewal task.
    pub(crate) seq: u64,
    pub(crate) expires_at_ms: AtomicU64,
    /// When the renewal task should next renew it, in ms of the limiter's monotonic clock.
    pub(crate) renew_at_ms: AtomicU64,
    pub(crate) lost: AtomicBool,
    pub(crate) released: AtomicBool,
}

/// The limiter side of a leased permit: how to release it. Type-erased so that `Permit` names no store.
pub(crate) trait Owner: Send + Sync + 'static {
    /// Releases now if the store can, else in the background (retrying while the store is away).
    fn release_dropped(self: Arc<Self>, state: Arc<PermitState>);
    /// Releases and reports the store's answer.
    fn release(
        self: Arc<Self>,
        state: Arc<PermitState>,
    ) -> BoxFuture<'static, Result<(), StoreError>>;
    /// Stops renewing: the lease is someone else's to renew or release now.
    fn detach(&self, state: &PermitState);
}

/// How a permit holds its slot.
pub(crate) enum Hold {
    /// A lease in the store, renewed by the limiter while the permit is alive.
    Leased {
        state: Arc<PermitState>,
        owner: Arc<dyn Owner>,
    },
    /// A slot in an in-process store, which needs no lease: it lives exactly as long as the permit.
    Local {
        hold: Arc<dyn LocalHold>,
        lease_ms: u64,
    },
    /// Nothing to hold: the key is unlimited.
    Free { key: Arc<str> },
    /// One permit on each of several keys, taken together (never empty).
    Many(Vec<Permit>),
    /// Released or detached.
    Done,
}

/// One admitted request's slot under a key.
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
        let cell = OnceLock::new();
        if let Some(id) = id {
            let _ = cell.set(id);
        }
        Self {
            hold,
            id: cell,
            weight,
            limit,
            in_flight,
        }
    }

    /// A permit holding a slot of an in-process store (no lease: it lives exactly as long as the permit).
    #[inline]
    pub(crate) fn local(
        hold: Arc<dyn LocalHold>,
        id: Option<PermitId>,
        grant: Grant,
        lease_ms: u64,
    ) -> Self {
        Self::new(
            Hold::Local { hold, lease_ms },
            id,
            grant.weight,
            grant.limit,
            grant.in_flight,
        )
    }

    /// The key this permit counts against.
    pub fn key(&self) -> &str {
        match &self.hold {
            Hold::Leased { state, .. } => &state.key,
            Hold::Local { hold, .. } => hold.key(),
            Hold::Free { key } => key,
            Hold::Many(permits) => permits.first().map_or("", Permit::key),
            Hold::Done => "",
        }
    }

    /// The permit's id: the one given in [`crate::AcquireOptions::id`], else a generated UUID v4.
    pub fn id(&self) -> &PermitId {
        match &self.hold {
            Hold::Leased { state, .. } => &state.id,
            Hold::Many(permits) if !permits.is_empty() => permits[0].id(),
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

    /// When the lease ends unless renewed (ms since the Unix epoch, store clock). 0 when the permit has no
    /// lease: an unlimited key, or a permit held in this process's memory store, which ends only when it is
    /// released.
    pub fn expires_at_ms(&self) -> u64 {
        match &self.hold {
            Hold::Leased { state, .. } => state.expires_at_ms.load(Ordering::Relaxed),
            Hold::Many(permits) => permits
                .iter()
                .map(Permit::expires_at_ms)
                .filter(|at| *at > 0)
                .min()
                .unwrap_or(0),
            _ => 0,
        }
    }

    /// True once a renewal found the lease gone and could not take it back (the key was full): the
    /// request is no longer counted. Finishing its work is still safe; the permit is released as usual.
    pub fn is_lost(&self) -> bool {
        match &self.hold {
            Hold::Leased { state, .. } => state.lost.load(Ordering::Relaxed),
            Hold::Many(permits) => permits.iter().any(Permit::is_lost),
            _ => false,
        }
    }

    /// True when the permit counts against its key's limit (false for an unlimited key).
    pub fn is_counted(&self) -> bool {
        match &self.hold {
            Hold::Leased { .. } | Hold::Local { .. } => true,
            Hold::Many(permits) => permits.iter().any(Permit::is_counted),
            Hold::Free { .. } | Hold::Done => false,
        }
    }

    /// Releases the slot now and reports whether the store took the release.
    ///
    /// Dropping the permit releases it too; this is for callers that want the error.
    pub async fn release(mut self) -> Result<(), StoreError> {
        match std::mem::replace(&mut self.hold, Hold::Done) {
            Hold::Leased { state, owner } => owner.release(state).await,
            Hold::Local { hold, .. } => {
                hold.release(self.weight);
                Ok(())
            }
            Hold::Many(permits) => {
                let mut first_error = Ok(());
                for permit in permits {
                    let result = Box::pin(permit.release()).await;
                    if first_error.is_ok() {
                        first_error = result;
                    }
                }
                first_error
            }
            Hold::Free { .. } | Hold::Done => Ok(()),
        }
    }

    /// Hands the slot off as a lease: the limiter stops renewing it and dropping the permit no longer
    /// releases it. Whoever holds the returned [`Lease`] must renew or release it before it expires.
    pub fn detach(mut self) -> Lease {
        let key: Arc<str> = Arc::from(self.key());
        let id = self.id().clone();
        let expires_at_ms = match std::mem::replace(&mut self.hold, Hold::Done) {
            Hold::Leased { state, owner } => {
                owner.detach(&state);
                state.expires_at_ms.load(Ordering::Relaxed)
            }
            Hold::Local { hold, lease_ms } => hold.hand_off(&id, self.weight, lease_ms),
            // Every key's lease has the same id: whoever takes them over renews or releases each by it.
            Hold::Many(permits) => permits
                .into_iter()
                .map(|permit| permit.detach().expires_at_ms)
                .filter(|at| *at > 0)
                .min()
                .unwrap_or(0),
            Hold::Free { .. } | Hold::Done => 0,
        };
        Lease {
            key,
            id,
            weight: self.weight,
            limit: self.limit,
            in_flight: self.in_flight,
            expires_at_ms,
        }
    }
}

impl Drop for Permit {
    #[inline]
    fn drop(&mut self) {
        match &self.hold {
            // Released in place; the hold itself goes with the field.
            Hold::Local { hold, .. } => hold.release(self.weight),
            Hold::Leased { .. } => {
                if let Hold::Leased { state, owner } = std::mem::replace(&mut self.hold, Hold::Done)
                {
                    owner.release_dropped(state);
                }
            }
            Hold::Many(_) | Hold::Free { .. } | Hold::Done => {}
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
