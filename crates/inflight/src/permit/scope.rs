//! [`Scoped`]: a future that holds its permit until it completes or is dropped.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use super::Permit;

pin_project! {
    /// A future that holds a [`Permit`] until it completes or is dropped; made by [`Permit::scope`].
    #[must_use = "futures do nothing unless awaited; dropping this one releases its permit"]
    pub struct Scoped<F> {
        #[pin]
        future: F,
        permit: Option<Permit>,
    }
}

impl<F: Future> Future for Scoped<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let out = std::task::ready!(this.future.poll(cx));
        this.permit.take();
        Poll::Ready(out)
    }
}

impl Permit {
    /// Holds the permit for the life of `future`: released when it completes or is cancelled.
    ///
    /// ```
    /// use inflight::{Limiter, MemoryStore, Policy};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let limiter = Limiter::builder(MemoryStore::new()).policy(Policy::new(1, 0)).build();
    /// let permit = limiter.try_acquire("app").await.unwrap();
    /// let answer = permit.scope(async { 6 * 7 }).await;
    /// assert_eq!(answer, 42);
    /// assert_eq!(limiter.status("app").await.unwrap().in_flight, 0);
    /// # }
    /// ```
    pub fn scope<F: Future>(self, future: F) -> Scoped<F> {
        Scoped {
            future,
            permit: Some(self),
        }
    }
}
