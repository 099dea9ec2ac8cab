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
    state: State<'a, S>,
}

enum State<'a, S: Store> {
    Start {
        limiter: &'a Limiter<S>,
        key: &'a str,
        options: AcquireOptions,
    },
    /// The store is deciding (boxed: it is a network round trip, and this keeps the common future small).
    Store(BoxFuture<'a, Result<Permit, AcquireError>>),
    Done,
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
    /// store may have granted under a generated id; a lease under a given id ends with its lease.
    pub fn try_acquire_with<'a>(
        &'a self,
        key: &'a str,
        options: AcquireOptions,
    ) -> TryAcquire<'a, S> {
        TryAcquire {
            state: State::Start {
                limiter: self,
                key,
                options,
            },
        }
    }
}

impl<S: Store> Future for TryAcquire<'_, S> {
    type Output = Result<Permit, AcquireError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let State::Start {
            limiter,
            key,
            options,
        } = &mut this.state
        {
            let (limiter, key) = (*limiter, *key);
            match limiter.acquire_now(&[key], options) {
                Now::Local {
                    slots,
                    grant,
                    lease_ms,
                } => {
                    this.state = State::Done;
                    return Poll::Ready(Ok(Permit::local(slots, None, grant, lease_ms)));
                }
                Now::Decided(decided) => {
                    this.state = State::Done;
                    return Poll::Ready(decided.map_err(|(_, error)| error));
                }
                Now::Store(prepared) => {
                    this.state = State::Store(Box::pin(async move {
                        let keys = [key];
                        let decided = limiter.acquire_in_store(&keys, prepared).await;
                        decided.map_err(|(_, error)| error)
                    }));
                }
            }
        }
        match &mut this.state {
            State::Store(future) => {
                let out = std::task::ready!(future.as_mut().poll(cx));
                this.state = State::Done;
                Poll::Ready(out)
            }
            _ => panic!("TryAcquire polled after completion"),
        }
    }
}

impl<S: Store> fmt::Debug for TryAcquire<'_, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Start { .. } => "start",
            State::Store(_) => "store",
            State::Done => "done",
        };
        f.debug_struct("TryAcquire").field("state", &state).finish()
    }
}
