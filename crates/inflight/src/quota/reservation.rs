//! [`Reservation`]: an amount held from a key's balance, settled exactly once: committed or refunded by
//! its holder, refunded when dropped unsettled, refunded by the store when its ttl passes with no
//! extension (its holder's process gone).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use super::handle::Quota;
use super::store::{Balance, Extension, QuotaStore, Settle, Settlement};
use crate::error::StoreError;
use crate::id::PermitId;
use crate::limiter::{Attempt, Deferred, Extend, Unsettled};
use crate::permit::BoxFuture;
use crate::store::{AnyStore, Store};

/// An amount reserved from a key's balance under an id.
///
/// Settle it with [`Reservation::commit`] (spent) or [`Reservation::refund`] (given back). Dropped
/// unsettled (the work failed, was cancelled or panicked), it is refunded in the background by its
/// quota's limiter, on any thread, with a runtime or not. While it is held, that limiter's task
/// extends it by its ttl every third of one, so work may outlast the ttl; should its process die, the
/// store refunds it once a ttl passes with no extension. A reservation on an unmetered key holds
/// nothing and settling it does nothing.
#[must_use = "the reservation is refunded as soon as it is dropped"]
pub struct Reservation<S: Store + QuotaStore = AnyStore> {
    key: Arc<str>,
    id: PermitId,
    amount: u64,
    balance: Option<Balance>,
    expires_at_ms: u64,
    /// Set while it is settled here: its quota, its number among those its limiter keeps open, its ttl.
    open: Option<(Quota<S>, Option<u64>, u64)>,
}

/// A reservation handed off by [`Reservation::detach`]: whoever holds it settles it by key and id
/// ([`Quota::settle`]) before `expires_at_ms`, or the store refunds it then.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DetachedReservation {
    /// The key charged.
    pub key: Arc<str>,
    /// The reservation's id.
    pub id: PermitId,
    /// The amount reserved.
    pub amount: u64,
    /// The key's balance after the reservation; `None`: the key is unmetered and nothing is held.
    pub balance: Option<Balance>,
    /// When the store refunds it unless settled (ms since the Unix epoch, store clock; 0: unmetered).
    pub expires_at_ms: u64,
}

impl<S: Store + QuotaStore> Reservation<S> {
    /// Nothing held: a reservation on an unmetered key.
    pub(super) fn unmetered(key: Arc<str>, id: PermitId, amount: u64) -> Self {
        Self {
            key,
            id,
            amount,
            balance: None,
            expires_at_ms: 0,
            open: None,
        }
    }

    /// What the store has yet to answer: while `armed` (with its quota and ttl), dropping it refunds
    /// whatever the store may do.
    pub(super) fn pending(
        key: Arc<str>,
        id: PermitId,
        amount: u64,
        armed: Option<(Quota<S>, u64)>,
    ) -> Self {
        let mut pending = Self::unmetered(key, id, amount);
        pending.open = armed.map(|(quota, ttl_ms)| (quota, None, ttl_ms));
        pending
    }

    /// An open reservation (its balance and deadline as answered), kept open while it is held.
    pub(super) fn open(
        key: Arc<str>,
        id: PermitId,
        amount: u64,
        (balance, expires_at_ms): (Balance, u64),
        ttl_ms: u64,
        quota: Quota<S>,
    ) -> Self {
        // The limiter's renewal task extends it by `ttl_ms`, until it is no longer open.
        let ttl = Some(Duration::from_millis(ttl_ms));
        let extend: Extend = Box::new(again(&quota, &key, &id, move |quota, key, id| async move {
            match quota.extend(&key, &id, ttl).await {
                Ok(Extension::Extended { .. }) => Ok(true),
                Ok(Extension::NotOpen(_)) => Ok(false),
                Err(super::QuotaError::Store(error)) => Err(error),
                Err(other) => Err(StoreError::Rejected(other.to_string())),
            }
        }));
        let kept = quota
            .limiter()
            .keep_open(key.clone(), id.clone(), ttl_ms, extend);
        let mut open = Self::unmetered(key, id, amount);
        (open.balance, open.expires_at_ms) = (Some(balance), expires_at_ms);
        open.open = Some((quota, Some(kept), ttl_ms));
        open
    }

    /// Nothing to settle on drop any more, nor to extend: returns who would have settled it.
    pub(super) fn disarm(&mut self) -> Option<Quota<S>> {
        let (quota, kept, _) = self.open.take()?;
        if let Some(number) = kept {
            quota.limiter().stop_keeping(number);
        }
        Some(quota)
    }

    /// The key charged.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The reservation's id.
    pub fn id(&self) -> &PermitId {
        &self.id
    }

    /// The amount reserved.
    pub fn amount(&self) -> u64 {
        self.amount
    }

    /// The key's balance right after the reservation; `None` for an unmetered key.
    pub fn balance(&self) -> Option<Balance> {
        self.balance
    }

