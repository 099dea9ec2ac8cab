//! [`TryAcquire`]: the future of one admission on one key.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::admission::Now;
use super::Limiter;
use crate::error::AcquireError;
use crate::options::AcquireOptions;
use crate::permit::{BoxFuture, Permit};
use crate::store::Store;

/// The future returned by [`Limiter::try_acquire`] and [`Limiter::try_acquire_with`].
///
/// On its first poll it decides what needs no waiting (an invalid request, an in-process store) and
/// completes at once; otherwise it asks the store. It never waits for room.
#[must_use = "futures do nothing unless awaited"]
pub struct TryAcquire<'a, S: Store> {
    limiter: &'a Limiter<S>,
    key: &'a str,
    options: AcquireOptions,
    /// Polled once: the decision that needs no waiting is made.
    started: bool,
    /// The store is deciding (boxed: it is a network round trip, and this keeps the common future small).
    store: Option<BoxFuture<'a, Result<Permit, AcquireError>>>,
}

impl<S: Store> Limiter<S> {
    /// Admits one request under `key` now, or says why not; never waits for room.
    pub fn try_acquire<'a>(&'a self, key: &'a str) -> TryAcquire<'a, S> {
        self.try_acquire_with(key, AcquireOptions::new())
    }

    /// Admits one request under `key` with `options`, or says why not; never waits for room.
    ///
    /// An in-process store admits without awaiting anything.
    ///
    /// # Cancel safety
    ///
    /// Cancelling the future while the store decides releases, in the background, whatever lease the
    /// store grants: under a generated id by the id, under a given id once the store has answered, by the
    /// admission's own token (so that another admission of the id keeps its lease). A store that cannot
    /// answer (it timed out) leaves a lease under a given id to its deadline.
    pub fn try_acquire_with<'a>(
        &'a self,
        key: &'a str,
        options: AcquireOptions,
    ) -> TryAcquire<'a, S> {
        TryAcquire {
            limiter: self,
            key,
            options,
            started: false,
            store: None,
        }
    }
}

impl<S: Store> Future for TryAcquire<'_, S> {
    type Output = Result<Permit, AcquireError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if !this.started {
            this.started = true;
            let (limiter, key) = (this.limiter, this.key);
            match limiter.acquire_now(&[key], &mut this.options, None) {
                Now::Local {
                    slots,
                    grant,
                    lease_ms,
                } => return Poll::Ready(Ok(Permit::local(slots, None, grant, lease_ms))),
                Now::Decided(decided) => return Poll::Ready(decided.map_err(|(_, error)| error)),
                Now::Store(prepared) => {
                    this.store = Some(Box::pin(async move {
                        let keys = [key];
                        let (decided, _) = limiter.acquire_in_store(&keys, prepared).await;
                        decided.map_err(|(_, error)| error)
                    }));
                }
            }
        }
        let Some(future) = &mut this.store else {
            panic!("TryAcquire polled after completion");
        };
        let out = std::task::ready!(future.as_mut().poll(cx));
        this.store = None;
        Poll::Ready(out)
    }
}

impl<S: Store> fmt::Debug for TryAcquire<'_, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match (self.started, &self.store) {
            (false, _) => "start",
            (true, Some(_)) => "store",
            (true, None) => "done",
        };
        f.debug_struct("TryAcquire").field("state", &state).finish()
    }
}
