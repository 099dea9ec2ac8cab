//! [`Reservation`]: an amount held from a key's balance, settled exactly once: committed or refunded by
//! its holder, refunded when dropped unsettled, refunded by the store when its ttl passes with no
//! extension (its holder's process gone).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::task::AbortHandle;

use super::handle::{Backend, QuotaStats};
use super::{Balance, Extension, Settle, Settlement};
use crate::error::StoreError;
use crate::id::PermitId;
use crate::permit::BoxFuture;

/// What settles a reservation: its store and the counters.
#[derive(Clone)]
pub(super) struct Owner {
    pub(super) backend: Arc<dyn Backend>,
    pub(super) stats: Arc<QuotaStats>,
}

/// An amount reserved from a key's balance under an id.
///
/// Settle it with [`Reservation::commit`] (spent) or [`Reservation::refund`] (given back). Dropped
/// unsettled (the work failed, was cancelled or panicked), it is refunded in the background on the
/// current Tokio runtime. While it is held, a task on that runtime (which needs its timers enabled, as
/// the limiter's renewals do) extends it by its ttl every third of one, so work may outlast the ttl;
/// should its process die, the store refunds it once a ttl passes with no extension. A reservation on an unmetered key holds nothing and settling it does nothing.
#[must_use = "the reservation is refunded as soon as it is dropped"]
pub struct Reservation {
    key: Arc<str>,
    id: PermitId,
    amount: u64,
    balance: Option<Balance>,
    expires_at_ms: u64,
    /// Set while it is to be settled here.
    owner: Option<Owner>,
    /// The task that extends it while it is held.
    keeper: Option<Keeper>,
}

/// The task that extends a held reservation, stopped when dropped.
struct Keeper {
    task: AbortHandle,
    /// While this lives, the reservation is held: a keeper that finds it no longer open says so.
    _held: Arc<()>,
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A reservation handed off by [`Reservation::detach`]: whoever holds it settles it by key and id
/// ([`super::Quota::settle`]) before `expires_at_ms`, or the store refunds it then.
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

impl Reservation {
    /// What the store has yet to answer: while armed, dropping it refunds whatever the store may do.
    pub(super) fn pending(key: Arc<str>, id: PermitId, amount: u64, owner: Owner) -> Self {
        Self {
            key,
            id,
            amount,
            balance: None,
            expires_at_ms: 0,
            owner: Some(owner),
            keeper: None,
        }
    }

    pub(super) fn open(
        key: Arc<str>,
        id: PermitId,
        amount: u64,
        balance: Balance,
        expires_at_ms: u64,
        ttl_ms: u64,
        owner: Owner,
    ) -> Self {
        let keeper = keep(&owner, key.clone(), id.clone(), ttl_ms);
        Self {
            key,
            id,
            amount,
            balance: Some(balance),
            expires_at_ms,
            owner: Some(owner),
            keeper,
        }
    }

    pub(super) fn unmetered(key: Arc<str>, id: PermitId, amount: u64) -> Self {
        Self {
            key,
            id,
            amount,
            balance: None,
            expires_at_ms: 0,
            owner: None,
            keeper: None,
        }
    }

