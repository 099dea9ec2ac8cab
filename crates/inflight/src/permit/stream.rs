//! [`PermitStream`]: a stream that holds its permit until it ends or is dropped.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures_core::Stream;
use pin_project_lite::pin_project;

use super::Permit;

pin_project! {
    /// A stream that holds a [`Permit`] until it ends (returns `None`, and yields nothing after) or is
    /// dropped: a client that goes away mid-stream frees the slot.
    ///
    /// ```
    /// use futures_util::{stream, StreamExt};
    /// use inflight::{Limiter, MemoryStore, Policy};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let limiter = Limiter::builder(MemoryStore::new()).policy(Policy::new(1, 0)).build();
    /// let permit = limiter.try_acquire("app").await.unwrap();
    /// let mut tokens = permit.guard_stream(stream::iter(["Hello", ", ", "world"]));
    /// assert!(limiter.try_acquire("app").await.is_err()); // the stream holds the slot
    /// while let Some(token) = tokens.next().await {
    ///     print!("{token}");
    /// }
    /// assert!(limiter.try_acquire("app").await.is_ok()); // released at the end of the stream
    /// # }
    /// ```
    #[must_use = "streams do nothing unless polled; dropping this one releases its permit"]
    pub struct PermitStream<St> {
        #[pin]
        stream: St,
        permit: Option<Permit>,
    }
}

impl<St> PermitStream<St> {
    /// Wraps `stream` so that it holds `permit`.
    pub fn new(stream: St, permit: Permit) -> Self {
        Self {
            stream,
            permit: Some(permit),
        }
    }

    /// The permit, until the stream ends.
    pub fn permit(&self) -> Option<&Permit> {
        self.permit.as_ref()
    }
}

impl<St: Stream> Stream for PermitStream<St> {
    type Item = St::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.project();
        if this.permit.is_none() {
            return Poll::Ready(None);
        }
        let item = std::task::ready!(this.stream.poll_next(cx));
        if item.is_none() {
            this.permit.take();
        }
        Poll::Ready(item)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.permit.is_none() {
            (0, Some(0))
        } else {
            self.stream.size_hint()
        }
    }
}

impl Permit {
    /// Moves the permit into `stream`: it is released when the stream ends or is dropped.
    pub fn guard_stream<St: Stream>(self, stream: St) -> PermitStream<St> {
        PermitStream::new(stream, self)
    }
}
