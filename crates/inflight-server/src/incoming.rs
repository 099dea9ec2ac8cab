//! A request's body as the API and the proxy read it: hyper's, ended by an error when the client stops
//! sending it for `--body-timeout`, so that a client cannot hold a request (and its permit) open by
//! sending part of a body and then nothing.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

/// What a body-reading error is made of: hyper's, or the timeout.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pin_project! {
    /// See the module docs; the clock runs only while the reader waits for the client, not its upstream.
    pub struct RequestBody {
        #[pin]
        inner: Incoming,
        #[pin]
        wait: Sleep,
        timeout: Duration,
        waiting: bool,
    }
}

impl RequestBody {
    /// `inner`, which may wait for its client `timeout` at most at a time. Call it inside a runtime.
    pub fn new(inner: Incoming, timeout: Duration) -> Self {
        Self {
            inner,
            wait: tokio::time::sleep_until(Instant::now() + timeout),
            timeout,
            waiting: false,
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        if let Poll::Ready(frame) = this.inner.poll_frame(cx) {
            *this.waiting = false;
            return Poll::Ready(frame.map(|frame| frame.map_err(BoxError::from)));
        }
        if !*this.waiting {
            *this.waiting = true;
            this.wait.as_mut().reset(Instant::now() + *this.timeout);
        }
        match this.wait.poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimeout(*this.timeout))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The client sent nothing of a request's body for this long.
#[derive(Debug, thiserror::Error)]
#[error("the request's body stopped arriving: nothing came for {}", humantime::format_duration(*.0))]
pub struct BodyTimeout(pub Duration);

/// The body timeout behind `error`, if that is what it comes from (through any chain of sources).
pub fn body_timeout<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a BodyTimeout> {
    std::iter::successors(Some(error), |cause| cause.source())
        .find_map(|cause| cause.downcast_ref::<BodyTimeout>())
}
