//! [`PermitBody`]: a response body that holds its permit until the body ends or is dropped.

use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use inflight::Permit;
use pin_project_lite::pin_project;

pin_project! {
    /// A body that holds a [`Permit`] until its last frame has been read, it fails, or it is dropped;
    /// frames pass through unbuffered.
    pub struct PermitBody<B> {
        #[pin]
        inner: B,
        permit: Option<Permit>,
    }
}

impl<B> PermitBody<B> {
    /// `inner`, holding `permit` (or nothing, for an answer that holds no slot).
    pub fn new(inner: B, permit: Option<Permit>) -> Self {
        Self { inner, permit }
    }

    /// The permit, until the body ends.
    pub fn permit(&self) -> Option<&Permit> {
        self.permit.as_ref()
    }
}

impl<B: Body> Body for PermitBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let frame = std::task::ready!(this.inner.poll_frame(cx));
        if !matches!(frame, Some(Ok(_))) {
            // The end, or an error that ends it: the work is over either way.
            this.permit.take();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