    /// When the store refunds the reservation unless it is settled or extended first (ms since the
    /// Unix epoch, store clock), as first answered; 0 for an unmetered key.
    pub fn expires_at_ms(&self) -> u64 {
        self.expires_at_ms
    }

    /// True when something is held (the key is metered).
    pub fn is_metered(&self) -> bool {
        self.balance.is_some()
    }

    /// Spends the amount; a dropped future's commit finishes in the background.
    pub fn commit(self) -> Settling {
        self.settle(Settle::Commit)
    }

    /// Gives the amount back; a dropped future's refund finishes in the background.
    pub fn refund(self) -> Settling {
        self.settle(Settle::Refund)
    }

    /// Commits or refunds, as `settle` says.
    pub fn settle(mut self, settle: Settle) -> Settling {
        let unsettled = self.unsettled(settle);
        let future: BoxFuture<'static, _> = match self.disarm() {
            None => Box::pin(std::future::ready(Ok(Settlement::NotFound(self.balance)))),
            Some(quota) => {
                let (key, id) = (self.key.clone(), self.id.clone());
                Box::pin(async move { quota.settle(&key, &id, settle).await })
            }
        };
        Settling {
            future: Some(future),
            unsettled,
        }
    }

    /// Hands the reservation off: dropping it no longer refunds it; see [`DetachedReservation`].
    pub fn detach(mut self) -> DetachedReservation {
        self.disarm();
        self.described()
    }

    /// What [`Reservation::detach`] hands off, without detaching it.
    pub(super) fn described(&self) -> DetachedReservation {
        DetachedReservation {
            key: self.key.clone(),
            id: self.id.clone(),
            amount: self.amount,
            balance: self.balance,
            expires_at_ms: self.expires_at_ms,
        }
    }

    /// The settlement as the quota's limiter finishes it in the background when the guard returned is
    /// dropped armed (tried until a ttl from now, past which the store refunds it).
    fn unsettled(&self, settle: Settle) -> Option<Unsettled> {
        let (quota, _, ttl_ms) = self.open.as_ref()?;
        let settled = move |quota: Quota<S>, key: Arc<str>, id: PermitId| async move {
            quota.settle(&key, &id, settle).await.map(drop)
        };
        let attempt: Attempt = Box::new(again(quota, &self.key, &self.id, settled));
        let deferred = Deferred {
            what: match settle {
                Settle::Commit => "commit",
                Settle::Refund => "refund",
            },
            key: self.key.clone(),
            id: self.id.clone(),
            within: Duration::from_millis((*ttl_ms).max(1)),
            attempt,
        };
        Some(Unsettled::new(quota.limiter().settler(), Some(deferred)))
    }
}

impl<S: Store + QuotaStore> Drop for Reservation<S> {
    fn drop(&mut self) {
        // Dropped armed: refunded in the background.
        let refund = self.unsettled(Settle::Refund);
        self.disarm();
        drop(refund);
    }
}

impl<S: Store + QuotaStore> fmt::Debug for Reservation<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("key", &self.key)
            .field("id", &self.id)
            .field("amount", &self.amount)
            .field("balance", &self.balance)
            .finish()
    }
}

/// The settlement of a [`Reservation`], as its store answers it. Dropped before it completes, it is
/// finished in the background by the quota's limiter, like a dropped reservation's refund.
#[must_use = "dropped, the settlement finishes in the background and its answer is lost"]
pub struct Settling {
    future: Option<BoxFuture<'static, Result<Settlement, StoreError>>>,
    /// Armed until the answer: dropped armed, the settlement is finished in the background.
    unsettled: Option<Unsettled>,
}

impl Future for Settling {
    type Output = Result<Settlement, StoreError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(future) = self.future.as_mut() else {
            panic!("Settling polled after completion");
        };
        let out = std::task::ready!(future.as_mut().poll(cx));
        self.future = None;
        if let Some(unsettled) = self.unsettled.as_mut() {
            unsettled.disarm_unless(false);
        }
        Poll::Ready(out)
    }
}

impl fmt::Debug for Settling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let done = self.future.is_none();
        f.debug_struct("Settling").field("done", &done).finish()
    }
}

/// `call` on the reservation `key`, `id` of `quota`, as often as it is asked for (a settlement's tries, a
/// kept reservation's extensions).
fn again<S: Store + QuotaStore, F: Future + Send + 'static>(
    quota: &Quota<S>,
    key: &Arc<str>,
    id: &PermitId,
    call: impl Fn(Quota<S>, Arc<str>, PermitId) -> F + Send + Sync + 'static,
) -> impl Fn() -> BoxFuture<'static, F::Output> + Send + Sync + 'static {
    let (quota, key, id) = (quota.clone(), key.clone(), id.clone());
    move || Box::pin(call(quota.clone(), key.clone(), id.clone()))
}
