//! The body of a proxied response: the upstream's frames as they come, holding the permit, counted in
//! `inflight_in_flight`, and cut short if the server's shutdown grace period ends first. Read to the end,
//! it gives its upstream connection back to the pool.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use inflight::Permit;
use inflight_tower::PermitBody;
use pin_project_lite::pin_project;
use tokio::sync::watch;

use super::upstream::Reusable;
use crate::metrics::InFlightGuard;

pin_project! {
    /// See the module docs.
    pub(super) struct ProxyBody {
        #[pin]
        inner: PermitBody<hyper::body::Incoming>,
        cut: Pin<Box<dyn Future<Output = ()> + Send>>,
        connection: Option<Reusable>,
        _gauge: InFlightGuard,
    }
}

impl ProxyBody {
    pub(super) fn new(
        inner: hyper::body::Incoming,
        permit: Permit,
        connection: Reusable,
        mut cut: watch::Receiver<bool>,
        gauge: InFlightGuard,
    ) -> Self {
        let mut connection = Some(connection);
        if inner.is_end_stream() {
            // No body to read (the server will not ask for one): the connection goes back now. Should its
            // request body still be on its way up, it stays busy until then, and checkouts pass it over.
            give_back(&mut connection);
        }
        Self {
            inner: PermitBody::new(inner, Some(permit)),
            cut: Box::pin(async move {
                let _ = cut.wait_for(|cut| *cut).await;
            }),
            connection,
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
        let mut this = self.project();
        if this.cut.as_mut().poll(cx).is_ready() {
            // The grace period is over: end the response with an error, which closes the connection.
            return Poll::Ready(Some(Err(axum::Error::new("the server is shutting down"))));
        }
        let frame = std::task::ready!(this.inner.as_mut().poll_frame(cx));
        match &frame {
            // Read to the end (the server may not ask again once `is_end_stream` says so).
            None => give_back(this.connection),
            Some(Ok(_)) if this.inner.is_end_stream() => give_back(this.connection),
            Some(Ok(_)) => {}
            // The rest of the response may still be on the connection: it is closed when dropped.
            Some(Err(_)) => drop(this.connection.take()),
        }
        Poll::Ready(frame.map(|frame| frame.map_err(axum::Error::new)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

fn give_back(connection: &mut Option<Reusable>) {
    if let Some(connection) = connection.take() {
        connection.give_back();
    }
}