    /// Nothing to settle on drop any more, nor to extend: returns who would have settled it.
    pub(super) fn disarm(&mut self) -> Option<Owner> {
        self.keeper = None;
        self.owner.take()
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

    /// Spends the amount. Dropping the future before it completes lets the commit finish in the
    /// background.
    pub fn commit(self) -> Settling {
        self.settle(Settle::Commit)
    }

    /// Gives the amount back to the balance. Dropping the future before it completes lets the refund
    /// finish in the background.
    pub fn refund(self) -> Settling {
        self.settle(Settle::Refund)
    }

    /// Commits or refunds, as `settle` says.
    pub fn settle(mut self, settle: Settle) -> Settling {
        let future = match self.disarm() {
            Some(owner) => settling(owner, self.key.clone(), self.id.clone(), settle),
            None => Box::pin(std::future::ready(Ok(Settlement::NotFound(self.balance)))),
        };
        Settling {
            future: Some(future),
        }
    }

    /// Hands the reservation off: dropping it no longer refunds it, and its holder settles it by key and
    /// id before it expires.
    pub fn detach(mut self) -> DetachedReservation {
        self.disarm();
        DetachedReservation {
            key: self.key.clone(),
            id: self.id.clone(),
            amount: self.amount,
            balance: self.balance,
            expires_at_ms: self.expires_at_ms,
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(owner) = self.disarm() {
            let refund = settling(owner, self.key.clone(), self.id.clone(), Settle::Refund);
            background(Box::pin(async move { drop(refund.await) }));
        }
    }
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("key", &self.key)
            .field("id", &self.id)
            .field("amount", &self.amount)
            .field("balance", &self.balance)
            .finish()
    }
}

/// The settlement of a [`Reservation`], as its store answers it. Dropped before it completes, it
/// finishes in the background on the current Tokio runtime.
#[must_use = "dropped, the settlement finishes in the background and its answer is lost"]
pub struct Settling {
    future: Option<BoxFuture<'static, Result<Settlement, StoreError>>>,
}

impl Future for Settling {
    type Output = Result<Settlement, StoreError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(future) = self.future.as_mut() else {
            panic!("Settling polled after completion");
        };
        let out = std::task::ready!(future.as_mut().poll(cx));
        self.future = None;
        Poll::Ready(out)
    }
}

impl Drop for Settling {
    fn drop(&mut self) {
        if let Some(future) = self.future.take() {
            background(Box::pin(async move { drop(future.await) }));
        }
    }
}

impl fmt::Debug for Settling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let done = self.future.is_none();
        f.debug_struct("Settling").field("done", &done).finish()
    }
}

fn settling(
    owner: Owner,
    key: Arc<str>,
    id: PermitId,
    settle: Settle,
) -> BoxFuture<'static, Result<Settlement, StoreError>> {
    Box::pin(async move {
        let settled = owner.backend.settle(&key, &id, settle).await;
        match &settled {
            Ok(settlement) => owner.stats.settled(&key, settle, settlement),
            Err(error) => {
                tracing::warn!(%error, %key, %id, ?settle, "a reservation was not settled; it will expire and be refunded");
            }
        }
        settled
    })
}

/// Extends the reservation by `ttl_ms` every third of it, on the current Tokio runtime, until it is
/// aborted or finds the reservation no longer open; `None` without a runtime (the reservation then
/// ends with its ttl).
fn keep(owner: &Owner, key: Arc<str>, id: PermitId, ttl_ms: u64) -> Option<Keeper> {
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    let owner = owner.clone();
    let held = Arc::new(());
    let still_held = Arc::downgrade(&held);
    let every = Duration::from_millis((ttl_ms / 3).max(1));
    // After a failure, sooner: a third of the ttl twice more would let it expire while held.
    let again = Duration::from_millis((ttl_ms / 10).max(1));
    let mut wait = every;
    let keeper = runtime.spawn(async move {
        loop {
            tokio::time::sleep(wait).await;
            let extension = owner.backend.extend(&key, &id, ttl_ms).await;
            if let Ok(extension) = &extension {
                owner.stats.saw(&key, extension.balance().as_ref());
            }
            match extension {
                Ok(Extension::Extended { .. }) => wait = every,
                Ok(Extension::NotOpen(_)) => {
                    // (Settled a moment ago, as the keeper was stopped: nothing to say.)
                    if still_held.strong_count() == 0 {
                        return;
                    }
                    tracing::warn!(%key, %id, "a held reservation was no longer open: it expired (refunded) before it was settled");
                    return;
                }
                Err(error) => {
                    tracing::warn!(%error, %key, %id, "a held reservation was not extended; trying again");
                    wait = again;
                }
            }
        }
    });
    Some(Keeper {
        task: keeper.abort_handle(),
        _held: held,
    })
}

/// Runs `future` to its end without anyone waiting for it: polled once here (an in-process store is
/// done then; a remote one has the request), then left to the current runtime.
fn background(mut future: BoxFuture<'static, ()>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(
            "no Tokio runtime to settle a reservation on; it will expire and be refunded"
        );
        return;
    };
    if future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
        .is_pending()
    {
        runtime.spawn(future);
    }
}
