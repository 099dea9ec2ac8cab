//! The body of a proxied response: the upstream's frames as they come, holding the permit, counted in
//! `inflight_in_flight`, and cut short if the server's shutdown grace period ends first.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use inflight::Permit;
use inflight_tower::PermitBody;
use pin_project_lite::pin_project;
use tokio::sync::watch;

use crate::metrics::InFlightGuard;

pin_project! {
    /// See the module docs.
    pub(super) struct ProxyBody {
        #[pin]
        inner: PermitBody<hyper::body::Incoming>,
        cut: Pin<Box<dyn Future<Output = ()> + Send>>,
        _gauge: InFlightGuard,
    }
}

impl ProxyBody {
    pub(super) fn new(
        inner: hyper::body::Incoming,
        permit: Permit,
        mut cut: watch::Receiver<bool>,
        gauge: InFlightGuard,
    ) -> Self {
        Self {
            inner: PermitBody::new(inner, Some(permit)),
            cut: Box::pin(async move {
                let _ = cut.wait_for(|cut| *cut).await;
            }),
            _gauge: gauge,
        }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.project();
        if this.cut.as_mut().poll(cx).is_ready() {
            // The grace period is over: end the response with an error, which closes the connection.
            return Poll::Ready(Some(Err(axum::Error::new("the server is shutting down"))));
        }
        this.inner.poll_frame(cx).map_err(axum::Error::new)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
