//! [`TryAcquire`]: the future of one admission.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::error::AcquireError;
use crate::limiter::{Limiter, Now};
use crate::options::AcquireOptions;
use crate::permit::{BoxFuture, Permit};
use crate::store::Store;

/// The future returned by [`Limiter::try_acquire`] and [`Limiter::try_acquire_with`].
///
/// On its first poll it decides what needs no waiting (an unlimited key, an in-process store) and
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

impl<'a, S: Store> TryAcquire<'a, S> {
    pub(crate) fn new(limiter: &'a Limiter<S>, key: &'a str, options: AcquireOptions) -> Self {
        Self {
            state: State::Start {
                limiter,
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
            match limiter.acquire_now(key, options) {
                Now::Local {
                    hold,
                    grant,
                    lease_ms,
                } => {
                    this.state = State::Done;
                    return Poll::Ready(Ok(Permit::local(hold, None, grant, lease_ms)));
                }
                Now::Decided(decided) => {
                    this.state = State::Done;
                    return Poll::Ready(decided);
                }
                Now::Store(prepared) => {
                    this.state = State::Store(Box::pin(limiter.acquire_in_store(key, prepared)));
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
